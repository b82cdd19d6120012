/* Big-endian reads and writes of the wire and record formats, shared by the
 * C helpers (header only: each is inlined where it is used). */
#ifndef LEDGERMQ_BIGENDIAN_H
#define LEDGERMQ_BIGENDIAN_H
#include <stdint.h>

static inline int32_t lmq_r32(const uint8_t *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
}
static inline void lmq_w32(uint8_t *p, int32_t v) {
    uint32_t u = (uint32_t)v;
    p[0] = (uint8_t)(u >> 24);
    p[1] = (uint8_t)(u >> 16);
    p[2] = (uint8_t)(u >> 8);
    p[3] = (uint8_t)u;
}
static inline void lmq_w64(uint8_t *p, int64_t v) {
    lmq_w32(p, (int32_t)((uint64_t)v >> 32));
    lmq_w32(p + 4, (int32_t)(uint64_t)v);
}
static inline void lmq_w16(uint8_t *p, int32_t v) {
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

/* MessageClientIDSetter's key after its prefix: the time since the month
 * began (%08X) and the 16-bit counter (%04X); returns the end. */
static inline uint8_t *lmq_put_uniq_tail(uint8_t *q, int32_t diff, int32_t counter) {
    static const char hex[] = "0123456789ABCDEF";
    uint32_t d = (uint32_t)diff, c = (uint32_t)counter & 0xFFFF;
    for (int s = 28; s >= 0; s -= 4) *q++ = (uint8_t)hex[(d >> s) & 0xF];
    for (int s = 12; s >= 0; s -= 4) *q++ = (uint8_t)hex[(c >> s) & 0xF];
    return q;
}

#endif
