# Owns the wiring between the commitlog store (commitlog.store.SegmentedStore)
# and dispatch: where the log begins and where its committed part ends, the
# engine opened on the store's data segments, the trio Dispatcher fed by the
# commit watermark, and the leader's queue offset table with its append
# hook.  The broker talks to consume queues and the index through this.
import logging
import os
from typing import Protocol

import attrs
import trio

from commitlog.entry import Entry
from commitlog.store import AppendHook
from commitlog.watermark import Watermark
from consumequeue.checkpoint import DispatchState
from consumequeue.dispatcher import NO_SPACE, DispatchConfig, DispatchEngine, Dispatcher, OpenReport
from consumequeue.queue_offsets import QueueOffsetTable
from consumequeue.source import CommitlogSource

log = logging.getLogger(__name__)


class DispatchedLog(Protocol):
    """What dispatch uses of the commitlog store (commitlog.store.SegmentedStore)."""

    @property
    def begin_index(self) -> int: ...

    @property
    def end_index(self) -> int: ...

    @property
    def end_pos(self) -> int: ...

    @property
    def committed_index(self) -> int: ...

    def get(self, index: int) -> Entry: ...

    def pos_of(self, index: int) -> int: ...

    def add_append_hook(self, fn: AppendHook) -> None: ...

    def remove_append_hook(self, fn: AppendHook) -> None: ...


@attrs.frozen
class StorePositions:
    begin_pos: int  # position of the first entry (or where the next one goes)
    committed_index: int
    committed_pos: int  # just after the committed entry


def entry_end(store: DispatchedLog, index: int) -> int:
    """Commitlog position just after entry `index` (the begin position when
    nothing at or before it is readable)."""
    if index < max(store.begin_index, 0) or index < 0:
        return begin_position(store)
    e = store.get(index)
    return e.pos + e.size


def begin_position(store: DispatchedLog) -> int:
    if 0 <= store.begin_index <= store.end_index:
        return store.pos_of(store.begin_index)
    return store.end_pos


def positions(store: DispatchedLog) -> StorePositions:
    c = store.committed_index
    return StorePositions(begin_position(store), c, entry_end(store, c))


def source_for(store, *, populate: bool = False) -> CommitlogSource:
    return CommitlogSource(os.path.join(store.store_dir, "data"), segment_size=store.data_segment_size,
                           populate=populate)


def raise_committed_from_dispatch(store, root: str) -> int:
    """Dispatched implies committed: only committed entries are ever
    dispatched, and Raft never truncates a committed entry.  The store's own
    committed index is checkpointed only every few seconds, so after a crash
    it can lag what consumers were already shown; raise it to the dispatch
    checkpoint's entry when the log still holds that entry at the same
    position.  Without this a restart would cut consume queues back and hide
    messages consumers had seen until the leader's next commit arrives."""
    try:
        state = DispatchState.load(root)
    except ValueError:
        return store.committed_index  # unreadable: open() rebuilds anyway
    if (state is not None and store.committed_index < state.index <= store.end_index
            and state.index >= max(store.begin_index, 0) and entry_end(store, state.index) == state.phy):
        store.set_committed(state.index)
    return store.committed_index


def open_engine(store, *, root: str | None = None, config: DispatchConfig | None = None,
                backend=None, populate: bool = False) -> tuple[DispatchEngine, OpenReport]:
    """An engine over the store's data segments, restarted per its
    checkpoint and truncated to the store's recovered committed position
    (after raising that to what was already dispatched)."""
    root = root or store.cfg.root
    raise_committed_from_dispatch(store, root)
    engine = DispatchEngine(root, source_for(store, populate=populate),
                            config=config, backend=backend)
    p = positions(store)
    report = engine.open(p.begin_pos, p.committed_pos, p.committed_index)
    return engine, report


def dispatch_committed(store, engine: DispatchEngine, *, progress=None) -> int:
    """Synchronously dispatch everything committed (offline tools, tests)."""
    return engine.dispatch_to(positions(store).committed_pos, progress=progress)


# How long a follower lets commits gather before it dispatches them (see
# Dispatcher.linger): its queues are read by no one until it leads, and
# become_leader dispatches at once from then on.
FOLLOWER_LINGER = 0.02


@attrs.define
class ConsumeQueueService:
    """Consume queues + index for one broker store: the dispatcher task, and
    on the leader the offset table whose hook stamps appended records."""

    store: DispatchedLog
    engine: DispatchEngine
    committed: Watermark
    dispatcher: Dispatcher = attrs.field(init=False)
    offsets: QueueOffsetTable = attrs.field(factory=QueueOffsetTable)
    _hooked: bool = False

    def __attrs_post_init__(self):
        def end_of(index: int) -> int | None:
            if self.engine.pos < begin_position(self.store):
                # The log was reset (or cut by retention) past what we have
                # dispatched and nobody told us: the entries are gone for good.
                self.on_log_reset()
            if index < max(self.store.begin_index, 0):
                return None
            return entry_end(self.store, index)

        self.dispatcher = Dispatcher(self.engine, self.committed, end_of)
        self.dispatcher.linger.set(FOLLOWER_LINGER)  # (every node starts as a follower)

    @classmethod
    def open(cls, store, committed: Watermark, *, root: str | None = None,
             config: DispatchConfig | None = None, backend=None) -> "ConsumeQueueService":
        engine, _ = open_engine(store, root=root, config=config, backend=backend)
        return cls(store, engine, committed)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The dispatcher task; on the way out it dispatches what a linger
        left (Dispatcher.finish) and checkpoints."""
        try:
            await self.dispatcher.run(task_status=task_status)
        finally:
            with trio.CancelScope(shield=True):
                await self.dispatcher.finish()

    def become_leader(self) -> None:
        """Rebuild the offset table (consume queues + the undispatched log
        tail) and start stamping appends."""
        self.offsets.rebuild_from_consume_queues(self.engine.cqs, self.engine.source, self.engine.pos,
                                                 self.store.end_pos)
        if not self._hooked:
            self.store.add_append_hook(self.offsets.append_hook)
            self._hooked = True
        self.hurry()

    def hurry(self) -> None:
        """Dispatch every commit at once from now on (a node that starts to
        lead: its catch-up waits for dispatch, and consumers wait on a
        leader's queues), ending a linger in progress."""
        self.dispatcher.linger.set(0.0)

    def on_retention(self) -> tuple[int, int]:
        """After the store deleted head segments: drop consume queue and
        index files that only point below the log's first position, and
        move each queue's min offset.  Returns (CQ files, index files).
        The source forgets its maps of the deleted segments, which would
        otherwise keep their disk space until evicted."""
        self.engine.source.refresh()
        return self.engine.delete_expired(begin_position(self.store))

    def on_log_reset(self) -> bool:
        """After the store was reset to a later begin (SegmentedStore.reset_to:
        the leader no longer had the entries this follower needed): drop
        everything consume queues and index hold below the new begin, move
        queue min offsets up to it while keeping their offsets, and restart
        dispatch at the new begin (DispatchEngine.rebase).  A queue left
        without a message keeps its offsets as pre-blank units until its
        next message.  Idempotent; runs on the trio thread between shell
        rounds (a dispatch or checkpoint in flight is abandoned).  Returns
        whether anything changed."""
        self.engine.source.reset()
        p = positions(self.store)
        changed = self.engine.rebase(p.begin_pos, p.committed_pos, p.committed_index,
                                     begin_index=max(self.store.begin_index, 0))
        self.dispatcher.rebased()
        return changed

    def become_follower(self) -> None:
        if self._hooked:
            self.store.remove_append_hook(self.offsets.append_hook)
            self._hooked = False
        self.dispatcher.linger.set(FOLLOWER_LINGER)

    def close(self) -> None:
        self.become_follower()
        try:
            self.engine.checkpoint()
        except OSError as exc:
            if exc.errno not in NO_SPACE:
                raise
            # A full disk at shutdown: the last durable checkpoint stands and
            # recovery redoes the rest from the log.
            log.error("final dispatch checkpoint skipped: %s", exc)
        self.engine.close()
