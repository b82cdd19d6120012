/* The ACL check of plain SEND_MESSAGE_V2 requests in C, a scan at a time:
 * what broker/acl/validator.py decides for such a request, up to the
 * topic's permission (which broker/acl/fastpath.py decides once per
 * account and topic, in Python, with the validator's own functions).
 *
 * For each request the scanner accepted (status LMQ_SEND_OK), the JSON
 * header's extFields are read again (each value in place, or unescaped
 * into a scratch buffer when it holds an escape) and checked in the
 * validator's order:
 *
 *   no AccessKey                         -> LMQ_ACL_NO_KEY
 *   an AccessKey no account has          -> LMQ_ACL_UNKNOWN_KEY
 *   an account whitelisted for the caller's address -> LMQ_ACL_OK (white)
 *   a field SEND_MESSAGE_V2 does not define, or a value not of its
 *   field's type (broker/acl/fields.py) -> LMQ_ACL_GENERAL (it words it)
 *   HmacSHA1(secret, the values except Signature and _UNIQUE_KEY_QUERY in
 *   key order, then the body) in Base64 != Signature -> LMQ_ACL_BAD_SIGNATURE
 *   else                                 -> LMQ_ACL_OK
 *
 * Anything this file does not model exactly -- a key written with an
 * escape, a field given twice (JSON's last one wins), a top-level value
 * that is an object, an AccessKey with an escape where its text would be
 * needed, a header longer than the scratch -- is LMQ_ACL_GENERAL: the
 * general Python path (validator.validate on the decoded command) decides
 * and words it.  That general path is the oracle
 * (tests/broker/acl/test_native_acl.py): whatever verdict this file gives
 * other than GENERAL, the general path gives too, refusal text included.
 * Every read is bounded by the header (and the data) it is in. */
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "acl.h"

enum { K_TEXT, K_NAME, K_INT, K_LONG, K_BOOL, K_BROKER, K_CHANNEL, K_EMPTY };

/* SendMessageRequestHeaderV2's fields and the generic ones (fields.py
 * SEND_V2 and GENERIC), in the order the signature takes them (Java
 * TreeMap of ASCII keys: bytewise). */
typedef struct {
    const char *name;
    uint8_t len, kind;
} field_t;

static const field_t FIELDS[] = {
    {"AccessKey", 9, K_TEXT},  {"OnsChannel", 10, K_CHANNEL}, {"SecurityToken", 13, K_TEXT},
    {"Signature", 9, K_TEXT},  {"_UNIQUE_KEY_QUERY", 17, K_BOOL},
    {"a", 1, K_NAME},  {"b", 1, K_NAME},  {"bname", 5, K_BROKER}, {"c", 1, K_NAME}, {"d", 1, K_INT},
    {"e", 1, K_INT},   {"f", 1, K_INT},   {"g", 1, K_LONG},       {"h", 1, K_INT},  {"i", 1, K_TEXT},
    {"j", 1, K_INT},   {"k", 1, K_BOOL},  {"l", 1, K_INT},        {"lo", 2, K_BOOL}, {"m", 1, K_BOOL},
    {"n", 1, K_BROKER}, {"ns", 2, K_EMPTY}, {"nsd", 3, K_BOOL},   {"oway", 4, K_BOOL},
};
#define NFIELDS ((int)(sizeof(FIELDS) / sizeof(FIELDS[0])))
#define F_ACCESS_KEY 0
#define F_SIGNATURE 3
#define F_UNIQUE_KEY_QUERY 4

static int field_index(const uint8_t *k, int64_t n) {
    if (n < 1) return -1;
    for (int i = 0; i < NFIELDS; i++)
        if (FIELDS[i].len == n && (uint8_t)FIELDS[i].name[0] == k[0] &&
            (n == 1 || memcmp(FIELDS[i].name + 1, k + 1, (size_t)n - 1) == 0))
            return i;
    return -1;
}

typedef struct {
    const uint8_t *p, *end;
} cur_t;

/* The first byte at or after p (before end) that ends a run of plain
 * string text: '"', a backslash or a control character; end if none.
 * Sixteen bytes at a time where SSE2 is there (every x86-64), never
 * reading at or past end. */
static const uint8_t *plain_run(const uint8_t *p, const uint8_t *end) {
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), ctl = _mm_set1_epi8(0x1F);
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        __m128i m = _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash));
        m = _mm_or_si128(m, _mm_cmpeq_epi8(_mm_max_epu8(v, ctl), ctl)); /* v <= 0x1F, unsigned */
        int mask = _mm_movemask_epi8(m);
        if (mask) return p + __builtin_ctz((unsigned)mask);
        p += 16;
    }
#endif
    while (p < end && *p != '"' && *p != '\\' && *p >= 0x20) p++;
    return p;
}

static void ws(cur_t *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static int expect(cur_t *c, uint8_t ch) {
    ws(c);
    if (c->p >= c->end || *c->p != ch) return 0;
    c->p++;
    return 1;
}

/* A JSON string with no escape at c: its bytes (no check of UTF-8: used
 * only to compare with known ASCII names and to skip). 0 if there is an
 * escape, a control character, or no end. */
static int raw_string(cur_t *c, const uint8_t **s, int64_t *n) {
    ws(c);
    if (c->p >= c->end || *c->p != '"') return 0;
    const uint8_t *start = ++c->p;
    c->p = plain_run(c->p, c->end);
    if (c->p >= c->end || *c->p != '"') return 0;
    *s = start;
    *n = c->p - start;
    c->p++;
    return 1;
}

/* Skip a JSON string that may hold escapes (the scanner checked it). */
static int skip_string(cur_t *c) {
    ws(c);
    if (c->p >= c->end || *c->p != '"') return 0;
    c->p++;
    while ((c->p = plain_run(c->p, c->end)) < c->end) {
        uint8_t ch = *c->p++;
        if (ch == '"') return 1;
        if (ch == '\\') {
            if (c->p >= c->end) return 0;
            c->p++;
        }
    }
    return 0;
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

/* A JSON string value at c: *s, *n its text as UTF-8 -- in the header
 * itself when it holds no escape (no copy), else unescaped into
 * out[*w..cap) -- and *escaped which.  0 for anything not handled exactly
 * (lone surrogates, control characters, no room).  The bytes are UTF-8
 * already: the scanner (sendpath.c) checked every string of a header it
 * accepted, and only those come here. */
static int value(cur_t *c, uint8_t *out, int64_t cap, int64_t *w, const uint8_t **s, int64_t *n, int *escaped) {
    ws(c);
    if (c->p >= c->end || *c->p != '"') return 0;
    const uint8_t *start = ++c->p, *q = plain_run(start, c->end);
    if (q >= c->end || *q < 0x20) return 0;
    if (*q == '"') {
        *s = start;
        *n = q - start;
        *escaped = 0;
        c->p = q + 1;
        return 1;
    }
    int64_t o = *w, first = *w;
    if (cap - o < q - start) return 0;
    memcpy(out + o, start, (size_t)(q - start));
    o += q - start;
    c->p = q;
    *escaped = 1;
    while (c->p < c->end) {
        uint8_t ch = *c->p;
        if (ch == '"') {
            c->p++;
            *s = out + first;
            *n = o - first;
            *w = o;
            return 1;
        }
        if (ch < 0x20) return 0;
        if (ch != '\\') {
            const uint8_t *q2 = plain_run(c->p, c->end);
            if (cap - o < q2 - c->p) return 0;
            memcpy(out + o, c->p, (size_t)(q2 - c->p));
            o += q2 - c->p;
            c->p = q2;
            continue;
        }
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
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (c->end - c->p < 6 || c->p[0] != '\\' || c->p[1] != 'u' || !hex4(c->p + 2, &lo) || lo < 0xDC00 ||
                    lo > 0xDFFF)
                    return 0;
                c->p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return 0;
            }
            break;
        default: return 0;
        }
        if (cap - o < 4) return 0;
        if (cp < 0x80) out[o++] = (uint8_t)cp;
        else if (cp < 0x800) {
            out[o++] = (uint8_t)(0xC0 | (cp >> 6));
            out[o++] = (uint8_t)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out[o++] = (uint8_t)(0xE0 | (cp >> 12));
            out[o++] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
            out[o++] = (uint8_t)(0x80 | (cp & 0x3F));
        } else {
            out[o++] = (uint8_t)(0xF0 | (cp >> 18));
            out[o++] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
            out[o++] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
            out[o++] = (uint8_t)(0x80 | (cp & 0x3F));
        }
    }
    return 0;
}

/* A top-level scalar: a string, a number, true, false or null (objects
 * and arrays: 0, the general path). */
static int skip_scalar(cur_t *c) {
    ws(c);
    if (c->p >= c->end) return 0;
    if (*c->p == '"') return skip_string(c);
    if (*c->p == '{' || *c->p == '[') return 0;
    const uint8_t *start = c->p;
    while (c->p < c->end && *c->p != ',' && *c->p != '}' && *c->p != ' ' && *c->p != '\t' && *c->p != '\n' &&
           *c->p != '\r')
        c->p++;
    return c->p > start;
}

/* --- the field types (fields.py value_fits) ------------------------------------- */

static int is_name_char(uint8_t ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '%' ||
           ch == '|' || ch == '_' || ch == '.' || ch == '-';
}

/* Java's Integer / Long as written: -?(0|[1-9][0-9]*), in range. */
static int fits_number(const uint8_t *s, int64_t n, int is_long) {
    int neg = n > 0 && s[0] == '-';
    const uint8_t *d = s + neg;
    int64_t nd = n - neg;
    if (nd < 1 || nd > (is_long ? 19 : 10)) return 0;
    if (d[0] == '0' && nd > 1) return 0;
    uint64_t v = 0;
    for (int64_t i = 0; i < nd; i++) {
        if (d[i] < '0' || d[i] > '9') return 0;
        v = v * 10 + (uint64_t)(d[i] - '0');
    }
    uint64_t max = is_long ? (uint64_t)INT64_MAX : (uint64_t)INT32_MAX;
    return v <= max + (uint64_t)neg;
}

static int lower_is(const uint8_t *s, int64_t n, const char *word) {
    if ((int64_t)strlen(word) != n) return 0;
    for (int64_t i = 0; i < n; i++) {
        uint8_t ch = s[i];
        if (ch >= 'A' && ch <= 'Z') ch = (uint8_t)(ch + 32);
        if (ch != (uint8_t)word[i]) return 0;
    }
    return 1;
}

static int value_fits(int kind, const uint8_t *s, int64_t n, const lmq_acl_accounts *acc) {
    switch (kind) {
    case K_TEXT: return 1;
    case K_INT: return fits_number(s, n, 0);
    case K_LONG: return fits_number(s, n, 1);
    case K_BOOL: return lower_is(s, n, "true") || lower_is(s, n, "false") || (n == 1 && (s[0] == '0' || s[0] == '1'));
    case K_EMPTY: return n == 0;
    case K_BROKER:
        if (n > 0) return n == acc->broker_len && memcmp(s, acc->broker, (size_t)n) == 0;
        return 1;
    case K_NAME:
        if (n > 255) return 0;
        for (int64_t i = 0; i < n; i++)
            if (!is_name_char(s[i])) return 0;
        return 1;
    case K_CHANNEL:
        if (n > 32) return 0;
        for (int64_t i = 0; i < n; i++)
            if (s[i] < 'A' || s[i] > 'Z') return 0;
        return 1;
    }
    return 0;
}

/* --- accounts ------------------------------------------------------------------ */

static int64_t find_account(const lmq_acl_accounts *acc, const uint8_t *k, int64_t n) {
    int64_t lo = 0, hi = acc->n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        const uint8_t *key = acc->keys + acc->key_off[mid];
        int64_t kn = acc->key_off[mid + 1] - acc->key_off[mid];
        int64_t m = kn < n ? kn : n;
        int cmp = memcmp(key, k, (size_t)m);
        if (cmp == 0) cmp = kn < n ? -1 : kn > n ? 1 : 0;
        if (cmp == 0) return mid;
        if (cmp < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Base64 of the 20-byte MAC == given (28 characters), in time that does
 * not depend on where they differ. */
static int signature_matches(const uint8_t mac[20], const uint8_t *given, int64_t n) {
    uint8_t b[28];
    int o = 0;
    for (int i = 0; i < 18; i += 3) {
        uint32_t v = ((uint32_t)mac[i] << 16) | ((uint32_t)mac[i + 1] << 8) | mac[i + 2];
        b[o++] = (uint8_t)B64[v >> 18];
        b[o++] = (uint8_t)B64[(v >> 12) & 63];
        b[o++] = (uint8_t)B64[(v >> 6) & 63];
        b[o++] = (uint8_t)B64[v & 63];
    }
    uint32_t v = ((uint32_t)mac[18] << 16) | ((uint32_t)mac[19] << 8);
    b[o++] = (uint8_t)B64[v >> 18];
    b[o++] = (uint8_t)B64[(v >> 12) & 63];
    b[o++] = (uint8_t)B64[(v >> 6) & 63];
    b[o++] = '=';
    if (n != 28) return 0;
    uint8_t diff = 0;
    for (int i = 0; i < 28; i++) diff |= (uint8_t)(b[i] ^ given[i]);
    return diff == 0;
}

/* --- one request ---------------------------------------------------------------- */

#define PAIRS_REMEMBERED 16

static int32_t check_one(const uint8_t *hdr, int64_t hlen, const uint8_t *body, int64_t body_len,
                         const lmq_acl_accounts *acc, int64_t *account, int64_t *ak_at, int32_t *ak_n,
                         uint8_t *scratch, int64_t cap) {
    const uint8_t *val[NFIELDS];
    int64_t len[NFIELDS];
    int seen[NFIELDS] = {0};
    const uint8_t *ak_raw = NULL;
    int ak_escaped = 0, seen_ext = 0;
    int64_t w = 0;
    cur_t c = {hdr, hdr + hlen};
    if (!expect(&c, '{')) return LMQ_ACL_GENERAL;
    for (;;) {
        const uint8_t *k;
        int64_t kn;
        if (!raw_string(&c, &k, &kn) || !expect(&c, ':')) return LMQ_ACL_GENERAL;
        if (kn == 9 && memcmp(k, "extFields", 9) == 0) {
            if (seen_ext++ || !expect(&c, '{')) return LMQ_ACL_GENERAL;
            ws(&c);
            if (c.p < c.end && *c.p == '}') {
                c.p++;
            } else {
                for (;;) {
                    const uint8_t *f;
                    int64_t fn;
                    /* an unknown field (the general path words the refusal), an
                     * escaped name, a field given twice: not modelled here */
                    if (!raw_string(&c, &f, &fn)) return LMQ_ACL_GENERAL;
                    int i = field_index(f, fn);
                    if (i < 0 || seen[i] || !expect(&c, ':')) return LMQ_ACL_GENERAL;
                    seen[i] = 1;
                    int escaped;
                    if (!value(&c, scratch, cap, &w, &val[i], &len[i], &escaped)) return LMQ_ACL_GENERAL;
                    if (i == F_ACCESS_KEY) {
                        ak_raw = val[i];
                        ak_escaped = escaped;
                    }
                    ws(&c);
                    if (c.p < c.end && *c.p == ',') {
                        c.p++;
                        continue;
                    }
                    if (!expect(&c, '}')) return LMQ_ACL_GENERAL;
                    break;
                }
            }
        } else if (!skip_scalar(&c)) {
            return LMQ_ACL_GENERAL;
        }
        ws(&c);
        if (c.p < c.end && *c.p == ',') {
            c.p++;
            continue;
        }
        if (!expect(&c, '}')) return LMQ_ACL_GENERAL;
        break;
    }
    ws(&c);
    if (c.p != c.end || !seen_ext) return LMQ_ACL_GENERAL;

    if (!seen[F_ACCESS_KEY]) return LMQ_ACL_NO_KEY;
    int64_t akn = len[F_ACCESS_KEY];
    if (akn > LMQ_ACL_MAX_KEY) return LMQ_ACL_GENERAL;
    /* where its text is, for a refusal naming it (only when written plain) */
    *ak_at = ak_escaped ? -1 : ak_raw - hdr;
    *ak_n = (int32_t)akn;
    int64_t a = find_account(acc, val[F_ACCESS_KEY], akn);
    if (a < 0) return ak_escaped ? LMQ_ACL_GENERAL : LMQ_ACL_UNKNOWN_KEY;
    *account = a;
    if (acc->mode[a] == 1) return LMQ_ACL_OK; /* whitelisted: nothing else is checked */
    if (acc->mode[a] != 0) return LMQ_ACL_GENERAL;
    for (int i = 0; i < NFIELDS; i++)
        if (seen[i] && !value_fits(FIELDS[i].kind, val[i], len[i], acc)) return LMQ_ACL_GENERAL;
    lmq_sha1_ctx ctx;
    lmq_hmac_sha1_start(&acc->hmac[a], &ctx);
    for (int i = 0; i < NFIELDS; i++)
        if (seen[i] && i != F_SIGNATURE && i != F_UNIQUE_KEY_QUERY) lmq_sha1_update(&ctx, val[i], len[i]);
    lmq_sha1_update(&ctx, body, body_len);
    uint8_t mac[20];
    lmq_hmac_sha1_finish(&acc->hmac[a], &ctx, mac);
    int ok = seen[F_SIGNATURE] && signature_matches(mac, val[F_SIGNATURE], len[F_SIGNATURE]);
    if (ok) return LMQ_ACL_OK;
    return ak_escaped ? LMQ_ACL_GENERAL : LMQ_ACL_BAD_SIGNATURE;
}

/* Requests [from, to) of a scan: verdict[i] for each; for LMQ_ACL_OK,
 * pair[i] indexes pairs[] (distinct (account, topic, whitelisted), the
 * first PAIRS_REMEMBERED shared, then one per request); for the refusals
 * naming the AccessKey, ak_off[i]/ak_len[i] its text in data.  Returns
 * how many pairs there are. */
int64_t lmq_acl_check_sends(const uint8_t *data, int64_t data_len, const lmq_send_req *reqs, int64_t from,
                            int64_t to, const lmq_acl_accounts *acc, int32_t *verdict, int32_t *pair,
                            int64_t *ak_off, int32_t *ak_len, lmq_acl_pair *pairs, uint8_t *scratch,
                            int64_t scratch_cap) {
    int64_t npairs = 0;
    for (int64_t i = from; i < to; i++) {
        const lmq_send_req *r = &reqs[i];
        verdict[i] = LMQ_ACL_GENERAL;
        pair[i] = -1;
        ak_off[i] = -1;
        ak_len[i] = 0;
        if (r->status != LMQ_SEND_OK || r->header_off < 0 || r->header_len < 0 || r->body_off < 0 ||
            r->body_len < 0 || r->header_off > data_len - r->header_len || r->body_off > data_len - r->body_len ||
            r->header_len > scratch_cap)
            continue;
        int64_t account = -1, ak_at = -1;
        int32_t akn = 0;
        int32_t v = check_one(data + r->header_off, r->header_len, data + r->body_off, r->body_len, acc, &account,
                              &ak_at, &akn, scratch, scratch_cap);
        verdict[i] = v;
        if (v == LMQ_ACL_UNKNOWN_KEY || v == LMQ_ACL_BAD_SIGNATURE) {
            ak_off[i] = r->header_off + ak_at;
            ak_len[i] = akn;
        } else if (v == LMQ_ACL_OK) {
            int32_t white = acc->mode[account] == 1;
            int64_t k = 0, seen = npairs < PAIRS_REMEMBERED ? npairs : PAIRS_REMEMBERED;
            for (; k < seen; k++)
                if (pairs[k].account == account && pairs[k].topic_first == r->topic_first && pairs[k].white == white)
                    break;
            if (k == seen) {
                k = npairs++;
                pairs[k].account = (int32_t)account;
                pairs[k].topic_first = r->topic_first;
                pairs[k].white = white;
            }
            pair[i] = (int32_t)k;
        }
    }
    return npairs;
}

/* The topic decisions (per pair: LMQ_ACL_OK or LMQ_ACL_DENIED) onto the
 * requests that passed the signature. */
void lmq_acl_apply(int32_t *verdict, const int32_t *pair, const int32_t *pair_verdict, int64_t from, int64_t to) {
    for (int64_t i = from; i < to; i++)
        if (verdict[i] == LMQ_ACL_OK) verdict[i] = pair_verdict[pair[i]];
}
