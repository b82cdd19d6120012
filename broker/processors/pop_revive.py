# Owns the revive of POP checkpoints (RocketMQ 5's PopReviveService): the
# leader-only task that gives unacked messages back once their invisible
# time is over.
#
# It runs on every broker but works only while the role gate is open (the
# writable leader), like the schedule service: it starts when the gate
# opens, from the replicated checkpoint table (so a new master revives what
# its predecessor handed out), and is cancelled the moment the gate's
# generation moves.  No polling: it sleeps until the earliest checkpoint
# deadline, woken earlier when the pop processor adds a checkpoint with an
# earlier one (PopProcessor.on_checkpoint).
#
# For each expired ordinary checkpoint (earliest first, REVIVE_BATCH at a
# time), under the checkpoint's lock (an ack of it waits, then finds it
# gone and appends nothing): each unacked message is read from its queue
# (committed data only) and rewritten for the group's POP retry topic
# %RETRY%<group>_<topic> (created when missing: retryQueueNums queues) --
# body, flag, sysflag, born fields and properties kept, RETRY_TOPIC = the
# original topic, ORIGIN_MESSAGE_ID set once, reconsumeTimes + 1 -- or, when
# its reconsumeTimes already reached the group's retryMaxTimes, for
# %DLQ%<group> (1 queue).  The rewritten messages and then the pop.revive
# op that drops the checkpoint go out in ONE append: committed together or,
# if the leader dies between, the op (last) is not committed and the new
# master revives the checkpoint again -- a message may come back twice,
# never not at all.  A message the log no longer holds (retention) is
# skipped with a warning, and so is one that does not decode.  Order
# checkpoints are not revived: their queue is handed out again by the next
# order pop (pop.py).
import contextlib
import logging
import math
import time
import typing

import attrs
import trio

from broker.common.permissions import PERM_READ, PERM_WRITE
from broker.common.values import InvalidMetadataError
from broker.config import LiveConfig
from broker.metadata.pop import PopCheckpoint, PopReviveOp
from broker.metadata.service import MetadataService
from broker.processors.pop import PopProcessor
from broker.processors.pop_receipt import original_topic, pop_retry_topic, revived
from broker.processors.retry import DLQ_NUMS_PER_GROUP, dlq_topic, ensure_group, ensure_topic
from broker.store.gate import RoleGate
from commitlog.errors import CommitLogError, NotLeaderError, QuorumTimeoutError
from commitlog.replica import ReplicaNode
from consumequeue import record as M
from consumequeue.reader import GetMessageStatus, read_messages
from consumequeue.service import ConsumeQueueService

log = logging.getLogger("ledgermq.pop")

REVIVE_BATCH = 16  # checkpoints per append (up to 32 messages each)
ERROR_BACKOFF_S = 1.0


@attrs.define(eq=False, kw_only=True)
class PopReviveService:
    config: LiveConfig
    gate: RoleGate  # revives run on the writable master, for one term at a time
    metadata: MetadataService  # the checkpoints; revive ops
    replica: ReplicaNode  # revived messages and ops are appended through it
    cq: ConsumeQueueService  # the messages to revive
    pop: PopProcessor  # its checkpoint locks; it wakes held pops
    clock_ms: typing.Callable[[], int] = lambda: int(time.time() * 1000)
    revived: int = 0  # messages put back (retry or DLQ) by this node
    to_dlq: int = 0
    active: bool = False
    _wakeup: trio.Event = attrs.Factory(trio.Event)
    _armed: float = math.inf  # the deadline (ms) the sleeper waits for

    def __attrs_post_init__(self) -> None:
        self.pop.on_checkpoint = self.checkpoint_added

    def checkpoint_added(self, deadline_ms: int) -> None:
        if deadline_ms < self._armed:
            self._wakeup.set()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        gate = self.gate
        task_status.started(self)
        while True:
            await gate.wait_writable()
            term = gate.term
            try:
                async with trio.open_nursery() as nursery:
                    self.active = True
                    nursery.start_soon(gate.cancel_when_deposed, nursery.cancel_scope, term)
                    nursery.start_soon(self._serve)
            finally:
                self.active = False

    async def _serve(self) -> None:
        while True:
            table = self.metadata.state.pop
            now = self.clock_ms()
            due = [ck for ck in table.expired(now, REVIVE_BATCH)]
            if due:
                await self._revive(due)
                continue
            nxt = table.earliest_deadline()
            self._armed = math.inf if nxt is None else nxt
            self._wakeup = trio.Event()
            with trio.move_on_after(math.inf if nxt is None else max(nxt - now, 0) / 1000 + 0.001):
                await self._wakeup.wait()

    async def _revive(self, due: list[PopCheckpoint]) -> None:
        """Put the unacked messages of `due` back, under their locks."""
        locks = self.pop.ck_locks
        async with _hold_all(locks, [ck.key for ck in due]):
            table = self.metadata.state.pop
            now = self.clock_ms()
            live = [ck for ck in due if table.cks.get(ck.key) is ck and ck.deadline <= now]
            if not live:
                return
            records, ops, dlq = [], [], 0
            try:
                for ck in live:
                    for rec in await self._plan(ck, now):
                        dlq += rec.topic.startswith("%DLQ%")
                        records.append(M.encode(rec))
                    ops.append(PopReviveOp(group=ck.group, topic=ck.topic, queue_id=ck.queue_id,
                                           start_offset=ck.start_offset, pop_time=ck.pop_time))
                bodies = records + [self.metadata.encode(op) for op in ops]
                self.gate.check_writable()
                placed = await self.replica.append(bodies)
                await self.metadata.wait_applied(placed[-1][0])
            except NotLeaderError:
                await trio.sleep_forever()  # the role watcher cancels us
            except QuorumTimeoutError as exc:
                await self.replica.committed.wait_for(exc.index)  # they may still commit
                return
            except (CommitLogError, InvalidMetadataError) as exc:
                log.warning("pop revive failed, retrying in %.0f s: %s", ERROR_BACKOFF_S, exc)
                await trio.sleep(ERROR_BACKOFF_S)
                return
        self.revived += len(records)
        self.to_dlq += dlq
        log.info("revived %d unacked POP messages (%d to a DLQ) of %d checkpoints", len(records), dlq, len(live))
        for group in {ck.group for ck in live}:
            self.pop.state_changed(group)

    async def _plan(self, ck: PopCheckpoint, now: int) -> list[M.MessageRecord]:
        metadata, cfg = self.metadata, self.config.current
        group_cfg = await ensure_group(metadata, cfg, ck.group)
        max_times = group_cfg.retry_max_times if group_cfg is not None else 16
        topic = original_topic(ck.topic, ck.group)
        out = []
        for offset in ck.unacked:
            result = read_messages(self.cq, ck.topic, ck.queue_id, offset, 1)
            if result.status is not GetMessageStatus.FOUND or result.queue_offsets[0] != offset:
                log.warning("pop revive: %s@%d offset %d of %s is gone (%s): skipped", ck.topic, ck.queue_id,
                            offset, ck.group, result.status.value)
                continue
            try:
                rec = M.decode(result.records)
            except M.MessageFormatError as exc:
                log.warning("pop revive: %s@%d offset %d of %s does not decode: skipped (%s)", ck.topic,
                            ck.queue_id, offset, ck.group, exc)
                continue
            to_dlq = rec.reconsume_times >= max_times
            if to_dlq:
                await ensure_topic(metadata, dlq_topic(ck.group), DLQ_NUMS_PER_GROUP, PERM_READ | PERM_WRITE)
            else:
                await ensure_topic(metadata, pop_retry_topic(topic, ck.group),
                                   max(group_cfg.retry_queue_nums if group_cfg else 1, 1), PERM_READ | PERM_WRITE)
            out.append(revived(rec, result.phy_offsets[0], topic, to_dlq=to_dlq, group=ck.group, now_ms=now,
                               store_host=cfg.store_host))
        return out


class _hold_all:
    """Hold the locks of several keys (sorted: no two holders deadlock)."""

    def __init__(self, locks, keys) -> None:
        self.locks, self.keys = locks, sorted(set(keys))
        self._stack = None

    async def __aenter__(self):
        self._stack = contextlib.AsyncExitStack()
        await self._stack.__aenter__()
        for key in self.keys:
            await self._stack.enter_async_context(self.locks.hold(key))

    async def __aexit__(self, *exc):
        return await self._stack.__aexit__(*exc)
