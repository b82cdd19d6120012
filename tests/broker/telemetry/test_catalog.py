# The broker's /metrics against the catalogue (broker/telemetry/catalog.py),
# on one broker in this process over real TCP: every family served is in the
# catalogue with the catalogue's labels, every catalogue name is served, and
# the new exporter / RocketMQ 5 names carry the values the requests made
# (puts, sizes, committed offsets and lag, its age, pulls by store time, rpc
# latency of every request code).  FamilySet alone: a follower drops the group's data, a label the
# catalogue does not list is refused.
import time

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from broker import metrics
from broker.config import BrokerConfig
from broker.metrics import FamilySet, _first_store_time
from broker.remoting.client import open_remoting_client
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.server import serve_broker
from broker.telemetry import catalog as C
from tests.broker.test_metrics import http_get
from tools.bench import broker as B
from tools.localcluster import free_ports

N, COMMITTED = 40, 6  # messages sent to queue 0; the group's committed offset there


def solo_config(tmp_path) -> BrokerConfig:
    cfg, _ = BrokerConfig.from_dict({
        "brokerName": "solo", "brokerClusterName": "C1", "brokerIP1": "127.0.0.1", "listenPort": "0",
        "dLegerGroup": "solo", "dLegerPeers": f"n0-127.0.0.1:{free_ports(1)[0]}", "dLegerSelfId": "n0",
        "storePathRootDir": str(tmp_path / "n0"), "metricsExporterType": "PROM",
        "metricsPromExporterHost": "127.0.0.1", "metricsPromExporterPort": "0"})
    return cfg


async def scrape_families(url: str) -> dict:
    status, body = await http_get(url)
    assert status == "HTTP/1.1 200 OK", status
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def samples(fams: dict, name: str, suffix: str = "", **labels) -> list[float]:
    fam = fams.get(name.removesuffix("_total"))
    assert fam is not None, f"no family {name}"
    return [s.value for s in fam.samples if s.name == name + suffix
            and all(s.labels.get(k) == str(v) for k, v in labels.items())]


async def test_served_families_are_the_catalogue_and_carry_the_requests(tmp_path, monkeypatch):
    async with trio.open_nursery() as nursery:
        broker = await nursery.start(lambda task_status: serve_broker(
            solo_config(tmp_path), bind_host="127.0.0.1", task_status=task_status))
        await broker.gate.wait_writable(timeout=10)
        addr, url = broker.broker_addr, broker.metrics_server.url
        async with open_remoting_client() as rc:
            resp = await rc.invoke(addr, B.create_topic_request(B.TOPIC, 1), 5)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            sent_at = time.time() * 1000
            for _ in range(N):
                resp = await rc.invoke(addr, B.send_request(0, b"x" * 2000), 5)
                assert resp.code == ResponseCode.SUCCESS, resp.remark
            resp = await rc.invoke(addr, RemotingCommand.create_request(RequestCode.UPDATE_CONSUMER_OFFSET, {
                "consumerGroup": B.CGROUP, "topic": B.TOPIC, "queueId": 0, "commitOffset": COMMITTED}), 5)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            resp = await rc.invoke(addr, B.pull_request(0, 0, 10), 5)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            assert sent_at - 1000 <= _first_store_time(resp.body) <= time.time() * 1000
            resp = await rc.invoke(addr, B.pull_request(0, N, 10), 5)  # nothing there: PULL_NOT_FOUND
            assert resp.code != ResponseCode.SUCCESS
            for _ in range(2):  # a code nothing serves
                resp = await rc.invoke(addr, RemotingCommand.create_request(54321), 5)
                assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED

        fams = await scrape_families(url)
        foreign = tuple(p for p, _ in C.FOREIGN_PREFIXES)
        catalogue = {s.family_name for s in C.SERVED}
        ours = {n for n in fams if n in catalogue or not n.startswith(foreign)}
        assert ours == catalogue, (ours ^ catalogue)
        for spec in C.SERVED:
            for s in fams[spec.family_name].samples:
                keys = set(s.labels) - {"le"}
                assert keys == set(spec.labels), (spec.name, keys)

        t = dict(topic=B.TOPIC)
        assert samples(fams, "rocketmq_producer_offset", **t) == [N]
        assert samples(fams, "rocketmq_messages_in_total", **t, message_type="normal", is_system="false") == [N]
        assert samples(fams, "rocketmq_message_size", "_count", **t) == [N]
        assert samples(fams, "rocketmq_message_size", "_bucket", **t, le="1024.0") == [0]
        assert samples(fams, "rocketmq_message_size", "_bucket", **t, le="4096.0") == [N]
        g = dict(topic=B.TOPIC, group=B.CGROUP)
        assert samples(fams, "rocketmq_consumer_offset", **g) == [COMMITTED]
        assert samples(fams, "rocketmq_group_diff", **g, msgModel=1) == [N - COMMITTED]
        assert samples(fams, "rocketmq_message_accumulation", **g, queueid=0) == [N - COMMITTED]
        lag = samples(fams, "rocketmq_consumer_lag_messages", topic=B.TOPIC, consumer_group=B.CGROUP)
        assert lag == [N - COMMITTED]
        age = samples(fams, "rocketmq_group_get_latency_by_storetime", **g)
        assert len(age) == 1 and 0 < age[0] <= time.time() * 1000 - sent_at + 1000
        assert samples(fams, "rocketmq_consumer_lag_latency", topic=B.TOPIC, consumer_group=B.CGROUP) == age
        assert samples(fams, "rocketmq_messages_out_total", topic=B.TOPIC, consumer_group=B.CGROUP) == [10]
        assert samples(fams, "ledgermq_consume_latency_by_storetime_seconds", "_count", topic=B.TOPIC,
                       consumer_group=B.CGROUP) == [10]
        assert samples(fams, "rocketmq_rpc_latency", "_count", request_code="send_message") == [N]
        assert samples(fams, "rocketmq_rpc_latency", "_count", request_code="pull_message",
                       response_code="success") == [1]
        assert sum(samples(fams, "rocketmq_rpc_latency", "_count", request_code="pull_message")) == 2
        # every other code, one by one, by request and response code
        assert samples(fams, "rocketmq_rpc_latency", "_count", request_code="update_and_create_topic",
                       response_code="success", result="success") == [1]
        assert samples(fams, "rocketmq_rpc_latency", "_count", request_code="update_consumer_offset",
                       response_code="success") == [1]
        assert samples(fams, "rocketmq_rpc_latency", "_count", request_code="other",
                       response_code="request_code_not_supported") == [2]
        assert samples(fams, "rocketmq_brokeruntime_msg_put_total_today_now") == [N]
        pmdt = sum(sum(samples(fams, f"rocketmq_brokeruntime_pmdt_{band}")) for band, _, _ in C.PMDT_BANDS)
        assert pmdt == N
        assert samples(fams, "rocketmq_storage_size")[0] > N * 2000
        assert samples(fams, "rocketmq_broker_permission") == [6]

        # past MAX_AGE_READS records per scrape the age is not read again: the last one is kept
        monkeypatch.setattr(metrics, "MAX_AGE_READS", 0)
        again = await scrape_families(url)
        assert samples(again, "rocketmq_group_get_latency_by_storetime", **g) == age
        monkeypatch.setattr(metrics, "MAX_AGE_READS", 4096)
        again = await scrape_families(url)
        assert samples(again, "rocketmq_group_get_latency_by_storetime", **g)[0] >= age[0]
        nursery.cancel_scope.cancel()


def test_family_set_drops_the_groups_data_on_a_follower_and_refuses_unknown_labels():
    common = {"cluster": "c", "broker": "b"}
    follower, master = FamilySet(common, master=False), FamilySet(common, master=True)
    for out in (follower, master):
        out.add("rocketmq_producer_offset", 5, topic="T")  # MASTER scope
        out.add("ledgermq_dledger_term", 3)  # NODE scope
    got = {out.master: {f.name: [s.value for s in f.samples] for f in out} for out in (follower, master)}
    assert got[False]["rocketmq_producer_offset"] == [] and got[True]["rocketmq_producer_offset"] == [5]
    assert got[False]["ledgermq_dledger_term"] == got[True]["ledgermq_dledger_term"] == [3]
    assert set(got[False]) == {s.family_name for s in C.SERVED}  # every family, empty or not
    with pytest.raises(KeyError):
        master.add("rocketmq_producer_offset", 1, topic="T", group="g")
    with pytest.raises(KeyError):
        master.add("rocketmq_no_such_metric", 1)
