/* SHA-1 (FIPS 180-4) and HMAC-SHA1 (RFC 2104) for the ACL check of the
 * send path (acl.c): RocketMQ's ACL 1.0 signature is
 * Base64(HmacSHA1(secretKey, content)).  Written here rather than linked
 * from libcrypto so that a fresh machine needs only gcc (README: "The two
 * commands").  Two block functions: the SHA extensions of x86 CPUs that
 * have them (picked once, at the first call, with cpuid), else portable C.
 * Python's hashlib/hmac is the oracle (tests/broker/acl/test_native_acl.py,
 * both block functions, every length around the block boundaries). */
#include <string.h>

#include "acl_sha1.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define LMQ_HAVE_SHANI 1
#endif

static const uint32_t H0[5] = {0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u, 0xC3D2E1F0u};

static inline uint32_t rol(uint32_t x, int n) { return (x << n) | (x >> (32 - n)); }

#define R(f, k, t)                                          \
    do {                                                    \
        uint32_t x = rol(a, 5) + (f) + e + (k) + w[t];       \
        e = d, d = c, c = rol(b, 30), b = a, a = x;         \
    } while (0)

static void blocks_portable(uint32_t h[5], const uint8_t *p, int64_t n) {
    for (; n > 0; n--, p += 64) {
        uint32_t w[80];
        for (int t = 0; t < 16; t++)
            w[t] = ((uint32_t)p[4 * t] << 24) | ((uint32_t)p[4 * t + 1] << 16) | ((uint32_t)p[4 * t + 2] << 8) |
                   p[4 * t + 3];
        for (int t = 16; t < 80; t++) w[t] = rol(w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16], 1);
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
        for (int t = 0; t < 20; t++) R(d ^ (b & (c ^ d)), 0x5A827999u, t);
        for (int t = 20; t < 40; t++) R(b ^ c ^ d, 0x6ED9EBA1u, t);
        for (int t = 40; t < 60; t++) R((b & c) | (d & (b | c)), 0x8F1BBCDCu, t);
        for (int t = 60; t < 80; t++) R(b ^ c ^ d, 0xCA62C1D6u, t);
        h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e;
    }
}

#ifdef LMQ_HAVE_SHANI
/* Four rounds: group i's message words W (its four 32-bit words, first
 * word in the top lane), E the next E (sha1nexte) or, for the first
 * group, E0 + W. */
#define RNDS(F) abcd = _mm_sha1rnds4_epu32(abcd, e, F)
/* The schedule of four words: W[i] = msg2(msg1(W[i-4], W[i-3]) ^ W[i-2], W[i-1]). */
#define NEXT_W(w4, w3, w2, w1) _mm_sha1msg2_epu32(_mm_xor_si128(_mm_sha1msg1_epu32(w4, w3), w2), w1)
#define GROUP(W, F)                          \
    do {                                     \
        e = _mm_sha1nexte_epu32(prev, W);    \
        prev = abcd;                         \
        RNDS(F);                             \
    } while (0)

__attribute__((target("sha,sse4.1,ssse3"))) static void blocks_shani(uint32_t h[5], const uint8_t *p, int64_t n) {
    const __m128i swap = _mm_set_epi64x(0x0001020304050607LL, 0x08090a0b0c0d0e0fLL);
    __m128i abcd = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)h), 0x1B);
    __m128i e0 = _mm_set_epi32((int)h[4], 0, 0, 0);
    for (; n > 0; n--, p += 64) {
        __m128i abcd_save = abcd, e0_save = e0, e, prev;
        __m128i w0 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)p), swap);
        __m128i w1 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16)), swap);
        __m128i w2 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 32)), swap);
        __m128i w3 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 48)), swap);
        /* group 0: E is the state's E plus the words */
        e = _mm_add_epi32(e0, w0);
        prev = abcd;
        RNDS(0);
        GROUP(w1, 0);
        GROUP(w2, 0);
        GROUP(w3, 0);
        w0 = NEXT_W(w0, w1, w2, w3); GROUP(w0, 0);  /* group 4 */
        w1 = NEXT_W(w1, w2, w3, w0); GROUP(w1, 1);
        w2 = NEXT_W(w2, w3, w0, w1); GROUP(w2, 1);
        w3 = NEXT_W(w3, w0, w1, w2); GROUP(w3, 1);
        w0 = NEXT_W(w0, w1, w2, w3); GROUP(w0, 1);  /* group 8 */
        w1 = NEXT_W(w1, w2, w3, w0); GROUP(w1, 1);
        w2 = NEXT_W(w2, w3, w0, w1); GROUP(w2, 2);
        w3 = NEXT_W(w3, w0, w1, w2); GROUP(w3, 2);
        w0 = NEXT_W(w0, w1, w2, w3); GROUP(w0, 2);  /* group 12 */
        w1 = NEXT_W(w1, w2, w3, w0); GROUP(w1, 2);
        w2 = NEXT_W(w2, w3, w0, w1); GROUP(w2, 2);
        w3 = NEXT_W(w3, w0, w1, w2); GROUP(w3, 3);
        w0 = NEXT_W(w0, w1, w2, w3); GROUP(w0, 3);  /* group 16 */
        w1 = NEXT_W(w1, w2, w3, w0); GROUP(w1, 3);
        w2 = NEXT_W(w2, w3, w0, w1); GROUP(w2, 3);
        w3 = NEXT_W(w3, w0, w1, w2); GROUP(w3, 3);
        /* E after 80 rounds: rol30 of A four rounds before the end, plus the saved E */
        e0 = _mm_sha1nexte_epu32(prev, e0_save);
        abcd = _mm_add_epi32(abcd, abcd_save);
    }
    abcd = _mm_shuffle_epi32(abcd, 0x1B);
    _mm_storeu_si128((__m128i *)h, abcd);
    h[4] = (uint32_t)_mm_extract_epi32(e0, 3);
}

static int cpu_has_shani(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    if (!(c & (1u << 9)) || !(c & (1u << 19))) return 0; /* SSSE3, SSE4.1 */
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 29) & 1; /* SHA */
}
#endif

typedef void (*blocks_fn)(uint32_t h[5], const uint8_t *p, int64_t n);
static blocks_fn BLOCKS = NULL;
static int32_t USES_SHANI = 0;

static blocks_fn pick(void) {
    if (BLOCKS == NULL) {
#ifdef LMQ_HAVE_SHANI
        USES_SHANI = cpu_has_shani();
        BLOCKS = USES_SHANI ? blocks_shani : blocks_portable;
#else
        BLOCKS = blocks_portable;
#endif
    }
    return BLOCKS;
}

int32_t lmq_sha1_uses_shani(void) {
    pick();
    return USES_SHANI;
}

int32_t lmq_sha1_portable(int32_t on) {
    pick();
    int32_t was = BLOCKS == blocks_portable;
#ifdef LMQ_HAVE_SHANI
    USES_SHANI = on ? 0 : cpu_has_shani();
    BLOCKS = USES_SHANI ? blocks_shani : blocks_portable;
#endif
    return was;
}

void lmq_sha1_update(lmq_sha1_ctx *ctx, const uint8_t *data, int64_t len) {
    if (len <= 0) return;
    blocks_fn blocks = pick();
    ctx->total += (uint64_t)len;
    if (ctx->buflen) {
        int64_t take = 64 - ctx->buflen;
        if (take > len) take = len;
        memcpy(ctx->buf + ctx->buflen, data, (size_t)take);
        ctx->buflen += (uint32_t)take;
        data += take;
        len -= take;
        if (ctx->buflen < 64) return;
        blocks(ctx->h, ctx->buf, 1);
        ctx->buflen = 0;
    }
    if (len >= 64) {
        blocks(ctx->h, data, len / 64);
        data += len - len % 64;
        len %= 64;
    }
    if (len) {
        memcpy(ctx->buf, data, (size_t)len);
        ctx->buflen = (uint32_t)len;
    }
}

static void finish(lmq_sha1_ctx *ctx, uint8_t out[20]) {
    uint64_t bits = ctx->total * 8;
    uint8_t pad[72] = {0x80};
    int64_t padlen = (ctx->buflen < 56 ? 56 : 120) - ctx->buflen;
    for (int i = 0; i < 8; i++) pad[padlen + i] = (uint8_t)(bits >> (56 - 8 * i));
    uint64_t total = ctx->total;
    lmq_sha1_update(ctx, pad, padlen + 8);
    ctx->total = total;
    for (int i = 0; i < 5; i++) {
        out[4 * i] = (uint8_t)(ctx->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(ctx->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(ctx->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)ctx->h[i];
    }
}

static void start(lmq_sha1_ctx *ctx, const uint32_t h[5], uint64_t total) {
    memcpy(ctx->h, h, sizeof(ctx->h));
    ctx->total = total;
    ctx->buflen = 0;
}

void lmq_sha1(const uint8_t *data, int64_t len, uint8_t out[20]) {
    lmq_sha1_ctx ctx;
    start(&ctx, H0, 0);
    lmq_sha1_update(&ctx, data, len);
    finish(&ctx, out);
}

void lmq_hmac_sha1_key(const uint8_t *secret, int64_t len, lmq_hmac_key *key) {
    uint8_t k[64] = {0}, block[64];
    if (len > 64) lmq_sha1(secret, len, k);
    else if (len > 0) memcpy(k, secret, (size_t)len);
    blocks_fn blocks = pick();
    memcpy(key->inner, H0, sizeof(H0));
    memcpy(key->outer, H0, sizeof(H0));
    for (int i = 0; i < 64; i++) block[i] = k[i] ^ 0x36;
    blocks(key->inner, block, 1);
    for (int i = 0; i < 64; i++) block[i] = k[i] ^ 0x5c;
    blocks(key->outer, block, 1);
}

void lmq_hmac_sha1_start(const lmq_hmac_key *key, lmq_sha1_ctx *ctx) { start(ctx, key->inner, 64); }

void lmq_hmac_sha1_finish(const lmq_hmac_key *key, lmq_sha1_ctx *ctx, uint8_t out[20]) {
    uint8_t inner[20];
    finish(ctx, inner);
    start(ctx, key->outer, 64);
    lmq_sha1_update(ctx, inner, 20);
    finish(ctx, out);
}

void lmq_hmac_sha1(const lmq_hmac_key *key, const uint8_t *data, int64_t len, uint8_t out[20]) {
    lmq_sha1_ctx ctx;
    lmq_hmac_sha1_start(key, &ctx);
    lmq_sha1_update(&ctx, data, len);
    lmq_hmac_sha1_finish(key, &ctx, out);
}
