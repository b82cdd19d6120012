/* The send path's per-message checks in C, a run of scanned requests at a
 * time (see sendpath_take.c). */
#ifndef LEDGERMQ_SENDPATH_TAKE_H
#define LEDGERMQ_SENDPATH_TAKE_H
#include <stdint.h>

#include "sendpath.h"

/* why lmq_take_sends stopped */
#define LMQ_TAKE_END 0    /* it took every request up to `to` */
#define LMQ_TAKE_TOPIC 1  /* the next request is of another topic: check that topic, then go on */
#define LMQ_TAKE_CHECK 2  /* the next request fails a check: the general path serves (and words) it */

typedef struct {
    int32_t topic_first;  /* the scanner's topic_first of the topic these checks are for */
    int32_t max_queue;    /* max(write queues, read queues): a queue id at or above is refused */
    int64_t max_body;     /* maxMessageSize */
    int32_t set_flags;    /* sysflag bits the broker sets (MULTI_TAG, host IPv6 bits) */
    int32_t clear_flags;  /* and clears (the producer's IPv6 bits) */
    int64_t props_fixed;  /* properties bytes every record gets (CLUSTER) */
    int64_t props_uniq;   /* and a record gets when its UNIQ_KEY is made here */
    int64_t max_props;    /* the most properties bytes a record may hold */
} lmq_take_rule;

int64_t lmq_send_run_end(const lmq_send_req *reqs, int64_t from, int64_t n);
int64_t lmq_take_sends(const lmq_send_req *reqs, int64_t from, int64_t to, const lmq_take_rule *rule,
                       int32_t *which, int32_t *queue_ids, int32_t *sysflags, int32_t *opaques, int64_t at,
                       int64_t *counts, int32_t *why);

#endif
