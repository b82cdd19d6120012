# Owns BucketCounter, a histogram that costs one bisect and two additions
# per observation (prometheus_client's Histogram.observe takes a lock and
# several microseconds), and that takes a weight: the send path observes a
# whole burst at once, once per burst, with the burst's message count as
# the weight (every message of a burst waited as long as the burst).  The
# collector (broker/metrics.py) turns it into a HistogramMetricFamily at
# scrape time.
import bisect

import attrs

# Seconds: 0.5 ms .. 10 s, what a send or a pull takes on a healthy group
# (a quorum round trip on loopback is well under a millisecond) up to a
# quorum timeout.  The bounds hold RocketMQ 5's rocketmq_rpc_latency buckets
# (1, 3, 5, 7, 10, 100 ms, 1, 2, 3 s) and the exporter's
# PutMessageDistributeTime bands (10, 50, 100, 200, 500 ms, 1 .. 5, 10 s) as
# well, so those are read off the same counter (BucketCounter.coarsened)
# instead of being observed twice.
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.003, 0.005, 0.007, 0.01, 0.025, 0.05, 0.1, 0.2, 0.25, 0.5,
                     1.0, 2.0, 2.5, 3.0, 4.0, 5.0, 10.0)
RPC_LATENCY_BUCKETS_MS = (1, 3, 5, 7, 10, 100, 1000, 2000, 3000)  # RocketMQ 5's view of rocketmq_rpc_latency
# Bytes: RocketMQ 5's view of rocketmq_message_size.
MESSAGE_SIZE_BUCKETS = (1024, 4096, 512 * 1024, 1024 * 1024, 2 * 1024 * 1024, 4 * 1024 * 1024)
# Seconds from a message's store time to its delivery by a pull.
STORE_LAG_BUCKETS_S = (0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 600.0, 3600.0, 86400.0)


@attrs.define(eq=False)
class BucketCounter:
    bounds: tuple[float, ...] = LATENCY_BUCKETS_S
    counts: list[int] = attrs.field(init=False)  # one per bound, plus +Inf
    total: float = 0.0  # sum of value * weight
    count: int = 0

    def __attrs_post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, weight: int = 1) -> None:
        # bisect_left: a value equal to a bound belongs to that bucket (le).
        self.counts[bisect.bisect_left(self.bounds, value)] += weight
        self.total += value * weight
        self.count += weight

    def observe_sorted(self, values) -> None:
        """Observe each of `values` (sorted ascending) once: one bisect per
        bound, not per value."""
        if not values:
            return
        prev = 0
        for i, bound in enumerate(self.bounds):
            upto = bisect.bisect_right(values, bound)
            self.counts[i] += upto - prev
            prev = upto
        self.counts[-1] += len(values) - prev
        self.total += sum(values)
        self.count += len(values)

    def le(self, bound: float) -> int:
        """Observations <= bound, for a bound of this counter (KeyError else)."""
        i = self.bounds.index(bound)
        return sum(self.counts[:i + 1])

    def coarsened(self, bounds, scale: float = 1.0) -> list[tuple[str, int]]:
        """cumulative() over a subset of this counter's bounds, each bound
        (and so the exposed `le`) multiplied by `scale` (seconds -> ms)."""
        out = []
        for bound in bounds:
            out.append((repr(float(bound)), self.le(bound / scale)))
        out.append(("+Inf", self.count))
        return out

    def quantile(self, q: float) -> float:
        """The upper bound of the bucket holding quantile q (0 with no
        observations; the largest bound for the +Inf bucket)."""
        if self.count == 0:
            return 0.0
        rank, running = q * self.count, 0
        for bound, n in zip(self.bounds, self.counts):
            running += n
            if running >= rank:
                return bound
        return self.bounds[-1]

    def cumulative(self) -> list[tuple[str, int]]:
        """[(le, count of observations <= le)], +Inf last, as Prometheus
        exposes buckets."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out
