# Owns the broker's consumer offset requests (RocketMQ's
# ConsumerManageProcessor and the offset queries of AdminBrokerProcessor):
#
#   QUERY_CONSUMER_OFFSET 14       committed (or staged) offset; with none,
#                                  SUCCESS 0 while the queue still starts at
#                                  0, else QUERY_NOT_FOUND 22 (client-compat #7)
#   UPDATE_CONSUMER_OFFSET 15      through metadata (replicated, coalesced)
#                                  on the writable leader; negative offsets
#                                  ignored; answered unless oneway
#                                  (client-compat #8), and then only once the
#                                  commit is committed in the log: SUCCESS
#                                  means it survives a failover
#   GET_MAX_OFFSET 30 / GET_MIN_OFFSET 31 / SEARCH_OFFSET_BY_TIMESTAMP 29 /
#   GET_EARLIEST_MSG_STORETIME 32  over the consume queues (committed only)
import attrs

from broker.metadata.service import FlushAbortedError, MetadataService
from broker.processors.base import RequestProcessor
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RequestError
from broker.remoting.header import HeaderReader
from broker.store.gate import RoleGate
from consumequeue.dispatcher import DispatchEngine


@attrs.define(eq=False, kw_only=True)
class ConsumerOffsetProcessor(RequestProcessor):
    gate: RoleGate  # offsets are written on the writable leader only
    metadata: MetadataService  # the offsets, replicated
    queues: DispatchEngine  # the consume queues (min/max offsets, store times)

    CODES = (RequestCode.QUERY_CONSUMER_OFFSET, RequestCode.UPDATE_CONSUMER_OFFSET, RequestCode.GET_MAX_OFFSET,
             RequestCode.GET_MIN_OFFSET, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
             RequestCode.GET_EARLIEST_MSG_STORETIME)
    not_leader_remark = "offsets are stored on the DLedger leader (master)"

    def handlers(self) -> dict:
        return {
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.update_consumer_offset,
            RequestCode.GET_MAX_OFFSET: self.get_max_offset,
            RequestCode.GET_MIN_OFFSET: self.get_min_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset_by_timestamp,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self.get_earliest_msg_storetime,
        }

    # --- helpers -------------------------------------------------------------------

    def _cq(self, topic: str, queue_id: int):
        return self.queues.cqs.get(topic, queue_id)

    def _min_max(self, topic: str, queue_id: int) -> tuple[int, int]:
        cq = self._cq(topic, queue_id)
        return (0, 0) if cq is None else (cq.min_offset, cq.max_offset)

    # --- offsets ---------------------------------------------------------------------

    async def query_consumer_offset(self, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        group, topic, queue_id = h.str("consumerGroup"), h.str("topic"), h.int("queueId")
        set_zero = h.bool("setZeroIfNotFound", True)
        offset = self.metadata.query_offset(topic, group, queue_id)
        if offset is not None and offset >= 0:
            return request.make_response(ResponseCode.SUCCESS, None, {"offset": offset})
        if set_zero:
            lo, _ = self._min_max(topic, queue_id)
            # checkInMemByConsumeOffset(0): message 0 is still stored
            if lo <= 0:
                return request.make_response(ResponseCode.SUCCESS, None, {"offset": 0})
        return request.make_response(ResponseCode.QUERY_NOT_FOUND, "Not found, maybe this group consumer boot first")

    async def update_consumer_offset(self, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        group, topic = h.str("consumerGroup"), h.str("topic")
        queue_id, offset = h.int("queueId"), h.long("commitOffset")
        if offset < 0 or queue_id < 0:
            return request.make_response(ResponseCode.SUCCESS)  # client-compat #8: ignored
        self.gate.check_writable()  # refusals: RequestProcessor's translation
        commit = [(topic, group, queue_id, offset)]
        if request.is_oneway:  # nobody hears the answer: stage it for the next flush
            self.metadata.stage_offsets(commit)
            return request.make_response(ResponseCode.SUCCESS)
        # Acknowledge only what is in the replicated log: a commit answered
        # from the staging table was lost with a master that died or lost
        # its term before the next flush (found by the nemesis checker).
        try:
            await self.metadata.commit_offsets(commit)
        except FlushAbortedError as e:
            return request.make_response(ResponseCode.SERVICE_NOT_AVAILABLE, str(e))
        return request.make_response(ResponseCode.SUCCESS)

    async def get_max_offset(self, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        topic, queue_id = h.str("topic"), h.int("queueId")
        h.bool("committed", True)  # every consume queue unit is committed
        return request.make_response(ResponseCode.SUCCESS, None, {"offset": self._min_max(topic, queue_id)[1]})

    async def get_min_offset(self, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        topic, queue_id = h.str("topic"), h.int("queueId")
        return request.make_response(ResponseCode.SUCCESS, None, {"offset": self._min_max(topic, queue_id)[0]})

    async def search_offset_by_timestamp(self, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        topic, queue_id, ts = h.str("topic"), h.int("queueId"), h.long("timestamp")
        boundary = (h.str("boundaryType", None) or "LOWER").strip().upper()
        if boundary not in ("LOWER", "UPPER"):
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"bad boundaryType {boundary!r}")
        offset = self.queues.offset_by_time(topic, queue_id, ts, boundary.lower())
        return request.make_response(ResponseCode.SUCCESS, None, {"offset": offset})

    async def get_earliest_msg_storetime(self, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        topic, queue_id = h.str("topic"), h.int("queueId")
        cq, ts = self._cq(topic, queue_id), -1
        if cq is not None and cq.min_offset < cq.max_offset:
            unit = cq.get_unit(cq.min_offset)
            if not unit.is_blank:
                found = self.queues.store_timestamp_of(unit.phy, unit.size)
                ts = -1 if found is None else found
        return request.make_response(ResponseCode.SUCCESS, None, {"timestamp": ts})
