# Owns the console's memory of the last minutes, as pure values: rates
# derived from the brokers' monotonic counters (RateTracker), a bounded
# window of samples for the charts (Window), and the term changes seen per
# broker group (TermLog).  Nothing here does IO or reads a clock: the
# sampler hands every value its timestamp, so the tests feed made-up times.
from collections import deque

import attrs


@attrs.define
class RateTracker:
    """Per-second rates of counters that only grow while their process
    lives.  A counter that went down belongs to a restarted process (a
    broker killed and started again): that interval has no rate."""

    _last: dict = attrs.Factory(dict)  # key -> (t_s, value)

    def rate(self, key, t_s: float, value: float) -> float | None:
        prev = self._last.get(key)
        self._last[key] = (t_s, value)
        if prev is None:
            return None
        dt, dv = t_s - prev[0], value - prev[1]
        if dt <= 0 or dv < 0:
            return None
        return dv / dt

    def forget_except(self, keys) -> None:
        """Drop the counters of brokers/topics that are gone (bounded memory)."""
        keep = set(keys)
        for k in [k for k in self._last if k not in keep]:
            del self._last[k]


@attrs.define
class Window:
    """Samples {"t": ms, ...} of the last `span_ms`, oldest first."""

    span_ms: int = 5 * 60 * 1000
    points: deque = attrs.Factory(deque)

    def add(self, point: dict) -> None:
        self.points.append(point)
        while self.points and self.points[0]["t"] < point["t"] - self.span_ms:
            self.points.popleft()

    def to_list(self) -> list[dict]:
        return list(self.points)


@attrs.define
class TermLog:
    """The changes of each group's term and leader, newest last, bounded."""

    limit: int = 50
    current: dict = attrs.Factory(dict)  # group -> (term, leader)
    changes: deque = attrs.Factory(deque)

    def observe(self, t_ms: int, group: str, term: int | None, leader: str | None) -> dict | None:
        """Record the group's (term, leader); the change event if either moved
        (the first sighting of a group is not a change).  Leaderless samples
        are skipped, so a failover reads "term 1 -> 2, leader n0 -> n1"."""
        if term is None or leader is None:
            return None  # no leader agreed on yet (an election under way): not a state to log
        prev = self.current.get(group)
        if prev is not None and term < prev[0]:
            return None  # a stale answer from a node that has not heard of the new term yet
        self.current[group] = (term, leader)
        if prev is None or prev == (term, leader):
            return None
        change = {"t": t_ms, "group": group, "fromTerm": prev[0], "toTerm": term,
                  "fromLeader": prev[1], "toLeader": leader}
        self.changes.append(change)
        while len(self.changes) > self.limit:
            self.changes.popleft()
        return change
