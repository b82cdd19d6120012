# Owns the client library's values: Message (what a producer sends),
# MessageExt (what a consumer receives: a decoded commitlog record plus where
# it came from), MessageQueue, SendResult/SendStatus, PullResult/PullStatus,
# ConsumeStatus, ConsumeFromWhere, and the tag filter both consumers apply.
#
# Records are decoded by consumequeue/record.py (the same codec the broker
# stores with); MessageExt wraps the decoded record instead of copying its
# fields, so the per-message work on the consume path is one decode.
import enum
import zlib

import attrs

from broker.client.errors import InvalidArgumentError, InvalidMessageError
from broker.common.msgid import offset_msg_id
from broker.common.subscription import SQL92, TAG, Subscription, SubscriptionError, parse_subscription
from broker.common.values import InvalidMetadataError, check_topic_name
from consumequeue import record as M

PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_MIN_OFFSET = "MIN_OFFSET"
PROPERTY_MAX_OFFSET = "MAX_OFFSET"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024  # DefaultMQProducer.maxMessageSize
# Properties the library sets itself; user properties may not use them.
RESERVED_PROPERTIES = frozenset({M.PROPERTY_TAGS, M.PROPERTY_KEYS, M.PROPERTY_UNIQ_KEY, PROPERTY_WAIT_STORE_MSG_OK,
                                 M.PROPERTY_DELAY})


_CHECKED_TOPICS: set = set()  # topic names check_topic_name() accepted


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def _keys(value) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(k for k in value.split(M.KEY_SEPARATOR) if k)
    return tuple(str(k) for k in value)


@attrs.frozen
class Message:
    """A message to send.  `keys` are index keys (QUERY_MESSAGE finds the
    message by each); `properties` are user properties; `delay_level` n > 0
    delivers it after the broker's n-th messageDelayLevel (1 s, 5 s, 10 s,
    30 s, 1 min, ...); `deliver_at_ms` (epoch ms) delivers it at that time
    (a timer message, TIMER_DELIVER_MS: its SendResult carries the
    recall_handle Producer.recall takes)."""

    topic: str
    body: bytes = attrs.field(converter=bytes)
    tags: str | None = None
    keys: tuple[str, ...] = attrs.field(default=(), converter=_keys)
    properties: dict = attrs.field(factory=dict, converter=dict)
    flag: int = 0
    wait_store_msg_ok: bool = True
    delay_level: int = 0
    deliver_at_ms: int | None = None

    def check(self, max_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> None:
        """Validators.checkMessage: raises InvalidMessageError."""
        if type(self.topic) is not str or self.topic not in _CHECKED_TOPICS:  # (few topics, many sends each)
            try:
                check_topic_name(self.topic)
            except InvalidMetadataError as e:
                raise InvalidMessageError(str(e)) from None
            if len(_CHECKED_TOPICS) > 4096:
                _CHECKED_TOPICS.clear()
            _CHECKED_TOPICS.add(self.topic)
        if not self.body:
            raise InvalidMessageError("the message body is empty")
        if len(self.body) > max_size:
            raise InvalidMessageError(f"the message body is {len(self.body)} bytes, over the {max_size} limit")
        if isinstance(self.delay_level, bool) or not isinstance(self.delay_level, int) or self.delay_level < 0:
            raise InvalidMessageError(f"delay_level must be an int >= 0, not {self.delay_level!r}")
        if self.deliver_at_ms is not None and (isinstance(self.deliver_at_ms, bool)
                                               or not isinstance(self.deliver_at_ms, int) or self.deliver_at_ms < 0):
            raise InvalidMessageError(f"deliver_at_ms must be an int >= 0 (epoch ms), not {self.deliver_at_ms!r}")
        for name in self.properties:
            if name in RESERVED_PROPERTIES:
                raise InvalidMessageError(f"property {name!r} is reserved; use the Message field instead")

    def wire_properties(self, uniq_key: str | None) -> dict:
        """The properties as they travel (user ones plus TAGS/KEYS/WAIT/UNIQ_KEY)."""
        props = {str(k): str(v) for k, v in self.properties.items()}
        if self.tags:
            props[M.PROPERTY_TAGS] = self.tags
        if self.keys:
            props[M.PROPERTY_KEYS] = M.KEY_SEPARATOR.join(self.keys)
        if self.delay_level:
            props[M.PROPERTY_DELAY] = str(self.delay_level)
        if self.deliver_at_ms is not None:
            props[PROPERTY_TIMER_DELIVER_MS] = str(self.deliver_at_ms)
        if not self.wait_store_msg_ok:
            props[PROPERTY_WAIT_STORE_MSG_OK] = "false"
        if uniq_key:
            props[M.PROPERTY_UNIQ_KEY] = uniq_key
        return props


@attrs.frozen(order=True)
class MessageQueue:
    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}/{self.queue_id}"


@attrs.frozen
class MessageExt:
    """A received message: the stored record plus the queue it came from."""

    record: M.MessageRecord = attrs.field(repr=False)
    queue: MessageQueue
    body: bytes = attrs.field(repr=lambda b: f"<{len(b)} bytes>")

    @classmethod
    def from_record(cls, record: M.MessageRecord, queue: MessageQueue) -> "MessageExt":
        body = record.body
        if record.sysflag & M.COMPRESSED_FLAG:  # a Java producer compressed it (zlib)
            try:
                body = zlib.decompress(body)
            except zlib.error:
                pass  # hand over what is stored rather than lose the message
        return cls(record, queue, body)

    @property
    def topic(self) -> str:
        """The original topic (a message redelivered through %RETRY%<group>
        shows the topic it was first sent to, as Java's client does)."""
        return self.record.properties.get(PROPERTY_RETRY_TOPIC) or self.record.topic

    @property
    def tags(self) -> str | None:
        return self.record.tags

    @property
    def keys(self) -> list[str]:
        return self.record.keys

    @property
    def properties(self) -> dict:
        return self.record.properties

    @property
    def msg_id(self) -> str:
        """The unique key the producer set (Java's getMsgId), else offsetMsgId."""
        return self.record.uniq_key or self.offset_msg_id

    @property
    def offset_msg_id(self) -> str:
        return offset_msg_id(self.record.store_host, self.record.physical_offset)

    @property
    def queue_id(self) -> int:
        return self.record.queue_id

    @property
    def queue_offset(self) -> int:
        return self.record.queue_offset

    @property
    def commitlog_offset(self) -> int:
        return self.record.physical_offset

    @property
    def reconsume_times(self) -> int:
        return self.record.reconsume_times

    @property
    def born_timestamp(self) -> int:
        return self.record.born_timestamp

    @property
    def store_timestamp(self) -> int:
        return self.record.store_timestamp

    @property
    def born_host(self) -> str:
        return str(self.record.born_host)

    @property
    def store_host(self) -> str:
        return str(self.record.store_host)

    @property
    def flag(self) -> int:
        return self.record.flag

    @property
    def sysflag(self) -> int:
        return self.record.sysflag


def decode_records(body: bytes, queue: MessageQueue) -> list[MessageExt]:
    """A PULL_MESSAGE body (stored records back to back) to MessageExts."""
    out, off, n = [], 0, len(body)
    view = memoryview(body)
    while off < n:
        try:
            record = M.decode(view, off)
        except M.MessageFormatError as e:
            raise InvalidMessageError(f"undecodable record in pull response from {queue}: {e}") from None
        out.append(MessageExt.from_record(record, queue))
        off += M.I32.unpack_from(body, off)[0]
    return out


class SendStatus(enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@attrs.frozen(kw_only=True)
class SendResult:
    status: SendStatus
    msg_id: str  # the unique key (UNIQ_KEY), what consumers see as msg_id
    offset_msg_id: str  # storeHost + commitlog offset (VIEW_MESSAGE_BY_ID)
    queue: MessageQueue
    queue_offset: int
    region_id: str | None = None
    recall_handle: str | None = None  # a timer message's: what Producer.recall takes


_SEND_RESULT_SETTERS = tuple(SendResult.__dict__[f.name].__set__ for f in attrs.fields(SendResult))


def send_result(status: SendStatus, msg_id: str, offset_msg_id: str, queue: MessageQueue, queue_offset: int,
                region_id: str | None, recall_handle: str | None = None) -> SendResult:
    """SendResult(...) without the frozen class's per-field __setattr__
    (a SendResult per send: the slots' own setters cost a third)."""
    r = object.__new__(SendResult)
    s = _SEND_RESULT_SETTERS
    s[0](r, status)
    s[1](r, msg_id)
    s[2](r, offset_msg_id)
    s[3](r, queue)
    s[4](r, queue_offset)
    s[5](r, region_id)
    s[6](r, recall_handle)
    return r


class ConsumeStatus(enum.Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


@attrs.frozen(kw_only=True)
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt] = attrs.field(factory=list)
    suggest_broker_id: int = 0


@attrs.frozen
class MessageSelector:
    """What a consumer subscribes with (Java's MessageSelector): a tag
    expression, or a SQL92 expression over the message's properties, which
    the broker evaluates (it needs enablePropertyFilter=true)."""

    expression_type: str
    expression: str

    @classmethod
    def by_tag(cls, expression: str = "*") -> "MessageSelector":
        return cls(TAG, expression)

    @classmethod
    def by_sql(cls, expression: str) -> "MessageSelector":
        return cls(SQL92, expression)


def subscription(expression: "str | MessageSelector | None") -> Subscription:
    """`TagA || TagB` / `*` parsed as the broker parses it (the same
    String.hashCode tag codes), or a MessageSelector (by_sql is compiled
    here too, so a typo fails before anything is sent); InvalidArgumentError
    for what it refuses."""
    etype = TAG
    if isinstance(expression, MessageSelector):
        etype, expression = expression.expression_type, expression.expression
    try:
        return parse_subscription(expression, expression_type=etype)
    except SubscriptionError as e:
        raise InvalidArgumentError(f"subscription {expression!r}: {e.remark}") from None


def filter_by_tags(messages: list[MessageExt], sub: Subscription) -> list[MessageExt]:
    """The broker filters by tag hash code; equal hashes of different tags
    pass it, so the client keeps only messages whose tag is subscribed
    (PullAPIWrapper.processPullResult).  SQL92 was evaluated on the broker
    over the whole properties: nothing is left to check."""
    if sub.is_all or sub.is_sql:
        return messages
    return [m for m in messages if m.tags is not None and m.tags in sub.tags]
