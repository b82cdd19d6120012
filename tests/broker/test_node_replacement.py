# Replacing a node of a live group under load, with the commands the README
# gives (real processes, tools/brokercluster.py): a fresh node n3 is added
# as a learner (mqadmin addDLedgerPeer, the broker started with
# dLegerJoin=true), catches up from the leader's log, is promoted
# (promoteDLedgerPeer), and the current master is removed
# (removeDLedgerPeer hands its leadership over first) and stopped -- while
# a producer keeps sending.  The checker: every acknowledged send is
# consumed, dledgerStatus shows the new configuration on every node,
# compareReplicas finds the replicas identical, and verifyStore --cq finds
# every store (the new node's included) clean once stopped; and no send
# failed.
import json
import sys

import pytest
import trio

from broker.client import ConsumeFromWhere, ConsumeStatus, open_producer, open_push_consumer
from tests.broker.test_multi_group import Load
from tests.helpers import REPO_ROOT
from tools.brokercluster import open_broker_cluster

pytestmark = pytest.mark.slow

TOPIC, GROUP = "Replaced", "replaced_consumers"


async def mqadmin(*args, ns: str | None = None, expect: int = 0) -> str:
    argv = [sys.executable, "-m", "tools.mqadmin", *args] + (["-n", ns] if ns else [])
    r = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False, cwd=str(REPO_ROOT))
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == expect and "Traceback" not in err, (args, r.returncode, out, err)
    return out


async def test_replace_the_master_node_under_load(tmp_path):
    async with open_broker_cluster(tmp_path, cluster_name="LedgerCluster") as cluster:
        old = await cluster.wait_master()
        ns = cluster.namesrv_addr
        await mqadmin("updateTopic", "-c", "LedgerCluster", "-t", TOPIC, "-r", "4", "-w", "4", ns=ns)
        async with open_producer("replace_producers", namesrv_addr=ns) as producer, \
                trio.open_nursery() as nursery:
            load = Load(producer, TOPIC, senders=4)
            nursery.start_soon(load.run)
            await trio.sleep(2.0)
            started = trio.current_time()

            peer = cluster.add_node("n3")
            out = await mqadmin("addDLedgerPeer", "-b", "broker-a", "--peer", f"n3-{peer}", ns=ns)
            assert "added n3" in out and "learners n3" in out
            await cluster.start_broker("n3")
            status = json.loads(await mqadmin("dledgerStatus", "-b", "broker-a", "--json", ns=ns))
            n3 = next(n for n in status["nodes"] if n["selfId"] == "n3")
            assert "n3" in n3["learners"] or n3["voters"] == []        # a learner (or still learning that)

            out = await mqadmin("promoteDLedgerPeer", "-b", "broker-a", "-p", "n3", "--wait", "90", ns=ns)
            assert "promoted n3" in out
            out = await mqadmin("removeDLedgerPeer", "-b", "broker-a", "-p", old, ns=ns)
            assert f"removed {old}" in out and f"handed from {old}" in out
            await cluster.stop(old)
            done = trio.current_time()
            await trio.sleep(2.0)
            load.stop.set()

        acks = sorted(t for t, _, _ in load.acked)
        during = [y - x for x, y in zip(acks, acks[1:]) if started <= y <= done + 1]
        print(f"\n[replacement] {len(acks)} acknowledged, {load.errors} failed attempts; "
              f"longest pause between acknowledgements during the replacement {max(during) * 1000:.0f} ms")
        assert max(during) < 3.0                   # a leadership hand-over, not an outage
        assert load.errors == 0                    # the deposed master held or handed on what it received

        # The checker: nothing acknowledged is lost ...
        sent = {body for _, _, body in load.acked}
        received: set[str] = set()
        all_in = trio.Event()

        async def handler(msgs):
            received.update(m.body.decode() for m in msgs)
            if sent <= received:
                all_in.set()
            return ConsumeStatus.CONSUME_SUCCESS

        async with open_push_consumer(GROUP, namesrv_addr=ns, subscriptions={TOPIC: "*"}, handler=handler,
                                      consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET):
            with trio.fail_after(60):
                await all_in.wait()

        # ... every node has the new configuration ...
        members = sorted({"n0", "n1", "n2", "n3"} - {old})
        status = json.loads(await mqadmin("dledgerStatus", "-b", "broker-a", "--json", ns=ns))
        live = {n["selfId"]: n for n in status["nodes"]}
        assert sorted(live) == members
        for n in live.values():
            assert sorted(n["voters"]) == members and n["learners"] == [], n
        # ... the replicas are identical ...
        with trio.fail_after(30):
            while True:
                report = json.loads(await mqadmin("compareReplicas", "-c", "broker-a", "--json", ns=ns))
                if report["consistent"] and len(report["replicas"]) == 3:
                    break
                await trio.sleep(0.5)
        # ... and every store verifies, the new node's included.
        for node in members:
            await cluster.stop(node)
        for node in members:
            out = await mqadmin("verifyStore", "--store", cluster.store_root(node), "--self-id", node, "--cq",
                                "--json")
            assert json.loads(out)["problems"] == [], out
