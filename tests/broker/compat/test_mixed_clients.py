# Mixed clients on a real name server + 3-broker DLedger group: our Python
# producer feeding the stock C++ push consumer (rocketmq==0.4.4), and the
# stock producer feeding our push consumer.  Bodies, tags, keys and message
# ids must agree across the two implementations.
# Slow: a real 3-broker group and the stock C++ client's processes.
import pytest
import trio

from broker.client import ConsumeFromWhere, ConsumeStatus, Message, SendStatus, open_producer, open_push_consumer
from tests.broker.compat.stock_client import run_script
from tools.brokercluster import open_broker_cluster

pytestmark = pytest.mark.slow


async def run_stock(script: str, args: list, timeout: float):
    return await trio.to_thread.run_sync(lambda: run_script(script, [str(a) for a in args], timeout=timeout))


async def test_mixed_producers_and_consumers(tmp_path, stock_client):
    ours_topic, stock_topic, n = "MixedOurs", "MixedStock", 16
    async with open_broker_cluster(tmp_path) as cluster:
        await cluster.wait_master()
        ns = cluster.namesrv_addr

        # our producer -> stock push consumer
        sent = {}
        async with open_producer("mixed_py_producer", namesrv_addr=ns) as producer:
            for i in range(n):
                r = await producer.send(Message(ours_topic, f"py-{i}".encode(), tags="TagPy", keys=[f"pk{i}"]))
                assert r.status is SendStatus.SEND_OK
                sent[f"py-{i}"] = r
        run = await run_stock("push.py", [ns, ours_topic, n, "--group", "mixed_cpp_push", "--wait", 40], timeout=70)
        got = {m["body"]: m for m in run.result["messages"]}
        assert run.result["complete"], (sorted(got), run.log_text[-3000:])
        assert set(got) == set(sent)
        for body, m in got.items():
            r = sent[body]
            assert (m["topic"], m["tags"], m["queue_id"], m["queue_offset"]) == (
                ours_topic, "TagPy", r.queue.queue_id, r.queue_offset)
            assert m["id"] == r.msg_id  # the C++ client reports the UNIQ_KEY our producer set

        # stock producer -> our push consumer
        received: dict[str, object] = {}
        all_in = trio.Event()

        async def handler(msgs):
            for m in msgs:
                received[m.body.decode()] = m
            if len(received) >= n:
                all_in.set()
            return ConsumeStatus.CONSUME_SUCCESS

        prod = await run_stock("produce.py", [ns, stock_topic, n, "--tags", "TagCpp", "--keys", "ck",
                                              "--body-prefix", "cpp-"], timeout=60)
        assert prod.result["ok"] == n, (prod.result, prod.log_text[-3000:])
        stock_ids = {f"cpp-{i}": s["msg_id"] for i, s in enumerate(prod.result["sent"])}
        async with open_push_consumer("mixed_py_push", namesrv_addr=ns, subscriptions={stock_topic: "TagCpp"},
                                      handler=handler, consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET):
            with trio.fail_after(20):
                await all_in.wait()
        assert set(received) == set(stock_ids)
        for body, m in received.items():
            i = int(body.split("-")[1])
            assert (m.topic, m.tags, m.keys) == (stock_topic, "TagCpp", [f"ck{i}"])
            assert m.msg_id == stock_ids[body]
