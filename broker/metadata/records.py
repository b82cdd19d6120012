# Owns the internal system topics that carry metadata changes through the
# replicated log, and the codec between a change (an "op") and the RocketMQ
# message record that carries it.
#
# Internal topics (the `rmq_sys_` prefix is RocketMQ's TopicValidator.isSystemTopic's, so stock tools
# treat them as system topics; ledgermq hides them from topic lists and refuses client sends to them:
# INTERNAL_TOPICS / is_internal_topic):
#   rmq_sys_LEDGERMQ_TOPIC_CONFIG        topic.upsert, topic.delete, broker.announce
#   rmq_sys_LEDGERMQ_SUBSCRIPTION_GROUP  group.upsert, group.delete
#   rmq_sys_LEDGERMQ_CONSUMER_OFFSET     offset.*, delay.offset, timer.done, mq.lock/unlock, pop.*
#
# Each op is one ordinary v1 message record (consumequeue/record.py), queue 0, TAGS = the op name, KEYS =
# the topic or group it is about (mqadmin's key query finds a topic's config history), body = UTF-8 JSON:
#   {"v":1,"op":"topic.upsert","topicConfig":{...as in topics.json...}}
#   {"v":1,"op":"topic.delete","topic":"T","cleanOffsets":true}
#   {"v":1,"op":"group.upsert","subscriptionGroupConfig":{...}}
#   {"v":1,"op":"group.delete","group":"G","cleanOffsets":true}
#   {"v":1,"op":"offset.commit","offsetTable":{"T@G":{"0":123,"1":7}}}   (many queues per record)
#   {"v":1,"op":"offset.reset","offsetTable":{"T@G":{"0":0}}}           (may move offsets back)
#   {"v":1,"op":"offset.delete","offsetKeys":["T@G"]}
#   {"v":1,"op":"delay.offset","offsetTable":{"3":17}}    (delay level -> next offset; only grows)
#   {"v":1,"op":"timer.done","offsets":[5,9],"batch":[5]}   (timer units delivered or recalled; "batch":
#       those whose delivered records follow this record in the same append, in order: timer.py)
#   {"v":1,"op":"broker.announce","selfId":"n1","brokerAddr":"127.0.0.1:10911"}   (a new leader)
#   {"v":1,"op":"mq.lock","group":"G","clientId":"C","mqs":[["T",0]],"maxLiveMs":60000}, "mq.unlock"
#       without maxLiveMs (orderly queue locks: who gets a contested queue is decided on apply)
#   pop.ck, pop.ack, pop.change, pop.revive   POP checkpoints (broker/metadata/pop.py)
#
# An op that does not decode (unknown op or version, wrong topic, bad field) raises MetadataRecordError;
# the applier stops on it rather than skip it (replicas of different versions would diverge).
import json

import attrs

from broker.common.values import InvalidMetadataError, TopicConfig, check_group_name, check_topic_name
from broker.metadata.pop import POP_OPS
from broker.metadata.tables import MetadataState, SubscriptionGroupConfig, split_offset_key
from consumequeue.record import LOCALHOST, PROPERTY_KEYS, PROPERTY_TAGS, HostAddr, MessageRecord, encode

TOPIC_CONFIG_TOPIC = "rmq_sys_LEDGERMQ_TOPIC_CONFIG"
SUBSCRIPTION_GROUP_TOPIC = "rmq_sys_LEDGERMQ_SUBSCRIPTION_GROUP"
CONSUMER_OFFSET_TOPIC = "rmq_sys_LEDGERMQ_CONSUMER_OFFSET"
INTERNAL_TOPICS = frozenset({TOPIC_CONFIG_TOPIC, SUBSCRIPTION_GROUP_TOPIC, CONSUMER_OFFSET_TOPIC})
FORMAT_VERSION = 1


def is_internal_topic(name: str) -> bool:
    """True for the metadata topics (hide them from topic lists, refuse
    client sends and topic updates)."""
    return name in INTERNAL_TOPICS


class MetadataRecordError(ValueError):
    """A record on an internal topic whose body is not a valid op."""


def _offset_table(obj) -> dict[str, dict[int, int]]:
    """Validate {"topic@group": {queueId: offset}} (queue ids as ints or as
    the strings JSON gives); raises InvalidMetadataError."""
    if not isinstance(obj, dict):
        raise InvalidMetadataError("offsetTable must be an object")
    out: dict[str, dict[int, int]] = {}
    for key, queues in obj.items():
        topic, group = split_offset_key(key)
        check_topic_name(topic)
        check_group_name(group)
        if not isinstance(queues, dict):
            raise InvalidMetadataError(f"offsets of {key!r} must be an object")
        table = {}
        for qid, offset in queues.items():
            try:
                if isinstance(qid, bool):
                    raise TypeError
                q = int(qid)
            except (TypeError, ValueError):
                raise InvalidMetadataError(f"queue id {qid!r} of {key!r} is not an int") from None
            if not 0 <= q < 1 << 31 or isinstance(offset, bool) or not isinstance(offset, int) \
                    or not 0 <= offset < 1 << 63:
                raise InvalidMetadataError(f"bad offset {offset!r} for {key!r} queue {qid}")
            table[q] = offset
        out[key] = table
    return out


def _is_bool(_inst, attr, value) -> None:
    if not isinstance(value, bool):
        raise InvalidMetadataError(f"{attr.name} must be a boolean, got {value!r}")


def _table_json(table: dict[str, dict[int, int]]) -> dict:
    return {key: {str(q): o for q, o in sorted(queues.items())} for key, queues in sorted(table.items())}


@attrs.frozen
class TopicUpsert:
    config: TopicConfig
    OP = "topic.upsert"
    TOPIC = TOPIC_CONFIG_TOPIC

    @property
    def subject(self) -> str:
        return self.config.topic_name

    def body(self) -> dict:
        return {"topicConfig": self.config.to_json()}

    @classmethod
    def from_body(cls, obj: dict) -> "TopicUpsert":
        return cls(TopicConfig.from_json(obj.get("topicConfig")))

    def apply_to(self, state: MetadataState, index: int, ts: int) -> None:
        state.topics.upsert(self.config, index, ts)


@attrs.frozen
class TopicDelete:
    topic: str = attrs.field(validator=lambda i, a, v: check_topic_name(v))
    clean_offsets: bool = attrs.field(default=True, validator=_is_bool)
    OP = "topic.delete"
    TOPIC = TOPIC_CONFIG_TOPIC

    @property
    def subject(self) -> str:
        return self.topic

    def body(self) -> dict:
        return {"topic": self.topic, "cleanOffsets": self.clean_offsets}

    @classmethod
    def from_body(cls, obj: dict) -> "TopicDelete":
        return cls(obj.get("topic"), obj.get("cleanOffsets", True))

    def apply_to(self, state: MetadataState, index: int, ts: int) -> None:
        state.topics.delete(self.topic, index, ts)
        if self.clean_offsets:
            state.offsets.delete_topic(self.topic, index, ts)


@attrs.frozen
class GroupUpsert:
    config: SubscriptionGroupConfig
    OP = "group.upsert"
    TOPIC = SUBSCRIPTION_GROUP_TOPIC

    @property
    def subject(self) -> str:
        return self.config.group_name

    def body(self) -> dict:
        return {"subscriptionGroupConfig": self.config.to_json()}

    @classmethod
    def from_body(cls, obj: dict) -> "GroupUpsert":
        return cls(SubscriptionGroupConfig.from_json(obj.get("subscriptionGroupConfig")))

    def apply_to(self, state: MetadataState, index: int, ts: int) -> None:
        state.groups.upsert(self.config, index, ts)


@attrs.frozen
class GroupDelete:
    group: str = attrs.field(validator=lambda i, a, v: check_group_name(v))
    clean_offsets: bool = attrs.field(default=True, validator=_is_bool)
    OP = "group.delete"
    TOPIC = SUBSCRIPTION_GROUP_TOPIC

    @property
    def subject(self) -> str:
        return self.group

    def body(self) -> dict:
        return {"group": self.group, "cleanOffsets": self.clean_offsets}

    @classmethod
    def from_body(cls, obj: dict) -> "GroupDelete":
        return cls(obj.get("group"), obj.get("cleanOffsets", True))

    def apply_to(self, state: MetadataState, index: int, ts: int) -> None:
        state.groups.delete(self.group, index, ts)
        if self.clean_offsets:
            state.offsets.delete_group(self.group, index, ts)


@attrs.frozen
class OffsetCommit:
    """Many (topic@group, queueId, offset) commits; offsets only grow."""

    table: dict = attrs.field(converter=_offset_table)
    OP = "offset.commit"
    TOPIC = CONSUMER_OFFSET_TOPIC
    subject = None

    def body(self) -> dict:
        return {"offsetTable": _table_json(self.table)}

    @classmethod
    def from_body(cls, obj: dict):
        return cls(obj.get("offsetTable"))

    def apply_to(self, state: MetadataState, index: int, ts: int) -> None:
        state.offsets.commit(self.table, index, ts)


@attrs.frozen
class OffsetReset(OffsetCommit):
    """Set queues to exactly these offsets (resetOffsetByTime, admin reset)."""

    OP = "offset.reset"

    def apply_to(self, state: MetadataState, index: int, ts: int) -> None:
        state.offsets.reset(self.table, index, ts)


def _keys(value) -> tuple:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(k, str) for k in value):
        raise InvalidMetadataError(f"offsetKeys must be a list of strings, got {value!r}")
    for k in value:
        split_offset_key(k)
    return tuple(value)


@attrs.frozen
class OffsetDelete:
    keys: tuple = attrs.field(converter=_keys)
    OP = "offset.delete"
    TOPIC = CONSUMER_OFFSET_TOPIC
    subject = None

    def body(self) -> dict:
        return {"offsetKeys": list(self.keys)}

    @classmethod
    def from_body(cls, obj: dict) -> "OffsetDelete":
        return cls(obj.get("offsetKeys") or ())

    def apply_to(self, state: MetadataState, index: int, ts: int) -> None:
        state.offsets.delete_keys(self.keys, index, ts)


def _level_table(obj) -> dict[int, int]:
    if not isinstance(obj, dict):
        raise InvalidMetadataError("delay offsetTable must be an object")
    out = {}
    for level, offset in obj.items():
        try:
            if isinstance(level, bool):
                raise TypeError
            lv = int(level)
        except (TypeError, ValueError):
            raise InvalidMetadataError(f"delay level {level!r} is not an int") from None
        if not 0 < lv < 1 << 31 or isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < 1 << 63:
            raise InvalidMetadataError(f"bad delay offset {offset!r} for level {level!r}")
        out[lv] = offset
    return out


@attrs.frozen
class DelayOffsetCommit:
    """The schedule service's progress: level -> next offset (only grows)."""

    table: dict = attrs.field(converter=_level_table)
    OP = "delay.offset"
    TOPIC = CONSUMER_OFFSET_TOPIC
    subject = None

    def body(self) -> dict:
        return {"offsetTable": {str(k): v for k, v in sorted(self.table.items())}}

    @classmethod
    def from_body(cls, obj: dict) -> "DelayOffsetCommit":
        return cls(obj.get("offsetTable"))

    def apply_to(self, state: MetadataState, index: int, ts: int) -> None:
        state.delay_offsets.commit(self.table, index, ts)


MAX_TIMER_OFFSETS = 100_000  # units per timer.done record (the service writes at most a batch)


def _timer_offsets(value) -> tuple:
    if not isinstance(value, (list, tuple)) or len(value) > MAX_TIMER_OFFSETS:
        raise InvalidMetadataError(f"timer offsets must be a list of at most {MAX_TIMER_OFFSETS}")
    for o in value:
        if isinstance(o, bool) or not isinstance(o, int) or not 0 <= o < 1 << 63:
            raise InvalidMetadataError(f"bad timer queue offset {o!r}")
    return tuple(value)


@attrs.frozen
class TimerDone:
    """Timer queue units delivered or recalled (broker/store/timer.py)."""

    offsets: tuple = attrs.field(converter=_timer_offsets)
    batch: tuple = attrs.field(default=(), converter=_timer_offsets)
    OP = "timer.done"
    TOPIC = CONSUMER_OFFSET_TOPIC
    subject = None

    def body(self) -> dict:
        return {"offsets": list(self.offsets), "batch": list(self.batch)}

    @classmethod
    def from_body(cls, obj: dict) -> "TimerDone":
        return cls(obj.get("offsets"), obj.get("batch", ()))

    def apply_to(self, state: MetadataState, index: int, ts: int) -> None:
        state.timer.mark(self.offsets, self.batch, index, ts)


def _nonempty_str(_inst, attr, value) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidMetadataError(f"{attr.name} must be a non-empty string, got {value!r}")


@attrs.frozen
class BrokerAnnounce:
    """A leader's broker address (brokerIP1:listenPort) under its selfId."""

    self_id: str = attrs.field(validator=_nonempty_str)
    broker_addr: str = attrs.field(validator=_nonempty_str)
    OP = "broker.announce"
    TOPIC = TOPIC_CONFIG_TOPIC

    @property
    def subject(self) -> str:
        return self.self_id

    def body(self) -> dict:
        return {"selfId": self.self_id, "brokerAddr": self.broker_addr}

    @classmethod
    def from_body(cls, obj: dict) -> "BrokerAnnounce":
        return cls(obj.get("selfId"), obj.get("brokerAddr"))

    def apply_to(self, state: MetadataState, index: int, ts: int) -> None:
        state.broker_addrs[self.self_id] = self.broker_addr


def _mqs(value) -> tuple:
    if not isinstance(value, (list, tuple)):
        raise InvalidMetadataError(f"mqs must be a list, got {value!r}")
    out = []
    for item in value:
        if not isinstance(item, (list, tuple)) or len(item) != 2 or isinstance(item[1], bool) \
                or not isinstance(item[1], int) or not 0 <= item[1] < 1 << 31:
            raise InvalidMetadataError(f"bad queue {item!r} (expected [topic, queueId])")
        out.append((check_topic_name(item[0]), item[1]))
    return tuple(out)


@attrs.frozen(kw_only=True)
class QueueLockBatch:
    """LOCK_BATCH_MQ: `client_id` asks for `mqs` of `group`."""

    group: str = attrs.field(validator=lambda i, a, v: check_group_name(v))
    client_id: str = attrs.field(validator=_nonempty_str)
    mqs: tuple = attrs.field(converter=_mqs)
    max_live_ms: int = 60000
    OP = "mq.lock"
    TOPIC = CONSUMER_OFFSET_TOPIC

    @property
    def subject(self) -> str:
        return self.group

    def body(self) -> dict:
        return {"group": self.group, "clientId": self.client_id, "mqs": [list(m) for m in self.mqs],
                "maxLiveMs": self.max_live_ms}

    @classmethod
    def from_body(cls, obj: dict) -> "QueueLockBatch":
        live = obj.get("maxLiveMs", 60000)
        if isinstance(live, bool) or not isinstance(live, int) or live <= 0:
            raise InvalidMetadataError(f"bad maxLiveMs {live!r}")
        return cls(group=obj.get("group"), client_id=obj.get("clientId"), mqs=obj.get("mqs"), max_live_ms=live)

    def apply_to(self, state: MetadataState, index: int, ts: int) -> None:
        state.locks.try_lock(self.group, self.client_id, self.mqs, ts, self.max_live_ms)


@attrs.frozen
class QueueUnlockBatch:
    group: str = attrs.field(validator=lambda i, a, v: check_group_name(v))
    client_id: str = attrs.field(validator=_nonempty_str)
    mqs: tuple = attrs.field(converter=_mqs)
    OP = "mq.unlock"
    TOPIC = CONSUMER_OFFSET_TOPIC

    @property
    def subject(self) -> str:
        return self.group

    def body(self) -> dict:
        return {"group": self.group, "clientId": self.client_id, "mqs": [list(m) for m in self.mqs]}

    @classmethod
    def from_body(cls, obj: dict) -> "QueueUnlockBatch":
        return cls(obj.get("group"), obj.get("clientId"), obj.get("mqs"))

    def apply_to(self, state: MetadataState, index: int, ts: int) -> None:
        state.locks.unlock(self.group, self.client_id, self.mqs)


OPS = {cls.OP: cls for cls in (TopicUpsert, TopicDelete, GroupUpsert, GroupDelete, OffsetCommit, OffsetReset,
                                OffsetDelete, DelayOffsetCommit, BrokerAnnounce, QueueLockBatch, QueueUnlockBatch,
                                TimerDone)}


OPS.update({cls.OP: cls for cls in POP_OPS})


def encode_op(op, *, timestamp_ms: int, host: HostAddr = LOCALHOST) -> bytes:
    """The message record bytes that carry `op` (born and store timestamps
    = timestamp_ms; the leader's append hook fills in the offsets)."""
    body = {"v": FORMAT_VERSION, "op": op.OP, **op.body()}
    props = {PROPERTY_TAGS: op.OP}
    if op.subject:
        props[PROPERTY_KEYS] = op.subject
    rec = MessageRecord(topic=op.TOPIC, body=json.dumps(body, sort_keys=True, separators=(",", ":")).encode(),
                        properties=props, born_timestamp=timestamp_ms, store_timestamp=timestamp_ms,
                        born_host=host, store_host=host)
    return encode(rec)


def parse_op(topic: str, body: bytes):
    """The op carried by a record of internal topic `topic`."""
    try:
        obj = json.loads(bytes(body).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MetadataRecordError(f"{topic}: body is not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise MetadataRecordError(f"{topic}: body is not a JSON object")
    if obj.get("v") != FORMAT_VERSION:
        raise MetadataRecordError(f"{topic}: unsupported format version {obj.get('v')!r}")
    cls = OPS.get(obj.get("op"))
    if cls is None:
        raise MetadataRecordError(f"{topic}: unknown op {obj.get('op')!r}")
    if cls.TOPIC != topic:
        raise MetadataRecordError(f"{topic}: op {cls.OP} belongs on {cls.TOPIC}")
    try:
        return cls.from_body(obj)
    except (InvalidMetadataError, TypeError) as exc:
        raise MetadataRecordError(f"{topic}: {cls.OP}: {exc}") from None


def decode_op(rec: MessageRecord):
    return parse_op(rec.topic, rec.body)


def merge_offsets(into: dict[str, dict[int, int]], table: dict[str, dict[int, int]]) -> None:
    """Coalesce commits: keep the highest offset per queue."""
    for key, queues in table.items():
        current = into.setdefault(key, {})
        for qid, offset in queues.items():
            if offset > current.get(qid, -1):
                current[qid] = offset

