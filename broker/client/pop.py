# Owns the client side of POP consumption (RocketMQ 5): POP_MESSAGE,
# ACK_MESSAGE, BATCH_ACK_MESSAGE and CHANGE_MESSAGE_INVISIBLETIME to one
# broker address, for any group -- what tests and the gRPC proxy call.
#
#   async with open_pop_client(namesrv_addr) as pc:
#       res = await pc.pop(broker_addr, "G", "T", queue_id=-1, max_nums=32,
#                          invisible_ms=30000, poll_ms=5000, order=False)
#       for m in res.messages:               # PopMessage: .message (MessageExt), .receipt
#           await pc.ack(broker_addr, "G", "T", m.receipt)
#       new = await pc.change_invisible(broker_addr, "G", "T", receipt, 60000)
#
# A receipt is the record's POP_CK property, "ckQueueOffset popTime
# invisibleTime reviveQid topicType brokerName queueId queueOffset"; an ack
# names the topic the message was popped for (not its retry topic: the
# receipt's topicType says where it is).  A 9th field (the commitlog
# offset the gRPC proxy appends) is accepted everywhere and kept.
# Errors are the library's BrokerErrors (e.g. INVALID_PARAMETER for a
# receipt the broker cannot read, NO_MESSAGE for a change whose message
# was acked or revived); "nothing to pop" is a PopResult, not an error.
import base64
import enum
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs

from broker.client.consumer_api import request
from broker.client.errors import InvalidArgumentError
from broker.client.instance import ClientInstance, open_client_instance
from broker.client.model import MessageExt, MessageQueue, decode_records
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.header import encode_json

PROPERTY_POP_CK = "POP_CK"
INIT_MODE_MIN, INIT_MODE_MAX = 0, 1


class PopStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    POLLING_FULL = "POLLING_FULL"
    POLLING_NOT_FOUND = "POLLING_NOT_FOUND"


_STATUS = {ResponseCode.SUCCESS: PopStatus.FOUND, ResponseCode.POLLING_FULL: PopStatus.POLLING_FULL,
           ResponseCode.POLLING_TIMEOUT: PopStatus.POLLING_NOT_FOUND,
           ResponseCode.PULL_NOT_FOUND: PopStatus.POLLING_NOT_FOUND}


@attrs.frozen
class PopMessage:
    message: MessageExt
    receipt: str  # the POP_CK property: what ack/change_invisible take

    @property
    def queue_offset(self) -> int:
        return self.message.record.queue_offset

    @property
    def reconsume_times(self) -> int:
        return self.message.record.reconsume_times


@attrs.frozen(kw_only=True)
class PopResult:
    status: PopStatus
    messages: list  # [PopMessage]
    pop_time: int = 0
    invisible_time: int = 0
    revive_qid: int = 0
    rest_num: int = 0


def receipt_fields(receipt: str) -> list[str]:
    parts = receipt.split(" ") if isinstance(receipt, str) else []
    if len(parts) not in (8, 9):
        raise InvalidArgumentError(f"not a POP receipt (8 fields): {receipt!r}")
    return parts


@attrs.define(eq=False)
class PopClient:
    instance: ClientInstance
    timeout: float = 5.0  # beyond a pop's poll time

    async def pop(self, broker_addr: str, group: str, topic: str, *, queue_id: int = -1, max_nums: int = 32,
                  invisible_ms: int = 60000, poll_ms: int = 0, order: bool = False, expression: str = "*",
                  expression_type: str = "TAG", init_mode: int = INIT_MODE_MAX,
                  attempt_id: str | None = None) -> PopResult:
        """One POP_MESSAGE: up to max_nums (<= 32) messages, invisible for
        invisible_ms; with poll_ms the broker holds the request that long
        when there is nothing to hand out."""
        fields = {"consumerGroup": group, "topic": topic, "queueId": str(queue_id), "maxMsgNums": str(max_nums),
                  "invisibleTime": str(invisible_ms), "pollTime": str(poll_ms),
                  "bornTime": str(int(time.time() * 1000)),
                  "initMode": str(init_mode), "expType": expression_type, "exp": expression,
                  "order": "true" if order else "false"}
        if attempt_id is not None:
            fields["attemptId"] = attempt_id
        resp = await self.instance.invoke(broker_addr, request(RequestCode.POP_MESSAGE, fields),
                                          self.timeout + poll_ms / 1000, ok=tuple(_STATUS))
        f = resp.ext_fields
        status = _STATUS[resp.code]
        messages = []
        if status is PopStatus.FOUND:
            for m in decode_records(resp.body, MessageQueue(topic, "", queue_id)):
                receipt = m.record.properties.get(PROPERTY_POP_CK, "")
                parts = receipt.split(" ")
                queue = MessageQueue(m.record.topic, parts[5] if len(parts) > 5 else "", m.record.queue_id)
                messages.append(PopMessage(attrs.evolve(m, queue=queue), receipt))
        return PopResult(status=status, messages=messages, pop_time=int(f.get("popTime", 0)),
                         invisible_time=int(f.get("invisibleTime", 0)),
                         revive_qid=int(f.get("reviveQid", 0)), rest_num=int(f.get("restNum", 0)))

    async def ack(self, broker_addr: str, group: str, topic: str, receipt: str) -> None:
        """ACK_MESSAGE for the message of `receipt` (SUCCESS also when it was
        acked before, or its invisible time ran out and it is on its way back)."""
        parts = receipt_fields(receipt)
        await self.instance.invoke(broker_addr, request(RequestCode.ACK_MESSAGE, {
            "consumerGroup": group, "topic": topic, "queueId": parts[6], "extraInfo": receipt, "offset": parts[7]}))

    async def batch_ack(self, broker_addr: str, group: str, topic: str, receipts: list[str]) -> None:
        """BATCH_ACK_MESSAGE: the receipts grouped by checkpoint, one bit set each."""
        by_ck: dict = {}
        broker_name = ""
        for receipt in receipts:
            p = receipt_fields(receipt)
            broker_name = p[5]
            by_ck.setdefault((p[0], p[1], p[2], p[3], p[4], p[6]), []).append(int(p[7]))
        acks = []
        for (so, pt, it, rq, r, q), offsets in by_ck.items():
            bits = 0
            for o in offsets:
                if o < int(so):
                    raise InvalidArgumentError(f"receipt offset {o} below its checkpoint's {so}")
                bits |= 1 << (o - int(so))
            raw = bits.to_bytes((bits.bit_length() + 7) // 8, "little")
            acks.append({"c": group, "t": topic, "r": r, "so": int(so), "q": int(q), "rq": int(rq), "pt": int(pt),
                         "it": int(it), "b": base64.b64encode(raw).decode()})
        await self.instance.invoke(broker_addr, request(RequestCode.BATCH_ACK_MESSAGE, body=encode_json(
            {"brokerName": broker_name, "acks": acks})))

    async def change_invisible(self, broker_addr: str, group: str, topic: str, receipt: str,
                               invisible_ms: int) -> str:
        """CHANGE_MESSAGE_INVISIBLETIME: the message becomes visible again
        invisible_ms from now; returns its new receipt (the old one is void)."""
        p = receipt_fields(receipt)
        resp = await self.instance.invoke(broker_addr, request(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, {
            "consumerGroup": group, "topic": topic, "queueId": p[6], "extraInfo": receipt, "offset": p[7],
            "invisibleTime": str(invisible_ms)}))
        f = resp.ext_fields
        new = [p[7], f["popTime"], f["invisibleTime"], f["reviveQid"], p[4], p[5], p[6], p[7], *p[8:]]
        return " ".join(str(x) for x in new)


@asynccontextmanager
async def open_pop_client(namesrv_addr, *, timeout: float = 3.0, credentials=None,
                          tls=None) -> AsyncIterator[PopClient]:
    async with open_client_instance(namesrv_addr, timeout=timeout, credentials=credentials,
                                    tls=tls) as (instance, _tasks):
        yield PopClient(instance)
