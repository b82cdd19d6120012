/* The broker's send path for the usual request, in C (see sendpath.h):
 *
 *   lmq_scan_requests the whole frames at the front of a receive buffer;
 *                     for a SEND_MESSAGE_V2 JSON header, the fields a
 *                     record needs (strings unescaped into a scratch
 *                     buffer), or a status sending it down the general path;
 *   lmq_encode_sends  the message records (spec §1), UNIQ_KEY added when
 *                     missing and CLUSTER always, as the broker stores them;
 *   lmq_encode_send_responses  the SendMessageResponseHeader frames.
 *
 * Each function does exactly what the general Python path does for the
 * requests it accepts (broker/processors/send.py: parse_send_header,
 * _plain_record, encode_response); anything unusual is declined with a
 * status, never guessed.  That general path is the pure-Python twin: the
 * oracle tests (tests/broker/processors/test_send_native.py) check that
 * whatever this file accepts comes out byte for byte as it would there. */
#include <string.h>

#include "bigendian.h"
#include "entries.h"
#include "sendpath.h"

#define MAGIC_V1 ((int32_t)0xDAA320A7)
#define MAGIC_V2 ((int32_t)0xDAA320AB)
#define MAX_PROPS 32767
#define TOPICS_PER_SCAN 8 /* distinct topics remembered per scan (topic_first) */

/* --- a small, strict JSON reader ------------------------------------------ */

typedef struct {
    const uint8_t *p, *end;
} cur_t;

static void ws(cur_t *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static int expect(cur_t *c, uint8_t ch) {
    ws(c);
    if (c->p >= c->end || *c->p != ch) return 0;
    c->p++;
    return 1;
}

static int hex4(const uint8_t *p, uint32_t *v) {
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) {
        uint8_t h = p[i];
        x <<= 4;
        if (h >= '0' && h <= '9') x |= (uint32_t)(h - '0');
        else if (h >= 'a' && h <= 'f') x |= (uint32_t)(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F') x |= (uint32_t)(h - 'A' + 10);
        else return 0;
    }
    *v = x;
    return 1;
}

/* A JSON string at c (after whitespace), unescaped as UTF-8 into out[*n..cap)
 * (out NULL: validated the same way, nothing kept).  Returns 1, or 0 for
 * anything it does not handle exactly (lone surrogates, raw control
 * characters, invalid UTF-8, no room): the caller declines. */
static int string_into(cur_t *c, uint8_t *out, int64_t cap, int64_t *n) {
    ws(c);
    if (c->p >= c->end || *c->p != '"') return 0;
    c->p++;
    int64_t w = out ? *n : 0;
    if (!out) cap = INT64_MAX;
    while (c->p < c->end) {
        uint8_t ch = *c->p;
        if (ch == '"') {
            c->p++;
            if (out) *n = w;
            return 1;
        }
        if (ch < 0x20) return 0;
        if (ch == '\\') {
            if (c->end - c->p < 2) return 0;
            uint8_t e = c->p[1];
            uint32_t cp;
            c->p += 2;
            switch (e) {
            case '"': cp = '"'; break;
            case '\\': cp = '\\'; break;
            case '/': cp = '/'; break;
            case 'b': cp = 8; break;
            case 'f': cp = 12; break;
            case 'n': cp = 10; break;
            case 'r': cp = 13; break;
            case 't': cp = 9; break;
            case 'u':
                if (c->end - c->p < 4 || !hex4(c->p, &cp)) return 0;
                c->p += 4;
                if (cp >= 0xD800 && cp <= 0xDBFF) {  /* a surrogate pair, or decline */
                    uint32_t lo;
                    if (c->end - c->p < 6 || c->p[0] != '\\' || c->p[1] != 'u' || !hex4(c->p + 2, &lo) ||
                        lo < 0xDC00 || lo > 0xDFFF)
                        return 0;
                    c->p += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    return 0;
                }
                break;
            default: return 0;
            }
            if (cap - w < 4) return 0;
            if (!out) continue;
            if (cp < 0x80) out[w++] = (uint8_t)cp;
            else if (cp < 0x800) {
                out[w++] = (uint8_t)(0xC0 | (cp >> 6));
                out[w++] = (uint8_t)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                out[w++] = (uint8_t)(0xE0 | (cp >> 12));
                out[w++] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
                out[w++] = (uint8_t)(0x80 | (cp & 0x3F));
            } else {
                out[w++] = (uint8_t)(0xF0 | (cp >> 18));
                out[w++] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
                out[w++] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
                out[w++] = (uint8_t)(0x80 | (cp & 0x3F));
            }
            continue;
        }
        /* raw UTF-8: copy a whole, valid sequence */
        int len = ch < 0x80 ? 1 : (ch & 0xE0) == 0xC0 ? 2 : (ch & 0xF0) == 0xE0 ? 3 : (ch & 0xF8) == 0xF0 ? 4 : 0;
        if (len == 0 || c->end - c->p < len || cap - w < len) return 0;
        for (int i = 1; i < len; i++)
            if ((c->p[i] & 0xC0) != 0x80) return 0;
        if (len == 2 && ch < 0xC2) return 0;                                   /* overlong */
        if (len == 3 && ch == 0xE0 && c->p[1] < 0xA0) return 0;                 /* overlong */
        if (len == 3 && ch == 0xED && c->p[1] >= 0xA0) return 0;                /* a surrogate */
        if (len == 4 && (ch > 0xF4 || (ch == 0xF0 && c->p[1] < 0x90) || (ch == 0xF4 && c->p[1] >= 0x90)))
            return 0;
        if (out) {
            memcpy(out + w, c->p, (size_t)len);
            w += len;
        }
        c->p += len;
    }
    return 0;
}

/* A JSON integer (no fraction or exponent) into *v; 0 if not one. */
static int int_value(cur_t *c, int64_t *v) {
    ws(c);
    int neg = 0;
    if (c->p < c->end && *c->p == '-') {
        neg = 1;
        c->p++;
    }
    int digits = 0;
    int64_t x = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        if (++digits > 18) return 0;
        x = x * 10 + (*c->p - '0');
        c->p++;
    }
    if (digits == 0) return 0;
    if (c->p < c->end && (*c->p == '.' || *c->p == 'e' || *c->p == 'E')) return 0;
    *v = neg ? -x : x;
    return 1;
}

/* Skip any JSON value (bounded depth); 0 on malformed input. */
static int skip_value(cur_t *c, int depth) {
    ws(c);
    if (c->p >= c->end || depth > 16) return 0;
    uint8_t ch = *c->p;
    if (ch == '"') return string_into(c, NULL, 0, NULL);
    if (ch == '{' || ch == '[') {
        uint8_t close = ch == '{' ? '}' : ']';
        c->p++;
        ws(c);
        if (c->p < c->end && *c->p == close) {
            c->p++;
            return 1;
        }
        for (;;) {
            if (ch == '{') {
                if (!skip_value(c, depth + 1) || !expect(c, ':')) return 0;
            }
            if (!skip_value(c, depth + 1)) return 0;
            ws(c);
            if (c->p < c->end && *c->p == ',') {
                c->p++;
                continue;
            }
            return expect(c, close);
        }
    }
    /* true, false, null: exactly */
    static const char *const lits[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(lits[i]);
        if ((size_t)(c->end - c->p) >= n && memcmp(c->p, lits[i], n) == 0) {
            c->p += n;
            return 1;
        }
    }
    /* a number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
    if (*c->p == '-') c->p++;
    if (c->p >= c->end || *c->p < '0' || *c->p > '9') return 0;
    if (*c->p == '0') c->p++;
    else
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++;
    if (c->p < c->end && *c->p == '.') {
        c->p++;
        if (c->p >= c->end || *c->p < '0' || *c->p > '9') return 0;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++;
    }
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
        c->p++;
        if (c->p < c->end && (*c->p == '+' || *c->p == '-')) c->p++;
        if (c->p >= c->end || *c->p < '0' || *c->p > '9') return 0;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++;
    }
    return 1;
}

/* --- SEND_MESSAGE_V2 headers -------------------------------------------------- */

/* The V2 extFields a record needs, by their one-letter names. */
enum { F_A, F_B, F_C, F_D, F_E, F_F, F_G, F_H, F_I, F_J, F_K, F_L, F_M, NF };

static int plain_digits(const uint8_t *s, int64_t n, int max_digits, int64_t *v) {
    if (n < 1 || n > max_digits) return 0;
    int64_t x = 0;
    for (int64_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        x = x * 10 + (s[i] - '0');
    }
    *v = x;
    return 1;
}

static const uint8_t *find(const uint8_t *hay, int64_t n, const char *needle, int64_t m) {
    if (m == 0 || n < m) return NULL;
    for (int64_t i = 0; i + m <= n; i++)
        if (hay[i] == (uint8_t)needle[0] && memcmp(hay + i, needle, (size_t)m) == 0) return hay + i;
    return NULL;
}

static int32_t parse_one(const uint8_t *hdr, int64_t hlen, lmq_send_req *r, uint8_t *scratch, int64_t cap,
                         int64_t *used) {
    cur_t c = {hdr, hdr + hlen};
    int64_t vals_off[NF], vals_len[NF];
    int have[NF] = {0};
    int64_t code = -1, flag = 0, opaque = 0, version = 0;
    int seen_code = 0, seen_flag = 0, seen_opaque = 0, seen_version = 0, seen_ext = 0;
    if (!expect(&c, '{')) return LMQ_SEND_BAD_JSON;
    ws(&c);
    if (c.p < c.end && *c.p == '}') return LMQ_SEND_BAD_JSON;
    for (;;) {
        int64_t kstart = *used, klen;
        if (!string_into(&c, scratch, cap, used)) return LMQ_SEND_BAD_JSON;
        klen = *used - kstart;
        const uint8_t *key = scratch + kstart;
        *used = kstart; /* keys are not kept */
        if (!expect(&c, ':')) return LMQ_SEND_BAD_JSON;
        /* The fields the general decoder converts are taken in one form
         * only (an integer; extFields an object of strings), each at most
         * once (JSON's "last one wins" is left to it); the rest it ignores
         * or never fails on (language, serializeTypeCurrentRPC, unknown
         * keys) and is skipped; remark must be text or null. */
        if (klen == 4 && memcmp(key, "code", 4) == 0) {
            if (seen_code++ || !int_value(&c, &code)) return LMQ_SEND_GENERAL;
        } else if (klen == 4 && memcmp(key, "flag", 4) == 0) {
            if (seen_flag++ || !int_value(&c, &flag) || flag < INT32_MIN || flag > INT32_MAX) return LMQ_SEND_GENERAL;
        } else if (klen == 6 && memcmp(key, "opaque", 6) == 0) {
            if (seen_opaque++ || !int_value(&c, &opaque) || opaque < INT32_MIN || opaque > INT32_MAX)
                return LMQ_SEND_GENERAL;
        } else if (klen == 7 && memcmp(key, "version", 7) == 0) {
            if (seen_version++ || !int_value(&c, &version) || version < INT32_MIN || version > INT32_MAX)
                return LMQ_SEND_GENERAL;
        } else if (klen == 6 && memcmp(key, "remark", 6) == 0) {
            ws(&c);
            if (c.p < c.end && *c.p == '"') {
                if (!string_into(&c, NULL, 0, NULL)) return LMQ_SEND_GENERAL;
            } else if ((size_t)(c.end - c.p) >= 4 && memcmp(c.p, "null", 4) == 0) {
                c.p += 4;
            } else {
                return LMQ_SEND_GENERAL;
            }
        } else if (klen == 9 && memcmp(key, "extFields", 9) == 0) {
            if (seen_ext++ || !expect(&c, '{')) return LMQ_SEND_GENERAL;
            ws(&c);
            if (c.p < c.end && *c.p == '}') {
                c.p++;
            } else {
                for (int entries = 1;; entries++) {
                    if (entries > LMQ_MAX_EXT_FIELDS) return LMQ_SEND_GENERAL; /* the general decoder refuses it */
                    int64_t fstart = *used;
                    if (!string_into(&c, scratch, cap, used)) return LMQ_SEND_GENERAL;
                    int64_t flen = *used - fstart;
                    int field = (flen == 1 && scratch[fstart] >= 'a' && scratch[fstart] < 'a' + NF)
                                    ? scratch[fstart] - 'a' : -1;
                    *used = fstart;
                    if (!expect(&c, ':')) return LMQ_SEND_BAD_JSON;
                    ws(&c);
                    if (c.p >= c.end || *c.p != '"') return LMQ_SEND_GENERAL; /* a non-text value */
                    int64_t vstart = *used;
                    if (!string_into(&c, scratch, cap, used)) return LMQ_SEND_GENERAL;
                    if (field >= 0) {
                        if (have[field]) return LMQ_SEND_GENERAL; /* given twice: JSON's last wins; decline */
                        have[field] = 1;
                        vals_off[field] = vstart;
                        vals_len[field] = *used - vstart;
                    } else {
                        *used = vstart; /* other fields (n, brokerName...) are not needed */
                    }
                    ws(&c);
                    if (c.p < c.end && *c.p == ',') {
                        c.p++;
                        continue;
                    }
                    if (!expect(&c, '}')) return LMQ_SEND_BAD_JSON;
                    break;
                }
            }
        } else {
            if (!skip_value(&c, 0)) return LMQ_SEND_BAD_JSON;
        }
        ws(&c);
        if (c.p < c.end && *c.p == ',') {
            c.p++;
            continue;
        }
        if (!expect(&c, '}')) return LMQ_SEND_BAD_JSON;
        break;
    }
    ws(&c);
    if (c.p != c.end) return LMQ_SEND_BAD_JSON;
    if (code != 310 || !seen_opaque || (flag & 1)) return LMQ_SEND_GENERAL; /* (flag bit 0: a response) */
    r->code = (int32_t)code;
    r->opaque = (int32_t)opaque;
    r->flag = (int32_t)flag;
    /* required fields; plain digits only (HeaderReader's rules for the rest) */
    for (int f = F_A; f <= F_H; f++)
        if (!have[f]) return LMQ_SEND_GENERAL;
    int64_t v;
    if (!plain_digits(scratch + vals_off[F_D], vals_len[F_D], 9, &v)) return LMQ_SEND_GENERAL;
    if (!plain_digits(scratch + vals_off[F_E], vals_len[F_E], 9, &v)) return LMQ_SEND_GENERAL;
    r->queue_id = (int32_t)v;
    if (!plain_digits(scratch + vals_off[F_F], vals_len[F_F], 9, &v)) return LMQ_SEND_GENERAL;
    r->sysflag = (int32_t)v;
    if (!plain_digits(scratch + vals_off[F_G], vals_len[F_G], 18, &v)) return LMQ_SEND_GENERAL;
    r->born_timestamp = v;
    if (!plain_digits(scratch + vals_off[F_H], vals_len[F_H], 9, &v)) return LMQ_SEND_GENERAL;
    r->msg_flag = (int32_t)v;
    r->reconsume_times = 0;
    if (have[F_J]) {
        if (!plain_digits(scratch + vals_off[F_J], vals_len[F_J], 9, &v)) return LMQ_SEND_GENERAL;
        r->reconsume_times = (int32_t)v;
    }
    if (have[F_L] && !plain_digits(scratch + vals_off[F_L], vals_len[F_L], 9, &v)) return LMQ_SEND_GENERAL;
    if (have[F_M]) { /* batch: "false"/"0"/"1" is a single message; "true" (and the rest) not here */
        const uint8_t *m = scratch + vals_off[F_M];
        int64_t n = vals_len[F_M];
        if (!((n == 5 && memcmp(m, "false", 5) == 0) || (n == 1 && (m[0] == '0' || m[0] == '1'))))
            return LMQ_SEND_GENERAL;
    }
    r->topic_off = (uint32_t)vals_off[F_B];
    r->topic_len = (uint32_t)vals_len[F_B];
    /* properties: what _plain_record takes (see there) */
    int64_t plen = have[F_I] ? vals_len[F_I] : 0;
    const uint8_t *props = have[F_I] ? scratch + vals_off[F_I] : scratch;
    r->props_off = have[F_I] ? (uint32_t)vals_off[F_I] : 0;
    r->props_len = (uint32_t)plen;
    r->uniq_off = r->uniq_len = 0;
    if (plen) {
        int64_t c1 = 0, c2 = 0;
        for (int64_t i = 0; i < plen; i++) {
            c1 += props[i] == 1;
            c2 += props[i] == 2;
        }
        if (props[plen - 1] != 2 || c1 != c2) return LMQ_SEND_PROPS;
        if (find(props, plen, "DELAY\x01", 6) || find(props, plen, "CLUSTER\x01", 8) ||
            find(props, plen, "TRAN_MSG\x01", 9) || find(props, plen, "TIMER_", 6))
            return LMQ_SEND_PROPS;
        const uint8_t *u = NULL;
        if (plen >= 9 && memcmp(props, "UNIQ_KEY\x01", 9) == 0) u = props;
        else {
            const uint8_t *x = find(props, plen, "\x02UNIQ_KEY\x01", 10);
            if (x) u = x + 1;
        }
        if (u) {
            const uint8_t *val = u + 9;
            const uint8_t *stop = memchr(val, 2, (size_t)(props + plen - val));
            if (!stop || stop == val) return LMQ_SEND_PROPS; /* empty: Java drops it */
            if (find(val, props + plen - val, "UNIQ_KEY\x01", 9)) return LMQ_SEND_PROPS; /* twice */
            r->uniq_off = (uint32_t)(val - scratch);
            r->uniq_len = (uint32_t)(stop - val);
        }
    }
    return LMQ_SEND_OK;
}

static const char SEND_V2_PREFIX[] = "{\"code\":310,";

int64_t lmq_scan_requests(const uint8_t *buf, int64_t len, int64_t max_frame, int64_t max_n,
                          lmq_send_req *out, uint8_t *scratch, int64_t scratch_cap) {
    int64_t pos = 0, used = 0, n = 0;
    int32_t topics[TOPICS_PER_SCAN];
    int n_topics = 0;
    while (n < max_n && len - pos >= 8) {
        /* the decoder's checks; a frame failing one ends the scan (the
         * general decoder reports it) */
        int64_t length = lmq_r32(buf + pos);
        uint32_t lt = (uint32_t)lmq_r32(buf + pos + 4);
        int64_t header_len = lt & 0xFFFFFF;
        int32_t stype = (int32_t)(lt >> 24);
        if (length < 4 || header_len > length - 4 || header_len > LMQ_MAX_HEADER_SIZE || (stype != 0 && stype != 1) ||
            length + 4 > max_frame || len - pos < 4 + length)
            break;
        lmq_send_req *r = &out[n++];
        memset(r, 0, sizeof(*r));
        r->frame_off = pos;
        r->frame_len = 4 + length;
        r->header_off = pos + 8;
        r->header_len = header_len;
        r->body_off = pos + 8 + header_len;
        r->body_len = length - 4 - header_len;
        r->stype = stype;
        r->status = LMQ_SEND_OTHER;
        const size_t pl = sizeof(SEND_V2_PREFIX) - 1;
        if (stype == 0 && (size_t)header_len >= pl && memcmp(buf + r->header_off, SEND_V2_PREFIX, pl) == 0) {
            if (scratch_cap - used < header_len) {
                if (n > 1) { /* the scratch is full: end the scan here, the next one goes on */
                    n--;
                    break;
                }
                r->status = LMQ_SEND_GENERAL; /* no room to unescape it */
            } else {
                int64_t mark = used;
                r->status = parse_one(buf + r->header_off, header_len, r, scratch, scratch_cap, &used);
                if (r->status != LMQ_SEND_OK) used = mark; /* nothing of a declined header is kept */
            }
        }
        r->topic_first = (int32_t)(n - 1);
        if (r->status == LMQ_SEND_OK) {
            /* A scan is usually one or a few topics: the send path checks
             * each topic once, keyed by its first request. */
            int k = 0;
            for (; k < n_topics; k++) {
                const lmq_send_req *t = &out[topics[k]];
                if (t->topic_len == r->topic_len &&
                    memcmp(scratch + t->topic_off, scratch + r->topic_off, r->topic_len) == 0) {
                    r->topic_first = topics[k];
                    break;
                }
            }
            if (k == n_topics && n_topics < TOPICS_PER_SCAN) topics[n_topics++] = (int32_t)(n - 1);
        }
        pos += 4 + length;
    }
    return n;
}

/* --- records --------------------------------------------------------------------- */


static const char HEX[] = "0123456789ABCDEF";

int64_t lmq_record_size(const lmq_send_env *env, int64_t body_len, int64_t topic_len, int v2, int64_t props_len) {
    return 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + env->born_host_len + 8 + env->store_host_len + 4 + 8 + 4 + body_len +
           (v2 ? 2 : 1) + topic_len + 2 + props_len;
}

uint8_t *lmq_put_record(uint8_t *p, int64_t total, int v2, int32_t queue_id, int32_t msg_flag, int32_t sysflag,
                        int64_t born_timestamp, int32_t reconsume_times, const uint8_t *body, int64_t body_len,
                        const uint8_t *topic, int64_t topic_len, const uint8_t *props, int64_t props_len,
                        int64_t new_props_len, int make_uniq, int32_t counter, const lmq_send_env *env) {
    int64_t bh = env->born_host_len, sh = env->store_host_len; /* 8 or 20 (ip + port) */
    lmq_w32(p, (int32_t)total);
    lmq_w32(p + 4, v2 ? MAGIC_V2 : MAGIC_V1);
    lmq_w32(p + 8, (int32_t)(lmq_body_crc32(0, body, (size_t)body_len) & 0x7FFFFFFF));
    lmq_w32(p + 12, queue_id);
    lmq_w32(p + 16, msg_flag);
    lmq_w64(p + 20, 0); /* QUEUEOFFSET: the append hook stamps it */
    lmq_w64(p + 28, 0); /* PHYSICALOFFSET: likewise */
    lmq_w32(p + 36, sysflag);
    lmq_w64(p + 40, born_timestamp);
    uint8_t *q = p + 48;
    memcpy(q, env->born_host, (size_t)bh);
    q += bh;
    lmq_w64(q, env->store_timestamp);
    q += 8;
    memcpy(q, env->store_host, (size_t)sh);
    q += sh;
    lmq_w32(q, reconsume_times);
    lmq_w64(q + 4, 0); /* PREPAREDTXOFFSET */
    lmq_w32(q + 12, (int32_t)body_len);
    q += 16;
    memcpy(q, body, (size_t)body_len);
    q += body_len;
    if (v2) {
        lmq_w16(q, (int32_t)topic_len);
        q += 2;
    } else {
        *q++ = (uint8_t)topic_len;
    }
    memcpy(q, topic, (size_t)topic_len);
    q += topic_len;
    lmq_w16(q, (int32_t)new_props_len);
    q += 2;
    memcpy(q, props, (size_t)props_len);
    q += props_len;
    if (make_uniq) { /* MessageClientIDSetter: prefix, time since the month began, counter */
        memcpy(q, "UNIQ_KEY\x01", 9);
        memcpy(q + 9, env->uniq_prefix, (size_t)env->uniq_prefix_len);
        q = lmq_put_uniq_tail(q + 9 + env->uniq_prefix_len, env->uniq_diff, counter);
        *q++ = 2;
    }
    memcpy(q, "CLUSTER\x01", 8);
    q += 8;
    memcpy(q, env->cluster, (size_t)env->cluster_len);
    q += env->cluster_len;
    *q++ = 2;
    return q;
}

int64_t lmq_encode_sends(const uint8_t *buf, const lmq_send_req *reqs, const int32_t *which,
                         const int32_t *queue_ids, const int32_t *sysflags, int64_t n, const uint8_t *scratch,
                         const lmq_send_env *env, uint8_t *out, int64_t cap, int64_t *rec_off, int32_t *rec_len,
                         int64_t *uniq_off, int32_t *uniq_len, int32_t *uniq_counter_used) {
    int64_t w = 0;
    int32_t counter = env->uniq_counter;
    for (int64_t k = 0; k < n; k++) {
        const lmq_send_req *r = &reqs[which[k]];
        int64_t tl = r->topic_len, pl = r->props_len;
        int v2 = tl > 127;
        int64_t uniq_extra = r->uniq_len ? 0 : 9 + env->uniq_prefix_len + 12 + 1;
        int64_t new_pl = pl + uniq_extra + 8 + env->cluster_len + 1;
        if (new_pl > MAX_PROPS || (v2 && tl > 32767)) return -1 - k;
        int64_t total = lmq_record_size(env, r->body_len, tl, v2, new_pl);
        if (cap - w < total) return -1 - k;
        lmq_put_record(out + w, total, v2, queue_ids[k], r->msg_flag, sysflags[k], r->born_timestamp,
                       r->reconsume_times, buf + r->body_off, r->body_len, scratch + r->topic_off, tl,
                       scratch + r->props_off, pl, new_pl, !r->uniq_len, counter, env);
        int64_t props_at = w + total - new_pl; /* the stored properties: as sent, then UNIQ_KEY, CLUSTER */
        if (r->uniq_len) {
            uniq_off[k] = props_at + (int64_t)(r->uniq_off - r->props_off);
            uniq_len[k] = (int32_t)r->uniq_len;
        } else {
            uniq_off[k] = props_at + pl + 9;
            uniq_len[k] = env->uniq_prefix_len + 12;
            counter = (counter + 1) & 0xFFFF;
        }
        rec_off[k] = w;
        rec_len[k] = (int32_t)total;
        w += total;
    }
    *uniq_counter_used = counter;
    return w;
}

/* --- responses ------------------------------------------------------------------ */

static uint8_t *put(uint8_t *q, const char *s) {
    size_t n = strlen(s);
    memcpy(q, s, n);
    return q + n;
}
static uint8_t *put_int(uint8_t *q, int64_t v) {
    char tmp[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)(-(v + 1)) + 1 : (uint64_t)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) *q++ = '-';
    while (n) *q++ = (uint8_t)tmp[--n];
    return q;
}

/* JSON string content of UTF-8 text as orjson writes it: ", \ and control
 * characters escaped (\b \f \n \r \t, else \u00XX), the rest as is. */
static uint8_t *put_escaped(uint8_t *q, const uint8_t *s, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint8_t ch = s[i];
        if (ch == '"' || ch == '\\') {
            *q++ = '\\';
            *q++ = ch;
        } else if (ch < 0x20) {
            *q++ = '\\';
            switch (ch) {
            case 8: *q++ = 'b'; break;
            case 12: *q++ = 'f'; break;
            case 10: *q++ = 'n'; break;
            case 13: *q++ = 'r'; break;
            case 9: *q++ = 't'; break;
            default:
                *q++ = 'u';
                *q++ = '0';
                *q++ = '0';
                *q++ = (uint8_t)HEX[ch >> 4];
                *q++ = (uint8_t)(HEX[ch & 0xF] | 0x20 * (HEX[ch & 0xF] > '9')); /* lower-case hex */
            }
        } else {
            *q++ = ch;
        }
    }
    return q;
}

int64_t lmq_encode_send_responses(const int32_t *opaques, const int32_t *queue_ids, const int64_t *queue_offsets,
                                  const int64_t *phy_offsets, const uint8_t *uniq_buf, const int64_t *uniq_off,
                                  const int32_t *uniq_len, int64_t n, const uint8_t *store_host,
                                  int32_t store_host_len, int32_t version, uint8_t *out, int64_t cap,
                                  int64_t *frame_off) {
    int64_t w = 0;
    for (int64_t k = 0; k < n; k++) {
        /* worst case: fixed text ~200 + msgId 56 + digits + escaped uniq (6x) */
        if (cap - w < 400 + 6 * (int64_t)uniq_len[k]) return -1 - k;
        uint8_t *frame = out + w, *q = frame + 8;
        q = put(q, "{\"code\":0,\"extFields\":{\"MSG_REGION\":\"DefaultRegion\",\"TRACE_ON\":\"true\",\"msgId\":\"");
        for (int32_t i = 0; i < store_host_len; i++) {
            *q++ = (uint8_t)HEX[store_host[i] >> 4];
            *q++ = (uint8_t)HEX[store_host[i] & 0xF];
        }
        for (int s = 56; s >= 0; s -= 8) {
            uint8_t b = (uint8_t)((uint64_t)phy_offsets[k] >> s);
            *q++ = (uint8_t)HEX[b >> 4];
            *q++ = (uint8_t)HEX[b & 0xF];
        }
        q = put(q, "\",\"queueId\":\"");
        q = put_int(q, queue_ids[k]);
        q = put(q, "\",\"queueOffset\":\"");
        q = put_int(q, queue_offsets[k]);
        q = put(q, "\",\"transactionId\":\"");
        q = put_escaped(q, uniq_buf + uniq_off[k], uniq_len[k]);
        q = put(q, "\"},\"flag\":1,\"language\":\"JAVA\",\"opaque\":");
        q = put_int(q, opaques[k]);
        q = put(q, ",\"serializeTypeCurrentRPC\":\"JSON\",\"version\":");
        q = put_int(q, version);
        *q++ = '}';
        int64_t header_len = q - (frame + 8);
        lmq_w32(frame, (int32_t)(4 + header_len));
        lmq_w32(frame + 4, (int32_t)header_len); /* serialize type JSON (0) in the top byte */
        frame_off[k] = w;
        w += 8 + header_len;
    }
    return w;
}
