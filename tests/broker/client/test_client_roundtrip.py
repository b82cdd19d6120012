# The Python client library against a real name server + 3-broker DLedger
# group (tools/brokercluster, real processes and TCP): send/receive with tag
# filtering, keys and properties; batch; oneway; queue selector; the pull
# consumer's statuses and offsets; a push consumer's RECONSUME_LATER path.
# Both under asyncio and trio (anyio backends; the cluster harness runs in a
# thread of its own, cluster_helpers.py).
# Slow: a real name server + 3-broker group per test, each test on two event
#   loops.
import time

import pytest
import anyio

from broker.client import (
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    PullStatus,
    SendStatus,
    open_producer,
    open_pull_consumer,
    open_push_consumer,
)
from broker.client.consumer_api import ConsumerApi
from broker.client.errors import NotSupportedError
from broker.remoting.codes import ResponseCode
from tests.broker.client.cluster_helpers import thread_cluster
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


@pytest.fixture
def cluster(tmp_path):
    with thread_cluster(tmp_path) as c:
        yield c


async def drain(pc, mq, until, offset=0, expression="*"):
    """The messages of mq in [offset, until) that match `expression`.
    Sends are answered once committed; the consume queue may follow a
    moment later, so pulls long-poll until `until` is reached."""
    out, res = [], None
    with anyio.fail_after(15):
        while offset < until:
            res = await pc.pull(mq, offset, max_nums=32, sub_expression=expression, block=2.0)
            assert res.status in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG, PullStatus.NO_NEW_MSG), res
            out += res.messages
            offset = res.next_begin_offset
    return out, res


def note_end(ends, result):
    ends[result.queue.queue_id] = max(ends.get(result.queue.queue_id, 0), result.queue_offset + 1)


async def test_send_pull_push_round_trip(cluster, anyio_backend):
    topic = "RoundTrip"
    await cluster.wait_master()
    ns = cluster.namesrv_addr
    async with open_producer("rt_producer", namesrv_addr=ns) as producer, \
            open_pull_consumer("rt_puller", namesrv_addr=ns) as pc:
        # single sends: tags, keys, properties; the broker auto-creates the topic (4 queues)
        sent, ends = {}, {}
        for i in range(12):
            tag = ["TagA", "TagB", "TagC"][i % 3]
            msg = Message(topic, f"body-{i}".encode(), tags=tag, keys=[f"k{i}", f"alt{i}"],
                          properties={"idx": str(i)})
            r = await producer.send(msg)
            assert r.status is SendStatus.SEND_OK and r.queue.topic == topic and r.queue_offset >= 0
            assert len(r.offset_msg_id) == 32
            sent[r.msg_id] = (msg, r)
            note_end(ends, r)
        queues = await pc.fetch_queues(topic)
        assert [q.queue_id for q in queues] == [0, 1, 2, 3]
        got = {}
        for mq in queues:
            msgs, _ = await drain(pc, mq, ends.get(mq.queue_id, 0))
            assert len(msgs) == ends.get(mq.queue_id, 0)
            for m in msgs:
                got[m.msg_id] = m
        assert set(got) == set(sent)
        for mid, (msg, r) in sent.items():
            m = got[mid]
            assert (m.body, m.tags, m.keys, m.properties["idx"]) == (msg.body, msg.tags, list(msg.keys),
                                                                    msg.properties["idx"])
            assert (m.queue, m.queue_offset, m.offset_msg_id) == (r.queue, r.queue_offset, r.offset_msg_id)
        # tag filtering on pull: only TagA/TagB come back
        filtered = []
        for mq in queues:
            msgs, _ = await drain(pc, mq, ends.get(mq.queue_id, 0), expression="TagA || TagB")
            filtered += msgs
        assert sorted(m.body for m in filtered) == sorted(
            msg.body for msg, _ in sent.values() if msg.tags in ("TagA", "TagB"))

        # queue selector: everything to queue 2
        for i in range(5):
            r = await producer.send(Message(topic, f"sel-{i}".encode(), tags="Sel"),
                                    selector=lambda qs, msg: qs[2])
            assert r.queue.queue_id == 2 and r.queue_offset == ends.get(2, 0)
            note_end(ends, r)
        # batch: one queue, consecutive offsets, one result per message
        batch = [Message(topic, f"batch-{i}".encode(), tags="Batch", keys=[f"b{i}"]) for i in range(6)]
        rs = await producer.send_batch(batch)
        assert len(rs) == 6 and len({r.queue for r in rs}) == 1
        assert [r.queue_offset for r in rs] == list(range(rs[0].queue_offset, rs[0].queue_offset + 6))
        assert len({r.msg_id for r in rs}) == 6
        note_end(ends, rs[-1])
        bq = rs[0].queue
        res = await pc.pull(bq, rs[0].queue_offset, max_nums=6, block=5)
        assert [m.body for m in res.messages] == [m.body for m in batch]
        assert [m.msg_id for m in res.messages] == [r.msg_id for r in rs]
        # oneway: arrives although nobody waits for an answer
        await producer.send_oneway(Message(topic, b"oneway-0", tags="One"), selector=lambda qs, m: qs[1])
        res = await pc.pull(queues[1], ends.get(1, 0), block=5)
        assert [m.body for m in res.messages] == [b"oneway-0"]
        ends[1] = ends.get(1, 0) + 1
        # async sends, many in flight on one connection
        results, done = [], anyio.Event()

        def callback(result, error):
            results.append((result, error))
            if len(results) == 20:
                done.set()
        for i in range(20):
            producer.send_async(Message(topic, f"async-{i}".encode(), tags="Async"), callback)
        with anyio.fail_after(20):
            await done.wait()
        assert all(e is None and r.status is SendStatus.SEND_OK for r, e in results)
        for r, _ in results:
            note_end(ends, r)

        # pull statuses and offsets
        mq = queues[0]
        top = ends[0]
        await drain(pc, mq, top)  # until queue 0 has everything sent to it
        res = await pc.pull(mq, top)
        assert res.status is PullStatus.NO_NEW_MSG and res.next_begin_offset == top
        res = await pc.pull(mq, top + 100)
        # past the end with the queue starting at 0: RocketMQ moves the consumer to minOffset
        assert res.status is PullStatus.OFFSET_ILLEGAL and (res.next_begin_offset, res.max_offset) == (0, top)
        res = await pc.pull(mq, 0, sub_expression="NoSuchTag")
        assert res.status in (PullStatus.NO_MATCHED_MSG, PullStatus.FOUND) and res.messages == []
        assert res.next_begin_offset > 0
        with anyio.fail_after(10):  # long polling: a pull that waits is woken by a send
            async with anyio.create_task_group() as nursery:
                box = {}

                async def blocked_pull():
                    box["res"] = await pc.pull(mq, top, block=8)
                nursery.start_soon(blocked_pull)
                await anyio.wait_all_tasks_blocked()  # the pull is on the wire, waiting
                await producer.send(Message(topic, b"wake", tags="W"), selector=lambda qs, m: qs[0])
        assert box["res"].status is PullStatus.FOUND and box["res"].messages[0].body == b"wake"
        assert await pc.fetch_offset(mq) == -1
        await pc.update_offset(mq, 3)
        assert await pc.fetch_offset(mq) == 3

    # push consumer with a tag expression, from the first offset
    want = {m.body for m, _ in sent.values() if m.tags in ("TagA", "TagC")}
    got_push, all_in = [], anyio.Event()

    async def handler(msgs):
        for m in msgs:
            assert m.tags in ("TagA", "TagC")
            got_push.append(m.body)
        if want <= set(got_push):
            all_in.set()
        return ConsumeStatus.CONSUME_SUCCESS
    async with open_push_consumer("rt_push", namesrv_addr=ns, subscriptions={topic: "TagA || TagC"},
                                  handler=handler, consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET):
        with anyio.fail_after(20):
            await all_in.wait()
    assert sorted(got_push) == sorted(want)

    # a new group starts at the last offset by default, or at a timestamp when asked
    fresh, at_time = [], []

    def collect(into):
        async def handle(msgs):
            into.extend(m.body for m in msgs)
            return ConsumeStatus.CONSUME_SUCCESS
        return handle
    async with open_producer("rt_producer", namesrv_addr=ns) as producer:
        async with open_push_consumer("rt_latest", namesrv_addr=ns, subscriptions={topic: "*"},
                                      handler=collect(fresh)):
            since = int(time.time() * 1000)
            for i in range(3):
                await producer.send(Message(topic, f"new-{i}".encode()))
            with anyio.fail_after(10):
                while len(fresh) < 3:
                    await anyio.sleep(0.05)
        async with open_push_consumer("rt_since", namesrv_addr=ns, subscriptions={topic: "*"},
                                      handler=collect(at_time), consume_timestamp=since,
                                      consume_from=ConsumeFromWhere.CONSUME_FROM_TIMESTAMP):
            with anyio.fail_after(10):
                while len(at_time) < 3:
                    await anyio.sleep(0.05)
            # A marker at the end of every queue: anything older than `since`
            # delivered by mistake comes before it (queues are pulled in order).
            markers = {f"end-{i}".encode() for i in range(16)}
            for body in sorted(markers):
                await producer.send(Message(topic, body), selector=lambda qs, m: qs[int(m.body[4:]) % len(qs)])
            await wait_until(lambda: markers <= set(at_time), 10, "the end markers")
    at_time = [b for b in at_time if b not in markers]
    assert sorted(fresh) == sorted(at_time) == [f"new-{i}".encode() for i in range(3)]


class RefusingSendBack(ConsumerApi):
    """What a broker without CONSUMER_SEND_MSG_BACK answers."""

    async def send_back(self, msg, *args):
        raise NotSupportedError("broker", ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "request type 36 not supported")


async def test_reconsume_later_goes_through_retry_topic_or_local_redelivery(cluster, anyio_backend):
    topic = "Retry"
    await cluster.wait_master()
    ns = cluster.namesrv_addr
    async with open_producer("retry_producer", namesrv_addr=ns) as producer:
        for i in range(4):
            await producer.send(Message(topic, f"r-{i}".encode(), tags="R"))

    async def consume_failing_first(group: str, break_send_back: bool):
        deliveries: dict[bytes, list] = {}
        done, armed = anyio.Event(), anyio.Event()

        async def handler(msgs):
            await armed.wait()
            for m in msgs:
                deliveries.setdefault(m.body, []).append(m)
                assert (m.topic, m.tags) == (topic, "R")  # also when it comes back through %RETRY%<group>
            if len(deliveries) == 4 and all(len(d) >= 2 for d in deliveries.values()):
                done.set()
            first = any(len(deliveries[m.body]) == 1 for m in msgs)
            return ConsumeStatus.RECONSUME_LATER if first else ConsumeStatus.CONSUME_SUCCESS

        async with open_push_consumer(group, namesrv_addr=ns, subscriptions={topic: "*"}, handler=handler,
                                      consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                                      retry_delay_level=1, redeliver_delay=0.5) as consumer:
            if break_send_back:
                consumer.api = RefusingSendBack(consumer.instance, group)
            armed.set()
            with anyio.fail_after(30):
                await done.wait()
        assert sorted(deliveries) == [f"r-{i}".encode() for i in range(4)]
        return consumer, deliveries

    # the broker re-puts failed messages to %RETRY%<group> (delay level 1: one second)
    consumer, deliveries = await consume_failing_first("retry_group", break_send_back=False)
    assert consumer.send_backs == 4 and consumer.local_redeliveries == 0
    for first, again, *_ in deliveries.values():
        assert again.queue.topic == "%RETRY%retry_group" and again.reconsume_times == 1
        assert again.msg_id == first.msg_id and first.reconsume_times == 0
    # a broker that refuses the send-back: the client hands the messages over again itself
    consumer, deliveries = await consume_failing_first("local_group", break_send_back=True)
    assert consumer.send_backs == 0 and consumer.local_redeliveries == 4
    for first, again, *_ in deliveries.values():
        assert again.queue.topic == topic and again.queue_offset == first.queue_offset

    # delay_level: held by the broker (level 1 is one second), then delivered to the topic
    async with open_producer("delay_producer", namesrv_addr=ns) as producer, \
            open_pull_consumer("delay_puller", namesrv_addr=ns) as pc:
        r = await producer.send(Message("Delayed", b"later", delay_level=1), selector=lambda qs, m: qs[0])
        sent_at = time.monotonic()
        mq = (await pc.fetch_queues("Delayed"))[0]
        with anyio.fail_after(15):
            while not (res := await pc.pull(mq, 0, block=5)).messages:
                pass
        assert time.monotonic() - sent_at >= 0.8
        assert [m.body for m in res.messages] == [b"later"] and res.messages[0].msg_id == r.msg_id
