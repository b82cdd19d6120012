# Owns RECALL_MESSAGE 370 (RocketMQ 5's RecallMessageProcessor): cancel a
# timer message before it is delivered.  Header (RecallMessageRequestHeader):
# producerGroup, topic, recallHandle, brokerName (optional; the handle names
# the broker too).  Answer: SUCCESS with the message id (msgId), or
#
#   not the master                 SERVICE_NOT_AVAILABLE (the gate's remark)
#   topic unknown                  TOPIC_NOT_EXIST "recall failed, the topic[T] not exist"
#   handle not v1 base64           ILLEGAL_OPERATION "recall handle is invalid"
#   handle for another topic       ILLEGAL_OPERATION "recall failed, topic not match"
#   handle for another broker      ILLEGAL_OPERATION "recall failed, broker service not available"
#   time passed / beyond horizon   ILLEGAL_OPERATION "recall failed, timestamp invalid"
#   no such pending timer          ILLEGAL_OPERATION (delivered, already recalled or unknown;
#                                  upstream writes a delete marker blindly and answers SUCCESS,
#                                  we know the pending set and say so)
#
# The cancellation itself (a replicated timer.done record, so no master
# delivers it afterwards) is TimerService.recall (broker/store/timer.py).
import logging
import time
import typing

import attrs

from broker.config import LiveConfig
from broker.metadata.service import MetadataService
from broker.processors.base import RequestProcessor
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RequestError
from broker.remoting.header import HeaderReader
from broker.store.gate import RoleGate
from broker.store.timer import RecallError, RecallHandle, TimerService

log = logging.getLogger("ledgermq.recall")


@attrs.define(eq=False)
class RecallProcessor(RequestProcessor):
    config: LiveConfig
    gate: RoleGate
    metadata: MetadataService
    timer: TimerService
    clock_ms: typing.Callable[[], int] = lambda: int(time.time() * 1000)

    CODES = (RequestCode.RECALL_MESSAGE,)
    not_leader_remark = "recall failed, broker service not available"

    def handlers(self) -> dict:
        return {RequestCode.RECALL_MESSAGE: self.recall}

    async def recall(self, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        topic, text = h.str("topic"), h.str("recallHandle", "")
        group = h.str("producerGroup", "")
        cfg = self.config.current
        self.gate.check_writable()
        if self.metadata.topic_config(topic) is None:
            return request.make_response(ResponseCode.TOPIC_NOT_EXIST, f"recall failed, the topic[{topic}] not exist")
        try:
            handle = RecallHandle.decode(text)
        except ValueError as exc:
            return request.make_response(ResponseCode.ILLEGAL_OPERATION, str(exc))
        if handle.topic != topic:
            return request.make_response(ResponseCode.ILLEGAL_OPERATION, "recall failed, topic not match")
        if handle.broker_name != cfg.broker_name:
            return request.make_response(ResponseCode.ILLEGAL_OPERATION, "recall failed, broker service not available")
        try:
            left = int(handle.timestamp) - self.clock_ms()
        except ValueError:
            left = -1
        if left <= 0 or left >= cfg.timer_max_delay_sec * 1000:
            return request.make_response(ResponseCode.ILLEGAL_OPERATION, "recall failed, timestamp invalid")
        try:
            await self.timer.recall(handle.message_id)
        except RecallError as exc:
            raise RequestError(ResponseCode[exc.code], exc.remark) from None
        log.debug("timer message %s of %s recalled by %s", handle.message_id, topic, group)
        return request.make_response(ResponseCode.SUCCESS, None, ext_fields={"msgId": handle.message_id})
