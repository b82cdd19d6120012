/* A SEND_BATCH_MESSAGE's records in C (see sendpath_batch.c). */
#ifndef LEDGERMQ_SENDPATH_BATCH_H
#define LEDGERMQ_SENDPATH_BATCH_H
#include <stdint.h>

#include "sendpath.h"

typedef struct {
    int64_t body_off;   /* the message body, in the batch body */
    int32_t body_len;
    int32_t flag;
    int64_t props_off;  /* its properties string, in the batch body */
    int32_t props_len;
    int32_t uniq_len;   /* length of its UNIQ_KEY value (0: none, one is made) */
} lmq_batch_item;

int64_t lmq_scan_batch(const uint8_t *body, int64_t len, lmq_batch_item *items, int64_t max_n,
                       int64_t *missing_uniq, int64_t *props_total);
int64_t lmq_encode_batch(const uint8_t *body, const lmq_batch_item *items, int64_t n, const uint8_t *topic,
                         int32_t topic_len, int32_t magic, int32_t queue_id, int32_t sysflag, int64_t born_timestamp,
                         int32_t reconsume_times, const lmq_send_env *env, uint8_t *out, int64_t cap,
                         int64_t *rec_off);

#endif
