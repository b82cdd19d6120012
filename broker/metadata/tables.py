# Owns the broker's metadata tables as pure, deterministic state machines:
# TopicConfigTable (RocketMQ's TopicConfigManager), SubscriptionGroupTable
# (SubscriptionGroupManager) and ConsumerOffsetTable (ConsumerOffsetManager),
# plus SubscriptionGroupConfig (TopicConfig and DataVersion are shared with
# the name server and the client: broker.common.values).
#
# Tables change only through apply(op, index, timestamp) with an op decoded
# from a committed log record (broker/metadata/records.py).  Every op is a
# per-key overwrite, a per-queue max (offset commits) or a per-key removal,
# and each table's dataVersion.counter is the log index of the last op that
# changed it.  Consequence, relied on by snapshots: replaying any suffix of
# the log that starts at or before a state's true position reproduces the
# same final state (replay is idempotent), so a snapshot whose three files
# were taken at different indexes is repaired by replaying from the oldest.
#
# Offsets never move backward through a commit; only an explicit reset op
# (resetOffsetByTime, mqadmin resetOffset) can lower them.
import bisect

import attrs

from broker.common.values import (
    DataVersion,
    InvalidMetadataError,
    TopicConfig,
    check_bool,
    check_group_name,
    check_int32,
    check_nonneg32,
    from_camel_json,
    sorted_extra,
    string_map,
    to_camel_json,
)
from broker.metadata.pop import PopTable

PERM_PRIORITY, PERM_READ, PERM_WRITE, PERM_INHERIT = 8, 4, 2, 1
TOPIC_GROUP_SEPARATOR = "@"


@attrs.frozen
class SubscriptionGroupConfig:
    """org.apache.rocketmq.remoting.protocol.subscription.SubscriptionGroupConfig
    (the scalar fields; 5.x objects such as groupRetryPolicy ride in `extra`)."""

    group_name: str = attrs.field(validator=lambda i, a, v: check_group_name(v))
    consume_enable: bool = attrs.field(default=True, validator=check_bool)
    consume_from_min_enable: bool = attrs.field(default=True, validator=check_bool)
    consume_broadcast_enable: bool = attrs.field(default=True, validator=check_bool)
    consume_message_orderly: bool = attrs.field(default=False, validator=check_bool)
    retry_queue_nums: int = attrs.field(default=1, validator=check_nonneg32)
    retry_max_times: int = attrs.field(default=16, validator=check_int32)
    broker_id: int = attrs.field(default=0, validator=check_nonneg32)
    which_broker_when_consume_slowly: int = attrs.field(default=1, validator=check_nonneg32)
    notify_consumer_ids_changed_enable: bool = attrs.field(default=True, validator=check_bool)
    group_sys_flag: int = attrs.field(default=0, validator=check_int32)
    consume_timeout_minute: int = attrs.field(default=15, validator=check_int32)
    attributes: dict = attrs.field(factory=dict, converter=string_map)
    extra: dict = attrs.field(factory=dict, converter=sorted_extra, repr=False)

    _FIELDS = {"groupName": "group_name", "consumeEnable": "consume_enable",
               "consumeFromMinEnable": "consume_from_min_enable",
               "consumeBroadcastEnable": "consume_broadcast_enable",
               "consumeMessageOrderly": "consume_message_orderly", "retryQueueNums": "retry_queue_nums",
               "retryMaxTimes": "retry_max_times", "brokerId": "broker_id",
               "whichBrokerWhenConsumeSlowly": "which_broker_when_consume_slowly",
               "notifyConsumerIdsChangedEnable": "notify_consumer_ids_changed_enable",
               "groupSysFlag": "group_sys_flag", "consumeTimeoutMinute": "consume_timeout_minute",
               "attributes": "attributes"}

    @classmethod
    def from_json(cls, obj: dict) -> "SubscriptionGroupConfig":
        return from_camel_json(cls, cls._FIELDS, obj)

    def to_json(self) -> dict:
        return to_camel_json(self, self._FIELDS)


def offset_key(topic: str, group: str) -> str:
    return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"


def split_offset_key(key: str) -> tuple[str, str]:
    topic, sep, group = key.partition(TOPIC_GROUP_SEPARATOR)
    if not sep or not topic or not group:
        raise InvalidMetadataError(f"offset key {key!r} is not topic@group")
    return topic, group


@attrs.define
class TopicConfigTable:
    topics: dict[str, TopicConfig] = attrs.Factory(dict)
    data_version: DataVersion = attrs.Factory(DataVersion)

    def get(self, name: str) -> TopicConfig | None:
        return self.topics.get(name)

    def upsert(self, cfg: TopicConfig, index: int, timestamp: int) -> None:
        self.topics[cfg.topic_name] = cfg
        self.data_version = DataVersion(index, 0, timestamp)

    def delete(self, name: str, index: int, timestamp: int) -> None:
        self.topics.pop(name, None)
        self.data_version = DataVersion(index, 0, timestamp)


@attrs.define
class SubscriptionGroupTable:
    groups: dict[str, SubscriptionGroupConfig] = attrs.Factory(dict)
    data_version: DataVersion = attrs.Factory(DataVersion)

    def get(self, name: str) -> SubscriptionGroupConfig | None:
        return self.groups.get(name)

    def upsert(self, cfg: SubscriptionGroupConfig, index: int, timestamp: int) -> None:
        self.groups[cfg.group_name] = cfg
        self.data_version = DataVersion(index, 0, timestamp)

    def delete(self, name: str, index: int, timestamp: int) -> None:
        self.groups.pop(name, None)
        self.data_version = DataVersion(index, 0, timestamp)


@attrs.define
class ConsumerOffsetTable:
    """`topic@group` -> {queueId: offset}."""

    offsets: dict[str, dict[int, int]] = attrs.Factory(dict)
    data_version: DataVersion = attrs.Factory(DataVersion)

    def query(self, topic: str, group: str, queue_id: int) -> int | None:
        return self.offsets.get(offset_key(topic, group), {}).get(queue_id)

    def table_of(self, topic: str, group: str) -> dict[int, int]:
        return dict(self.offsets.get(offset_key(topic, group), {}))

    def groups_of_topic(self, topic: str) -> list[str]:
        return sorted(split_offset_key(k)[1] for k in self.offsets if split_offset_key(k)[0] == topic)

    def topics_of_group(self, group: str) -> list[str]:
        return sorted(split_offset_key(k)[0] for k in self.offsets if split_offset_key(k)[1] == group)

    def _touch(self, index: int, timestamp: int) -> None:
        self.data_version = DataVersion(index, 0, timestamp)

    def commit(self, table: dict[str, dict[int, int]], index: int, timestamp: int) -> None:
        """Offset commits: each queue's offset only ever grows."""
        for key, queues in table.items():
            current = self.offsets.setdefault(key, {})
            for qid, offset in queues.items():
                if offset > current.get(qid, -1):
                    current[qid] = offset
        self._touch(index, timestamp)

    def reset(self, table: dict[str, dict[int, int]], index: int, timestamp: int) -> None:
        """Explicit resets: the given queues take exactly the given offsets."""
        for key, queues in table.items():
            self.offsets.setdefault(key, {}).update(queues)
        self._touch(index, timestamp)

    def delete_keys(self, keys, index: int, timestamp: int) -> None:
        for key in keys:
            self.offsets.pop(key, None)
        self._touch(index, timestamp)

    def delete_topic(self, topic: str, index: int, timestamp: int) -> None:
        self.delete_keys([k for k in self.offsets if split_offset_key(k)[0] == topic], index, timestamp)

    def delete_group(self, group: str, index: int, timestamp: int) -> None:
        self.delete_keys([k for k in self.offsets if split_offset_key(k)[1] == group], index, timestamp)


@attrs.define
class DelayOffsetTable:
    """ScheduleMessageService's offsetTable: delay level -> the next
    SCHEDULE_TOPIC_XXXX queue offset (queue level-1) to deliver.  Only
    grows, like consumer offset commits (replay stays idempotent)."""

    offsets: dict[int, int] = attrs.Factory(dict)
    data_version: DataVersion = attrs.Factory(DataVersion)

    def get(self, level: int) -> int | None:
        return self.offsets.get(level)

    def commit(self, table: dict[int, int], index: int, timestamp: int) -> None:
        for level, offset in table.items():
            if offset > self.offsets.get(level, -1):
                self.offsets[level] = offset
        self.data_version = DataVersion(index, 0, timestamp)


# --- timer progress (broker/store/timer.py) ----------------------------------


@attrs.define
class TimerProgress:
    """Which units of the timer topic's queue are done (delivered or
    recalled): every offset below `low`, and the sorted, disjoint [a, b)
    ranges in `done` above it (as many ranges as gaps of pending timers,
    so its size follows the pending timers, not the delivered ones).
    `last_batch`/`last_index`: the units whose delivered records follow
    the last timer op at log index `last_index`, in order -- what a new
    leader checks to finish a batch its predecessor committed only in
    part.  Replay is idempotent: marking a done unit again changes
    nothing."""

    low: int = 0
    done: list = attrs.Factory(list)  # [[a, b), ...] sorted, a > low
    last_batch: tuple = ()
    last_index: int = -1
    data_version: DataVersion = attrs.Factory(DataVersion)

    def is_done(self, offset: int) -> bool:
        if offset < self.low:
            return True
        i = bisect.bisect_right(self.done, offset, key=lambda r: r[0]) - 1
        return i >= 0 and offset < self.done[i][1]

    def mark(self, offsets, batch, index: int, timestamp: int) -> None:
        for o in offsets:
            self._add(o)
        self.last_batch = tuple(batch)
        self.last_index = index
        self.data_version = DataVersion(index, 0, timestamp)

    def _add(self, o: int) -> None:
        if self.is_done(o):
            return
        done = self.done
        if o == self.low:  # the head moves: fold the first range in when it touches
            self.low = o + 1
            if done and done[0][0] == self.low:
                self.low = done.pop(0)[1]
            return
        i = bisect.bisect_right(done, o, key=lambda r: r[0])
        left = done[i - 1] if i > 0 and done[i - 1][1] == o else None
        right = done[i] if i < len(done) and done[i][0] == o + 1 else None
        if left is not None and right is not None:
            left[1] = right[1]
            del done[i]
        elif left is not None:
            left[1] = o + 1
        elif right is not None:
            right[0] = o
        else:
            done.insert(i, [o, o + 1])

    def pending_between(self, lo: int, hi: int) -> int:
        """Units in [lo, hi) not done (stats)."""
        n = max(0, hi - max(lo, self.low))
        for a, b in self.done:
            n -= max(0, min(b, hi) - max(a, lo, self.low))
        return n

    def to_json(self) -> dict:
        return {"low": self.low, "done": [list(r) for r in self.done], "lastBatch": list(self.last_batch),
                "lastIndex": self.last_index, "dataVersion": self.data_version.to_json()}

    @classmethod
    def from_json(cls, obj) -> "TimerProgress":
        if not isinstance(obj, dict):
            raise ValueError("timer progress is not an object")
        done = [[int(a), int(b)] for a, b in obj.get("done") or []]
        return cls(int(obj.get("low", 0)), done, tuple(int(o) for o in obj.get("lastBatch") or ()),
                   int(obj.get("lastIndex", -1)), DataVersion.from_json(obj.get("dataVersion")))


@attrs.frozen
class QueueLock:
    client_id: str
    timestamp: int  # ms, the store timestamp of the record that took or renewed it
    max_live_ms: int  # rebalanceLockMaxLiveTime as the taking leader had it

    def expired(self, now_ms: int) -> bool:
        return now_ms - self.timestamp > self.max_live_ms


@attrs.define
class QueueLockTable:
    """RebalanceLockManager's table, replicated: (group, topic, queueId) ->
    the client holding the queue for orderly consumption.  Changed only by
    lock/unlock records; every decision uses the record's store timestamp,
    never a local clock, so each replica reaches the same table (and a new
    master honours a lock the old one granted until it expires)."""

    locks: dict[tuple[str, str, int], QueueLock] = attrs.Factory(dict)

    def holder(self, group: str, topic: str, queue_id: int, now_ms: int) -> str | None:
        lock = self.locks.get((group, topic, queue_id))
        return None if lock is None or lock.expired(now_ms) else lock.client_id

    def try_lock(self, group: str, client_id: str, queues, timestamp: int, max_live_ms: int) -> None:
        """tryLockBatch: free, expired or our own -> ours from `timestamp`."""
        for topic, queue_id in queues:
            key = (group, topic, queue_id)
            lock = self.locks.get(key)
            if lock is None or lock.client_id == client_id or lock.expired(timestamp):
                self.locks[key] = QueueLock(client_id, timestamp, max_live_ms)

    def unlock(self, group: str, client_id: str, queues) -> None:
        for topic, queue_id in queues:
            key = (group, topic, queue_id)
            lock = self.locks.get(key)
            if lock is not None and lock.client_id == client_id:
                del self.locks[key]

    def to_json(self) -> list:
        return [[g, t, q, lk.client_id, lk.timestamp, lk.max_live_ms]
                for (g, t, q), lk in sorted(self.locks.items())]

    @classmethod
    def from_json(cls, rows) -> "QueueLockTable":
        if not isinstance(rows, list):
            raise ValueError("queue locks are not a list")
        return cls({(str(g), str(t), int(q)): QueueLock(str(c), int(ts), int(live)) for g, t, q, c, ts, live in rows})


@attrs.define
class MetadataState:
    """The tables and the log index they include everything up to.
    Compares by value (tests compare a restarted node with a full replay).
    broker_addrs: dLegerSelfId -> broker address (brokerIP1:listenPort),
    announced by each leader as it opens for writes, so any member can
    name the master's broker address in a not-leader answer."""

    topics: TopicConfigTable = attrs.Factory(TopicConfigTable)
    groups: SubscriptionGroupTable = attrs.Factory(SubscriptionGroupTable)
    offsets: ConsumerOffsetTable = attrs.Factory(ConsumerOffsetTable)
    applied_index: int = -1
    delay_offsets: DelayOffsetTable = attrs.Factory(DelayOffsetTable)
    broker_addrs: dict[str, str] = attrs.Factory(dict)
    locks: QueueLockTable = attrs.Factory(QueueLockTable)
    pop: PopTable = attrs.Factory(PopTable)  # POP consumption's checkpoints (pop.py)
    timer: TimerProgress = attrs.Factory(TimerProgress)

    def apply(self, op, index: int, timestamp: int) -> None:
        """Apply one decoded op (broker.metadata.records) committed at
        `index`; `timestamp` is the record's store timestamp (never the
        local clock, so every replica computes the same dataVersion)."""
        op.apply_to(self, index, timestamp)
        if index > self.applied_index:
            self.applied_index = index
