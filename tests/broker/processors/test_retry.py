# Consumer retry (CONSUMER_SEND_MSG_BACK), the leader-hint and role gaps.
#
# In process (3-node in-memory group on real stores, trio MockClock; rig in
# test_broker_roles), with a virtual-time clock for store timestamps and the
# schedule service so delays are exact and instant:
#  - send-back -> %RETRY%<group> (auto-created, 1 queue) after the delay
#    level's time, with RETRY_TOPIC / ORIGIN_MESSAGE_ID / reconsumeTimes + 1
#    and the original body, tags, keys and UNIQ_KEY; delayLevel 0 = 3 +
#    reconsumeTimes (clamped to the configured levels);
#  - reconsumeTimes >= maxReconsumeTimes (header, else the group's
#    retryMaxTimes) or delayLevel < 0 -> %DLQ%<group> at once; retryQueueNums 0
#    drops the message; a bad offset is SYSTEM_ERROR; without
#    autoCreateSubscriptionGroup an unknown group is SUBSCRIPTION_GROUP_NOT_EXIST;
#  - suggestWhichBrokerId: 0 unless the consumer lags, then a follower's id;
#  - followers refuse metadata writes with the gate's error naming the
#    master's broker address (brokerIP1:listenPort), not its DLedger port.
# Real processes (open_broker_cluster, slow): HEART_BEAT puts %RETRY%<group>
# in the route; a send-back over TCP comes back through %RETRY%; a slave's
# send and UPDATE_AND_CREATE_TOPIC answers name the master's broker address.
import json

import pytest
import trio

from broker.common.msgid import offset_msg_id, parse_offset_msg_id
from broker.common.values import TopicConfig
from broker.config import LiveConfig
from broker.metadata.tables import SubscriptionGroupConfig
from broker.processors.retry import SendBackProcessor, dlq_topic, retry_topic
from broker.processors.send import SendProcessor
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.store.gate import NotWritableError
from consumequeue import record as M
from tests.broker.processors.test_send import BORN, processor, v2
from tests.broker.store.test_gate import Group
from tests.helpers.store_services import schedule_service

GROUP = "cg_retry"
LEVELS = "1s 2s 3s 4s"


def vclock() -> int:
    return int(trio.current_time() * 1000)


def send_back(offset: int, delay_level: int = 0, group: str = GROUP, **extra) -> RemotingCommand:
    # only what the stock C++ client sends, plus extras
    fields = {"group": group, "offset": str(offset), "delayLevel": str(delay_level), **extra}
    return RemotingCommand.create_request(RequestCode.CONSUMER_SEND_MSG_BACK, fields, opaque=5)


def cq_records(m, topic: str, queue_id: int = 0) -> list[M.MessageRecord]:
    cq = m.bs.cq.engine.cqs.get(topic, queue_id)
    if cq is None:
        return []
    return [M.decode(m.bs.cq.engine.source.read(u.phy, u.size)) for u in cq.read(cq.min_offset, 1000)]


async def started(tmp_path, nursery, **extra):
    g = Group(tmp_path, nursery, messageDelayLevel=LEVELS, **extra)
    await g.start()
    leader = await g.wait_leader()
    send = SendProcessor(LiveConfig(leader.cfg), leader.bs.replica, leader.bs.gate, leader.bs.metadata, leader.bs.store,
                         clock_ms=vclock)
    back = SendBackProcessor(send, leader.bs.cq)
    schedule = schedule_service(leader.bs, leader.cfg, clock_ms=vclock)
    await nursery.start(schedule.run)
    return g, leader, send, back, schedule


async def sent(send, **kw) -> int:
    """Send one message; its commitlog physical offset."""
    resp = await send.process(v2(**kw), BORN)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return parse_offset_msg_id(resp.ext_fields["msgId"])[1]


async def wait_records(m, topic: str, n: int, queue_id: int = 0) -> list[M.MessageRecord]:
    dispatched = m.bs.cq.dispatcher.dispatched
    while len(recs := cq_records(m, topic, queue_id)) < n:
        await dispatched.wait_changed(dispatched.value)
    return recs


async def test_send_back_goes_to_retry_after_its_delay(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g, leader, send, back, schedule = await started(tmp_path, nursery)
        phy = await sent(send, body=b"fail-me")
        t0 = trio.current_time()
        resp = await back.process(send_back(phy, delay_level=2))
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        # the group and its retry topic were created through the metadata (1 queue, RW)
        assert leader.bs.metadata.group_config(GROUP) is not None
        rt = leader.bs.metadata.topic_config(retry_topic(GROUP))
        assert (rt.read_queue_nums, rt.write_queue_nums, rt.perm) == (1, 1, 6)
        # parked on SCHEDULE_TOPIC_XXXX queue 1 (level 2), not yet on %RETRY%
        parked = await wait_records(leader, M.SCHEDULE_TOPIC, 1, queue_id=1)
        assert parked[0].properties["REAL_TOPIC"] == retry_topic(GROUP) and parked[0].properties["DELAY"] == "2"
        assert cq_records(leader, retry_topic(GROUP)) == []
        (rec,) = await wait_records(leader, retry_topic(GROUP), 1)
        assert 2.0 <= trio.current_time() - t0 < 3.0  # level 2 of "1s 2s 3s 4s"
        original = M.decode(leader.bs.cq.engine.source.read(phy, int.from_bytes(
            leader.bs.cq.engine.source.read(phy, 4), "big")))
        assert rec.body == b"fail-me" and rec.reconsume_times == 1 and rec.queue_id == 0
        p = rec.properties
        assert p["RETRY_TOPIC"] == "TopicA" and p["ORIGIN_MESSAGE_ID"] == offset_msg_id(original.store_host, phy)
        assert (p["TAGS"], p["KEYS"], p["UNIQ_KEY"]) == (original.tags, original.properties["KEYS"],
                                                         original.uniq_key)
        assert "DELAY" not in p
        # every replica has it, and the level's offset is replicated
        await g.settle()
        for m in g.alive():
            assert [r.body for r in cq_records(m, retry_topic(GROUP))] == [b"fail-me"]
            await m.bs.metadata.wait_applied(leader.bs.store.end_index)
            assert m.bs.metadata.delay_offset(2) == 1
        # a second failure of the retried message: delayLevel 0 = 3 + reconsumeTimes(1) = 4
        rphy = await_retry_phy(leader)
        assert (await back.process(send_back(rphy))).code == ResponseCode.SUCCESS
        parked = await wait_records(leader, M.SCHEDULE_TOPIC, 1, queue_id=3)
        assert parked[0].reconsume_times == 2 and parked[0].properties["RETRY_TOPIC"] == "TopicA"
        assert parked[0].properties["ORIGIN_MESSAGE_ID"] == p["ORIGIN_MESSAGE_ID"]
        await wait_records(leader, retry_topic(GROUP), 2)
        assert schedule.delivered == 2
        nursery.cancel_scope.cancel()


def await_retry_phy(m) -> int:
    cq = m.bs.cq.engine.cqs.get(retry_topic(GROUP), 0)
    return cq.read(cq.min_offset, 1)[0].phy


async def test_dead_letters_and_refusals(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g, leader, send, back, _ = await started(tmp_path, nursery)
        # reconsumeTimes 2 >= the header's maxReconsumeTimes 2: straight to the DLQ
        phy = await sent(send, body=b"tired", j=2)
        assert (await back.process(send_back(phy, delay_level=1, maxReconsumeTimes="2"))).code == ResponseCode.SUCCESS
        (dead,) = await wait_records(leader, dlq_topic(GROUP), 1)
        assert dead.body == b"tired" and dead.reconsume_times == 3 and "DELAY" not in dead.properties
        assert leader.bs.metadata.topic_config(dlq_topic(GROUP)).write_queue_nums == 1
        # a negative delay level is a DLQ request too
        phy = await sent(send, body=b"poison")
        assert (await back.process(send_back(phy, delay_level=-1))).code == ResponseCode.SUCCESS
        assert [r.body for r in await wait_records(leader, dlq_topic(GROUP), 2)] == [b"tired", b"poison"]
        # without maxReconsumeTimes the group's retryMaxTimes counts
        await leader.bs.metadata.update_group(SubscriptionGroupConfig("g_strict", retry_max_times=1))
        phy = await sent(send, body=b"once", j=1)
        assert (await back.process(send_back(phy, group="g_strict"))).code == ResponseCode.SUCCESS
        assert [r.body for r in await wait_records(leader, dlq_topic("g_strict"), 1)] == [b"once"]
        # retryQueueNums 0: accepted and dropped
        await leader.bs.metadata.update_group(SubscriptionGroupConfig("g_drop", retry_queue_nums=0))
        end = leader.bs.store.end_index
        assert (await back.process(send_back(phy, group="g_drop"))).code == ResponseCode.SUCCESS
        assert leader.bs.store.end_index == end
        # an offset where no record starts
        resp = await back.process(send_back(phy + 1))
        assert resp.code == ResponseCode.SYSTEM_ERROR and "look message by offset failed" in resp.remark
        nursery.cancel_scope.cancel()


async def test_no_group_without_auto_create(tmp_path, autojump_clock):
    from broker.processors.retry import ensure_retry_topic
    async with trio.open_nursery() as nursery:
        g, leader, send, back, _ = await started(tmp_path, nursery, autoCreateSubscriptionGroup="false")
        phy = await sent(send, body=b"orphan")
        resp = await back.process(send_back(phy, group="g_unknown"))
        assert resp.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST and "g_unknown" in resp.remark
        assert await ensure_retry_topic(leader.bs.metadata, leader.bs.gate, leader.cfg, "g_unknown") is None
        assert leader.bs.metadata.topic_config(retry_topic("g_unknown")) is None
        # an existing group gets its retry topic (what HEART_BEAT does on the master)
        await leader.bs.metadata.update_group(SubscriptionGroupConfig("g_known", retry_queue_nums=2))
        rt = await ensure_retry_topic(leader.bs.metadata, leader.bs.gate, leader.cfg, "g_known")
        assert (rt.topic_name, rt.write_queue_nums) == (retry_topic("g_known"), 2)
        nursery.cancel_scope.cancel()


async def test_followers_refuse_writes_naming_the_masters_broker_address(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery)
        await g.start()
        leader = await g.wait_leader()
        follower = next(m for m in g.alive() if m is not leader)
        await follower.bs.metadata.wait_applied(leader.bs.store.end_index)
        assert follower.bs.metadata.broker_addr_of(leader.nid) == leader.cfg.broker_addr == "10.0.0.%d:10911" % (
            int(leader.nid[1:]) + 1)
        for write in (lambda md: md.update_topic(TopicConfig("T1")),
                      lambda md: md.update_group(SubscriptionGroupConfig("g1")),
                      lambda md: md.commit_offset("T1", "g1", 0, 5)):
            with pytest.raises(NotWritableError) as info:
                await write(follower.bs.metadata)
            assert info.value.broker_addr == leader.cfg.broker_addr
            assert f"the master is {leader.nid} at {leader.cfg.broker_addr}" in str(info.value)
        back = SendBackProcessor(processor(follower), follower.bs.cq)
        resp = await back.process(send_back(0))
        assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE and leader.cfg.broker_addr in resp.remark
        # the announcement survives a snapshot + restart
        await follower.bs.metadata.write_snapshot()
        await follower.stop()
        await g.start(follower.nid)
        assert follower.bs.metadata.broker_addr_of(leader.nid) == leader.cfg.broker_addr
        nursery.cancel_scope.cancel()


async def test_suggest_which_broker_id_follows_the_consumers_lag(tmp_path, autojump_clock):
    from tests.broker.processors.test_pull import pull_processor, pull_req
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery)
        await g.start()
        leader = await g.wait_leader()
        send = processor(leader)
        for i in range(4):
            assert (await send.process(v2(topic="TopicP", body=b"x" * 1000), BORN)).code == ResponseCode.SUCCESS
        await g.settle()
        follower = next(m for m in g.alive() if m is not leader)

        async def suggested(m, lag_bytes, offset=0):
            p = pull_processor(m, slave_read_lag_bytes=lag_bytes)
            resp = await p.process(pull_req(offset, topic="TopicP", max_nums=1))
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            return int(resp.ext_fields["suggestWhichBrokerId"])

        # close to the end (the default bound is 40 % of RAM): stay on / go back to the master
        assert await suggested(leader, 10**12) == 0
        assert await suggested(follower, 10**12) == 0
        # far behind: the master sends the consumer to a follower, by the id it registers under;
        # that follower keeps it while it is still far behind
        ids = {m.bs.broker_id for m in g.alive() if m is not leader}
        assert await suggested(leader, 1000) in ids
        assert await suggested(follower, 1000) == follower.bs.broker_id != 0
        nursery.cancel_scope.cancel()


# --- real processes ----------------------------------------------------------------------


def heartbeat(group: str, topic: str) -> RemotingCommand:
    cd = {"groupName": group, "unitMode": False, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
          "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
          "subscriptionDataSet": [{"classFilterMode": False, "codeSet": [], "expressionType": "TAG",
                                   "subString": "*", "subVersion": 1, "tagsSet": [], "topic": topic}]}
    data = {"clientID": "127.0.0.1@retry-test", "consumerDataSet": [cd], "producerDataSet": []}
    return RemotingCommand.create_request(RequestCode.HEART_BEAT, body=json.dumps(data).encode())


def pull(topic: str, group: str, queue_id: int = 0, offset: int = 0) -> RemotingCommand:
    return RemotingCommand.create_request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": group, "topic": topic, "queueId": queue_id, "queueOffset": offset, "maxMsgNums": 32,
        "sysFlag": 0x4 | 0x2, "commitOffset": 0, "suspendTimeoutMillis": 5000, "subscription": "*",
        "subVersion": 0})


@pytest.mark.slow
async def test_processes_heartbeat_route_send_back_and_slave_answers(tmp_path):
    """Slow: a real 3-broker group; the retry comes back after its 1 s delay level."""
    from tools.brokercluster import open_broker_cluster
    group, topic = "cg_proc", "RetryProcTopic"
    async with open_broker_cluster(tmp_path, size=3, extra_conf={"messageDelayLevel": "1s 2s"}) as cluster:
        rc = cluster.remoting
        master = cluster.addr(await cluster.wait_master())
        slave = next(a for n, a in ((n, cluster.addr(n)) for n in cluster.brokers) if a != master)
        # HEART_BEAT on the master creates the group and its retry topic; the route follows
        assert (await rc.invoke(master, heartbeat(group, topic), 10)).code == ResponseCode.SUCCESS
        ns = cluster.namesrv_client()
        with trio.fail_after(20):
            while True:
                try:
                    route = await ns.get_route(retry_topic(group))
                    if route.queue_datas:
                        break
                except Exception:  # TOPIC_NOT_EXIST until the broker re-registers
                    pass
                await trio.sleep(0.2)
        assert route.queue_datas[0].read_queue_nums == 1
        # send, fail, get it back through %RETRY% after level 1 (1 s)
        resp = await rc.invoke(master, v2(topic=topic, body=b"proc-fail", queue_id=0), 10)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        phy = parse_offset_msg_id(resp.ext_fields["msgId"])[1]
        resp = await rc.invoke(master, send_back(phy, delay_level=1, group=group), 10)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        with trio.fail_after(20):
            while (got := await rc.invoke(master, pull(retry_topic(group), group), 10)).code != ResponseCode.SUCCESS:
                pass  # long polling: each pull parks until the retry message is dispatched
        rec = M.decode(got.body)
        assert rec.body == b"proc-fail" and rec.properties["RETRY_TOPIC"] == topic and rec.reconsume_times == 1
        # the slave's answers name the master's broker address
        resp = await rc.invoke(slave, v2(topic=topic), 10)
        assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE and master in resp.remark, resp.remark
        upd = RemotingCommand.create_request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": "SlaveTopic", "defaultTopic": "TBW102", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6,
            "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False})
        resp = await rc.invoke(slave, upd, 10)
        assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE and master in resp.remark, resp.remark
