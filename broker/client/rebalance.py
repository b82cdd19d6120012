# Owns the pure parts of the push consumer's bookkeeping: queue allocation
# (AllocateMessageQueueAveragely) and ProcessQueue, the per-queue record of
# messages pulled but not yet consumed, which decides the offset that is
# safe to commit.  No IO here.
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

    @property
    def in_flight(self) -> int:
        return len(self._msgs)

    @property
    def commit_offset(self) -> int:
        return next(iter(self._msgs)) if self._msgs else self.next_offset

    def add(self, msgs: Sequence[MessageExt]) -> None:
        for m in msgs:
            self._msgs[m.queue_offset] = m

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
