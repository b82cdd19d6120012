# Owns the value types the name server, the broker and the client share, in
# their RocketMQ JSON shapes (camelCase field names as fastjson writes them):
# TopicConfig (org.apache.rocketmq.common.TopicConfig), DataVersion, the
# topic/group name rules (TopicValidator), and the HeartbeatData enums
# (ConsumeType, MessageModel, ConsumeFromWhere).  One definition each; a
# value that arrives over the wire from a stock broker or client is read
# with the same class the broker writes it with.
import enum
import re

import attrs

from broker.common.permissions import PERM_READ, PERM_WRITE

FILTER_TYPES = ("SINGLE_TAG", "MULTI_TAG")
_VALID_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")  # TopicValidator.VALID_PATTERN_STR
TOPIC_MAX_LENGTH = 127
RETRY_DLQ_TOPIC_MAX_LENGTH = 255
GROUP_MAX_LENGTH = 255
_INT32 = (-(1 << 31), (1 << 31) - 1)


class InvalidMetadataError(ValueError):
    """A topic config, group config or offset that the tables refuse."""


def check_topic_name(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidMetadataError("topic name is empty")
    limit = RETRY_DLQ_TOPIC_MAX_LENGTH if name.startswith(("%RETRY%", "%DLQ%")) else TOPIC_MAX_LENGTH
    if len(name) > limit:
        raise InvalidMetadataError(f"topic name longer than {limit} characters: {name[:40]!r}...")
    if not _VALID_NAME.match(name):
        raise InvalidMetadataError(f"topic name {name!r} has characters outside [%|a-zA-Z0-9_-]")
    return name


def check_group_name(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidMetadataError("group name is empty")
    if len(name) > GROUP_MAX_LENGTH:
        raise InvalidMetadataError(f"group name longer than {GROUP_MAX_LENGTH} characters")
    if not _VALID_NAME.match(name):
        raise InvalidMetadataError(f"group name {name!r} has characters outside [%|a-zA-Z0-9_-]")
    return name


def _shown(value: object) -> str:
    """A value from a JSON body, for an error message: bounded."""
    text = repr(value) if type(value) is not list and type(value) is not dict else \
        f"a JSON {'array' if type(value) is list else 'object'} of {len(value)}"
    return text if len(text) <= 64 else text[:64] + "..."


def check_int32(_inst, attr, value):
    if isinstance(value, bool) or not isinstance(value, int) or not _INT32[0] <= value <= _INT32[1]:
        raise InvalidMetadataError(f"{attr.name} must be a 32-bit int, got {_shown(value)}")


def check_nonneg32(inst, attr, value):
    check_int32(inst, attr, value)
    if value < 0:
        raise InvalidMetadataError(f"{attr.name} must not be negative, got {value}")


def check_bool(_inst, attr, value):
    if not isinstance(value, bool):
        raise InvalidMetadataError(f"{attr.name} must be a boolean, got {_shown(value)}")


def string_map(value) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise InvalidMetadataError(f"attributes must map strings to strings, got {_shown(value)}")
    return dict(sorted(value.items()))


def sorted_extra(value) -> dict:
    return dict(sorted((value or {}).items()))


def from_camel_json(cls, fields: dict[str, str], obj: dict):
    """Build cls from a JSON object: known camelCase fields by name, the rest
    kept in `extra` (so fields of newer RocketMQ versions survive a
    round trip through ledgermq)."""
    if not isinstance(obj, dict):
        raise InvalidMetadataError(f"expected a JSON object, got {type(obj).__name__}")
    kw, extra = {}, {}
    for key, value in obj.items():
        if key in fields:
            kw[fields[key]] = value
        else:
            extra[key] = value
    try:
        return cls(**kw, extra=extra)
    except TypeError as exc:
        raise InvalidMetadataError(str(exc)) from None


def to_camel_json(inst, fields: dict[str, str]) -> dict:
    out = dict(inst.extra)
    for json_name, py_name in fields.items():
        out[json_name] = getattr(inst, py_name)
    return out


# The values hold dicts (attributes, extra): they compare by value but are
# not hashable.
@attrs.frozen
class TopicConfig:
    """org.apache.rocketmq.common.TopicConfig."""

    topic_name: str = attrs.field(validator=lambda i, a, v: check_topic_name(v))
    read_queue_nums: int = attrs.field(default=16, validator=check_nonneg32)
    write_queue_nums: int = attrs.field(default=16, validator=check_nonneg32)
    perm: int = attrs.field(default=PERM_READ | PERM_WRITE)
    topic_filter_type: str = attrs.field(default="SINGLE_TAG")
    topic_sys_flag: int = attrs.field(default=0, validator=check_int32)
    order: bool = attrs.field(default=False, validator=check_bool)
    attributes: dict = attrs.field(factory=dict, converter=string_map)
    extra: dict = attrs.field(factory=dict, converter=sorted_extra, repr=False)

    @perm.validator
    def _perm(self, _attr, value):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 15:
            raise InvalidMetadataError(f"perm must be a combination of PRIORITY 8 | READ 4 | WRITE 2 | "
                                       f"INHERIT 1, got {_shown(value)}")

    @topic_filter_type.validator
    def _filter(self, _attr, value):
        if value not in FILTER_TYPES:
            raise InvalidMetadataError(f"topicFilterType must be one of {FILTER_TYPES}, got {_shown(value)}")

    _FIELDS = {"topicName": "topic_name", "readQueueNums": "read_queue_nums",
               "writeQueueNums": "write_queue_nums", "perm": "perm", "topicFilterType": "topic_filter_type",
               "topicSysFlag": "topic_sys_flag", "order": "order", "attributes": "attributes"}

    @classmethod
    def from_json(cls, obj: dict, name: str | None = None) -> "TopicConfig":
        """From topics.json / a registration body; `name` (the table key)
        fills a missing topicName."""
        if name is not None and isinstance(obj, dict) and "topicName" not in obj:
            obj = {**obj, "topicName": name}
        return from_camel_json(cls, cls._FIELDS, obj)

    def to_json(self) -> dict:
        return to_camel_json(self, self._FIELDS)


@attrs.frozen
class DataVersion:
    """RocketMQ's DataVersion.  counter = log index of the last change."""

    counter: int = 0
    state_version: int = 0
    timestamp: int = 0

    def to_json(self) -> dict:
        return {"counter": self.counter, "stateVersion": self.state_version, "timestamp": self.timestamp}

    @classmethod
    def from_json(cls, obj) -> "DataVersion":
        if not isinstance(obj, dict):
            return cls()
        return cls(int(obj.get("counter", 0)), int(obj.get("stateVersion", 0)), int(obj.get("timestamp", 0)))




# --- HeartbeatData enums (sent by name or by ordinal, client-compat #5) --------

class ConsumeType(enum.Enum):
    CONSUME_ACTIVELY = 0
    CONSUME_PASSIVELY = 1
    CONSUME_POP = 2


class MessageModel(enum.Enum):
    BROADCASTING = 0
    CLUSTERING = 1


class ConsumeFromWhere(enum.Enum):
    """Where a consumer group with no committed offset starts (the values
    are Java's ordinals; the wire carries the name)."""

    CONSUME_FROM_LAST_OFFSET = 0
    CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST = 1
    CONSUME_FROM_MIN_OFFSET = 2
    CONSUME_FROM_MAX_OFFSET = 3
    CONSUME_FROM_FIRST_OFFSET = 4
    CONSUME_FROM_TIMESTAMP = 5
