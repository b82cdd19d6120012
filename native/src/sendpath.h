/* The broker's send path in C: SEND_MESSAGE_V2 headers, message records and
 * send responses (see sendpath.c). */
#ifndef LEDGERMQ_SENDPATH_H
#define LEDGERMQ_SENDPATH_H
#include <stddef.h>
#include <stdint.h>

/* status of a scanned request */
#define LMQ_SEND_OK 0       /* a plain SEND_MESSAGE_V2: every field below is set */
#define LMQ_SEND_GENERAL 1  /* a field not in plain form, a batch, a duplicate...: the general path */
#define LMQ_SEND_PROPS 2    /* properties the general path handles (DELAY, CLUSTER, TRAN_MSG, unusual form) */
#define LMQ_SEND_BAD_JSON 3 /* not JSON this parser reads: the general path (and its errors) */
#define LMQ_SEND_OTHER 4    /* not a SEND_MESSAGE_V2 request in JSON: the general path */

/* The remoting decoder's limits (broker/remoting/codec.py MAX_HEADER_SIZE,
 * MAX_EXT_FIELDS): a frame whose header is longer ends the scan, a header
 * with more extFields entries is declined; the general decoder refuses both. */
#define LMQ_MAX_HEADER_SIZE 1048576
#define LMQ_MAX_EXT_FIELDS 1024

typedef struct {
    int64_t frame_off;       /* where the frame starts in the scanned buffer */
    int64_t frame_len;       /* 4 + its length field */
    int64_t header_off;
    int64_t header_len;
    int64_t body_off;        /* the body, in the scanned buffer */
    int64_t body_len;
    int32_t stype;           /* serialize type */
    int32_t status;
    int32_t code;
    int32_t opaque;
    int32_t flag;            /* the request's flag (oneway bit) */
    int32_t queue_id;
    int32_t sysflag;         /* as the producer sent it */
    int32_t msg_flag;
    int32_t reconsume_times;
    int64_t born_timestamp;
    uint32_t topic_off, topic_len;  /* unescaped, in the scratch buffer */
    uint32_t props_off, props_len;  /* likewise */
    uint32_t uniq_off, uniq_len;    /* the UNIQ_KEY value inside the properties (len 0: none) */
    int32_t topic_first;            /* the first request of the scan with these exact topic bytes
                                       (itself when none before it has them) */
} lmq_send_req;

typedef struct {
    const uint8_t *born_host;   /* ip + port, as a record stores it */
    int32_t born_host_len;      /* 8 (IPv4) or 20 (IPv6) */
    const uint8_t *store_host;
    int32_t store_host_len;
    int64_t store_timestamp;
    const uint8_t *cluster;     /* brokerClusterName, UTF-8 */
    int32_t cluster_len;
    const uint8_t *uniq_prefix; /* hex of ip + pid + class loader hash */
    int32_t uniq_prefix_len;
    int32_t uniq_diff;          /* ms since the month began, as Java's (int) */
    int32_t uniq_counter;       /* the next 16-bit counter */
} lmq_send_env;

/* C-only (not in the cdef): one message record (spec §1) from its parts,
 * shared by the single and batch send paths.  lmq_record_size is its
 * TOTALSIZE; lmq_put_record writes it at p (properties as given, then a
 * made UNIQ_KEY when make_uniq, then CLUSTER) and returns its end. */
int64_t lmq_record_size(const lmq_send_env *env, int64_t body_len, int64_t topic_len, int v2, int64_t props_len);
uint8_t *lmq_put_record(uint8_t *p, int64_t total, int v2, int32_t queue_id, int32_t msg_flag, int32_t sysflag,
                        int64_t born_timestamp, int32_t reconsume_times, const uint8_t *body, int64_t body_len,
                        const uint8_t *topic, int64_t topic_len, const uint8_t *props, int64_t props_len,
                        int64_t new_props_len, int make_uniq, int32_t counter, const lmq_send_env *env);

int64_t lmq_scan_requests(const uint8_t *buf, int64_t len, int64_t max_frame, int64_t max_n,
                          lmq_send_req *out, uint8_t *scratch, int64_t scratch_cap);
int64_t lmq_encode_sends(const uint8_t *buf, const lmq_send_req *reqs, const int32_t *which,
                         const int32_t *queue_ids, const int32_t *sysflags, int64_t n, const uint8_t *scratch,
                         const lmq_send_env *env, uint8_t *out, int64_t cap, int64_t *rec_off, int32_t *rec_len,
                         int64_t *uniq_off, int32_t *uniq_len, int32_t *uniq_counter_used);
int64_t lmq_encode_send_responses(const int32_t *opaques, const int32_t *queue_ids, const int64_t *queue_offsets,
                                  const int64_t *phy_offsets, const uint8_t *uniq_buf, const int64_t *uniq_off,
                                  const int32_t *uniq_len, int64_t n, const uint8_t *store_host,
                                  int32_t store_host_len, int32_t version, uint8_t *out, int64_t cap,
                                  int64_t *frame_off);

#endif
