# Consumer offset and client requests (broker/processors/offsets.py, clients.py,
# client_manager.py): offsets against a real
# 3-node in-memory group (MockClock; rig of test_broker_roles), the client
# registry with fake connections.  Checked: QUERY_CONSUMER_OFFSET's 0 vs 22
# (client-compat #7), UPDATE_CONSUMER_OFFSET ignoring negatives, answering
# unless oneway, leader only, replicated (#8); GET_MAX/MIN_OFFSET,
# SEARCH_OFFSET_BY_TIMESTAMP, GET_EARLIEST_MSG_STORETIME; HEART_BEAT with
# enum names and ordinals (#5), GET_CONSUMER_LIST_BY_GROUP, UNREGISTER_CLIENT,
# connection close and expiry, and NOTIFY_CONSUMER_IDS_CHANGED pushed oneway
# to the group's other connections.
import json
import random

import pytest
import trio
import trio.testing

from broker.common.msgid import UniqKeyGenerator
from broker.common.values import ConsumeFromWhere, ConsumeType, MessageModel
from broker.config import LiveConfig
from broker.processors.client_manager import ClientManager, parse_enum
from broker.processors.clients import ClientProcessor
from broker.processors.offsets import ConsumerOffsetProcessor
from broker.processors.retry import RetryTopics, retry_topic
from broker.processors.send import SendProcessor
from broker.remoting.codes import RPC_ONEWAY, RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RequestError
from broker.remoting.server import RequestDispatcher
from tests.broker.processors.test_pull import TOPIC, send
from tests.broker.processors.test_send import BORN, v2
from tests.broker.store.test_gate import Group


def offsets_processor(bs) -> ConsumerOffsetProcessor:
    """As broker.server wires it."""
    return ConsumerOffsetProcessor(gate=bs.gate, metadata=bs.metadata, queues=bs.cq.engine)


class FakeConn:
    def __init__(self, name: str):
        self.remote_address = name
        self.attributes = {}
        self.closed = False
        self.sent: list[RemotingCommand] = []

    async def send_request_oneway(self, cmd, timeout=None):
        self.sent.append(cmd.as_request(0, oneway=True))  # what Connection sends


def req(code, fields=None, body=b"", oneway=False) -> RemotingCommand:
    return RemotingCommand.create_request(code, fields, body=body, opaque=9, flag=RPC_ONEWAY if oneway else 0)


def heartbeat(client_id, group="cg", *, names=True, producer=None, sub="TagA") -> RemotingCommand:
    cd = {"groupName": group, "unitMode": False,
          "consumeType": "CONSUME_PASSIVELY" if names else 1,
          "messageModel": "CLUSTERING" if names else 1,
          "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET" if names else 4,
          "subscriptionDataSet": [{"classFilterMode": False, "codeSet": [], "expressionType": "TAG",
                                   "subString": sub, "subVersion": 1, "tagsSet": [sub], "topic": TOPIC}]}
    data = {"clientID": client_id, "consumerDataSet": [cd] if group else [],
            "producerDataSet": [{"groupName": producer}] if producer else [],
            "heartbeatFingerprint": 0, "withoutSub": False}
    return req(RequestCode.HEART_BEAT, body=json.dumps(data).encode())


async def loaded(tmp_path, nursery, n=3, **extra):
    g = Group(tmp_path, nursery, **extra)
    await g.start()
    leader = await g.wait_leader()
    for i in range(n):
        assert (await send(leader, f"m{i}".encode(), "TagA")).code == ResponseCode.SUCCESS
    await g.settle()
    return g, leader


def offset_of(resp) -> int:
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return int(resp.ext_fields["offset"])


def test_parse_enum_names_and_ordinals():
    assert parse_enum(ConsumeType, "CONSUME_PASSIVELY", ConsumeType.CONSUME_ACTIVELY) is ConsumeType.CONSUME_PASSIVELY
    assert parse_enum(ConsumeType, 1, ConsumeType.CONSUME_ACTIVELY) is ConsumeType.CONSUME_PASSIVELY
    assert parse_enum(ConsumeType, "2", ConsumeType.CONSUME_ACTIVELY) is ConsumeType.CONSUME_POP
    assert parse_enum(MessageModel, 0, MessageModel.CLUSTERING) is MessageModel.BROADCASTING
    assert parse_enum(ConsumeFromWhere, 5, None) is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP
    assert parse_enum(MessageModel, None, MessageModel.CLUSTERING) is MessageModel.CLUSTERING
    for bad in (7, -1, "NOPE", True, 1.5):
        with pytest.raises(RequestError):
            parse_enum(MessageModel, bad, MessageModel.CLUSTERING)


async def test_query_and_update_consumer_offset(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g, leader = await loaded(tmp_path, nursery)
        follower = next(m for m in g.alive() if m is not leader)
        p = offsets_processor(leader.bs)
        fp = offsets_processor(follower.bs)
        q = {"consumerGroup": "cg", "topic": TOPIC, "queueId": 1}

        # nothing committed, the queue starts at 0: SUCCESS 0 (quirk #7)
        assert offset_of(await p(None, req(RequestCode.QUERY_CONSUMER_OFFSET, q))) == 0
        assert offset_of(await p(None, req(RequestCode.QUERY_CONSUMER_OFFSET, {**q, "queueId": 3}))) == 0
        nf = await p(None, req(RequestCode.QUERY_CONSUMER_OFFSET, {**q, "setZeroIfNotFound": False}))
        assert nf.code == ResponseCode.QUERY_NOT_FOUND
        cq = leader.bs.cq.engine.cqs.get(TOPIC, 1)
        saved, cq.min_offset = cq.min_offset, 2  # as if retention removed the head
        try:
            assert (await p(None, req(RequestCode.QUERY_CONSUMER_OFFSET, q))).code == ResponseCode.QUERY_NOT_FOUND
        finally:
            cq.min_offset = saved

        u = {**q, "commitOffset": 2}
        # negative commits are ignored, but a request that is not oneway is answered (#8)
        neg = await p(None, req(RequestCode.UPDATE_CONSUMER_OFFSET, {**u, "commitOffset": -1}))
        assert neg.code == ResponseCode.SUCCESS and leader.bs.metadata.query_offset(TOPIC, "cg", 1) is None
        assert await p(None, req(RequestCode.UPDATE_CONSUMER_OFFSET, {**u, "commitOffset": -1}, oneway=True)) is None
        ok = await p(None, req(RequestCode.UPDATE_CONSUMER_OFFSET, u))
        assert (ok.code, ok.opaque, ok.is_response) == (ResponseCode.SUCCESS, 9, True)
        # SUCCESS means committed in the log, not merely staged on this master
        # (an acknowledged commit must survive a failover: issue 14)
        assert leader.bs.metadata.query_offset(TOPIC, "cg", 1, include_staged=False) == 2
        assert offset_of(await p(None, req(RequestCode.QUERY_CONSUMER_OFFSET, q))) == 2  # staged counts
        assert await p(None, req(RequestCode.UPDATE_CONSUMER_OFFSET, {**u, "commitOffset": 3}, oneway=True)) is None
        # only the writable leader stores offsets
        fr = await fp(None, req(RequestCode.UPDATE_CONSUMER_OFFSET, {**u, "commitOffset": 1}))
        assert fr.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert await fp(None, req(RequestCode.UPDATE_CONSUMER_OFFSET, u, oneway=True)) is None
        await trio.sleep(1)
        await g.settle()
        for m in g.alive():
            assert m.bs.metadata.query_offset(TOPIC, "cg", 1, include_staged=False) == 3
        assert offset_of(await fp(None, req(RequestCode.QUERY_CONSUMER_OFFSET, q))) == 3
        bad = await p(None, req(RequestCode.QUERY_CONSUMER_OFFSET, {"topic": TOPIC}))
        assert bad.code == ResponseCode.SYSTEM_ERROR and "<consumerGroup>" in bad.remark
        nursery.cancel_scope.cancel()


async def test_max_min_search_and_earliest_time(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g, leader = await loaded(tmp_path, nursery, n=0)
        times = iter([1000, 2000, 2000, 3000])
        sp = SendProcessor(LiveConfig(leader.cfg), leader.bs.replica, leader.bs.gate, leader.bs.metadata, leader.bs.store,
                           uniq_keys=UniqKeyGenerator(ip=b"\x7f\0\0\x01", pid=7, class_loader_hash=1),
                           rng=random.Random(0), clock_ms=lambda: next(times))
        for i in range(4):
            assert (await sp.process(v2(TOPIC, f"t{i}".encode(), queue_id=1), BORN)).code == ResponseCode.SUCCESS
        await g.settle()
        for m in g.alive():
            p = offsets_processor(m.bs)
            q = {"topic": TOPIC, "queueId": 1}

            async def offset(code, **extra):
                return offset_of(await p(None, req(code, {**q, **extra})))

            assert await offset(RequestCode.GET_MAX_OFFSET) == 4
            assert await offset(RequestCode.GET_MAX_OFFSET, committed=False) == 4
            assert await offset(RequestCode.GET_MIN_OFFSET) == 0
            assert await offset(RequestCode.GET_MAX_OFFSET, queueId=2) == 0
            assert await offset(RequestCode.GET_MIN_OFFSET, queueId=2) == 0
            S = RequestCode.SEARCH_OFFSET_BY_TIMESTAMP
            assert await offset(S, timestamp=2000) == 1
            assert await offset(S, timestamp=2000, boundaryType="UPPER") == 2
            assert await offset(S, timestamp=1500) == 1
            assert await offset(S, timestamp=500) == 0
            assert await offset(S, timestamp=9000) == 4
            assert await offset(S, timestamp=500, boundaryType="UPPER") == 0
            bad = await p(None, req(S, {**q, "timestamp": 1, "boundaryType": "MIDDLE"}))
            assert bad.code == ResponseCode.SYSTEM_ERROR
            e = await p(None, req(RequestCode.GET_EARLIEST_MSG_STORETIME, q))
            assert e.code == ResponseCode.SUCCESS and e.ext_fields["timestamp"] == "1000"
            e = await p(None, req(RequestCode.GET_EARLIEST_MSG_STORETIME, {**q, "queueId": 2}))
            assert e.ext_fields["timestamp"] == "-1"
        nursery.cancel_scope.cancel()


async def test_a_producer_heartbeat_naming_another_clients_id_does_not_replace_it():
    """Producers are kept per connection (RocketMQ's ProducerManager keys by
    channel): a second connection claiming the same client id adds a
    channel, and the first keeps its own (its transaction check-backs)."""
    mgr = ClientManager()
    p = ClientProcessor(mgr)
    owner, other = FakeConn("owner"), FakeConn("other")
    await p(owner, heartbeat("ip@1", group=None, producer="pg"))
    await p(other, heartbeat("ip@1", group=None, producer="pg"))
    assert [ch.conn for ch in mgr.producer_channels("pg")] == [owner, other]
    assert mgr.producer_ids("pg") == ["ip@1"]
    await p(other, req(RequestCode.UNREGISTER_CLIENT, {"clientID": "ip@1", "producerGroup": "pg"}))
    assert [ch.conn for ch in mgr.producer_channels("pg")] == [owner]
    mgr.on_connection_closed(owner)
    assert mgr.producer_channels("pg") == [] and "pg" not in mgr.producers


async def test_heartbeat_consumer_list_unregister_and_notify():
    now = [0]
    mgr = ClientManager(clock_ms=lambda: now[0])
    p = ClientProcessor(mgr)
    c1, c2, c3 = FakeConn("c1"), FakeConn("c2"), FakeConn("c3")

    async def ids(group="cg"):
        r = await p(None, req(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group}))
        return json.loads(r.body)["consumerIdList"] if r.code == ResponseCode.SUCCESS else r.code

    async with trio.open_nursery() as nursery:
        await nursery.start(mgr.run)
        assert await ids() == ResponseCode.SYSTEM_ERROR  # Java: "no consumer for this group"
        r = await p(c1, heartbeat("ip@1", producer="pg"))
        assert r.code == ResponseCode.SUCCESS and c1.attributes["clientID"] == "ip@1"
        info = mgr.group("cg")
        assert (info.consume_type, info.message_model, info.consume_from_where) == (
            ConsumeType.CONSUME_PASSIVELY, MessageModel.CLUSTERING, ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
        assert info.subscriptions[TOPIC].subscription().tags == {"TagA"}
        assert mgr.producer_ids("pg") == ["ip@1"]
        # ordinals (client-compat #5), a second member: the first is told
        assert (await p(c2, heartbeat("ip@2", names=False))).code == ResponseCode.SUCCESS
        assert mgr.group("cg").consume_from_where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(await ids()) == ["ip@1", "ip@2"]
        assert [(c.code, c.ext_fields, c.is_oneway) for c in c1.sent] == [
            (RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": "cg"}, True)]
        assert c2.sent == []
        # a repeated heartbeat is not a membership change
        await p(c1, heartbeat("ip@1"))
        await p(c2, heartbeat("ip@2", names=False))
        await trio.testing.wait_all_tasks_blocked()
        assert (len(c1.sent), len(c2.sent)) == (1, 0)
        # a third member, then it unregisters: the others hear of both.
        # Another connection naming its client id unregisters nothing
        # (client ids are no secret; RocketMQ keys clients by channel).
        await p(c3, heartbeat("ip@3"))
        await trio.testing.wait_all_tasks_blocked()  # (else its join and leave are one waiting push)
        for group in ({"consumerGroup": "cg"}, {"producerGroup": "pg"}):
            await p(c2, req(RequestCode.UNREGISTER_CLIENT, {"clientID": "ip@3", **group}))
            await p(c3, req(RequestCode.UNREGISTER_CLIENT, {"clientID": "ip@1", **group}))
        assert sorted(await ids()) == ["ip@1", "ip@2", "ip@3"] and mgr.producer_ids("pg") == ["ip@1"]
        r = await p(c3, req(RequestCode.UNREGISTER_CLIENT, {"clientID": "ip@3", "consumerGroup": "cg"}))
        assert r.code == ResponseCode.SUCCESS
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(await ids()) == ["ip@1", "ip@2"]
        assert (len(c1.sent), len(c2.sent), len(c3.sent)) == (3, 2, 0)
        # unregistering a producer
        await p(c1, req(RequestCode.UNREGISTER_CLIENT, {"clientID": "ip@1", "producerGroup": "pg"}))
        assert mgr.producer_ids("pg") == []
        # a closed connection: its client leaves, the rest are told
        mgr.on_connection_closed(c2)
        await trio.testing.wait_all_tasks_blocked()
        assert await ids() == ["ip@1"] and len(c1.sent) == 4
        # expiry: no heartbeat for 120 s
        now[0] = 119_000
        await p(c2, heartbeat("ip@2"))
        now[0] = 121_000
        assert await ids() == ["ip@2"]  # reads skip the expired one at once
        assert mgr.scan_expired() == 1
        await trio.testing.wait_all_tasks_blocked()
        assert len(c2.sent) == 3  # told when ip@1 expired
        now[0] = 300_000
        assert mgr.scan_expired() == 1 and mgr.group("cg") is None
        # bad bodies
        assert (await p(c1, req(RequestCode.HEART_BEAT, body=b"{nope"))).code == ResponseCode.SYSTEM_ERROR
        assert (await p(c1, req(RequestCode.HEART_BEAT, body=b'{"consumerDataSet":[]}'))).code == \
            ResponseCode.SYSTEM_ERROR
        bad_enum = json.dumps({"clientID": "x", "consumerDataSet": [{"groupName": "g", "messageModel": 9}]})
        assert (await p(c1, req(RequestCode.HEART_BEAT, body=bad_enum.encode()))).code == ResponseCode.SYSTEM_ERROR
        assert mgr.group("g") is None  # nothing half-registered
        nursery.cancel_scope.cancel()


async def test_scan_timer_expires_clients(autojump_clock):
    now = [0]
    mgr = ClientManager(clock_ms=lambda: now[0])
    c1, c2 = FakeConn("c1"), FakeConn("c2")
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: mgr.run(scan_interval=10, task_status=task_status))
        mgr.heartbeat(c1, heartbeat("a"), json.loads(heartbeat("a").body))
        mgr.heartbeat(c2, heartbeat("b"), json.loads(heartbeat("b").body))
        await trio.sleep(1)
        assert len(c1.sent) == 1
        now[0] = 100_000
        mgr.heartbeat(c2, heartbeat("b"), json.loads(heartbeat("b").body))
        now[0] = 130_000
        await trio.sleep(10)  # one scan
        assert mgr.consumer_ids("cg") == ["b"] and len(c2.sent) == 1
        nursery.cancel_scope.cancel()


async def test_register_plugs_every_code(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g, leader = await loaded(tmp_path, nursery, n=1)
        d = RequestDispatcher()
        mgr = ClientManager()
        offsets_processor(leader.bs).register(d)
        ClientProcessor(mgr, RetryTopics(LiveConfig(leader.cfg), leader.bs.metadata, leader.bs.gate)).register(d)
        assert set(ConsumerOffsetProcessor.CODES) | set(ClientProcessor.CODES) <= d.codes
        c = FakeConn("c")
        assert (await d(c, heartbeat("ip@9"))).code == ResponseCode.SUCCESS
        # on the writable leader the heartbeat's group and its %RETRY% topic exist now
        assert leader.bs.metadata.group_config("cg") is not None
        assert leader.bs.metadata.topic_config(retry_topic("cg")) is not None
        r = await d(c, req(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "cg"}))
        assert json.loads(r.body) == {"consumerIdList": ["ip@9"]}
        assert offset_of(await d(c, req(RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": 1}))) == 1
        nursery.cancel_scope.cancel()


async def test_notify_over_real_connections():
    """Heartbeats over TCP; the broker pushes NOTIFY_CONSUMER_IDS_CHANGED
    (oneway) to the other member, and again when that member disconnects."""
    from broker.remoting.client import open_remoting_client
    from broker.remoting.server import serve_remoting

    mgr = ClientManager()
    d = RequestDispatcher()
    ClientProcessor(mgr).register(d)
    got: dict[str, list] = {"a": [], "b": []}
    changed = trio.Event()

    def handler(name):
        async def on_request(conn, cmd):
            got[name].append((cmd.code, cmd.ext_fields.get("consumerGroup"), cmd.is_oneway))
            changed.set()
            return None
        return on_request

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(mgr.run)
            server = await nursery.start(lambda task_status: serve_remoting(
                d, "127.0.0.1", 0, on_close=mgr.on_connection_closed, task_status=task_status))
            async with open_remoting_client(handler=handler("a")) as a:
                assert (await a.invoke(server.address, heartbeat("ip@a"))).code == ResponseCode.SUCCESS
                async with open_remoting_client(handler=handler("b")) as b:
                    assert (await b.invoke(server.address, heartbeat("ip@b"))).code == ResponseCode.SUCCESS
                    await changed.wait()
                    assert got == {"a": [(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, "cg", True)], "b": []}
                    r = await a.invoke(server.address, req(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                                           {"consumerGroup": "cg"}))
                    assert sorted(json.loads(r.body)["consumerIdList"]) == ["ip@a", "ip@b"]
                    changed = trio.Event()
                # b's connection closed: a is told, b is gone
                await changed.wait()
                assert len(got["a"]) == 2 and mgr.consumer_ids("cg") == ["ip@a"]
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(("enabled", "sub", "etype", "code"), [
    (False, "TagA || TagB", "TAG", ResponseCode.SUCCESS),           # tags never need the filter
    (False, "a > 5", "SQL92", ResponseCode.SYSTEM_ERROR),           # Java: does not support ... SQL92
    (False, "a >> 5", "SQL92", ResponseCode.SYSTEM_ERROR),          # the switch is checked before parsing
    (True, "a > 5 AND color = 'red'", "SQL92", ResponseCode.SUCCESS),
    (True, "a >> 5", "SQL92", ResponseCode.SUBSCRIPTION_PARSE_FAILED),
    (True, "a > 5", "FANCY", ResponseCode.SUBSCRIPTION_PARSE_FAILED),  # no filter of that type
])
async def test_check_client_config(enabled, sub, etype, code):
    """CHECK_CLIENT_CONFIG (46), what a Java push consumer asks at start for
    each subscription (MQClientInstance.checkClientInBroker)."""
    p = ClientProcessor(ClientManager(), property_filter=lambda: enabled)
    body = {"clientId": "ip@1", "group": "cg",
            "subscriptionData": {"topic": TOPIC, "subString": sub, "expressionType": etype, "subVersion": 1}}
    r = await p(None, req(RequestCode.CHECK_CLIENT_CONFIG, {}, json.dumps(body).encode()))
    assert r.code == code, r.remark
    if code == ResponseCode.SYSTEM_ERROR:
        assert r.remark == f"The broker does not support consumer to filter message by {etype}"


async def test_check_client_config_without_a_subscription_and_with_bad_json():
    p = ClientProcessor(ClientManager(), property_filter=lambda: True)
    assert (await p(None, req(RequestCode.CHECK_CLIENT_CONFIG, {}, b'{"clientId": "ip@1"}'))).code \
        == ResponseCode.SUCCESS
    bad = await p(None, req(RequestCode.CHECK_CLIENT_CONFIG, {}, b"{not json"))
    assert bad.code == ResponseCode.SYSTEM_ERROR and "CheckClientRequestBody" in bad.remark


async def test_a_flood_of_joining_clients_stays_within_the_notify_budget(caplog):
    """NOTIFY_CONSUMER_IDS_CHANGED has a budget: while every send slot is
    busy (the clients do not read), at most notify_budget notifications
    wait, a (connection, group) already waiting is not queued twice, the
    rest are dropped, counted and logged once; heartbeats never wait.  Once
    the clients read again, what waited is delivered and new changes flow."""
    budget, in_flight, n = 4, 2, 30
    mgr = ClientManager(notify_budget=budget, notify_in_flight=in_flight)
    release = trio.Event()
    sending = [0, 0]  # now, most at once

    class StuckConn(FakeConn):
        async def send_request_oneway(self, cmd, timeout=None):
            sending[0] += 1
            sending[1] = max(sending)
            try:
                await release.wait()
                await super().send_request_oneway(cmd, timeout)
            finally:
                sending[0] -= 1

    conns = [StuckConn(f"c{i}") for i in range(n)]
    with trio.fail_after(10), caplog.at_level("WARNING", logger="ledgermq.clients"):
        async with trio.open_nursery() as nursery:
            await nursery.start(mgr.run)
            for i, c in enumerate(conns):  # each join notifies every earlier member
                mgr.heartbeat(c, heartbeat(f"ip@{i}"), json.loads(heartbeat(f"ip@{i}").body))
                await trio.testing.wait_all_tasks_blocked()
            assert sending == [in_flight, in_flight]
            # in flight, taken by the reader (waiting for a slot), waiting in the queue
            assert len(mgr._pending) <= budget + 1
            # n*(n-1)/2 joins were told about; everything past the budget was dropped
            assert mgr.notifications_dropped > 0
            assert [r.levelname for r in caplog.records].count("WARNING") == 1
            assert "dropped" in caplog.records[0].getMessage()
            assert sorted(mgr.consumer_ids("cg")) == sorted(f"ip@{i}" for i in range(n))
            release.set()
            await trio.testing.wait_all_tasks_blocked()
            assert sending[1] == in_flight and not mgr._pending
            delivered = mgr.notifications_sent
            assert 0 < delivered <= in_flight + 1 + budget
            # drained: the next change is told
            x, y = FakeConn("x"), FakeConn("y")
            for c in (x, y):
                hb = heartbeat(c.remote_address, group="other")
                mgr.heartbeat(c, hb, json.loads(hb.body))
            await trio.testing.wait_all_tasks_blocked()
            assert mgr.notifications_sent == delivered + 1 and len(x.sent) == 1
            nursery.cancel_scope.cancel()
