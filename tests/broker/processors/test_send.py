# The send path against a real 3-node in-memory group (BrokerStores on real
# stores in tmp_path, MemoryNetwork, trio MockClock; rig in
# test_broker_roles): SEND_MESSAGE / SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE
# requests as RemotingCommands in, responses out.  Checked: the reply comes
# after commit; the stored bytes on every replica decode to the sent message
# with the broker's fields (§1.8) and the PHYSICALOFFSET/QUEUEOFFSET the reply
# names; batches; validation; error mapping (not leader names the leader,
# pending full, quorum timeout).
import random

import attrs
import trio

from broker.common.msgid import UniqKeyGenerator, offset_msg_id, parse_offset_msg_id
from broker.config import LiveConfig
from broker.processors.send import SendProcessor
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from consumequeue import batch as batches
from consumequeue import record as M
from tests.broker.store.test_gate import Group

BORN = "192.168.1.5:50000"
PROPS = M.properties_to_string({"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "AC110001000118B4AAC2000000000001"})


def processor(m, **kw) -> SendProcessor:
    return SendProcessor(LiveConfig(kw.pop("cfg", m.cfg)), m.bs.replica, m.bs.gate, m.bs.metadata, m.bs.store,
                         uniq_keys=UniqKeyGenerator(ip=b"\x7f\0\0\x01", pid=7, class_loader_hash=1),
                         rng=random.Random(0), clock_ms=lambda: 1_700_000_000_123, **kw)


def v2(topic="TopicA", body=b"hello", *, queue_id=1, props=PROPS, sys_flag=0, code=RequestCode.SEND_MESSAGE_V2,
       **extra) -> RemotingCommand:
    # Mixed value types, as stock clients send them (client-compat #1).
    fields = {"a": "pg", "b": topic, "c": "TBW102", "d": 4, "e": queue_id, "f": sys_flag, "g": "1700000000000",
              "h": 0, "i": props, "j": 0, "k": False, "m": code == RequestCode.SEND_BATCH_MESSAGE, **extra}
    return RemotingCommand.create_request(code, fields, body=body, opaque=42)


def v1(topic="TopicA", body=b"v1-body", *, queue_id=-1, props="") -> RemotingCommand:
    fields = {"producerGroup": "pg", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
              "queueId": str(queue_id), "sysFlag": "0", "bornTimestamp": "1700000000001", "flag": "3",
              "properties": props}
    return RemotingCommand.create_request(RequestCode.SEND_MESSAGE, fields, body=body, opaque=43)


def stored(m, msg_id: str) -> M.MessageRecord:
    host, phy = parse_offset_msg_id(msg_id)
    assert host == m.cfg.store_host or host.port == m.cfg.listen_port
    size = int.from_bytes(m.bs.cq.engine.source.read(phy, 4), "big")
    rec = M.decode(m.bs.cq.engine.source.read(phy, size), check_crc=True)
    assert rec.physical_offset == phy
    return rec


async def test_send_v2_and_v1_are_committed_and_stored_identically(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery)
        await g.start()
        leader = await g.wait_leader()
        send = processor(leader)
        resp = await send.process(v2(sys_flag=M.COMPRESSED_FLAG), BORN)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert (resp.opaque, resp.is_response) == (42, True)
        # the reply came after commit: the leader's committed index covers it
        assert leader.bs.replica.committed.value == leader.bs.store.end_index
        f = resp.ext_fields
        assert (f["queueId"], f["queueOffset"]) == ("1", "0")
        assert f["transactionId"] == "AC110001000118B4AAC2000000000001"
        host, phy = parse_offset_msg_id(f["msgId"])
        assert f["msgId"] == offset_msg_id(leader.cfg.store_host, phy)
        # the topic was auto-created with min(client 4, broker 8) queues
        assert leader.bs.metadata.topic_config("TopicA").write_queue_nums == 4

        r1 = await send.process(v1(queue_id=1), "[::ffff:192.168.1.6]:50001")
        assert r1.code == ResponseCode.SUCCESS and r1.ext_fields["queueOffset"] == "1"
        r2 = await send.process(v1(), BORN)  # queueId -1: the broker picks
        assert r2.code == ResponseCode.SUCCESS and 0 <= int(r2.ext_fields["queueId"]) < 4
        await g.settle()
        for m in g.alive():
            rec = stored(m, f["msgId"])
            assert (rec.topic, rec.body, rec.queue_id, rec.queue_offset) == ("TopicA", b"hello", 1, 0)
            assert rec.sysflag & M.COMPRESSED_FLAG  # the producer's sysFlag round-trips
            assert str(rec.born_host) == BORN and rec.born_timestamp == 1_700_000_000_000
            assert rec.store_host == leader.cfg.store_host and rec.store_timestamp == 1_700_000_000_123
            assert rec.properties["CLUSTER"] == "TestCluster"
            assert rec.properties["TAGS"] == "TagA" and rec.uniq_key == f["transactionId"]
            rec1 = stored(m, r1.ext_fields["msgId"])
            assert (rec1.queue_offset, rec1.flag, str(rec1.born_host)) == (1, 3, "192.168.1.6:50001")
            assert rec1.uniq_key == r1.ext_fields["transactionId"] and len(rec1.uniq_key) == 32
        nursery.cancel_scope.cancel()


async def test_batch_send(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery)
        await g.start()
        leader = await g.wait_leader()
        send = processor(leader)
        items = [batches.BatchItem(f"b{i}".encode(), {"UNIQ_KEY": f"U{i}"} if i else {}, flag=i) for i in range(3)]
        resp = await send.process(v2(body=batches.encode_batch(items), queue_id=2, props="",
                                     code=RequestCode.SEND_BATCH_MESSAGE), BORN)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        ids = resp.ext_fields["msgId"].split(",")
        assert len(ids) == 3 and resp.ext_fields["queueOffset"] == "0"
        await g.settle()
        for m in g.alive():
            recs = [stored(m, i) for i in ids]
            assert [(r.body, r.flag, r.queue_id, r.queue_offset) for r in recs] == [
                (f"b{i}".encode(), i, 2, i) for i in range(3)]
            assert [r.uniq_key for r in recs][1:] == ["U1", "U2"] and recs[0].uniq_key
            assert all(r.properties["CLUSTER"] == "TestCluster" for r in recs)
        # transactional or delayed batches are refused
        bad = await send.process(v2(body=batches.encode_batch(items), props="DELAY\x013\x02",
                                    code=RequestCode.SEND_BATCH_MESSAGE), BORN)
        assert bad.code == ResponseCode.MESSAGE_ILLEGAL
        nursery.cancel_scope.cancel()


async def test_validation_errors(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery, maxMessageSize="1024")
        await g.start()
        leader = await g.wait_leader()
        send = processor(leader)
        end = leader.bs.store.end_index

        async def code(req):
            return (await send.process(req, BORN)).code

        assert await code(v2(topic="bad topic")) == ResponseCode.MESSAGE_ILLEGAL
        assert await code(v2(topic="T" * 128)) == ResponseCode.MESSAGE_ILLEGAL
        assert await code(v2(body=b"x" * 1025)) == ResponseCode.MESSAGE_ILLEGAL
        assert await code(v2(props="K\x01" + "v" * 40000 + "\x02")) == ResponseCode.MESSAGE_ILLEGAL
        assert await code(v2(topic="TBW102")) == ResponseCode.NO_PERMISSION
        assert await code(v2(topic="rmq_sys_LEDGERMQ_CONSUMER_OFFSET")) == ResponseCode.NO_PERMISSION
        missing = RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, {"a": "pg", "b": "TopicA"})
        resp = await send.process(missing, BORN)
        assert resp.code == ResponseCode.SYSTEM_ERROR and "<c>" in resp.remark
        assert await code(v2(queue_id=99)) == ResponseCode.SYSTEM_ERROR  # creates TopicA (4 queues) first
        no_auto = processor(leader, cfg=attrs.evolve(leader.cfg, auto_create_topic_enable=False))
        resp = await no_auto.process(v2(topic="Unknown"), BORN)
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST and "Unknown" in resp.remark
        # nothing but TopicA's config record reached the log
        assert leader.bs.store.end_index == end + 1
        nursery.cancel_scope.cancel()


async def test_not_leader_and_busy(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery)
        await g.start()
        leader = await g.wait_leader()
        follower = next(m for m in g.alive() if m is not leader)
        await follower.bs.metadata.wait_applied(leader.bs.store.end_index)  # the leader's announcement
        resp = await processor(follower).process(v2(), BORN)
        assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE
        # the master's broker address (announced through the metadata), not its DLedger peer address
        assert f"the master is {leader.nid} at {leader.cfg.broker_addr}" in resp.remark
        assert (await processor(leader).process(v2(), BORN)).code == ResponseCode.SUCCESS
        leader.bs.replica.max_pending = 0
        resp = await processor(leader).process(v2(), BORN)
        assert resp.code == ResponseCode.SYSTEM_BUSY
        nursery.cancel_scope.cancel()


async def test_quorum_timeout_is_flush_slave_timeout_with_ids(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        # acks time out well inside check-quorum's step-down
        g = Group(tmp_path, nursery, maxWaitAckTimeMs="100")
        await g.start()
        leader = await g.wait_leader()
        send = processor(leader)
        assert (await send.process(v2(), BORN)).code == ResponseCode.SUCCESS
        for m in g.alive():
            if m is not leader:
                g.net.isolate(m.nid)
        resp = await send.process(v2(body=b"lonely"), BORN)
        assert resp.code == ResponseCode.FLUSH_SLAVE_TIMEOUT, resp.remark
        assert resp.ext_fields["queueOffset"] == "1" and resp.ext_fields["queueId"] == "1"
        _, phy = parse_offset_msg_id(resp.ext_fields["msgId"])
        raw = leader.bs.store.get(leader.bs.store.end_index).body
        assert M.decode(raw).physical_offset == phy and M.decode(raw).body == b"lonely"
        nursery.cancel_scope.cancel()
