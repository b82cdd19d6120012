# Owns the pure parts of the push consumer's bookkeeping: queue allocation
# (AllocateMessageQueueAveragely) and ProcessQueue, the per-queue record of
# messages pulled but not yet consumed, which decides the offset that is
# safe to commit, and for orderly consumption the queue's broker lock and
# its one consume task's state.  No IO here.
from collections import OrderedDict
from collections.abc import Sequence

import attrs
import anyio
import anyio.abc

from broker.client.model import MessageExt, MessageQueue


def allocate_averagely(client_id: str, queues: Sequence[MessageQueue], client_ids: Sequence[str]) -> list[MessageQueue]:
    """AllocateMessageQueueAveragely: with queues and client ids sorted, the
    i-th client takes a contiguous run; the first `len(queues) % len(ids)`
    clients take one extra.  A client not in the list gets nothing."""
    queues, client_ids = sorted(queues), sorted(client_ids)
    if client_id not in client_ids or not queues:
        return []
    index, n, k = client_ids.index(client_id), len(queues), len(client_ids)
    mod = n % k
    if n <= k:
        size = 1
    elif mod > 0 and index < mod:
        size = n // k + 1
    else:
        size = n // k
    start = index * size if mod > 0 and index < mod else index * size + mod
    return [queues[(start + i) % n] for i in range(min(size, n - start))]


@attrs.define(eq=False)
class ProcessQueue:
    """Messages of one queue between pull and consume.  The commit offset is
    the oldest message still in flight (messages after it may be done, but
    committing past an unfinished one could lose it), or the next pull
    offset when nothing is in flight."""

    mq: MessageQueue
    next_offset: int = -1  # where the next pull starts; -1 until the start offset is known (never committed)
    broker_id: int = 0  # the node the broker suggested for the next pull
    committed: int = -1  # the last offset committed to the broker
    dropped: bool = False
    cancel_scope: anyio.CancelScope = attrs.Factory(anyio.CancelScope)
    _msgs: OrderedDict = attrs.Factory(OrderedDict)  # queue offset -> MessageExt, ascending
    _space: anyio.Event | None = None
    # Orderly consumption: the broker lock (held since lock_time, by the
    # client's clock) and the queue's one consume task.
    locked: bool = False
    lock_time: float = -1e18
    consuming: bool = False
    _lock_changed: anyio.Event = attrs.Factory(anyio.Event)
    _arrived: anyio.Event = attrs.Factory(anyio.Event)
    _idle: anyio.Event = attrs.Factory(anyio.Event)

    @property
    def in_flight(self) -> int:
        return len(self._msgs)

    @property
    def commit_offset(self) -> int:
        return next(iter(self._msgs)) if self._msgs else self.next_offset

    def add(self, msgs: Sequence[MessageExt]) -> None:
        for m in msgs:
            self._msgs[m.queue_offset] = m
        self._arrived.set()

    # --- orderly consumption ------------------------------------------------------

    def head(self, n: int) -> list[MessageExt]:
        """The n oldest messages in flight (offset order)."""
        out = []
        for m in self._msgs.values():
            if len(out) == n:
                break
            out.append(m)
        return out

    async def wait_messages(self) -> None:
        while not self._msgs and not self.dropped:
            self._arrived = anyio.Event()
            await self._arrived.wait()

    def set_locked(self, locked: bool, now: float) -> None:
        if locked:
            self.lock_time = now
        if locked != self.locked:
            self.locked = locked
            self._lock_changed.set()
            self._lock_changed = anyio.Event()

    def lock_valid(self, now: float, max_live: float) -> bool:
        """Held and renewed within max_live seconds (the client's bound is
        half the broker's, so the broker never frees a queue we still use)."""
        return self.locked and now - self.lock_time <= max_live

    async def wait_locked(self) -> None:
        while not self.locked and not self.dropped:
            await self._lock_changed.wait()

    def begin_consume(self) -> None:
        self.consuming = True
        self._idle = anyio.Event()

    def end_consume(self) -> None:
        self.consuming = False
        self._idle.set()

    async def wait_idle(self) -> None:
        if self.consuming:
            await self._idle.wait()

    def remove(self, msgs: Sequence[MessageExt]) -> None:
        for m in msgs:
            self._msgs.pop(m.queue_offset, None)
        if self._space is not None:
            self._space.set()
            self._space = None

    async def wait_below(self, limit: int) -> None:
        """Flow control: park until fewer than `limit` messages are in flight."""
        while len(self._msgs) >= limit and not self.dropped:
            if self._space is None:
                self._space = anyio.Event()
            await self._space.wait()

    def drop(self) -> None:
        self.dropped = True
        self.cancel_scope.cancel()
        if self._space is not None:
            self._space.set()
            self._space = None
        self._arrived.set()
        self._lock_changed.set()
