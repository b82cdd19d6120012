# Owns the "committed >= N" wait primitive.  Producers of progress (the Raft
# shell, a local store in tests) call advance(); consumers (append callers,
# the dispatcher, long-polling pulls) await wait_for(n).  No polling: waiters
# park on one shared trio.Event that is replaced on every advance.
import math

import attrs
import trio


@attrs.define
class Watermark:
    """A monotonically increasing integer that tasks can wait on."""

    value: int = -1
    _changed: trio.Event = attrs.field(factory=trio.Event, init=False)
    _closed: BaseException | None = attrs.field(default=None, init=False)

    def advance(self, value: int) -> None:
        """Raise the watermark (never lowers it) and wake every waiter."""
        if value > self.value:
            self.value = value
            self._wake()

    def close(self, exc: BaseException) -> None:
        """Fail current and future waiters with `exc` (e.g. lost leadership)."""
        self._closed = exc
        self._wake()

    def reopen(self) -> None:
        self._closed = None

    def _wake(self) -> None:
        event, self._changed = self._changed, trio.Event()
        event.set()

    async def wait_for(self, target: int, timeout: float = math.inf) -> int:
        """Return the watermark once it is >= target.  Raises trio.TooSlowError
        after `timeout` seconds, or the close() exception."""
        if self.value >= target:
            return self.value
        if timeout == math.inf:  # the usual case: no cancel scope to set up and tear down
            return await self._wait(target)
        with trio.fail_after(timeout):
            return await self._wait(target)

    async def _wait(self, target: int) -> int:
        while self.value < target:
            if self._closed is not None:
                raise self._closed
            await self._changed.wait()
        return self.value

    async def wait_changed(self, seen: int) -> int:
        """Wait until the value differs from `seen` (for tasks that follow
        every step, like the dispatcher)."""
        return await self.wait_for(seen + 1)
