# Owns the values the Raft shell (replica.py) hands out: one replicated
# append from submit() to its resolution (AppendRequest), and a leader
# whose entries a follower refused to place (RefusedLeader).
from collections.abc import Callable, Sequence

import attrs
import trio


@attrs.define(eq=False)
class AppendRequest:
    """One append, from submit() until it is resolved -- released on commit,
    failed, timed out, or abandoned by a cancelled waiter -- exactly once:
    `done` turns True there, and that is where its entries leave the
    pending count.  `task` is the waiter parked in wait(), if one is (with
    trio.lowlevel.wait_task_rescheduled rather than an Event and a cancel
    scope: at tens of thousands of appends per second those were most of
    the append path's cost).  Instead of a waiter, a request may carry
    `on_done`: called with the request, once, synchronously, by the task
    that resolves it (the log's driver on commit), so a caller can answer
    without a task of its own waking up; it must not block, must not call
    back into the log, and its exceptions are logged and dropped."""

    bodies: Sequence[bytes]
    deadline: float  # trio time after which the caller gets QuorumTimeoutError
    task: trio.lowlevel.Task | None = None  # the waiter's, while parked
    on_done: Callable[["AppendRequest"], None] | None = None
    done: bool = False
    term: int = -1
    first_index: int = -1
    # The store's [(index, pos)] of the write holding these entries, and
    # where they start in it (no per-request copy until the caller asks);
    # the store hooks' per-entry stamps of that write (queue offsets), if any.
    placed: list | None = None
    stamps: Sequence[int] | None = None
    offset: int = 0
    error: BaseException | None = None

    @property
    def result(self) -> list[tuple[int, int]]:
        """[(index, pos)] of this request's entries (once resolved)."""
        return self.placed[self.offset:self.offset + len(self.bodies)]

    @property
    def stamped(self):
        """The stamps of this request's entries (None without a stamping hook)."""
        if self.stamps is None:
            return None
        return self.stamps[self.offset:self.offset + len(self.bodies)]

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.bodies) - 1


@attrs.frozen
class RefusedLeader:
    """A leader whose entries this follower could not place, and why."""

    leader: str
    term: int
    reason: str

    def to_json(self) -> dict:
        return {"leader": self.leader, "term": self.term, "reason": self.reason}
