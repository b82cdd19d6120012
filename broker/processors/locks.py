# Owns the queue locks of orderly consumption (RocketMQ's RebalanceLockManager
# behind LOCK_BATCH_MQ / UNLOCK_BATCH_MQ), answered by the master only:
#
#   LOCK_BATCH_MQ 41    body {"consumerGroup","clientId","mqSet":[{"topic",
#                       "brokerName","queueId"}]} -> body {"lockOKMQSet":[...]}:
#                       the queues the client holds now.  A queue is granted
#                       when it is free, its lock expired (rebalanceLock-
#                       MaxLiveTime, 60 s, unrenewed) or already the client's
#                       (renewed).
#   UNLOCK_BATCH_MQ 42  body {"consumerGroup","clientId","mqSet"} -> SUCCESS:
#                       frees the queues the client holds.
#
# Failover: the lock table is REPLICATED, not waited out.  Every request
# (renewals included: clients renew every 20 s) is a record appended through
# the metadata (broker/metadata/records.py mq.lock/mq.unlock) and answered
# after it is committed and applied; the applier decides contested queues
# from the record's store timestamp.  A new master therefore holds the same
# table the old one answered from and never hands a queue to a second
# consumer while the first may still hold it, with no pause after a
# failover.  (The other option, refusing every lock for rebalanceLockMax-
# LiveTime after an election, would stop orderly consumption for a minute
# at each failover.)  The client stops consuming a queue 30 s after its last
# successful lock, well inside the broker's 60 s, which absorbs clock skew
# between the nodes.
import logging

import attrs

from broker.config import LiveConfig
from broker.metadata.service import MetadataService
from broker.processors.base import RequestProcessor
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RequestError
from broker.remoting.header import decode_json, encode_json

log = logging.getLogger("ledgermq.locks")


def parse_lock_body(body: bytes, what: str) -> tuple[str, str, list[dict]]:
    """(group, clientId, mqSet) of a Lock/UnlockBatchRequestBody."""
    obj = decode_json(body, what)
    if not isinstance(obj, dict):
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"{what} must be a JSON object")
    group, client_id, mqs = obj.get("consumerGroup"), obj.get("clientId"), obj.get("mqSet") or []
    if not isinstance(group, str) or not group or not isinstance(client_id, str) or not client_id:
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"{what} needs consumerGroup and clientId")
    if not isinstance(mqs, list) or not all(isinstance(m, dict) and isinstance(m.get("topic"), str)
                                            for m in mqs):
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"{what}: mqSet must be a list of message queues")
    try:
        mqs = [{"topic": m["topic"], "brokerName": str(m.get("brokerName", "")), "queueId": int(m["queueId"])}
               for m in mqs]
    except (KeyError, TypeError, ValueError):
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"{what}: a message queue without a queueId") from None
    return group, client_id, mqs


@attrs.define(eq=False)
class QueueLockProcessor(RequestProcessor):
    config: LiveConfig
    metadata: MetadataService  # lock_queues / unlock_queues, through the log, gated by the role gate

    CODES = (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ)
    not_leader_remark = "queue locks are kept by the master"

    def handlers(self) -> dict:
        return {RequestCode.LOCK_BATCH_MQ: self.lock, RequestCode.UNLOCK_BATCH_MQ: self.unlock}

    async def lock(self, request: RemotingCommand) -> RemotingCommand:
        group, client_id, mqs = parse_lock_body(request.body, "LockBatchRequestBody")
        keys = list(dict.fromkeys((m["topic"], m["queueId"]) for m in mqs))
        held = await self.metadata.lock_queues(group, client_id, keys,
                                               self.config.current.rebalance_lock_max_live_ms) if keys else set()
        ok = [m for m in mqs if (m["topic"], m["queueId"]) in held]
        if len(ok) < len(mqs):
            log.debug("%s of %s: %d of %d queues locked", client_id, group, len(ok), len(mqs))
        return request.make_response(ResponseCode.SUCCESS, None, None, encode_json({"lockOKMQSet": ok}))

    async def unlock(self, request: RemotingCommand) -> RemotingCommand:
        group, client_id, mqs = parse_lock_body(request.body, "UnlockBatchRequestBody")
        keys = list(dict.fromkeys((m["topic"], m["queueId"]) for m in mqs))
        if keys:
            await self.metadata.unlock_queues(group, client_id, keys)
        return request.make_response(ResponseCode.SUCCESS)
