/* The broker's SEND_BATCH_MESSAGE records in C (see sendpath_batch.h):
 *
 *   lmq_scan_batch    splits a batch body (spec §1.10: per message i32
 *                     TOTALSIZE, i32 MAGIC, i32 BODYCRC, i32 FLAG, i32
 *                     BODYLEN, BODY, i16 PROPLEN, PROPS) and checks that
 *                     every message's properties are plain;
 *   lmq_encode_batch  one message record (spec §1) per message: its
 *                     properties as sent, UNIQ_KEY added when missing and
 *                     CLUSTER appended, the rest from the request.
 *
 * "Plain" is exactly SendProcessor._plain_properties
 * (broker/processors/send.py): valid UTF-8, empty or ending in 0x02 with as
 * many 0x01 as 0x02, no DELAY or CLUSTER property, UNIQ_KEY at most once and
 * not empty.  One message that is not plain, or a malformed body, declines
 * the whole batch: the general path in Python (the pure-Python twin the
 * oracle tests compare with) then builds it or names the error. */
#include <string.h>

#include "bigendian.h"
#include "entries.h"
#include "sendpath_batch.h"

#define MAX_PROPS 32767
#define UNIQ_NAME "UNIQ_KEY\x01"
#define UNIQ_NAME_LEN 9


/* Python's strict UTF-8 decoding: no overlong forms, no surrogates, nothing
 * past U+10FFFF. */
static int valid_utf8(const uint8_t *s, int64_t n) {
    int64_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        uint32_t min, cp;
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2, min = 0x80, cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3, min = 0x800, cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4, min = 0x10000, cp = c & 0x07;
        } else {
            return 0;
        }
        if (i + len > n) return 0;
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += len;
    }
    return 1;
}

static int64_t find(const uint8_t *hay, int64_t n, int64_t from, const char *needle, int64_t m) {
    for (int64_t i = from; i + m <= n; i++)
        if (hay[i] == (uint8_t)needle[0] && memcmp(hay + i, needle, (size_t)m) == 0) return i;
    return -1;
}

/* 1 and the UNIQ_KEY value's length (0: none) if p[0..n) is plain, else 0. */
static int plain_props(const uint8_t *p, int64_t n, int32_t *uniq_len) {
    *uniq_len = 0;
    if (n == 0) return 1;
    if (p[n - 1] != 2 || !valid_utf8(p, n)) return 0;
    int64_t ones = 0, twos = 0;
    for (int64_t i = 0; i < n; i++) {
        ones += p[i] == 1;
        twos += p[i] == 2;
    }
    if (ones != twos) return 0;
    if (find(p, n, 0, "DELAY\x01", 6) >= 0 || find(p, n, 0, "CLUSTER\x01", 8) >= 0) return 0;
    int64_t at = (n >= UNIQ_NAME_LEN && memcmp(p, UNIQ_NAME, UNIQ_NAME_LEN) == 0) ? 0
                                                                             : find(p, n, 0, "\x02" UNIQ_NAME, 10);
    if (at < 0) return 1;
    int64_t value_at = (at == 0 ? 0 : at + 1) + UNIQ_NAME_LEN;
    int64_t end = value_at;
    while (end < n && p[end] != 2) end++; /* there is one: the string ends with 0x02 */
    if (end == value_at || find(p, n, value_at, UNIQ_NAME, UNIQ_NAME_LEN) >= 0) return 0;
    *uniq_len = (int32_t)(end - value_at);
    return 1;
}

int64_t lmq_scan_batch(const uint8_t *body, int64_t len, lmq_batch_item *items, int64_t max_n,
                       int64_t *missing_uniq, int64_t *props_total) {
    int64_t off = 0, n = 0, missing = 0, props = 0;
    while (off < len) {
        if (n == max_n || len - off < 20) return -1;
        int32_t total = lmq_r32(body + off), flag = lmq_r32(body + off + 12), body_len = lmq_r32(body + off + 16);
        if (total < 22 || total > len - off || body_len < 0 || (int64_t)body_len + 22 > total) return -1;
        int64_t p = off + 20 + body_len;
        int32_t props_len = (int16_t)((body[p] << 8) | body[p + 1]);
        if (props_len < 0 || 22 + (int64_t)body_len + props_len != total) return -1;
        lmq_batch_item *it = &items[n];
        it->body_off = off + 20, it->body_len = body_len, it->flag = flag;
        it->props_off = p + 2, it->props_len = props_len;
        if (!plain_props(body + p + 2, props_len, &it->uniq_len)) return -1;
        missing += it->uniq_len == 0;
        props += props_len;
        off += total;
        n++;
    }
    if (n == 0) return -1;
    *missing_uniq = missing;
    *props_total = props;
    return n;
}

int64_t lmq_encode_batch(const uint8_t *body, const lmq_batch_item *items, int64_t n, const uint8_t *topic,
                         int32_t topic_len, int32_t magic, int32_t queue_id, int32_t sysflag, int64_t born_timestamp,
                         int32_t reconsume_times, const lmq_send_env *env, uint8_t *out, int64_t cap,
                         int64_t *rec_off) {
    int64_t w = 0, tl = topic_len;
    int v2 = magic != (int32_t)0xDAA320A7; /* the caller chose it by the topic's length in UTF-16 units */
    int32_t counter = env->uniq_counter;
    if (tl > (v2 ? 32767 : 127)) return -1;
    for (int64_t k = 0; k < n; k++) {
        const lmq_batch_item *it = &items[k];
        int64_t pl = it->props_len;
        int64_t new_pl = pl + (it->uniq_len ? 0 : UNIQ_NAME_LEN + env->uniq_prefix_len + 12 + 1) + 8 +
                         env->cluster_len + 1;
        if (new_pl > MAX_PROPS) return -1;
        int64_t total = lmq_record_size(env, it->body_len, tl, v2, new_pl);
        if (cap - w < total) return -1;
        lmq_put_record(out + w, total, v2, queue_id, it->flag, sysflag, born_timestamp, reconsume_times,
                       body + it->body_off, it->body_len, topic, tl, body + it->props_off, pl, new_pl, !it->uniq_len,
                       counter, env);
        if (!it->uniq_len) counter = (counter + 1) & 0xFFFF;
        rec_off[k] = w;
        w += total;
    }
    rec_off[n] = w;
    return w;
}
