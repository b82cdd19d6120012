# The broker's and name server's Prometheus endpoints scraped from a live
# group (one mqnamesrv + a 3-broker DLedger group as real processes,
# metricsExporterType=PROM) and parsed with prometheus_client's own parser,
# and the request codes RocketMQ's dashboard, exporter and mqadmin send
# (315, 300, 201, 307, 21; 224 and 304 at the name server) answered through
# the remoting client.  One cluster for the whole module: the values are
# checked as they move (puts, lag while the consumer is away, a new term
# after the master is killed).
# Slow: a real name server + 3-broker group, mqbench subprocesses and a kill
#   -9 of the master.
import json
import re
import sys

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from broker.client import ConsumeFromWhere, ConsumeStatus, Message, open_producer, open_push_consumer
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from tests.helpers import REPO_ROOT
from tests.helpers.waiting import eventually
from tools.bench.broker import create_topic_request
from tools.brokercluster import open_broker_cluster

pytestmark = pytest.mark.slow

TOPIC, GROUP = "MetricsTopic", "metrics_group"
PROM = {"metricsExporterType": "PROM", "metricsPromExporterHost": "127.0.0.1", "metricsPromExporterPort": 0}
BODY = b"m" * 100


async def http_get(url: str) -> tuple[str, bytes]:
    """(status line, body) of GET url, over a real socket."""
    hostport, _, path = url.removeprefix("http://").partition("/")
    host, _, port = hostport.rpartition(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\n\r\n".encode())
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode(), body


async def scrape(url: str) -> list:
    """Every sample of the endpoint: [(name, labels, value)]."""
    status, body = await http_get(url)
    assert status == "HTTP/1.1 200 OK", status
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(body.decode())
            for s in fam.samples]


def value(samples, name: str, **labels) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    hits = [v for n, lab, v in samples if n == name and all(lab.get(k) == w for k, w in labels.items())]
    assert hits, f"no sample {name} {labels}"
    return sum(hits)


async def call(cluster, addr: str, code: int, fields: dict | None = None, body: bytes = b""):
    return await cluster.remoting.invoke(addr, RemotingCommand.create_request(code, fields, body=body), 5.0)


async def test_live_group_metrics_and_stock_tool_codes(tmp_path):
    async with open_broker_cluster(tmp_path, extra_conf=PROM, namesrv_conf=PROM) as cluster:
        master = await cluster.wait_master()
        url = {n: p.info["metrics"] for n, p in cluster.brokers.items()}
        assert all(u.startswith("http://127.0.0.1:") for u in url.values()), url
        resp = await cluster.remoting.invoke(cluster.addr(master), create_topic_request(TOPIC, 4), 5.0)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        ns = cluster.namesrv_addr

        # --- puts: offsets, counts, bytes, send latency, on the master and (dispatched) on a follower
        n = 200
        async with open_producer("metrics_producer", namesrv_addr=ns) as producer:
            for i in range(n):
                await producer.send(Message(TOPIC, BODY))

        async def puts_counted():
            s = await scrape(url[master])
            assert value(s, "rocketmq_producer_offset", topic=TOPIC) == n
            assert value(s, "rocketmq_messages_in_total", topic=TOPIC) == n
            assert value(s, "rocketmq_throughput_in_total", topic=TOPIC) > n * len(BODY)
            return s
        s = await eventually(puts_counted)
        assert value(s, "ledgermq_send_latency_seconds_count") >= n
        count = value(s, "ledgermq_send_latency_seconds_count")
        assert value(s, "ledgermq_send_latency_seconds_bucket", le="+Inf") == count
        assert value(s, "ledgermq_send_latency_seconds_sum") > 0
        assert value(s, "ledgermq_dledger_role", role="leader") == 1
        assert value(s, "ledgermq_dledger_writable") == 1
        term = value(s, "ledgermq_dledger_term")
        assert term >= 1 and value(s, "ledgermq_dledger_committed_index") >= n
        peers = {lab["peer"] for name, lab, _ in s if name == "ledgermq_dledger_peer_match_lag_entries"}
        assert peers == set(cluster.brokers) - {master}
        assert all(v < 5 for name, _, v in s if name == "ledgermq_dledger_peer_last_ack_age_seconds")
        assert value(s, "process_resident_memory_bytes") > 10 << 20
        assert value(s, "ledgermq_remoting_connections") >= 1
        assert 0 < value(s, "rocketmq_brokeruntime_commitlog_disk_ratio") < 1
        assert value(s, "ledgermq_dispatch_lag_bytes") >= 0
        assert value(s, "ledgermq_dledger_append_errors_total", type="quorum_timeout") == 0
        assert value(s, "ledgermq_dledger_ticks_dropped_total") >= 0
        assert value(s, "ledgermq_dledger_peer_messages_dropped_total", reason="refused") == 0
        # --- the peer port counts what it turns away: a stranger's garbage instead of a HELLO
        host, port = cluster.peers[master].rsplit(":", 1)
        stranger = await trio.open_tcp_stream(host, int(port))
        await stranger.send_all(b"\x00\x00\x00\x10 not a DLedger hello")
        await stranger.aclose()

        async def stranger_counted():
            s2 = await scrape(url[master])
            assert value(s2, "ledgermq_dledger_peer_connections_refused_total", reason="rejected") >= 1
        await eventually(stranger_counted)
        follower = next(x for x in cluster.brokers if x != master)

        async def follower_dispatched():
            f = await scrape(url[follower])
            assert value(f, "ledgermq_dledger_role", role="follower") == 1
            assert value(f, "ledgermq_dledger_committed_index") >= n
            # the group's data is the master's alone (sums over the group's members are the truth)
            assert not [x for x in f if x[0] in ("rocketmq_producer_offset", "rocketmq_messages_in_total")]
        await eventually(follower_dispatched)

        # --- mqbench pointed at the running cluster (-n): its puts show up in the metrics
        r = await trio.run_process([sys.executable, "-m", "tools.bench.mqbench", "producer", "-n", ns, "-t", "BenchT",
                                    "--count", "100", "-c", "8", "-s", "64", "--json"], capture_stdout=True,
                                   capture_stderr=True, cwd=str(REPO_ROOT), check=False)
        assert r.returncode == 0, r.stderr.decode()
        bench = json.loads(r.stdout)
        assert (bench["messages"], bench["failed"]) == (100, 0) and bench["latencyMs"]["p99"] > 0

        async def bench_counted():
            s = await scrape(url[master])
            assert value(s, "rocketmq_messages_in_total", topic="BenchT") == 100
        await eventually(bench_counted)
        r = await trio.run_process([sys.executable, "-m", "tools.bench.mqbench", "consumer", "-n", ns, "-t", "BenchT",
                                    "--count", "100", "--seconds", "30", "--json"], capture_stdout=True,
                                   capture_stderr=True, cwd=str(REPO_ROOT), check=False)
        assert r.returncode == 0 and json.loads(r.stdout)["messages"] >= 100, r.stderr.decode()

        # --- gets and lag: a group consumes everything, leaves; more is sent; the lag is what it missed
        got = []

        async def handle(msgs):
            got.extend(msgs)
            return ConsumeStatus.CONSUME_SUCCESS

        opts = dict(namesrv_addr=ns, subscriptions={TOPIC: "*"}, handler=handle, persist_interval=0.5,
                    consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
        async with open_push_consumer(GROUP, **opts):
            with trio.fail_after(30):
                while len(got) < n:
                    await trio.sleep(0.05)

        async def no_lag():
            s = await scrape(url[master])
            assert value(s, "rocketmq_message_accumulation", topic=TOPIC, group=GROUP) == 0
            assert value(s, "rocketmq_consumer_offset", topic=TOPIC, group=GROUP) == n
        await eventually(no_lag)
        out = [await scrape(u) for u in url.values()]
        assert sum(value(x, "rocketmq_messages_out_total", topic=TOPIC, consumer_group=GROUP)
                   for x in out if any(n_ == "rocketmq_messages_out_total" for n_, _, _ in x)) >= n
        assert sum(value(x, "ledgermq_pull_latency_seconds_count") for x in out) >= 1
        m = 50
        async with open_producer("metrics_producer", namesrv_addr=ns) as producer:
            for i in range(m):
                await producer.send(Message(TOPIC, BODY))

        async def lag_rose():
            s = await scrape(url[master])
            assert value(s, "rocketmq_message_accumulation", topic=TOPIC, group=GROUP) == m
            lags = [v for name, lab, v in s if name == "rocketmq_message_accumulation" and lab["group"] == GROUP
                    and lab["topic"] == TOPIC]
            assert len(lags) == 4  # per queue
        await eventually(lag_rose)

        # --- the Grafana dashboard asks only for metrics the endpoints serve
        with open(REPO_ROOT / "deploy" / "grafana" / "ledgermq-dashboard.json") as f:
            exprs = [t["expr"] for p in json.load(f)["panels"] for t in p["targets"]]
        served = {name for u in url.values() for name, _, _ in await scrape(u)}
        wanted = {m for e in exprs for m in re.findall(r"\b((?:rocketmq|ledgermq|process)_[a-z_]+)\b", e)}
        assert wanted and wanted <= served, wanted - served

        # --- VIEW_BROKER_STATS_DATA (315), as rocketmq-exporter asks it
        resp = await call(cluster, cluster.addr(master), RequestCode.VIEW_BROKER_STATS_DATA,
                          {"statsName": "TOPIC_PUT_NUMS", "statsKey": TOPIC})
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        data = json.loads(resp.body)
        assert set(data) == {"statsMinute", "statsHour", "statsDay"}
        assert data["statsHour"]["sum"] == data["statsDay"]["sum"] == n + m
        assert set(data["statsMinute"]) == {"sum", "tps", "avgpt"} and data["statsMinute"]["tps"] >= 0
        resp = await call(cluster, cluster.addr(master), RequestCode.VIEW_BROKER_STATS_DATA,
                          {"statsName": "BROKER_PUT_NUMS", "statsKey": "LedgerCluster"})
        assert resp.code == ResponseCode.SUCCESS
        assert json.loads(resp.body)["statsDay"]["sum"] == n + m + 100  # and mqbench's
        resp = await call(cluster, cluster.addr(master), RequestCode.VIEW_BROKER_STATS_DATA,
                          {"statsName": "TOPIC_PUT_NUMS", "statsKey": "NoSuchTopic"})
        assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR,
                                            "The stats <TOPIC_PUT_NUMS> <NoSuchTopic> not exist")

        # --- GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201), QUERY_TOPIC_CONSUME_BY_WHO (300), GET_ALL_TOPIC_CONFIG (21)
        cfg = {"groupName": "cfg_group", "consumeEnable": True, "retryQueueNums": 1, "retryMaxTimes": 16,
               "brokerId": 0, "whichBrokerWhenConsumeSlowly": 1, "consumeBroadcastEnable": False}
        resp = await call(cluster, cluster.addr(master), RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                          body=json.dumps(cfg).encode())
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        resp = await call(cluster, cluster.addr(master), RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        body = json.loads(resp.body)
        assert resp.code == ResponseCode.SUCCESS and body["subscriptionGroupTable"]["cfg_group"]["retryMaxTimes"] == 16
        assert body["dataVersion"]["counter"] > 0
        resp = await call(cluster, cluster.addr(master), RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": TOPIC})
        assert resp.code == ResponseCode.SUCCESS and GROUP in json.loads(resp.body)["groupSet"]
        resp = await call(cluster, cluster.addr(master), RequestCode.GET_ALL_TOPIC_CONFIG)
        assert resp.code == ResponseCode.SUCCESS and TOPIC in json.loads(resp.body)["topicConfigTable"]

        # --- GET_CONSUMER_RUNNING_INFO (307): forwarded to the online client, its answer returned
        async with open_push_consumer(GROUP, **opts) as consumer:
            client_id = consumer.instance.client_id
            for addr in (cluster.addr(b) for b in cluster.brokers):  # every broker the client heartbeats to

                async def answered(addr=addr):
                    resp = await call(cluster, addr, RequestCode.GET_CONSUMER_RUNNING_INFO,
                                      {"consumerGroup": GROUP, "clientId": client_id, "jstackEnable": False})
                    assert resp.code == ResponseCode.SUCCESS, resp.remark
                    return json.loads(resp.body)
                info = await eventually(answered)
                assert info["properties"]["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"
                assert TOPIC in [sd["topic"] for sd in info["subscriptionSet"]]
            resp = await call(cluster, cluster.addr(master), RequestCode.GET_CONSUMER_RUNNING_INFO,
                              {"consumerGroup": GROUP, "clientId": "nobody@1", "jstackEnable": False})
            assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR,
                                                f"The Consumer <{GROUP}> <nobody@1> not online")

        # --- the name server: 224, 304 and its own endpoint
        ns_addr = cluster.namesrv_addrs[0]
        resp = await call(cluster, ns_addr, RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "LedgerCluster"})
        assert resp.code == ResponseCode.SUCCESS and TOPIC in json.loads(resp.body)["topicList"]
        resp = await call(cluster, ns_addr, RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS)
        assert resp.code == ResponseCode.SUCCESS and "LedgerCluster" in json.loads(resp.body)["topicList"]
        s = await scrape(cluster.namesrvs[0].info["metrics"])
        assert value(s, "ledgermq_namesrv_brokers", cluster="LedgerCluster") == 3
        assert value(s, "ledgermq_namesrv_requests_total", code="REGISTER_BROKER") >= 3
        assert value(s, "ledgermq_namesrv_requests_total", code="GET_ROUTEINFO_BY_TOPIC") >= 1
        assert value(s, "process_resident_memory_bytes") > 0
        status, _ = await http_get(url[master].replace("/metrics", "/nothing"))
        assert status == "HTTP/1.1 404 Not Found"

        # --- a kill -9 of the master: the new master's term is higher, and it counts the election
        cluster.kill(master)
        new = await cluster.wait_master(exclude={master})

        async def new_term():
            s = await scrape(url[new])
            assert value(s, "ledgermq_dledger_term") > term
            assert value(s, "ledgermq_dledger_elections_total") >= 1
            assert value(s, "ledgermq_dledger_role", role="leader") == 1
            assert value(s, "rocketmq_producer_offset", topic=TOPIC) == n + m  # the new master exports them now
        await eventually(new_term)
