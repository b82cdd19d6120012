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


async def test_a_send_alone_and_in_a_burst_are_answered_alike(tmp_path, autojump_clock):
    """The oracle of the one route: every request of a corpus answered by
    process() (a burst of one) says what it says inside one burst of them
    all, native runs included -- code, remark, header fields and the record
    stored, log positions aside."""
    from broker.remoting.codes import RequestCode
    from tests.broker.processors.test_send_native import _comparable, _raw, _serve
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery, maxMessageSize="1024")
        await g.start()
        leader = await g.wait_leader()
        alone, together = processor(leader), processor(leader)
        assert (await alone.process(_v2(), BORN)).code == ResponseCode.SUCCESS
        corpus = [
            _v2(opaque=1), _v2(opaque=2, props="TAGS\x01t\x02UNIQ_KEY\x01MINE\x02"),
            _v2(opaque=3, props="DELAY\x012\x02"), _v2(opaque=4, queue_id=77), _v2(opaque=5, body=b"y" * 2000),
            _v2(opaque=6, topic="TBW102"), _v2(opaque=7, topic="Fresh1"), _v2(opaque=8, e="01"),
            RemotingCommand.create_request(RequestCode.SEND_MESSAGE, {
                "producerGroup": "pg", "topic": "TopicA", "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
                "queueId": "3", "sysFlag": "0", "bornTimestamp": "1", "flag": "9", "properties": "K\x01v\x02"},
                body=b"v1", opaque=9),
            _v2(opaque=10, props="K\x01" + "v" * 40000 + "\x02"),
        ]
        one_by_one = [await alone.process(c, BORN) for c in corpus]
        # (the auto-created topic exists now: a fresh name keeps that case in the burst)
        burst = corpus[:6] + [_v2(opaque=7, topic="Fresh2")] + corpus[7:]
        in_burst = await _serve(together, _raw(burst))
        await g.settle()
        a = [_comparable(r, leader) for r in one_by_one]
        b = [_comparable(r, leader) for r in in_burst]
        assert [r.code for r in one_by_one] == [0, 0, 0, ResponseCode.SYSTEM_ERROR, ResponseCode.MESSAGE_ILLEGAL,
                                               ResponseCode.NO_PERMISSION, 0, 0, 0, ResponseCode.MESSAGE_ILLEGAL]
        assert a[:6] + a[7:] == b[:6] + b[7:]
        assert a[6][4][0][1:] == b[6][4][0][1:] and (a[6][4][0][0], b[6][4][0][0]) == ("Fresh1", "Fresh2")
        nursery.cancel_scope.cancel()
