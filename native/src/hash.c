/* CRC32 and Java String.hashCode, the two hashes every RocketMQ format uses.
 *
 * CRC32 is the IEEE/zlib CRC (reflected 0xEDB88320, init and xorout
 * 0xFFFFFFFF) computed slice-by-8, so `lmq_crc32(0, buf, n)` equals Python's
 * zlib.crc32(buf) and chains the same way (pass the previous result as crc).
 *
 * Java's String.hashCode iterates UTF-16 code units with int overflow; the
 * UTF-8 variant decodes in place (supplementary characters become surrogate
 * pairs) so tags and keys can be hashed straight from a commitlog buffer.
 * Malformed UTF-8 hashes as U+FFFD per maximal ill-formed subpart, exactly as
 * Java's and Python's decoders substitute.  The `_from` form continues a hash
 * (IndexFile keys hash "topic#key" without building the string).
 */
#include <string.h>

#include "hash.h"

static uint32_t crc_table[8][256];
static int crc_ready = 0;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = crc_table[0][i];
        for (int t = 1; t < 8; t++) {
            c = crc_table[0][c & 0xFF] ^ (c >> 8);
            crc_table[t][i] = c;
        }
    }
    crc_ready = 1;
}

uint32_t lmq_crc32(uint32_t crc, const uint8_t *buf, size_t len) {
    if (!crc_ready) crc_init();
    uint32_t c = ~crc;
    while (len && ((uintptr_t)buf & 7)) {
        c = crc_table[0][(c ^ *buf++) & 0xFF] ^ (c >> 8);
        len--;
    }
    while (len >= 8) {
        uint32_t lo = (uint32_t)buf[0] | (uint32_t)buf[1] << 8 | (uint32_t)buf[2] << 16 | (uint32_t)buf[3] << 24;
        uint32_t hi = (uint32_t)buf[4] | (uint32_t)buf[5] << 8 | (uint32_t)buf[6] << 16 | (uint32_t)buf[7] << 24;
        lo ^= c;
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
            crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^
            crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
            crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        buf += 8;
        len -= 8;
    }
    while (len--) c = crc_table[0][(c ^ *buf++) & 0xFF] ^ (c >> 8);
    return ~c;
}

int32_t lmq_java_hash_utf16(const uint16_t *units, size_t n) {
    uint32_t h = 0;
    for (size_t i = 0; i < n; i++) h = 31u * h + units[i];
    return (int32_t)h;
}

uint32_t lmq_java_hash_utf8_from(uint32_t h, const uint8_t *s, size_t len) {
    /* Decodes like Java's (and Python's) UTF-8 decoder: each maximal ill-formed
     * subpart becomes one U+FFFD (Unicode §3.9, "best practice").
     * 31^1..31^8 mod 2^32: eight ASCII chars fold in with one dependent
     * multiply instead of eight (keys like UNIQ_KEY are 32 ASCII chars). */
    static const uint32_t P1 = 31u, P2 = 961u, P3 = 29791u, P4 = 923521u, P5 = 28629151u,
                          P6 = 887503681u, P7 = 1742810335u, P8 = 2487512833u;
    size_t i = 0;
    while (i < len) {
        if (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                const uint8_t *c = s + i;
                h = h * P8 + (c[0] * P7 + c[1] * P6 + c[2] * P5 + c[3] * P4) +
                    (c[4] * P3 + c[5] * P2 + c[6] * P1 + c[7]);
                i += 8;
                continue;
            }
        }
        uint8_t b = s[i];
        if (b < 0x80) { h = 31u * h + b; i++; continue; }
        size_t need;
        uint32_t cp;
        uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (b >= 0xC2 && b <= 0xDF) { need = 1; cp = b & 0x1F; }
        else if (b >= 0xE0 && b <= 0xEF) {
            need = 2; cp = b & 0x0F;
            if (b == 0xE0) lo = 0xA0;
            if (b == 0xED) hi = 0x9F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            need = 3; cp = b & 0x07;
            if (b == 0xF0) lo = 0x90;
            if (b == 0xF4) hi = 0x8F;
        } else { h = 31u * h + 0xFFFDu; i++; continue; }
        size_t j = 1;
        for (; j <= need; j++) {
            if (i + j >= len) break;
            uint8_t c = s[i + j];
            uint8_t l = (j == 1) ? lo : 0x80, u = (j == 1) ? hi : 0xBF;
            if (c < l || c > u) break;
            cp = (cp << 6) | (c & 0x3F);
        }
        if (j <= need) { h = 31u * h + 0xFFFDu; i += j; continue; }
        if (cp >= 0x10000) {
            cp -= 0x10000;
            h = 31u * h + (0xD800u + (cp >> 10));
            h = 31u * h + (0xDC00u + (cp & 0x3FF));
        } else {
            h = 31u * h + cp;
        }
        i += need + 1;
    }
    return h;
}

int32_t lmq_java_hash_utf8(const uint8_t *s, size_t len) {
    return (int32_t)lmq_java_hash_utf8_from(0, s, len);
}
