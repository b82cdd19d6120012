# Planned operations under continuous load from the stock C++ client
# (rocketmq==0.4.4) and the Python client, on real processes
# (tools/brokercluster.py), with the commands the README gives:
#
#   - `mqadmin rollingRestart` restarts every node of the group one at a
#     time -- the master last, after handing its leadership over -- through
#     a --restart-command that asks this test (over a loopback socket) to
#     stop and start the node, so every process stays one this test started
#     and ends by PID;
#   - replacing the master node: a fresh node n3 is added as a learner
#     (addDLedgerPeer, the broker started with dLegerJoin=true), catches up,
#     is promoted (promoteDLedgerPeer), the master is removed
#     (removeDLedgerPeer hands its leadership over first) and, after the
#     drain, stopped.
#
# The checker: no send of either producer failed, everything acknowledged
# is consumed, dledgerStatus shows the configuration on every node, the
# replicas are identical, and (replacement) verifyStore --cq finds every
# store clean once stopped.
# Slow: real 3- and 4-broker groups under load, restarts and membership
#   changes, and a 35 s drain for the stock client's 30 s route poll.
import json
import sys

import pytest
import trio

from broker.client import ConsumeFromWhere, ConsumeStatus, open_producer, open_push_consumer
from tests.broker.compat.stock_client import run_script
from tests.broker.test_multi_group import Load
from tests.helpers.cli import mqadmin
from tools.brokercluster import open_broker_cluster

pytestmark = pytest.mark.slow

TOPIC, GROUP = "Rolling", "rolling_consumers"
# The restart command: tell the test which node, wait for its "ok".
ASK = ("import socket, sys; s = socket.create_connection(('127.0.0.1', int(sys.argv[1]))); "
       "s.sendall(sys.argv[2].encode() + b'\\n'); sys.exit(0 if s.makefile().readline().strip() == 'ok' else 1)")


async def serve_restarts(cluster, restarted: list, *, task_status=trio.TASK_STATUS_IGNORED):
    """A loopback port that restarts the node named on each connection
    (SIGTERM, then the same broker.conf) and answers "ok"."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])

    async def one(stream):
        async with stream:
            line = b""
            while not line.endswith(b"\n"):
                chunk = await stream.receive_some(100)
                if not chunk:
                    return
                line += chunk
            node = line.decode().strip()
            await cluster.stop(node)
            await cluster.start_broker(node)
            restarted.append(node)
            await stream.send_all(b"ok\n")
    await trio.serve_listeners(one, listeners)


async def test_rolling_restart_fails_no_send(tmp_path, stock_client):
    async with open_broker_cluster(tmp_path, cluster_name="LedgerCluster") as cluster:
        first_master = await cluster.wait_master()
        ns = cluster.namesrv_addr
        await mqadmin("updateTopic", "-c", "LedgerCluster", "-t", TOPIC, "-r", "4", "-w", "4", ns=ns)
        restarted: list = []
        until = tmp_path / "stop-producing"
        stock: dict = {}
        async with trio.open_nursery() as restarts:
            port = await restarts.start(serve_restarts, cluster, restarted)
            async with open_producer("rolling_producers", namesrv_addr=ns) as producer, \
                    trio.open_nursery() as nursery:
                load = Load(producer, TOPIC, senders=4)
                nursery.start_soon(load.run)
                nursery.start_soon(stock_producer(ns, TOPIC, until, stock))
                await more_acks(load, 200)  # the group serves (the stock producer's count is checked at the end)
                out = await mqadmin("rollingRestart", "-b", "broker-a", "--json", "--drain-seconds", "35",
                                    "--restart-command", f"{sys.executable} -c \"{ASK}\" {port} {{selfId}}", ns=ns)
                report = json.loads(out)
                await more_acks(load, 200)  # and it goes on serving after the last restart
                until.touch()
                load.stop.set()
            restarts.cancel_scope.cancel()

        # Every node restarted once, the master last after handing over.
        done = report["restarted"]
        assert sorted(d["selfId"] for d in done) == ["n0", "n1", "n2"] == sorted(restarted)
        assert done[-1]["selfId"] == first_master and done[-1]["wasLeader"]
        assert [d["wasLeader"] for d in done[:-1]] == [False, False]
        assert await cluster.wait_master() != first_master

        # No send failed, from either client.
        sent = stock["run"].result["sent"]
        no_send_failed("rolling restart", load, sent)

        # Everything acknowledged is consumed, and the replicas are identical.
        await consume_all(ns, TOPIC, GROUP, {body for _, _, body in load.acked} | stock_bodies(sent))
        await replicas_identical(ns)


async def more_acks(load, n: int, timeout: float = 30.0) -> None:
    """Until the Python producer has `n` more acknowledged sends than now."""
    target = len(load.acked) + n
    with trio.fail_after(timeout):
        while len(load.acked) < target:
            await trio.sleep(0.05)


def stock_bodies(sent: list) -> set[str]:
    return {f"stock-{i}" for i in range(len(sent))}


def no_send_failed(what: str, load, sent: list) -> None:
    stock_errors = [s for s in sent if "error" in s]
    print(f"\n[{what}] python: {len(load.acked)} acknowledged, {load.errors} failed; "
          f"stock C++: {len(sent)} sent, {len(stock_errors)} failed")
    assert load.errors == 0
    assert stock_errors == [] and all(s["status"] == "OK" for s in sent), stock_errors[:5]
    assert len(sent) > 100 and len(load.acked) > 100


async def consume_all(ns: str, topic: str, group: str, expected: set[str]) -> None:
    received: set[str] = set()
    all_in = trio.Event()

    async def handler(msgs):
        received.update(m.body.decode() for m in msgs)
        if expected <= received:
            all_in.set()
        return ConsumeStatus.CONSUME_SUCCESS

    async with open_push_consumer(group, namesrv_addr=ns, subscriptions={topic: "*"}, handler=handler,
                                  consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET):
        with trio.fail_after(60):
            await all_in.wait()


async def replicas_identical(ns: str) -> None:
    """compareReplicas, asked until the three replicas are caught up (a
    restarted or new node may still be replicating the tail)."""
    with trio.fail_after(30):
        while True:
            compared = json.loads(await mqadmin("compareReplicas", "-c", "broker-a", "--json", ns=ns))
            if compared["consistent"] and len(compared["replicas"]) == 3:
                return
            await trio.sleep(0.5)


def stock_producer(ns: str, topic: str, until, box: dict):
    """The stock C++ producer, one sync send every 20 ms until `until` exists."""
    async def run():
        box["run"] = await trio.to_thread.run_sync(lambda: run_script(
            "produce.py", [ns, topic, "100000", "--group", f"{topic}_stock", "--body-prefix", "stock-",
                           "--until-file", str(until), "--pace-ms", "20", "--shutdown"], timeout=400))
    return run


async def test_replace_the_master_node_fails_no_send(tmp_path, stock_client):
    topic, group = "Replaced", "replaced_consumers"
    async with open_broker_cluster(tmp_path, cluster_name="LedgerCluster") as cluster:
        old = await cluster.wait_master()
        ns = cluster.namesrv_addr
        await mqadmin("updateTopic", "-c", "LedgerCluster", "-t", topic, "-r", "4", "-w", "4", ns=ns)
        until = tmp_path / "stop-producing"
        stock: dict = {}
        async with open_producer("replace_producers", namesrv_addr=ns) as producer, \
                trio.open_nursery() as nursery:
            load = Load(producer, topic, senders=4)
            nursery.start_soon(load.run)
            nursery.start_soon(stock_producer(ns, topic, until, stock))
            await more_acks(load, 200)  # the group serves (the stock producer's count is checked at the end)
            started = trio.current_time()
            marks: dict = {}

            peer = cluster.add_node("n3")
            out = await mqadmin("addDLedgerPeer", "-b", "broker-a", "--peer", f"n3-{peer}", ns=ns)
            assert "added n3" in out and "learners n3" in out
            await cluster.start_broker("n3")
            status = json.loads(await mqadmin("dledgerStatus", "-b", "broker-a", "--json", ns=ns))
            n3 = next(n for n in status["nodes"] if n["selfId"] == "n3")
            assert "n3" in n3["learners"] or n3["voters"] == []        # a learner (or still learning that)

            out = await mqadmin("promoteDLedgerPeer", "-b", "broker-a", "-p", "n3", "--wait", "90", ns=ns)
            assert "promoted n3" in out
            marks["promoted"] = round(trio.current_time() - started, 1)
            out = await mqadmin("removeDLedgerPeer", "-b", "broker-a", "-p", old, ns=ns)
            assert f"removed {old}" in out and f"handed from {old}" in out
            marks["removed"] = round(trio.current_time() - started, 1)
            # The README's step 5: clients' next route poll finds the new
            # master while the old one hands on what it still receives.
            await trio.sleep(35)  # the drain is time itself: the C++ client asks for routes every 30 s
            await cluster.stop(old)
            done = trio.current_time()
            marks["stopped"] = round(done - started, 1)
            await more_acks(load, 200)  # the group goes on serving without the old node
            until.touch()
            load.stop.set()

        acks = sorted(t for t, _, _ in load.acked)
        during = [(y - x, x) for x, y in zip(acks, acks[1:]) if started <= y <= done + 1]
        pause, at = max(during)
        print(f"\n[replacement] longest pause between acknowledgements during the replacement "
              f"{pause * 1000:.0f} ms, from {at - started:.1f} s after the start; marks: {marks}")
        during = [p for p, _ in during]
        assert max(during) < 3.0                   # a leadership hand-over, not an outage
        no_send_failed("replacement", load, stock["run"].result["sent"])
        await consume_all(ns, topic, group, {body for _, _, body in load.acked}
                          | stock_bodies(stock["run"].result["sent"]))

        # Every node has the new configuration, the replicas are identical ...
        members = sorted({"n0", "n1", "n2", "n3"} - {old})
        status = json.loads(await mqadmin("dledgerStatus", "-b", "broker-a", "--json", ns=ns))
        live = {n["selfId"]: n for n in status["nodes"]}
        assert sorted(live) == members
        for n in live.values():
            assert sorted(n["voters"]) == members and n["learners"] == [], n
        await replicas_identical(ns)
        # ... and every store verifies, the new node's included.
        for node in members:
            await cluster.stop(node)
        for node in members:
            out = await mqadmin("verifyStore", "--store", cluster.store_root(node), "--self-id", node, "--cq",
                                "--json")
            assert json.loads(out)["problems"] == [], out
