/* DLedger entry layout, sealing and scanning (see entries.c). */
#ifndef LEDGERMQ_ENTRIES_H
#define LEDGERMQ_ENTRIES_H
#include <stddef.h>
#include <stdint.h>

int64_t lmq_layout_plan(const int64_t *lens, int64_t n, int64_t pos, int64_t seg_end,
                        int64_t seg_size, int64_t *pos_out);
void lmq_layout_fill(uint8_t *out, const uint8_t *bodies, const int64_t *lens,
                     const int64_t *pos, int64_t n, int64_t start_pos, int64_t first_index,
                     int64_t term, int32_t magic);
uint32_t lmq_layout_seal(uint8_t *out, const int64_t *pos, int64_t n, int64_t start_pos,
                         uint32_t prev_chain, int32_t with_crc, uint8_t *index_out);
int32_t lmq_scan_entries(const uint8_t *buf, int64_t len, int32_t flags, int64_t max_count,
                         int64_t *state, uint8_t *index_out);
int64_t lmq_first_nonzero(const uint8_t *buf, int64_t len);
int64_t lmq_first_diff(const uint8_t *a, const uint8_t *b, int64_t len);
uint32_t lmq_body_crc32(uint32_t crc, const uint8_t *buf, size_t len);

#endif
