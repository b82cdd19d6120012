/* The hot loops of the DLedger-format store (spec §5.1-5.3):
 *
 *   lmq_layout_plan   places a batch of bodies in the data address space,
 *                     applying DLedger's blank rule (an entry of `size`
 *                     bytes goes to the next segment when size + 8 is more
 *                     than what is left in the current one);
 *   lmq_layout_fill   writes headers (CRCs 0), bodies and blank fillers into
 *                     a zeroed buffer that mirrors [start_pos, end_pos);
 *   lmq_layout_seal   computes bodyCrc/chainCrc into those headers (after the
 *                     append hooks ran) and emits the 32-byte index units;
 *   lmq_scan_entries  walks entries in a segment region (recovery, tools) or
 *                     in a replication batch (follower append, read_batch)
 *                     and checks everything recovery checks, stopping at the
 *                     first problem with a reason code;
 *   lmq_first_nonzero finds garbage after the end of a log;
 *   lmq_first_diff    finds the first index unit that disagrees with the data.
 *
 * Everything is big-endian on disk.  The scan state is an int64_t array so
 * the Python twin (native/entries.py) shares the exact same calling
 * convention; the slot numbers and reason codes below are mirrored there.
 */
#include <string.h>

#include "entries.h"
#include "hash.h"

enum { HDR = 48, UNIT = 32, MIN_BLANK = 8 };

/* scan state slots */
enum {
    S_NEXT_INDEX, S_LAST_TERM, S_POS, S_SEG_END, S_SEG_SIZE, S_PREV_CHAIN,
    S_CRC_MODE, S_CHAIN_KNOWN, S_COUNT, S_CONSUMED, S_DETAIL, S_EXPECTED
};

/* flags */
enum { F_SEGMENT = 1, F_BATCH = 2, F_CHECK_CRC = 4 };

/* reasons: < 16 are normal stops, >= 16 are problems */
enum {
    R_END = 0, R_BLANK = 1, R_MAX = 2, R_SHORT = 3, R_ROLL = 4,
    R_BAD_MAGIC = 16, R_BAD_SIZE, R_BAD_BODY_SIZE, R_BAD_CHANNEL, R_BAD_POS,
    R_BAD_INDEX, R_BAD_TERM, R_BAD_BODY_CRC, R_BAD_CHAIN_CRC, R_MISSING_CRC,
    R_TORN, R_BAD_BLANK, R_NO_ROOM
};

static inline uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) << 32 | get32(p + 4); }
static inline void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}
static inline void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)(v >> 32)); put32(p + 4, (uint32_t)v); }

/* --- body CRC32 ------------------------------------------------------------
 * Bodies are CRC'ed on every append and every scan, so on x86-64 CPUs with
 * PCLMULQDQ the bulk of a body is folded with carry-less multiplies (the
 * folding method of Gopal et al., "Fast CRC Computation for Generic
 * Polynomials Using PCLMULQDQ", Intel 2009); the tail and other CPUs use the
 * table CRC of hash.c.  Both give zlib's CRC32 (tests/test_native_entries.py
 * compares them over many lengths and alignments).  The folding constants
 * are derived for the bit-reflected CRC-32 polynomial P = 0x104C11DB7 as
 * K(n) = reflect32(x^n mod P) << 1; mu' is reflect33(x^64 div P).
 */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define LMQ_HAVE_CLMUL 1

static const uint64_t FOLD_512[2] = {0x154442bd4ull, 0x1c6e41596ull}; /* K(544), K(480) */
static const uint64_t FOLD_128[2] = {0x1751997d0ull, 0x0ccaa009eull}; /* K(160), K(96) */
static const uint64_t FOLD_64[2] = {0x163cd6124ull, 0};               /* K(64) */
static const uint64_t BARRETT[2] = {0x1db710641ull, 0x1f7011641ull};  /* P', mu' */

/* Internal (pre-inverted) CRC state over len bytes; len >= 64, len % 16 == 0. */
__attribute__((target("pclmul,sse4.1")))
static uint32_t clmul_fold(const uint8_t *p, size_t len, uint32_t state) {
    const __m128i k512 = _mm_loadu_si128((const __m128i *)FOLD_512);
    const __m128i k128 = _mm_loadu_si128((const __m128i *)FOLD_128);
    __m128i a = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)state));
    __m128i b = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i d = _mm_loadu_si128((const __m128i *)(p + 48));
    p += 64;
    len -= 64;
    /* four independent lanes, each folded 512 bits forward per step */
#define FOLD(acc, k, next) \
    _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(acc, k, 0x00), _mm_clmulepi64_si128(acc, k, 0x11)), next)
    for (; len >= 64; p += 64, len -= 64) {
        a = FOLD(a, k512, _mm_loadu_si128((const __m128i *)p));
        b = FOLD(b, k512, _mm_loadu_si128((const __m128i *)(p + 16)));
        c = FOLD(c, k512, _mm_loadu_si128((const __m128i *)(p + 32)));
        d = FOLD(d, k512, _mm_loadu_si128((const __m128i *)(p + 48)));
    }
    /* merge the lanes, then fold the remaining 16-byte blocks */
    a = FOLD(a, k128, b);
    a = FOLD(a, k128, c);
    a = FOLD(a, k128, d);
    for (; len >= 16; p += 16, len -= 16)
        a = FOLD(a, k128, _mm_loadu_si128((const __m128i *)p));
#undef FOLD
    /* 128 -> 96 -> 64 bits */
    const __m128i low32 = _mm_setr_epi32(-1, 0, -1, 0);
    a = _mm_xor_si128(_mm_srli_si128(a, 8), _mm_clmulepi64_si128(a, k128, 0x10));
    a = _mm_xor_si128(_mm_srli_si128(a, 4),
                      _mm_clmulepi64_si128(_mm_and_si128(a, low32), _mm_loadu_si128((const __m128i *)FOLD_64), 0x00));
    /* Barrett reduction to 32 bits */
    const __m128i barrett = _mm_loadu_si128((const __m128i *)BARRETT);
    __m128i t = _mm_and_si128(_mm_clmulepi64_si128(_mm_and_si128(a, low32), barrett, 0x10), low32);
    a = _mm_xor_si128(a, _mm_clmulepi64_si128(t, barrett, 0x00));
    return (uint32_t)_mm_extract_epi32(a, 1);
}

static int clmul_ok = -1;
#endif

/* zlib CRC32 of buf, continuing from crc (like zlib.crc32(buf, crc)). */
static uint32_t body_crc32(uint32_t crc, const uint8_t *buf, size_t len) {
#ifdef LMQ_HAVE_CLMUL
    if (clmul_ok < 0) {
        __builtin_cpu_init();
        clmul_ok = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    }
    if (clmul_ok && len >= 64) {
        size_t bulk = len & ~(size_t)15;
        crc = ~clmul_fold(buf, bulk, ~crc);
        buf += bulk;
        len -= bulk;
    }
#endif
    return lmq_crc32(crc, buf, len);
}

uint32_t lmq_body_crc32(uint32_t crc, const uint8_t *buf, size_t len) { return body_crc32(crc, buf, len); }

static uint32_t chain_crc(uint32_t prev, uint32_t body_crc, int64_t index, int64_t term) {
    uint8_t b[24];
    put32(b, prev);
    put32(b + 4, body_crc);
    put64(b + 8, (uint64_t)index);
    put64(b + 16, (uint64_t)term);
    return lmq_crc32(0, b, sizeof b);
}

int64_t lmq_layout_plan(const int64_t *lens, int64_t n, int64_t pos, int64_t seg_end,
                        int64_t seg_size, int64_t *pos_out) {
    for (int64_t i = 0; i < n; i++) {
        int64_t size = HDR + lens[i];
        if (size + MIN_BLANK > seg_size) return -1 - i; /* never fits a segment */
        if (size + MIN_BLANK > seg_end - pos) {         /* DLedger's blank rule */
            pos = seg_end;
            seg_end += seg_size;
        }
        pos_out[i] = pos;
        pos += size;
    }
    return pos;
}

void lmq_layout_fill(uint8_t *out, const uint8_t *bodies, const int64_t *lens,
                     const int64_t *pos, int64_t n, int64_t start_pos, int64_t first_index,
                     int64_t term, int32_t magic) {
    int64_t at = start_pos, src = 0;
    for (int64_t i = 0; i < n; i++) {
        if (pos[i] != at) { /* blank filler; the rest of it is already zero */
            put32(out + (at - start_pos), 0xFFFFFFFFu);
            put32(out + (at - start_pos) + 4, (uint32_t)(pos[i] - at));
        }
        uint8_t *h = out + (pos[i] - start_pos);
        int64_t size = HDR + lens[i];
        put32(h, (uint32_t)magic);
        put32(h + 4, (uint32_t)size);
        put64(h + 8, (uint64_t)(first_index + i));
        put64(h + 16, (uint64_t)term);
        put64(h + 24, (uint64_t)pos[i]);
        memset(h + 32, 0, 12); /* channel, chainCrc, bodyCrc */
        put32(h + 44, (uint32_t)lens[i]);
        memcpy(h + HDR, bodies + src, (size_t)lens[i]);
        src += lens[i];
        at = pos[i] + size;
    }
}

uint32_t lmq_layout_seal(uint8_t *out, const int64_t *pos, int64_t n, int64_t start_pos,
                         uint32_t prev_chain, int32_t with_crc, uint8_t *index_out) {
    for (int64_t i = 0; i < n; i++) {
        uint8_t *h = out + (pos[i] - start_pos);
        int32_t size = (int32_t)get32(h + 4);
        int64_t index = (int64_t)get64(h + 8), term = (int64_t)get64(h + 16);
        if (with_crc) {
            uint32_t bcrc = body_crc32(0, h + HDR, (size_t)(size - HDR));
            prev_chain = chain_crc(prev_chain, bcrc, index, term);
            put32(h + 36, prev_chain);
            put32(h + 40, bcrc);
        } else {
            prev_chain = 0;
        }
        if (index_out) {
            uint8_t *u = index_out + i * UNIT;
            memcpy(u, h, 4);            /* magic */
            memcpy(u + 4, h + 24, 8);   /* pos */
            memcpy(u + 12, h + 4, 4);   /* size */
            memcpy(u + 16, h + 8, 16);  /* index, term */
        }
    }
    return prev_chain;
}

static int32_t stop(int64_t *st, int32_t reason, int64_t off, int64_t detail, int64_t expected) {
    st[S_CONSUMED] = off;
    st[S_DETAIL] = detail;
    st[S_EXPECTED] = expected;
    return reason;
}

int32_t lmq_scan_entries(const uint8_t *buf, int64_t len, int32_t flags, int64_t max_count,
                         int64_t *st, uint8_t *index_out) {
    const int segment = (flags & F_SEGMENT) != 0, check_crc = (flags & F_CHECK_CRC) != 0;
    int64_t off = 0, count = 0;
    st[S_COUNT] = 0;
    for (;;) {
        int64_t pos = st[S_POS], rem_seg = st[S_SEG_END] - pos, rem_buf = len - off;
        const uint8_t *p = buf + off;
        if (count == max_count) return stop(st, R_MAX, off, 0, 0);
        if (rem_buf == 0) return stop(st, segment ? R_SHORT : R_END, off, 0, 0);
        if (segment && rem_buf < MIN_BLANK)
            return stop(st, lmq_first_nonzero(p, rem_buf) < 0 ? R_END : R_TORN, off, rem_buf, 0);
        if (!segment && rem_buf < HDR) return stop(st, R_TORN, off, rem_buf, HDR);
        int32_t magic = (int32_t)get32(p), size = (int32_t)get32(p + 4);
        if (segment) {
            if (magic == 0 && size == 0) return stop(st, R_END, off, 0, 0);
            if (magic == -1) {
                if (size != rem_seg) return stop(st, R_BAD_BLANK, off, size, rem_seg);
                return stop(st, R_BLANK, off, size, 0);
            }
        }
        if (magic < 1 || magic > 3) return stop(st, R_BAD_MAGIC, off, magic, 0);
        if (size <= HDR - 4) return stop(st, R_BAD_SIZE, off, size, 0);
        if ((int64_t)size + MIN_BLANK > st[S_SEG_SIZE]) return stop(st, R_BAD_SIZE, off, size, 0);
        if (rem_buf < HDR) return stop(st, R_TORN, off, rem_buf, HDR);
        int64_t index = (int64_t)get64(p + 8), term = (int64_t)get64(p + 16);
        int64_t epos = (int64_t)get64(p + 24);
        int32_t channel = (int32_t)get32(p + 32), body_size = (int32_t)get32(p + 44);
        uint32_t chain = get32(p + 36), bcrc = get32(p + 40);
        /* size 45..47 passes DLedger's "size > 44" but would mean a negative body */
        if (body_size < 0 || (int64_t)body_size + HDR != size)
            return stop(st, R_BAD_BODY_SIZE, off, body_size, size - HDR);
        if (channel != 0) return stop(st, R_BAD_CHANNEL, off, channel, 0);
        if ((int64_t)size + MIN_BLANK > rem_seg) {
            if (segment) {
                if (size > rem_seg) return stop(st, R_BAD_SIZE, off, size, rem_seg);
                return stop(st, R_NO_ROOM, off, size, rem_seg);
            }
            /* batch: the entry went to the next segment; the caller writes
             * the blank filler and calls again with the next segment. */
            if (epos == st[S_SEG_END]) return stop(st, R_ROLL, off, epos, 0);
            return stop(st, R_BAD_POS, off, epos, st[S_SEG_END]);
        }
        if (epos != pos) return stop(st, R_BAD_POS, off, epos, pos);
        if (index < 0 || (st[S_NEXT_INDEX] >= 0 && index != st[S_NEXT_INDEX]))
            return stop(st, R_BAD_INDEX, off, index, st[S_NEXT_INDEX]);
        if (term < 0 || term < st[S_LAST_TERM]) return stop(st, R_BAD_TERM, off, term, st[S_LAST_TERM]);
        if (size > rem_buf) return stop(st, R_TORN, off, rem_buf, size);
        if (check_crc) {
            if (chain == 0 && bcrc == 0) {
                if (st[S_CRC_MODE]) return stop(st, R_MISSING_CRC, off, 0, 0);
            } else {
                uint32_t got = body_crc32(0, p + HDR, (size_t)body_size);
                if (got != bcrc) return stop(st, R_BAD_BODY_CRC, off, bcrc, got);
                if (st[S_CHAIN_KNOWN]) {
                    uint32_t want = chain_crc((uint32_t)st[S_PREV_CHAIN], got, index, term);
                    if (want != chain) return stop(st, R_BAD_CHAIN_CRC, off, chain, want);
                }
                st[S_CRC_MODE] = 1;
            }
        }
        if (index_out) {
            uint8_t *u = index_out + count * UNIT;
            memcpy(u, p, 4);
            memcpy(u + 4, p + 24, 8);
            memcpy(u + 12, p + 4, 4);
            memcpy(u + 16, p + 8, 16);
        }
        st[S_PREV_CHAIN] = chain;
        st[S_CHAIN_KNOWN] = 1;
        st[S_LAST_TERM] = term;
        st[S_NEXT_INDEX] = index + 1;
        st[S_POS] = pos + size;
        st[S_COUNT] = ++count;
        off += size;
    }
}

int64_t lmq_first_nonzero(const uint8_t *buf, int64_t len) {
    int64_t i = 0;
    while (i < len && ((uintptr_t)(buf + i) & 7)) {
        if (buf[i]) return i;
        i++;
    }
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, buf + i, 8);
        if (w) break;
    }
    for (; i < len; i++)
        if (buf[i]) return i;
    return -1;
}

int64_t lmq_first_diff(const uint8_t *a, const uint8_t *b, int64_t len) {
    /* memcmp in blocks to find the block, then bytes to find the offset */
    int64_t i = 0;
    while (i < len) {
        int64_t n = len - i < 4096 ? len - i : 4096;
        if (memcmp(a + i, b + i, (size_t)n) != 0) {
            for (int64_t j = i; j < i + n; j++)
                if (a[j] != b[j]) return j;
        }
        i += n;
    }
    return -1;
}
