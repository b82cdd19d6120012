# Owns the translation between a gRPC apache.rocketmq.v2.Message and what
# remoting carries, as RocketMQ's proxy does it (spec §8.9):
#   message_id          <-> UNIQ_KEY
#   tag / keys          <-> TAGS / KEYS (space-separated)
#   message_group       <-> __SHARDINGKEY
#   delivery_timestamp  <-> TIMER_DELIVER_MS (absolute ms)
#   transaction         ->  TRAN_MSG=true, PGROUP=<topic> (RocketMQ's proxy uses the topic as producer group)
#   user_properties     <-> the other properties (a system name is refused)
# and the checks a SendMessage entry must pass before it is relayed, each a
# typed RequestInvalid with the Code RocketMQ's proxy answers.  A stored
# record becomes a gRPC Message with its body decompressed (IDENTITY) and
# body_digest the MD5 in uppercase hex, which the Python client checks.
import base64
import binascii
import hashlib
import time
import zlib

import attrs

from broker.common.values import InvalidMetadataError, check_topic_name
from broker.proxy import pb
from consumequeue import record as M

PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
MAX_DELAY_MS = 3 * 24 * 3600 * 1000  # timerMaxDelaySec: 3 days
MAX_PROPERTIES_BYTES = 16 * 1024  # RocketMQ's proxy: maxUserPropertySize 16 KiB
MAX_MESSAGE_GROUP = 64
# Names a user property may not take: the ones remoting gives a meaning.
SYSTEM_PROPERTIES = frozenset({
    M.PROPERTY_TAGS, M.PROPERTY_KEYS, M.PROPERTY_UNIQ_KEY, M.PROPERTY_DELAY, "WAIT", PROPERTY_SHARDING_KEY,
    PROPERTY_TIMER_DELIVER_MS, "TIMER_DELAY_SEC", "TIMER_DELAY_MS", PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_PRODUCER_GROUP, PROPERTY_REAL_TOPIC, "REAL_QID", "RETRY_TOPIC", "MIN_OFFSET", "MAX_OFFSET",
    "POP_CK", "CLUSTER", "MSG_REGION", "TRACE_ON", PROPERTY_RECONSUME_TIME, "MAX_RECONSUME_TIMES",
    "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG", "CORRECTION_FLAG", "INNER_NUM", "INNER_MULTI_QUEUE_OFFSET",
    "TRANSACTION_CHECK_TIMES", "CHECK_IMMUNITY_TIME_IN_SECONDS", "INSTANCE_ID", "SHARDING_KEY"})
_ACCEPTED_TYPES = {pb.MessageType.NORMAL, pb.MessageType.FIFO, pb.MessageType.DELAY, pb.MessageType.TRANSACTION,
                   pb.MessageType.MESSAGE_TYPE_UNSPECIFIED}


class RequestInvalid(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@attrs.frozen(kw_only=True)
class Outgoing:
    """One SendMessage entry, checked, as the proxy relays it."""

    topic: str
    body: bytes
    message_id: str
    tag: str | None
    keys: tuple[str, ...]
    user_properties: dict
    extra_properties: dict
    message_group: str | None
    transactional: bool
    deliver_ms: int | None = None


def check_topic(name: str) -> str:
    try:
        check_topic_name(name)
    except InvalidMetadataError as e:
        raise RequestInvalid(pb.Code.ILLEGAL_TOPIC, f"topic name {name[:300]!r} is illegal: {e}") from None
    return name


def outgoing(msg, max_body_size: int, now_ms: int | None = None) -> Outgoing:
    """The checks of SendMessageActivity, in its order; RequestInvalid names
    the first one that fails."""
    topic_name = check_topic(msg.topic.name)
    sp = msg.system_properties
    if not sp.message_id:
        raise RequestInvalid(pb.Code.ILLEGAL_MESSAGE_ID, "message id cannot be empty")
    if len(sp.message_id) > 128:
        raise RequestInvalid(pb.Code.ILLEGAL_MESSAGE_ID, "message id is too long")
    if not msg.body:
        raise RequestInvalid(pb.Code.MESSAGE_BODY_EMPTY, "message body cannot be empty")
    if len(msg.body) > max_body_size:
        raise RequestInvalid(pb.Code.MESSAGE_BODY_TOO_LARGE,
                             f"message body cannot exceed the max {max_body_size} bytes ({len(msg.body)})")
    tag = sp.tag if sp.HasField("tag") else None
    if tag is not None and (not tag.strip() or "|" in tag or any(c in tag for c in "\x01\x02\n")):
        raise RequestInvalid(pb.Code.ILLEGAL_MESSAGE_TAG, f"tag {tag[:64]!r} is illegal")
    for key in sp.keys:
        if not key.strip() or any(c in key for c in "\x01\x02"):
            raise RequestInvalid(pb.Code.ILLEGAL_MESSAGE_KEY, f"key {key[:64]!r} is illegal")
    size = 0
    for name, value in msg.user_properties.items():
        if not name or name in SYSTEM_PROPERTIES or any(c in name + value for c in "\x01\x02"):
            raise RequestInvalid(pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property {name[:64]!r} is reserved or illegal")
        size += len(name.encode()) + len(value.encode())
    if size > MAX_PROPERTIES_BYTES:
        raise RequestInvalid(pb.Code.MESSAGE_PROPERTIES_TOO_LARGE,
                             f"user properties are {size} bytes, over the {MAX_PROPERTIES_BYTES} limit")
    mtype = sp.message_type
    group = sp.message_group if sp.HasField("message_group") else None
    delivery = sp.delivery_timestamp if sp.HasField("delivery_timestamp") else None
    if mtype not in _ACCEPTED_TYPES:
        raise RequestInvalid(pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                             f"message type {pb.MessageType.Name(mtype)} is not accepted by topic {topic_name}")
    if mtype == pb.MessageType.MESSAGE_TYPE_UNSPECIFIED:  # older clients: the type follows from the fields
        mtype = pb.MessageType.FIFO if group else pb.MessageType.DELAY if delivery else pb.MessageType.NORMAL
    conflict = {pb.MessageType.NORMAL: group or delivery, pb.MessageType.FIFO: not group or delivery,
                pb.MessageType.DELAY: not delivery or group, pb.MessageType.TRANSACTION: group or delivery}[mtype]
    if conflict:
        raise RequestInvalid(pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                             f"the message's properties conflict with its type {pb.MessageType.Name(mtype)}")
    extra: dict[str, str] = {}
    if group is not None:
        if not group.strip() or len(group) > MAX_MESSAGE_GROUP or any(c in group for c in "\x01\x02"):
            raise RequestInvalid(pb.Code.ILLEGAL_MESSAGE_GROUP, f"message group {group[:64]!r} is illegal")
        extra[PROPERTY_SHARDING_KEY] = group
    if delivery is not None:
        at = delivery.seconds * 1000 + delivery.nanos // 1_000_000
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        if at - now_ms > MAX_DELAY_MS:
            raise RequestInvalid(pb.Code.ILLEGAL_DELIVERY_TIME,
                                 f"delivery timestamp is more than {MAX_DELAY_MS // 1000} s ahead")
        extra[PROPERTY_TIMER_DELIVER_MS] = str(max(at, 0))
    transactional = mtype == pb.MessageType.TRANSACTION
    if transactional:
        extra[PROPERTY_TRANSACTION_PREPARED] = "true"
        extra[PROPERTY_PRODUCER_GROUP] = topic_name
    deliver_ms = int(extra[PROPERTY_TIMER_DELIVER_MS]) if PROPERTY_TIMER_DELIVER_MS in extra else None
    return Outgoing(topic=topic_name, body=bytes(msg.body), message_id=sp.message_id, tag=tag, keys=tuple(sp.keys),
                    user_properties=dict(msg.user_properties), extra_properties=extra,
                    message_group=group, transactional=transactional, deliver_ms=deliver_ms)


def recall_handle(topic: str, broker_name: str, deliver_ms: int, message_id: str) -> str:
    """RocketMQ's RecallMessageHandle v1: base64url of "v1 topic brokerName
    timestamp messageId" (what the broker's RECALL_MESSAGE decodes)."""
    raw = " ".join(("v1", topic, broker_name, str(deliver_ms), message_id))
    return base64.urlsafe_b64encode(raw.encode()).decode("ascii")


def recall_broker(handle: str) -> str:
    """The broker a recall handle names; RequestInvalid if it is not one."""
    try:
        if not handle or len(handle) > 1024:
            raise ValueError
        items = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)).decode("utf-8").split(" ")
        if items[0] != "v1" or len(items) < 5 or not items[2]:
            raise ValueError
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise RequestInvalid(pb.Code.BAD_REQUEST, "recall handle is invalid") from None
    return items[2]


def _host(addr: M.HostAddr) -> str:
    return f"{addr.ip}:{addr.port}"


def to_grpc_message(record: M.MessageRecord, *, topic: str | None = None, queue_id: int | None = None,
                    receipt_handle: str | None = None, invisible_ms: int | None = None):
    """A stored record as the clients receive it."""
    props = dict(record.properties)
    body = record.body
    if record.sysflag & M.COMPRESSED_FLAG:
        body = zlib.decompress(body)
    msg = pb.definition.Message()
    msg.topic.name = topic or props.get(PROPERTY_REAL_TOPIC) or record.topic
    msg.body = body
    sp = msg.system_properties
    if props.get(M.PROPERTY_TAGS):
        sp.tag = props[M.PROPERTY_TAGS]
    sp.keys.extend(k for k in props.get(M.PROPERTY_KEYS, "").split(M.KEY_SEPARATOR) if k)
    sp.message_id = props.get(M.PROPERTY_UNIQ_KEY) or ""
    sp.body_digest.type = pb.definition.DigestType.MD5
    sp.body_digest.checksum = hashlib.md5(body).hexdigest().upper()
    sp.body_encoding = pb.definition.Encoding.IDENTITY
    group = props.get(PROPERTY_SHARDING_KEY)
    deliver = props.get(PROPERTY_TIMER_DELIVER_MS)
    if props.get(PROPERTY_TRANSACTION_PREPARED) == "true":
        sp.message_type = pb.MessageType.TRANSACTION
    elif group:
        sp.message_type = pb.MessageType.FIFO
        sp.message_group = group
    elif deliver and deliver.isdigit():
        sp.message_type = pb.MessageType.DELAY
        sp.delivery_timestamp.FromMilliseconds(int(deliver))
    else:
        sp.message_type = pb.MessageType.NORMAL
    sp.born_timestamp.FromMilliseconds(record.born_timestamp)
    sp.born_host = _host(record.born_host)
    sp.store_timestamp.FromMilliseconds(record.store_timestamp)
    sp.store_host = _host(record.store_host)
    sp.queue_id = record.queue_id if queue_id is None else queue_id
    sp.queue_offset = record.queue_offset
    sp.delivery_attempt = record.reconsume_times + 1
    if receipt_handle is not None:
        sp.receipt_handle = receipt_handle
    if invisible_ms is not None:
        sp.invisible_duration.FromMilliseconds(invisible_ms)
    for name, value in props.items():
        if name not in SYSTEM_PROPERTIES:
            msg.user_properties[name] = value
    return msg
