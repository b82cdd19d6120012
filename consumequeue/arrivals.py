# Owns waiting for one queue: "wake me when (topic, queueId) holds a unit at
# or after offset N" -- RocketMQ's PullRequestHoldService /
# notifyMessageArriving.  Long-polling pulls and the delay-level services
# park here instead of on the dispatched watermark, so a commit wakes only
# the waiters of the queues it touched, not every held pull and every delay
# level (waking them all took most of a one-message round's CPU).
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
        # (topic, queueId) -> {event: offset}: wake when max offset > offset.
        # A dict, not a list: thousands of waiters of one queue cancelled
        # together (a closed flood of long polls) each leave in O(1).
        self._waiting: dict[tuple[str, int], dict[trio.Event, int]] = {}

    @property
    def waiters(self) -> int:
        return sum(len(w) for w in self._waiting.values())

    async def wait_beyond(self, topic: str, queue_id: int, offset: int) -> None:
        """Return once the queue holds a unit at `offset` or later (its max
        offset exceeds `offset`), or after a reset(); callers re-check."""
        if self._max_offset(topic, queue_id) > offset:
            return
        key, event = (topic, queue_id), trio.Event()
        self._waiting.setdefault(key, {})[event] = offset
        try:
            await event.wait()
        finally:
            waiters = self._waiting.get(key)
            if waiters is not None and waiters.pop(event, None) is not None and not waiters:
                del self._waiting[key]

    def check(self) -> None:
        """After dispatch: wake the waiters whose queue moved past them."""
        if not self._waiting:
            return
        for key in list(self._waiting):
            waiters = self._waiting[key]
            top = self._max_offset(*key)
            woken = [event for event, offset in waiters.items() if top > offset]
            if not woken:
                continue
            for event in woken:
                del waiters[event]
                event.set()
            if not waiters:
                del self._waiting[key]

    def reset(self) -> None:
        """Wake every waiter (the queues were rebuilt or rebased)."""
        waiting, self._waiting = self._waiting, {}
        for waiters in waiting.values():
            for event in waiters:
                event.set()
