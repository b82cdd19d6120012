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
# quorum timeout.
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


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

    def cumulative(self) -> list[tuple[str, int]]:
        """[(le, count of observations <= le)], +Inf last, as Prometheus
        exposes buckets."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out
