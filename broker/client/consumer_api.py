# Owns the consumer-side requests both consumers use, as coroutines over a
# ClientInstance: PULL_MESSAGE (request building and response decoding into
# a PullResult), the offset requests (QUERY/UPDATE_CONSUMER_OFFSET, GET_MAX/
# MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP), GET_CONSUMER_LIST_BY_GROUP,
# CONSUMER_SEND_MSG_BACK, LOCK/UNLOCK_BATCH_MQ (orderly consumption), and
# the HEART_BEAT consumer data.
#
# Where requests go: offsets are stored by the master (the DLedger leader),
# so offset writes and reads go there; pulls go to the node the broker
# suggested (suggestWhichBrokerId), falling back to the master and then to
# any node, so consumption carries on from a follower while no master is
# registered.
import logging

import attrs
import anyio
import anyio.abc

from broker.client.errors import BrokerError, BrokerUnavailableError, ConnectionFailedError, NoRouteError
from broker.client.instance import ClientInstance, TopicRoute
from broker.client.model import MessageQueue, PullResult, PullStatus, decode_records, filter_by_tags, subscription
from broker.common.subscription import FLAG_COMMIT_OFFSET, FLAG_SUBSCRIPTION, FLAG_SUSPEND, Subscription
from broker.remoting.codes import LanguageCode, RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.header import decode_json, encode_json

log = logging.getLogger("ledgermq.client.pull")

_PULL_STATUS = {ResponseCode.SUCCESS: PullStatus.FOUND, ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
                ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
                ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL}
MAX_RECONSUME_TIMES = 16


def request(code: int, fields: dict | None = None, body: bytes = b"") -> RemotingCommand:
    return RemotingCommand.create_request(code, fields, body=body, language=LanguageCode.PYTHON)


def subscription_data(topic: str, sub: Subscription) -> dict:
    """One SubscriptionData of a HEART_BEAT (spec §8.5)."""
    return {"classFilterMode": False, "topic": topic, "subString": sub.sub_string,
            "expressionType": sub.expression_type,
            "tagsSet": sorted(sub.tags), "codeSet": sorted(sub.codes or ()), "subVersion": sub.sub_version}


@attrs.define(eq=False)
class ConsumerApi:
    instance: ClientInstance
    group: str

    async def _route(self, topic: str) -> TopicRoute:
        route = await self.instance.route(topic)
        if route is None:
            raise NoRouteError(topic)
        return route

    async def master_addr(self, mq: MessageQueue, avoid: str | None = None) -> str:
        """The master of mq's broker (not `avoid`, an address that just
        failed), refreshing the route and waiting up to the client timeout
        while a failover is in progress."""
        route = await self._route(mq.topic)
        addr = route.master(mq.broker_name)
        if addr is not None and addr != avoid:
            return addr
        deadline = anyio.current_time() + self.instance.timeout
        route = await self.instance.wait_route(
            mq.topic, lambda r: r.master(mq.broker_name) not in (None, avoid), deadline)
        return route.master(mq.broker_name)

    async def on_master(self, mq: MessageQueue, req: RemotingCommand,
                        ok: tuple[int, ...] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
        """`req` to mq's master; once more to the new master if that one is
        gone or no longer the master (a stale route after failover)."""
        addr = await self.master_addr(mq)
        try:
            return await self.instance.invoke(addr, req, ok=ok)
        except (ConnectionFailedError, BrokerUnavailableError):
            addr = await self.master_addr(mq, avoid=addr)
            return await self.instance.invoke(addr, req, ok=ok)

    async def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues, sorted."""
        return list((await self._route(topic)).read_queues)

    # --- pull -------------------------------------------------------------------------

    async def pull(self, mq: MessageQueue, offset: int, sub: Subscription, *, max_nums: int = 32,
                   suspend_ms: int = 0, timeout: float = 10.0, commit_offset: int | None = None,
                   broker_id: int = 0) -> PullResult:
        """One PULL_MESSAGE.  With suspend_ms the broker holds the request
        until a message arrives or that many ms pass (long polling)."""
        route = await self._route(mq.topic)
        addr = route.addr(mq.broker_name, broker_id)
        if addr is None:
            raise NoRouteError(mq.topic, f"no node of {mq.broker_name} in the route")
        sys_flag = FLAG_SUBSCRIPTION | (FLAG_SUSPEND if suspend_ms > 0 else 0)
        if commit_offset is not None and commit_offset > 0 and addr == route.master(mq.broker_name):
            sys_flag |= FLAG_COMMIT_OFFSET
        req = request(RequestCode.PULL_MESSAGE, {
            "consumerGroup": self.group, "topic": mq.topic, "queueId": str(mq.queue_id), "queueOffset": str(offset),
            "maxMsgNums": str(max_nums), "sysFlag": str(sys_flag),
            "commitOffset": str(commit_offset if commit_offset is not None else 0),
            "suspendTimeoutMillis": str(suspend_ms), "subscription": sub.sub_string,
            "subVersion": str(sub.sub_version), "expressionType": sub.expression_type})
        await self.instance.ensure_heartbeat(addr)
        resp = await self.instance.invoke(addr, req, timeout, ok=tuple(_PULL_STATUS))
        f = resp.ext_fields
        status = _PULL_STATUS[resp.code]
        if status is PullStatus.OFFSET_ILLEGAL:
            log.warning("%s: %s says offset %d of %s is illegal (min %s, max %s, next %s)", self.group, addr, offset,
                        mq, f.get("minOffset"), f.get("maxOffset"), f.get("nextBeginOffset"))
        messages = filter_by_tags(decode_records(resp.body, mq), sub) if status is PullStatus.FOUND else []
        return PullResult(status=status, next_begin_offset=int(f.get("nextBeginOffset", offset)),
                          min_offset=int(f.get("minOffset", 0)),
                          max_offset=int(f.get("maxOffset", 0)), messages=messages,
                          suggest_broker_id=int(f.get("suggestWhichBrokerId", 0)))

    # --- offsets ----------------------------------------------------------------------

    async def query_offset(self, mq: MessageQueue) -> int | None:
        """The group's committed offset of mq, None if it has none."""
        req = request(RequestCode.QUERY_CONSUMER_OFFSET, {
            "consumerGroup": self.group, "topic": mq.topic, "queueId": str(mq.queue_id),
            "setZeroIfNotFound": "false"})
        resp = await self.on_master(mq, req, ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        offset = int(resp.ext_fields.get("offset", -1))
        return offset if offset >= 0 else None

    async def update_offset(self, mq: MessageQueue, offset: int) -> None:
        req = request(RequestCode.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": self.group, "topic": mq.topic, "queueId": str(mq.queue_id),
            "commitOffset": str(offset)})
        await self.on_master(mq, req)

    async def _offset(self, code: int, mq: MessageQueue, **extra) -> int:
        req = request(code, {"topic": mq.topic, "queueId": str(mq.queue_id), **extra})
        resp = await self.on_master(mq, req)
        return int(resp.ext_fields["offset"])

    async def max_offset(self, mq: MessageQueue) -> int:
        return await self._offset(RequestCode.GET_MAX_OFFSET, mq)

    async def min_offset(self, mq: MessageQueue) -> int:
        return await self._offset(RequestCode.GET_MIN_OFFSET, mq)

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return await self._offset(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, mq, timestamp=str(timestamp_ms))

    # --- group --------------------------------------------------------------------------

    async def consumer_ids(self, topic: str) -> list[str]:
        """The group's client ids as a broker of the topic sees them, sorted."""
        route = await self._route(topic)
        names = sorted(route.brokers)
        if not names:
            raise NoRouteError(topic, "no broker in the route")
        addr = route.addr(names[0])
        await self.instance.ensure_heartbeat(addr)
        resp = await self.instance.invoke(addr, request(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                                        {"consumerGroup": self.group}),
                                          ok=(ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR))
        if resp.code != ResponseCode.SUCCESS:  # "no consumer for this group": not registered yet
            return []
        body = decode_json(resp.body, "GetConsumerListByGroupResponseBody")
        return sorted(str(c) for c in (body or {}).get("consumerIdList") or ())

    async def lock_batch(self, mqs: list[MessageQueue]) -> set[MessageQueue]:
        """LOCK_BATCH_MQ for queues of ONE broker, to its master: the ones
        this client holds now (orderly consumption)."""
        req = request(RequestCode.LOCK_BATCH_MQ, body=encode_json({
            "consumerGroup": self.group, "clientId": self.instance.client_id,
            "mqSet": [{"topic": m.topic, "brokerName": m.broker_name, "queueId": m.queue_id} for m in mqs]}))
        resp = await self.on_master(mqs[0], req)
        body = decode_json(resp.body, "LockBatchResponseBody") or {}
        return {MessageQueue(m["topic"], m["brokerName"], int(m["queueId"])) for m in body.get("lockOKMQSet") or ()}

    async def unlock_batch(self, mqs: list[MessageQueue]) -> None:
        req = request(RequestCode.UNLOCK_BATCH_MQ, body=encode_json({
            "consumerGroup": self.group, "clientId": self.instance.client_id,
            "mqSet": [{"topic": m.topic, "brokerName": m.broker_name, "queueId": m.queue_id} for m in mqs]}))
        await self.on_master(mqs[0], req)

    async def send_back(self, msg, delay_level: int = 0, max_reconsume_times: int = MAX_RECONSUME_TIMES) -> None:
        """CONSUMER_SEND_MSG_BACK: the broker re-puts `msg` to %RETRY%<group>
        (or the DLQ).  Raises BrokerError (e.g. REQUEST_CODE_NOT_SUPPORTED)."""
        req = request(RequestCode.CONSUMER_SEND_MSG_BACK, {
            "offset": str(msg.commitlog_offset), "group": self.group, "delayLevel": str(delay_level),
            "originMsgId": msg.msg_id, "originTopic": msg.topic, "unitMode": "false",
            "maxReconsumeTimes": str(max_reconsume_times)})
        await self.on_master(msg.queue, req)


def parse_subscriptions(subscriptions: dict) -> dict[str, Subscription]:
    """topic -> tag expression (text) or MessageSelector."""
    return {topic: subscription(expr) for topic, expr in subscriptions.items()}


__all__ = ["BrokerError", "ConsumerApi", "parse_subscriptions", "request", "subscription_data"]
