# The telemetry pieces on their own: the bucket histogram against
# prometheus_client's own exposition, the windowed stats (what
# VIEW_BROKER_STATS_DATA answers), the metrics keys, the HTTP endpoint over
# a real socket, and log files: rotation by size and JSON lines.
import json
import logging
import random

import pytest
import trio
from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from broker.metrics import CQ_UNIT, _size_sum
from broker.telemetry import stats as S
from broker.telemetry.buckets import BucketCounter
from broker.telemetry.exporter import MetricsConfig, MetricsConfigError, answer, serve_metrics
from broker.telemetry.logs import setup_logging


def test_bucket_counter_weights_and_cumulates():
    bc = BucketCounter((0.001, 0.01, 0.1))
    bc.observe(0.0005, 10)  # a burst of 10 that took 0.5 ms
    bc.observe(0.01)  # on a bound: counted in that bucket (le)
    bc.observe(3.0, 2)
    assert bc.cumulative() == [("0.001", 10), ("0.01", 11), ("0.1", 11), ("+Inf", 13)]
    assert bc.count == 13 and bc.total == pytest.approx(0.005 + 0.01 + 6.0)


class _One:
    def __init__(self, bc):
        self.bc = bc

    def collect(self):
        fam = HistogramMetricFamily("x_seconds", "x", labels=[])
        fam.add_metric([], self.bc.cumulative(), self.bc.total)
        yield fam


def test_bucket_counter_exposes_a_valid_histogram():
    bc = BucketCounter()
    for v in (0.0002, 0.003, 0.003, 0.2):
        bc.observe(v)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_One(bc))
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    status, _, body = answer(registry, head).partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 200 OK")
    (fam,) = text_string_to_metric_families(body.decode())
    assert fam.type == "histogram"
    samples = {(s.name, s.labels.get("le")): s.value for s in fam.samples}
    assert samples["x_seconds_count", None] == 4 and samples["x_seconds_bucket", "+Inf"] == 4
    assert samples["x_seconds_bucket", "0.005"] == 3 and samples["x_seconds_bucket", "0.0005"] == 1


def test_http_answers_only_get_metrics():
    registry = CollectorRegistry(auto_describe=False)
    assert answer(registry, b"GET /other HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404")
    assert answer(registry, b"POST /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405")
    assert answer(registry, b"\x00\x00\x00\x10junk\r\n\r\n").startswith(b"HTTP/1.1 400")
    head = answer(registry, b"HEAD /metrics HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n")


async def test_endpoint_over_a_socket():
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_One(BucketCounter()))
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_metrics, registry, "127.0.0.1", 0)
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := await stream.receive_some(4096):
            data += chunk
        assert data.startswith(b"HTTP/1.1 200 OK") and b"x_seconds_count 0.0" in data
        assert server.scrapes == 1 and server.url == f"http://127.0.0.1:{server.port}/metrics"
        nursery.cancel_scope.cancel()


def test_stats_windows_are_rocketmq_snapshots():
    now = [1000.0]
    totals = {}
    book = S.StatsBook(source=lambda: dict(totals), clock=lambda: now[0])
    book.sample(now[0], {})  # the first timer sample: nothing yet
    now[0] += 10
    totals[S.TOPIC_PUT_NUMS, "T"] = (100, 4)  # 100 messages in 4 calls
    book.sample(now[0], totals)
    now[0] += 5
    totals[S.TOPIC_PUT_NUMS, "T"] = (130, 5)
    book.refresh()  # a reader: the windows end at what is true now, the rings stay regular
    data = book.broker_stats_data(S.TOPIC_PUT_NUMS, "T")
    assert data["statsMinute"] == {"sum": 130, "tps": pytest.approx(130 / 15), "avgpt": pytest.approx(130 / 5)}
    assert data["statsDay"]["sum"] == 130
    assert len(book.get(S.TOPIC_PUT_NUMS, "T").fine) == 2  # the seed and one timer sample
    assert book.broker_stats_data(S.TOPIC_PUT_NUMS, "Other") is None
    for _ in range(12):  # two minutes later the minute window holds only the last minute
        now[0] += 10
        totals[S.TOPIC_PUT_NUMS, "T"] = (totals[S.TOPIC_PUT_NUMS, "T"][0] + 60, 6)
        book.sample(now[0], totals)
    assert book.get(S.TOPIC_PUT_NUMS, "T").snapshot(60).sum == 360
    assert book.get(S.TOPIC_PUT_NUMS, "T").rate(60) == pytest.approx(6.0)


def test_metrics_config_keys():
    cfg, warnings = MetricsConfig.from_props({"metricsExporterType": "prom", "metricsPromExporterPort": "9100"})
    assert (cfg.enabled, cfg.prom_port, cfg.prom_host, warnings) == (True, 9100, "", [])
    assert MetricsConfig.from_props({})[0].enabled is False  # off by default, as in RocketMQ
    cfg, warnings = MetricsConfig.from_props({"metricsExporterType": "OTLP_GRPC"})
    assert not cfg.enabled and "not implemented" in warnings[0]
    with pytest.raises(MetricsConfigError, match="metricsExporterType='GRAPHITE': expected one of"):
        MetricsConfig.from_props({"metricsExporterType": "GRAPHITE"})
    with pytest.raises(MetricsConfigError, match="metricsPromExporterPort='70000'"):
        MetricsConfig.from_props({"metricsPromExporterPort": "70000"})


@pytest.fixture
def clean_root_logger():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    root.handlers[:], root.level = saved[0], saved[1]


def test_log_file_rotates_by_size_in_json_lines(tmp_path, clean_root_logger):
    path = tmp_path / "logs" / "broker.log"  # the folder is created
    setup_logging("DEBUG", str(path), "json", console=False, max_bytes=2000, backups=2)
    log = logging.getLogger("ledgermq.test")
    for i in range(100):
        log.info("message %d of the rotation test", i)
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("with a traceback")
    names = sorted(p.name for p in path.parent.iterdir())
    assert names == ["broker.log", "broker.log.1", "broker.log.2"]  # two backups kept, the rest dropped
    lines = [json.loads(line) for p in path.parent.iterdir() for line in p.read_text().splitlines()]
    assert all(set(x) >= {"ts", "level", "logger", "message", "pid"} for x in lines)
    last = json.loads(path.read_text().splitlines()[-1])
    assert last["level"] == "ERROR" and "ValueError: boom" in last["exc"] and last["ts"].endswith("Z")


def test_log_setup_errors_name_the_cause(tmp_path, clean_root_logger):
    with pytest.raises(ValueError, match="unknown log level 'VERBOSE'"):
        setup_logging("verbose")
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError, match=f"cannot write the log file {tmp_path}/file/x.log"):
        setup_logging("INFO", str(tmp_path / "file" / "x.log"))


def test_put_size_sum_matches_unit_by_unit():
    """The put counter's one-unpack sum equals unit-by-unit decoding,
    zero-size (filler) and negative sizes included."""
    rnd = random.Random(7)
    for n in (0, 1, 5, 300):
        for sizes in ([rnd.randrange(1, 1 << 20) for _ in range(n)],
                      [rnd.choice((0, -1, 17, 4096)) for _ in range(n)]):
            raw = b"".join(CQ_UNIT.pack(rnd.randrange(1 << 40), s, rnd.randrange(1 << 32)) for s in sizes)
            assert _size_sum(raw, n) == sum(u[1] for u in CQ_UNIT.iter_unpack(raw) if u[1] > 0)
