/* The ACL check of plain SEND_MESSAGE_V2 requests, a scan at a time (see
 * acl.c). */
#ifndef LEDGERMQ_ACL_H
#define LEDGERMQ_ACL_H
#include <stdint.h>

#include "acl_sha1.h"
#include "sendpath.h"

/* verdict of one request */
#define LMQ_ACL_OK 0          /* signature verified (or whitelisted account); pair[] names (account, topic) */
#define LMQ_ACL_GENERAL 1     /* the general path decides and words it (a field problem, an escape...) */
#define LMQ_ACL_NO_KEY 2      /* no AccessKey field */
#define LMQ_ACL_UNKNOWN_KEY 3 /* an AccessKey no account has (ak_off/ak_len: its text in the data) */
#define LMQ_ACL_BAD_SIGNATURE 4 /* the signature does not verify (ak_off/ak_len likewise) */
#define LMQ_ACL_DENIED 5      /* set by lmq_acl_apply: the account may not send to the topic */

#define LMQ_ACL_MAX_KEY 1024  /* a longer AccessKey is left to the general path */

typedef struct {
    int64_t n;                   /* accounts */
    const uint8_t *keys;         /* their accessKeys, UTF-8, sorted bytewise, back to back */
    const int64_t *key_off;      /* n + 1 offsets into keys */
    const lmq_hmac_key *hmac;    /* per account: its secret's HMAC states */
    const uint8_t *mode;         /* per account, for the caller's address: 0 check, 1 whitelisted */
    const uint8_t *broker;       /* the broker's name: what `bname` and `n` must say when not empty */
    int64_t broker_len;
} lmq_acl_accounts;

typedef struct {
    int32_t account;             /* index into the accounts */
    int32_t topic_first;         /* the scanner's topic_first */
    int32_t white;               /* 1: the account is whitelisted for the address (no topic check) */
} lmq_acl_pair;

int64_t lmq_acl_check_sends(const uint8_t *data, int64_t data_len, const lmq_send_req *reqs, int64_t from,
                            int64_t to, const lmq_acl_accounts *acc, int32_t *verdict, int32_t *pair,
                            int64_t *ak_off, int32_t *ak_len, lmq_acl_pair *pairs, uint8_t *scratch,
                            int64_t scratch_cap);
void lmq_acl_apply(int32_t *verdict, const int32_t *pair, const int32_t *pair_verdict, int64_t from, int64_t to);

#endif
