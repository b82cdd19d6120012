# POP consumption through one in-process broker over real TCP remoting
# (pop_helpers.pop_bed: serve_broker + name server in this process, the
# Python client's producer and PopClient): pop/ack hands each message out
# once; an unacked message comes back through %RETRY%G_T with
# reconsumeTimes + 1 and then goes to %DLQ%G at the group's retryMaxTimes;
# an acked one is never revived and a late ack is SUCCESS; a changed
# invisible time gives a new receipt and voids the old; bad requests get
# their codes (INVALID_PARAMETER for maxMsgNums > 32 or a bad receipt,
# TOPIC_NOT_EXIST, NO_MESSAGE beyond the queue); queue -1 takes the queues
# in turn; FIFO blocks a queue until every message is acked, or hands the
# same ones out again after the invisible time; a held pop wakes on a send
# and a pop past popPollingMaxHeld is POLLING_FULL.
import pytest
import trio

from broker.client import PopStatus
from broker.remoting.client import open_remoting_client
from broker.remoting.codes import RequestCode, ResponseCode, SerializeType
from broker.remoting.command import RemotingCommand
from consumequeue import record as M
from tests.broker.pop.pop_helpers import pop_bed
from tests.helpers.waiting import wait_until
from tools.localcluster import free_ports

G = "pop_cg"
T = "PopT"


async def test_pop_then_ack_hands_each_message_out_once(tmp_path):
    async with pop_bed(tmp_path) as bed:
        await bed.send(T, 8)
        got = []
        while len(got) < 8:
            res = await bed.pc.pop(bed.addr, G, T, max_nums=3, invisible_ms=60000)
            assert res.status is PopStatus.FOUND
            got += res.messages
        bodies = sorted(m.message.body for m in got)
        assert bodies == sorted(f"m{i}".encode() for i in range(8))
        res = await bed.pc.pop(bed.addr, G, T, max_nums=32, invisible_ms=60000)
        assert res.status is PopStatus.POLLING_NOT_FOUND
        for m in got:
            await bed.pc.ack(bed.addr, G, T, m.receipt)
        assert not bed.broker.metadata.state.pop.cks


async def test_expired_messages_come_back_through_retry_then_the_dlq(tmp_path):
    async with pop_bed(tmp_path) as bed:
        await bed.create_group(G, retry_max_times=1)
        await bed.send(T, 1, queue_id=2)
        first = await bed.pc.pop(bed.addr, G, T, invisible_ms=300)
        (m,) = first.messages
        assert m.reconsume_times == 0 and m.receipt.split(" ")[4] == "0"
        # not acked: after 300 ms the revive service puts it to %RETRY%G_T
        again = await bed.pc.pop(bed.addr, G, T, invisible_ms=300, poll_ms=10000)
        (r,) = again.messages
        assert r.message.body == b"m0" and r.reconsume_times == 1
        assert r.message.record.topic == T  # handed out as the topic it was popped for
        assert r.receipt.split(" ")[4] == "1"  # ... from the V1 retry topic
        assert r.message.record.properties["RETRY_TOPIC"] == T
        # reconsumeTimes 1 reached retryMaxTimes 1: next time it goes to %DLQ%G
        await wait_until(lambda: bed.revive.to_dlq == 1, 10, "the revive service's move to the DLQ")

        def dlq_units():
            cq = bed.broker.store.cq.engine.cqs.get(f"%DLQ%{G}", 0)
            return 0 if cq is None else cq.max_offset
        await wait_until(dlq_units, 10, "the DLQ message dispatched")
        assert dlq_units() == 1
        assert not bed.broker.metadata.state.pop.cks


async def test_an_acked_message_is_not_revived_and_a_late_ack_succeeds(tmp_path):
    async with pop_bed(tmp_path) as bed:
        await bed.send(T, 2, queue_id=1)
        res = await bed.pc.pop(bed.addr, G, T, invisible_ms=400)
        a, b = res.messages
        await bed.pc.ack(bed.addr, G, T, a.receipt)
        back = await bed.pc.pop(bed.addr, G, T, invisible_ms=60000, poll_ms=10000)
        assert [m.message.body for m in back.messages] == [b.message.body]
        await bed.pc.ack(bed.addr, G, T, b.receipt)  # too late: SUCCESS, nothing appended
        await bed.pc.ack(bed.addr, G, T, back.messages[0].receipt)
        assert bed.revive.revived == 1 and not bed.broker.metadata.state.pop.cks


async def test_change_invisible_gives_a_new_receipt(tmp_path):
    from broker.client.errors import BrokerError
    async with pop_bed(tmp_path) as bed:
        await bed.send(T, 2, queue_id=0)
        res = await bed.pc.pop(bed.addr, G, T, invisible_ms=60000)
        a, b = res.messages
        new = await bed.pc.change_invisible(bed.addr, G, T, a.receipt, 300)
        assert new.split(" ")[0] == str(a.queue_offset) and new.split(" ")[2] == "300"
        with pytest.raises(BrokerError) as err:  # the old receipt is void
            await bed.pc.change_invisible(bed.addr, G, T, a.receipt, 300)
        assert err.value.code == 208  # NO_MESSAGE
        back = await bed.pc.pop(bed.addr, G, T, invisible_ms=60000, poll_ms=10000)
        assert [m.message.body for m in back.messages] == [a.message.body]
        assert back.messages[0].reconsume_times == 1
        await bed.pc.batch_ack(bed.addr, G, T, [b.receipt, back.messages[0].receipt])
        assert not bed.broker.metadata.state.pop.cks


async def test_invalid_requests_get_clear_errors(tmp_path):
    from broker.client.errors import BrokerError
    async with pop_bed(tmp_path) as bed:
        for kw, code in (({"max_nums": 33}, 29), ({"invisible_ms": 0}, 29), ({"queue_id": 4}, 29)):
            with pytest.raises(BrokerError) as err:
                await bed.pc.pop(bed.addr, G, T, **kw)
            assert err.value.code == code, kw
        with pytest.raises(BrokerError) as err:
            await bed.pc.pop(bed.addr, G, "NoSuchTopic")
        assert err.value.code == 17
        with pytest.raises(BrokerError) as err:  # %RETRY%<group>_<topic> would be too long
            await bed.pc.pop(bed.addr, "g" * 250, T)
        assert err.value.code == 29 and "retry or DLQ topic" in str(err.value)
        with pytest.raises(BrokerError) as err:
            await bed.pc.ack(bed.addr, G, T, "1 2 3 4 7 b 0 0")
        assert err.value.code == 29 and "invalid receipt" in str(err.value)
        await bed.send(T, 1, queue_id=0)
        with pytest.raises(BrokerError) as err:  # beyond the queue
            await bed.pc.ack(bed.addr, G, T, "5 1 60000 0 0 popb 0 5")
        assert err.value.code == 208
        assert bed.broker.metadata.state.pop.cks == {}


async def test_queue_minus_one_pops_every_queue_in_turn(tmp_path):
    async with pop_bed(tmp_path) as bed:
        for q in range(4):
            await bed.send(T, 2, queue_id=q)
        queues = []
        for _ in range(4):
            res = await bed.pc.pop(bed.addr, G, T, max_nums=1, invisible_ms=60000)
            queues += [m.message.record.queue_id for m in res.messages]
        assert sorted(queues) == [0, 1, 2, 3]


async def test_fifo_blocks_a_queue_until_acked_or_expired(tmp_path):
    async with pop_bed(tmp_path) as bed:
        await bed.send(T, 3, queue_id=1)
        first = await bed.pc.pop(bed.addr, G, T, order=True, invisible_ms=60000)
        assert [m.message.body for m in first.messages] == [b"m0", b"m1", b"m2"]
        assert first.revive_qid == 999 and all(m.receipt.split(" ")[3] == "999" for m in first.messages)
        await bed.send(T, 1, queue_id=1, prefix="n")
        blocked = await bed.pc.pop(bed.addr, G, T, order=True, invisible_ms=60000)
        assert blocked.status is PopStatus.POLLING_NOT_FOUND
        await bed.pc.ack(bed.addr, G, T, first.messages[0].receipt)
        assert (await bed.pc.pop(bed.addr, G, T, order=True)).status is PopStatus.POLLING_NOT_FOUND
        for m in first.messages[1:]:
            await bed.pc.ack(bed.addr, G, T, m.receipt)
        nxt = await bed.pc.pop(bed.addr, G, T, order=True, invisible_ms=300)
        assert [m.message.body for m in nxt.messages] == [b"n0"]
        # not acked: once its invisible time is over, the same message again, one attempt more
        again = await bed.pc.pop(bed.addr, G, T, order=True, invisible_ms=60000, poll_ms=10000)
        assert [m.message.body for m in again.messages] == [b"n0"]
        assert again.messages[0].reconsume_times == 1


async def test_a_held_pop_wakes_on_a_send_and_the_budget_is_polling_full(tmp_path):
    async with pop_bed(tmp_path, popPollingMaxHeld=1) as bed:
        got = []

        async def held():
            got.append(await bed.pc.pop(bed.addr, G, T, invisible_ms=60000, poll_ms=20000))
        with trio.fail_after(10):  # held for 20 s unless the send wakes it
            async with trio.open_nursery() as nursery:
                nursery.start_soon(held)
                await wait_until(lambda: bed.pop.held == 1, 10, "the first pop held")
                full = await bed.pc.pop(bed.addr, G, T, invisible_ms=60000, poll_ms=20000)
                assert full.status is PopStatus.POLLING_FULL
                await bed.send(T, 1)
        assert [m.message.body for m in got[0].messages] == [b"m0"]


async def test_fifo_messages_past_retry_max_times_go_to_the_dlq(tmp_path):
    async with pop_bed(tmp_path) as bed:
        await bed.create_group(G, retry_max_times=1)
        await bed.send(T, 1, queue_id=3, prefix="f")
        first = await bed.pc.pop(bed.addr, G, T, order=True, max_nums=1, invisible_ms=200)
        assert [(m.message.body, m.reconsume_times) for m in first.messages] == [(b"f0", 0)]
        await bed.send(T, 1, queue_id=3, prefix="z")
        again = await bed.pc.pop(bed.addr, G, T, order=True, max_nums=1, invisible_ms=200, poll_ms=10000)
        assert [(m.message.body, m.reconsume_times) for m in again.messages] == [(b"f0", 1)]
        # a third time would pass retryMaxTimes 1: f0 goes to %DLQ%G and the queue moves on
        after = await bed.pc.pop(bed.addr, G, T, order=True, max_nums=1, invisible_ms=60000, poll_ms=10000)
        assert [m.message.body for m in after.messages] == [b"z0"]

        def dlq():
            cq = bed.broker.store.cq.engine.cqs.get(f"%DLQ%{G}", 0)
            return [] if cq is None else [M.decode(bed.broker.store.cq.engine.source.read(u.phy, u.size))
                                          for u in cq.read(0, 10)]
        (dead,) = await wait_until(dlq, 10, "f0 in the DLQ")
        assert dead.body == b"f0" and dead.reconsume_times == 2 and dead.properties["RETRY_TOPIC"] == T
        assert bed.pop.stats["fifo_to_dlq"] == 1


async def test_checkpoints_survive_a_restart(tmp_path):
    ports = tuple(free_ports(2))
    async with pop_bed(tmp_path, ports=ports) as bed:
        await bed.send(T, 2, queue_id=0)
        res = await bed.pc.pop(bed.addr, G, T, invisible_ms=1500)
        a, b = res.messages
        await bed.pc.ack(bed.addr, G, T, a.receipt)
    async with pop_bed(tmp_path, ports=ports) as bed:
        # the restarted broker knows the checkpoint (or already revived it: only it could)
        state = bed.broker.metadata.state.pop
        assert [ck.unacked for ck in state.cks.values()] == [[b.queue_offset]] or bed.revive.revived == 1
        back = await bed.pc.pop(bed.addr, G, T, invisible_ms=60000, poll_ms=10000)
        assert [(m.message.body, m.reconsume_times) for m in back.messages] == [(b.message.body, 1)]
        assert int(b.receipt.split(" ")[1]) + 1500 <= back.pop_time
        assert bed.revive.revived == 1 and all(ck.topic != T for ck in state.cks.values())


async def test_a_binary_header_cannot_carry_a_pop_code(tmp_path):
    async with pop_bed(tmp_path) as bed, open_remoting_client() as rc:
        truncated = RemotingCommand.create_request(RequestCode.POP_MESSAGE & 0xFFFF, {"topic": T},
                                                   serialize_type=SerializeType.ROCKETMQ)
        resp = await rc.invoke(bed.addr, truncated, 5)
        assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


async def test_a_held_fifo_pop_wakes_when_its_queue_is_acked(tmp_path):
    async with pop_bed(tmp_path) as bed:
        await bed.send(T, 1, queue_id=2, prefix="a")
        first = await bed.pc.pop(bed.addr, G, T, order=True, invisible_ms=60000)
        await bed.send(T, 1, queue_id=2, prefix="b")
        got = []

        async def held():
            got.append(await bed.pc.pop(bed.addr, G, T, order=True, invisible_ms=60000, poll_ms=20000))
        with trio.fail_after(10):  # held for 20 s unless the ack wakes it
            async with trio.open_nursery() as nursery:
                nursery.start_soon(held)
                await wait_until(lambda: bed.pop.held == 1, 10, "the FIFO pop held")
                await bed.pc.ack(bed.addr, G, T, first.messages[0].receipt)
        assert [m.message.body for m in got[0].messages] == [b"b0"]


async def test_a_tag_expression_filters_and_the_offset_moves_past_the_rest(tmp_path):
    async with pop_bed(tmp_path) as bed:
        await bed.send(T, 3, queue_id=0, tag="A", prefix="a")
        await bed.send(T, 2, queue_id=0, tag="B", prefix="b")
        res = await bed.pc.pop(bed.addr, G, T, queue_id=0, expression="B", invisible_ms=60000)
        assert [m.message.body for m in res.messages] == [b"b0", b"b1"]
        assert bed.broker.metadata.state.offsets.query(T, G, 0) == 5
        got = []

        async def held():  # only A's left behind the offset: a new B wakes it
            got.append(await bed.pc.pop(bed.addr, G, T, queue_id=0, expression="B", poll_ms=20000))
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(held)
                await wait_until(lambda: bed.pop.held == 1, 10, "the pop held")
                await bed.send(T, 1, queue_id=0, tag="A", prefix="x")
                await bed.send(T, 1, queue_id=0, tag="B", prefix="y")
        assert [m.message.body for m in got[0].messages] == [b"y0"]
