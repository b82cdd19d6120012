# Owns the consuming RPCs of mqproxy on the brokers' POP codes (spec §8.9,
# RocketMQ's ReceiveMessageActivity / AckMessageActivity /
# ChangeInvisibleDurationActivity / ForwardMessageToDLQActivity):
#
#   ReceiveMessage   POP_MESSAGE 200050 to the master of the assigned broker
#                    (queueId -1: any queue), held up to the client's
#                    long_polling_timeout (at most longPollingTimeoutMillis),
#                    at most maxHeldReceives held at once (past it
#                    TOO_MANY_REQUESTS).  The stream is a status first (OK, or
#                    MESSAGE_NOT_FOUND 40401 when nothing came), then each
#                    message with receipt_handle = its POP_CK + " " + its
#                    commitlog offset and body_digest MD5.  A push consumer
#                    (auto_renew, no invisible_duration) gets
#                    autoRenewInvisibleMillis, renewed while it holds the
#                    message (renew.py); its ack names the handle it was given.
#   AckMessage       ACK_MESSAGE 200051 per entry, to the master of the
#                    receipt's broker (once more to the next master when that
#                    one went away unanswered), naming the topic the client consumes:
#                    the broker finds the retry topic a redelivered message
#                    came from by the receipt's topicType (ExtraInfoUtil.getRealTopic).
#   ChangeInvisibleDuration  CHANGE_MESSAGE_INVISIBLETIME 200053 -> the new receipt.
#   ForwardMessageToDeadLetterQueue  CONSUMER_SEND_MSG_BACK 36 with
#                    delayLevel -1 (straight to %DLQ%group), then the ack.
#
# A receipt is checked here before anything is sent: at least 8 fields of
# the right types (else INVALID_RECEIPT_HANDLE "receipt handle is invalid"),
# not expired (popTime + invisibleTime in the past: INVALID_RECEIPT_HANDLE
# "receipt handle has expired"), for a broker of the topic's route.
# A new group starts from the queues' first messages (initMode MIN), so
# nothing sent before a consumer's first receive is skipped.
import json
import time

import anyio
import attrs

from broker.client.errors import BrokerUnavailableError, ClientError, ConnectionFailedError, NoRouteError
from broker.proxy import auth, pb
from broker.proxy.convert import RequestInvalid, check_topic, to_grpc_message
from broker.proxy.status import ok, status
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from consumequeue import record as M

S = pb.service
MIN_INVISIBLE_MS = 10_000
MAX_INVISIBLE_MS = 12 * 3600 * 1000
MAX_BATCH = 32
MAX_ACK_ENTRIES = 64
ACK_RETRY_S = 2.0  # how long an ack whose master went away waits for the next one
_NOT_FOUND = (ResponseCode.POLLING_TIMEOUT, ResponseCode.NO_MESSAGE, ResponseCode.PULL_NOT_FOUND)


@attrs.frozen(kw_only=True)
class Receipt:
    text: str  # the first 8 fields: what the broker wrote in POP_CK
    ck_offset: int
    pop_time: int
    invisible_ms: int
    revive_qid: int
    topic_type: str
    broker_name: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int | None

    @property
    def expires_ms(self) -> int:
        return self.pop_time + self.invisible_ms

    def handle(self) -> str:
        return self.text if self.commitlog_offset is None else f"{self.text} {self.commitlog_offset}"


def parse_receipt(text: str, now_ms: int | None = None) -> Receipt:
    bad = RequestInvalid(pb.Code.INVALID_RECEIPT_HANDLE, "receipt handle is invalid")
    if not text or len(text) > 1024:
        raise bad
    parts = text.split(" ")
    if len(parts) not in (8, 9) or parts[4] not in ("0", "1", "2") or not parts[5] or len(parts[5]) > 255:
        raise bad
    try:
        nums = [int(p) for i, p in enumerate(parts) if i not in (4, 5)]
    except ValueError:
        raise bad from None
    if any(n < 0 or n >= 1 << 63 for n in nums):
        raise bad
    ck, pop_time, invisible, revive, queue_id, queue_offset, *phy = nums
    r = Receipt(text=" ".join(parts[:8]), ck_offset=ck, pop_time=pop_time, invisible_ms=invisible, revive_qid=revive,
                topic_type=parts[4], broker_name=parts[5], queue_id=queue_id, queue_offset=queue_offset,
                commitlog_offset=phy[0] if phy else None)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if r.expires_ms <= now_ms:
        raise RequestInvalid(pb.Code.INVALID_RECEIPT_HANDLE, "receipt handle has expired")
    return r


def _duration_ms(d) -> int:
    return d.seconds * 1000 + d.nanos // 1_000_000


class ConsumeRpcs:
    """MessagingService's consuming RPCs (a mixin: self.inst, self.cfg,
    self.receives, self._authorize, self._refusal, self._route, self._relay)."""

    async def _broker_addr(self, topic: str, broker_name: str | None) -> tuple[str, str]:
        """(broker name, master address) for a consuming request; a route
        without that master is refreshed once first (the election may be
        over: the name server has no push)."""
        route = await self._route(topic)
        for attempt in range(2):
            names = [n for n in sorted(route.brokers) if route.master(n)]
            if broker_name:
                if broker_name not in route.brokers:
                    raise RequestInvalid(pb.Code.BAD_REQUEST,
                                         f"broker {broker_name[:255]} is not in the route of {topic}")
                names = [broker_name] if route.master(broker_name) else []
            if names:
                return names[0], route.master(names[0])
            if attempt == 0:
                route = await self.inst.refresh_route(topic, route.version) or route
        raise RequestInvalid(pb.Code.HA_NOT_AVAILABLE, f"no master for the queues of {topic} now")

    async def _fifo(self, topic: str, group: str) -> bool:
        """consumeMessageOrderly of the group (GET_ALL_SUBSCRIPTIONGROUP_CONFIG
        on a master of the topic), as RocketMQ's proxy answers settings.fifo."""
        try:
            _name, addr = await self._broker_addr(topic, None)
            resp = await self.inst.invoke(addr, RemotingCommand.create_request(
                RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {}))
            table = json.loads(resp.body or b"{}").get("subscriptionGroupTable") or {}
            return bool((table.get(group) or {}).get("consumeMessageOrderly"))
        except (ClientError, RequestInvalid, ValueError, AttributeError):
            return False

    async def ReceiveMessage(self, request, context):
        try:
            topic = check_topic(request.message_queue.topic.name)
            group = request.group.name
            if not group:
                raise RequestInvalid(pb.Code.ILLEGAL_CONSUMER_GROUP, "consumer group cannot be empty")
            self._authorize(context, auth.consume_resources(topic, group))
            if not 0 < request.batch_size <= MAX_BATCH:
                raise RequestInvalid(pb.Code.BAD_REQUEST,
                                     f"batch size {request.batch_size} is not within 1..{MAX_BATCH}")
            if request.HasField("invisible_duration"):
                invisible = _duration_ms(request.invisible_duration)
                if not MIN_INVISIBLE_MS <= invisible <= MAX_INVISIBLE_MS:
                    raise RequestInvalid(pb.Code.ILLEGAL_INVISIBLE_TIME,
                                         f"invisible duration {invisible} ms is not within "
                                         f"{MIN_INVISIBLE_MS}..{MAX_INVISIBLE_MS} ms")
            elif request.auto_renew:
                invisible = self.cfg.auto_renew_invisible_ms
            else:
                raise RequestInvalid(pb.Code.ILLEGAL_INVISIBLE_TIME, "invisible duration is required")
            poll = self.cfg.long_polling_timeout_ms
            if request.HasField("long_polling_timeout"):
                poll = _duration_ms(request.long_polling_timeout)
                if not 0 <= poll <= self.cfg.long_polling_timeout_ms:
                    raise RequestInvalid(pb.Code.ILLEGAL_POLLING_TIME,
                                         f"long polling timeout must be within 0..{self.cfg.long_polling_timeout_ms} ms")
            remaining = context.time_remaining()
            if remaining is not None:  # answer before the client's deadline, as RocketMQ's proxy
                poll = max(0, min(poll, int(remaining * 1000) - 1000))
            expression, exp_type = "*", "TAG"
            if request.HasField("filter_expression"):
                expression = request.filter_expression.expression or "*"
                exp_type = "SQL92" if request.filter_expression.type == pb.definition.FilterType.SQL else "TAG"
            broker_name, addr = await self._broker_addr(topic, request.message_queue.broker.name or None)
            session = self.sessions.get(self._client_id(context))
            order = bool(session is not None and session.fifo)
            if self.receives.locked():
                raise RequestInvalid(pb.Code.TOO_MANY_REQUESTS,
                                     f"the proxy holds {self.cfg.max_held_receives} receives already")
            async with self.receives:
                req = RemotingCommand.create_request(RequestCode.POP_MESSAGE, {
                    "consumerGroup": group, "topic": topic, "queueId": "-1", "maxMsgNums": str(request.batch_size),
                    "invisibleTime": str(invisible), "pollTime": str(poll), "bornTime": str(int(time.time() * 1000)),
                    "initMode": "0", "expType": exp_type, "exp": expression, "order": "true" if order else "false",
                    **({"attemptId": request.attempt_id} if request.HasField("attempt_id") else {})})
                resp = await self._relay(topic, addr, req, timeout=poll / 1000 + 5,
                                         ok=(ResponseCode.SUCCESS, *_NOT_FOUND, ResponseCode.POLLING_FULL))
        except Exception as e:
            yield S.ReceiveMessageResponse(status=self._refusal(e))
            return
        if resp.code == ResponseCode.POLLING_FULL:
            yield S.ReceiveMessageResponse(status=status(pb.Code.TOO_MANY_REQUESTS, resp.remark or "polling full"))
            return
        messages = []
        if resp.code == ResponseCode.SUCCESS and resp.body:
            body, off = resp.body, 0
            while off + 4 <= len(body) and len(messages) < MAX_BATCH:
                size = int.from_bytes(body[off:off + 4], "big")
                if size <= 0 or off + size > len(body):
                    break
                try:
                    record = M.decode(body, off)
                except M.MessageFormatError:
                    break
                off += size
                ck = record.properties.get("POP_CK")
                if not ck:
                    continue
                messages.append(to_grpc_message(record, topic=topic, receipt_handle=f"{ck} {record.physical_offset}",
                                                invisible_ms=invisible))
        if not messages:
            yield S.ReceiveMessageResponse(status=status(pb.Code.MESSAGE_NOT_FOUND, "no new message"))
            return
        if request.auto_renew and not request.HasField("invisible_duration"):
            client_id = self._client_id(context)
            for m in messages:
                handle = m.system_properties.receipt_handle
                try:
                    self.renewals.add(group, topic, client_id, handle, parse_receipt(handle))
                except RequestInvalid:
                    pass  # (already expired: nothing to renew)
        first = S.ReceiveMessageResponse()
        first.delivery_timestamp.GetCurrentTime()
        yield S.ReceiveMessageResponse(status=ok())
        yield first
        for m in messages:
            yield S.ReceiveMessageResponse(message=m)

    async def _receipt(self, group: str, handle: str) -> Receipt:
        """The receipt a client's handle stands for now: the renewed one if
        the proxy renews it (renewal stopped), else the handle itself."""
        renewed = await self.renewals.take(group, handle)
        return renewed if renewed is not None else parse_receipt(handle)

    async def _change_receipt(self, topic: str, group: str, receipt: Receipt, invisible: int) -> Receipt:
        """CHANGE_MESSAGE_INVISIBLETIME: the message's new receipt."""
        _name, addr = await self._broker_addr(topic, receipt.broker_name)
        req = RemotingCommand.create_request(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, {
            "consumerGroup": group, "topic": topic, "queueId": str(receipt.queue_id),
            "extraInfo": receipt.text, "offset": str(receipt.queue_offset), "invisibleTime": str(invisible)})
        f = (await self._relay(topic, addr, req)).ext_fields
        try:
            pop_time, new_invisible, revive = int(f["popTime"]), int(f["invisibleTime"]), int(f["reviveQid"])
        except (KeyError, ValueError):
            raise RequestInvalid(pb.Code.INTERNAL_SERVER_ERROR, "the broker's answer has no new receipt") from None
        text = (f"{receipt.queue_offset} {pop_time} {new_invisible} {revive} {receipt.topic_type} "
                f"{receipt.broker_name} {receipt.queue_id} {receipt.queue_offset}")
        return attrs.evolve(receipt, text=text, ck_offset=receipt.queue_offset, pop_time=pop_time,
                            invisible_ms=new_invisible, revive_qid=revive)

    async def _ack_one(self, topic: str, group: str, receipt: Receipt) -> None:
        """ACK_MESSAGE; an ack whose master went away before answering is
        sent once more to the next master (within ACK_RETRY_S).  An ack is
        idempotent: if the first one was committed the checkpoint is gone
        and the broker answers SUCCESS without appending; if not, this one
        acks it.  Without the retry the client would see a failed ack for a
        message that may be acked, and never come back."""
        req = RemotingCommand.create_request(RequestCode.ACK_MESSAGE, {
            "consumerGroup": group, "topic": topic, "queueId": str(receipt.queue_id),
            "extraInfo": receipt.text, "offset": str(receipt.queue_offset)})
        _name, addr = await self._broker_addr(topic, receipt.broker_name)
        try:
            await self._relay(topic, addr, req)
            return
        except (ConnectionFailedError, BrokerUnavailableError) as e:
            first = e
        deadline = anyio.current_time() + ACK_RETRY_S
        try:
            route = await self.inst.wait_route(
                topic, lambda r: r.master(receipt.broker_name) not in (None, addr), deadline)
        except NoRouteError:
            raise first from None
        await self._relay(topic, route.master(receipt.broker_name),
                          RemotingCommand.create_request(RequestCode.ACK_MESSAGE, dict(req.ext_fields)))

    async def AckMessage(self, request, context):
        try:
            topic = check_topic(request.topic.name)
            group = request.group.name
            self._authorize(context, auth.consume_resources(topic, group))
            if not request.entries or len(request.entries) > MAX_ACK_ENTRIES:
                raise RequestInvalid(pb.Code.BAD_REQUEST, f"1..{MAX_ACK_ENTRIES} entries per AckMessage")
            resp = S.AckMessageResponse(status=ok())
            for entry in request.entries:
                try:
                    await self._ack_one(topic, group, await self._receipt(group, entry.receipt_handle))
                    st = ok()
                except Exception as e:
                    st = self._refusal(e)
                resp.entries.add(message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=st)
            codes = {e.status.code for e in resp.entries}
            if codes != {pb.Code.OK}:
                resp.status.CopyFrom(resp.entries[0].status if len(resp.entries) == 1 or pb.Code.OK not in codes
                                     else status(pb.Code.MULTIPLE_RESULTS, "some entries failed"))
            return resp
        except Exception as e:
            return S.AckMessageResponse(status=self._refusal(e))

    async def ChangeInvisibleDuration(self, request, context):
        try:
            topic = check_topic(request.topic.name)
            group = request.group.name
            self._authorize(context, auth.consume_resources(topic, group))
            invisible = _duration_ms(request.invisible_duration)
            if not 0 <= invisible <= MAX_INVISIBLE_MS:
                raise RequestInvalid(pb.Code.ILLEGAL_INVISIBLE_TIME, f"invisible duration {invisible} ms is illegal")
            receipt = await self._receipt(group, request.receipt_handle)
            new = await self._change_receipt(topic, group, receipt, invisible)
            return S.ChangeInvisibleDurationResponse(status=ok(), receipt_handle=new.handle())
        except Exception as e:
            return S.ChangeInvisibleDurationResponse(status=self._refusal(e))

    async def ForwardMessageToDeadLetterQueue(self, request, context):
        try:
            topic = check_topic(request.topic.name)
            group = request.group.name
            self._authorize(context, auth.consume_resources(topic, group))
            receipt = await self._receipt(group, request.receipt_handle)
            if receipt.commitlog_offset is None:
                raise RequestInvalid(pb.Code.INVALID_RECEIPT_HANDLE, "receipt handle has no commitlog offset")
            _name, addr = await self._broker_addr(topic, receipt.broker_name)
            req = RemotingCommand.create_request(RequestCode.CONSUMER_SEND_MSG_BACK, {
                "offset": str(receipt.commitlog_offset), "group": group, "delayLevel": "-1",
                "originMsgId": request.message_id, "originTopic": topic, "unitMode": "false",
                "maxReconsumeTimes": "0"})
            await self._relay(topic, addr, req)
            await self._ack_one(topic, group, receipt)
            return S.ForwardMessageToDeadLetterQueueResponse(status=ok())
        except Exception as e:
            return S.ForwardMessageToDeadLetterQueueResponse(status=self._refusal(e))
