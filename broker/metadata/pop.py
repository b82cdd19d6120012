# Owns the replicated state of POP consumption (RocketMQ 5's PopCheckPoint, AckMsg and
# ConsumerOrderInfoManager, decided by the leader and carried in the log like the other metadata):
# the table of in-flight checkpoints and the four ops that change it, on
# rmq_sys_LEDGERMQ_CONSUMER_OFFSET:
#
#   pop.ck      {"group","topic","queueId","startOffset","nextOffset","popTime","invisibleTime",
#                "reviveQid","offsets":[..],"order":b,"attempts":n}
#               one POP of one queue.  An ordinary pop also moves the group's consumer offset to
#               nextOffset (as RocketMQ: the checkpoint, not the offset, keeps the unacked ones); an
#               order pop replaces the queue's order checkpoint and moves no offset (acks do).
#   pop.ack     {"group","topic","queueId","startOffset","popTime","offsets":[..],"order":b}
#               acks offsets of one checkpoint; one with every offset acked is gone.  An order ack
#               moves the consumer offset to the first unacked offset (nextOffset when all are).
#   pop.change  {"group","topic","queueId","startOffset","popTime","offset","newPopTime",
#                "invisibleTime","reviveQid","order":b}
#               the offset is acked in its checkpoint and gets one of its own (popTime = newPopTime);
#               in an order checkpoint the queue's deadline moves instead (invisibleTime stretched).
#   pop.revive  {"group","topic","queueId","startOffset","popTime"}
#               the checkpoint's unacked messages went to the retry topic (or the DLQ) earlier in the
#               same append: the checkpoint is gone.
#
# Rules.  A checkpoint is keyed (group, topic, queueId, startOffset, popTime), an order checkpoint
# (group, topic, queueId): the queue is blocked for the group's order pops while it has unacked
# offsets and its deadline (popTime + invisibleTime) is ahead.  Every replica applies every op the
# same way, with the times the leader wrote, never a local clock.  Replaying any suffix of the log
# from before a state's index reproduces the state (ops recreate or overwrite by key, acks are set
# unions, offsets only grow), as the snapshot rule needs (tables.py).  Pure: no trio, no I/O.
import attrs

from broker.common.values import InvalidMetadataError, check_group_name, check_topic_name

ORDER_REVIVE_QID = 999  # KeyBuilder.POP_ORDER_REVIVE_QUEUE: a receipt of an order pop
MAX_OFFSETS_PER_CK = 1024  # a pop hands out at most 32; a decoder's bound


def _int(obj: dict, name: str, lo: int = 0, hi: int = (1 << 63) - 1) -> int:
    v = obj.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise InvalidMetadataError(f"{name} must be an int in [{lo}, {hi}], got {v!r}")
    return v


def _offsets(obj: dict) -> tuple:
    v = obj.get("offsets")
    if not isinstance(v, list) or len(v) > MAX_OFFSETS_PER_CK or \
            not all(not isinstance(o, bool) and isinstance(o, int) and 0 <= o < 1 << 63 for o in v):
        raise InvalidMetadataError(f"offsets must be a list of at most {MAX_OFFSETS_PER_CK} offsets")
    return tuple(sorted(set(v)))


def _where(obj: dict) -> dict:
    """group, topic and queue_id of an op's body, checked."""
    return {"group": check_group_name(obj.get("group")), "topic": check_topic_name(obj.get("topic")),
            "queue_id": _int(obj, "queueId", 0, (1 << 31) - 1)}


def _bool(obj: dict, name: str) -> bool:
    v = obj.get(name, False)
    if not isinstance(v, bool):
        raise InvalidMetadataError(f"{name} must be a boolean")
    return v


@attrs.define(kw_only=True)
class PopCheckpoint:
    group: str
    topic: str  # the topic popped: a normal topic or its %RETRY%group_topic
    queue_id: int
    start_offset: int
    pop_time: int
    invisible_time: int
    offsets: tuple  # the queue offsets handed out, sorted
    next_offset: int
    order: bool = False
    revive_qid: int = 0
    attempts: int = 0  # order pops: how often these offsets were handed out before
    acked: set = attrs.Factory(set)

    @property
    def deadline(self) -> int:
        return self.pop_time + self.invisible_time

    @property
    def key(self) -> tuple:
        if self.order:
            return (self.group, self.topic, self.queue_id)
        return (self.group, self.topic, self.queue_id, self.start_offset, self.pop_time)

    @property
    def unacked(self) -> list[int]:
        return [o for o in self.offsets if o not in self.acked]

    def to_json(self) -> list:
        return [self.group, self.topic, self.queue_id, self.start_offset, self.pop_time, self.invisible_time,
                list(self.offsets), self.next_offset, self.order, self.revive_qid, self.attempts,
                sorted(self.acked)]

    @classmethod
    def from_json(cls, row) -> "PopCheckpoint":
        g, t, q, so, pt, it, offs, nxt, order, rq, att, acked = row
        return cls(group=str(g), topic=str(t), queue_id=int(q), start_offset=int(so), pop_time=int(pt),
                   invisible_time=int(it), offsets=tuple(int(o) for o in offs), next_offset=int(nxt),
                   order=bool(order), revive_qid=int(rq), attempts=int(att), acked={int(o) for o in acked})


@attrs.define
class PopTable:
    """In-flight checkpoints by key, order checkpoints by queue, and the
    unacked count per (group, topic, queueId) (the pop budget reads it)."""

    cks: dict = attrs.Factory(dict)
    orders: dict = attrs.Factory(dict)
    inflight: dict = attrs.Factory(dict)

    def _count(self, ck: PopCheckpoint, delta: int) -> None:
        key = (ck.group, ck.topic, ck.queue_id)
        n = self.inflight.get(key, 0) + delta
        if n > 0:
            self.inflight[key] = n
        else:
            self.inflight.pop(key, None)

    def _drop(self, ck: PopCheckpoint) -> None:
        table = self.orders if ck.order else self.cks
        if table.get(ck.key) is ck:
            del table[ck.key]
            self._count(ck, -len(ck.unacked))

    def add(self, ck: PopCheckpoint) -> None:
        table = self.orders if ck.order else self.cks
        old = table.get(ck.key)
        if old is not None:
            self._drop(old)
        if ck.offsets:
            table[ck.key] = ck
            self._count(ck, len(ck.unacked))

    def find(self, group: str, topic: str, queue_id: int, start: int, pop_time: int,
             order: bool) -> PopCheckpoint | None:
        if order:
            ck = self.orders.get((group, topic, queue_id))
            return ck if ck is not None and ck.pop_time == pop_time else None
        return self.cks.get((group, topic, queue_id, start, pop_time))

    def ack(self, ck: PopCheckpoint, offsets) -> None:
        fresh = [o for o in offsets if o in ck.offsets and o not in ck.acked]
        ck.acked.update(fresh)
        self._count(ck, -len(fresh))
        if not ck.unacked:
            self._drop(ck)

    def order_ck(self, group: str, topic: str, queue_id: int) -> PopCheckpoint | None:
        return self.orders.get((group, topic, queue_id))

    def blocked(self, group: str, topic: str, queue_id: int, now_ms: int) -> bool:
        """An order pop of this queue must wait (FIFO: unacked and visible later)."""
        ck = self.orders.get((group, topic, queue_id))
        return ck is not None and bool(ck.unacked) and ck.deadline > now_ms

    def in_flight(self, group: str, topic: str, queue_id: int) -> int:
        return self.inflight.get((group, topic, queue_id), 0)

    def earliest_deadline(self) -> int | None:
        return min((ck.deadline for ck in self.cks.values()), default=None)

    def expired(self, now_ms: int, limit: int) -> list[PopCheckpoint]:
        """Ordinary checkpoints whose deadline passed, earliest first."""
        due = sorted((ck for ck in self.cks.values() if ck.deadline <= now_ms), key=lambda c: c.deadline)
        return due[:limit]

    def to_json(self) -> list:
        return [ck.to_json() for ck in [*self.cks.values(), *self.orders.values()]]

    @classmethod
    def from_json(cls, rows) -> "PopTable":
        if not isinstance(rows, list):
            raise ValueError("pop checkpoints are not a list")
        table = cls()
        for row in rows:
            table.add(PopCheckpoint.from_json(row))
        return table


def _commit(state, topic: str, group: str, queue_id: int, offset: int, index: int, ts: int) -> None:
    state.offsets.commit({f"{topic}@{group}": {queue_id: offset}}, index, ts)


# --- the ops (records.py registers them) ------------------------------------------------

_OFFSET_TOPIC = "rmq_sys_LEDGERMQ_CONSUMER_OFFSET"  # records.CONSUMER_OFFSET_TOPIC (records imports us)


@attrs.frozen
class PopCheckpointOp:
    ck: PopCheckpoint
    OP = "pop.ck"
    TOPIC = _OFFSET_TOPIC

    @property
    def subject(self) -> str:
        return self.ck.group

    def body(self) -> dict:
        c = self.ck
        return {"group": c.group, "topic": c.topic, "queueId": c.queue_id, "startOffset": c.start_offset,
                "nextOffset": c.next_offset, "popTime": c.pop_time, "invisibleTime": c.invisible_time,
                "reviveQid": c.revive_qid, "offsets": list(c.offsets), "order": c.order, "attempts": c.attempts}

    @classmethod
    def from_body(cls, obj: dict) -> "PopCheckpointOp":
        return cls(PopCheckpoint(**_where(obj), start_offset=_int(obj, "startOffset"), pop_time=_int(obj, "popTime"),
                                 invisible_time=_int(obj, "invisibleTime"), offsets=_offsets(obj),
                                 next_offset=_int(obj, "nextOffset"), order=_bool(obj, "order"),
                                 revive_qid=_int(obj, "reviveQid", 0, (1 << 31) - 1),
                                 attempts=_int(obj, "attempts", 0, (1 << 31) - 1)))

    def apply_to(self, state, index: int, ts: int) -> None:
        c = attrs.evolve(self.ck, acked=set())  # the op's value stays untouched by later acks
        state.pop.add(c)
        if not c.order:
            _commit(state, c.topic, c.group, c.queue_id, c.next_offset, index, ts)
        elif not c.offsets:  # an order pop that only skipped filtered-out messages
            _commit(state, c.topic, c.group, c.queue_id, c.next_offset, index, ts)


@attrs.frozen(kw_only=True)
class PopAckOp:
    group: str
    topic: str
    queue_id: int
    start_offset: int
    pop_time: int
    offsets: tuple
    order: bool = False
    OP = "pop.ack"
    TOPIC = _OFFSET_TOPIC

    @property
    def subject(self) -> str:
        return self.group

    def body(self) -> dict:
        return {"group": self.group, "topic": self.topic, "queueId": self.queue_id, "startOffset": self.start_offset,
                "popTime": self.pop_time, "offsets": list(self.offsets), "order": self.order}

    @classmethod
    def from_body(cls, obj: dict) -> "PopAckOp":
        return cls(**_where(obj), start_offset=_int(obj, "startOffset"), pop_time=_int(obj, "popTime"),
                   offsets=_offsets(obj), order=_bool(obj, "order"))

    def apply_to(self, state, index: int, ts: int) -> None:
        ck = state.pop.find(self.group, self.topic, self.queue_id, self.start_offset, self.pop_time, self.order)
        if ck is None:
            return
        state.pop.ack(ck, self.offsets)
        if self.order:
            left = ck.unacked
            _commit(state, ck.topic, ck.group, ck.queue_id, left[0] if left else ck.next_offset, index, ts)


@attrs.frozen(kw_only=True)
class PopChangeOp:
    group: str
    topic: str
    queue_id: int
    start_offset: int
    pop_time: int
    offset: int
    new_pop_time: int
    invisible_time: int
    revive_qid: int = 0
    order: bool = False
    OP = "pop.change"
    TOPIC = _OFFSET_TOPIC

    @property
    def subject(self) -> str:
        return self.group

    def body(self) -> dict:
        return {"group": self.group, "topic": self.topic, "queueId": self.queue_id, "startOffset": self.start_offset,
                "popTime": self.pop_time, "offset": self.offset, "newPopTime": self.new_pop_time,
                "invisibleTime": self.invisible_time, "reviveQid": self.revive_qid, "order": self.order}

    @classmethod
    def from_body(cls, obj: dict) -> "PopChangeOp":
        return cls(**_where(obj), start_offset=_int(obj, "startOffset"), pop_time=_int(obj, "popTime"),
                   offset=_int(obj, "offset"), new_pop_time=_int(obj, "newPopTime"),
                   invisible_time=_int(obj, "invisibleTime"), revive_qid=_int(obj, "reviveQid", 0, (1 << 31) - 1),
                   order=_bool(obj, "order"))

    def apply_to(self, state, index: int, ts: int) -> None:
        table = state.pop
        ck = table.find(self.group, self.topic, self.queue_id, self.start_offset, self.pop_time, self.order)
        if ck is None or self.offset not in ck.offsets or self.offset in ck.acked:
            return
        if self.order:
            ck.invisible_time = self.new_pop_time + self.invisible_time - ck.pop_time
            return
        table.ack(ck, (self.offset,))
        table.add(PopCheckpoint(group=self.group, topic=self.topic, queue_id=self.queue_id, start_offset=self.offset,
                                pop_time=self.new_pop_time,
                                invisible_time=self.invisible_time, offsets=(self.offset,), next_offset=self.offset + 1,
                                order=False, revive_qid=self.revive_qid))


@attrs.frozen(kw_only=True)
class PopReviveOp:
    group: str
    topic: str
    queue_id: int
    start_offset: int
    pop_time: int
    OP = "pop.revive"
    TOPIC = _OFFSET_TOPIC

    @property
    def subject(self) -> str:
        return self.group

    def body(self) -> dict:
        return {"group": self.group, "topic": self.topic, "queueId": self.queue_id, "startOffset": self.start_offset,
                "popTime": self.pop_time}

    @classmethod
    def from_body(cls, obj: dict) -> "PopReviveOp":
        return cls(**_where(obj), start_offset=_int(obj, "startOffset"), pop_time=_int(obj, "popTime"))

    def apply_to(self, state, index: int, ts: int) -> None:
        ck = state.pop.find(self.group, self.topic, self.queue_id, self.start_offset, self.pop_time, False)
        if ck is not None:
            state.pop._drop(ck)


POP_OPS = (PopCheckpointOp, PopAckOp, PopChangeOp, PopReviveOp)
