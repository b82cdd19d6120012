# A real Prometheus (Debian's `prometheus`, installed by `make setup`)
# scrapes a real 3-broker DLedger group under load, on 127.0.0.1 with a
# 1-second scrape interval, and the queries operators use are asked through
# its HTTP API: rocketmq-exporter's stock rules (its example.rules) and every
# query of the shipped Grafana dashboard.  Each value is checked against what
# the test sent, pulled and committed -- before issue 31 the put figures came
# out three times the truth (each replica exported them).
import json
import os
import re
import shutil
import signal
import time
import urllib.parse

import pytest
import trio

from broker.client import Message, open_producer
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.telemetry.stats import SAMPLE_S
from tests.broker.test_metrics import PROM
from tests.helpers import REPO_ROOT
from tests.helpers.waiting import eventually
from tools.bench.broker import FLAG_SUBSCRIPTION, create_topic_request
from tools.brokercluster import open_broker_cluster
from tools.localcluster import free_ports

pytestmark = pytest.mark.slow

TOPIC, GROUP, PULLER = "PromTopic", "prom_group", "prom_puller"
N, QUEUES, COMMIT_PER_QUEUE, PULLED = 600, 4, 3, 32
BODY = b"p" * 500

# rocketmq-exporter's example.rules, the expressions as shipped.
PRODUCE_RULE = "sum(rocketmq_producer_tps) by (cluster)"
CONSUME_RULE = "sum(rocketmq_consumer_tps) by (cluster)"
FALLING_BEHIND = ("(sum(rocketmq_producer_offset) by (topic) - on(topic)  group_right  "
                  "sum(rocketmq_consumer_offset) by (group,topic)) - ignoring(group) group_left "
                  "sum (avg_over_time(rocketmq_producer_tps[5m])) by (topic)*5*60 > 0")
FALLING_BEHIND_LAG = ("sum(rocketmq_producer_offset) by (topic) - on(topic)  group_right  "
                      "sum(rocketmq_consumer_offset) by (group,topic)")
STORETIME_RULE = "rocketmq_group_get_latency_by_storetime > 1000"


async def http_get(url: str) -> tuple[str, bytes]:
    """(status line, body) of GET url, asking the server to close after it
    (Prometheus keeps HTTP/1.1 connections open otherwise)."""
    hostport, _, path = url.removeprefix("http://").partition("/")
    host, _, port = hostport.rpartition(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        body = _unchunk(body)
    return head.split(b"\r\n")[0].decode(), body


def _unchunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        data = rest[size + 2:]
    return out


def prometheus_binary() -> str:
    path = shutil.which("prometheus") or ("/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK)
                                          else None)
    if path is None:
        pytest.skip("no prometheus binary: `make setup` installs Debian's prometheus with apt-get "
                    "(not root or no apt here)")
    return path


class Prom:
    def __init__(self, url: str, proc, log) -> None:
        self.url, self.proc, self.log = url, proc, log

    def exited(self) -> str | None:
        """Why the process is gone (its exit code and log), None while it runs."""
        if self.proc.poll() is None:
            return None
        return f"prometheus exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}"

    async def query(self, expr: str) -> list:
        status, body = await http_get(f"{self.url}/api/v1/query?query={urllib.parse.quote(expr)}")
        answer = json.loads(body)
        assert status == "HTTP/1.1 200 OK" and answer["status"] == "success", (expr, status, body[:300])
        return answer["data"]["result"]

    async def scalar(self, expr: str) -> float:
        result = await self.query(expr)
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, expr) of the shipped dashboard, its variables set to All."""
    with open(REPO_ROOT / "deploy" / "grafana" / "ledgermq-dashboard.json") as f:
        dash = json.load(f)
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = re.sub(r"\$(cluster|broker|job)\b", ".*", target["expr"])
            out.append((panel["title"], expr))
    return out


async def test_stock_rules_and_dashboard_give_true_values_against_prometheus(tmp_path):
    """Slow: a name server + 3-broker group as real processes and a real
    Prometheus scraping them every second (about 30 s)."""
    binary = prometheus_binary()
    async with open_broker_cluster(tmp_path, extra_conf=PROM) as cluster:
        master = await cluster.wait_master()
        targets = [p.info["metrics"].removeprefix("http://").removesuffix("/metrics")
                   for p in cluster.brokers.values()]
        port = free_ports(1)[0]
        conf = tmp_path / "prometheus.yml"
        conf.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                        "scrape_configs:\n  - job_name: ledgermq\n    scrape_interval: 1s\n"
                        f"    static_configs:\n      - targets: {json.dumps(targets)}\n")
        with open(tmp_path / "prometheus.log", "wb") as log:
            proc = await trio.lowlevel.open_process(
                [binary, f"--config.file={conf}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], stdout=log, stderr=log)
        try:
            prom = Prom(f"http://127.0.0.1:{port}", proc, tmp_path / "prometheus.log")
            await run_checks(cluster, master, prom)
        finally:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()


async def pull(cluster, addr: str, qid: int, offset: int, n: int) -> None:
    """PULLER reads n messages of queue qid from `offset` (a raw PULL_MESSAGE)."""
    resp = await cluster.remoting.invoke(addr, RemotingCommand.create_request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": PULLER, "topic": TOPIC, "queueId": qid, "queueOffset": offset, "maxMsgNums": n,
        "sysFlag": FLAG_SUBSCRIPTION, "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*",
        "subVersion": 0, "expressionType": "TAG"}), 5.0)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert int(resp.ext_fields["nextBeginOffset"]) == offset + n


async def run_checks(cluster, master: str, prom: Prom) -> None:
    addr = cluster.addr(master)
    resp = await cluster.remoting.invoke(addr, create_topic_request(TOPIC, QUEUES), 5.0)
    assert resp.code == ResponseCode.SUCCESS, resp.remark

    async def ready():
        try:
            status, _ = await http_get(f"{prom.url}/-/ready")
        except OSError as e:  # not listening yet
            gone = prom.exited()
            if gone:
                pytest.fail(gone)
            raise AssertionError(f"prometheus not up: {e}") from None
        assert status == "HTTP/1.1 200 OK"
        _, body = await http_get(f"{prom.url}/api/v1/targets")
        health = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in json.loads(body)["data"]["activeTargets"]]
        assert [h for _, h, _ in health] == ["up"] * 3, health
    await eventually(ready, timeout=20)

    async with open_producer("prom_producer", namesrv_addr=cluster.namesrv_addr) as producer:
        # One message first, put and pulled, seen by Prometheus, so the counters' series exist before the
        # load (rate() cannot see what a counter held when its series appeared).
        t_first = time.time()
        first = await producer.send(Message(TOPIC, BODY))
        qid = first.queue.queue_id
        await pull(cluster, addr, qid, 0, 1)

        async def first_scraped():
            assert await prom.scalar(f'sum(rocketmq_messages_in_total{{topic="{TOPIC}"}})') == 1
            assert await prom.scalar(f'sum(rocketmq_messages_out_total{{topic="{TOPIC}"}})') == 1
        await eventually(first_scraped)
        t_load = time.time()
        sent = 0

        async def sender(k: int) -> None:
            nonlocal sent
            for _ in range(k):
                await producer.send(Message(TOPIC, BODY))
                sent += 1
        async with trio.open_nursery() as n:
            for _ in range(16):
                n.start_soon(sender, N // 16)
        t_loaded = time.time()
    total = sent + 1
    assert sent == N // 16 * 16

    # A group that committed COMMIT_PER_QUEUE on each queue (its lag: the rest), and a puller that read PULLED.
    for qid in range(QUEUES):
        resp = await cluster.remoting.invoke(addr, RemotingCommand.create_request(
            RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": GROUP, "topic": TOPIC, "queueId": qid,
                                                 "commitOffset": COMMIT_PER_QUEUE}), 5.0)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    committed = COMMIT_PER_QUEUE * QUEUES
    await pull(cluster, addr, qid, 1, PULLED - 1)
    async def all_scraped():
        assert await prom.scalar(f'sum(rocketmq_producer_offset{{topic="{TOPIC}"}})') == total
        assert await prom.scalar(f'sum(rocketmq_consumer_offset{{group="{GROUP}"}})') == committed
        assert await prom.scalar(f'sum(rocketmq_messages_out_total{{topic="{TOPIC}"}})') == PULLED
    await eventually(all_scraped, timeout=20)

    # --- only the master exports the group's data; the stock sums are the truth
    assert await prom.scalar(f'count(rocketmq_producer_offset{{topic="{TOPIC}"}})') == 1
    assert await prom.scalar("sum(rocketmq_producer_offset)") == total
    assert await prom.scalar(f'sum by (topic) (rocketmq_messages_in_total{{topic="{TOPIC}"}})') == total
    assert await prom.scalar(FALLING_BEHIND_LAG.replace("sum(rocketmq_consumer_offset)",
                                                        f'sum(rocketmq_consumer_offset{{group="{GROUP}"}})')) \
        == total - committed
    # the whole rule: the lag less five minutes of average put rate, alerting when positive (our labels
    # match its on()/ignoring() joins: one series per group and topic)
    unfiltered = FALLING_BEHIND.removesuffix(" > 0")
    (behind,) = [r for r in await prom.query(unfiltered) if r["metric"].get("group") == GROUP]
    avg_tps = await prom.scalar(f'sum(avg_over_time(rocketmq_producer_tps{{topic="{TOPIC}"}}[5m]))')
    assert float(behind["value"][1]) == pytest.approx(total - committed - avg_tps * 300, abs=avg_tps * 30 + 1)
    firing = [r for r in await prom.query(FALLING_BEHIND) if r["metric"].get("group") == GROUP]
    assert len(firing) == (float(behind["value"][1]) > 0), firing
    assert await prom.scalar(f'sum(rocketmq_group_diff{{group="{GROUP}"}})') == total - committed
    assert await prom.scalar(f'sum(rocketmq_consumer_lag_messages{{consumer_group="{GROUP}"}})') == total - committed

    # producer_tps: the master's minute rate (stats sampled every SAMPLE_S): all `total` puts over a span from
    # the sample before the first put (at most SAMPLE_S earlier) to the scrape
    tps = await prom.query(PRODUCE_RULE)
    assert len(tps) == 1 and tps[0]["metric"] == {"cluster": "LedgerCluster"}, tps
    scraped_at = await prom.scalar(f'timestamp(rocketmq_producer_tps{{topic="{TOPIC}"}})')
    value = float(tps[0]["value"][1])
    assert total / (scraped_at - t_first + SAMPLE_S + 1) <= value <= total / (scraped_at - t_first - 1), \
        (value, scraped_at - t_first)
    consume = await prom.query(CONSUME_RULE)
    assert len(consume) == 1 and float(consume[0]["value"][1]) > 0  # the puller's gets, on the master alone

    # the stock alert on consumption by store time: one series (the master), the age of the oldest unconsumed
    ages = await prom.query(f'rocketmq_group_get_latency_by_storetime{{group="{GROUP}"}}')
    assert len(ages) == 1, ages
    age_at = await prom.scalar(f'timestamp(rocketmq_group_get_latency_by_storetime{{group="{GROUP}"}})')
    age = float(ages[0]["value"][1])
    assert (age_at - t_loaded - 1) * 1000 <= age <= (age_at - t_load + 1) * 1000, (age, age_at - t_load)
    await prom.query(STORETIME_RULE)

    # --- every query of the shipped dashboard answers; the group's figures are the truth
    span_puts = await prom.scalar(f'sum(rocketmq_throughput_in_total{{topic="{TOPIC}"}})')
    queries = dashboard_queries()
    assert queries
    for title, expr in queries:
        result = await prom.query(expr)
        if title == "Put TPS per topic":
            (row,) = [r for r in result if r["metric"].get("topic") == TOPIC]
            # rate over [1m] of a counter younger than a minute: what it rose by, / 60 (plus Prometheus'
            # extrapolation of at most a scrape interval at each end of the series)
            assert 0.9 * sent <= float(row["value"][1]) * 60 <= 1.25 * sent, (expr, row)
        elif title == "Put throughput per topic":
            (row,) = [r for r in result if r["metric"].get("topic") == TOPIC]
            assert 0.9 * span_puts * sent / total <= float(row["value"][1]) * 60 <= 1.25 * span_puts, (expr, row)
        elif title == "Get TPS per topic and group":
            (row,) = [r for r in result if r["metric"].get("consumer_group") == PULLER]
            assert 0.9 * (PULLED - 1) <= float(row["value"][1]) * 60 <= 1.25 * PULLED, (expr, row)
        elif title == "Consumer lag per group (messages)":
            (row,) = [r for r in result if r["metric"].get("group") == GROUP]
            assert float(row["value"][1]) == total - committed, (expr, row)
        elif title == "Consumer lag age (oldest unconsumed, by store time)":
            (row,) = [r for r in result if r["metric"].get("group") == GROUP]
            assert float(row["value"][1]) > 0, (expr, row)
        elif title == "Producer TPS per cluster (exporter rule)":
            assert len(result) == 1 and float(result[0]["value"][1]) == pytest.approx(value, rel=0.5), result
        elif title == "DLedger role (1 = leader)":
            assert len(result) == 3 and sum(float(r["value"][1]) for r in result) == 1, result
        elif title == "Commit index":
            assert len(result) == 3 and max(float(r["value"][1]) for r in result) >= total, result
        elif title == "Disk use":
            assert len(result) == 3 and all(0 < float(r["value"][1]) < 1 for r in result), result
        elif title in ("Send latency (p50 / p99)", "RPC latency p99 (RocketMQ 5)", "Resident memory",
                       "Open connections"):
            assert result, (title, expr)
