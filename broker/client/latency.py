# Owns the producer's latency fault tolerance (RocketMQ's MQFaultStrategy,
# sendLatencyFaultEnable): which broker groups a send should avoid right
# now.  With many groups behind one name server, a group whose master is
# failing over would otherwise take (and fail, and retry) its share of every
# round-robin turn until its new master registers; marking it avoided for a
# while sends that share to the other groups instead.
#
# Rules (Java's, with durations fitted to ledgermq's sub-second failover;
# Java isolates a failed broker for 10 minutes, which is why it ships the
# feature off):
#   * a send that FAILED (connection refused or lost, timeout, not the
#     master) avoids its group for `isolation` seconds;
#   * a send that succeeded slowly avoids its group for a time that grows
#     with its latency (LATENCY_STEPS: >= 550 ms -> 1 s, ... >= 15 s -> 30 s);
#   * a group whose master address changed in the route (the failover
#     finished) is not avoided any more;
#   * if every group is avoided, the one that becomes available first is
#     used (Java's pickOneAtLeast): avoiding never blocks a send.
# Time comes from the caller (time.monotonic(), cheaper to read than the
# event loop's clock), so this is plain code.
import attrs

# (latency at least, avoid for), seconds; the first matching row from the end.
LATENCY_STEPS: tuple[tuple[float, float], ...] = ((0.55, 1.0), (1.0, 2.0), (2.0, 4.0), (3.0, 6.0), (15.0, 30.0))
DEFAULT_ISOLATION = 2.0


@attrs.define
class FaultItem:
    until: float        # avoided before this time
    latency: float      # the latency (or isolation) that decided it
    master: str | None  # the master address it was measured against


@attrs.define
class LatencyFaultTolerance:
    enabled: bool = True
    isolation: float = DEFAULT_ISOLATION
    items: dict[str, FaultItem] = attrs.Factory(dict)

    def record(self, broker_name: str, latency: float, failed: bool, now: float, master: str | None) -> None:
        """The outcome of one send attempt to `broker_name` (whose master was
        `master`) that took `latency` seconds."""
        if not self.enabled:
            return
        avoid = self.isolation if failed else 0.0
        if not failed:
            for threshold, duration in LATENCY_STEPS:
                if latency >= threshold:
                    avoid = duration
        if avoid <= 0:
            self.items.pop(broker_name, None)
            return
        self.items[broker_name] = FaultItem(now + avoid, latency, master)

    def available(self, broker_name: str, now: float, master: str | None = None) -> bool:
        item = self.items.get(broker_name)
        if item is None:
            return True
        if now >= item.until or (master is not None and item.master is not None and master != item.master):
            del self.items[broker_name]      # expired, or a new master took over
            return True
        return False

    def choose(self, queues: list, now: float, master_of) -> list:
        """The queues of groups not avoided now; if none, those of the group
        that is available soonest.  `master_of(broker_name)` is the route's
        master address."""
        if not self.enabled or not self.items:
            return queues
        ok = [q for q in queues if self.available(q.broker_name, now, master_of(q.broker_name))]
        if ok or not queues:
            return ok
        soonest = min({q.broker_name for q in queues}, key=lambda b: self.items[b].until)
        return [q for q in queues if q.broker_name == soonest]
