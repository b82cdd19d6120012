# Producer.send_async without a task per send, against a real name server
# + 3-broker group (cluster_helpers.thread_cluster), on asyncio and trio:
# once the route and the connection are ready, sends go out from the
# caller and their answers are handled by the connection's reader (no task
# is started); an async callback is awaited and drain() waits for it; a
# first attempt answered SYSTEM_BUSY is retried in a task, with the same
# UNIQ_KEY, as send() would; a send that must wait (no route yet) takes the
# task path and still succeeds; every acknowledged message is stored where
# its result says.
# Slow: a real name server + 3-broker group (one for the module), each test on
#   two event loops.
import pytest
import anyio

from broker.client import Message, PullStatus, SendStatus, open_producer, open_pull_consumer
from broker.remoting.codes import ResponseCode
from broker.remoting.command import RemotingCommand
from tests.broker.client.cluster_helpers import thread_cluster
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with thread_cluster(tmp_path_factory.mktemp("send-async")) as c:
        yield c


def counting_tasks(producer) -> list:
    """Every task the producer starts from now on, by function name."""
    started: list = []
    nursery = producer._nursery
    real = nursery.start_soon

    def start_soon(fn, *args, **kw):
        started.append(getattr(fn, "__name__", repr(fn)))
        return real(fn, *args, **kw)
    nursery.start_soon = start_soon
    return started


async def stored(ns: str, results) -> dict:
    """msg_id -> (body, queue offset) of what the queues hold at each result's place.
    SEND_OK means committed; the consume queue is dispatched from the commit
    point a moment later (as RocketMQ's reput is), so each pull long-polls:
    the broker answers as soon as that queue holds the offset."""
    out = {}
    async with open_pull_consumer("send_async_reader", namesrv_addr=ns) as pc:
        for r in results:
            res = await pc.pull(r.queue, r.queue_offset, max_nums=1, block=10.0)
            assert res.status is PullStatus.FOUND, (r, res.status)
            m = res.messages[0]
            out[m.msg_id] = (m.body, m.queue_offset)
    return out


async def test_sends_go_out_without_a_task_once_ready(cluster, anyio_backend):
    ns, topic = cluster.namesrv_addr, f"Async_{anyio_backend}"
    async with open_producer(f"async_pg_{anyio_backend}", namesrv_addr=ns) as producer:
        await producer.send(Message(topic, b"warm-up"))  # the route, the connection, the heartbeat
        tasks = counting_tasks(producer)
        results, errors = [], []

        def callback(result, error):
            (results if error is None else errors).append(result or error)
        for i in range(300):
            producer.send_async(Message(topic, b"m-%d" % i, keys=f"k{i}"), callback)
        with anyio.fail_after(30):
            await producer.drain()
        assert errors == [] and tasks == []
        assert len(results) == 300 and all(r.status is SendStatus.SEND_OK for r in results)
        assert len({(r.queue, r.queue_offset) for r in results}) == 300
        by_id = await stored(ns, results)
        assert {by_id[r.msg_id][0] for r in results} == {b"m-%d" % i for i in range(300)}
        assert all(by_id[r.msg_id][1] == r.queue_offset for r in results)

        # an async callback runs in a task of its own, and drain() waits for it
        ended = []

        started, release, drained = anyio.Event(), anyio.Event(), anyio.Event()

        async def slow_callback(result, error):
            started.set()
            await release.wait()
            ended.append((result.status, error))
        producer.send_async(Message(topic, b"awaited"), slow_callback)

        async def drain():
            await producer.drain()
            drained.set()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(drain)
                await started.wait()
                await anyio.wait_all_tasks_blocked()  # drain() had every chance to return
                assert not drained.is_set() and ended == []
                release.set()
        assert ended == [(SendStatus.SEND_OK, None)] and tasks == ["finish"]


async def test_a_busy_first_answer_is_retried_in_a_task_with_the_same_key(cluster, anyio_backend):
    ns, topic = cluster.namesrv_addr, f"AsyncBusy_{anyio_backend}"
    async with open_producer(f"async_busy_pg_{anyio_backend}", namesrv_addr=ns) as producer:
        await producer.send(Message(topic, b"warm-up"))
        inst = producer.instance
        real_submit, first = inst.submit, []

        def submit(addr, request, timeout, done):
            def busy_once(resp, error):
                if not first:  # stored, but answered as a busy broker would: the client retries
                    first.append(resp.ext_fields["msgId"])
                    resp = RemotingCommand(ResponseCode.SYSTEM_BUSY, remark="busy (test)", opaque=resp.opaque)
                done(resp, error)
            return real_submit(addr, request, timeout, busy_once)
        inst.submit = submit
        tasks = counting_tasks(producer)
        got = []
        producer.send_async(Message(topic, b"retried"), lambda r, e: got.append((r, e)))
        with anyio.fail_after(20):
            await producer.drain()
        (result, error), = got
        assert error is None and result.status is SendStatus.SEND_OK
        assert tasks == ["_send_and_call"] and first
        # the message is there twice (the busy answer was a lie), both copies under one UNIQ_KEY
        # (read until both are dispatched: SEND_OK means committed, the consume
        # queue follows the commit point a moment later)
        async with open_pull_consumer("send_async_busy_reader", namesrv_addr=ns) as pc:
            queues = (await producer.instance.route(topic)).write_queues

            async def both_copies():
                copies = []
                for q in queues:
                    res = await pc.pull(q, 0, max_nums=32)
                    copies += [m for m in res.messages if m.body == b"retried"]
                return copies if len(copies) >= 2 else None
            copies = await wait_until(both_copies, 10, "both copies in the consume queues")
        assert len(copies) == 2 and {m.msg_id for m in copies} == {result.msg_id}


async def test_a_send_that_must_wait_takes_a_task(cluster, anyio_backend):
    ns, topic = cluster.namesrv_addr, f"AsyncCold_{anyio_backend}"
    async with open_producer(f"async_cold_pg_{anyio_backend}", namesrv_addr=ns) as producer:
        tasks = counting_tasks(producer)
        got = []
        producer.send_async(Message(topic, b"cold"), lambda r, e: got.append((r, e)))  # no route yet
        with anyio.fail_after(20):
            await producer.drain()
        (result, error), = got
        assert error is None and result.status is SendStatus.SEND_OK and tasks == ["_send_and_call"]
