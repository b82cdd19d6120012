# The stock C++ client (rocketmq==0.4.4) on the paths of issue 15, against a
# real name server + 3-broker group: send_orderly and the orderly push
# consumer (which takes its queues with LOCK_BATCH_MQ) keep each key's order;
# our send_orderly feeds the stock orderly consumer, and the stock producer's
# ordered messages feed our orderly consumer.  (The bundled client has no
# transactional producer, so transactions are covered by our client only.
# Its orderly consumer does not hand over again a message whose callback
# raised -- observed with rocketmq-client-cpp 1.0.1, a client-side matter --
# so retry by a raising callback is checked in concurrent mode, in
# test_stock_broker.py.)
import collections

import pytest
import trio

from broker.client import ConsumeFromWhere, ConsumeStatus, Message, open_producer, open_push_consumer
from tests.broker.client.feature_helpers import order_problems
from tests.broker.compat.stock_client import run_script
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
