# send()'s inline first attempt (producer.py: made without _send when the
# route, heartbeat and connection are ready) against a real broker group:
# a busy first answer goes on to _send's retries with the same UNIQ_KEY,
# and a signed (ACL rpc_hook) send still goes through the hook.  The busy
# answer is the broker's real answer rewritten in the client, as
# test_send_async does it.
# Slow: a real name server + 3-broker group (one for the module), each test on
#   two event loops.
import pytest
import anyio

from broker.client import Message, SendStatus, open_producer, open_pull_consumer
from broker.remoting.codes import ResponseCode
from broker.remoting.command import RemotingCommand
from tests.broker.client.cluster_helpers import thread_cluster
from tests.helpers.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with thread_cluster(tmp_path_factory.mktemp("send-inline")) as c:
        yield c


async def test_a_busy_first_answer_of_send_is_retried_with_the_same_key(cluster, anyio_backend):
    ns, topic = cluster.namesrv_addr, f"InlineBusy_{anyio_backend}"
    async with open_producer(f"inline_busy_pg_{anyio_backend}", namesrv_addr=ns) as producer:
        await producer.send(Message(topic, b"warm-up"))
        inst = producer.instance
        real_invoke, first = inst.invoke, []

        async def invoke(addr, request, timeout=None, ok=(ResponseCode.SUCCESS,)):
            resp = await real_invoke(addr, request, timeout, ok)
            if not first:  # stored, but answered as a busy broker would: the client retries
                first.append(resp.ext_fields["msgId"])
                resp = RemotingCommand(ResponseCode.SYSTEM_BUSY, remark="busy (test)", opaque=resp.opaque)
            return resp
        inst.invoke = invoke
        with anyio.fail_after(20):
            result = await producer.send(Message(topic, b"retried"))
        assert result.status is SendStatus.SEND_OK and first
        async with open_pull_consumer("send_inline_busy_reader", namesrv_addr=ns) as pc:
            async def both_copies():
                # (an answer waits for the commit, not for the dispatch to the
                # consume queues, as in RocketMQ: a pull right after may not see it yet)
                copies = []
                for q in (await producer.instance.route(topic)).write_queues:
                    res = await pc.pull(q, 0, max_nums=32)
                    copies += [m for m in res.messages if m.body == b"retried"]
                assert len(copies) == 2 and {m.msg_id for m in copies} == {result.msg_id}, copies
            await eventually(both_copies, timeout=10)


async def test_the_rpc_hook_sees_every_send(cluster, anyio_backend):
    ns, topic = cluster.namesrv_addr, f"InlineHook_{anyio_backend}"
    async with open_producer(f"inline_hook_pg_{anyio_backend}", namesrv_addr=ns) as producer:
        await producer.send(Message(topic, b"warm-up"))
        seen = []

        def hook(cmd):
            assert type(cmd) is RemotingCommand  # (a SendRequest is handed over as its command)
            seen.append((cmd.code, cmd.ext_fields.get("b")))
            return cmd
        producer.instance.remoting.rpc_hook = hook
        results = [await producer.send(Message(topic, b"%d" % i, tags="t")) for i in range(3)]
        got = []
        producer.send_async(Message(topic, b"async"), lambda r, e: got.append((r, e)))
        with anyio.fail_after(20):
            await producer.drain()
        assert all(r.status is SendStatus.SEND_OK for r in results) and got[0][1] is None
        assert seen.count((310, topic)) == 4
