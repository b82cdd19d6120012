# Owns dispatch -- RocketMQ's ReputMessageService: turning committed
# commitlog bytes into ConsumeQueue units and IndexFile items.
#
# DispatchEngine is the synchronous core shared by the live dispatcher,
# the offline rebuild and the benchmark: it scans a byte range of the data
# segments with the native scanner (one C call per batch, no Python object
# per message), groups the records by queue, stages each queue's units
# across batches in C (one put_units per queue per STAGE_LIMIT bytes, not
# one per queue per batch) and inserts the index items in C.  It owns the
# restart logic: load the files, truncate them to min(checkpoint, committed
# position), compare them with the checkpointed state and fall back to a
# full rebuild when they disagree (missing or damaged consume queue files).
#
# Dispatcher is the trio task: it parks on the commit watermark (no
# polling), dispatches exactly up to the committed entry, publishes its own
# `dispatched` watermark for pull long-polling, and checkpoints on an
# interval and on close.  Only committed entries are ever dispatched, so a
# follower's truncated uncommitted tail never reaches a consume queue.  A
# leader dispatches every commit at once; a follower, whose queues nobody
# reads, lets commits gather for `linger` (service.FOLLOWER_LINGER) and
# dispatches them in one round.
import errno
import logging
import math
import os
import threading
import time

import attrs
import trio

from commitlog.linger import Linger
from commitlog.store import RELEASE_STEP
from commitlog.watermark import Watermark
from consumequeue import checkpoint as ck
from consumequeue.arrivals import QueueArrivals
from consumequeue.cq import DEFAULT_FILE_SIZE, ConsumeQueueStore
from consumequeue.errors import BadTopicError, DispatchError, InconsistentStateError
from consumequeue.files import sync_paths
from consumequeue.indexfile import DEFAULT_INDEX_NUM, DEFAULT_SLOT_NUM, IndexService
from consumequeue.record import DEFAULT_DELAY_LEVELS_MS
from consumequeue.source import CommitlogSource
from native.dispatch import (
    BAD_TEXT,
    ERR_TEXT,
    REC_BAD,
    STOP_BLANK,
    STOP_CORRUPT,
    STOP_END,
    STOP_FULL,
    STOP_NAMES,
    STOP_PARTIAL,
    default_backend,
)

log = logging.getLogger(__name__)

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)

BATCH_RECORDS = 8192  # ~8 MiB of 1 KiB messages per scan: still in cache for the index pass
STAGE_LIMIT = 64 << 10  # staged units per queue before they go to put_units (measured: 32-64 KiB best)


@attrs.define
class DispatchConfig:
    cq_file_size: int = DEFAULT_FILE_SIZE
    index_slot_num: int = DEFAULT_SLOT_NUM
    index_num: int = DEFAULT_INDEX_NUM
    index_enabled: bool = True  # messageIndexEnable
    batch_records: int = BATCH_RECORDS
    # messageDelayLevel: a SCHEDULE_TOPIC_XXXX unit's tags code is its
    # delivery time by this table (the broker passes its configured one).
    delay_levels_ms: tuple[int, ...] = DEFAULT_DELAY_LEVELS_MS


@attrs.define
class DispatchStats:
    entries: int = 0
    messages: int = 0
    bad_messages: int = 0
    bytes: int = 0
    skipped_topics: int = 0


@attrs.define
class OpenReport:
    """What open() found and did, for logs and mqadmin."""

    action: str  # "fresh", "resumed", "truncated", "rebuilt"
    position: int
    reason: str = ""


class DispatchEngine:
    def __init__(self, root: str, source: CommitlogSource, *, config: DispatchConfig | None = None,
                 backend=None):
        self.root = root
        self.source = source
        self.config = config or DispatchConfig()
        self.backend = backend or default_backend()
        self.cqs = ConsumeQueueStore(root, file_size=self.config.cq_file_size, backend=self.backend)
        self.index = IndexService(root, slot_num=self.config.index_slot_num,
                                  index_num=self.config.index_num, backend=self.backend)
        self.pos = 0  # next commitlog position to dispatch
        self._released_at = 0  # pos when the source last released what was read
        self.last_index = -1  # last dispatched entry index
        self.last_store_timestamp = 0
        self.stats = DispatchStats()
        self._recs = self.backend.new_records(self.config.batch_records)
        # Queues by the backend stage's queue ids (a BadTopicError for a
        # topic that cannot be dispatched).  The stage collects each queue's
        # units across scan batches during a dispatch_to call and is empty
        # outside one: put_units over the concatenation of contiguous runs
        # writes what one call per run would (a queue's units are in log
        # order, so only the first unit decides what is a duplicate).
        self._by_id: list = []
        self._stage = self.backend.new_stage()
        # Bumped whenever the dispatch position moves back or jumps (reset,
        # rebase): work planned against the old position must not land, and
        # a checkpoint snapshotted before it must not be written after it.
        self.generation = 0
        self._state_lock = threading.Lock()

    # --- open / restart -----------------------------------------------------

    def open(self, begin: int, committed_pos: int, committed_index: int) -> OpenReport:
        """Load consume queues and index, then bring them to a state a clean
        rebuild up to some position P <= committed_pos would produce, and
        resume from P.  `begin` is the position of the log's first entry;
        committed_pos is the end of entry committed_index."""
        os.makedirs(self.root, exist_ok=True)
        try:
            state = ck.DispatchState.load(self.root)
        except ValueError as exc:
            return self._rebuild_reset(begin, f"unreadable dispatch state ({exc})")
        self.cqs.load()
        try:
            self.index.load()
        except InconsistentStateError as exc:
            # A damaged index file (found by the consume queue fuzzer: a
            # truncated one was a ValueError out of the broker's start).
            return self._rebuild_reset(begin, exc.reason)
        if state is None:
            if self.cqs.queues or self.index.files:
                return self._rebuild_reset(begin, "consume queue files without a dispatch checkpoint")
            self.pos, self.last_index = begin, -1
            self.checkpoint()
            return OpenReport("fresh", begin)
        if self.cqs.problems():
            return self._rebuild_reset(begin, "; ".join(self.cqs.problems()))
        target = min(state.phy, committed_pos)
        self._forget_queues()
        self.cqs.truncate_phy(target)
        for (topic, qid), (want, first_phy) in state.queues.items():
            cq = self.cqs.get(topic, qid)
            if first_phy < 0 < want and (cq is None or cq.max_phy_end < 0):
                # A placeholder at the checkpoint whose first real units
                # came after it: they were cut, the numbering stays.
                self.cqs.get_or_create(topic, qid).make_placeholder(want)
        if self.config.index_enabled:
            self.index.truncate_phy(target, self.store_timestamp_of)
        try:
            self._check_against(state, exact=target == state.phy, limit=target)
        except InconsistentStateError as exc:
            return self._rebuild_reset(begin, exc.reason)
        self.pos = target
        self.last_index = state.index if target == state.phy else committed_index
        if target < begin:
            # The log was reset past what we dispatched (reset_to, perhaps
            # while we were down): the same as ConsumeQueueService.on_log_reset.
            self.rebase(begin, committed_pos, committed_index, begin_index=None)
            log.info("dispatch rebased to commitlog position %d (log reset past %d)", self.pos, target)
            return OpenReport("rebased", self.pos, f"dispatch position {target} is below the first "
                                                   f"commitlog position {begin}")
        for cq in self.cqs.queues.values():
            cq.correct_min_offset(begin)  # retention may have moved the log's start
        self.checkpoint()
        action = "resumed" if target == state.phy else "truncated"
        log.info("dispatch %s at commitlog position %d", action, target)
        return OpenReport(action, target)

    def rebase(self, begin: int, committed_pos: int, committed_index: int, *,
               begin_index: int | None) -> bool:
        """The log now starts at `begin` and everything below it is gone for
        good on this node (a follower's store reset to a later begin).
        Bring consume queues and index to what a clean rebuild of the log
        from `begin` up to some P <= committed_pos writes, keeping every
        queue's offsets (ConsumeQueue.rebase), and resume from P.  The index
        cannot drop items, so an index holding any item below `begin` is
        deleted and P = begin (the queues skip the re-dispatched units).
        `begin_index` is the index of the entry at `begin` (None: unknown,
        the entry checks then restart at the first entry dispatched).
        Idempotent; returns whether anything changed."""
        with self._state_lock:
            self.generation += 1  # a checkpoint already snapshotted stays unwritten
        self.cqs.write_pending()
        self._forget_queues()
        index_ok = not self.config.index_enabled or all(
            f.header.index_count <= 1 or f.header.begin_phy_offset >= begin for f in self.index.files[:1])
        target = max(min(self.pos, committed_pos), begin) if index_ok else begin
        changed = target != self.pos
        changed |= self.cqs.truncate_phy(target) > 0
        changed |= self.cqs.rebase(begin) > 0
        if not index_ok:
            self.index.destroy()
            changed = True
        elif self.config.index_enabled and target < self.pos:
            self.index.truncate_phy(target, self.store_timestamp_of)
        if target == begin:
            if begin_index is not None:
                self.last_index = begin_index - 1
            elif target != self.pos:
                self.last_index = -1
        elif target != self.pos:
            self.last_index = committed_index
        self.pos = target
        self.checkpoint()
        return changed

    def _check_against(self, state: ck.DispatchState, *, exact: bool, limit: int) -> None:
        have = self.cqs.max_offset_table()
        for key, (want, first_phy) in state.queues.items():
            got = have.get(key)
            if got is None:
                if not exact and first_phy >= limit:
                    continue  # every unit it had pointed at or beyond the cut
                raise InconsistentStateError(f"consume queue {key[0]}/{key[1]} is missing")
            if got > want or (exact and got != want):
                raise InconsistentStateError(f"consume queue {key[0]}/{key[1]} ends at {got}, "
                                             f"checkpoint says {want}")
        for key in have:
            if key not in state.queues:
                raise InconsistentStateError(f"consume queue {key[0]}/{key[1]} is not in the checkpoint")
        if not exact:
            for key, cq in self.cqs.queues.items():
                self._check_last_unit(cq)
        if self.config.index_enabled:
            files = self.index.file_counts()
            want_files = state.index_files
            if exact and files != want_files:
                raise InconsistentStateError(f"index files {files} differ from checkpoint {want_files}")
            if not exact and [n for n, _ in files] != [n for n, _ in want_files][:len(files)]:
                raise InconsistentStateError("index files differ from the checkpoint")

    def _check_last_unit(self, cq) -> None:
        """After a truncation: the queue's last unit must point at its own
        message (topic, queue id and queue offset read from the commitlog)."""
        from consumequeue.record import MessageFormatError, decode
        u = cq.get_unit(cq.max_offset - 1)
        try:
            rec = decode(self.source.read(u.phy, u.size))
        except (KeyError, MessageFormatError) as exc:
            raise InconsistentStateError(f"consume queue {cq.topic}/{cq.queue_id} last unit: {exc}")
        if (rec.topic, rec.queue_id, rec.queue_offset) != (cq.topic, cq.queue_id, u.offset):
            raise InconsistentStateError(f"consume queue {cq.topic}/{cq.queue_id} unit {u.offset} "
                                         f"points at a message of {rec.topic}/{rec.queue_id}@{rec.queue_offset}")

    def _rebuild_reset(self, begin: int, reason: str) -> OpenReport:
        log.warning("rebuilding consume queues and index from commitlog position %d: %s", begin, reason)
        self.reset(begin)
        return OpenReport("rebuilt", begin, reason)

    def reset(self, begin: int) -> None:
        """Delete every consume queue, index file and checkpoint; dispatch will
        start again at `begin` (a full rebuild)."""
        with self._state_lock:
            self.generation += 1
        self._forget_queues()
        self.cqs.destroy()
        self.index.destroy()
        ck.remove_all(self.root)
        self.pos, self.last_index = begin, -1
        self.checkpoint()

    # --- dispatch -------------------------------------------------------------

    def dispatch_to(self, end_pos: int, *, max_bytes: int | None = None, progress=None) -> int:
        """Dispatch committed bytes [pos, end_pos) (stopping early after about
        max_bytes).  Returns the bytes advanced."""
        started = self.pos
        try:
            self._dispatch_loop(end_pos, math.inf if max_bytes is None else started + max_bytes,
                                progress)
        finally:
            self._flush_stage()
        self.cqs.write_pending()  # dispatched units are readable once this returns
        if self.pos >= self._released_at + RELEASE_STEP:
            self._released_at = self.pos
            self.source.release_below(self.pos - RELEASE_STEP // 2)
        return self.pos - started

    def apply_scanned(self, view, res) -> None:
        """Apply a scan result made elsewhere (a Spark executor ran the same
        native scanner over `view`) exactly as dispatch_to would: grouping,
        CQ staging and index insertion, in log order.  The caller moves
        pos/last_index; flush_scanned() after the last result."""
        self._apply(view, res)

    def flush_scanned(self) -> None:
        """Hand over what apply_scanned staged; the units become readable."""
        self._flush_stage()
        self.cqs.write_pending()

    def _take_stage(self, sid: int) -> None:
        cq = self._by_id[sid]
        if not isinstance(cq, BadTopicError):  # (a bad topic's runs are never staged)
            self.backend.stage_take(self._stage, sid, cq.put_units)

    def _flush_stage(self) -> None:
        for sid in range(len(self._by_id)):
            self._take_stage(sid)
        self.backend.stage_trim(self._stage)

    def _forget_queues(self) -> None:
        """Drop the cached queue objects (and the stage, empty here)."""
        self._stage = self.backend.new_stage()
        self._by_id = []

    def _dispatch_loop(self, end_pos: int, limit, progress) -> None:
        while self.pos < end_pos and self.pos < limit:
            try:
                seg_end = self.source.segment_end(self.pos)
            except KeyError:
                raise DispatchError(self.pos, "no commitlog segment holds this position") from None
            stop_at = min(end_pos, seg_end)
            view = self.source.view(self.pos, stop_at)
            try:
                res = self.backend.scan(view, self.pos, self._recs, mode=self.source.mode,
                                        expect_index=self.last_index + 1 if self.last_index >= 0 else -1,
                                        delay_levels=self.config.delay_levels_ms)
                self._apply(view, res)
            finally:
                view.release()
            self.pos += res.consumed
            self.stats.entries += res.entries
            self.stats.bytes += res.consumed
            if res.entries:
                self.last_index = res.last_index
            if res.stop == STOP_BLANK or (res.stop == STOP_END and self.pos == seg_end):
                self.stats.bytes += seg_end - self.pos
                self.pos = seg_end
            elif res.stop == STOP_CORRUPT:
                raise DispatchError(self.pos,
                                    ERR_TEXT.get(res.err_code, f"error {res.err_code}"))
            elif res.stop not in (STOP_END, STOP_FULL):
                what = STOP_NAMES[res.stop]
                raise DispatchError(self.pos, f"committed range ends inside an entry ({what})"
                                    if res.stop == STOP_PARTIAL else f"unexpected {what} data")
            if progress is not None:
                progress(self.pos)

    def _apply(self, view, res) -> None:
        if res.n == 0:
            return
        self.stats.messages += res.n
        if res.bad:
            self._log_bad(res)
        g = self.backend.group(view, res)
        # The runs go into the backend's stage, one per queue, which hands
        # them over in pieces of STAGE_LIMIT bytes; only the runs it cannot
        # stage come back (a queue's first run, offsets that jump, repeat
        # or do not continue the stage) and go the direct way.
        uview, need = self.backend.cq_pack_stage(view, res, g, self._stage, STAGE_LIMIT)
        by_id = self._by_id
        for why, sid, (q0, qid, toff, tlen, count, run, _, start) in need:
            if sid == len(by_id):  # first sight of this queue
                raw_topic = bytes(view[toff:toff + tlen])
                try:
                    cq = self.cqs.get_or_create(raw_topic.decode("utf-8", "replace"), qid)
                except BadTopicError as exc:
                    cq = exc
                    self.backend.stage_set_bad(self._stage, sid)
                by_id.append(cq)
            cq = by_id[sid]
            self._take_stage(sid)
            if why:
                continue  # staged; the stage reached its limit and went out
            if isinstance(cq, BadTopicError):
                self.stats.skipped_topics += count
                log.error("not dispatching %d messages: %s", count, cq)
                continue
            chunk = uview[start * 20:(start + count) * 20]
            if run == count:
                cq.put_units(q0, chunk)
            else:  # queue offsets jump or repeat inside the batch: unit by unit
                for k, i in enumerate(self.backend.order_slice(g, start, start + count)):
                    cq.put_units(res.record(i).queue_offset, chunk[k * 20:(k + 1) * 20])
        if self.config.index_enabled:
            self.index.put_batch(view, res)
        self.last_store_timestamp = res.store_timestamp(res.n - 1)

    def _log_bad(self, res) -> None:
        self.stats.bad_messages += res.bad
        for i in range(res.first_bad, res.n):
            r = res.record(i)
            if r.flags & REC_BAD:
                log.error("skipping malformed message in entry %d at commitlog position %d: %s",
                          r.entry_index, r.phy_offset, BAD_TEXT.get(r.bad_reason, r.bad_reason))

    # --- checkpoint / retention -------------------------------------------------

    def checkpoint(self) -> None:
        """Make everything dispatched so far durable, then record it."""
        self.prepare_checkpoint()()

    def prepare_checkpoint(self):
        """Snapshot what a checkpoint records and hand back the part that
        only syncs and writes files: it touches no engine state, so the
        live dispatcher runs it in a worker thread while readers go on."""
        self.cqs.write_pending()
        files, dirs = self.cqs.fds.take_dirty()
        index_fds = []
        if self.config.index_enabled:
            for f in self.index.files:
                f.write_header()
                index_fds.append(os.dup(f.fd))
            if self.index.files:
                dirs.append(self.index.dir)
            # created files / the index dir itself (children before parents)
            dirs = sorted(set(dirs) | set(self.index.take_dirty_dirs()), key=len, reverse=True)
        state = ck.DispatchState(phy=self.pos, index=self.last_index, queues=self.cqs.queue_table(),
                                 index_files=self.index.file_counts() if self.config.index_enabled else [])
        full = [f for f in self.index.files if f.is_full]
        ts = self.last_store_timestamp
        point = ck.StoreCheckpoint(physic_msg_timestamp=ts, logics_msg_timestamp=ts,
                                   index_msg_timestamp=full[-1].header.end_timestamp if full else 0,
                                   dispatched_phy_offset=self.pos, dispatched_index=self.last_index)
        root, generation = self.root, self.generation

        def run() -> None:
            try:
                sync_paths(files, dirs)
                for fd in index_fds:
                    os.fsync(fd)  # covers the pages dirtied through the shared map
            finally:
                for fd in index_fds:
                    os.close(fd)
            with self._state_lock:
                if generation != self.generation:
                    return  # rebased meanwhile: that wrote a newer state
                state.store(root)
                point.store(root)

        return run

    # --- queries -------------------------------------------------------------

    def store_timestamp_of(self, phy: int, size: int = 0) -> int | None:
        try:
            return self.source.store_timestamp_at(phy)
        except KeyError:  # deleted by retention
            return None

    def offset_by_time(self, topic: str, queue_id: int, timestamp: int, boundary: str = "lower") -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP over one consume queue (0 if none)."""
        cq = self.cqs.get(topic, queue_id)
        return cq.offset_by_time(timestamp, self.store_timestamp_of, boundary=boundary) if cq else 0

    def query_by_key(self, topic: str, key: str, max_num: int, begin: int, end: int):
        """QUERY_MESSAGE: commitlog positions whose key hash matches (callers
        compare the actual keys: the index stores hashes only)."""
        return self.index.query(topic, key, max_num, begin, end)

    def delete_expired(self, min_phy: int) -> tuple[int, int]:
        """After retention removed commitlog below `min_phy`: drop the consume
        queue and index files that only point below it."""
        return self.cqs.delete_expired(min_phy), self.index.delete_expired(min_phy)

    def close(self) -> None:
        self.cqs.close()
        self.index.close()


class Dispatcher:
    """The reput service as a trio task over a DispatchEngine."""

    def __init__(self, engine: DispatchEngine, committed: Watermark, end_of_index, *,
                 checkpoint_interval: float = 1.0, chunk_bytes: int = 4 << 20):
        self.engine = engine
        self.committed = committed
        # index -> commitlog position just after that entry, or None when the
        # entry is below the log's first one
        self.end_of_index = end_of_index
        self.checkpoint_interval = checkpoint_interval
        self.chunk_bytes = chunk_bytes
        self.dispatched = Watermark(engine.last_index)  # how far dispatch got
        # Per-queue waiters (long-polling pulls, delay levels): woken only
        # when their queue moved, checked after every dispatch step.
        self.arrivals = QueueArrivals(self._max_offset)
        self.checkpointed = Watermark(engine.last_index)  # durable dispatch progress
        self._last_checkpoint = time.monotonic()
        self._checkpointed_pos = engine.pos
        # Seconds to let commits gather after one arrives before dispatching
        # them together (0: at once).  A follower's consume queues serve no
        # one until it leads, so it dispatches in batches (FOLLOWER_LINGER,
        # set by ConsumeQueueService) instead of paying a dispatch round for
        # every commit while the leader waits for CPU on the same cores.
        self.linger = Linger()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            # Park on the commit watermark; with work not yet checkpointed,
            # wake after one interval of quiet to checkpoint it.
            stale = self.engine.pos != self._checkpointed_pos
            try:
                committed = await self.committed.wait_for(
                    self.engine.last_index + 1, timeout=self.checkpoint_interval if stale else math.inf)
            except trio.TooSlowError:
                await self.checkpoint()
                continue
            if self.linger.seconds > 0:
                await self.linger.wait()
                committed = self.committed.value
            await self.dispatch_through(committed)

    async def dispatch_through(self, index: int) -> None:
        """Dispatch every entry up to and including `index` (committed)."""
        end = self.end_of_index(index)
        if end is None:  # below the log's first entry (retention, reset_to): nothing to do
            self.engine.last_index = max(self.engine.last_index, index)
            self.dispatched.advance(index)
            self.arrivals.check()
            return
        generation = self.engine.generation
        while self.engine.pos < end:
            self.engine.dispatch_to(end, max_bytes=self.chunk_bytes)
            await trio.lowlevel.checkpoint()  # let other tasks run between chunks
            if self.engine.generation != generation:
                return  # the log was reset meanwhile: `end` is of the old log
        if self.engine.last_index != index:
            raise DispatchError(end, f"dispatched through entry {self.engine.last_index}, "
                                     f"expected the committed entry {index}")
        self.dispatched.advance(index)
        self.arrivals.check()
        if time.monotonic() - self._last_checkpoint >= self.checkpoint_interval:
            await self.checkpoint()

    async def finish(self) -> None:
        """On the way out (shielded by the caller): dispatch what is
        committed when it is at most one chunk -- what a linger left, so a
        stopped follower's queues end where its log's committed part ends
        -- then checkpoint.  More than that is left to the next start's
        recovery, as after a crash."""
        committed = self.committed.value
        if committed > self.engine.last_index:
            end = self.end_of_index(committed)
            if end is not None and end - self.engine.pos <= self.chunk_bytes:
                try:
                    await self.dispatch_through(committed)
                except (DispatchError, OSError) as exc:
                    log.error("dispatch through entry %d on the way out failed: %s", committed, exc)
        await self.checkpoint()

    async def checkpoint(self) -> None:
        if self.engine.pos != self._checkpointed_pos:
            pos, index, generation = self.engine.pos, self.engine.last_index, self.engine.generation
            # fsyncs off the event loop; the snapshot was taken here, so the
            # engine may move on meanwhile.
            try:
                await trio.to_thread.run_sync(self.engine.prepare_checkpoint())
            except OSError as exc:
                if exc.errno not in NO_SPACE:
                    raise
                # A full disk: the last durable checkpoint stays (recovery
                # redoes the rest from the log); try again next interval.
                log.error("dispatch checkpoint at entry %d deferred: %s", index, exc)
                self._last_checkpoint = time.monotonic()
                return
            if self.engine.generation == generation:
                self._checkpointed_pos = pos
                self.checkpointed.advance(index)
        self._last_checkpoint = time.monotonic()

    def rebased(self) -> None:
        """After the engine was rebased (and checkpointed) synchronously."""
        self._checkpointed_pos = self.engine.pos
        self.dispatched.advance(self.engine.last_index)
        self.checkpointed.advance(self.engine.last_index)
        self.arrivals.reset()  # every queue may have moved: waiters re-read

    def _max_offset(self, topic: str, queue_id: int) -> int:
        cq = self.engine.cqs.get(topic, queue_id)
        return -1 if cq is None else cq.max_offset
