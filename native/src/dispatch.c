/* The dispatch hot path: one call walks a contiguous commitlog buffer and
 * fills an array of fixed-size dispatch records, so no Python object exists
 * per message.  Further calls group those records by queue, pack
 * ConsumeQueue units and insert IndexFile items straight into the mapped
 * index file.
 *
 * Two buffer layouts (spec §1, §5.1, §6.5):
 *   LMQ_MODE_DLEDGER  entries with the 48-byte DLedger header; an entry whose
 *                     body carries a v1/v2 message magic at +4 is a message;
 *                     NOOP and other entries are consumed silently; i32 -1 is
 *                     the blank filler closing a segment.
 *   LMQ_MODE_PLAIN    RocketMQ commitlog records back to back; the 8-byte
 *                     BLANK (i32 size, i32 0xCBD43194) closes a segment.
 *
 * Every rule mirrors the broker's checkMessageAndReturnSize, buildIndex and
 * putMessagePositionInfo; native/dispatch.py holds the pure-Python twin that
 * the tests compare against byte for byte.  All multi-byte fields on disk
 * are big-endian.
 */
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "hash.h"

/* err_code for LMQ_STOP_CORRUPT */
#define LMQ_ERR_ENTRY_MAGIC 1
#define LMQ_ERR_ENTRY_SIZE 2
#define LMQ_ERR_CHANNEL 3
#define LMQ_ERR_POS 4
#define LMQ_ERR_INDEX 5
#define LMQ_ERR_RECORD_MAGIC 6
#define LMQ_ERR_RECORD 7
#define LMQ_ERR_TOO_LARGE 8

/* bad_reason for LMQ_REC_BAD */
#define LMQ_BAD_TOTALSIZE 1
#define LMQ_BAD_HOSTS 2
#define LMQ_BAD_BODYLEN 3
#define LMQ_BAD_TOPICLEN 4
#define LMQ_BAD_PROPSLEN 5
#define LMQ_BAD_LENGTH 6
#define LMQ_BAD_DELAY 7

#define MAGIC_V1 ((int32_t)0xDAA320A7)
#define MAGIC_V2 ((int32_t)0xDAA320AB)
#define BLANK_MAGIC ((int32_t)0xCBD43194)
#define MIN_RECORD 91 /* v1, IPv4 hosts, empty body/topic/properties */


static inline int32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return (int32_t)__builtin_bswap32(v);
}
static inline int64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return (int64_t)__builtin_bswap64(v);
}
static inline int16_t rd16(const uint8_t *p) { return (int16_t)((p[0] << 8) | p[1]); }
static inline void wr32(uint8_t *p, int32_t v) {
    uint32_t x = __builtin_bswap32((uint32_t)v);
    memcpy(p, &x, 4);
}
static inline void wr64(uint8_t *p, int64_t v) {
    uint64_t x = __builtin_bswap64((uint64_t)v);
    memcpy(p, &x, 8);
}

/* Integer.parseInt over ASCII: optional sign, digits, int32 range. */
static int parse_java_int(const uint8_t *s, size_t n, int64_t *out) {
    size_t i = 0;
    int neg = 0;
    if (n && (s[0] == '+' || s[0] == '-')) { neg = s[0] == '-'; i = 1; }
    if (i == n) return 0;
    int64_t v = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (s[i] - '0');
        if (v > 2147483648LL) return 0;
    }
    if (neg) v = -v;
    if (v > 2147483647LL) return 0;
    *out = v;
    return 1;
}

/* Parse the record at buf+off of exactly L bytes (L = TOTALSIZE as found).
 * Returns 0 or an LMQ_BAD_* reason; fills r either way as far as it got. */
static int parse_record(const uint8_t *buf, size_t off, int64_t L, int32_t options,
                        const int64_t *delay_levels, int32_t n_delay_levels, lmq_disp_rec *r) {
    const uint8_t *m = buf + off;
    int32_t total = rd32(m), magic = rd32(m + 4);
    r->size = total;
    if (L < MIN_RECORD || total != L) return LMQ_BAD_TOTALSIZE;
    int v2 = magic == MAGIC_V2;
    r->queue_id = rd32(m + 12);
    r->queue_offset = rd64(m + 20);
    int64_t stored_phy = rd64(m + 28);
    r->sysflag = rd32(m + 36);
    int64_t bh = (r->sysflag & 0x10) ? 20 : 8, sh = (r->sysflag & 0x20) ? 20 : 8;
    int64_t ts_pos = 48 + bh, body_len_pos = ts_pos + 8 + sh + 12, p = body_len_pos + 4;
    if (p > L) return LMQ_BAD_HOSTS;
    r->store_timestamp = rd64(m + ts_pos);
    if (stored_phy != r->phy_offset) r->flags |= LMQ_REC_PHY_MISMATCH;
    int32_t body_len = rd32(m + body_len_pos);
    if (body_len < 0 || p + body_len > L) return LMQ_BAD_BODYLEN;
    if (options & LMQ_SCAN_CHECK_CRC) {
        uint32_t crc = lmq_crc32(0, m + p, (size_t)body_len) & 0x7FFFFFFFu;
        if ((int32_t)crc != rd32(m + 8)) r->flags |= LMQ_REC_CRC_BAD;
    }
    p += body_len;
    int64_t tl = v2 ? 2 : 1;
    if (p + tl > L) return LMQ_BAD_TOPICLEN;
    int64_t topic_len = v2 ? rd16(m + p) : (int8_t)m[p];
    p += tl;
    if (topic_len < 0 || p + topic_len + 2 > L) return LMQ_BAD_TOPICLEN;
    r->topic_off = (uint32_t)(off + p);
    r->topic_len = (uint32_t)topic_len;
    r->topic_hash = (int32_t)lmq_java_hash_utf8_from(0, m + p, (size_t)topic_len);
    p += topic_len;
    int64_t props_len = rd16(m + p);
    p += 2;
    if (props_len < 0 || p + props_len > L) return LMQ_BAD_PROPSLEN;
    int64_t expect = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + bh + 8 + sh + 4 + 8 + 4 + body_len + tl +
                     topic_len + 2 + props_len;
    if (expect != L) return LMQ_BAD_LENGTH;

    /* string2messageProperties, for the four names the store reads.  Their
     * segments are >= 3 chars by construction, so the "segment shorter than
     * 3 chars" rule never hides one of them; 0x01/0x02/' ' never occur
     * inside a multi-byte UTF-8 sequence, so byte splitting is exact.
     * A later duplicate wins, like HashMap.put. */
    const uint8_t *tags = NULL, *delay = NULL;
    size_t tags_n = 0, delay_n = 0;
    const uint8_t *ps = m + p, *pe = m + p + props_len;
    while (ps < pe) {
        const uint8_t *q = memchr(ps, 0x02, (size_t)(pe - ps));
        if (!q) q = pe;
        const uint8_t *k = memchr(ps, 0x01, (size_t)(q - ps));
        if (k && k > ps && k < q - 1) {
            size_t kn = (size_t)(k - ps), vn = (size_t)(q - k - 1);
            const uint8_t *v = k + 1;
            if (kn == 4 && memcmp(ps, "TAGS", 4) == 0) { tags = v; tags_n = vn; }
            else if (kn == 4 && memcmp(ps, "KEYS", 4) == 0) {
                r->keys_off = (uint32_t)(v - buf); r->keys_len = (uint32_t)vn;
            } else if (kn == 8 && memcmp(ps, "UNIQ_KEY", 8) == 0) {
                r->uniq_off = (uint32_t)(v - buf); r->uniq_len = (uint32_t)vn;
            } else if (kn == 5 && memcmp(ps, "DELAY", 5) == 0) { delay = v; delay_n = vn; }
        }
        ps = q + 1;
    }
    r->tags_code = tags ? (int64_t)(int32_t)lmq_java_hash_utf8_from(0, tags, tags_n) : 0;
    /* The delay level table is the broker's messageDelayLevel, passed in
     * (none: the tags code stays the TAGS hash). */
    if (delay && topic_len == 19 && memcmp(buf + r->topic_off, "SCHEDULE_TOPIC_XXXX", 19) == 0) {
        int64_t level;
        if (!parse_java_int(delay, delay_n, &level)) return LMQ_BAD_DELAY;
        if (level > n_delay_levels) level = n_delay_levels;
        if (level > 0) {
            r->tags_code = r->store_timestamp + delay_levels[level - 1];
            r->flags |= LMQ_REC_DELAY;
        }
    }
    int32_t tran = r->sysflag & 0xC;
    if (tran == 0x4 || tran == 0xC) r->flags |= LMQ_REC_NO_CQ;
    if (tran == 0xC) r->flags |= LMQ_REC_NO_INDEX;
    return 0;
}

static void rec_init(lmq_disp_rec *r, int64_t index, int64_t entry_pos, int64_t phy) {
    memset(r, 0, sizeof(*r));
    r->entry_index = index;
    r->entry_pos = entry_pos;
    r->phy_offset = phy;
}

static int64_t stop(lmq_scan_state *st, int32_t why, int32_t code, int64_t at, int64_t n) {
    st->stop = why;
    st->err_code = code;
    st->err_offset = at;
    return n;
}

int64_t lmq_dispatch_scan(const uint8_t *buf, size_t len, int64_t base_pos, int32_t mode,
                          int32_t options, int64_t expect_index, lmq_disp_rec *out, int64_t cap,
                          int64_t max_entries, const int64_t *delay_levels, int32_t n_delay_levels,
                          lmq_scan_state *st) {
    int64_t n = 0;
    size_t off = 0;
    st->consumed = 0;
    st->entries = 0;
    st->last_index = -1;
    st->bad = 0;
    st->first_bad = -1;
    if (len > 0xFFFFFFFFu) return stop(st, LMQ_STOP_CORRUPT, LMQ_ERR_TOO_LARGE, 0, 0);
    for (;;) {
        st->consumed = (int64_t)off;
        size_t rem = len - off;
        if (rem == 0) return stop(st, LMQ_STOP_END, 0, 0, n);
        if (n == cap || (max_entries >= 0 && st->entries == max_entries))
            return stop(st, LMQ_STOP_FULL, 0, 0, n);
        if (rem < 8) return stop(st, LMQ_STOP_PARTIAL, 0, (int64_t)off, n);
        const uint8_t *p = buf + off;
        int32_t a = rd32(p), b = rd32(p + 4);
        if (mode == LMQ_MODE_PLAIN) {
            if (b == BLANK_MAGIC) return stop(st, LMQ_STOP_BLANK, 0, 0, n);
            if (a == 0 && b == 0) return stop(st, LMQ_STOP_ZERO, 0, 0, n);
            if (b != MAGIC_V1 && b != MAGIC_V2)
                return stop(st, LMQ_STOP_CORRUPT, LMQ_ERR_RECORD_MAGIC, (int64_t)off, n);
            if (a < 8) return stop(st, LMQ_STOP_CORRUPT, LMQ_ERR_RECORD, (int64_t)off, n);
            if ((size_t)a > rem) return stop(st, LMQ_STOP_PARTIAL, 0, (int64_t)off, n);
            lmq_disp_rec *r = &out[n];
            int64_t pos = base_pos + (int64_t)off;
            rec_init(r, -1, pos, pos);
            int bad = parse_record(buf, off, a, options, delay_levels, n_delay_levels, r);
            if (bad) return stop(st, LMQ_STOP_CORRUPT, LMQ_ERR_RECORD, (int64_t)off, n);
            n++;
            st->entries++;
            off += (size_t)a;
            continue;
        }
        /* DLedger entry: magic a, size b */
        if (a == -1) return stop(st, LMQ_STOP_BLANK, 0, 0, n);
        if (a == 0 && b == 0) return stop(st, LMQ_STOP_ZERO, 0, 0, n);
        if (rem < 48) return stop(st, LMQ_STOP_PARTIAL, 0, (int64_t)off, n);
        if (a < 1 || a > 3) return stop(st, LMQ_STOP_CORRUPT, LMQ_ERR_ENTRY_MAGIC, (int64_t)off, n);
        int32_t body_size = rd32(p + 44);
        if (b <= 44 || (int64_t)body_size + 48 != b)
            return stop(st, LMQ_STOP_CORRUPT, LMQ_ERR_ENTRY_SIZE, (int64_t)off, n);
        if (rd32(p + 32) != 0) return stop(st, LMQ_STOP_CORRUPT, LMQ_ERR_CHANNEL, (int64_t)off, n);
        int64_t index = rd64(p + 8), pos = rd64(p + 24);
        if (pos != base_pos + (int64_t)off) return stop(st, LMQ_STOP_CORRUPT, LMQ_ERR_POS, (int64_t)off, n);
        if (expect_index >= 0 && index != expect_index)
            return stop(st, LMQ_STOP_CORRUPT, LMQ_ERR_INDEX, (int64_t)off, n);
        if ((size_t)b > rem) return stop(st, LMQ_STOP_PARTIAL, 0, (int64_t)off, n);
        /* The next header and this record's tail (topic, properties) are
         * the next two cache misses; start both now. */
        if ((size_t)b + 64 <= rem) __builtin_prefetch(p + b, 0, 0);
        __builtin_prefetch(p + b - 64, 0, 0);
        if (a == 1 && body_size >= 8) {
            int32_t mm = rd32(p + 52);
            if (mm == MAGIC_V1 || mm == MAGIC_V2) {
                lmq_disp_rec *r = &out[n];
                rec_init(r, index, pos, pos + 48);
                int bad = parse_record(buf, off + 48, body_size, options, delay_levels, n_delay_levels, r);
                if (bad) {
                    r->flags |= LMQ_REC_BAD | LMQ_REC_NO_CQ | LMQ_REC_NO_INDEX;
                    r->bad_reason = bad;
                    if (st->bad++ == 0) st->first_bad = n;
                }
                n++;
            }
        }
        st->entries++;
        st->last_index = index;
        expect_index = index + 1;
        off += (size_t)b;
    }
}

/* ---- grouping by queue ------------------------------------------------ */

static int same_queue(const uint8_t *buf, const lmq_disp_rec *a, const lmq_disp_rec *b) {
    return a->topic_hash == b->topic_hash && a->queue_id == b->queue_id &&
           a->topic_len == b->topic_len &&
           memcmp(buf + a->topic_off, buf + b->topic_off, a->topic_len) == 0;
}

/* Collect the records that go to a ConsumeQueue (not NO_CQ) into one run
 * per (topic, queue id): runs in order of each queue's first record, log
 * order inside a run (a counting sort over an open-addressing table, so
 * O(n)).  order[] gets record indexes; group_starts[g] is where run g
 * starts in order[], with group_starts[*ngroups] = the count.  Returns the
 * count, or -1 if out of memory.  order and group_starts need room for n
 * and n + 1 items. */
int64_t lmq_dispatch_group(const uint8_t *buf, const lmq_disp_rec *recs, int64_t n,
                           int32_t *order, int32_t *group_starts, int64_t *ngroups) {
    size_t cap = 16;
    while (cap < (size_t)n * 2) cap *= 2;
    int32_t *table = malloc(cap * sizeof(int32_t));
    int32_t *gid = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    int32_t *first = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    if (!table || !gid || !first) {
        free(table); free(gid); free(first);
        return -1;
    }
    memset(table, 0xFF, cap * sizeof(int32_t));
    int64_t g = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        const lmq_disp_rec *r = &recs[i];
        if (r->flags & LMQ_REC_NO_CQ) { gid[i] = -1; continue; }
        uint32_t h = (uint32_t)r->topic_hash * 0x9E3779B1u ^ (uint32_t)r->queue_id * 0x85EBCA77u;
        size_t slot = (h ^ (h >> 15)) & (cap - 1);
        int32_t found = -1;
        while (table[slot] >= 0) {
            if (same_queue(buf, &recs[first[table[slot]]], r)) { found = table[slot]; break; }
            slot = (slot + 1) & (cap - 1);
        }
        if (found < 0) {
            found = (int32_t)g;
            table[slot] = found;
            first[g] = (int32_t)i;
            group_starts[g] = 0;
            g++;
        }
        gid[i] = found;
        group_starts[found]++; /* a count for now */
        m++;
    }
    int32_t acc = 0;
    for (int64_t k = 0; k < g; k++) { /* counts -> starts; first[] becomes the fill cursor */
        int32_t c = group_starts[k];
        group_starts[k] = acc;
        first[k] = acc;
        acc += c;
    }
    group_starts[g] = acc;
    for (int64_t i = 0; i < n; i++)
        if (gid[i] >= 0) order[first[gid[i]]++] = (int32_t)i;
    *ngroups = g;
    free(table);
    free(gid);
    free(first);
    return m;
}

/* ---- ConsumeQueue units ----------------------------------------------- */

/* Write the 20-byte units (i64 phy, i32 size, i64 tagsCode) of
 * recs[order[from..to)] back to back into out.  Returns how many leading
 * units carry consecutive queue offsets (the rest need the slow path). */
int64_t lmq_cq_pack(const lmq_disp_rec *recs, const int32_t *order, int64_t from, int64_t to,
                    uint8_t *out) {
    int64_t run = 0;
    for (int64_t k = from; k < to; k++) {
        const lmq_disp_rec *r = &recs[order[k]];
        uint8_t *u = out + (k - from) * 20;
        wr64(u, r->phy_offset);
        wr32(u + 8, r->size);
        wr64(u + 12, r->tags_code);
        if (run == k - from &&
            (k == from || r->queue_offset == recs[order[k - 1]].queue_offset + 1))
            run++;
    }
    return run;
}

/* lmq_cq_pack for every run of a grouping at once: the units of run g go
 * to out + starts[g] * 20, and info[g * 8 ..] says which queue they belong
 * to and from which queue offset (LMQ_GROUP_FIELDS), so the caller does one
 * write per queue without looking at single records. */
int64_t lmq_cq_pack_groups(const lmq_disp_rec *recs, const int32_t *order, const int32_t *starts,
                           int64_t ngroups, uint8_t *out, int64_t *info) {
    for (int64_t g = 0; g < ngroups; g++) {
        const lmq_disp_rec *r = &recs[order[starts[g]]];
        int64_t *gi = info + g * LMQ_GROUP_FIELDS;
        gi[0] = r->queue_offset;
        gi[1] = r->queue_id;
        gi[2] = r->topic_off;
        gi[3] = r->topic_len;
        gi[4] = starts[g + 1] - starts[g];
        gi[5] = lmq_cq_pack(recs, order, starts[g], starts[g + 1], out + (size_t)starts[g] * 20);
        gi[6] = order[starts[g]];
        gi[7] = starts[g];
    }
    return ngroups;
}

/* Number of leading valid units (offset >= 0 && size > 0), the rule
 * ConsumeQueue.recover stops at. */
int64_t lmq_cq_valid_units(const uint8_t *buf, size_t len) {
    int64_t n = 0;
    for (size_t off = 0; off + 20 <= len; off += 20, n++)
        if (rd64(buf + off) < 0 || rd32(buf + off + 8) <= 0) break;
    return n;
}

/* ---- IndexFile items --------------------------------------------------- */

static inline int32_t key_hash_of(uint32_t hash32) {
    int32_t k = (int32_t)hash32; /* indexKeyHashMethod: abs, MIN_VALUE -> 0 */
    if (k == INT32_MIN) return 0;
    return k < 0 ? -k : k;
}

/* IndexFile.putKey for one key whose slot is known. */
static void put_item(uint8_t *map, int32_t slot_num, lmq_index_header *h, int32_t key_hash,
                     size_t slot_pos, int64_t phy, int64_t ts) {
    int32_t slot_value = rd32(map + slot_pos);
    if (slot_value <= 0 || slot_value > h->index_count) slot_value = 0;
    int64_t diff = (ts - h->begin_timestamp) / 1000; /* truncates like Java */
    if (h->begin_timestamp <= 0) diff = 0;
    else if (diff > INT32_MAX) diff = INT32_MAX;
    else if (diff < 0) diff = 0;
    uint8_t *item = map + 40 + (size_t)slot_num * 4 + (size_t)h->index_count * 20;
    wr32(item, key_hash);
    wr64(item + 4, phy);
    wr32(item + 12, (int32_t)diff);
    wr32(item + 16, slot_value);
    wr32(map + slot_pos, h->index_count);
    if (h->index_count <= 1) {
        h->begin_phy_offset = phy;
        h->begin_timestamp = ts;
    }
    if (slot_value == 0) h->hash_slot_count++;
    h->index_count++;
    h->end_phy_offset = phy;
    h->end_timestamp = ts;
}

/* A short software pipeline: keys are hashed and their slot's cache line is
 * prefetched PIPE keys before they are inserted, so the random slot reads
 * of a 20 MB table overlap instead of stalling one by one.  Insertion stays
 * strictly in order, so the bytes are those of sequential putKey calls. */
#define PIPE 16
typedef struct {
    int32_t key_hash;
    size_t slot_pos;
    int64_t phy, ts;
} pend_key;

typedef struct {
    uint8_t *map;
    int32_t slot_num;
    lmq_index_header *h;
    pend_key q[PIPE];
    int head, count;
    int64_t last_phy; /* phy of the newest queued key */
} key_pipe;

static void pipe_pop(key_pipe *p) {
    pend_key *k = &p->q[p->head];
    put_item(p->map, p->slot_num, p->h, k->key_hash, k->slot_pos, k->phy, k->ts);
    p->head = (p->head + 1) % PIPE;
    p->count--;
}

static void pipe_push(key_pipe *p, uint32_t hash32, int64_t phy, int64_t ts) {
    if (p->count == PIPE) pipe_pop(p);
    pend_key *k = &p->q[(p->head + p->count) % PIPE];
    k->key_hash = key_hash_of(hash32);
    k->slot_pos = 40 + (size_t)(k->key_hash % p->slot_num) * 4;
    k->phy = phy;
    k->ts = ts;
    __builtin_prefetch(p->map + k->slot_pos, 1, 1);
    p->count++;
    p->last_phy = phy;
}

/* What the header will say once the queued keys are in. */
static inline int32_t pipe_count(const key_pipe *p) { return p->h->index_count + p->count; }
static inline int64_t pipe_end_phy(const key_pipe *p) {
    return p->count ? p->last_phy : p->h->end_phy_offset;
}

static void write_header(uint8_t *map, const lmq_index_header *h) {
    wr64(map, h->begin_timestamp);
    wr64(map + 8, h->end_timestamp);
    wr64(map + 16, h->begin_phy_offset);
    wr64(map + 24, h->end_phy_offset);
    wr32(map + 32, h->hash_slot_count);
    wr32(map + 36, h->index_count);
}

/* Index recs[rec_from..n) into the mapped file: for each record (not
 * NO_INDEX, and not below the file's endPhyOffset -- already indexed) the
 * key "topic#UNIQ_KEY" and then "topic#k" for every non-empty token of KEYS
 * split on ' '.  Key numbering inside a record: 0 is UNIQ_KEY when present,
 * then the KEYS tokens.  Starts at key `key_from` of recs[rec_from].  When
 * the file fills up, returns the record to resume at and sets *key_next;
 * returns n when everything went in.  The header is written back into the
 * map before returning. */
int64_t lmq_index_put(uint8_t *map, int32_t slot_num, int32_t index_num, lmq_index_header *hdr,
                      const uint8_t *buf, const lmq_disp_rec *recs, int64_t rec_from, int64_t n,
                      int32_t key_from, int32_t *key_next) {
    key_pipe p;
    p.map = map;
    p.slot_num = slot_num;
    p.h = hdr;
    p.head = p.count = 0;
    p.last_phy = 0;
    int64_t i = rec_from;
    int32_t kf = key_from;
    *key_next = 0;
    for (; i < n; i++, kf = 0) {
        const lmq_disp_rec *r = &recs[i];
        if (kf == 0) {
            if (pipe_count(&p) >= index_num) break;
            if (r->phy_offset < pipe_end_phy(&p) || (r->flags & LMQ_REC_NO_INDEX)) continue;
        }
        uint32_t base = 31u * (uint32_t)r->topic_hash + '#';
        int32_t key = 0;
        int full = 0;
        if (r->uniq_len) {
            if (key >= kf) {
                if (pipe_count(&p) >= index_num) { full = 1; goto out; }
                pipe_push(&p, lmq_java_hash_utf8_from(base, buf + r->uniq_off, r->uniq_len), r->phy_offset,
                          r->store_timestamp);
            }
            key++;
        }
        const uint8_t *ks = buf + r->keys_off, *ke = ks + r->keys_len;
        while (ks < ke) {
            const uint8_t *sp = memchr(ks, ' ', (size_t)(ke - ks));
            if (!sp) sp = ke;
            if (sp > ks) {
                if (key >= kf) {
                    if (pipe_count(&p) >= index_num) { full = 1; goto out; }
                    pipe_push(&p, lmq_java_hash_utf8_from(base, ks, (size_t)(sp - ks)), r->phy_offset,
                              r->store_timestamp);
                }
                key++;
            }
            ks = sp + 1;
        }
    out:
        if (full) { *key_next = key; break; }
    }
    while (p.count) pipe_pop(&p);
    write_header(map, hdr);
    return i;
}

/* ---- staging ConsumeQueue units across scan batches --------------------- */

/* A queue's units from several scan batches collect here, so the caller
 * hands them over in one piece (one Python call per queue per `limit`
 * bytes instead of one per queue per batch).  Queues are interned by
 * (topic bytes, queue id) and keep their id for the stage's life. */
typedef struct {
    uint8_t *topic;
    int32_t topic_len, queue_id, topic_hash, bad;
    int64_t first, next; /* staged units hold queue offsets [first, next) */
    uint8_t *units;
    int64_t len, cap;
} lmq_stq;

struct lmq_stage {
    lmq_stq *q;
    int64_t n, qcap;
    int32_t *table; /* open addressing: queue id or -1 */
    size_t tcap;
};

lmq_stage *lmq_stage_new(void) {
    lmq_stage *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->tcap = 64;
    s->table = malloc(s->tcap * sizeof(int32_t));
    if (!s->table) { free(s); return NULL; }
    memset(s->table, 0xFF, s->tcap * sizeof(int32_t));
    return s;
}

void lmq_stage_free(lmq_stage *s) {
    if (!s) return;
    for (int64_t i = 0; i < s->n; i++) { free(s->q[i].topic); free(s->q[i].units); }
    free(s->q);
    free(s->table);
    free(s);
}

static inline size_t stage_slot(int32_t topic_hash, int32_t queue_id, size_t tcap) {
    uint32_t h = (uint32_t)topic_hash * 0x9E3779B1u ^ (uint32_t)queue_id * 0x85EBCA77u;
    return (h ^ (h >> 15)) & (tcap - 1);
}

/* The id of (topic, queue id), interning it if new (*is_new = 1); -1 if
 * out of memory. */
static int64_t stage_intern(lmq_stage *s, const uint8_t *topic, int32_t topic_len, int32_t queue_id,
                            int *is_new) {
    int32_t th = (int32_t)lmq_java_hash_utf8_from(0, topic, (size_t)topic_len);
    size_t slot = stage_slot(th, queue_id, s->tcap);
    *is_new = 0;
    while (s->table[slot] >= 0) {
        lmq_stq *q = &s->q[s->table[slot]];
        if (q->topic_hash == th && q->queue_id == queue_id && q->topic_len == topic_len &&
            memcmp(q->topic, topic, (size_t)topic_len) == 0)
            return s->table[slot];
        slot = (slot + 1) & (s->tcap - 1);
    }
    if ((size_t)(s->n + 1) * 2 > s->tcap) { /* grow the table, then find a slot again */
        size_t ncap = s->tcap * 2;
        int32_t *nt = malloc(ncap * sizeof(int32_t));
        if (!nt) return -1;
        memset(nt, 0xFF, ncap * sizeof(int32_t));
        for (int64_t i = 0; i < s->n; i++) {
            size_t k = stage_slot(s->q[i].topic_hash, s->q[i].queue_id, ncap);
            while (nt[k] >= 0) k = (k + 1) & (ncap - 1);
            nt[k] = (int32_t)i;
        }
        free(s->table);
        s->table = nt;
        s->tcap = ncap;
        slot = stage_slot(th, queue_id, s->tcap);
        while (s->table[slot] >= 0) slot = (slot + 1) & (s->tcap - 1);
    }
    if (s->n == s->qcap) {
        int64_t nc = s->qcap ? s->qcap * 2 : 64;
        lmq_stq *nq = realloc(s->q, (size_t)nc * sizeof(lmq_stq));
        if (!nq) return -1;
        s->q = nq;
        s->qcap = nc;
    }
    lmq_stq *q = &s->q[s->n];
    memset(q, 0, sizeof(*q));
    q->topic = malloc(topic_len ? (size_t)topic_len : 1);
    if (!q->topic) return -1;
    memcpy(q->topic, topic, (size_t)topic_len);
    q->topic_len = topic_len;
    q->queue_id = queue_id;
    q->topic_hash = th;
    s->table[slot] = (int32_t)s->n;
    *is_new = 1;
    return s->n++;
}

/* Route the runs of a lmq_cq_pack_groups result (info, units) into the
 * stage.  A run is staged when its queue is known (seen in an earlier
 * call), not marked bad, its queue offsets are consecutive (run == count)
 * and it continues what the queue has staged (or nothing is staged).
 * ids[g] gets run g's queue id.  att[] gets the runs needing the caller,
 * in order, as run index * 2 + why: why 0 = not staged (the caller takes
 * the queue's stage first, then handles the run itself), why 1 = staged
 * and the queue's stage reached `limit` bytes (take it).  Returns how many
 * att[] items, or -1 if out of memory. */
int64_t lmq_stage_groups(lmq_stage *s, const uint8_t *buf, const int64_t *info, int64_t ngroups,
                         const uint8_t *units, int64_t limit, int64_t *ids, int64_t *att) {
    int64_t k = 0;
    for (int64_t g = 0; g < ngroups; g++) {
        const int64_t *gi = info + g * LMQ_GROUP_FIELDS;
        int is_new;
        int64_t id = stage_intern(s, buf + gi[2], (int32_t)gi[3], (int32_t)gi[1], &is_new);
        if (id < 0) return -1;
        ids[g] = id;
        lmq_stq *q = &s->q[id];
        int64_t q0 = gi[0], count = gi[4];
        if (is_new || q->bad || gi[5] != count || (q->len && q->next != q0)) {
            att[k++] = g * 2;
            continue;
        }
        int64_t nb = count * 20;
        if (q->len + nb > q->cap) {
            int64_t nc = q->cap ? q->cap : 4096;
            while (nc < q->len + nb) nc *= 2;
            uint8_t *nu = realloc(q->units, (size_t)nc);
            if (!nu) return -1;
            q->units = nu;
            q->cap = nc;
        }
        if (!q->len) q->first = q0;
        memcpy(q->units + q->len, units + gi[7] * 20, (size_t)nb);
        q->len += nb;
        q->next = q0 + count;
        if (q->len >= limit) att[k++] = g * 2 + 1;
    }
    return k;
}

/* Bytes staged for queue `id` (and their first queue offset). */
int64_t lmq_stage_len(const lmq_stage *s, int64_t id, int64_t *first) {
    if (id < 0 || id >= s->n) return 0;
    *first = s->q[id].first;
    return s->q[id].len;
}

/* Queue `id`'s staged units, in place (lmq_stage_len bytes): valid until
 * the next call on this stage; lmq_stage_clear empties the stage. */
const uint8_t *lmq_stage_data(const lmq_stage *s, int64_t id) {
    if (id < 0 || id >= s->n) return NULL;
    return s->q[id].units;
}

void lmq_stage_clear(lmq_stage *s, int64_t id) {
    if (id >= 0 && id < s->n) s->q[id].len = 0;
}

/* Free the buffers of the queues with nothing staged (after a flush: a
 * broker with many queues keeps no idle buffers between dispatches). */
void lmq_stage_trim(lmq_stage *s) {
    for (int64_t i = 0; i < s->n; i++)
        if (!s->q[i].len) {
            free(s->q[i].units);
            s->q[i].units = NULL;
            s->q[i].cap = 0;
        }
}

/* Never stage queue `id` again (its topic cannot be dispatched). */
void lmq_stage_set_bad(lmq_stage *s, int64_t id) {
    if (id >= 0 && id < s->n) s->q[id].bad = 1;
}

int64_t lmq_stage_count(const lmq_stage *s) { return s->n; }
