# Owns StatsBook, RocketMQ's BrokerStatsManager in the only form its readers
# see: per (stats name, key) a running total of a value and of the calls that
# added it, sampled by a timer, and for the last minute / hour / day the
# StatsSnapshot (sum, tps, avgpt) that VIEW_BROKER_STATS_DATA (315) answers
# and that rocketmq-exporter turns into rocketmq_producer_tps,
# rocketmq_consumer_tps, ...
#
# Nothing is added per message: sample() takes the totals the broker already
# has (consume-queue max offsets, per-burst and per-pull counters) every
# SAMPLE_S seconds.  Two rings per item bound the memory: one sample every
# SAMPLE_S for the last FINE_SPAN_S, one every COARSE_EVERY_S for a day.
#
# Stats names and keys are RocketMQ's (BrokerStatsManager):
#   TOPIC_PUT_NUMS / TOPIC_PUT_SIZE     key topic
#   GROUP_GET_NUMS / GROUP_GET_SIZE     key "topic@group"
#   BROKER_PUT_NUMS / BROKER_GET_NUMS   key the cluster name
import collections
import time
from collections.abc import Callable

import attrs

TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"
GROUP_GET_NUMS = "GROUP_GET_NUMS"
GROUP_GET_SIZE = "GROUP_GET_SIZE"
BROKER_PUT_NUMS = "BROKER_PUT_NUMS"
BROKER_GET_NUMS = "BROKER_GET_NUMS"
STATS_NAMES = (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, GROUP_GET_NUMS, GROUP_GET_SIZE, BROKER_PUT_NUMS, BROKER_GET_NUMS)

SAMPLE_S = 10.0
FINE_SPAN_S = 600.0
COARSE_EVERY_S = 600.0
DAY_S = 86400.0
WINDOWS = {"statsMinute": 60.0, "statsHour": 3600.0, "statsDay": DAY_S}


@attrs.frozen
class Snapshot:
    """RocketMQ's StatsSnapshot over one window: the value added (sum), per
    second (tps) and per call (avgpt)."""

    sum: int
    tps: float
    avgpt: float

    def to_json(self) -> dict:
        return {"sum": self.sum, "tps": self.tps, "avgpt": self.avgpt}


@attrs.define(eq=False)
class StatsItem:
    """The rings hold the timer's samples only (evenly spaced); `latest` is
    the freshest reading, the end of every window."""

    fine: collections.deque = attrs.Factory(lambda: collections.deque(maxlen=int(FINE_SPAN_S / SAMPLE_S) + 1))
    coarse: collections.deque = attrs.Factory(lambda: collections.deque(maxlen=int(DAY_S / COARSE_EVERY_S) + 1))
    latest: tuple | None = None

    def sample(self, now: float, value: int, times: int) -> None:
        self.fine.append((now, value, times))
        if not self.coarse or now - self.coarse[-1][0] >= COARSE_EVERY_S:
            self.coarse.append((now, value, times))
        self.latest = (now, value, times)

    def observe(self, now: float, value: int, times: int) -> None:
        self.latest = (now, value, times)

    @property
    def value(self) -> int:
        return self.latest[1] if self.latest else 0

    def snapshot(self, window: float) -> Snapshot:
        if not self.fine:
            return Snapshot(0, 0.0, 0.0)
        t1, v1, n1 = self.latest
        ring = self.fine if window <= FINE_SPAN_S else self.coarse
        # The oldest sample inside the window (or the oldest there is).
        t0, v0, n0 = next(((t, v, n) for t, v, n in ring if t >= t1 - window), ring[0])
        value, times, span = v1 - v0, n1 - n0, t1 - t0
        return Snapshot(value, value / span if span > 0 else 0.0, value / times if times > 0 else 0.0)

    def rate(self, window: float) -> float:
        return self.snapshot(window).tps


@attrs.define(eq=False)
class StatsBook:
    """`source` (set by whoever owns the totals: broker/metrics.py) gives
    the totals; sample() is called by a timer, refresh() by readers, so
    that each window ends at what is true now."""

    items: dict[tuple[str, str], StatsItem] = attrs.Factory(dict)
    source: Callable[[], dict] | None = None
    clock: Callable[[], float] = time.monotonic
    last_sample: float | None = None

    def sample(self, now: float, totals: dict[tuple[str, str], tuple[int, int]]) -> None:
        """totals: (stats name, key) -> (value so far, calls so far), each
        counted from 0 when the process started."""
        for key, (value, times) in totals.items():
            item = self.items.get(key)
            if item is None:
                item = self.items[key] = StatsItem()
                # Not in the previous sample: it was 0 then (totals start at 0).
                item.sample(self.last_sample if self.last_sample is not None else now, 0, 0)
            item.sample(now, value, times)
        self.last_sample = now

    def refresh(self) -> None:
        if self.source is None:
            return
        now = self.clock()
        for key, (value, times) in self.source().items():
            item = self.items.get(key)
            if item is None:
                item = self.items[key] = StatsItem()
                item.sample(self.last_sample if self.last_sample is not None else now, 0, 0)
            item.observe(now, value, times)

    def get(self, name: str, key: str) -> StatsItem | None:
        return self.items.get((name, key))

    def broker_stats_data(self, name: str, key: str) -> dict | None:
        """The BrokerStatsData body of VIEW_BROKER_STATS_DATA, or None when
        the item does not exist (RocketMQ answers SYSTEM_ERROR then)."""
        self.refresh()
        item = self.items.get((name, key))
        if item is None:
            return None
        return {field: item.snapshot(window).to_json() for field, window in WINDOWS.items()}
