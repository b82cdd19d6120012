# The official RocketMQ 5.x Python client (rocketmq-python-client, its own
# venv: official_client.py), unchanged, against mqproxy as a real process in
# front of a real 3-node DLedger group (tools/brokercluster, real processes,
# TCP on 127.0.0.1).  The proxy checks credentials (plain_acl.yml); the
# brokers see the proxy's inner account.
#
#   test_official_client_features: Producer normal / FIFO / delay and
#     transactions (commit, rollback, an unknown state resolved by the
#     orphaned-transaction check), SimpleConsumer receive / ack /
#     change-invisible-duration, PushConsumer normal and FIFO, credentials
#     right and wrong.
#   test_official_client_across_a_master_kill: a producer, a SimpleConsumer
#     and a PushConsumer run while the master is killed: every acknowledged
#     send is received and acked by both, and nothing acked comes back.
#
# Slow: a real 3-node group, a real mqproxy process and the official client
# in subprocesses (each starts a Python with grpcio); the failover test
# waits out the election and one invisible time after the last ack, to
# see that nothing acked comes back.
import json
import subprocess
import sys

import pytest
import trio

from broker.namesrv.client import NamesrvClient
from broker.remoting.client import open_remoting_client
from tests.broker.client.cluster_helpers import thread_cluster
from tests.broker.proxy.official_client import OfficialClientUnavailable, ensure_venv, start_script
from tools.mqadmin.adminapi import MQAdmin

pytestmark = pytest.mark.slow

ACL = """\
accounts:
  - accessKey: owner001
    secretKey: owner-secret
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
"""
AK, SK = "owner001", "owner-secret"
TOPICS = ("Normal", "Fifo", "Delay", "Tx", "Failover")
ORDERLY_GROUP = "FifoPushGroup"


@pytest.fixture(scope="module")
def official_client():
    try:
        return ensure_venv()
    except OfficialClientUnavailable as e:
        pytest.skip(f"official client unavailable: {e}")


async def _prepare(c, topics, orderly_group):
    """Topics on the master (replicated to the group), the FIFO push group
    orderly, and the name server routing every topic."""
    async with open_remoting_client() as rc:
        admin = MQAdmin(rc, c.namesrv_addr)
        addr = c.addr(await c.wait_master())
        for t in topics:
            await admin.create_topic(addr, t, 4, 4, 6, False)
        await admin.update_sub_group(addr, {"groupName": orderly_group, "consumeEnable": True,
                                            "consumeMessageOrderly": True, "retryMaxTimes": 16})
        ns = NamesrvClient(rc, [c.namesrv_addr], 3.0)
        with trio.fail_after(30):
            for t in topics:
                while await ns.get_route(t) is None:
                    await trio.sleep(0.05)  # the master registers the new topic at once; the name server has no push


@pytest.fixture(scope="module")
def group_and_proxy(tmp_path_factory, official_client):
    root = tmp_path_factory.mktemp("grpc-group")
    acl = root / "plain_acl.yml"
    acl.write_text(ACL)
    with thread_cluster(root / "cluster") as cluster:
        cluster.call(_prepare, cluster.cluster, TOPICS, ORDERLY_GROUP)
        conf = root / "proxy.conf"
        conf.write_text(f"namesrvAddr={cluster.namesrv_addr}\ngrpcServerPort=0\nbindAddress=127.0.0.1\n"
                        f"aclEnable=true\naclFile={acl}\nlongPollingTimeoutMillis=5000\n")
        log = open(root / "proxy.log", "w")
        proxy = subprocess.Popen([sys.executable, "-m", "broker.proxy.server", "-c", str(conf)],
                                 stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            line = proxy.stdout.readline()
            assert line.startswith("{"), (line, (root / "proxy.log").read_text()[-3000:])
            yield cluster, json.loads(line)["grpcEndpoint"], root
        finally:
            proxy.terminate()
            proxy.wait(10)
            log.close()


def _all(runs: dict, timeout: float = 120.0) -> dict:
    """The results of scripts started side by side."""
    try:
        return {name: r.finish(timeout) for name, r in runs.items()}
    finally:
        for r in runs.values():
            r.home.cleanup()


def test_official_client_features(group_and_proxy):
    cluster, endpoint, root = group_and_proxy
    # Producers (normal, FIFO, delay), transactions, wrong credentials: side by side.
    out = _all({
        "normal": start_script("produce.py", [endpoint, AK, SK, "Normal", "normal", 20]),
        "fifo": start_script("produce.py", [endpoint, AK, SK, "Fifo", "fifo", 20]),
        "delay": start_script("produce.py", [endpoint, AK, SK, "Delay", "delay", 3]),
        # commit and the unknown one (checked, answered COMMIT) arrive; the rollback never
        "tx": start_script("transaction.py", [endpoint, AK, SK, "Tx"]),
        "wrong": start_script("produce.py", [endpoint, AK, "wrong-secret", "Normal", "normal", 1]),
        "anonymous": start_script("produce.py", [endpoint, "-", "-", "Normal", "normal", 1]),
    })
    normal, fifo, delay, tx = out["normal"], out["fifo"], out["delay"], out["tx"]
    for name in ("normal", "fifo", "delay"):
        assert out[name]["failed"] == 0 and out[name]["ids"], out[name]
    for name in ("wrong", "anonymous"):  # refused, and the proxy said why
        assert not out[name]["ids"] and any("40100" in x or "UNAUTHORIZED" in x for x in out[name]["log"]), out[name]
    assert tx["check_seen"] and tx["unknown"] in tx["checked"], tx
    files = {}
    for name, ids in (("normal", normal["ids"]), ("tx", [tx["commit"], tx["unknown"]]), ("delay", delay["ids"])):
        files[name] = root / f"{name}-ids.json"
        files[name].write_text(json.dumps(ids))
    # Consumers side by side: SimpleConsumer (one message changed-invisible
    # first and received again), the transaction's and the delayed messages
    # (after their due time), PushConsumer normal and FIFO.
    got = _all({
        "simple": start_script("simple.py", [endpoint, AK, SK, "Normal", "SimpleGroup", files["normal"], "change"]),
        "tx": start_script("simple.py", [endpoint, AK, SK, "Tx", "TxGroup", files["tx"]]),
        "delay": start_script("simple.py", [endpoint, AK, SK, "Delay", "DelayGroup", files["delay"]]),
        "push": start_script("push.py", [endpoint, AK, SK, "Normal", "PushGroup", 20]),
        "fifo": start_script("push.py", [endpoint, AK, SK, "Fifo", ORDERLY_GROUP, 20]),
    })
    simple = got["simple"]
    assert simple["complete"], simple
    assert simple["changed"] in normal["ids"] and simple["changed_deliveries"] >= 2, simple
    assert set(got["tx"]["acked"]) == {tx["commit"], tx["unknown"]}, got["tx"]  # the rolled-back half never shows
    assert got["delay"]["complete"], got["delay"]
    assert {c[0] for c in got["push"]["consumed"]} == set(normal["ids"]), got["push"]
    fifo_push = got["fifo"]
    assert fifo_push["fifo"] is True  # the orderly group's settings
    assert {c[0] for c in fifo_push["consumed"]} == set(fifo["ids"])
    for g in ("g0", "g1"):
        seq = [int(body.split("-")[1]) for _id, body, grp, _attempt in fifo_push["consumed"] if grp == g]
        first = [n for k, n in enumerate(seq) if n not in seq[:k]]
        assert first == sorted(first), (g, seq)  # each message group in send order


def test_official_client_across_a_master_kill(group_and_proxy):
    cluster, endpoint, root = group_and_proxy
    ids_file = root / "failover-ids.json"
    consumer = start_script("simple.py", [endpoint, AK, SK, "Failover", "FailoverGroup", ids_file, "watch"])
    pusher = start_script("push.py", [endpoint, AK, SK, "Failover", "FailoverPushGroup", f"@{ids_file}"])
    producer = start_script("produce.py", [endpoint, AK, SK, "Failover", "normal", 300])
    killed = None
    try:
        for event in producer.events(timeout=120):
            if "sent" in event and event["sent"] >= 100 and killed is None:
                killed = cluster.call(cluster.cluster.wait_master, settled=False)
                cluster.kill(killed)
        result = producer.finish(30)
    finally:
        producer.home.cleanup()
    assert killed is not None
    acked = result["ids"]
    assert len(acked) >= 250, result  # the client retries across the failover; few if any sends fail
    ids_file.write_text(json.dumps(acked))
    try:
        got = consumer.finish(150)
    finally:
        consumer.home.cleanup()
    missing = set(acked) - set(got["acked"])
    errors = [e for e in consumer.lines if "receive_error" in e or "ack_error" in e]
    try:
        pushed = pusher.finish(150)
    finally:
        pusher.home.cleanup()
    # nothing acknowledged is lost ("missing": each missing id, how often it
    # was delivered and why its last ack failed)
    assert got["complete"], (len(missing), got["missing"], errors[-8:])
    assert pushed["complete"], len(set(acked) - {c[0] for c in pushed["consumed"]})  # the push consumer too
    # Nothing acked comes back (within an invisible time after the last ack).
    # A second copy of a message id (delivery attempt 1) is a send retried
    # across the kill, stored twice: at-least-once on the producer's side.
    assert not got["redelivered_after_ack"], got["redelivered_after_ack"]
    seen: set = set()
    push_again = [c for c in pushed["consumed"] if c[0] in seen or seen.add(c[0])]
    assert not [c for c in push_again if c[3] > 1], push_again  # nor to the push consumer
    print(f"failover: {len(acked)} acknowledged sends, {result['failed']} failed, "
          f"{len(got['duplicate_copies'])} duplicate copies delivered to the simple consumer, "
          f"{len(push_again)} to the push consumer")
