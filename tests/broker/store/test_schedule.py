# Delay levels (broker/store/schedule.py): the pure rewrites, messageDelayLevel,
# the schedule service on a 3-node in-memory group (trio MockClock, store
# timestamps on the virtual clock so delays are exact), the delayOffset.json
# snapshot, and -- with real processes -- a kill -9 of the master while
# delayed messages wait: the new master delivers every one of them, and the
# ones delivered before the kill are not delivered again (their offsets were
# replicated with them).
import json
import os

import pytest
import trio
import trio.testing

from broker.config import BrokerConfig, LiveConfig, parse_delay_levels
from broker.metadata import snapshot
from broker.processors.send import SendProcessor
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.store.schedule import deliver_at, from_schedule, to_schedule
from commitlog.config import ConfigError
from consumequeue import record as M
from tests.broker.processors.test_send import BORN, v2
from tests.broker.store.test_gate import Group
from tests.helpers.store_services import schedule_service

HOST = M.HostAddr("10.0.0.9", 10911)


def vclock() -> int:
    return int(trio.current_time() * 1000)


def delayed(level, tags="TagD", uniq="U1") -> str:
    return M.properties_to_string({"TAGS": tags, "UNIQ_KEY": uniq, "DELAY": str(level)})


def test_pure_rewrites_and_level_config():
    rec = M.MessageRecord(topic="T", body=b"b", queue_id=3, properties={"TAGS": "x", "DELAY": "9"},
                          store_timestamp=1000, reconsume_times=2, flag=7)
    parked = to_schedule(rec, max_level=2)
    assert (parked.topic, parked.queue_id) == (M.SCHEDULE_TOPIC, 1)  # clamped to level 2
    assert parked.properties == {"TAGS": "x", "DELAY": "2", "REAL_TOPIC": "T", "REAL_QID": "3"}
    back = from_schedule(parked, store_timestamp=5000, store_host=HOST)
    assert (back.topic, back.queue_id, back.body, back.flag, back.reconsume_times) == ("T", 3, b"b", 7, 2)
    assert "DELAY" not in back.properties and back.properties["REAL_TOPIC"] == "T"
    assert (back.store_timestamp, back.store_host) == (5000, HOST)
    # not delayed / prepared transactions stay as they are
    assert to_schedule(M.MessageRecord(topic="T"), 2).topic == "T"
    prepared = M.MessageRecord(topic="T", properties={"DELAY": "1"}, sysflag=M.TRANSACTION_PREPARED_TYPE)
    assert to_schedule(prepared, 2) is prepared
    # due times, and a clock that went back delivers at once
    assert deliver_at(1000, 2, (1000, 2000), now_ms=1500) == 3000
    assert deliver_at(10_000, 1, (1000,), now_ms=1000) == 1000
    assert parse_delay_levels("messageDelayLevel", "1s 5s 2m 1h 1d") == (1000, 5000, 120000, 3600000, 86400000)
    with pytest.raises(ConfigError):
        parse_delay_levels("messageDelayLevel", "1s 5x")
    base = {"brokerName": "b", "dLegerGroup": "b", "dLegerSelfId": "n0", "dLegerPeers": "n0-127.0.0.1:40911",
            "storePathRootDir": "/tmp/h2/x"}
    cfg, _ = BrokerConfig.from_dict({**base, "messageDelayLevel": "1s 2s"})
    assert cfg.message_delay_levels_ms == (1000, 2000)
    assert len(BrokerConfig.from_dict(base)[0].message_delay_levels_ms) == 18


def records_of(m, topic, queue_id):
    cq = m.bs.cq.engine.cqs.get(topic, queue_id)
    if cq is None:
        return []
    return [M.decode(m.bs.cq.engine.source.read(u.phy, u.size)) for u in cq.read(cq.min_offset, 1000)]


async def wait_count(m, topic, queue_id, n):
    dispatched = m.bs.cq.dispatcher.dispatched
    while len(recs := records_of(m, topic, queue_id)) < n:
        await dispatched.wait_changed(dispatched.value)
    return recs


def sender(m) -> SendProcessor:
    return SendProcessor(LiveConfig(m.cfg), m.bs.replica, m.bs.gate, m.bs.metadata, m.bs.store, clock_ms=vclock)


async def test_delayed_send_is_delivered_when_due_and_offsets_replicate(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery, messageDelayLevel="1s 2s")
        await g.start()
        leader = await g.wait_leader()
        services = {m.nid: schedule_service(m.bs, m.cfg, clock_ms=vclock) for m in g.alive()}
        for s in services.values():
            await nursery.start(s.run)
        send = sender(leader)
        t0 = trio.current_time()
        resp = await send.process(v2(topic="DelayT", body=b"later", queue_id=2, props=delayed(2)), BORN)
        assert resp.code == ResponseCode.SUCCESS and resp.ext_fields["queueId"] == "2"
        resp = await send.process(v2(topic="DelayT", body=b"clamped", queue_id=2, props=delayed(7, uniq="U2")), BORN)
        assert resp.code == ResponseCode.SUCCESS
        # parked on level 2's queue with the delivery time as tagsCode
        parked = await wait_count(leader, M.SCHEDULE_TOPIC, 1, 2)
        assert [p.properties["DELAY"] for p in parked] == ["2", "2"]
        cq = leader.bs.cq.engine.cqs.get(M.SCHEDULE_TOPIC, 1)
        unit = cq.read(0, 1)[0]
        # the delivery time by the broker's own messageDelayLevel (not the default table)
        levels = leader.cfg.message_delay_levels_ms
        assert levels != M.DEFAULT_DELAY_LEVELS_MS[:len(levels)]
        assert unit.tags_code == M.delay_tags_code("2", parked[0].store_timestamp, levels)
        assert records_of(leader, "DelayT", 2) == []
        await trio.sleep(1.5)
        assert records_of(leader, "DelayT", 2) == []  # not before its time
        got = await wait_count(leader, "DelayT", 2, 2)
        assert 2.0 <= trio.current_time() - t0 < 2.5
        assert [r.body for r in got] == [b"later", b"clamped"]
        assert all("DELAY" not in r.properties and r.properties["REAL_QID"] == "2" for r in got)
        assert got[0].tags == "TagD" and got[0].uniq_key == "U1"
        # only the leader delivered; everyone has the level's offset
        await g.settle()
        assert services[leader.nid].delivered == 2
        assert sum(s.delivered for s in services.values()) == 2
        for m in g.alive():
            await m.bs.metadata.wait_applied(leader.bs.store.end_index)
            assert m.bs.metadata.delay_offset(2) == 2
            assert [r.body for r in records_of(m, "DelayT", 2)] == [b"later", b"clamped"]
        # a DELAY that is not an int is refused
        resp = await send.process(v2(topic="DelayT", props=M.properties_to_string({"DELAY": "soon"})), BORN)
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL
        # delayOffset.json, as RocketMQ names it, carries the offsets
        await leader.bs.metadata.write_snapshot()
        with open(os.path.join(leader.cfg.store_path_root_dir, "config", "delayOffset.json")) as f:
            assert json.load(f)["offsetTable"] == {"2": 2}
        assert snapshot.load_snapshot(leader.cfg.store_path_root_dir).state.delay_offsets.offsets == {2: 2}
        nursery.cancel_scope.cancel()


async def test_new_leader_delivers_what_the_old_one_left(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery, messageDelayLevel="1s 3s")
        await g.start()
        leader = await g.wait_leader()
        services = {m.nid: schedule_service(m.bs, m.cfg, clock_ms=vclock) for m in g.alive()}
        for s in services.values():
            await nursery.start(s.run)
        send = sender(leader)
        for i in range(3):  # level 1: delivered by the first leader
            resp = await send.process(v2(topic="FailT", body=f"a{i}".encode(), queue_id=0, props=delayed(1)), BORN)
            assert resp.code == ResponseCode.SUCCESS
        await wait_count(leader, "FailT", 0, 3)
        for i in range(3):  # level 2: still waiting when the leader goes
            resp = await send.process(v2(topic="FailT", body=f"b{i}".encode(), queue_id=0, props=delayed(2)), BORN)
            assert resp.code == ResponseCode.SUCCESS
        await g.settle()
        old = leader
        await old.stop()
        await trio.testing.wait_all_tasks_blocked()
        assert not services[old.nid].active  # stopped with the leadership
        leader = await g.wait_leader(exclude=(old.nid,))
        got = await wait_count(leader, "FailT", 0, 6)
        assert sorted(r.body for r in got) == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"]
        await trio.sleep(5)  # nothing else comes: level 1 is not delivered again
        assert len(records_of(leader, "FailT", 0)) == 6
        assert services[leader.nid].delivered == 3 and services[leader.nid].active
        nursery.cancel_scope.cancel()


# --- real processes ------------------------------------------------------------------------


def max_offset_req(topic, queue_id=0):
    return RemotingCommand.create_request(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": queue_id})


@pytest.mark.slow
async def test_kill_master_while_delayed_messages_wait(tmp_path):
    """Slow: a real 3-broker group, a kill -9 of its master and delay levels of 1 and 3 s."""
    from tools.brokercluster import open_broker_cluster
    topic = "DelayKillT"
    async with open_broker_cluster(tmp_path, size=3, extra_conf={"messageDelayLevel": "1s 3s"}) as cluster:
        rc = cluster.remoting
        node = await cluster.wait_master()
        master = cluster.addr(node)

        async def max_offset(addr):
            resp = await rc.invoke(addr, max_offset_req(topic), 10)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            return int(resp.ext_fields["offset"])

        for i in range(4):
            resp = await rc.invoke(master, v2(topic=topic, body=f"a{i}".encode(), queue_id=0, props=delayed(1)), 10)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        with trio.fail_after(20):
            while await max_offset(master) < 4:
                await trio.sleep(0.2)
        for i in range(4):
            resp = await rc.invoke(master, v2(topic=topic, body=f"b{i}".encode(), queue_id=0, props=delayed(2)), 10)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert await max_offset(master) == 4  # level 2 (3 s) is not due yet
        cluster.kill(node)
        await cluster.wait_dead(node)
        new = cluster.addr(await cluster.wait_master(exclude={node}, timeout=30))
        with trio.fail_after(30):
            while await max_offset(new) < 8:
                await trio.sleep(0.2)
        # The barrier a re-delivery of level 1 would pass first: one more
        # level-1 message, delivered from that level's queue after the ones
        # the old master had delivered (a queue is delivered in order).
        resp = await rc.invoke(new, v2(topic=topic, body=b"c0", queue_id=0, props=delayed(1)), 10)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        with trio.fail_after(30):
            while await max_offset(new) < 9:
                await trio.sleep(0.2)
        assert await max_offset(new) == 9
        pull = RemotingCommand.create_request(RequestCode.PULL_MESSAGE, {
            "consumerGroup": "g", "topic": topic, "queueId": 0, "queueOffset": 0, "maxMsgNums": 32,
            "sysFlag": 0x4, "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0})
        resp = await rc.invoke(new, pull, 10)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        bodies, off = [], 0
        while off < len(resp.body):
            rec = M.decode(resp.body, off)
            bodies.append(rec.body.decode())
            off += int.from_bytes(resp.body[off:off + 4], "big")
        assert sorted(bodies) == [f"a{i}" for i in range(4)] + [f"b{i}" for i in range(4)] + ["c0"]


def test_delay_offset_snapshot_file(tmp_path):
    from broker.metadata.tables import MetadataState
    state = MetadataState(applied_index=41)
    state.delay_offsets.commit({1: 5, 3: 2}, 40, 1700000000000)
    state.broker_addrs["n1"] = "127.0.0.1:10911"
    snapshot.write_snapshot(str(tmp_path), state)
    loaded = snapshot.load_snapshot(str(tmp_path))
    assert loaded.problems == () and loaded.state == state
    # a snapshot written before delayOffset.json existed keeps its index
    os.unlink(tmp_path / "config" / "delayOffset.json")
    loaded = snapshot.load_snapshot(str(tmp_path))
    assert loaded.state.applied_index == 41 and loaded.state.delay_offsets.offsets == {}
    # stock RocketMQ's file (fastjson, unquoted level keys) is imported
    (tmp_path / "config" / "delayOffset.json").write_text('{"offsetTable":{1:23,2:4}}')
    loaded = snapshot.load_snapshot(str(tmp_path))
    assert loaded.state.delay_offsets.offsets == {1: 23, 2: 4} and loaded.state.applied_index == -1
