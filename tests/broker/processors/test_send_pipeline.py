# The send pipeline over a real connection: sends pipelined on one TCP
# connection, written in chunks that cut frames anywhere (so one read
# brings a burst, part of one, or several), are answered in request order,
# each from the log's driver as the commit covers its burst (no task of the
# burst's own); a refused send in the middle is answered alone and takes
# nothing from its neighbours; every queue offset answered is the one
# stored, and each queue's offsets count up in request order.
import random

import trio

from broker.common.msgid import parse_offset_msg_id
from broker.remoting.codec import CommandDecoder, encode_command
from broker.remoting.codes import ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.server import RequestDispatcher, serve_remoting
from consumequeue import record as M
from tests.broker.processors.test_send import BORN, processor
from tests.broker.processors.test_send_native import _v2
from tests.broker.store.test_gate import Group

N = 600
REFUSED = frozenset(range(7, N, 50))  # queue 99: SYSTEM_ERROR, alone


async def test_pipelined_sends_are_answered_in_order_from_the_commit(tmp_path):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery)
        await g.start()
        leader = await g.wait_leader()
        send = processor(leader)
        assert (await send.process(_v2(), BORN)).code == ResponseCode.SUCCESS  # TopicA, 4 queues
        woken: list = []

        class Replica:  # a burst that parks a task of its own would come through wait()
            def __getattr__(self, name):
                return getattr(leader.bs.replica, name)

            async def wait(self, req):
                woken.append(req)
                return await leader.bs.replica.wait(req)
        send.replica = Replica()
        dispatcher = RequestDispatcher()
        send.register(dispatcher)
        server = await nursery.start(lambda task_status: serve_remoting(
            dispatcher, "127.0.0.1", 0, bursts=dispatcher, raw_sends=True, task_status=task_status))
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        data = b"".join(encode_command(_v2(opaque=i, queue_id=99 if i in REFUSED else i % 3,
                                           body=f"m{i}".encode())) for i in range(N))
        rng = random.Random(5)

        async def write() -> None:
            pos = 0
            while pos < len(data):
                n = rng.choice((1, 7, 200, 3000, 20000))
                await stream.send_all(data[pos:pos + n])
                pos += n
                await trio.sleep(0)  # let the broker read what is there: bursts of every size

        nursery.start_soon(write)
        decoder, answers = CommandDecoder(), []
        with trio.fail_after(60):
            while len(answers) < N:
                decoder.receive_data(await stream.receive_some(65536))
                while isinstance(cmd := decoder.next_command(), RemotingCommand):
                    answers.append(cmd)
        assert [a.opaque for a in answers] == list(range(N))
        assert not woken  # every burst was answered from the driver's release
        last: dict[int, int] = {}
        source = leader.bs.cq.engine.source
        await g.settle()
        for i, a in enumerate(answers):
            if i in REFUSED:
                assert a.code == ResponseCode.SYSTEM_ERROR and "queueId[99]" in a.remark
                continue
            assert a.code == ResponseCode.SUCCESS, (i, a.code, a.remark)
            qid, qoff = int(a.ext_fields["queueId"]), int(a.ext_fields["queueOffset"])
            assert qid == i % 3
            if qid in last:
                assert qoff == last[qid] + 1  # request order is queue order
            last[qid] = qoff
            _, phy = parse_offset_msg_id(a.ext_fields["msgId"])
            rec = M.decode(source.read(phy, int.from_bytes(source.read(phy, 4), "big")), check_crc=True)
            assert (rec.body, rec.queue_id, rec.queue_offset) == (f"m{i}".encode(), qid, qoff)
        await stream.aclose()
        nursery.cancel_scope.cancel()
