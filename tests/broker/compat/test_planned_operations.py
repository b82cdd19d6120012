# Planned operations under continuous load from the stock C++ client
# (rocketmq==0.4.4) and the Python client, on real processes
# (tools/brokercluster.py): `mqadmin rollingRestart` restarts every node of
# the group one at a time -- the master last, after handing its leadership
# over -- through a --restart-command that asks this test (over a loopback
# socket) to stop and start the node, so every process stays one this test
# started and ends by PID.  The checker: no send of either producer failed,
# everything acknowledged is consumed, and the replicas are identical.
import json
import sys

import pytest
import trio

from broker.client import ConsumeFromWhere, ConsumeStatus, open_producer, open_push_consumer
from tests.broker.compat.stock_client import run_script
from tests.broker.test_multi_group import Load
from tests.broker.test_node_replacement import mqadmin
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
    async with open_broker_cluster(tmp_path, cluster_name="LedgerCluster") as cluster, trio.open_nursery() as bg:
        first_master = await cluster.wait_master()
        ns = cluster.namesrv_addr
        await mqadmin("updateTopic", "-c", "LedgerCluster", "-t", TOPIC, "-r", "4", "-w", "4", ns=ns)
        restarted: list = []
        port = await bg.start(serve_restarts, cluster, restarted)
        until = tmp_path / "stop-producing"
        stock: dict = {}

        async def stock_producer():
            stock["run"] = await trio.to_thread.run_sync(lambda: run_script(
                "produce.py", [ns, TOPIC, "100000", "--group", "rolling_stock", "--body-prefix", "stock-",
                               "--until-file", str(until), "--pace-ms", "20", "--shutdown"], timeout=400))

        async with open_producer("rolling_producers", namesrv_addr=ns) as producer, \
                trio.open_nursery() as nursery:
            load = Load(producer, TOPIC, senders=4)
            nursery.start_soon(load.run)
            nursery.start_soon(stock_producer)
            await trio.sleep(3.0)  # both producers running
            out = await mqadmin("rollingRestart", "-b", "broker-a", "--json", "--drain-seconds", "35",
                                "--restart-command", f"{sys.executable} -c \"{ASK}\" {port} {{selfId}}", ns=ns)
            report = json.loads(out)
            await trio.sleep(2.0)
            until.touch()
            load.stop.set()
        bg.cancel_scope.cancel()

        # Every node restarted once, the master last after handing over.
        done = report["restarted"]
        assert sorted(d["selfId"] for d in done) == ["n0", "n1", "n2"] == sorted(restarted)
        assert done[-1]["selfId"] == first_master and done[-1]["wasLeader"]
        assert [d["wasLeader"] for d in done[:-1]] == [False, False]
        assert await cluster.wait_master() != first_master

        # No send failed, from either client.
        sent = stock["run"].result["sent"]
        stock_errors = [s for s in sent if "error" in s]
        print(f"\n[rolling restart] python: {len(load.acked)} acknowledged, {load.errors} failed; "
              f"stock C++: {len(sent)} sent, {len(stock_errors)} failed")
        assert load.errors == 0
        assert stock_errors == [] and all(s["status"] == "OK" for s in sent), stock_errors[:5]
        assert len(sent) > 100 and len(load.acked) > 100

        # Everything acknowledged is consumed ...
        expected = {body for _, _, body in load.acked} | {f"stock-{i}" for i in range(len(sent))}
        received: set[str] = set()
        all_in = trio.Event()

        async def handler(msgs):
            received.update(m.body.decode() for m in msgs)
            if expected <= received:
                all_in.set()
            return ConsumeStatus.CONSUME_SUCCESS

        async with open_push_consumer(GROUP, namesrv_addr=ns, subscriptions={TOPIC: "*"}, handler=handler,
                                      consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET):
            with trio.fail_after(60):
                await all_in.wait()
        # ... and the replicas are identical.
        with trio.fail_after(30):
            while True:
                compared = json.loads(await mqadmin("compareReplicas", "-c", "broker-a", "--json", ns=ns))
                if compared["consistent"] and len(compared["replicas"]) == 3:
                    break
                await trio.sleep(0.5)
