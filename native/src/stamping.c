/* The append hook's stamping of a leader batch in place: each record's
 * PHYSICALOFFSET and QUEUEOFFSET written into the laid-out entries, a
 * group (one consume queue) at a time, in one call per batch
 * (consumequeue/queue_offsets.py; its record-by-record Python path is the
 * test oracle). */
#include <stdint.h>
#include <string.h>

#include "dispatch.h"
#include "stamping.h"

static inline void wr64(uint8_t *p, int64_t v) {
    uint64_t x = __builtin_bswap64((uint64_t)v);
    memcpy(p, &x, 8);
}

/* The leader's append hook (consumequeue/queue_offsets.py): record
 * order[starts[g] + k] of group g gets QUEUEOFFSET first[g] + k, a record in
 * no group (NO_CQ: a transaction PREPARED/ROLLBACK) gets 0, and every one
 * gets PHYSICALOFFSET = its own position.  `out` holds the batch from
 * absolute position `start`; stamps[entry_index - first_index] receives
 * each record's queue offset.  The records must all be sound (no
 * LMQ_REC_BAD): the caller takes the slow path otherwise. */
void lmq_stamp_offsets(uint8_t *out, int64_t start, const lmq_disp_rec *recs, int64_t n, const int32_t *order,
                       const int32_t *starts, int64_t ngroups, const int64_t *first, int64_t first_index,
                       int64_t *stamps) {
    for (int64_t i = 0; i < n; i++) {
        const lmq_disp_rec *r = &recs[i];
        uint8_t *rec = out + (r->phy_offset - start);
        wr64(rec + 28, r->phy_offset);
        if (r->flags & LMQ_REC_NO_CQ) {
            wr64(rec + 20, 0);
            stamps[r->entry_index - first_index] = 0;
        }
    }
    for (int64_t g = 0; g < ngroups; g++) {
        int64_t qo = first[g];
        for (int32_t k = starts[g]; k < starts[g + 1]; k++, qo++) {
            const lmq_disp_rec *r = &recs[order[k]];
            wr64(out + (r->phy_offset - start) + 20, qo);
            stamps[r->entry_index - first_index] = qo;
        }
    }
}
