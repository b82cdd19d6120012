# Owns what becomes of each append (AppendRequest) once the shell took it:
# positions assigned as its write lands, released in one sweep when the
# commit covers it, failed when it times out, when a later leader's
# truncation or a reset removes it, or when the node stops; each outcome
# handed over once -- to the waiter parked in wait() or to the request's
# on_done callback, whose failure is logged, never the driver's.  A mixin of
# ReplicaNode (replica.py): it works on the node's own queues.
import collections
import logging

import trio

from commitlog.appends import AppendRequest
from commitlog.errors import QuorumTimeoutError, TermChangedError

log = logging.getLogger("ledgermq.replica")


class AppendResults:
    def _expire(self, now: float) -> None:
        # Deadlines grow along both queues (call order, one timeout), so
        # only expired heads are visited.  A committed head is the driver's
        # to release (it may be yielding between commit and release).
        waiting = self._waiting
        committed = self.committed.value
        while waiting and waiting[0].deadline <= now and waiting[0].last_index > committed:
            self._time_out(waiting.popleft())
        for r in self._proposals:  # normally empty: the driver drains it every round
            if r.deadline > now:
                break
            self._time_out(r)

    def _time_out(self, r: AppendRequest) -> None:
        if not r.done:
            self.stats["quorum_timeout"] += 1
            self._resolve(r, QuorumTimeoutError(r.last_index, self.max_wait_ack_ms))

    def _resolve(self, r: AppendRequest, error: BaseException | None = None) -> None:
        """Hand the outcome to the request (once; later calls no-op) and
        wake its waiter if one is parked."""
        if not r.done:
            r.done, r.error = True, error
            self._pending_entries -= len(r.bodies)
            if r.task is not None:
                task, r.task = r.task, None
                trio.lowlevel.reschedule(task)
            elif r.on_done is not None:
                _notify(r)

    def _assign_positions(self, first_index: int, placed: list[tuple[int, int]], stamps) -> None:
        # Requests wait in index order; those of this write are at the tail.
        for r in reversed(self._waiting):
            if r.first_index < first_index:
                break
            r.placed, r.offset, r.stamps = placed, r.first_index - first_index, stamps

    def _release(self, commit: int) -> None:
        # Hot path: every waiter whose entries are all committed, inline.
        waiting = self._waiting
        reschedule = trio.lowlevel.reschedule
        released = 0
        limit = commit + 1
        term = self.core.term
        while waiting:
            r = waiting[0]
            n = len(r.bodies)
            if r.first_index + n > limit:
                break
            waiting.popleft()
            if r.term != term and not r.done and self.log.term_at(r.last_index) != r.term:
                # Held across a leader change (_fail_written_from fails those a
                # truncation removes; this is the check that cannot be skipped).
                self._resolve(r, TermChangedError(r.term, term))
                continue
            if not r.done:
                r.done = True
                released += n
                task = r.task
                if task is not None:
                    r.task = None
                    reschedule(task)
                elif r.on_done is not None:
                    self._pending_entries -= released  # (a callback may look at the log's state)
                    released = 0
                    _notify(r)
        self._pending_entries -= released

    def _fail_all(self, exc: BaseException) -> None:
        for r in list(self._waiting) + self._proposals:
            self._resolve(r, exc)
        self._waiting = collections.deque()
        self._proposals = []

    def _fail_proposals(self, exc: BaseException) -> None:
        for r in self._proposals:
            self._resolve(r, exc)
        self._proposals = []

    def _fail_written_from(self, index: int, why: str) -> None:
        """The log no longer holds entries from `index` on (truncated by a
        later leader, or reset): their waiters fail with TermChangedError;
        nothing of theirs can commit any more."""
        waiting = self._waiting
        while waiting and waiting[-1].last_index >= index:
            r = waiting.pop()
            self.stats["held_appends_lost"] += 1
            self._resolve(r, TermChangedError(r.term, self.core.term))
        if why:
            log.debug("%s: appends from entry %d failed: %s", self.node_id, index, why)


def _notify(r: AppendRequest) -> None:
    """Hand a resolved request to its on_done callback (AppendRequest): a
    failing callback is the caller's bug and must not stop the driver."""
    try:
        r.on_done(r)
    except Exception:
        log.exception("an append's completion callback failed")
