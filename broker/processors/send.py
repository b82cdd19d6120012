# Owns the send path (RocketMQ's SendMessageProcessor over DLedgerCommitLog):
# SEND_MESSAGE (10, full header names), SEND_MESSAGE_V2 (310, short names
# a..n) and SEND_BATCH_MESSAGE (320, V2 header, body per spec §1.10), from
# request RemotingCommand to response RemotingCommand.
#
#   1. parse the header (values arrive as text, numbers or booleans,
#      client-compat #1; RemotingCommand already made them text);
#   2. the role gate: only a writable leader takes writes;
#   3. validate: topic name (TopicValidator), forbidden/internal topics,
#      body size vs maxMessageSize, properties length, queueId range;
#   4. the topic config, auto-created through metadata when allowed;
#   5. build the records (spec §1.8): bornHost = the connection's peer,
#      storeHost = brokerIP1:listenPort, storeTimestamp, masked body CRC,
#      the producer's sysFlag kept (compression bit) with the V6 bits set
#      from the hosts, UNIQ_KEY added when missing, CLUSTER property;
#   6. append through the replica; the reply is sent only after the entries
#      are committed on a quorum (the append hook has stamped QUEUEOFFSET and
#      PHYSICALOFFSET; the queue offset is read back from the stored bytes);
#   7. reply: msgId = offset message id (comma-separated for a batch),
#      queueId, queueOffset (the first), transactionId = UNIQ_KEY.
#
# Error translation happens in one place, _failure(): SendError carries a
# code of its own; commitlog errors map as the issue asks (spec §6.8 maps a
# quorum timeout to SYSTEM_ERROR; we answer FLUSH_SLAVE_TIMEOUT, with the
# msgId/queueOffset read from the local log when it still holds our records,
# because clients count that code as "sent" and the entry may still commit).
#   not leader / catching up / term changed / disk full -> SERVICE_NOT_AVAILABLE
#                               (remark names the leader when one is known)
#   pending full             -> SYSTEM_BUSY
#   quorum timeout           -> FLUSH_SLAVE_TIMEOUT
#   entry too large          -> MESSAGE_ILLEGAL
# Delay levels: a single message whose DELAY property is > 0 is stored to
# SCHEDULE_TOPIC_XXXX (broker/store/schedule.py rewrites it; the reply's queueId is
# the one the producer asked for, its queueOffset the schedule queue's, as
# Java answers); batches with DELAY are refused.  CONSUMER_SEND_MSG_BACK
# (retry/DLQ) lives in broker/processors/retry.py and reuses _failure.
# Not handled here: transactions (PREPARED is refused), ACL.
import functools
import logging
import random
import struct
import time
import typing

import attrs

from broker.common.msgid import UniqKeyGenerator, offset_msg_id
from broker.common.permissions import PERM_WRITE
from broker.common.values import InvalidMetadataError, TopicConfig, check_topic_name
from broker.config import BrokerConfig, LiveConfig
from broker.metadata.records import is_internal_topic
from broker.metadata.service import MetadataService
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RequestError
from broker.remoting.header import HeaderReader
from broker.store.gate import NotWritableError, RoleGate, describe_leader
from broker.store.schedule import DelayPropertyError, to_schedule
from commitlog.errors import (
    CommitLogError,
    DiskFullError,
    EntryTooLargeError,
    NotLeaderError,
    PendingFullError,
    QuorumTimeoutError,
)
from commitlog.replica import ReplicaNode
from commitlog.store import SegmentedStore
from consumequeue import record as M

log = logging.getLogger("ledgermq.send")

# SendMessageRequestHeaderV2 short name -> SendMessageRequestHeader name
V2_NAMES = {"a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums",
            "e": "queueId", "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties",
            "j": "reconsumeTimes", "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch", "n": "brokerName"}
_V2_SHORT = {full: short for short, full in V2_NAMES.items()}
# The header fields in parse_send_header's order, under each code's names.
_FULL_FIELDS = ("producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
                "bornTimestamp", "flag", "properties", "reconsumeTimes", "maxReconsumeTimes", "batch")
_SHORT_FIELDS = tuple(_V2_SHORT[name] for name in _FULL_FIELDS)
AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
# TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET (+ the auto-create template topic)
NOT_ALLOWED_SEND_TOPICS = frozenset({
    "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT", AUTO_CREATE_TOPIC_KEY_TOPIC})
PROPERTY_TRAN_MSG = "TRAN_MSG"
PROPERTY_MSG_REGION = "MSG_REGION"
PROPERTY_TRACE_SWITCH = "TRACE_ON"
DEFAULT_REGION = "DefaultRegion"
_NO_BATCH_FLAGS = M.NEED_UNWRAP_FLAG | M.INNER_BATCH_FLAG
_I64 = struct.Struct(">q")


@attrs.define(str=False)
class SendError(Exception):
    """A send refused before it reached the log; answered with `code`."""

    code: int
    remark: str

    def __str__(self) -> str:
        return f"{ResponseCode(self.code).name}: {self.remark}"


@attrs.frozen
class SendHeader:
    producer_group: str
    topic: str
    default_topic: str
    default_topic_queue_nums: int
    queue_id: int
    sys_flag: int
    born_timestamp: int
    flag: int
    properties: dict
    reconsume_times: int = 0
    max_reconsume_times: int | None = None
    batch: bool = False


def parse_send_header(request: RemotingCommand) -> SendHeader:
    """SEND_MESSAGE's full names, or V2/BATCH's short ones.  RequestError
    (SYSTEM_ERROR, Java's wording) when a required field is missing or bad."""
    h = HeaderReader(request.ext_fields)
    # V2/BATCH carry the same fields under short names; errors name the wire name, as Java's do.
    short = request.code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)
    pg, tp, dt, dqn, qid, sf, bts, fl, pr, rt, mrt, bt = _SHORT_FIELDS if short else _FULL_FIELDS
    return SendHeader(
        producer_group=h.str(pg), topic=h.str(tp), default_topic=h.str(dt),
        default_topic_queue_nums=h.int(dqn), queue_id=h.int(qid),
        sys_flag=h.int(sf), born_timestamp=h.long(bts), flag=h.int(fl),
        properties=M.string_to_properties(h.str(pr, "")),
        reconsume_times=h.int(rt, 0), max_reconsume_times=h.int(mrt, None),
        batch=request.code == RequestCode.SEND_BATCH_MESSAGE or h.bool(bt, False))


def validate_topic(topic: str) -> None:
    """TopicValidator.validateTopic + isNotAllowedSendTopic + our internal topics."""
    try:
        check_topic_name(topic)
    except InvalidMetadataError as exc:
        raise SendError(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
    if topic in NOT_ALLOWED_SEND_TOPICS or is_internal_topic(topic):
        raise SendError(ResponseCode.NO_PERMISSION, f"Sending message to topic[{topic}] is forbidden.")


@functools.lru_cache(maxsize=4096)  # peers are few and stable; this runs per send
def host_of(peer) -> M.HostAddr:
    """The born host from a connection's peer address ("ip:port", "[v6]:port",
    a (host, port) tuple or a HostAddr); IPv4-mapped IPv6 becomes IPv4 so
    clients that read only IPv4 hosts can decode it (client-compat #9)."""
    if isinstance(peer, M.HostAddr):
        addr = peer
    elif isinstance(peer, tuple):
        addr = M.HostAddr(peer[0], int(peer[1]))
    else:
        addr = M.HostAddr.parse(str(peer))
    mapped = getattr(addr.ip, "ipv4_mapped", None)
    return M.HostAddr(mapped, addr.port) if mapped is not None else addr


@attrs.define(eq=False)
class SendProcessor:
    config: LiveConfig
    replica: ReplicaNode  # append(bodies) -> [(index, pos)] after commit
    gate: RoleGate  # check_writable()
    metadata: MetadataService  # topic_config, update_topic
    store: SegmentedStore  # the replica's log: get(index) to read back stamped offsets
    uniq_keys: UniqKeyGenerator = attrs.Factory(UniqKeyGenerator)
    rng: random.Random = attrs.Factory(random.Random)
    clock_ms: typing.Callable[[], int] = lambda: int(time.time() * 1000)

    @property
    def cfg(self) -> BrokerConfig:
        return self.config.current

    async def __call__(self, conn, request: RemotingCommand) -> RemotingCommand:
        """The RequestDispatcher processor for codes 10, 310 and 320."""
        return await self.process(request, conn.remote_address)

    CODES = (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)

    def register(self, dispatcher) -> None:
        for code in self.CODES:
            dispatcher.register(code, self)

    async def process(self, request: RemotingCommand, peer) -> RemotingCommand:
        records: list[bytes] = []
        try:
            header = parse_send_header(request)
            self.gate.check_writable()
            validate_topic(header.topic)
            # The usual case (the topic exists, writable) without a coroutine; the rest in _topic_config.
            topic_cfg = self.metadata.topic_config(header.topic)
            if topic_cfg is None or not topic_cfg.perm & PERM_WRITE:
                topic_cfg = await self._topic_config(header)
            queue_id = self._queue_id(header, topic_cfg)
            records, uniq = self._records(header, topic_cfg, queue_id, request.body, host_of(peer))
            placed = await self.replica.append(records)
            return self._success(request, queue_id, placed, uniq)
        except (SendError, RequestError, CommitLogError, InvalidMetadataError, M.MessageFormatError) as exc:
            return self._failure(request, exc, records)

    # --- steps --------------------------------------------------------------------

    async def _topic_config(self, header: SendHeader) -> TopicConfig:
        cfg = self.metadata.topic_config(header.topic)
        if cfg is None:
            if not self.cfg.auto_create_topic_enable:
                raise SendError(ResponseCode.TOPIC_NOT_EXIST,
                                f"topic[{header.topic}] not exist, apply first please!")
            # createTopicInSendMessageMethod: min(client's, broker's) queues, perm RW.
            n = max(1, min(header.default_topic_queue_nums, self.cfg.default_topic_queue_nums))
            log.info("auto-creating topic %s with %d queues for producer group %s", header.topic, n,
                     header.producer_group)
            await self.metadata.update_topic(TopicConfig(header.topic, n, n))
            cfg = self.metadata.topic_config(header.topic)
            if cfg is None:  # deleted again meanwhile
                raise SendError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{header.topic}] not exist, apply first please!")
        if not cfg.perm & PERM_WRITE:
            raise SendError(ResponseCode.NO_PERMISSION, f"the topic[{header.topic}] sending message is forbidden")
        return cfg

    def _queue_id(self, header: SendHeader, cfg: TopicConfig) -> int:
        if header.queue_id < 0:
            if cfg.write_queue_nums <= 0:
                raise SendError(ResponseCode.NO_PERMISSION, f"topic[{header.topic}] has no write queues")
            return self.rng.randrange(cfg.write_queue_nums)
        limit = max(cfg.write_queue_nums, cfg.read_queue_nums)
        if header.queue_id >= limit:
            raise SendError(ResponseCode.SYSTEM_ERROR,
                            f"request queueId[{header.queue_id}] is illegal, topic[{header.topic}] has "
                            f"{limit} queues. Producer group: {header.producer_group}")
        return header.queue_id

    def _properties(self, props: dict) -> tuple[dict, str]:
        props = dict(props)
        uniq = props.get(M.PROPERTY_UNIQ_KEY) or self.uniq_keys.next()
        props[M.PROPERTY_UNIQ_KEY] = uniq
        props[M.PROPERTY_CLUSTER] = self.cfg.broker_cluster_name
        return props, uniq

    def _records(self, header: SendHeader, cfg: TopicConfig, queue_id: int, body: bytes,
                 born_host: M.HostAddr) -> tuple[list[bytes], str | None]:
        max_size = self.cfg.max_message_size
        if len(body) > max_size:
            raise SendError(ResponseCode.MESSAGE_ILLEGAL,
                            f"message body size {len(body)} exceeds maxMessageSize {max_size}")
        sysflag = header.sys_flag
        if sysflag & M.TRANSACTION_MASK == M.TRANSACTION_PREPARED_TYPE:
            raise SendError(ResponseCode.NO_PERMISSION, "transaction messages are not supported by this broker")
        if cfg.topic_filter_type == "MULTI_TAG":
            sysflag |= M.MULTI_TAGS_FLAG
        store_timestamp = self.clock_ms()
        if not header.batch:
            props, uniq = self._properties(header.properties)
            # Built once (no template + evolve): this runs per message.
            rec = M.MessageRecord(
                topic=header.topic, body=body, properties=props, queue_id=queue_id, flag=header.flag,
                sysflag=sysflag, born_timestamp=header.born_timestamp, born_host=born_host,
                store_timestamp=store_timestamp, store_host=self.cfg.store_host,
                reconsume_times=header.reconsume_times)
            try:
                rec = to_schedule(rec, len(self.cfg.message_delay_levels_ms))
            except DelayPropertyError as exc:
                raise SendError(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
            return [M.encode(rec)], uniq
        # SEND_BATCH_MESSAGE: one record (and one log entry) per message.
        if header.properties.get(PROPERTY_TRAN_MSG, "").lower() == "true" or header.sys_flag & M.TRANSACTION_MASK:
            raise SendError(ResponseCode.MESSAGE_ILLEGAL, "batch message does not support transaction")
        if header.properties.get(M.PROPERTY_DELAY, "0").strip() not in ("", "0"):
            raise SendError(ResponseCode.MESSAGE_ILLEGAL, "batch message does not support delay")
        items = M.decode_batch(body)
        if not items:
            raise SendError(ResponseCode.MESSAGE_ILLEGAL, "empty batch")
        # Each item's record built directly (attrs.evolve of a template costs as much again per item).
        record, topic, store_host = M.MessageRecord, header.topic, self.cfg.store_host
        batch_sysflag = sysflag & ~(_NO_BATCH_FLAGS | M.COMPRESSED_FLAG)
        born_ts, reconsume = header.born_timestamp, header.reconsume_times
        records = []
        for item in items:
            props, _ = self._properties(item.properties)
            records.append(M.encode(record(
                topic=topic, body=item.body, properties=props, queue_id=queue_id, flag=item.flag,
                sysflag=batch_sysflag, born_timestamp=born_ts, born_host=born_host,
                store_timestamp=store_timestamp, store_host=store_host, reconsume_times=reconsume)))
        return records, header.properties.get(M.PROPERTY_UNIQ_KEY)

    # --- replies --------------------------------------------------------------------

    def _stamped(self, placed) -> tuple[list[str], int]:
        """(offset msg ids, first queue offset) of stored records."""
        ids, first = [], None
        for index, pos in placed:
            ids.append(offset_msg_id(self.cfg.store_host, pos + 48))
            if first is None:
                first = _I64.unpack_from(self.store.get(index).body, M.POS_QUEUEOFFSET)[0]
        return ids, first

    def _reply(self, request, code, queue_id, ids, queue_offset, uniq, remark=None) -> RemotingCommand:
        fields = {"msgId": ",".join(ids), "queueId": queue_id, "queueOffset": queue_offset,
                  "transactionId": uniq, PROPERTY_MSG_REGION: DEFAULT_REGION, PROPERTY_TRACE_SWITCH: True}
        return request.make_response(code, remark, ext_fields=fields)

    def _success(self, request, queue_id, placed, uniq) -> RemotingCommand:
        ids, queue_offset = self._stamped(placed)
        return self._reply(request, ResponseCode.SUCCESS, queue_id, ids, queue_offset, uniq)

    def _timed_out_reply(self, request, exc: QuorumTimeoutError, records) -> RemotingCommand | None:
        """FLUSH_SLAVE_TIMEOUT with ids, if the log still holds exactly our
        records (offsets aside) at the entries the append was given."""
        first = exc.index - len(records) + 1
        placed = []
        try:
            for index, rec in zip(range(first, exc.index + 1), records):
                e = self.store.get(index)
                stored = bytes(e.body)
                if stored[:M.POS_QUEUEOFFSET] + stored[M.POS_SYSFLAG:] != rec[:M.POS_QUEUEOFFSET] + rec[M.POS_SYSFLAG:]:
                    return None
                placed.append((index, e.pos))
            ids, queue_offset = self._stamped(placed)
        except CommitLogError:
            return None
        rec = M.decode(records[0])
        uniq = rec.uniq_key if len(records) == 1 else None
        return self._reply(request, ResponseCode.FLUSH_SLAVE_TIMEOUT, rec.queue_id, ids, queue_offset, uniq,
                           remark=str(exc))

    def _failure(self, request: RemotingCommand, exc: Exception, records) -> RemotingCommand:
        """The one translation point from errors to response codes."""
        if isinstance(exc, (SendError, RequestError)):
            code, remark = exc.code, exc.remark
        elif isinstance(exc, NotLeaderError):
            code, remark = ResponseCode.SERVICE_NOT_AVAILABLE, self.not_leader_remark(exc)
        elif isinstance(exc, PendingFullError):
            code, remark = ResponseCode.SYSTEM_BUSY, f"[PCBUSY_CLEAN_QUEUE]broker busy: {exc}"
        elif isinstance(exc, QuorumTimeoutError):
            reply = self._timed_out_reply(request, exc, records) if records else None
            if reply is not None:
                return reply
            code, remark = ResponseCode.FLUSH_SLAVE_TIMEOUT, str(exc)
        elif isinstance(exc, (EntryTooLargeError, InvalidMetadataError, M.MessageFormatError)):
            code, remark = ResponseCode.MESSAGE_ILLEGAL, str(exc)
        elif isinstance(exc, CommitLogError):  # TermChanged, DiskFull, transfer in progress, ...
            code = ResponseCode.SERVICE_NOT_AVAILABLE
            remark = f"service not available now: {exc}"
            if not isinstance(exc, DiskFullError):
                remark += f" ({self._leader_hint()})"
        else:  # pragma: no cover - process() catches only the types above
            raise exc
        log.debug("send to %s refused: %s %s", request.ext_fields.get("topic") or request.ext_fields.get("b"),
                  ResponseCode(code).name, remark)
        return request.make_response(code, remark)

    def _leader_hint(self) -> str:
        leader = self.replica.leader_error()
        return describe_leader(leader.leader_id, leader.leader_addr, self._broker_addr_of(leader.leader_id))

    def _broker_addr_of(self, leader_id: str | None) -> str | None:
        return self.gate.leader_broker_addr(leader_id)

    def not_leader_remark(self, exc: NotLeaderError) -> str:
        """Names the master's broker address (brokerIP1:listenPort), the one
        a client can use, when the metadata knows it."""
        writable = exc if isinstance(exc, NotWritableError) else None
        if writable is not None and writable.catching_up:
            return (f"broker {self.cfg.broker_name}/{self.cfg.self_id} was just elected leader and does not "
                    f"accept writes until it has caught up; retry shortly")
        broker_addr = (writable.broker_addr if writable is not None else None) or self._broker_addr_of(exc.leader_id)
        who = describe_leader(exc.leader_id, exc.leader_addr, broker_addr)
        return f"broker {self.cfg.broker_name}/{self.cfg.self_id} is not the DLedger leader (master); {who}"
