# Owns MetadataService: the broker's metadata that survives failover.
# Topic configs, subscription groups and consumer offsets are changed only by
# appending records to internal topics through the replicated log
# (records.py); every node -- leader or follower -- builds its tables by
# applying committed records (applier.py), starting from the last snapshot
# (snapshot.py).  A new leader therefore serves exactly what was committed,
# and a consumer resumes from its last committed offset after a leader
# change (the failure of apache/rocketmq#7790).  Writes (leader only; NotLeaderError otherwise) return once the record is
# committed AND applied locally, so a caller reads its own write.  Offset
# commits are coalesced: every commit staged during one flush interval
# (default 200 ms) becomes one record (split when large), keeping the
# highest offset per queue; a reset drops the staged commits of the queues
# it resets, so an older commit can never land after it.  Every node applies
# each commit at once (a deposed master hands writes on to the leader whose
# broker address the tables announce).
#
# Snapshots are written every snapshot_interval seconds when the tables moved,
# and on clean close.  Retention may delete entries only BELOW
# min_retained_index(), which never advances before a snapshot is durable.
#
# Leadership: the broker calls `await leader_barrier()` when this node
# becomes leader and serves metadata only after it returns (it waits until
# everything in the local log at election time -- a superset of everything
# committed by earlier leaders -- is applied).  With a `write_gate` (the
# broker's RoleGate sets itself) every write asks the gate first, so a
# follower -- or a leader still catching up -- refuses with the gate's
# NotWritableError (naming the master's broker address) instead of trying.
# The gate's own announcement (announce_leader) is the one write made
# before the gate opens.
import errno
import logging
import math
import time
from typing import Callable, Protocol, Sequence

import attrs
import trio

from broker.common.values import InvalidMetadataError, TopicConfig, check_group_name, check_topic_name
from broker.metadata import snapshot
from broker.metadata.applier import MetadataApplier, MetadataGapError
from broker.metadata.records import (
    BrokerAnnounce,
    DelayOffsetCommit,
    GroupDelete,
    GroupUpsert,
    OffsetCommit,
    OffsetReset,
    QueueLockBatch,
    QueueUnlockBatch,
    TimerDone,
    TopicDelete,
    TopicUpsert,
    encode_op,
    is_internal_topic,
    merge_offsets,
)
from broker.metadata.tables import MetadataState, SubscriptionGroupConfig, offset_key
from consumequeue.record import LOCALHOST, HostAddr

log = logging.getLogger("ledgermq.metadata")


class FlushAbortedError(Exception):
    """The service stopped before staged offset commits were appended."""

    def __str__(self) -> str:
        return "metadata service stopped before the offset commits were appended"


@attrs.frozen
class MetadataConfig:
    offset_flush_interval_ms: int = 200  # coalescing window for offset commits
    max_offsets_per_record: int = 1000  # queues per offset.commit record (~60 KiB)
    snapshot_interval_s: float = 60.0
    store_host: HostAddr = LOCALHOST  # STOREHOST/BORNHOST of metadata records


@attrs.frozen
class OffsetCommitRequest:
    topic: str
    group: str
    queue_id: int
    offset: int


@attrs.define(eq=False)
class _Flush:
    """The staged offset commits of one flush interval and their waiters."""

    table: dict = attrs.Factory(dict)
    done: trio.Event = attrs.Factory(trio.Event)
    index: int = -1
    error: BaseException | None = None


class MetadataNode(Protocol):
    """What the service uses of its replica (commitlog.replica.ReplicaNode)."""

    @property
    def is_leader(self) -> bool: ...

    def leader_error(self) -> Exception: ...

    async def append(self, bodies: Sequence[bytes]) -> list[tuple[int, int]]: ...


class MetadataLog(Protocol):
    """What the service reads of the node's log (commitlog.store.SegmentedStore)."""

    @property
    def end_index(self) -> int: ...


class WriteGate(Protocol):
    """Asked before every write (broker.store.gate.RoleGate)."""

    def check_writable(self) -> None: ...


@attrs.define(eq=False)
class MetadataService:
    node: MetadataNode
    store: MetadataLog
    root: str  # storePathRootDir (snapshots go to <root>/config/)
    applier: MetadataApplier
    config: MetadataConfig = attrs.Factory(MetadataConfig)
    persisted_index: int = -1  # index of the last durable snapshot
    write_gate: WriteGate | None = None  # check_writable() before every write
    # Store timestamps of the records written here (queue locks expire by them).
    clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)
    _staged: _Flush = attrs.Factory(_Flush)
    # Flushes being appended: their offsets are acknowledged but not yet
    # applied, so queries must still see them (else a committed offset reads
    # back stale until the append returns).
    _flushing: list[_Flush] = attrs.Factory(list)
    _flush_wanted: trio.Event = attrs.Factory(trio.Event)
    _snapshot_lock: trio.Lock = attrs.Factory(trio.Lock)

    @classmethod
    def open(cls, node, store, root: str, config: MetadataConfig | None = None) -> "MetadataService":
        """Load the snapshot and check that the log still holds everything
        after it: MetadataGapError if not (then the broker must obtain a
        newer snapshot, e.g. the leader's config files, and start from it).
        Nothing is applied until run()."""
        loaded = snapshot.load_snapshot(root)
        for problem in loaded.problems:
            log.warning("metadata snapshot file unusable, rebuilding it from the log: %s", problem)
        state = loaded.state
        if store.begin_index > state.applied_index + 1:
            raise MetadataGapError(state.applied_index + 1, store.begin_index)
        applier = MetadataApplier(store, node.committed, state)
        return cls(node, store, root, applier, config or MetadataConfig(), persisted_index=state.applied_index)

    # --- reads (local tables; on the leader after leader_barrier) ----------------

    @property
    def state(self) -> MetadataState:
        return self.applier.state

    @property
    def applied_index(self) -> int:
        return self.applier.state.applied_index

    def topic_config(self, topic: str) -> TopicConfig | None:
        return self.state.topics.get(topic)

    def topic_configs(self, *, include_internal: bool = False) -> dict[str, TopicConfig]:
        return {n: c for n, c in self.state.topics.topics.items() if include_internal or not is_internal_topic(n)}

    def group_config(self, group: str) -> SubscriptionGroupConfig | None:
        return self.state.groups.get(group)

    def query_offset(self, topic: str, group: str, queue_id: int, *, include_staged: bool = True) -> int | None:
        """The committed offset, or (include_staged) a higher one staged on
        this leader and not yet flushed (what RocketMQ answers)."""
        best = self.state.offsets.query(topic, group, queue_id)
        if include_staged:
            key = offset_key(topic, group)
            for pending in self._pending_tables():
                staged = pending.get(key, {}).get(queue_id)
                if staged is not None and (best is None or staged > best):
                    best = staged
        return best

    def _pending_tables(self) -> list[dict]:
        """Offsets acknowledged on this leader but not yet applied: the
        staged ones and those of the flush in flight."""
        return [self._staged.table, *(flush.table for flush in self._flushing)]

    def offset_table(self, topic: str, group: str) -> dict[int, int]:
        return self.state.offsets.table_of(topic, group)

    def delay_offset(self, level: int) -> int | None:
        """The schedule service's committed next offset of a delay level."""
        return self.state.delay_offsets.get(level)

    @property
    def timer_progress(self):
        """The timer service's replicated progress (tables.TimerProgress)."""
        return self.state.timer

    def broker_addr_of(self, self_id: str | None) -> str | None:
        """The broker address a member announced when it last led."""
        return self.state.broker_addrs.get(self_id) if self_id else None

    def min_retained_index(self) -> int:
        """The lowest log index retention must keep: entries below it are in
        the durable snapshot.  0 until a snapshot is written."""
        return max(self.persisted_index + 1, 0)

    async def wait_applied(self, index: int, timeout: float = math.inf) -> int:
        return await self.applier.wait_applied(index, timeout)

    async def leader_barrier(self, timeout: float = math.inf) -> int:
        """Wait until the tables include every entry the log held when this
        was called (on election: every entry of earlier terms, so every
        entry they committed).  Returns the applied index."""
        return await self.applier.wait_applied(self.store.end_index, timeout)

    # --- writes (leader) ---------------------------------------------------------

    def _check_leader(self) -> None:
        if self.write_gate is not None:
            self.write_gate.check_writable()
        if not self.node.is_leader:
            raise self.node.leader_error()

    def encode(self, op) -> bytes:
        """The record carrying `op` (for callers that append it together
        with their own records, e.g. the schedule service)."""
        return encode_op(op, timestamp_ms=self.clock_ms(), host=self.config.store_host)

    def delay_offset_record(self, table: dict[int, int]) -> bytes:
        return self.encode(DelayOffsetCommit(table))

    def timer_done_record(self, offsets, batch=()) -> bytes:
        return self.encode(TimerDone(tuple(offsets), tuple(batch)))

    async def announce_leader(self, self_id: str, broker_addr: str) -> int:
        """Record this leader's broker address (called by the role gate
        before it opens, hence not gated).  Returns the log index."""
        if not self.node.is_leader:
            raise self.node.leader_error()
        return await self._append([BrokerAnnounce(self_id, broker_addr)], gated=False)

    async def import_ops(self, ops) -> int:
        """Append ops in one batch before the role gate opens: the one-time
        import of a migrated master-slave store's tables (broker/
        migrated_store.py).  Leader only, not gated.  Returns the last
        op's log index."""
        if not self.node.is_leader:
            raise self.node.leader_error()
        return await self._append(list(ops), gated=False)

    async def _append(self, ops, *, gated: bool = True) -> int:
        if gated:
            self._check_leader()
        bodies = [self.encode(op) for op in ops]
        placed = await self.node.append(bodies)
        last = placed[-1][0]
        await self.applier.wait_applied(last)
        return last

    async def lock_queues(self, group: str, client_id: str, mqs, max_live_ms: int) -> set[tuple[str, int]]:
        """LOCK_BATCH_MQ: append the request and return the (topic, queueId)
        of `mqs` that `client_id` holds once it is applied (the applier,
        on every replica alike, decides who gets a contested queue)."""
        index = await self._append([QueueLockBatch(group=group, client_id=client_id, mqs=mqs, max_live_ms=max_live_ms)])
        del index
        locks = self.state.locks
        return {(t, q) for t, q in mqs if (lk := locks.locks.get((group, t, q))) is not None
                and lk.client_id == client_id}

    async def unlock_queues(self, group: str, client_id: str, mqs) -> int:
        return await self._append([QueueUnlockBatch(group, client_id, mqs)])

    async def update_topic(self, cfg: TopicConfig) -> int:
        """Create or replace a topic config; returns its log index."""
        if is_internal_topic(cfg.topic_name):
            raise InvalidMetadataError(f"{cfg.topic_name} is an internal topic")
        return await self._append([TopicUpsert(cfg)])

    async def delete_topic(self, topic: str, *, clean_offsets: bool = True) -> int:
        if is_internal_topic(topic):
            raise InvalidMetadataError(f"{topic} is an internal topic")
        if clean_offsets:
            self._drop_staged(lambda key: key.partition("@")[0] == topic)
        return await self._append([TopicDelete(topic, clean_offsets)])

    async def update_group(self, cfg: SubscriptionGroupConfig) -> int:
        return await self._append([GroupUpsert(cfg)])

    async def delete_group(self, group: str, *, clean_offsets: bool = True) -> int:
        if clean_offsets:
            self._drop_staged(lambda key: key.partition("@")[2] == group)
        return await self._append([GroupDelete(group, clean_offsets)])

    async def reset_offsets(self, topic: str, group: str, offsets: dict[int, int]) -> int:
        """Set queues to exactly these offsets (may move them back)."""
        key = offset_key(check_topic_name(topic), check_group_name(group))
        for table in self._pending_tables():
            staged = table.get(key)
            if staged is None:
                continue
            for qid in offsets:
                staged.pop(qid, None)
            if not staged:
                del table[key]
        return await self._append([OffsetReset({key: dict(offsets)})])

    def _drop_staged(self, doomed) -> None:
        for table in self._pending_tables():
            for key in [k for k in table if doomed(k)]:
                del table[key]

    def stage_offsets(self, commits) -> _Flush:
        """Stage commits for the next flush without waiting (UPDATE_CONSUMER_
        OFFSET is oneway); returns the flush handle commit_offsets waits on."""
        self._check_leader()
        table: dict = {}
        for c in commits:
            if not isinstance(c, OffsetCommitRequest):
                c = OffsetCommitRequest(*c)
            check_topic_name(c.topic)
            check_group_name(c.group)
            if not 0 <= c.queue_id < 1 << 31 or not 0 <= c.offset < 1 << 63:
                raise InvalidMetadataError(f"bad queue id / offset {c.queue_id}/{c.offset}")
            merge_offsets(table, {offset_key(c.topic, c.group): {c.queue_id: c.offset}})
        flush = self._staged
        merge_offsets(flush.table, table)
        self._flush_wanted.set()
        return flush

    async def commit_offsets(self, commits) -> int:
        """Stage commits [(topic, group, queueId, offset)] and wait until the
        record holding them is committed and applied; returns its index."""
        flush = self.stage_offsets(commits)
        await flush.done.wait()
        if flush.error is not None:
            raise flush.error
        return flush.index

    async def commit_offset(self, topic: str, group: str, queue_id: int, offset: int) -> int:
        return await self.commit_offsets([OffsetCommitRequest(topic, group, queue_id, offset)])

    def _offset_ops(self, table: dict) -> list[OffsetCommit]:
        ops, chunk, n = [], {}, 0
        for key, queues in table.items():
            for qid, offset in queues.items():
                chunk.setdefault(key, {})[qid] = offset
                n += 1
                if n == self.config.max_offsets_per_record:
                    ops.append(OffsetCommit(chunk))
                    chunk, n = {}, 0
        if chunk:
            ops.append(OffsetCommit(chunk))
        return ops

    async def flush_offsets(self) -> None:
        """Append everything staged now (also what the flusher task does)."""
        flush, self._staged = self._staged, _Flush()
        self._flushing.append(flush)
        try:
            ops = self._offset_ops(flush.table)  # encoded before the first await
            if ops:
                flush.index = await self._append(ops)
        except BaseException as exc:
            flush.error = exc if isinstance(exc, Exception) else FlushAbortedError()
            raise
        finally:
            self._flushing.remove(flush)
            flush.done.set()

    async def _offset_flusher(self) -> None:
        interval = self.config.offset_flush_interval_ms / 1000
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted = trio.Event()
            await trio.sleep(interval)  # the coalescing window, not a poll
            try:
                await self.flush_offsets()
            except Exception as exc:  # already handed to the waiters; nothing is retried
                log.warning("offset flush failed: %s", exc)

    # --- snapshots -----------------------------------------------------------------

    async def write_snapshot(self, *, force: bool = False) -> int:
        """Write the three config files (rendered on the trio thread, written
        and fsync'ed in a worker thread) if the tables moved since the last
        one; returns the durable snapshot's index."""
        async with self._snapshot_lock:
            state = self.state
            if state.applied_index <= self.persisted_index and not force:
                return self.persisted_index
            index = state.applied_index
            files = snapshot.render(state)
            await trio.to_thread.run_sync(snapshot.write_files, self.root, files)
            self.persisted_index = max(self.persisted_index, index)
            return index

    async def _snapshotter(self) -> None:
        while True:
            await trio.sleep(self.config.snapshot_interval_s)  # a timer, not a poll
            if self.applier.error is None and self.state.applied_index > self.persisted_index:
                try:
                    await self.write_snapshot()
                except OSError as exc:
                    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    # A full disk: the last snapshot stays valid (retention
                    # honours it); the next interval tries again.
                    log.error("metadata snapshot deferred: %s", exc)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The applier, the offset flusher and the snapshot timer; a final
        snapshot is written when cancelled (clean close)."""
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.applier.run)
                nursery.start_soon(self._offset_flusher)
                nursery.start_soon(self._snapshotter)
                task_status.started(self)
        finally:
            with trio.CancelScope(shield=True):
                self._fail_staged()
                if self.applier.error is None:
                    try:
                        await self.write_snapshot()
                    except OSError as exc:
                        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                            raise
                        log.error("final metadata snapshot skipped: %s", exc)

    def _fail_staged(self) -> None:
        flush, self._staged = self._staged, _Flush()
        if flush.table:
            flush.error = FlushAbortedError()
        flush.done.set()
