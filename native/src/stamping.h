/* The append hook's in-place stamping (see stamping.c). */
#ifndef LEDGERMQ_STAMPING_H
#define LEDGERMQ_STAMPING_H
#include <stdint.h>

#include "dispatch.h"

void lmq_stamp_offsets(uint8_t *out, int64_t start, const lmq_disp_rec *recs, int64_t n, const int32_t *order,
                       const int32_t *starts, int64_t ngroups, const int64_t *first, int64_t first_index,
                       int64_t *stamps);

#endif
