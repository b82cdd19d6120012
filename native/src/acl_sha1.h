/* SHA-1 and the HMAC-SHA1 of RocketMQ's ACL 1.0 signatures (see acl_sha1.c). */
#ifndef LEDGERMQ_ACL_SHA1_H
#define LEDGERMQ_ACL_SHA1_H
#include <stdint.h>

typedef struct {
    uint32_t h[5];
    uint64_t total;  /* bytes absorbed, the padded key block included */
    uint8_t buf[64];
    uint32_t buflen;
} lmq_sha1_ctx;

/* The two SHA-1 states an HMAC key leaves (after its ipad and its opad
 * block): computed once per secret, then every signature costs only the
 * content's blocks and two more. */
typedef struct {
    uint32_t inner[5];
    uint32_t outer[5];
} lmq_hmac_key;

void lmq_sha1(const uint8_t *data, int64_t len, uint8_t out[20]);
void lmq_hmac_sha1_key(const uint8_t *secret, int64_t len, lmq_hmac_key *key);
void lmq_hmac_sha1_start(const lmq_hmac_key *key, lmq_sha1_ctx *ctx);
void lmq_sha1_update(lmq_sha1_ctx *ctx, const uint8_t *data, int64_t len);
void lmq_hmac_sha1_finish(const lmq_hmac_key *key, lmq_sha1_ctx *ctx, uint8_t out[20]);
/* one HMAC over data (tests; the send check streams) */
void lmq_hmac_sha1(const lmq_hmac_key *key, const uint8_t *data, int64_t len, uint8_t out[20]);
/* 1 when this CPU's SHA extensions are in use; lmq_sha1_portable(1) turns
 * them off (tests compare both) and returns the previous setting. */
int32_t lmq_sha1_uses_shani(void);
int32_t lmq_sha1_portable(int32_t on);

#endif
