# Owns delay levels (RocketMQ's ScheduleMessageService over DLedgerCommitLog):
#
#   to_schedule     the pure rewrite a send (or a send-back) applies to a
#                   message whose DELAY property is > 0: stored to
#                   SCHEDULE_TOPIC_XXXX, queue level-1, with REAL_TOPIC /
#                   REAL_QID naming where it goes, DELAY = the level (clamped
#                   to the highest configured level, as CommitLog.putMessage
#                   does).  The dispatcher writes the CQ unit's tagsCode as
#                   the delivery timestamp (spec §2, from the default level
#                   table; see deliver_at for why we do not read it back).
#   from_schedule   the pure rewrite back: REAL_TOPIC/REAL_QID, DELAY
#                   removed, stored now by this broker.
#   ScheduleService the delivery task.  It runs on every broker but works
#                   only while the role gate is open (writable leader): it
#                   starts when the gate opens and is cancelled the moment
#                   the gate's generation moves (leadership lost).  One task
#                   per level reads that level's consume queue (dispatched,
#                   hence committed, units only) from the level's replicated
#                   offset and, for the messages that are due, appends the
#                   delivered records AND the new offset (a delay.offset
#                   metadata record) in one append.  A new leader starts from
#                   the replicated offsets: nothing is lost, and at most the
#                   last batch of a dying leader (delivered, offset record not
#                   committed) is delivered twice -- at-least-once.  The
#                   offsets are snapshotted as RocketMQ's
#                   config/delayOffset.json (broker/metadata/snapshot.py).
#
# No polling: a level task with nothing to deliver parks on the dispatch
# watermark (new committed messages); one whose head is not due sleeps
# until the head's delivery time.  Messages of one level are stored in time
# order, so nothing behind the head can be due before it (RocketMQ's timer
# tasks rely on the same order).
import logging
import time
import typing

import attrs
import trio

from broker.config import BrokerConfig
from broker.metadata.service import MetadataService
from broker.store.gate import RoleGate
from commitlog.errors import CommitLogError, NotLeaderError, PendingFullError, QuorumTimeoutError
from commitlog.replica import ReplicaNode
from consumequeue import record as M
from consumequeue.arrivals import QueueArrivals
from consumequeue.dispatcher import DispatchEngine
from consumequeue.errors import MessageNotFoundError
from consumequeue.reader import message_at
from consumequeue.record import SCHEDULE_TOPIC, MessageFormatError, parse_java_int
from consumequeue.service import ConsumeQueueService

log = logging.getLogger("ledgermq.schedule")

PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QID = "REAL_QID"
DELIVER_BATCH = 32  # messages per append (plus one offset record)
ERROR_BACKOFF_S = 1.0  # after an append failed for a reason other than leadership


class DelayPropertyError(ValueError):
    """A DELAY property that is not an int (Java's Integer.parseInt throws)."""


def delay_level(props: dict) -> int:
    """The DELAY property as an int (0 when absent or empty)."""
    text = (props.get(M.PROPERTY_DELAY) or "").strip()
    if not text:
        return 0
    try:
        return parse_java_int(text)
    except MessageFormatError:
        raise DelayPropertyError(f"DELAY property {text!r} is not an int") from None


def queue_of_level(level: int) -> int:
    return level - 1


def to_schedule(rec: M.MessageRecord, max_level: int) -> M.MessageRecord:
    """`rec` as stored while it waits for its delay level, or `rec` itself
    when it is not delayed (level <= 0) or is a prepared/rollback
    transactional message (those never get delayed, as in RocketMQ)."""
    level = delay_level(rec.properties)
    if level <= 0 or rec.transaction_type not in (M.TRANSACTION_NOT_TYPE, M.TRANSACTION_COMMIT_TYPE):
        return rec
    level = min(level, max_level)
    props = dict(rec.properties)
    props[PROPERTY_REAL_TOPIC] = rec.topic
    props[PROPERTY_REAL_QID] = str(rec.queue_id)
    props[M.PROPERTY_DELAY] = str(level)
    return attrs.evolve(rec, topic=SCHEDULE_TOPIC, queue_id=queue_of_level(level), properties=props)


def from_schedule(rec: M.MessageRecord, *, store_timestamp: int, store_host: M.HostAddr) -> M.MessageRecord:
    """The record delivered to the real topic (ScheduleMessageService.
    messageTimeup): same body, flag, sysflag, born fields, reconsume times
    and properties, minus DELAY (REAL_TOPIC/REAL_QID stay, as in Java);
    stored by this broker now, so its offset message id names us."""
    props = dict(rec.properties)
    props.pop(M.PROPERTY_DELAY, None)
    try:
        topic = props[PROPERTY_REAL_TOPIC]
        queue_id = parse_java_int(props[PROPERTY_REAL_QID])
    except (KeyError, MessageFormatError):
        raise MessageFormatError("delayed message without a usable REAL_TOPIC/REAL_QID") from None
    return M.MessageRecord(topic=topic, body=rec.body, properties=props, queue_id=queue_id, flag=rec.flag,
                           sysflag=rec.sysflag, born_timestamp=rec.born_timestamp, born_host=rec.born_host,
                           store_timestamp=store_timestamp, store_host=store_host,
                           reconsume_times=rec.reconsume_times)


def deliver_at(store_timestamp: int, level: int, levels_ms: typing.Sequence[int], now_ms: int) -> int:
    """When a message stored at `store_timestamp` on `level` is due.  From
    the configured messageDelayLevel (the native dispatcher writes the CQ
    tagsCode from the default table, which a custom messageDelayLevel
    overrides); a time further out than now + the level's delay (the clock
    went back) means now, as correctDeliverTimestamp does."""
    delay = levels_ms[min(level, len(levels_ms)) - 1]
    due = store_timestamp + delay
    return now_ms if due > now_ms + delay else due


@attrs.define(eq=False, kw_only=True)
class ScheduleService:
    """Construct with the collaborators below (by keyword); run() is the
    service."""

    cfg: BrokerConfig
    gate: RoleGate  # delivers only while open, for one term at a time
    metadata: MetadataService  # the levels' replicated offsets (delay.offset records)
    replica: ReplicaNode  # delivered messages and offsets are appended through it
    cq: ConsumeQueueService  # where the delayed messages are read
    queues: DispatchEngine  # the levels' consume queues
    arrivals: QueueArrivals  # wakes a level with nothing to deliver
    clock_ms: typing.Callable[[], int] = lambda: int(time.time() * 1000)
    batch: int = DELIVER_BATCH
    delivered: int = 0  # messages delivered by this node (stats, tests)
    active: bool = False  # delivering right now (this node is the writable leader)

    @property
    def levels_ms(self) -> tuple[int, ...]:
        return self.cfg.message_delay_levels_ms

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        gate = self.gate
        task_status.started(self)
        while True:
            await gate.wait_writable()
            term = gate.term
            log.info("%s: delivering delayed messages (term %d)", self.cfg.self_id, term)
            try:
                async with trio.open_nursery() as nursery:
                    self.active = True
                    nursery.start_soon(gate.cancel_when_deposed, nursery.cancel_scope, term)
                    for level in range(1, len(self.levels_ms) + 1):
                        nursery.start_soon(self._serve_level, level)
            finally:
                self.active = False
            log.info("%s: stopped delivering delayed messages (term %d over)", self.cfg.self_id, term)

    # --- one level --------------------------------------------------------------

    async def _serve_level(self, level: int) -> None:
        qid = queue_of_level(level)
        offset = self.metadata.delay_offset(level) or 0
        while True:
            cq = self.queues.cqs.get(SCHEDULE_TOPIC, qid)
            if cq is not None:
                offset = max(offset, cq.min_offset)
            if cq is None or cq.max_offset <= offset:
                # Woken by committed messages of this level only.
                await self.arrivals.wait_beyond(SCHEDULE_TOPIC, qid, offset)
                continue
            now = self.clock_ms()
            due, next_due = self._due(cq, level, offset, now)
            if due:
                offset = await self._deliver(level, offset, due)
            elif next_due is not None:
                await trio.sleep(max(0, next_due - now) / 1000)  # until the head is due

    def _due(self, cq, level: int, offset: int, now: int) -> tuple[list, int | None]:
        """([record or None (skip)] for the due head units, the head's due time if none is due)."""
        due = []
        for unit in cq.read(offset, self.batch):
            if unit.is_blank:
                due.append(None)
                continue
            try:
                rec = M.decode(message_at(self.cq, unit.phy))
            except (MessageNotFoundError, MessageFormatError) as exc:
                log.warning("%s level %d offset %d: delayed message skipped: %s", SCHEDULE_TOPIC, level,
                            unit.offset, exc)
                due.append(None)
                continue
            when = deliver_at(rec.store_timestamp, level, self.levels_ms, now)
            if when > now:
                return due, (None if due else when)
            due.append(rec)
        return due, None

    async def _deliver(self, level: int, offset: int, due: list) -> int:
        """Append the due messages and the level's new offset; returns the
        offset to continue from (unchanged after a failure)."""
        now = self.clock_ms()
        records = []
        for rec in due:
            if rec is None:
                continue
            try:
                records.append(M.encode(from_schedule(rec, store_timestamp=now, store_host=self.cfg.store_host)))
            except MessageFormatError as exc:
                log.warning("%s level %d: delayed message %s dropped: %s", SCHEDULE_TOPIC, level, rec.uniq_key, exc)
        next_offset = offset + len(due)
        records.append(self.metadata.delay_offset_record({level: next_offset}))
        try:
            self.gate.check_writable()
            await self.replica.append(records)
        except NotLeaderError:
            await trio.sleep_forever()  # the role watcher cancels us
        except QuorumTimeoutError as exc:
            # The entries may still commit: wait for that rather than append
            # them again (the role watcher cancels us if they are cut).
            await self.replica.committed.wait_for(exc.index)
        except (PendingFullError, CommitLogError) as exc:
            log.warning("%s level %d: delivery failed, retrying in %.0f s: %s", SCHEDULE_TOPIC, level,
                        ERROR_BACKOFF_S, exc)
            await trio.sleep(ERROR_BACKOFF_S)
            return offset
        self.delivered += len(records) - 1
        return next_offset
