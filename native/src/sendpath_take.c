/* The send path's per-message checks, a run of scanned requests at a time.
 *
 * The decoder hands out consecutive plain SEND_MESSAGE_V2 requests of one
 * scan as one run (lmq_send_run_end finds where it ends); the send
 * processor checks a topic once in Python (name, permission, queues,
 * MULTI_TAG) and lmq_take_sends applies the per-message part of those
 * checks to every request of the run -- queue id, body size, transaction
 * type, properties length -- exactly as broker/processors/send.py's
 * general path decides them, writing what lmq_encode_sends and
 * lmq_encode_send_responses need.  It stops at the first request that is
 * of another topic or fails a check; the caller checks that topic, or
 * serves that request the general way (which words the refusal), and
 * goes on from there, so every message keeps its place in the burst. */
#include "sendpath_take.h"

#define TRANSACTION_MASK 0xC
#define TRANSACTION_PREPARED_TYPE 0x4
#define RPC_ONEWAY 2

/* The first index at or after `from` (below n) whose status is not OK. */
int64_t lmq_send_run_end(const lmq_send_req *reqs, int64_t from, int64_t n) {
    int64_t i = from;
    while (i < n && reqs[i].status == LMQ_SEND_OK) i++;
    return i;
}

/* Take reqs[from..to) (all LMQ_SEND_OK) while they pass `rule`: each
 * taken request's index, queue id, sysflag as stored and opaque go to
 * which/queue_ids/sysflags/opaques[at...]; counts[0] += those without a
 * UNIQ_KEY, counts[1] += oneway ones.  Returns the index of the first
 * request not taken (to when all were) and why in *why. */
int64_t lmq_take_sends(const lmq_send_req *reqs, int64_t from, int64_t to, const lmq_take_rule *rule,
                       int32_t *which, int32_t *queue_ids, int32_t *sysflags, int32_t *opaques, int64_t at,
                       int64_t *counts, int32_t *why) {
    int64_t missing = 0, oneway = 0, i = from;
    *why = LMQ_TAKE_END;
    for (; i < to; i++) {
        const lmq_send_req *r = &reqs[i];
        if (r->topic_first != rule->topic_first) {
            *why = LMQ_TAKE_TOPIC;
            break;
        }
        if (r->status != LMQ_SEND_OK || r->queue_id < 0 || r->queue_id >= rule->max_queue ||
            r->body_len > rule->max_body || (r->sysflag & TRANSACTION_MASK) == TRANSACTION_PREPARED_TYPE ||
            (int64_t)r->props_len + rule->props_fixed + (r->uniq_len ? 0 : rule->props_uniq) > rule->max_props) {
            *why = LMQ_TAKE_CHECK;
            break;
        }
        which[at] = (int32_t)i;
        queue_ids[at] = r->queue_id;
        sysflags[at] = (r->sysflag & ~rule->clear_flags) | rule->set_flags;
        opaques[at] = r->opaque;
        at++;
        if (!r->uniq_len) missing++;
        if (r->flag & RPC_ONEWAY) oneway++;
    }
    counts[0] += missing;
    counts[1] += oneway;
    return i;
}
