# Owns transactional messages on the storage side (RocketMQ's
# TransactionalMessageBridge, TransactionalMessageServiceImpl and
# TransactionalMessageCheckService over the replicated log):
#
#   to_half        the pure rewrite of a PREPARED send: stored on
#                  RMQ_SYS_TRANS_HALF_TOPIC queue 0 with REAL_TOPIC/REAL_QID
#                  naming where it goes, its sysflag reset to NOT_TYPE (so it
#                  gets a half-queue offset and no consumer ever sees it:
#                  the half topic has no topic config, hence no route and no
#                  pull).
#   from_half      the real message END_TRANSACTION commits: REAL_TOPIC /
#                  REAL_QID back, the commit sysflag, PREPAREDTRANSACTION-
#                  OFFSET = the half's commitlog offset.
#   op_record      the op on RMQ_SYS_TRANS_OP_HALF_TOPIC that resolves a half
#                  (commit or rollback): tags "d", body = the half's queue
#                  offset as text (RocketMQ's format), plus the half's
#                  UNIQ_KEY in LEDGERMQ_HALF_KEY (ours) so re-put copies of
#                  one half are resolved together.
#   TransactionService   the check service.  Like the delay-level service
#                  (schedule.py) it runs on every broker and works only while
#                  the role gate is open.  It keeps an index of the op queue
#                  (half offsets and keys resolved) and walks the half queue
#                  from the replicated progress offsets -- consumer offsets of
#                  group CID_RMQ_SYS_TRANS on the half and op topics, as
#                  RocketMQ keeps them -- so a new master resumes exactly
#                  where the old one was.  For a half that is unresolved and
#                  due (transactionTimeOut after it was stored, or
#                  transactionCheckInterval after its last check), it appends
#                  a copy with TRANSACTION_CHECK_TIMES + 1 together with the
#                  new progress (one append: the check count is in the log),
#                  then asks a producer of the half's group (PGROUP) for the
#                  state with CHECK_TRANSACTION_STATE, naming the copy.  A
#                  half already checked transactionCheckMax times is
#                  discarded (logged), as RocketMQ 4.x does.
#
# No polling: with nothing due the service parks on the op queue's arrivals
# (an op may resolve the head) bounded by the head's due time, or on the
# half queue's arrivals when every half is resolved.  END_TRANSACTION lives
# in broker/processors/end_transaction.py; it asks claim() first, so a
# commit that arrives twice (the producer's own, then a check's answer) is
# stored once.  Delivery is still at least once across a failover: a commit
# whose op record did not reach the log is checked back and may commit again.
import logging
import time
import typing

import attrs
import trio

from broker.config import BrokerConfig
from broker.metadata.records import OffsetCommit
from broker.metadata.service import MetadataService
from broker.metadata.tables import offset_key
from broker.store.gate import RoleGate
from commitlog.errors import CommitLogError, NotLeaderError, QuorumTimeoutError
from commitlog.replica import ReplicaNode
from commitlog.store import SegmentedStore
from consumequeue import record as M
from consumequeue.arrivals import QueueArrivals
from consumequeue.dispatcher import DispatchEngine
from consumequeue.errors import MessageNotFoundError
from consumequeue.reader import message_at
from consumequeue.record import MessageFormatError, parse_java_int
from consumequeue.service import ConsumeQueueService

log = logging.getLogger("ledgermq.transaction")

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_GROUP = "CID_RMQ_SYS_TRANS"  # TransactionalMessageUtil.buildConsumerGroup()
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QID = "REAL_QID"
PROPERTY_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
PROPERTY_HALF_KEY = "LEDGERMQ_HALF_KEY"
REMOVE_TAG = "d"  # TransactionalMessageUtil.REMOVETAG
SCAN_BATCH = 32
ERROR_BACKOFF_S = 1.0

CheckBack = typing.Callable[[str, M.MessageRecord], typing.Awaitable[bool]]


class TransactionError(ValueError):
    """A half message that END_TRANSACTION cannot use (answered SYSTEM_ERROR)."""


def to_half(rec: M.MessageRecord) -> M.MessageRecord:
    """A PREPARED message as stored while its transaction is open."""
    props = dict(rec.properties)
    props[PROPERTY_REAL_TOPIC] = rec.topic
    props[PROPERTY_REAL_QID] = str(rec.queue_id)
    return attrs.evolve(rec, topic=HALF_TOPIC, queue_id=0, properties=props,
                        sysflag=rec.sysflag & ~M.TRANSACTION_MASK)


def real_target(half: M.MessageRecord) -> tuple[str, int]:
    try:
        return half.properties[PROPERTY_REAL_TOPIC], parse_java_int(half.properties[PROPERTY_REAL_QID])
    except (KeyError, MessageFormatError):
        raise TransactionError("half message without a usable REAL_TOPIC/REAL_QID") from None


def from_half(half: M.MessageRecord, *, store_timestamp: int, store_host: M.HostAddr) -> M.MessageRecord:
    """The committed message (EndTransactionProcessor.endMessageTransaction)."""
    topic, queue_id = real_target(half)
    props = {k: v for k, v in half.properties.items()
             if k not in (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID, PROPERTY_CHECK_TIMES)}
    props[PROPERTY_PREPARED_QUEUE_OFFSET] = str(half.queue_offset)
    return M.MessageRecord(topic=topic, body=half.body, properties=props, queue_id=queue_id, flag=half.flag,
                           sysflag=(half.sysflag & ~M.TRANSACTION_MASK) | M.TRANSACTION_COMMIT_TYPE,
                           born_timestamp=half.born_timestamp, born_host=half.born_host,
                           store_timestamp=store_timestamp, store_host=store_host,
                           reconsume_times=half.reconsume_times, prepared_transaction_offset=half.physical_offset)


def op_record(half: M.MessageRecord, *, store_timestamp: int, store_host: M.HostAddr) -> M.MessageRecord:
    props = {M.PROPERTY_TAGS: REMOVE_TAG}
    if half.uniq_key:
        props[PROPERTY_HALF_KEY] = half.uniq_key
    return M.MessageRecord(topic=OP_TOPIC, body=str(half.queue_offset).encode(), properties=props,
                           born_timestamp=store_timestamp, born_host=store_host,
                           store_timestamp=store_timestamp, store_host=store_host)


def check_times(half: M.MessageRecord) -> int:
    try:
        return parse_java_int(half.properties.get(PROPERTY_CHECK_TIMES) or "0")
    except MessageFormatError:
        return 0


def renewed(half: M.MessageRecord, now_ms: int) -> M.MessageRecord:
    """The copy a check re-puts (putBackHalfMsgQueue), one check more."""
    props = dict(half.properties)
    props[PROPERTY_CHECK_TIMES] = str(check_times(half) + 1)
    return attrs.evolve(half, properties=props, store_timestamp=now_ms, queue_offset=0, physical_offset=0,
                        body_crc=None)


def due_at(half: M.MessageRecord, cfg: BrokerConfig) -> int:
    """When a half is checked: transactionTimeOut (or its own
    CHECK_IMMUNITY_TIME_IN_SECONDS) after it was stored, and
    transactionCheckInterval after each check (a copy carries the count)."""
    if check_times(half) > 0:
        return half.store_timestamp + cfg.transaction_check_interval_ms
    wait = cfg.transaction_timeout_ms
    immunity = half.properties.get(PROPERTY_CHECK_IMMUNITY)
    if immunity:
        try:
            wait = max(wait, parse_java_int(immunity) * 1000)
        except MessageFormatError:
            pass
    return half.store_timestamp + wait


@attrs.define(eq=False)
class OpIndex:
    """What the op queue says from `read_offset` on: resolved half offsets
    and keys, with the op queue offset that resolved each."""

    read_offset: int = 0
    offsets: dict[int, int] = attrs.Factory(dict)  # half queue offset -> op queue offset
    keys: dict[str, int] = attrs.Factory(dict)  # half UNIQ_KEY -> op queue offset

    def add(self, op_offset: int, half_offset: int, key: str | None) -> None:
        self.offsets[half_offset] = op_offset
        if key:
            self.keys[key] = op_offset

    def resolved(self, half_offset: int, key: str | None) -> bool:
        return half_offset in self.offsets or (key is not None and key in self.keys)

    def commit_offset(self, half_progress: int) -> int:
        """The op offset a new master must re-read from: the oldest op that
        still matters for halves at or after `half_progress` (older ones
        are dropped from the index here)."""
        for h in [h for h in self.offsets if h < half_progress]:
            del self.offsets[h]
        live = set(self.offsets.values())
        self.keys = {k: o for k, o in self.keys.items() if o in live}
        return min(live, default=self.read_offset)


@attrs.define(eq=False, kw_only=True)
class TransactionService:
    """Construct with the collaborators below (by keyword); run() is the
    service, claim()/release() END_TRANSACTION's side."""

    cfg: BrokerConfig
    gate: RoleGate  # checks only while open, for one term at a time
    metadata: MetadataService  # the replicated progress (CID_RMQ_SYS_TRANS offsets)
    replica: ReplicaNode  # re-put halves and progress are appended through it
    store: SegmentedStore  # a re-put copy's queue offset when the append did not stamp it
    cq: ConsumeQueueService  # where halves and ops are read
    queues: DispatchEngine  # the half and op queues
    arrivals: QueueArrivals  # wakes the service on new halves and ops
    check_back: CheckBack  # (group, re-put half) -> told a producer (end_transaction.TransactionCheckBack)
    clock_ms: typing.Callable[[], int] = lambda: int(time.time() * 1000)
    ops: OpIndex = attrs.Factory(OpIndex)
    claimed: set = attrs.Factory(set)  # keys END_TRANSACTION is storing an op for right now
    checks_sent: int = 0
    discarded: int = 0
    active: bool = False

    # --- END_TRANSACTION's side --------------------------------------------------

    def claim(self, half: M.MessageRecord) -> bool:
        """True if the caller may resolve `half` now (nobody did, nobody is)."""
        key = half.uniq_key or f"@{half.queue_offset}"
        if self.ops.resolved(half.queue_offset, half.uniq_key) or key in self.claimed:
            return False
        self.claimed.add(key)
        return True

    def release(self, half: M.MessageRecord) -> None:
        self.claimed.discard(half.uniq_key or f"@{half.queue_offset}")

    # --- the check service -------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        gate = self.gate
        task_status.started(self)
        while True:
            await gate.wait_writable()
            term = gate.term
            log.info("%s: checking transactions (term %d)", self.cfg.self_id, term)
            try:
                async with trio.open_nursery() as nursery:
                    self.active = True
                    nursery.start_soon(gate.cancel_when_deposed, nursery.cancel_scope, term)
                    nursery.start_soon(self._serve)
            finally:
                self.active = False

    def _progress(self, topic: str) -> int:
        return self.metadata.query_offset(topic, CHECK_GROUP, 0) or 0

    async def _serve(self) -> None:
        half_offset = self._progress(HALF_TOPIC)
        self.ops = OpIndex(self._progress(OP_TOPIC))
        self.claimed.clear()
        while True:
            self._read_ops()
            half_offset, wait_ms, work = self._scan(half_offset)
            if work is not None:
                half_offset = await self._check(half_offset, work)
                continue
            if wait_ms is None:  # every half is resolved: wait for a new one
                await self.arrivals.wait_beyond(HALF_TOPIC, 0, half_offset)
                continue
            with trio.move_on_after(wait_ms / 1000):  # the head's due time, or an op resolving it
                await self.arrivals.wait_beyond(OP_TOPIC, 0, self.ops.read_offset)

    def _queue(self, topic: str):
        return self.queues.cqs.get(topic, 0)

    def _record(self, phy: int) -> M.MessageRecord | None:
        try:
            return M.decode(message_at(self.cq, phy))
        except (MessageNotFoundError, MessageFormatError) as exc:
            log.warning("transaction record at %d unreadable, skipped: %s", phy, exc)
            return None

    def _read_ops(self) -> None:
        cq = self._queue(OP_TOPIC)
        if cq is None:
            return
        self.ops.read_offset = max(self.ops.read_offset, cq.min_offset)
        while cq.max_offset > self.ops.read_offset:
            for unit in cq.read(self.ops.read_offset, 256):
                rec = None if unit.is_blank else self._record(unit.phy)
                if rec is not None:
                    try:
                        half = int(bytes(rec.body).decode())
                    except ValueError:
                        half = -1
                    self.ops.add(unit.offset, half, rec.properties.get(PROPERTY_HALF_KEY))
                self.ops.read_offset = unit.offset + 1

    def _scan(self, offset: int) -> tuple[int, int | None, tuple | None]:
        """Walk resolved and discarded halves from `offset`: (new offset, ms
        until the head is due or None when the queue is done, (head unit,
        record) when the head is due now)."""
        cq = self._queue(HALF_TOPIC)
        if cq is None:
            return offset, None, None
        offset = max(offset, cq.min_offset)
        now = self.clock_ms()
        while cq.max_offset > offset:
            for unit in cq.read(offset, SCAN_BATCH):
                rec = None if unit.is_blank else self._record(unit.phy)
                if rec is None or self.ops.resolved(unit.offset, rec.uniq_key):
                    offset = unit.offset + 1
                    continue
                if check_times(rec) >= self.cfg.transaction_check_max:
                    log.warning("half message %s of group %s checked %d times without an answer: discarded",
                                rec.uniq_key, rec.properties.get(PROPERTY_PRODUCER_GROUP), check_times(rec))
                    self.discarded += 1
                    offset = unit.offset + 1
                    continue
                due = due_at(rec, self.cfg)
                if due > now:
                    return offset, due - now, None
                return offset, 0, (unit, rec)
        return offset, None, None

    async def _check(self, offset: int, work) -> int:
        """Re-put the due head with one check more and the progress past it
        (one append), then ask its producer group.  Returns the new offset."""
        unit, half = work
        now = self.clock_ms()
        copy = renewed(half, now)
        next_offset = unit.offset + 1
        progress = OffsetCommit({offset_key(HALF_TOPIC, CHECK_GROUP): {0: next_offset},
                                 offset_key(OP_TOPIC, CHECK_GROUP): {0: self.ops.commit_offset(next_offset)}})
        try:
            self.gate.check_writable()
            req = await self.replica.wait(self.replica.submit([M.encode(copy), self.metadata.encode(progress)]))
        except NotLeaderError:
            await trio.sleep_forever()  # the role watcher cancels us
        except QuorumTimeoutError as exc:
            await self.replica.committed.wait_for(exc.index)  # it may still commit; else we are cancelled
            return offset
        except CommitLogError as exc:
            log.warning("transaction check of %s failed, retrying in %.0f s: %s", half.uniq_key, ERROR_BACKOFF_S, exc)
            await trio.sleep(ERROR_BACKOFF_S)
            return offset
        index, pos = req.result[0]
        stamps = req.stamped
        queue_offset = stamps[0] if stamps is not None and stamps[0] >= 0 else \
            int.from_bytes(bytes(self.store.get(index).body)[M.POS_QUEUEOFFSET:M.POS_QUEUEOFFSET + 8], "big")
        stored = attrs.evolve(copy, queue_offset=queue_offset, physical_offset=pos + 48)
        group = half.properties.get(PROPERTY_PRODUCER_GROUP, "")
        try:
            sent = await self.check_back(group, stored)
        except Exception:  # a bug in the sender must not stop the service
            log.exception("check-back of %s failed", half.uniq_key)
            sent = False
        self.checks_sent += bool(sent)
        log.info("half message %s (group %s): check %d %s", half.uniq_key, group, check_times(copy),
                 "sent" if sent else "not sent (no producer of the group is connected)")
        return next_offset


def as_checked(half: M.MessageRecord) -> M.MessageRecord:
    """The half as the producer's check listener sees it: its real topic and
    queue (sendCheckMessage), offsets as stored."""
    topic, queue_id = real_target(half)
    return attrs.evolve(half, topic=topic, queue_id=queue_id)


__all__ = ["CHECK_GROUP", "HALF_TOPIC", "OP_TOPIC", "OpIndex", "TransactionError", "TransactionService",
           "as_checked", "due_at", "from_half", "op_record", "renewed", "to_half"]
