# The console's pure parts: rates from counters (a restarted broker's reset
# counter gives no rate, not a negative one), the bounded chart window, the
# term log a failover is read from, and the loopback check of --bind.
from broker.acl.signing import Credentials
from tools.dashboard.history import RateTracker, TermLog, Window
from tools.dashboard.prom import endpoint, latency_quantile
from tools.dashboard.serve import DashboardConfig, is_loopback


def test_rates_from_counters_skip_resets_and_first_sightings():
    r = RateTracker()
    assert r.rate("a", 10.0, 100) is None           # first sighting: no interval yet
    assert r.rate("a", 12.0, 160) == 30.0
    assert r.rate("a", 13.0, 5) is None              # the process restarted: counter went down
    assert r.rate("a", 14.0, 15) == 10.0
    assert r.rate("a", 14.0, 20) is None             # no time passed
    r.rate("b", 1.0, 1)
    r.forget_except({"a"})
    assert r.rate("b", 2.0, 2) is None               # forgotten: a first sighting again


def test_window_keeps_the_last_span():
    w = Window(span_ms=1000)
    for t in range(0, 3001, 500):
        w.add({"t": t})
    assert [p["t"] for p in w.to_list()] == [2000, 2500, 3000]


def test_term_log_reads_a_failover_as_one_change():
    log = TermLog(limit=3)
    assert log.observe(0, "g", 1, "n0") is None      # first sighting
    assert log.observe(1, "g", 1, "n0") is None      # nothing moved
    assert log.observe(2, "g", 1, None) is None      # election under way: not logged
    assert log.observe(3, "g", None, None) is None
    change = log.observe(4, "g", 2, "n1")
    assert change == {"t": 4, "group": "g", "fromTerm": 1, "toTerm": 2, "fromLeader": "n0", "toLeader": "n1"}
    assert log.observe(5, "g", 1, "n0") is None      # a stale answer from an older term
    assert log.current["g"] == (2, "n1")
    for term in range(3, 8):
        log.observe(term * 10, "g", term, f"n{term % 3}")
    assert len(log.changes) == 3 and log.changes[-1]["toTerm"] == 7


def test_bind_and_config_never_show_the_secret():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("example.org")
    cfg = DashboardConfig("127.0.0.1:9876", credentials=Credentials("ak", "very-secret"))
    assert cfg.bind == "127.0.0.1"
    assert "very-secret" not in repr(cfg) and "very-secret" not in repr(cfg.credentials)


def test_prometheus_endpoint_and_latency_quantile_between_scrapes():
    assert endpoint({"metricsExporterType": "DISABLE", "metricsPromExporterPort": "5557"}, "h:1") is None
    assert endpoint({"metricsExporterType": "PROM", "metricsPromExporterPort": "5557",
                     "metricsPromExporterHost": ""}, "10.0.0.5:10911") == ("10.0.0.5", 5557)
    assert endpoint({"metricsExporterType": "prom", "metricsPromExporterPort": "9",
                     "metricsPromExporterHost": "127.0.0.2"}, "h:1") == ("127.0.0.2", 9)
    prev = {0.001: 10, 0.01: 20, 0.1: 20, float("inf"): 20}
    cur = {0.001: 10, 0.01: 119, 0.1: 120, float("inf"): 120}   # 100 new: 99 under 10 ms, 1 under 100 ms
    assert latency_quantile(prev, cur, 0.99) == 0.01
    assert latency_quantile(prev, cur, 0.999) == 0.1
    assert latency_quantile(cur, cur, 0.99) is None               # nothing observed in between
    assert latency_quantile(cur, prev, 0.99) is None              # counters went back: a restart
