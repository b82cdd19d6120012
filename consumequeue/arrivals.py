# Owns waiting for one queue: "wake me when (topic, queueId) holds a unit at
# or after offset N" -- RocketMQ's PullRequestHoldService /
# notifyMessageArriving.  Long-polling pulls and the delay-level services
# park here instead of on the dispatched watermark, so a commit wakes only
# the waiters of the queues it touched, not every held pull and every delay
# level (18 tasks per commit before: most of a one-message round's CPU).
#
# The dispatcher calls check() after each dispatch step (the consume queues
# are complete then); it looks only at queues somebody waits on.  reset()
# wakes everyone (the queues were rebuilt or rebased: waiters re-read).
from collections.abc import Callable

import trio

# (topic, queueId) -> that queue's max offset (units it holds), or -1
MaxOffset = Callable[[str, int], int]


class QueueArrivals:
    def __init__(self, max_offset: MaxOffset) -> None:
        self._max_offset = max_offset
        # (topic, queueId) -> [(offset, event)]: wake when max offset > offset
        self._waiting: dict[tuple[str, int], list[tuple[int, trio.Event]]] = {}

    @property
    def waiters(self) -> int:
        return sum(len(w) for w in self._waiting.values())

    async def wait_beyond(self, topic: str, queue_id: int, offset: int) -> None:
        """Return once the queue holds a unit at `offset` or later (its max
        offset exceeds `offset`), or after a reset(); callers re-check."""
        if self._max_offset(topic, queue_id) > offset:
            return
        key, entry = (topic, queue_id), (offset, trio.Event())
        self._waiting.setdefault(key, []).append(entry)
        try:
            await entry[1].wait()
        finally:
            waiters = self._waiting.get(key)
            if waiters is not None and entry in waiters:
                waiters.remove(entry)
                if not waiters:
                    del self._waiting[key]

    def check(self) -> None:
        """After dispatch: wake the waiters whose queue moved past them."""
        if not self._waiting:
            return
        for key in list(self._waiting):
            waiters = self._waiting[key]
            top = self._max_offset(*key)
            if all(top <= offset for offset, _ in waiters):
                continue
            keep = []
            for offset, event in waiters:
                if top > offset:
                    event.set()
                else:
                    keep.append((offset, event))
            if keep:
                self._waiting[key] = keep
            else:
                del self._waiting[key]

    def reset(self) -> None:
        """Wake every waiter (the queues were rebuilt or rebased)."""
        waiting, self._waiting = self._waiting, {}
        for waiters in waiting.values():
            for _, event in waiters:
                event.set()
