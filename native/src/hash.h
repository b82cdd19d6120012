/* CRC32 (zlib polynomial) and Java String.hashCode helpers. */
#ifndef LEDGERMQ_HASH_H
#define LEDGERMQ_HASH_H
#include <stddef.h>
#include <stdint.h>

uint32_t lmq_crc32(uint32_t crc, const uint8_t *buf, size_t len);
int32_t lmq_java_hash_utf16(const uint16_t *units, size_t n);
int32_t lmq_java_hash_utf8(const uint8_t *buf, size_t len);
/* Java String.hashCode continued from h (the hash of a prefix) over the
 * UTF-16 units of `new String(buf, UTF_8)`. */
uint32_t lmq_java_hash_utf8_from(uint32_t h, const uint8_t *buf, size_t len);

#endif
