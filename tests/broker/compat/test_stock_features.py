# The stock C++ client (rocketmq==0.4.4) on the paths of issue 15, against a
# real name server + 3-broker group: send_orderly and the orderly push
# consumer (which takes its queues with LOCK_BATCH_MQ) keep each key's order;
# our send_orderly feeds the stock orderly consumer, and the stock producer's
# ordered messages feed our orderly consumer.  (The bundled client has no
# transactional producer, so transactions are covered by our client only.
# Its orderly consumer does not hand over again a message whose callback
# raised -- observed with rocketmq-client-cpp 1.0.1, a client-side matter --
# so retry by a raising callback is checked in concurrent mode, in
# test_stock_broker.py.)  The stock orderly consumer across a kill -9 of
# the master.  Broadcasting: two stock consumers and one of ours in one
# group each get every message.
# Slow: a real 3-broker group per test and stock C++ client processes; the
#   master kill waits out the C++ client's 30 s timers.
import collections
import json

import pytest
import trio

from broker.client import (
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    open_producer,
    open_pull_consumer,
    open_push_consumer,
)
from broker.client.errors import NoRouteError
from tests.broker.client.feature_helpers import order_problems
from tests.broker.compat.stock_client import run_script
from tests.helpers.waiting import wait_until
from tools.brokercluster import open_broker_cluster

pytestmark = pytest.mark.slow


async def run_stock(script: str, args: list, timeout: float):
    return await trio.to_thread.run_sync(lambda: run_script(script, [str(a) for a in args], timeout=timeout))


def per_key(consumed: list[dict]) -> dict[str, list[int]]:
    out = collections.defaultdict(list)
    for m in consumed:
        if not m.get("failed"):
            key, seq = m["body"].split(":")
            out[key].append(int(seq))
    return out


async def test_stock_orderly_producer_and_consumer(tmp_path, stock_client):
    keys, n = 4, 6
    async with open_broker_cluster(tmp_path) as cluster:
        await cluster.wait_master()
        ns = cluster.namesrv_addr
        run = await run_stock("orderly.py", [ns, "StockOrd", keys, n, "--wait", 60], timeout=90)
        r = run.result
        assert all(s["status"] == "OK" for s in r["sent"]), r["sent"]
        assert r["complete"], (r["consumed"], run.log_text[-3000:])
        queues = collections.defaultdict(set)
        for m in r["consumed"]:
            queues[m["body"].split(":")[0]].add(m["queue_id"])
        assert all(len(q) == 1 for q in queues.values()), queues
        for key, seqs in per_key(r["consumed"]).items():
            assert not order_problems(seqs, n), (key, seqs)

        # ours -> stock: our send_orderly, the stock orderly consumer
        async with open_producer("ours_ord_p", namesrv_addr=ns) as p:
            for seq in range(n):
                for key in range(keys):
                    await p.send_orderly(Message("OursOrd", f"k{key}:{seq}".encode()), f"k{key}")
        run = await run_stock("orderly.py", [ns, "OursOrd", keys, n, "--no-send", "--group", "stock_reads_ours",
                                             "--wait", 60], timeout=90)
        assert run.result["complete"], run.log_text[-3000:]
        for key, seqs in per_key(run.result["consumed"]).items():
            assert not order_problems(seqs, n), (key, seqs)

        # stock -> ours: the stock send_orderly, our orderly consumer
        got: dict[str, list[int]] = collections.defaultdict(list)

        async def handler(msgs):
            for m in msgs:
                key, seq = m.body.decode().split(":")
                got[key].append(int(seq))
            return ConsumeStatus.CONSUME_SUCCESS

        async with open_push_consumer("ours_reads_stock", namesrv_addr=ns, subscriptions={"StockOrd": "*"},
                                      handler=handler, orderly=True,
                                      consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET):
            with trio.fail_after(30):
                while sum(len(v) for v in got.values()) < keys * n:
                    await trio.sleep(0.05)
        for key, seqs in got.items():
            assert not order_problems(seqs, n), (key, seqs)


async def test_stock_broadcasting_consumers_each_get_everything(tmp_path, stock_client):
    """Two stock consumers in BROADCASTING mode and one of ours share a group:
    each gets every message (no queue is shared out; the stock ones keep
    their offsets in their local store).  The stock consumers start from the
    queues' max offsets, so probes go to every queue until each consumer shows
    one from each (their --progress files); only then do the counted ones go."""
    topic, group, n = "StockBc", "stock_bc_g", 12
    progress = {name: tmp_path / f"{name}.jsonl" for name in ("s1", "s2")}
    runs: dict = {}
    ours: list = []

    async def handler(msgs):
        ours.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    def probed(name) -> set:
        path = progress[name]
        lines = path.read_text().splitlines() if path.exists() else []
        return {d["queue_id"] for d in map(json.loads, lines) if d["body"].startswith("probe")}

    async with open_broker_cluster(tmp_path / "cluster") as cluster:
        await cluster.wait_master()
        ns = cluster.namesrv_addr
        async with open_producer("stock_bc_p", namesrv_addr=ns) as p, \
                open_pull_consumer("stock_bc_route", namesrv_addr=ns) as pc:
            await p.send(Message(topic, b"probe-create"))  # the topic exists before anyone subscribes

            async def route_queues():  # (auto-created on the master; the name server learns it a moment later)
                try:
                    return {mq.queue_id for mq in await pc.fetch_queues(topic)}
                except NoRouteError:
                    return None
            queue_ids = await wait_until(route_queues, 20, f"the name server's route of {topic}")

            async def stock(name):
                runs[name] = await run_stock("push.py", [ns, topic, n, "--group", group, "--broadcast",
                                                         "--progress", progress[name], "--count-prefix", "m",
                                                         "--wait", 60], timeout=90)

            async with trio.open_nursery() as nursery, \
                    open_push_consumer(group, namesrv_addr=ns, subscriptions={topic: "*"}, handler=handler,
                                       message_model="BROADCASTING", instance_name="ours",
                                       offset_store_dir=str(tmp_path / "offsets")):
                for name in progress:
                    nursery.start_soon(stock, name)
                with trio.fail_after(60):
                    while not all(probed(name) >= queue_ids for name in progress) or \
                            {m.queue_id for m in ours if m.body.startswith(b"probe")} < queue_ids:
                        for q in sorted(queue_ids):
                            await p.send(Message(topic, f"probe-{q}".encode()),
                                         selector=lambda qs, m, q=q: next(x for x in qs if x.queue_id == q))
                        await trio.sleep(0.5)
                for i in range(n):
                    await p.send(Message(topic, f"m{i}".encode()))
                with trio.fail_after(30):
                    while len({m.body for m in ours if m.body.startswith(b"m")}) < n:
                        await trio.sleep(0.05)
    want = sorted(f"m{i}" for i in range(n))
    for name, run in runs.items():
        assert run.result["complete"], (name, run.log_text[-3000:])
        assert sorted({m["body"] for m in run.result["messages"] if m["body"].startswith("m")}) == want, name
    assert sorted({m.body.decode() for m in ours if m.body.startswith(b"m")}) == want


async def test_stock_orderly_consumer_across_a_master_kill(tmp_path, stock_client):
    """The stock orderly consumer holds its queues' locks when the master is
    killed; it renews them on the new master (LOCK_BATCH_MQ, answered from
    the replicated lock table) and goes on there, each key in order, once its
    route refresh finds the new master (its long polls to the dead one time
    out after 30 s: about 35 s in all, client timers)."""
    keys, n1, n2 = 4, 5, 5
    prog = tmp_path / "progress.jsonl"

    def seen() -> int:
        return len(prog.read_text().splitlines()) if prog.exists() else 0

    async with open_broker_cluster(tmp_path / "cluster") as cluster:
        master = await cluster.wait_master()
        ns = cluster.namesrv_addr
        async with open_producer("stock_ordfo_p", namesrv_addr=ns) as p:
            async def send(seqs):
                for seq in seqs:
                    for key in range(keys):
                        await p.send_orderly(Message("StockOrdFo", f"k{key}:{seq}".encode()), f"k{key}")

            await send(range(n1))
            runs = {}

            async def stock():
                runs["run"] = await run_stock("orderly.py", [ns, "StockOrdFo", keys, n1 + n2, "--no-send",
                                                             "--group", "stock_ordfo", "--progress", prog,
                                                             "--wait", 120], timeout=160)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(stock)
                with trio.fail_after(30):
                    while seen() < keys * n1:
                        await trio.sleep(0.1)
                await trio.sleep(1)  # a lock renewal or offset commit may be in flight: the kill lands anywhere
                cluster.kill(master)
                await cluster.wait_master(exclude={master})
                await send(range(n1, n1 + n2))
    r = runs["run"].result
    assert r["complete"], (r["consumed"], runs["run"].log_text[-3000:])
    for key, seqs in per_key(r["consumed"]).items():
        assert not order_problems(seqs, n1 + n2), (key, seqs)
