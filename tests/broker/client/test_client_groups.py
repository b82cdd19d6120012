# Push consumers in a consumer group on a real 3-broker group: two consumers
# split the queues by average allocation (rebalanced on the broker's
# NOTIFY_CONSUMER_IDS_CHANGED, with the periodic rebalance set far away),
# the survivor takes every queue when one leaves, offsets are committed on
# close and a restarted consumer resumes there; and the blocking facade
# from plain synchronous code.
# Slow: a real 3-broker group per test; consumers join, leave and rebalance.
import threading

import pytest
import trio

from broker.client import (
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    PullStatus,
    SendStatus,
    allocate_averagely,
    open_producer,
    open_pull_consumer,
    open_push_consumer,
)
from broker.client.blocking import BlockingProducer, BlockingPullConsumer, BlockingPushConsumer
from broker.client.consumer_api import ConsumerApi
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from tests.broker.client.helpers import wait_committed
from tests.helpers.waiting import wait_until
from tools.brokercluster import open_broker_cluster

pytestmark = pytest.mark.slow


def owned(consumer, topic):
    """The consumer's queues of `topic` (it also owns %RETRY%<group> queues)."""
    return [q for q in consumer.assigned_queues() if q.topic == topic]


async def test_group_splits_rebalances_commits_and_resumes(tmp_path):
    topic, group = "Grouped", "g_split"
    async with open_broker_cluster(tmp_path) as cluster:
        await cluster.wait_master()
        ns = cluster.namesrv_addr
        got: dict[str, list[bytes]] = {"c1": [], "c2": [], "c3": []}

        def handler(name):
            async def handle(msgs):
                got[name].extend(m.body for m in msgs)
                return ConsumeStatus.CONSUME_SUCCESS
            return handle

        opts = dict(namesrv_addr=ns, subscriptions={topic: "*"}, rebalance_interval=120,
                    consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
        async with open_producer("g_producer", namesrv_addr=ns) as producer, \
                open_pull_consumer("g_observer", namesrv_addr=ns) as observer:
            await producer.send(Message(topic, b"create"), selector=lambda qs, m: qs[0])
            queues = await observer.fetch_queues(topic)
            assert len(queues) == 4

            async def send(prefix, n):
                for i in range(n):
                    r = await producer.send(Message(topic, f"{prefix}-{i}".encode()))
                    assert r.status is SendStatus.SEND_OK

            async with open_push_consumer(group, handler=handler("c1"), **opts) as c1:
                await wait_until(lambda: len(owned(c1, topic)) == 4, 10, "c1 owns all")
                async with open_push_consumer(group, handler=handler("c2"), **opts) as c2:
                    ids = sorted([c1.instance.client_id, c2.instance.client_id])
                    await wait_until(lambda: len(owned(c1, topic)) == 2 and len(owned(c2, topic)) == 2,
                                   10, "split")
                    for c in (c1, c2):
                        assert owned(c, topic) == allocate_averagely(c.instance.client_id, queues, ids)
                    await wait_until(lambda: b"create" in got["c1"] + got["c2"], 10, "create consumed")
                    await send("two", 40)
                    await wait_until(lambda: sum(b.startswith(b"two-") for b in got["c1"] + got["c2"]) >= 40,
                                   15, "two consumed")
                    two = [b for b in got["c1"] + got["c2"] if b.startswith(b"two-")]
                    assert sorted(two) == sorted(f"two-{i}".encode() for i in range(40))  # exactly once
                    assert any(b.startswith(b"two-") for b in got["c1"])
                    assert any(b.startswith(b"two-") for b in got["c2"])
                # c2 left: the broker's notification makes c1 take every queue
                await wait_until(lambda: len(owned(c1, topic)) == 4, 10, "c1 takes over")
                await send("one", 20)
                await wait_until(lambda: sum(b.startswith(b"one-") for b in got["c1"]) >= 20, 15, "one consumed")
            # c1 closed and committed: every queue's committed offset is its max offset
            await wait_committed(ConsumerApi(observer.instance, group), observer, queues)
            await send("later", 10)
            async with open_push_consumer(group, handler=handler("c3"), **opts):
                await wait_until(lambda: len(got["c3"]) >= 10, 15, "c3 resumed")
                # c3 committed every queue's max offset: it consumed all it was going to
                # (a re-read from an earlier offset would be in got["c3"] before that)
                await wait_committed(ConsumerApi(observer.instance, group), observer, queues, timeout=20)
                assert sorted(got["c3"]) == sorted(f"later-{i}".encode() for i in range(10))
                # resetOffsetByTime to the beginning: the broker resets and tells c3, which reads all again
                master = await cluster.wait_master()
                reset = RemotingCommand.create_request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {
                    "topic": topic, "group": group, "timestamp": 0, "isForce": True})
                resp = await cluster.remoting.invoke(cluster.addr(master), reset, 10)
                assert resp.code == ResponseCode.SUCCESS and resp.ext_fields["notifiedClients"] == "1", resp
                await wait_until(lambda: len(got["c3"]) >= 10 + 71, 15, "c3 re-read everything")
            assert set(got["c3"]) == set(got["c1"] + got["c2"]) | {f"later-{i}".encode() for i in range(10)}


async def test_blocking_facade_from_sync_code(tmp_path):
    topic = "Blocking"
    async with open_broker_cluster(tmp_path) as cluster:
        await cluster.wait_master()
        ns = cluster.namesrv_addr

        def sync_program() -> dict:
            out = {}
            with BlockingProducer("b_producer", namesrv_addr=ns) as producer:
                results = [producer.send(Message(topic, f"b-{i}".encode(), tags="B")) for i in range(8)]
                out["statuses"] = {r.status for r in results}
                out["batch"] = producer.send_batch([Message(topic, f"bb-{i}".encode()) for i in range(3)])
                producer.send_oneway(Message(topic, b"b-oneway"))
            with BlockingPullConsumer("b_puller", namesrv_addr=ns) as pc:
                bodies, queues = [], pc.fetch_queues(topic)
                offsets = {mq: 0 for mq in queues}
                for _ in range(20):  # passes over the queues until all 12 are in (consume queues may lag commits)
                    for mq in queues:
                        while True:
                            res = pc.pull(mq, offsets[mq], block=0.2)
                            if res.status is PullStatus.NO_NEW_MSG:
                                break
                            bodies += [m.body for m in res.messages]
                            offsets[mq] = res.next_begin_offset
                    if len(bodies) >= 12:
                        break
                for mq, offset in offsets.items():
                    pc.update_offset(mq, offset)
                    assert pc.fetch_offset(mq) == offset
                out["pulled"] = bodies
            seen, lock, done = [], threading.Lock(), threading.Event()

            def handle(msgs):
                assert threading.current_thread() is not threading.main_thread()
                with lock:
                    seen.extend(m.body for m in msgs)
                    if len(seen) >= 12:
                        done.set()
                return ConsumeStatus.CONSUME_SUCCESS
            with BlockingPushConsumer("b_push", namesrv_addr=ns, subscriptions={topic: "*"}, handler=handle,
                                      consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET) as consumer:
                out["complete"] = done.wait(20)
                out["assigned"] = len([q for q in consumer.assigned_queues() if q.topic == topic])
            out["pushed"] = sorted(seen)
            return out

        out = await trio.to_thread.run_sync(sync_program)
        expect = sorted([f"b-{i}".encode() for i in range(8)] + [f"bb-{i}".encode() for i in range(3)] + [b"b-oneway"])
        assert out["statuses"] == {SendStatus.SEND_OK}
        assert len(out["batch"]) == 3
        assert sorted(out["pulled"]) == expect
        assert out["complete"] and out["assigned"] == 4
        assert out["pushed"] == expect
