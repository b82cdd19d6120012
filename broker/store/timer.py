# Owns timer messages (RocketMQ 5's TimerMessageStore, over the replicated
# log) and the recall handle:
#
#   to_timer        the pure rewrite a send (or a committed transaction)
#                   applies to a message with TIMER_DELIVER_MS,
#                   TIMER_DELAY_SEC or TIMER_DELAY_MS: due in the future ->
#                   stored to rmq_sys_wheel_timer queue 0 with TIMER_OUT_MS
#                   (the due time, rounded UP to timerPrecisionMs: never
#                   early), REAL_TOPIC, REAL_QID; due now or in the past ->
#                   left as it is (delivered at once, as upstream); further
#                   than timerMaxDelaySec -> TimerMessageError (upstream's
#                   WHEEL_TIMER_MSG_ILLEGAL wording, answered MESSAGE_ILLEGAL).
#                   A DELAY level > 0 wins: the TIMER_ properties are dropped
#                   (HookUtils.checkIfTimerMessage).
#   from_timer      the pure rewrite back to the real topic at delivery.
#   recall handles  base64url("v1 topic brokerName timestamp messageId"),
#                   RecallMessageHandle.HandleV1; the send answer carries one
#                   (recallHandle) for a message stored as a timer.
#   DueIndex        the leader's due-time structure: a heap of (due, unit)
#                   plus unit -> (UNIQ_KEY, phy) and UNIQ_KEY -> units for
#                   recall (a producer's retry may have stored a send twice:
#                   a recall cancels both); removed units are dropped
#                   lazily from the heap.
#   TimerService    the delivery task.
#
# Why a heap rebuilt from the log rather than time-slot queues: the timer
# queue is in arrival order, and time slots over a 3-day horizon at 100 ms
# would be millions of queues (each a preallocated CQ file).  Instead the
# replicated state is small -- TimerProgress (broker/metadata/tables.py):
# every unit below `low` is done, plus the done ranges above it (as many as
# gaps of pending timers) -- and a new leader rebuilds the heap by reading
# the not-done units from `low` to the queue's end, in chunks, delivering
# what is due between them (recalls wait until it has read everything
# committed when they came).  Memory is O(pending):
# about 420 bytes per pending timer in the heap and maps; at most
# timerMaxInMemory are loaded at once, the rest wait in the queue (read
# once the heap drains below the budget; they may then be late, never lost).
#
# Exactly once across failover: one append carries a timer.done record
# FIRST (the units now done, and as `batch` the units whose delivered
# records follow it) and then the delivered records.  Raft may commit only
# a prefix of an append when the leader dies, so a new leader -- its
# metadata applied through everything in its log at election, before the
# role gate opens -- checks the entries after the last timer.done record in
# its own log (the log that will commit): each must be the delivered record
# of its unit (same UNIQ_KEY and real topic).  The missing suffix is
# delivered again, under a new timer.done record that names it as its
# batch.  A recall is a timer.done record without a batch.  Deliveries and
# recalls are appended one at a time (a lock held until commit), so the last
# timer.done record always names the only batch that can be in doubt.
#
# No polling: the task parks until the heap's head is due, or until the
# timer queue grows past what it has read (the dispatcher's arrivals).
# It runs while the role gate is open and is cancelled when the gate's
# generation moves, as ScheduleService.
import base64
import binascii
import heapq
import logging
import math
import re
import time
import typing

import attrs
import trio

from broker.config import BrokerConfig
from broker.metadata.service import MetadataService
from broker.store.gate import RoleGate
from broker.store.schedule import PROPERTY_REAL_QID, PROPERTY_REAL_TOPIC, delay_level
from commitlog.errors import CommitLogError, NotLeaderError, PendingFullError, QuorumTimeoutError
from commitlog.replica import ReplicaNode
from commitlog.store import SegmentedStore
from commitlog.watermark import Watermark
from consumequeue import record as M
from consumequeue.arrivals import QueueArrivals
from consumequeue.dispatcher import DispatchEngine
from consumequeue.errors import MessageNotFoundError
from consumequeue.reader import message_at
from consumequeue.record import MessageFormatError, parse_java_int
from consumequeue.service import ConsumeQueueService

log = logging.getLogger("ledgermq.timer")

TIMER_TOPIC = "rmq_sys_wheel_timer"
TIMER_QUEUE = 0
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
PROPERTY_TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
PROPERTY_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
TIMER_PROPERTIES = (PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_DELAY_SEC, PROPERTY_TIMER_DELAY_MS)
DELIVER_BATCH = 64  # delivered records per append (plus one timer.done record)
SCAN_CHUNK = 512  # queue units read per step while loading
ERROR_BACKOFF_S = 1.0
MAX_HANDLE_CHARS = 2048
_JAVA_LONG = re.compile(r"[+-]?[0-9]+\Z")


class TimerMessageError(MessageFormatError):
    """A timer message the broker refuses (WHEEL_TIMER_MSG_ILLEGAL)."""


class RecallError(ValueError):
    """A recall refused; `code` is the remoting response code's name."""

    def __init__(self, code: str, remark: str):
        super().__init__(remark)
        self.code = code
        self.remark = remark


def illegal_remark(max_delay_sec: int) -> str:
    return (f"timer message illegal, the delay time should not be bigger than the max delay "
            f"{max_delay_sec * 1000}ms; or if set del msg, the delay time should be bigger than the current time")


def _java_long(text: str) -> int:
    if not _JAVA_LONG.match(text or ""):
        raise ValueError(text)
    value = int(text)
    if not -(1 << 63) <= value < 1 << 63:
        raise ValueError(text)
    return value


def is_timer_send(props: dict) -> bool:
    return any(p in props for p in TIMER_PROPERTIES)


def deliver_ms_of(props: dict, now_ms: int) -> int:
    """When the producer asked for delivery (upstream's order: DELAY_SEC,
    then DELAY_MS, then DELIVER_MS); ValueError when it does not parse."""
    if props.get(PROPERTY_TIMER_DELAY_SEC) is not None:
        return now_ms + _java_long(props[PROPERTY_TIMER_DELAY_SEC]) * 1000
    if props.get(PROPERTY_TIMER_DELAY_MS) is not None:
        return now_ms + _java_long(props[PROPERTY_TIMER_DELAY_MS])
    return _java_long(props[PROPERTY_TIMER_DELIVER_MS])


def to_timer(rec: M.MessageRecord, now_ms: int, cfg: BrokerConfig) -> M.MessageRecord:
    """`rec` as stored while it waits for its time, or `rec` itself (not a
    timer message, due already, a half or rollback, or a record the timer
    already rewrote).  Raises TimerMessageError."""
    props = rec.properties
    if not is_timer_send(props) or rec.transaction_type not in (M.TRANSACTION_NOT_TYPE, M.TRANSACTION_COMMIT_TYPE):
        return rec
    if rec.topic == M.SCHEDULE_TOPIC or delay_level(props) > 0:
        kept = {k: v for k, v in props.items() if k not in TIMER_PROPERTIES}
        return attrs.evolve(rec, properties=kept)
    if rec.topic == TIMER_TOPIC or PROPERTY_TIMER_OUT_MS in props:
        return rec
    try:
        deliver = deliver_ms_of(props, now_ms)
    except ValueError:
        raise TimerMessageError(illegal_remark(cfg.timer_max_delay_sec)) from None
    if deliver <= now_ms:
        if props.get(PROPERTY_TIMER_DEL_UNIQKEY) is not None:
            raise TimerMessageError(illegal_remark(cfg.timer_max_delay_sec))
        return rec
    if deliver - now_ms > cfg.timer_max_delay_sec * 1000:
        raise TimerMessageError(illegal_remark(cfg.timer_max_delay_sec))
    precision = cfg.timer_precision_ms
    out = -(-deliver // precision) * precision
    props = dict(props)
    props[PROPERTY_TIMER_OUT_MS] = str(out)
    props[PROPERTY_REAL_TOPIC] = rec.topic
    props[PROPERTY_REAL_QID] = str(rec.queue_id)
    return attrs.evolve(rec, topic=TIMER_TOPIC, queue_id=TIMER_QUEUE, properties=props)


def from_timer(rec: M.MessageRecord, *, store_timestamp: int, store_host: M.HostAddr) -> M.MessageRecord:
    """The record delivered to the real topic: same body, flag, sysflag,
    born fields and properties, minus REAL_TOPIC/REAL_QID, plus
    TIMER_DEQUEUE_MS; stored by this broker now."""
    props = dict(rec.properties)
    try:
        topic = props.pop(PROPERTY_REAL_TOPIC)
        queue_id = parse_java_int(props.pop(PROPERTY_REAL_QID))
    except (KeyError, MessageFormatError):
        raise MessageFormatError("timer message without a usable REAL_TOPIC/REAL_QID") from None
    props[PROPERTY_TIMER_DEQUEUE_MS] = str(store_timestamp)
    return M.MessageRecord(topic=topic, body=rec.body, properties=props, queue_id=queue_id, flag=rec.flag,
                           sysflag=rec.sysflag, born_timestamp=rec.born_timestamp, born_host=rec.born_host,
                           store_timestamp=store_timestamp, store_host=store_host,
                           reconsume_times=rec.reconsume_times)


def due_of(rec: M.MessageRecord) -> int:
    """A stored timer message's TIMER_OUT_MS (MessageFormatError if bad)."""
    try:
        return _java_long(rec.properties[PROPERTY_TIMER_OUT_MS])
    except (KeyError, ValueError):
        raise MessageFormatError("timer message without a usable TIMER_OUT_MS") from None


# --- recall handles ------------------------------------------------------------------

@attrs.frozen(kw_only=True)
class RecallHandle:
    topic: str
    broker_name: str
    timestamp: str
    message_id: str

    def encode(self) -> str:
        raw = " ".join(("v1", self.topic, self.broker_name, self.timestamp, self.message_id))
        return base64.urlsafe_b64encode(raw.encode()).decode("ascii")

    @classmethod
    def decode(cls, text: str | None) -> "RecallHandle":
        """RecallMessageHandle.decodeHandle; ValueError "recall handle is invalid"."""
        if not text or len(text) > MAX_HANDLE_CHARS:
            raise ValueError("recall handle is invalid")
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("utf-8")
        except (binascii.Error, ValueError):
            raise ValueError("recall handle is invalid") from None
        items = raw.split(" ")
        if items[0] != "v1" or len(items) < 5:
            raise ValueError("recall handle is invalid")
        return cls(topic=items[1], broker_name=items[2], timestamp=items[3], message_id=items[4])


class TimerKey(str):
    """A send's UNIQ_KEY carrying the recall handle of the timer message it
    was stored as (the send answer's recallHandle)."""

    recall_handle: str


def timer_key(uniq: str | None, rec: M.MessageRecord, broker_name: str) -> str | None:
    """`uniq`, with a recall handle when `rec` was stored as a timer."""
    if uniq is None or rec.topic != TIMER_TOPIC:
        return uniq
    key = TimerKey(uniq)
    key.recall_handle = RecallHandle(topic=rec.properties.get(PROPERTY_REAL_TOPIC, ""), broker_name=broker_name,
                                     timestamp=rec.properties.get(PROPERTY_TIMER_OUT_MS, ""), message_id=uniq).encode()
    return key


# --- the due-time structure ----------------------------------------------------------

@attrs.define
class DueIndex:
    """Pending timers of the leader: a heap of (due, unit) and, per unit,
    its (UNIQ_KEY, phy); removing a unit leaves its heap entry, skipped
    when it surfaces."""

    _heap: list = attrs.Factory(list)
    _units: dict = attrs.Factory(dict)  # unit -> (uniq, phy, due)
    _keys: dict = attrs.Factory(dict)  # uniq -> [unit, ...]

    def __len__(self) -> int:
        return len(self._units)

    def add(self, unit: int, due: int, uniq: str | None, phy: int) -> None:
        if unit in self._units:
            return
        self._units[unit] = (uniq, phy, due)
        if uniq:
            self._keys.setdefault(uniq, []).append(unit)
        heapq.heappush(self._heap, (due, unit))
        if len(self._heap) > 2 * len(self._units) + 64:  # many removed: rebuild
            self._heap = [(d, u) for u, (_, _, d) in self._units.items()]
            heapq.heapify(self._heap)

    def head_due(self) -> int | None:
        heap = self._heap
        while heap and heap[0][1] not in self._units:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def pop_due(self, now_ms: int, limit: int) -> list[tuple[int, int, str | None, int]]:
        """Up to `limit` (unit, due, uniq, phy) due at `now_ms`, earliest
        first, taken out (put them back with add() if they were not delivered)."""
        out, heap, units = [], self._heap, self._units
        while heap and len(out) < limit and heap[0][0] <= now_ms:
            due, unit = heapq.heappop(heap)
            entry = units.get(unit)
            if entry is None or entry[2] != due:
                continue
            self.remove(unit)
            out.append((unit, due, entry[0], entry[1]))
        return out

    def remove(self, unit: int) -> None:
        entry = self._units.pop(unit, None)
        if entry is None or not entry[0]:
            return
        units = self._keys.get(entry[0])
        if units is not None and unit in units:
            units.remove(unit)
            if not units:
                del self._keys[entry[0]]

    def find(self, uniq: str) -> list[int]:
        """The pending units of `uniq` (more than one when a producer's
        retry stored the send twice)."""
        return list(self._keys.get(uniq, ()))

    def due_of(self, unit: int) -> int | None:
        entry = self._units.get(unit)
        return None if entry is None else entry[2]

    def clear(self) -> None:
        self._heap.clear()
        self._units.clear()
        self._keys.clear()


# --- the service ------------------------------------------------------------------------

@attrs.define(eq=False, kw_only=True)
class TimerService:
    """Construct with the collaborators below (by keyword); run() is the
    service, recall() the RECALL_MESSAGE half."""

    cfg: BrokerConfig
    gate: RoleGate  # delivers only while open, for one term at a time
    metadata: MetadataService  # the replicated timer progress (timer.done records)
    replica: ReplicaNode  # deliveries and done markers are appended through it
    store: SegmentedStore  # the log, to see whether a predecessor's batch got in
    cq: ConsumeQueueService  # where the timer messages are read
    queues: DispatchEngine  # the timer queue
    arrivals: QueueArrivals  # wakes the scan when the timer queue grows
    dispatched: Watermark  # how far dispatch got (a recall waits for it)
    clock_ms: typing.Callable[[], int] = lambda: int(time.time() * 1000)
    batch: int = DELIVER_BATCH
    delivered: int = 0  # records delivered by this node (stats, tests)
    redelivered: int = 0  # records of a predecessor's unfinished batch delivered again
    recalled: int = 0
    active: bool = False
    lateness_ms: list = attrs.Factory(list)  # delivery time - due, last 10000 (bench, tests)
    index: DueIndex = attrs.Factory(DueIndex)
    scanned: Watermark = attrs.Factory(lambda: Watermark(-1))  # next unit to read, this term
    _lock: trio.Lock = attrs.Factory(trio.Lock)
    _ready: trio.Event = attrs.Factory(trio.Event)  # this term's load is done
    _wake: trio.Event = attrs.Factory(trio.Event)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        gate = self.gate
        task_status.started(self)
        while True:
            await gate.wait_writable()
            term = gate.term
            log.info("%s: delivering timer messages (term %d)", self.cfg.self_id, term)
            try:
                async with trio.open_nursery() as nursery:
                    self.active = True
                    nursery.start_soon(gate.cancel_when_deposed, nursery.cancel_scope, term)
                    nursery.start_soon(self._serve)
            finally:
                self.active = False
                self._ready = trio.Event()
                self.index.clear()
                self.scanned = Watermark(-1)
            log.info("%s: stopped delivering timer messages (term %d over)", self.cfg.self_id, term)

    def _queue(self):
        return self.queues.cqs.get(TIMER_TOPIC, TIMER_QUEUE)

    @property
    def pending(self) -> int:
        """Timers not yet delivered nor recalled (committed, dispatched)."""
        cq = self._queue()
        return 0 if cq is None else self.metadata.timer_progress.pending_between(cq.min_offset, cq.max_offset)

    # --- one term ---------------------------------------------------------------------

    async def _serve(self) -> None:
        await self._finish_last_batch()
        progress = self.metadata.timer_progress
        cq = self._queue()
        pos = max(progress.low, cq.min_offset if cq is not None else 0)
        self.scanned = Watermark(pos)
        budget = self.cfg.timer_max_in_memory
        while True:
            # One chunk at a time, delivering what is due in between: a new
            # master with many pending timers delivers while it still reads.
            more = await self._load(budget)
            if not more and not self._ready.is_set():
                self._ready.set()
            now = self.clock_ms()
            head = self.index.head_due()
            if head is not None and head <= now:
                await self._deliver(now)
                continue
            if more:
                continue
            timeout = math.inf if head is None else (head - now) / 1000
            self._wake = trio.Event()
            with trio.move_on_after(timeout):
                if len(self.index) < budget:
                    async with trio.open_nursery() as n:
                        async def arrived(scope=n.cancel_scope):
                            await self.arrivals.wait_beyond(TIMER_TOPIC, TIMER_QUEUE, self.scanned.value)
                            scope.cancel()

                        async def woken(scope=n.cancel_scope):
                            await self._wake.wait()
                            scope.cancel()

                        n.start_soon(arrived)
                        n.start_soon(woken)
                else:
                    await self._wake.wait()

    async def _load(self, budget: int) -> bool:
        """Read up to SCAN_CHUNK units of the queue from `scanned` into the
        index (not-done units only), while the index is below `budget`.
        True when there is more to read now."""
        progress = self.metadata.timer_progress
        cq = self._queue()
        pos = self.scanned.value
        if cq is None or cq.max_offset <= pos or len(self.index) >= budget:
            return False
        pos = max(pos, cq.min_offset)
        units = cq.read(pos, min(SCAN_CHUNK, budget - len(self.index)))
        if not units:
            return False  # (nothing readable yet: the arrivals wake us)
        for unit in units:
            pos = unit.offset + 1
            if unit.is_blank or progress.is_done(unit.offset):
                continue
            try:
                rec = M.decode(message_at(self.cq, unit.phy))
                due = due_of(rec)
            except (MessageNotFoundError, MessageFormatError) as exc:
                log.warning("%s offset %d: timer message unreadable, skipped when due: %s", TIMER_TOPIC,
                            unit.offset, exc)
                due = 0  # marked done (not delivered) with the next batch
                rec = None
            self.index.add(unit.offset, due, rec.uniq_key if rec is not None else None, unit.phy)
        self.scanned.advance(pos)
        await trio.lowlevel.checkpoint()
        return cq.max_offset > pos and len(self.index) < budget

    async def _deliver(self, now: int) -> None:
        async with self._lock:
            due = self.index.pop_due(now, self.batch)
            if not due:
                return
            records, batch, done = [], [], []
            for unit, _when, _uniq, phy in due:
                done.append(unit)
                try:
                    rec = M.decode(message_at(self.cq, phy))
                    records.append(M.encode(from_timer(rec, store_timestamp=now, store_host=self.cfg.store_host)))
                    batch.append(unit)
                except (MessageNotFoundError, MessageFormatError) as exc:
                    log.warning("%s offset %d: timer message dropped: %s", TIMER_TOPIC, unit, exc)
            marker = self.metadata.timer_done_record(done, batch)
            if not await self._append([marker, *records]):
                for unit, when, uniq, phy in due:
                    self.index.add(unit, when, uniq, phy)
                return
            for _unit, when, _uniq, _phy in due:
                self._lateness(now - when if when else 0)
            self.delivered += len(records)

    def _lateness(self, ms: int) -> None:
        lat = self.lateness_ms
        lat.append(ms)
        if len(lat) > 10000:
            del lat[:5000]

    async def _append(self, bodies: list) -> bool:
        """One append (the caller holds the lock); True once committed."""
        try:
            self.gate.check_writable()
            await self.replica.append(bodies)
        except NotLeaderError:
            await trio.sleep_forever()  # the role watcher cancels us
        except QuorumTimeoutError as exc:
            # May still commit: wait for that rather than append again (the
            # role watcher cancels us if it is cut; the next leader finishes it).
            await self.replica.committed.wait_for(exc.index)
        except (PendingFullError, CommitLogError) as exc:
            log.warning("%s: timer append failed, retrying in %.0f s: %s", TIMER_TOPIC, ERROR_BACKOFF_S, exc)
            await trio.sleep(ERROR_BACKOFF_S)
            return False
        return True

    async def _finish_last_batch(self) -> None:
        """Deliver again what the last timer.done record's batch lacks in
        this node's log (a predecessor's append committed in part)."""
        progress = self.metadata.timer_progress
        batch, index = progress.last_batch, progress.last_index
        if not batch:
            return
        cq = self._queue()
        missing = []
        for k, unit in enumerate(batch):
            try:
                rec = self._timer_record(cq, unit)
            except (MessageNotFoundError, MessageFormatError, CommitLogError) as exc:
                log.warning("%s offset %d: cannot check its delivery: %s", TIMER_TOPIC, unit, exc)
                continue
            if not self._delivered_at(index + 1 + k, rec):
                for u in batch[k:]:
                    try:
                        missing.append((u, self._timer_record(cq, u)))
                    except (MessageNotFoundError, MessageFormatError) as exc:
                        log.warning("%s offset %d: timer message of an unfinished batch lost: %s", TIMER_TOPIC,
                                    u, exc)
                break
        if not missing:
            return
        now = self.clock_ms()
        records = [M.encode(from_timer(r, store_timestamp=now, store_host=self.cfg.store_host)) for _, r in missing]
        marker = self.metadata.timer_done_record((), [u for u, _ in missing])
        log.warning("%s: the last timer batch (log index %d) committed %d of %d deliveries; delivering the rest",
                    TIMER_TOPIC, index, len(batch) - len(missing), len(batch))
        async with self._lock:
            while not await self._append([marker, *records]):
                pass
        self.redelivered += len(records)

    def _timer_record(self, cq, unit: int) -> M.MessageRecord:
        if cq is None:
            raise MessageNotFoundError(f"no {TIMER_TOPIC} queue")
        units = cq.read(unit, 1)
        if not units or units[0].offset != unit or units[0].is_blank:
            raise MessageNotFoundError(f"{TIMER_TOPIC} unit {unit} not found")
        return M.decode(message_at(self.cq, units[0].phy))

    def _delivered_at(self, index: int, timer_rec: M.MessageRecord) -> bool:
        store = self.store
        if index > store.end_index:
            return False
        try:
            rec = M.decode(store.get(index).body)
        except (CommitLogError, MessageFormatError, ValueError):
            return False
        return rec.uniq_key == timer_rec.uniq_key and rec.topic == timer_rec.properties.get(PROPERTY_REAL_TOPIC)

    # --- recall -----------------------------------------------------------------------

    async def recall(self, uniq: str, timeout_s: float = 3.0) -> None:
        """Cancel the pending timer message `uniq`; RecallError when this
        node is not delivering or has no such pending message."""
        with trio.move_on_after(timeout_s):
            await self._ready.wait()
            # Everything committed so far is in the queue and read.
            await self.dispatched.wait_for(self.replica.committed.value)
            cq = self._queue()
            if cq is not None:
                await self.scanned.wait_for(cq.max_offset)
        if not self.active or not self._ready.is_set():
            raise RecallError("SERVICE_NOT_AVAILABLE", "recall failed, broker service not available")
        async with self._lock:
            units = self.index.find(uniq)
            if not units:
                raise RecallError("ILLEGAL_OPERATION",
                                  f"recall failed, no pending timer message {uniq} (delivered, recalled or unknown)")
            marker = self.metadata.timer_done_record(units, ())
            if not await self._append([marker]):
                raise RecallError("SYSTEM_ERROR", "recall failed, execute error")
            for unit in units:
                self.index.remove(unit)
            self.recalled += 1
        self._wake.set()
