# Owns the send path (RocketMQ's SendMessageProcessor over DLedgerCommitLog):
# SEND_MESSAGE (10, full header names), SEND_MESSAGE_V2 (310, short names a..n)
# and SEND_BATCH_MESSAGE (320, V2 header, body per spec §1.10), from request to
# response: parse the header (client-compat #1), the role gate (only a writable
# leader takes writes), validation (TopicValidator, forbidden/internal topics,
# maxMessageSize, properties length, queueId range), the topic config
# (auto-created through metadata when allowed), the records (spec §1.8:
# bornHost = the connection's peer, storeHost = brokerIP1:listenPort, masked
# body CRC, the producer's sysFlag with the V6 bits from the hosts, UNIQ_KEY
# added when missing, CLUSTER property), one append through the replica, and
# the reply (offset msgId, comma-separated for a batch; queueId; the first
# queueOffset; transactionId = UNIQ_KEY).
#
# Rules.  A reply is sent only once the entries are committed on a quorum.
# One route: the burst (send_burst.py).  A send this broker could not store (not leader, transferring, an
# entry a later leader truncated) goes to unstored(), where the forwarder
# (forward.py) may hold it or hand it to the master; otherwise it is refused.
# Errors are translated in one place, refusal():
#   not leader / catching up / term changed / disk full -> SERVICE_NOT_AVAILABLE
#                               (remark names the leader when one is known)
#   pending full             -> SYSTEM_BUSY
#   quorum timeout           -> FLUSH_SLAVE_TIMEOUT (not spec §6.8's SYSTEM_ERROR:
#                               clients count it as sent, and the entry may still
#                               commit; msgId/queueOffset read from the local log)
#   entry too large          -> MESSAGE_ILLEGAL
# DELAY > 0 stores a single message to SCHEDULE_TOPIC_XXXX (schedule.py; the
# reply keeps the producer's queueId, the offset is the schedule queue's, as
# Java); a batch with DELAY is refused.  PREPARED halves go to
# RMQ_SYS_TRANS_HALF_TOPIC (_half_record).  Elsewhere: CONSUMER_SEND_MSG_BACK
# (retry.py), END_TRANSACTION (end_transaction.py), the ACL (broker/acl/).
import functools
import logging
import random
import struct
import time
import typing

import attrs

from broker.common.msgid import UniqKeyGenerator, offset_msg_ids
from broker.common.permissions import PERM_WRITE
from broker.common.values import InvalidMetadataError, TopicConfig, check_topic_name
from broker.config import BrokerConfig, LiveConfig
from broker.metadata.records import is_internal_topic
from broker.metadata.service import MetadataService
from broker.processors import send_burst, send_native
from broker.processors.forward import WriteForwarder
from broker.remoting.codec import CommandDecoder, encode_response
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RequestError
from broker.remoting.header import HeaderReader
from broker.store.gate import NotWritableError, RoleGate, describe_leader
from broker.store.schedule import DelayPropertyError, to_schedule
from broker.store.timer import TIMER_PROPERTIES, TIMER_TOPIC, timer_key, to_timer
from broker.store.transaction import to_half
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
from consumequeue import batch as batches
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
    "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT", AUTO_CREATE_TOPIC_KEY_TOPIC,
    TIMER_TOPIC})
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


@attrs.frozen(slots=False)  # (slots off: `properties` is cached per header)
class SendHeader:
    producer_group: str
    topic: str
    default_topic: str
    default_topic_queue_nums: int
    queue_id: int
    sys_flag: int
    born_timestamp: int
    flag: int
    properties_text: str  # as the producer sent it: parsed only when something needs a property
    reconsume_times: int = 0
    max_reconsume_times: int | None = None
    batch: bool = False

    @functools.cached_property
    def properties(self) -> dict:
        return M.string_to_properties(self.properties_text)


class _NotPlain(Exception):
    """Internal: a header field the fast parse leaves to HeaderReader."""


def _plain_int(fields: dict, key: str, digits: int) -> int:
    value = fields.get(key)
    # Unsigned ASCII digits only: anything else (signs, blanks, Java's
    # other spellings, errors) goes through HeaderReader's rules.
    if value is None or not (value.isascii() and value.isdigit() and len(value) <= digits):
        raise _NotPlain
    return int(value)


def parse_send_header(request: RemotingCommand) -> SendHeader:
    """SEND_MESSAGE's full names, or V2/BATCH's short ones.  RequestError
    (SYSTEM_ERROR, Java's wording) when a required field is missing or bad.
    Headers of plain digits and present fields (what producers send) take a
    fast path; any other spelling is read by HeaderReader, field by field."""
    # V2/BATCH carry the same fields under short names; errors name the wire name, as Java's do.
    short = request.code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)
    pg, tp, dt, dqn, qid, sf, bts, fl, pr, rt, mrt, bt = _SHORT_FIELDS if short else _FULL_FIELDS
    f = request.ext_fields
    try:
        batch = f.get(bt)
        if batch not in (None, "false", "true", "0", "1"):
            raise _NotPlain
        max_times = f.get(mrt)
        return SendHeader(
            producer_group=f[pg], topic=f[tp], default_topic=f[dt],
            default_topic_queue_nums=_plain_int(f, dqn, 9), queue_id=_plain_int(f, qid, 9),
            sys_flag=_plain_int(f, sf, 9), born_timestamp=_plain_int(f, bts, 18), flag=_plain_int(f, fl, 9),
            properties_text=f.get(pr) or "",
            reconsume_times=_plain_int(f, rt, 9) if rt in f else 0,
            max_reconsume_times=None if max_times is None else _plain_int(f, mrt, 9),
            batch=request.code == RequestCode.SEND_BATCH_MESSAGE or batch == "true")  # ("1": false, as Java)
    except (_NotPlain, KeyError):
        pass
    h = HeaderReader(f)
    return SendHeader(
        producer_group=h.str(pg), topic=h.str(tp), default_topic=h.str(dt),
        default_topic_queue_nums=h.int(dqn), queue_id=h.int(qid),
        sys_flag=h.int(sf), born_timestamp=h.long(bts), flag=h.int(fl),
        properties_text=h.str(pr, ""),
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


def _topic_ok(topic: str) -> bool:
    try:
        validate_topic(topic)
    except SendError:
        return False
    return True


_UNIQ_NAME = M.PROPERTY_UNIQ_KEY + "\x01"


@functools.lru_cache(maxsize=4096)  # topics are few and stable; this runs per send
def _topic_wire(topic: str) -> tuple[bytes, int]:
    """A topic's UTF-8 bytes and the record magic it needs."""
    return topic.encode("utf-8", "surrogatepass"), M.choose_magic(topic)


@functools.lru_cache(maxsize=4096)
def _host_wire(host: M.HostAddr) -> tuple[bytes, bool]:
    return host.packed, host.is_v6


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
    native_sends: send_native.NativeSends = attrs.Factory(lambda: send_native.NativeSends(_topic_ok))
    # Hands on or holds what this node cannot store (forward.py); None: refuse at once.
    forwarder: WriteForwarder | None = None
    # Waits until the name servers were told of a topic just auto-created (the broker's
    # registration, wired by the composition root); None: nobody to tell.
    topics_announced: typing.Callable[[], typing.Awaitable[None]] | None = None

    @property
    def cfg(self) -> BrokerConfig:
        return self.config.current

    async def __call__(self, conn, request: RemotingCommand) -> RemotingCommand:
        """The RequestDispatcher processor for codes 10, 310 and 320."""
        return await self.process(request, conn.remote_address)

    CODES = (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)

    def register(self, dispatcher) -> None:
        for code in self.CODES:
            dispatcher.register_burst(code, self)

    async def process(self, request: RemotingCommand, peer, *, hand_on: bool = True) -> RemotingCommand:
        """One send, start to answer: a burst of one (send_burst.py), so a
        request read alone and one read with others take the same route.
        hand_on=False: the forwarder's own retry here, refused plainly if
        it fails again."""
        answers = send_burst.accept_burst(self, _Peer(peer), [request], hand_on=hand_on)
        [reply] = await answers()
        return _as_command(reply) if type(reply) is bytes else reply

    async def unstored(self, request, exc: Exception, peer, records=(), first_index: int = -1) -> RemotingCommand:
        """The one answer to a send this broker did not store: handed on to
        the master, or held until this node is the master again, when the
        forwarder takes it (forward.py: a master that just stepped down, a
        leader catching up or transferring); else refusal().
        `request` may be a RemotingCommand or a SendRun's RawSend."""
        fwd = self.forwarder
        if fwd is not None and fwd.eligible(request, exc):
            command = request if type(request) is RemotingCommand else request.command()
            reply = await fwd.take_over(command, lambda: self.process(command, peer, hand_on=False))
            if reply is not None:
                return reply
        return self.refusal(request, exc, records, first_index)

    def accept_burst(self, conn, cmds: list):
        """The synchronous half of a burst (send_burst.py); returns the
        async half, which answers each item in order."""
        return send_burst.accept_burst(self, conn, cmds)

    # What send_burst.py asks of the general path.
    REFUSALS = (SendError, RequestError, CommitLogError, InvalidMetadataError, M.MessageFormatError)

    def burst_hosts(self, peer) -> tuple[M.HostAddr, bytes, bool, bytes]:
        """(bornHost, its record bytes, whether IPv6, storeHost's record bytes)."""
        born_host = host_of(peer)
        born, born_v6 = _host_wire(born_host)
        return born_host, born, born_v6, _host_wire(self.cfg.store_host)[0]

    def burst_records(self, request: RemotingCommand, born_host: M.HostAddr) -> tuple | None:
        """One send of a burst the general way: (queueId, records, UNIQ_KEY),
        or None when its topic must be auto-created first or is not
        writable (topic_for_send creates it or says why).  Raises REFUSALS."""
        header = parse_send_header(request)
        validate_topic(header.topic)
        topic_cfg = self.metadata.topic_config(header.topic)
        if topic_cfg is None or not topic_cfg.perm & PERM_WRITE:
            return None
        queue_id = self._queue_id(header, topic_cfg)
        recs, uniq = self._records(header, topic_cfg, queue_id, request.body, born_host)
        return queue_id, recs, uniq

    # --- steps --------------------------------------------------------------------

    async def topic_for_send(self, request: RemotingCommand, create: bool = True) -> TopicConfig:
        """The writable config of a send's topic, auto-created first when
        that is allowed (and `create`); raises REFUSALS with the reason."""
        header = parse_send_header(request)
        validate_topic(header.topic)
        return await self._topic_config(header, create)

    async def _topic_config(self, header: SendHeader, create: bool = True) -> TopicConfig:
        cfg = self.metadata.topic_config(header.topic)
        if cfg is None:
            if not (create and self.cfg.auto_create_topic_enable):
                raise SendError(ResponseCode.TOPIC_NOT_EXIST,
                                f"topic[{header.topic}] not exist, apply first please!")
            # createTopicInSendMessageMethod: min(client's, broker's) queues, perm RW.
            n = max(1, min(header.default_topic_queue_nums, self.cfg.default_topic_queue_nums))
            log.info("auto-creating topic %s with %d queues for producer group %s", header.topic, n,
                     header.producer_group)
            await self.metadata.update_topic(TopicConfig(header.topic, n, n))
            if self.topics_announced is not None:  # routable before the first SEND_OK, as in RocketMQ
                await self.topics_announced()
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

    def _plain_record(self, header: SendHeader, sysflag: int, queue_id: int, body: bytes, born_host: M.HostAddr,
                      store_timestamp: int) -> tuple[bytes, str] | None:
        """The usual single message, the quick way: (record, UNIQ_KEY), or
        None for the general path.  Its properties string is kept as sent,
        plus UNIQ_KEY when missing and CLUSTER -- what Java's parse and
        re-serialization (and _properties below) make of a well-formed
        string -- and the record is encoded from wire-form fields, without a
        MessageRecord.  DELAY (a scheduled message), a CLUSTER of its own or
        a string that does not look well-formed take the general path."""
        plain = self._plain_properties(header.properties_text)
        if plain is None:
            return None
        props, uniq = plain
        cfg = self.cfg
        topic, magic = _topic_wire(header.topic)
        born, born_v6 = _host_wire(born_host)
        store, store_v6 = _host_wire(cfg.store_host)
        sysflag = M.host_flags(sysflag, born_v6, store_v6)
        return M.encode_parts(magic, topic, props, body, queue_id=queue_id, flag=header.flag, sysflag=sysflag,
                              born_timestamp=header.born_timestamp, born_host=born, store_timestamp=store_timestamp,
                              store_host=store, reconsume_times=header.reconsume_times), uniq

    def _plain_properties(self, text: str) -> tuple[bytes, str] | None:
        """A well-formed properties string as stored (UTF-8, UNIQ_KEY added
        when missing, CLUSTER appended) and its UNIQ_KEY, or None for the
        general path (see _plain_record)."""
        if text and (text[-1] != "\x02" or text.count("\x01") != text.count("\x02")):
            return None
        if "DELAY\x01" in text or "CLUSTER\x01" in text or "TIMER_" in text:  # (TIMER_: timer.py)
            return None
        at = 0 if text.startswith(_UNIQ_NAME) else text.find("\x02" + _UNIQ_NAME)
        if at >= 0:
            value_at = (at if at == 0 else at + 1) + len(_UNIQ_NAME)
            uniq = text[value_at:text.index("\x02", value_at)]
            if not uniq or text.find(_UNIQ_NAME, value_at) >= 0:
                return None  # empty (Java drops it) or given twice
            tail = ""
        else:
            uniq = self.uniq_keys.next()
            tail = _UNIQ_NAME + uniq + "\x02"
        props = text + tail + "CLUSTER\x01" + self.cfg.broker_cluster_name + "\x02"
        return props.encode("utf-8", "surrogatepass"), uniq

    def _records(self, header: SendHeader, cfg: TopicConfig, queue_id: int, body: bytes,
                 born_host: M.HostAddr) -> tuple[list[bytes], str | None]:
        max_size = self.cfg.max_message_size
        if len(body) > max_size:
            raise SendError(ResponseCode.MESSAGE_ILLEGAL,
                            f"message body size {len(body)} exceeds maxMessageSize {max_size}")
        sysflag = header.sys_flag
        if sysflag & M.TRANSACTION_MASK == M.TRANSACTION_PREPARED_TYPE and not header.batch:
            return self._half_record(header, sysflag, queue_id, body, born_host)
        if cfg.topic_filter_type == "MULTI_TAG":
            sysflag |= M.MULTI_TAGS_FLAG
        store_timestamp = self.clock_ms()
        if not header.batch:
            plain = self._plain_record(header, sysflag, queue_id, body, born_host, store_timestamp)
            if plain is not None:
                return [plain[0]], plain[1]
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
            rec = to_timer(rec, store_timestamp, self.cfg)  # TimerMessageError: MESSAGE_ILLEGAL in refusal()
            return [M.encode(rec)], timer_key(uniq, rec, self.cfg.broker_name)
        # SEND_BATCH_MESSAGE: one record (and one log entry) per message.
        if header.properties.get(PROPERTY_TRAN_MSG, "").lower() == "true" or header.sys_flag & M.TRANSACTION_MASK:
            raise SendError(ResponseCode.MESSAGE_ILLEGAL, "batch message does not support transaction")
        if header.properties.get(M.PROPERTY_DELAY, "0").strip() not in ("", "0"):
            raise SendError(ResponseCode.MESSAGE_ILLEGAL, "batch message does not support delay")
        if any(p in header.properties for p in TIMER_PROPERTIES):
            raise SendError(ResponseCode.MESSAGE_ILLEGAL, "batch message does not support timer message")
        # Every message plain: the records in C (send_native.batch_records);
        # else each message's record from wire-form parts when its
        # properties are plain (as _plain_record does for one message), the
        # others through a MessageRecord, as the general rules say.
        record, topic, store_host = M.MessageRecord, header.topic, self.cfg.store_host
        batch_sysflag = sysflag & ~(_NO_BATCH_FLAGS | M.COMPRESSED_FLAG)
        born_ts, reconsume = header.born_timestamp, header.reconsume_times
        topic_b, magic = _topic_wire(topic)
        born_b, born_v6 = _host_wire(born_host)
        store_b, store_v6 = _host_wire(store_host)
        wire_sysflag = M.host_flags(batch_sysflag, born_v6, store_v6)
        records = send_native.batch_records(body, topic_b, magic, queue_id, wire_sysflag, born_ts, reconsume, born_b,
                                            store_b, store_timestamp, self.cfg.broker_cluster_name.encode(),
                                            self.uniq_keys)
        if records is not None:
            return records, header.properties.get(M.PROPERTY_UNIQ_KEY)
        items = batches.decode_batch_raw(body)
        if not items:
            raise SendError(ResponseCode.MESSAGE_ILLEGAL, "empty batch")
        encode_parts, plain_properties = M.encode_parts, self._plain_properties
        records = []
        for item_body, flag, raw_props in items:
            try:
                plain = plain_properties(raw_props.decode("utf-8"))
            except UnicodeDecodeError:
                plain = None
            if plain is not None:
                records.append(encode_parts(
                    magic, topic_b, plain[0], item_body, queue_id=queue_id, flag=flag, sysflag=wire_sysflag,
                    born_timestamp=born_ts, born_host=born_b, store_timestamp=store_timestamp, store_host=store_b,
                    reconsume_times=reconsume))
                continue
            props, _ = self._properties(M.string_to_properties(raw_props.decode("utf-8", "replace")))
            records.append(M.encode(record(
                topic=topic, body=item_body, properties=props, queue_id=queue_id, flag=flag,
                sysflag=batch_sysflag, born_timestamp=born_ts, born_host=born_host,
                store_timestamp=store_timestamp, store_host=store_host, reconsume_times=reconsume)))
        return records, header.properties.get(M.PROPERTY_UNIQ_KEY)

    def _half_record(self, header: SendHeader, sysflag: int, queue_id: int, body: bytes,
                     born_host: M.HostAddr) -> tuple[list[bytes], str]:
        """A transactional half message (PREPARED): stored on
        RMQ_SYS_TRANS_HALF_TOPIC, never on its topic, until END_TRANSACTION
        commits it (broker/store/transaction.py owns the rewrite)."""
        props, uniq = self._properties(header.properties)
        rec = M.MessageRecord(
            topic=header.topic, body=body, properties=props, queue_id=queue_id, flag=header.flag, sysflag=sysflag,
            born_timestamp=header.born_timestamp, born_host=born_host, store_timestamp=self.clock_ms(),
            store_host=self.cfg.store_host, reconsume_times=header.reconsume_times)
        return [M.encode(to_half(rec))], uniq

    # --- replies --------------------------------------------------------------------

    def _stamped(self, placed, stamps=None) -> tuple[list[str], int]:
        """(offset msg ids, first queue offset) of stored records: the queue
        offset the append hook stamped, else read back from the log."""
        ids = offset_msg_ids(self.cfg.store_host, [pos + 48 for _, pos in placed])
        if stamps is not None and stamps[0] >= 0:
            return ids, stamps[0]
        return ids, _I64.unpack_from(self.store.get(placed[0][0]).body, M.POS_QUEUEOFFSET)[0]

    @staticmethod
    def _reply_fields(queue_id, ids, queue_offset, uniq) -> dict[str, str]:
        """SendMessageResponseHeader, as text."""
        fields = {"msgId": ",".join(ids), "queueId": str(queue_id), "queueOffset": str(queue_offset),
                  PROPERTY_MSG_REGION: DEFAULT_REGION, PROPERTY_TRACE_SWITCH: "true"}
        if uniq is not None:
            fields["transactionId"] = uniq
            handle = getattr(uniq, "recall_handle", None)  # a timer message's (broker/store/timer.py)
            if handle is not None:
                fields["recallHandle"] = handle
        return fields

    def _reply(self, request, code, queue_id, ids, queue_offset, uniq, remark=None) -> RemotingCommand:
        return request.make_response(code, remark, ext_fields=self._reply_fields(queue_id, ids, queue_offset, uniq))

    def success_frame(self, request, queue_id, placed, stamps, uniq) -> bytes:
        """The SUCCESS answer of stored records, encoded (every send is answered so)."""
        ids, queue_offset = self._stamped(placed, stamps)
        return encode_response(request, ResponseCode.SUCCESS, None,
                               self._reply_fields(queue_id, ids, queue_offset, uniq))

    def _timed_out_reply(self, request, exc: QuorumTimeoutError, records, first: int) -> RemotingCommand | None:
        """FLUSH_SLAVE_TIMEOUT with ids, if the log still holds exactly our
        records (offsets aside) at the entries the append was given (from
        index `first`)."""
        records = [bytes(r) for r in records]  # (the native path's are views)
        placed = []
        try:
            for index, rec in zip(range(first, first + len(records)), records):
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

    def refusal(self, request: RemotingCommand, exc: Exception, records=(), first_index: int = -1) -> RemotingCommand:
        """The one translation point from errors to response codes, shared
        by every write path (the burst path, retry.py, end_transaction.py)
        (`records` and `first_index`: where they were appended, if they were)."""
        if isinstance(exc, (SendError, RequestError)):
            code, remark = exc.code, exc.remark
        elif isinstance(exc, NotLeaderError):
            code, remark = ResponseCode.SERVICE_NOT_AVAILABLE, self.not_leader_remark(exc)
        elif isinstance(exc, PendingFullError):
            code, remark = ResponseCode.SYSTEM_BUSY, f"[PCBUSY_CLEAN_QUEUE]broker busy: {exc}"
        elif isinstance(exc, QuorumTimeoutError):
            if first_index < 0:  # one append of exactly these records: it ended at exc.index
                first_index = exc.index - len(records) + 1
            reply = self._timed_out_reply(request, exc, records, first_index) if records and first_index >= 0 \
                else None
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
        else:  # pragma: no cover - the send path catches only the types above
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


@attrs.frozen
class _Peer:
    """What a burst asks of its connection (the peer's address), for a
    send that did not come in one (process())."""

    remote_address: object


def _as_command(frame: bytes) -> RemotingCommand:
    """An answer the burst encoded, as the command process() returns."""
    decoder = CommandDecoder()
    decoder.receive_data(frame)
    return decoder.next_command()
