# The timer service on a 3-node in-memory group (trio MockClock; the send
# path and the services read the virtual clock, so due times are exact):
# delivery at the time asked and not before, recall, the replicated
# progress on every member, a leader change with timers pending, and a
# delivery batch its leader committed only in part (the next leader
# delivers the rest, once).
import pytest
import trio
import trio.testing

from broker.config import LiveConfig
from broker.processors.send import SendProcessor
from broker.remoting.codes import ResponseCode
from broker.store.timer import TIMER_TOPIC, RecallError, from_timer
from consumequeue import record as M
from tests.broker.processors.test_send import BORN, v2
from tests.broker.store.test_gate import Group
from tests.helpers.store_services import timer_service


def vclock() -> int:
    return int(trio.current_time() * 1000)


def timed(at_ms: int, uniq: str) -> str:
    return M.properties_to_string({"TAGS": "t", "UNIQ_KEY": uniq, "TIMER_DELIVER_MS": str(at_ms)})


def records_of(m, topic, queue_id=0):
    cq = m.bs.cq.engine.cqs.get(topic, queue_id)
    if cq is None:
        return []
    return [M.decode(m.bs.cq.engine.source.read(u.phy, u.size)) for u in cq.read(cq.min_offset, 1000)]


async def wait_count(m, topic, n, queue_id=0):
    dispatched = m.bs.cq.dispatcher.dispatched
    with trio.fail_after(60):  # (virtual seconds)
        while len(recs := records_of(m, topic, queue_id)) < n:
            await dispatched.wait_changed(dispatched.value)
    return recs


def sender(m) -> SendProcessor:
    return SendProcessor(LiveConfig(m.cfg), m.bs.replica, m.bs.gate, m.bs.metadata, m.bs.store, clock_ms=vclock)


async def start_services(g, nursery) -> dict:
    services = {m.nid: timer_service(m.bs, m.cfg, clock_ms=vclock) for m in g.alive()}
    for s in services.values():
        await nursery.start(s.run)
    return services


async def test_delivered_when_due_recalled_never_and_progress_replicated(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery, timerPrecisionMs="1")
        await g.start()
        leader = await g.wait_leader()
        services = await start_services(g, nursery)
        send = sender(leader)
        t0 = vclock()
        for at, uniq in ((t0 + 2000, "U2"), (t0 + 1000, "U1"), (t0 + 3000, "U3"), (t0 - 5, "U0")):
            resp = await send.process(v2(topic="TimT", body=uniq.encode(), queue_id=1, props=timed(at, uniq)), BORN)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            assert resp.ext_fields["queueId"] == "1"
            assert ("recallHandle" in resp.ext_fields) == (uniq != "U0")  # a past time is no timer
        assert [r.body for r in await wait_count(leader, "TimT", 1, 1)] == [b"U0"]  # at once
        for _ in range(2):  # a producer's retry stores a send twice: one recall cancels both
            resp = await send.process(v2(topic="TimT", body=b"U4", queue_id=1, props=timed(t0 + 3500, "U4")), BORN)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert len(await wait_count(leader, TIMER_TOPIC, 5)) == 5
        svc = services[leader.nid]
        await svc.recall("U4")
        await svc.recall("U3")
        with pytest.raises(RecallError, match="no pending timer message U3"):
            await svc.recall("U3")  # recalled already
        with pytest.raises(RecallError):
            await svc.recall("nope")
        await trio.sleep(0.99)
        assert len(records_of(leader, "TimT", 1)) == 1  # U1 not before its time
        got = await wait_count(leader, "TimT", 2, 1)
        assert vclock() - t0 >= 1000 and got[1].body == b"U1"
        got = await wait_count(leader, "TimT", 3, 1)
        assert vclock() - t0 >= 2000 and got[2].body == b"U2"
        assert got[2].properties["TIMER_DELIVER_MS"] == str(t0 + 2000) and "REAL_TOPIC" not in got[2].properties
        await trio.sleep(5)  # U3's and U4's times have passed: they were recalled, nothing comes
        assert [r.body for r in records_of(leader, "TimT", 1)] == [b"U0", b"U1", b"U2"]
        assert (svc.delivered, svc.recalled) == (2, 2) and svc.pending == 0
        await g.settle()
        for m in g.alive():
            await m.bs.metadata.wait_applied(leader.bs.store.end_index)
            assert (m.bs.metadata.timer_progress.low, m.bs.metadata.timer_progress.done) == (5, [])
            assert services[m.nid].delivered == (2 if m is leader else 0)
        nursery.cancel_scope.cancel()


async def test_new_leader_delivers_pending_timers_once(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery, timerPrecisionMs="1")
        await g.start()
        leader = await g.wait_leader()
        services = await start_services(g, nursery)
        send = sender(leader)
        t0 = vclock()
        for i in range(6):  # 0-2 due before the leader goes, 3-5 after
            at = t0 + (500 if i < 3 else 4000) + i
            resp = await send.process(v2(topic="FailT", body=f"m{i}".encode(), queue_id=0,
                                         props=timed(at, f"K{i}")), BORN)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        await wait_count(leader, "FailT", 3)
        await g.settle()
        old = leader
        await old.stop()
        await trio.testing.wait_all_tasks_blocked()
        assert not services[old.nid].active
        leader = await g.wait_leader(exclude=(old.nid,))
        got = await wait_count(leader, "FailT", 6)
        assert vclock() - t0 >= 4000
        await trio.sleep(5)  # nothing more comes
        got = records_of(leader, "FailT")
        assert sorted(r.body for r in got) == [f"m{i}".encode() for i in range(6)]
        assert services[leader.nid].delivered == 3 and services[leader.nid].redelivered == 0
        nursery.cancel_scope.cancel()


async def test_a_batch_committed_in_part_is_finished_by_the_next_leader(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery, timerPrecisionMs="1")
        await g.start()
        leader = await g.wait_leader()
        send = sender(leader)
        t0 = vclock()
        for i in range(3):
            resp = await send.process(v2(topic="PartT", body=f"p{i}".encode(), queue_id=0,
                                         props=timed(t0 + 100, f"P{i}")), BORN)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        parked = await wait_count(leader, TIMER_TOPIC, 3)
        await trio.sleep(0.2)
        # What a leader that died mid-append leaves: the timer.done record
        # naming units 0-2 as its batch, and only unit 0's delivered record.
        now = vclock()
        first = M.encode(from_timer(parked[0], store_timestamp=now, store_host=leader.cfg.store_host))
        marker = leader.bs.metadata.timer_done_record([0, 1, 2], [0, 1, 2])
        await leader.bs.replica.append([marker, first])
        await g.settle()
        services = await start_services(g, nursery)  # the leader's service finds the batch unfinished
        got = await wait_count(leader, "PartT", 3)
        await trio.sleep(5)
        got = records_of(leader, "PartT")
        assert [r.body for r in got] == [b"p0", b"p1", b"p2"]
        assert services[leader.nid].redelivered == 2 and services[leader.nid].delivered == 0
        # the redelivery names its own batch: a leader after it finds nothing to do
        progress = leader.bs.metadata.timer_progress
        assert progress.last_batch == (1, 2) and progress.low == 3
        old = leader
        await old.stop()
        leader = await g.wait_leader(exclude=(old.nid,))
        await trio.sleep(5)
        assert [r.body for r in records_of(leader, "PartT")] == [b"p0", b"p1", b"p2"]
        assert services[leader.nid].redelivered == 0
        nursery.cancel_scope.cancel()


async def test_over_the_memory_budget_timers_wait_in_the_queue_and_are_not_lost(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery, timerPrecisionMs="1", timerMaxInMemory="2")
        await g.start()
        leader = await g.wait_leader()
        send = sender(leader)
        t0 = vclock()
        for i in range(5):  # arrival order is the reverse of due order
            resp = await send.process(v2(topic="BudT", body=f"b{i}".encode(), queue_id=0,
                                         props=timed(t0 + 5000 - i * 1000, f"B{i}")), BORN)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        await wait_count(leader, TIMER_TOPIC, 5)
        services = await start_services(g, nursery)
        svc = services[leader.nid]
        await trio.testing.wait_all_tasks_blocked()
        assert len(svc.index) == 2 and svc.scanned.value == 2  # two loaded, three waiting in the queue
        got = await wait_count(leader, "BudT", 5)
        asked = {f"b{i}".encode(): t0 + 5000 - i * 1000 for i in range(5)}
        assert sorted(r.body for r in got) == sorted(asked)
        assert all(r.store_timestamp >= asked[r.body] for r in got)  # late maybe, never early
        nursery.cancel_scope.cancel()


async def test_a_committed_timer_half_waits_for_its_time_from_the_commit(tmp_path, autojump_clock):
    from broker.processors.client_manager import ClientManager
    from tests.broker.store.test_transaction import end_request, wire
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery, timerPrecisionMs="1")
        await g.start()
        leader = await g.wait_leader()
        send, _service, end = wire(leader, ClientManager(clock_ms=vclock))
        services = await start_services(g, nursery)
        props = M.properties_to_string({"TRAN_MSG": "true", "PGROUP": "txg", "UNIQ_KEY": "H1",
                                        "TIMER_DELAY_SEC": "2"})
        resp = await send.process(v2(topic="TxTimerT", body=b"half", queue_id=0, props=props,
                                     sys_flag=M.TRANSACTION_PREPARED_TYPE), BORN)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        await trio.sleep(1)
        committed_at = vclock()
        resp = await end.process(end_request(resp.ext_fields, M.TRANSACTION_COMMIT_TYPE))
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert [r.body for r in await wait_count(leader, TIMER_TOPIC, 1)] == [b"half"]
        got = await wait_count(leader, "TxTimerT", 1)
        assert got[0].store_timestamp >= committed_at + 2000 and got[0].uniq_key == "H1"
        assert services[leader.nid].delivered == 1
        nursery.cancel_scope.cancel()
