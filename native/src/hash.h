/* CRC32 (zlib polynomial) and Java String.hashCode helpers. */
#ifndef LEDGERMQ_HASH_H
#define LEDGERMQ_HASH_H
#include <stddef.h>
#include <stdint.h>

uint32_t lmq_crc32(uint32_t crc, const uint8_t *buf, size_t len);
int32_t lmq_java_hash_utf16(const uint16_t *units, size_t n);
int32_t lmq_java_hash_utf8(const uint8_t *buf, size_t len);

#endif
