# Admin requests (broker/processors/admin.py) against a real 3-node in-memory group
# (MockClock; rig of test_broker_roles via test_broker_pull/consumer).
# Checked: UPDATE_AND_CREATE_TOPIC replicated to every member, leader only,
# validation; DELETE_TOPIC_IN_BROKER (config + offsets); GET_ALL_TOPIC_CONFIG
# wrapper without internal topics; VIEW_MESSAGE_BY_ID raw record / SYSTEM_ERROR;
# QUERY_MESSAGE by key and unique key with the index header fields /
# QUERY_NOT_FOUND; GET_BROKER_RUNTIME_INFO KVTable; GET_TOPIC_STATS_INFO and
# GET_CONSUME_STATS (fastjson MessageQueue-keyed maps); subscription group
# create/delete.
import json
import re

import trio

from broker.common.msgid import parse_offset_msg_id
from broker.config import LiveConfig
from broker.metadata.records import CONSUMER_OFFSET_TOPIC
from broker.processors.admin import AdminProcessor, encode_mq_map, parse_attributes
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RequestError
from consumequeue import record as M
from tests.broker.processors.test_pull import TOPIC
from tests.broker.processors.test_send import BORN, processor, v2
from tests.broker.store.test_gate import Group


def admin_processor(m) -> AdminProcessor:
    """As broker.server wires it: the member's config and its store's parts."""
    bs = m.bs
    return AdminProcessor(config=LiveConfig(m.cfg), gate=bs.gate, metadata=bs.metadata, replica=bs.replica,
                          log=bs.store, cq=bs.cq, queues=bs.cq.engine)


def req(code, fields=None, body=b"") -> RemotingCommand:
    return RemotingCommand.create_request(code, fields, body=body, opaque=5)


async def send_keyed(m, body: bytes, keys: str, uniq: str, queue_id=1):
    props = M.properties_to_string({"TAGS": "TagA", "KEYS": keys, "UNIQ_KEY": uniq})
    resp = await processor(m).process(v2(TOPIC, body, queue_id=queue_id, props=props), BORN)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return resp


async def rig(tmp_path, nursery):
    g = Group(tmp_path, nursery)
    await g.start()
    leader = await g.wait_leader()
    sent = []
    for i in range(3):
        sent.append(await send_keyed(leader, f"m{i}".encode(), f"k{i} shared", f"UNIQ{i:04d}"))
    await settle(g, leader)
    follower = next(m for m in g.alive() if m is not leader)
    return g, leader, follower, sent


async def settle(g, leader) -> None:
    """Committed, dispatched and metadata applied on every member."""
    await g.settle()
    for m in g.alive():
        await m.bs.metadata.wait_applied(leader.bs.metadata.applied_index, timeout=10)


def topic_req(topic="TopicNew", **over):
    fields = {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6,
              "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False}
    fields.update(over)
    return req(RequestCode.UPDATE_AND_CREATE_TOPIC, {k: v for k, v in fields.items() if v is not None})


def mq_map(body: bytes) -> dict:
    """Parse encode_mq_map's fastjson body (object keys) back."""
    text = body.decode()
    out = {}
    for key, value in re.findall(r'(\{"brokerName":[^{}]*\}):(\{[^{}]*\})', text):
        k = json.loads(key)
        out[(k["topic"], k["queueId"])] = json.loads(value)
    return out


def test_parse_attributes_and_mq_map_encoding():
    assert parse_attributes("+a=1,+b=2") == {"a": "1", "b": "2"}
    assert parse_attributes("-a,c=3", {"a": "1", "b": "2"}) == {"b": "2", "c": "3"}
    assert parse_attributes(None, {"x": "y"}) == {"x": "y"}
    for bad in ("+a", "-a=1", "=1"):
        try:
            parse_attributes(bad)
        except RequestError as e:
            assert e.code == ResponseCode.INVALID_PARAMETER
        else:
            raise AssertionError(bad)
    body = encode_mq_map({("T", "b", 1): {"x": 1}, ("T", "b", 0): {"x": 0}}, {"consumeTps": 0.0})
    assert body == (b'{"consumeTps":0.0,"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{"x":0},'
                    b'{"brokerName":"b","queueId":1,"topic":"T"}:{"x":1}}}')
    assert encode_mq_map({}) == b'{"offsetTable":{}}'


async def test_update_create_and_delete_topic(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g, leader, follower, _ = await rig(tmp_path, nursery)
        p, fp = admin_processor(leader), admin_processor(follower)

        ok = await p(None, topic_req(attributes="+queue.type=BatchCQ"))
        assert (ok.code, ok.opaque, ok.is_response) == (ResponseCode.SUCCESS, 5, True), ok.remark
        await settle(g, leader)
        for m in g.alive():  # replicated through the metadata log
            tc = m.bs.metadata.topic_config("TopicNew")
            assert (tc.read_queue_nums, tc.write_queue_nums, tc.perm) == (4, 4, 6)
            assert tc.attributes == {"queue.type": "BatchCQ"}
        # update keeps attributes unless told
        assert (await p(None, topic_req(readQueueNums=8, writeQueueNums=8, perm=4))).code == ResponseCode.SUCCESS
        tc = leader.bs.metadata.topic_config("TopicNew")
        assert (tc.read_queue_nums, tc.perm, tc.attributes) == (8, 4, {"queue.type": "BatchCQ"})

        # leader only
        nl = await fp(None, topic_req("TopicF"))
        assert nl.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert follower.bs.metadata.topic_config("TopicF") is None

        # validation
        bad = {
            "bad name": topic_req("a b"),
            "system": topic_req("TBW102"),
            "rmq_sys": topic_req("rmq_sys_X"),
            "internal": topic_req(CONSUMER_OFFSET_TOPIC),
            "cluster": topic_req(leader.cfg.broker_cluster_name),
        }
        for what, r in bad.items():
            assert (await p(None, r)).code == ResponseCode.SYSTEM_ERROR, what
        for what, r in {"zero queues": topic_req(readQueueNums=0), "perm": topic_req(perm=16),
                        "filter": topic_req(topicFilterType="SQL"), "attr": topic_req(attributes="+x")}.items():
            assert (await p(None, r)).code == ResponseCode.INVALID_PARAMETER, what
        missing = await p(None, topic_req(perm=None))
        assert missing.code == ResponseCode.SYSTEM_ERROR and "perm" in missing.remark
        assert (await p(None, topic_req(readQueueNums="x"))).code == ResponseCode.SYSTEM_ERROR

        # GET_ALL_TOPIC_CONFIG: wrapper JSON, internal topics excluded (they exist on the node)
        assert CONSUMER_OFFSET_TOPIC not in leader.bs.metadata.topic_configs()
        await settle(g, leader)
        resp = await fp(None, req(RequestCode.GET_ALL_TOPIC_CONFIG))
        body = json.loads(resp.body)
        assert resp.code == ResponseCode.SUCCESS
        assert set(body["topicConfigTable"]) == {TOPIC, "TopicNew"}
        assert body["topicConfigTable"]["TopicNew"]["readQueueNums"] == 8
        assert body["topicConfigTable"]["TopicNew"]["topicName"] == "TopicNew"
        assert set(body["dataVersion"]) == {"counter", "stateVersion", "timestamp"}
        assert body["dataVersion"]["counter"] == leader.bs.metadata.state.topics.data_version.counter

        # DELETE_TOPIC_IN_BROKER: config and offsets go, on every member
        await leader.bs.metadata.commit_offset("TopicNew", "cg", 0, 3)
        assert (await fp(None, req(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "TopicNew"}))).code == \
            ResponseCode.SERVICE_NOT_AVAILABLE
        assert (await p(None, req(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "TopicNew"}))).code == \
            ResponseCode.SUCCESS
        await settle(g, leader)
        for m in g.alive():
            assert m.bs.metadata.topic_config("TopicNew") is None
            assert m.bs.metadata.query_offset("TopicNew", "cg", 0) is None
        # deleting again / an unknown topic is fine; system topics are refused
        assert (await p(None, req(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Nope"}))).code == \
            ResponseCode.SUCCESS
        assert (await p(None, req(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": CONSUMER_OFFSET_TOPIC}))).code == \
            ResponseCode.SYSTEM_ERROR
        nursery.cancel_scope.cancel()


async def test_view_and_query_message(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g, leader, follower, sent = await rig(tmp_path, nursery)
        for m in (leader, follower):
            p = admin_processor(m)
            _, phy = parse_offset_msg_id(sent[1].ext_fields["msgId"])
            resp = await p(None, req(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": phy, "topic": TOPIC}))
            assert resp.code == ResponseCode.SUCCESS
            rec = M.decode(resp.body, check_crc=True)
            assert (rec.body, rec.physical_offset, len(resp.body)) == (b"m1", phy, int.from_bytes(resp.body[:4], "big"))
            for wrong in (phy + 1, 10**12, -5):
                nf = await p(None, req(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": wrong}))
                assert nf.code == ResponseCode.SYSTEM_ERROR and nf.body == b"", wrong

            q = {"topic": TOPIC, "key": "shared", "maxNum": 32, "beginTimestamp": 0,
                 "endTimestamp": 2**62}
            resp = await p(None, req(RequestCode.QUERY_MESSAGE, q))
            assert resp.code == ResponseCode.SUCCESS
            got = []
            pos = 0
            while pos < len(resp.body):
                size = int.from_bytes(resp.body[pos:pos + 4], "big")
                got.append(M.decode(resp.body[pos:pos + size], check_crc=True).body)
                pos += size
            assert sorted(got) == [b"m0", b"m1", b"m2"]
            assert int(resp.ext_fields["indexLastUpdateTimestamp"]) > 0
            assert int(resp.ext_fields["indexLastUpdatePhyoffset"]) >= 0
            one = await p(None, req(RequestCode.QUERY_MESSAGE, {**q, "key": "k2"}))
            assert M.decode(one.body).body == b"m2"
            uniq = await p(None, req(RequestCode.QUERY_MESSAGE, {**q, "key": "UNIQ0001", "_UNIQUE_KEY_QUERY": True}))
            assert uniq.code == ResponseCode.SUCCESS and M.decode(uniq.body).body == b"m1"
            nf = await p(None, req(RequestCode.QUERY_MESSAGE, {**q, "key": "absent"}))
            assert nf.code == ResponseCode.QUERY_NOT_FOUND and nf.body == b""
            assert "indexLastUpdateTimestamp" in nf.ext_fields and "indexLastUpdatePhyoffset" in nf.ext_fields
            other = await p(None, req(RequestCode.QUERY_MESSAGE, {**q, "topic": "TopicOther"}))
            assert other.code == ResponseCode.QUERY_NOT_FOUND
        nursery.cancel_scope.cancel()


async def test_runtime_info_and_stats(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g, leader, follower, sent = await rig(tmp_path, nursery)
        p, fp = admin_processor(leader), admin_processor(follower)

        resp = await p(None, req(RequestCode.GET_BROKER_RUNTIME_INFO))
        table = json.loads(resp.body)["table"]
        assert all(isinstance(v, str) for v in table.values())
        assert (table["brokerVersionDesc"], table["brokerVersion"]) == ("V5_3_3", "479")
        assert table["brokerImpl"] == "ledgermq"
        assert int(table["msgPutTotalTodayNow"]) >= 3  # 3 messages (+ metadata records are not messages)
        assert int(table["commitLogMaxOffset"]) == leader.bs.store.end_pos
        assert int(table["commitLogMinOffset"]) == 0
        assert table["dledgerRole"] == "LEADER" and table["brokerRole"] == "ASYNC_MASTER"
        assert int(table["dledgerTerm"]) == leader.bs.gate.term >= 1
        assert int(table["dledgerCommittedIndex"]) == leader.bs.replica.committed.value
        ft = json.loads((await fp(None, req(RequestCode.GET_BROKER_RUNTIME_INFO))).body)["table"]
        assert ft["dledgerRole"] == "FOLLOWER" and ft["brokerRole"] == "SLAVE"

        # topic stats: every write queue, min/max/last update
        ts = await fp(None, req(RequestCode.GET_TOPIC_STATS_INFO, {"topic": TOPIC}))
        assert ts.code == ResponseCode.SUCCESS
        stats = mq_map(ts.body)
        nq = leader.bs.metadata.topic_config(TOPIC).write_queue_nums
        assert set(stats) == {(TOPIC, q) for q in range(nq)}
        assert stats[(TOPIC, 1)]["minOffset"] == 0 and stats[(TOPIC, 1)]["maxOffset"] == 3
        assert stats[(TOPIC, 1)]["lastUpdateTimestamp"] > 0
        assert stats[(TOPIC, 0)] == {"lastUpdateTimestamp": 0, "maxOffset": 0, "minOffset": 0}
        assert (await p(None, req(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "Nope"}))).code == \
            ResponseCode.TOPIC_NOT_EXIST
        # fastjson's dialect: the object keys are what Java reads; our own parser does not need to
        assert ts.body.startswith(b'{"offsetTable":{{"brokerName":')

        # consume stats
        await leader.bs.metadata.commit_offset(TOPIC, "cg", 1, 1)
        await settle(g, leader)
        cs = await fp(None, req(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "cg", "topic": TOPIC}))
        assert cs.code == ResponseCode.SUCCESS and cs.body.startswith(b'{"consumeTps":0.0,"offsetTable":{')
        table = mq_map(cs.body)
        assert table[(TOPIC, 1)]["brokerOffset"] == 3 and table[(TOPIC, 1)]["consumerOffset"] == 1
        assert table[(TOPIC, 1)]["lastTimestamp"] > 0 and "lag" not in table[(TOPIC, 1)]
        assert table[(TOPIC, 0)]["consumerOffset"] == -1
        py = fp.consume_stats("cg")  # no topic: the topics the group has offsets for
        assert py[(TOPIC, leader.cfg.broker_name, 1)]["lag"] == 2
        assert (await p(None, req(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "cg", "topic": "Nope"}))).code \
            == ResponseCode.TOPIC_NOT_EXIST
        empty = await p(None, req(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "nobody"}))
        assert empty.body == b'{"consumeTps":0.0,"offsetTable":{}}'
        nursery.cancel_scope.cancel()


async def test_subscription_groups(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g, leader, follower, _ = await rig(tmp_path, nursery)
        p, fp = admin_processor(leader), admin_processor(follower)
        cfg = {"groupName": "gA", "consumeEnable": True, "retryMaxTimes": 5, "brokerId": 0,
               "consumeBroadcastEnable": False, "groupRetryPolicy": {"type": "CUSTOMIZED"}}
        body = json.dumps(cfg).encode()
        assert (await fp(None, req(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body))).code == \
            ResponseCode.SERVICE_NOT_AVAILABLE
        ok = await p(None, req(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body))
        assert ok.code == ResponseCode.SUCCESS, ok.remark
        await settle(g, leader)
        for m in g.alive():
            gc = m.bs.metadata.group_config("gA")
            assert (gc.retry_max_times, gc.consume_broadcast_enable) == (5, False)
            assert gc.extra == {"groupRetryPolicy": {"type": "CUSTOMIZED"}}
        # GET_ALL_SUBSCRIPTIONGROUP_CONFIG: every node answers from its replicated tables
        for proc in (p, fp):
            resp = await proc(None, req(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
            table = json.loads(resp.body)["subscriptionGroupTable"]
            assert resp.code == ResponseCode.SUCCESS and table["gA"]["retryMaxTimes"] == 5
        for bad in (b"not json", b"[]", json.dumps({"groupName": "a b"}).encode(),
                    json.dumps({"groupName": "g", "retryMaxTimes": "x"}).encode()):
            assert (await p(None, req(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=bad))).code == \
                ResponseCode.SYSTEM_ERROR, bad

        await leader.bs.metadata.commit_offset(TOPIC, "gA", 1, 2)
        d = req(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "gA"})
        assert (await fp(None, d)).code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert (await p(None, d)).code == ResponseCode.SUCCESS
        assert leader.bs.metadata.group_config("gA") is None
        assert leader.bs.metadata.query_offset(TOPIC, "gA", 1) == 2  # kept without cleanOffset
        d2 = req(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "gA", "cleanOffset": True})
        assert (await p(None, d2)).code == ResponseCode.SUCCESS
        await settle(g, leader)
        for m in g.alive():
            assert m.bs.metadata.group_config("gA") is None
            assert m.bs.metadata.query_offset(TOPIC, "gA", 1) is None
        nursery.cancel_scope.cancel()
