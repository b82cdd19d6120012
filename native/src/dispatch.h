/* Commitlog dispatch helpers: scan a buffer of DLedger entries (or of plain
 * RocketMQ records) into fixed-size dispatch records, group them by queue,
 * pack ConsumeQueue units and insert IndexFile items.  See dispatch.c. */
#ifndef LEDGERMQ_DISPATCH_H
#define LEDGERMQ_DISPATCH_H
#include <stddef.h>
#include <stdint.h>

/* scan modes */
#define LMQ_MODE_DLEDGER 0 /* entries: 48-byte DLedger header + one record as body */
#define LMQ_MODE_PLAIN 1   /* RocketMQ commitlog: records back to back, 8-byte BLANK at the end */

/* scan option bits */
#define LMQ_SCAN_CHECK_CRC 1 /* verify each record's masked BODYCRC (sets LMQ_REC_CRC_BAD) */

/* why a scan stopped */
#define LMQ_STOP_END 0     /* consumed the whole buffer */
#define LMQ_STOP_BLANK 1   /* at a blank filler: the rest of this segment is filler */
#define LMQ_STOP_FULL 2    /* the output array (or max_entries) is full */
#define LMQ_STOP_PARTIAL 3 /* the buffer ends inside an entry or record */
#define LMQ_STOP_ZERO 4    /* zeroed header: the end of written data */
#define LMQ_STOP_CORRUPT 5 /* structural error at err_offset; err_code says which */

/* record flags */
#define LMQ_REC_NO_CQ 1         /* transaction PREPARED/ROLLBACK, or BAD */
#define LMQ_REC_NO_INDEX 2      /* transaction ROLLBACK, or BAD */
#define LMQ_REC_BAD 4           /* message-looking body that fails the record checks */
#define LMQ_REC_PHY_MISMATCH 8  /* stored PHYSICALOFFSET != actual position */
#define LMQ_REC_CRC_BAD 16      /* BODYCRC mismatch (only with LMQ_SCAN_CHECK_CRC) */
#define LMQ_REC_DELAY 32        /* tags_code is a delivery time (SCHEDULE_TOPIC_XXXX) */

typedef struct {
    int64_t entry_index;     /* DLedger index; -1 in plain mode */
    int64_t entry_pos;       /* absolute start of the entry (plain: of the record) */
    int64_t phy_offset;      /* absolute start of the record */
    int64_t queue_offset;
    int64_t tags_code;
    int64_t store_timestamp;
    int32_t size;            /* TOTALSIZE */
    int32_t queue_id;
    int32_t sysflag;
    int32_t flags;           /* LMQ_REC_* */
    uint32_t topic_off;      /* offsets are relative to the scanned buffer */
    uint32_t topic_len;
    uint32_t keys_off;       /* KEYS value; len 0 = absent */
    uint32_t keys_len;
    uint32_t uniq_off;       /* UNIQ_KEY value; len 0 = absent */
    uint32_t uniq_len;
    int32_t topic_hash;      /* Java String.hashCode of the topic */
    int32_t bad_reason;      /* LMQ_BAD_* when flags has LMQ_REC_BAD */
} lmq_disp_rec;

typedef struct {
    int64_t consumed;   /* bytes of the buffer fully processed */
    int64_t entries;    /* entries (plain: records) consumed, message or not */
    int64_t last_index; /* DLedger index of the last consumed entry, -1 if none */
    int64_t err_offset; /* buffer offset of the problem (CORRUPT/PARTIAL) */
    int64_t bad;        /* records flagged LMQ_REC_BAD */
    int64_t first_bad;  /* index of the first of them in the output, -1 if none */
    int32_t stop;       /* LMQ_STOP_* */
    int32_t err_code;   /* LMQ_ERR_* when stop is CORRUPT */
} lmq_scan_state;

typedef struct {
    int64_t begin_timestamp;
    int64_t end_timestamp;
    int64_t begin_phy_offset;
    int64_t end_phy_offset;
    int32_t hash_slot_count;
    int32_t index_count;
} lmq_index_header;

/* lmq_cq_pack_groups describes each run with these 8 int64s. */
#define LMQ_GROUP_FIELDS 8 /* first queue offset, queue id, topic off, topic len,
                              count, run, first record, start in order[] */

int64_t lmq_dispatch_scan(const uint8_t *buf, size_t len, int64_t base_pos, int32_t mode,
                          int32_t options, int64_t expect_index, lmq_disp_rec *out, int64_t cap,
                          int64_t max_entries, const int64_t *delay_levels, int32_t n_delay_levels,
                          lmq_scan_state *st);
int64_t lmq_dispatch_group(const uint8_t *buf, const lmq_disp_rec *recs, int64_t n,
                           int32_t *order, int32_t *group_starts, int64_t *ngroups);
int64_t lmq_cq_pack(const lmq_disp_rec *recs, const int32_t *order, int64_t from, int64_t to,
                    uint8_t *out);
int64_t lmq_cq_pack_groups(const lmq_disp_rec *recs, const int32_t *order, const int32_t *starts,
                           int64_t ngroups, uint8_t *out, int64_t *info);
int64_t lmq_cq_valid_units(const uint8_t *buf, size_t len);
int64_t lmq_index_put(uint8_t *map, int32_t slot_num, int32_t index_num, lmq_index_header *hdr,
                      const uint8_t *buf, const lmq_disp_rec *recs, int64_t rec_from, int64_t n,
                      int32_t key_from, int32_t *key_next);

/* Per-queue staging of ConsumeQueue units across scan batches (opaque). */
typedef struct lmq_stage lmq_stage;
lmq_stage *lmq_stage_new(void);
void lmq_stage_free(lmq_stage *s);
int64_t lmq_stage_groups(lmq_stage *s, const uint8_t *buf, const int64_t *info, int64_t ngroups,
                         const uint8_t *units, int64_t limit, int64_t *ids, int64_t *att);
int64_t lmq_stage_len(const lmq_stage *s, int64_t id, int64_t *first);
const uint8_t *lmq_stage_data(const lmq_stage *s, int64_t id);
void lmq_stage_clear(lmq_stage *s, int64_t id);
void lmq_stage_trim(lmq_stage *s);
void lmq_stage_set_bad(lmq_stage *s, int64_t id);
int64_t lmq_stage_count(const lmq_stage *s);
#endif
