# PULL_MESSAGE (broker/processors/pull.py) against a real 3-node in-memory group (the
# rig of test_broker_roles, MockClock): messages go in through the send
# processor, pulls come out as RemotingCommands.  Checked: FOUND with a tag
# filter (body = the stored records, unchanged), NO_NEW_MSG, OFFSET_MOVED
# (and its slave form on followers), the header fields clients rely on
# (client-compat #11), COMMIT_OFFSET on the leader only, long polling woken
# by a commit, the timeout answer, and that an uncommitted append is never
# visible.  Pulls from connections are parked (issue 27): answered by
# arrival or deadline through the connection, the suspension capped by
# longPollingSuspendMaxMillis, parked pulls counted in their own budgets
# per connection, per address and in all (past them SYSTEM_BUSY at once),
# and a closed connection's parked pulls dropped with their watchers.
import attrs
import pytest
import trio
import trio.testing

from broker.common.subscription import (
    FLAG_COMMIT_OFFSET,
    FLAG_SUBSCRIPTION,
    FLAG_SUSPEND,
    SubscriptionError,
    parse_subscription,
)
from broker.config import LiveConfig
from broker.processors.client_manager import ClientManager
from broker.processors.clients import ClientProcessor
from broker.processors.pull import Hold, PullProcessor
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.server import RequestDispatcher
from commitlog.watermark import Watermark
from consumequeue import record as M
from native.hashing import java_hash_str
from tests.broker.processors.test_send import BORN, processor, v2
from tests.broker.store.test_gate import Group
from tests.helpers.waiting import wait_until

TOPIC = "TopicP"


def pull_processor(m, clients: ClientManager | None = None, **kw) -> PullProcessor:
    """As broker.server wires it: the member's config, its store and a client registry."""
    bs = m.bs
    return PullProcessor(config=LiveConfig(m.cfg), gate=bs.gate, metadata=bs.metadata, replica=bs.replica, cq=bs.cq,
                         queues=bs.cq.engine, dispatcher=bs.cq.dispatcher, clients=clients or ClientManager(), **kw)


@attrs.define(eq=False)
class FakeConn:
    """A client connection as the registry keeps it (remoting.ClientConnection)."""

    remote_address: str = "client"
    attributes: dict = attrs.Factory(dict)
    closed: bool = False

    async def send_request_oneway(self, cmd, timeout=None):
        pass


def pull_req(offset=0, *, topic=TOPIC, queue_id=1, sub="*", flag=FLAG_SUBSCRIPTION, suspend_ms=15000,
             commit=0, max_nums=32, group="cg", **extra) -> RemotingCommand:
    # mixed value types (client-compat #1)
    fields = {"consumerGroup": group, "topic": topic, "queueId": queue_id, "queueOffset": str(offset),
              "maxMsgNums": max_nums, "sysFlag": flag, "commitOffset": commit, "suspendTimeoutMillis": suspend_ms,
              "subscription": sub, "subVersion": 0, "expressionType": "TAG", **extra}
    return RemotingCommand.create_request(RequestCode.PULL_MESSAGE, fields, opaque=7)


async def send(m, body: bytes, tag: str | None = None, *, queue_id=1, **kw):
    props = M.properties_to_string({"TAGS": tag}) if tag else ""
    resp = await processor(m, **kw).process(v2(TOPIC, body, queue_id=queue_id, props=props), BORN)
    return resp


def records(body: bytes) -> list[M.MessageRecord]:
    out, pos = [], 0
    while pos < len(body):
        size = int.from_bytes(body[pos:pos + 4], "big")
        out.append(M.decode(body[pos:pos + size], check_crc=True))
        pos += size
    assert pos == len(body)
    return out


def hdr(resp) -> dict[str, int]:
    return {k: int(resp.ext_fields[k]) for k in ("nextBeginOffset", "minOffset", "maxOffset", "suggestWhichBrokerId")}


async def loaded_group(tmp_path, nursery, tags=("TagA", "TagB", "TagA", "TagC"), **extra):
    g = Group(tmp_path, nursery, **extra)
    await g.start()
    leader = await g.wait_leader()
    for i, t in enumerate(tags):
        assert (await send(leader, f"m{i}".encode(), t)).code == ResponseCode.SUCCESS
    await g.settle()
    return g, leader


def test_parse_subscription():
    assert parse_subscription("*").is_all and parse_subscription(None).is_all and parse_subscription(" ").is_all
    s = parse_subscription(" TagA ||TagB|| ")
    assert s.tags == {"TagA", "TagB"} and s.codes == {java_hash_str("TagA"), java_hash_str("TagB")}
    assert parse_subscription("||").codes == frozenset()  # Java: nothing matches
    assert parse_subscription("a > 1", expression_type="SQL92").is_sql
    try:
        parse_subscription("a > 1", expression_type="CLASS")
    except SubscriptionError as e:
        assert e.code == ResponseCode.NO_PERMISSION
    else:
        raise AssertionError("CLASS accepted")


async def test_found_with_tag_filter_on_leader_and_follower(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g, leader = await loaded_group(tmp_path, nursery)
        p = pull_processor(leader)
        resp = await p.process(pull_req(0, sub="TagA || TagC"))
        assert resp.code == ResponseCode.SUCCESS and resp.remark == "FOUND"
        assert (resp.opaque, resp.is_response) == (7, True)
        recs = records(resp.body)
        assert [(r.body, r.tags, r.queue_offset) for r in recs] == [(b"m0", "TagA", 0), (b"m2", "TagA", 2),
                                                                     (b"m3", "TagC", 3)]
        assert hdr(resp) == {"nextBeginOffset": 4, "minOffset": 0, "maxOffset": 4, "suggestWhichBrokerId": 0}
        # the body is the stored bytes, unchanged
        src = leader.bs.cq.engine.source
        assert resp.body == b"".join(src.read(r.physical_offset, len(r.encode())) for r in recs)

        everything = await p.process(pull_req(1, max_nums=2))
        assert [r.body for r in records(everything.body)] == [b"m1", b"m2"]
        assert hdr(everything)["nextBeginOffset"] == 3

        none = await p.process(pull_req(0, sub="TagZ"))
        assert (none.code, none.remark, none.body) == (ResponseCode.PULL_RETRY_IMMEDIATELY, "NO_MATCHED_MESSAGE", b"")
        assert hdr(none)["nextBeginOffset"] == 4

        follower = next(m for m in g.alive() if m is not leader)
        fr = await pull_processor(follower).process(pull_req(0, sub="TagA || TagC"))
        assert fr.code == ResponseCode.SUCCESS and fr.body == resp.body
        # a consumer that is not far behind is sent back to the master (id 0)
        assert hdr(fr)["suggestWhichBrokerId"] == 0
        nursery.cancel_scope.cancel()


async def test_no_new_msg_offset_moved_and_checks(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g, leader = await loaded_group(tmp_path, nursery)
        p = pull_processor(leader)

        at_end = await p.process(pull_req(4))
        assert (at_end.code, at_end.remark) == (ResponseCode.PULL_NOT_FOUND, "OFFSET_OVERFLOW_ONE")
        assert hdr(at_end) == {"nextBeginOffset": 4, "minOffset": 0, "maxOffset": 4, "suggestWhichBrokerId": 0}
        empty = await p.process(pull_req(0, queue_id=3))  # no consume queue yet
        assert (empty.code, empty.remark) == (ResponseCode.PULL_NOT_FOUND, "NO_MATCHED_LOGIC_QUEUE")

        beyond = await p.process(pull_req(10))
        assert (beyond.code, beyond.remark) == (ResponseCode.PULL_OFFSET_MOVED, "OFFSET_OVERFLOW_BADLY")
        assert hdr(beyond)["nextBeginOffset"] == 0  # the queue still starts at 0
        moved = await p.process(pull_req(5, queue_id=3))
        assert (moved.code, hdr(moved)["nextBeginOffset"]) == (ResponseCode.PULL_OFFSET_MOVED, 0)

        # nor does a master whose dispatch lags its commit: the consumer may
        # have read further on a faster slave (issue 14: moved to 0, redelivered)
        real = leader.bs.cq.dispatcher.dispatched
        leader.bs.cq.dispatcher.dispatched = Watermark(leader.bs.replica.committed.value - 1)
        lag = await p.process(pull_req(10, suspend_ms=0))
        assert (lag.code, hdr(lag)["nextBeginOffset"]) == (ResponseCode.PULL_RETRY_IMMEDIATELY, 10)
        leader.bs.cq.dispatcher.dispatched = real
        # nor a master that has not heard from a quorum within an election
        # timeout (continued after SIGSTOP while a newer master took writes)
        heard = dict(leader.bs.replica._peer_heard)
        leader.bs.replica._peer_heard.clear()
        stale = await p.process(pull_req(10, suspend_ms=0))
        assert (stale.code, hdr(stale)["nextBeginOffset"]) == (ResponseCode.PULL_RETRY_IMMEDIATELY, 10)
        leader.bs.replica._peer_heard.update(heard)
        assert (await p.process(pull_req(10, suspend_ms=0))).code == ResponseCode.PULL_OFFSET_MOVED

        # a follower does not correct offsets (a slave without offsetCheckInSlave)
        follower = next(m for m in g.alive() if m is not leader)
        fr = await pull_processor(follower).process(pull_req(10))
        assert (fr.code, hdr(fr)["nextBeginOffset"]) == (ResponseCode.PULL_RETRY_IMMEDIATELY, 10)
        # ... but with SUSPEND it holds a pull beyond its queue first: the entries
        # may be committed and on their way into the queue (a lagging dispatch)
        held = pull_processor(follower)._begin(pull_req(10, flag=FLAG_SUBSCRIPTION | FLAG_SUSPEND, suspend_ms=5000))
        assert type(held) is Hold and held.header.queue_offset == 10

        assert (await p.process(pull_req(0, topic="Nope"))).code == ResponseCode.TOPIC_NOT_EXIST
        assert (await p.process(pull_req(0, queue_id=9))).code == ResponseCode.SYSTEM_ERROR
        sql = await p.process(pull_req(0, expressionType="SQL92", sub="a > 1"))
        assert sql.code == ResponseCode.SYSTEM_ERROR and "does not support" in sql.remark  # Java's answer
        bad_sql = await p.process(pull_req(0, expressionType="SQL92", sub="a >> 1"))
        assert bad_sql.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED  # parsed first, as in Java
        missing = RemotingCommand.create_request(RequestCode.PULL_MESSAGE, {"topic": TOPIC})
        bad = await p.process(missing)
        assert bad.code == ResponseCode.SYSTEM_ERROR and "<consumerGroup>" in bad.remark
        nursery.cancel_scope.cancel()


async def test_subscription_from_heartbeat_when_flag_missing(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g, leader = await loaded_group(tmp_path, nursery)
        mgr = ClientManager()
        p = pull_processor(leader, mgr)
        r = await p.process(pull_req(0, flag=0, group="hb"))
        assert r.code == ResponseCode.SUBSCRIPTION_NOT_EXIST
        hb = RemotingCommand.create_request(RequestCode.HEART_BEAT, body=(
            b'{"clientID":"c1","consumerDataSet":[{"groupName":"hb","consumeType":1,"messageModel":1,'
            b'"consumeFromWhere":0,"subscriptionDataSet":[{"topic":"TopicP","subString":"TagB","tagsSet":["TagB"],'
            b'"codeSet":[' + str(java_hash_str("TagB")).encode() + b'],"subVersion":5,"expressionType":"TAG"}]}],'
            b'"producerDataSet":[]}'))
        mgr.heartbeat(FakeConn(), hb, __import__("json").loads(hb.body))
        r = await p.process(pull_req(0, flag=0, group="hb"))
        assert r.code == ResponseCode.SUCCESS and [x.body for x in records(r.body)] == [b"m1"]
        r = await p.process(pull_req(0, flag=0, group="hb", subVersion=6))
        assert r.code == ResponseCode.SUBSCRIPTION_NOT_LATEST
        nursery.cancel_scope.cancel()


async def test_commit_offset_flag_leader_only(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g, leader = await loaded_group(tmp_path, nursery)
        follower = next(m for m in g.alive() if m is not leader)
        fr = await pull_processor(follower).process(
            pull_req(0, flag=FLAG_SUBSCRIPTION | FLAG_COMMIT_OFFSET, commit=3))
        assert fr.code == ResponseCode.SUCCESS
        r = await pull_processor(leader).process(
            pull_req(0, flag=FLAG_SUBSCRIPTION | FLAG_COMMIT_OFFSET, commit=2))
        assert r.code == ResponseCode.SUCCESS
        assert leader.bs.metadata.query_offset(TOPIC, "cg", 1) == 2  # staged at once
        neg = await pull_processor(leader).process(
            pull_req(0, flag=FLAG_SUBSCRIPTION | FLAG_COMMIT_OFFSET, commit=-1))
        assert neg.code == ResponseCode.SUCCESS
        await trio.sleep(1)  # the coalescing window
        await g.settle()
        for m in g.alive():  # replicated; the follower's commit of 3 never happened
            assert m.bs.metadata.query_offset(TOPIC, "cg", 1, include_staged=False) == 2
        nursery.cancel_scope.cancel()


async def test_long_poll_woken_by_a_commit(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g, leader = await loaded_group(tmp_path, nursery)
        p = pull_processor(leader)
        got = []

        async def poll():
            t0 = trio.current_time()
            got.append(await p.process(pull_req(4, flag=FLAG_SUBSCRIPTION | FLAG_SUSPEND, sub="TagA")))
            got.append(trio.current_time() - t0)

        nursery.start_soon(poll)
        await trio.sleep(2)
        assert not got and p.held == 1
        # a message on another queue moves dispatch but does not answer it
        assert (await send(leader, b"other", "TagA", queue_id=2)).code == ResponseCode.SUCCESS
        await trio.sleep(2)
        assert not got and p.held == 1
        assert (await send(leader, b"new", "TagA")).code == ResponseCode.SUCCESS
        with trio.fail_after(5):
            while not got:
                await trio.sleep(0.01)
        while len(got) < 2:
            await trio.sleep(0)
        resp, elapsed = got
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert [r.body for r in records(resp.body)] == [b"new"]
        assert hdr(resp)["nextBeginOffset"] == 5 and hdr(resp)["maxOffset"] == 5
        assert 4 - 1e-6 <= elapsed < 6 and p.held == 0  # (float sums of the mock clock: 3.9999999999999996)
        nursery.cancel_scope.cancel()


async def test_long_poll_timeout_and_short_polling(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g, leader = await loaded_group(tmp_path, nursery)
        p = pull_processor(leader)
        t0 = trio.current_time()
        resp = await p.process(pull_req(4, flag=FLAG_SUBSCRIPTION | FLAG_SUSPEND, suspend_ms=5000))
        assert trio.current_time() - t0 == pytest.approx(5.0)
        assert (resp.code, resp.remark) == (ResponseCode.PULL_NOT_FOUND, "OFFSET_OVERFLOW_ONE")
        assert hdr(resp)["nextBeginOffset"] == 4
        # long polling off: held shortPollingTimeMills (1 s)
        t0 = trio.current_time()
        resp = await pull_processor(leader, long_polling_enable=False).process(
            pull_req(4, flag=FLAG_SUBSCRIPTION | FLAG_SUSPEND))
        assert trio.current_time() - t0 == pytest.approx(1.0) and resp.code == ResponseCode.PULL_NOT_FOUND
        # without SUSPEND: answered at once
        t0 = trio.current_time()
        resp = await p.process(pull_req(4))
        assert trio.current_time() == t0 and resp.code == ResponseCode.PULL_NOT_FOUND
        # a queue that does not exist yet is held too, and woken by its first message
        got = []
        nursery.start_soon(lambda: _append(got, p.process(
            pull_req(0, queue_id=3, flag=FLAG_SUBSCRIPTION | FLAG_SUSPEND))))
        await trio.sleep(1)
        assert not got
        assert (await send(leader, b"q3", queue_id=3)).code == ResponseCode.SUCCESS
        with trio.fail_after(5):
            while not got:
                await trio.sleep(0.01)
        assert got[0].code == ResponseCode.SUCCESS and [r.body for r in records(got[0].body)] == [b"q3"]
        nursery.cancel_scope.cancel()


async def _append(out, coro):
    out.append(await coro)


async def test_uncommitted_append_is_never_pulled(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g, leader = await loaded_group(tmp_path, nursery, maxWaitAckTimeMs="100")
        p = pull_processor(leader)
        for m in g.alive():
            if m is not leader:
                g.net.isolate(m.nid)
        got = []
        nursery.start_soon(lambda: _append(got, p.process(
            pull_req(4, flag=FLAG_SUBSCRIPTION | FLAG_SUSPEND, suspend_ms=3000))))
        await trio.sleep(0.5)
        resp = await send(leader, b"lonely", "TagA")
        assert resp.code == ResponseCode.FLUSH_SLAVE_TIMEOUT, resp.remark
        assert M.decode(leader.bs.store.get(leader.bs.store.end_index).body).body == b"lonely"
        assert leader.bs.replica.committed.value < leader.bs.store.end_index
        with trio.fail_after(10):
            while not got:
                await trio.sleep(0.01)
        assert got[0].code == ResponseCode.PULL_NOT_FOUND and got[0].body == b""
        assert hdr(got[0])["maxOffset"] == 4
        again = await p.process(pull_req(0))
        assert [r.body for r in records(again.body)] == [b"m0", b"m1", b"m2", b"m3"]
        nursery.cancel_scope.cancel()


async def test_pull_and_heartbeat_share_one_client_registry(tmp_path, autojump_clock):
    """As broker.server wires it: one ClientManager given to both the client
    processor and pull; pull finds the subscriptions heartbeats registered."""
    import json

    async with trio.open_nursery() as nursery:
        g, leader = await loaded_group(tmp_path, nursery, tags=("TagA", "TagB"))
        d = RequestDispatcher()
        mgr = ClientManager()
        pull_processor(leader, mgr).register(d)
        ClientProcessor(mgr).register(d)
        assert RequestCode.PULL_MESSAGE in d.codes and RequestCode.HEART_BEAT in d.codes
        resp = await d(FakeConn(), pull_req(0))
        assert resp.code == ResponseCode.SUCCESS and [r.body for r in records(resp.body)] == [b"m0", b"m1"]
        hb = {"clientID": "c1", "consumerDataSet": [{"groupName": "cg", "consumeType": "CONSUME_PASSIVELY",
              "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
              "subscriptionDataSet": [{"topic": TOPIC, "subString": "TagB", "subVersion": 1}]}]}
        r = await d(FakeConn(), RemotingCommand.create_request(RequestCode.HEART_BEAT, body=json.dumps(hb).encode()))
        assert r.code == ResponseCode.SUCCESS
        resp = await d(FakeConn(), pull_req(0, flag=0))
        assert resp.code == ResponseCode.SUCCESS and [r.body for r in records(resp.body)] == [b"m1"]
        nursery.cancel_scope.cancel()


async def test_long_poll_over_tcp_does_not_block_other_requests(tmp_path):
    """Real sockets and clock: a held pull on one connection, while the same
    connection still gets answers; then a send wakes it."""
    from broker.remoting.client import open_remoting_client
    from broker.remoting.server import serve_remoting

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            g, leader = await loaded_group(tmp_path, nursery, tags=("TagA",))
            d = RequestDispatcher()
            p = pull_processor(leader)
            p.register(d)
            await nursery.start(p.run)  # parked, answered through the connection
            server = await nursery.start(lambda task_status: serve_remoting(d, "127.0.0.1", 0,
                                                                             task_status=task_status))
            async with open_remoting_client() as client:
                got = []

                async def held():
                    got.append(await client.invoke(server.address, pull_req(
                        1, flag=FLAG_SUBSCRIPTION | FLAG_SUSPEND, suspend_ms=20000), timeout=25))

                nursery.start_soon(held)
                await wait_until(lambda: p.holds.table.total == 1, 10, "the pull held by the processor")
                quick = await client.invoke(server.address, pull_req(0), timeout=5)
                assert quick.code == ResponseCode.SUCCESS and not got
                assert p.holds.table.total == 1 and p.held_in_tasks == 0
                assert (await send(leader, b"late", "TagA")).code == ResponseCode.SUCCESS
                await wait_until(lambda: got, 10, "the held pull's answer")
                assert got[0].code == ResponseCode.SUCCESS
                assert [r.body for r in records(got[0].body)] == [b"late"]
                assert got[0].ext_fields["suggestWhichBrokerId"] == "0"
            nursery.cancel_scope.cancel()


async def test_sql92_filter_at_pull_time(tmp_path, autojump_clock):
    """enablePropertyFilter=true: records whose properties match come back,
    the others are skipped (nextBeginOffset passes them); a bad expression
    is SUBSCRIPTION_PARSE_FAILED; tag pulls are unchanged."""
    async with trio.open_nursery() as nursery:
        g, leader = await loaded_group(tmp_path, nursery, tags=())
        for i, (a, color) in enumerate([("7", "red"), ("3", "red"), ("9", "blue"), (None, "red")]):
            props = {"TAGS": "T", "color": color, **({"a": a} if a is not None else {})}
            resp = await processor(leader).process(v2(TOPIC, f"m{i}".encode(), queue_id=1,
                                                      props=M.properties_to_string(props)), BORN)
            assert resp.code == ResponseCode.SUCCESS
        await g.settle()
        p = pull_processor(leader)
        p.config = LiveConfig(attrs.evolve(leader.cfg, enable_property_filter=True))
        sql = "a > 5 AND color = 'red'"
        found = await p.process(pull_req(0, expressionType="SQL92", sub=sql))
        assert found.code == ResponseCode.SUCCESS
        assert [r.body for r in records(found.body)] == [b"m0"]
        assert hdr(found)["nextBeginOffset"] == 4
        later = await p.process(pull_req(1, expressionType="SQL92", sub=sql))
        assert (later.code, later.remark) == (ResponseCode.PULL_RETRY_IMMEDIATELY, "NO_MATCHED_MESSAGE")
        assert hdr(later)["nextBeginOffset"] == 4
        missing = await p.process(pull_req(0, expressionType="SQL92", sub="a IS NULL OR color = 'blue'"))
        assert [r.body for r in records(missing.body)] == [b"m2", b"m3"]
        bad = await p.process(pull_req(0, expressionType="SQL92", sub="a >> 5"))
        assert bad.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "a >> 5" in bad.remark
        tags = await p.process(pull_req(0, sub="T"))
        assert len(records(tags.body)) == 4

        # from the heartbeat's subscription (no SUBSCRIPTION flag)
        mgr = ClientManager()
        p.clients = mgr
        hb = {"clientID": "c1", "consumerDataSet": [{"groupName": "cg", "subscriptionDataSet": [
            {"topic": TOPIC, "subString": "color = 'blue'", "expressionType": "SQL92", "subVersion": 1}]}]}
        mgr.heartbeat(FakeConn(), RemotingCommand.create_request(RequestCode.HEART_BEAT), hb)
        by_hb = await p.process(pull_req(0, flag=0))
        assert [r.body for r in records(by_hb.body)] == [b"m2"]
        nursery.cancel_scope.cancel()


@attrs.define(eq=False)
class AnsweringConn(FakeConn):
    """A connection as the hold service answers through it."""

    answers: list = attrs.Factory(list)
    answered: trio.Event = attrs.Factory(trio.Event)

    def send_response_soon(self, request, response) -> bool:
        if self.closed:
            return False
        self.answers.append((request.opaque, response))
        self.answered.set()
        self.answered = trio.Event()
        return True

    async def wait_answers(self, n: int) -> list:
        with trio.fail_after(60):
            while len(self.answers) < n:
                await self.answered.wait()
        return self.answers


def suspended(offset, queue_id=1, suspend_ms=5000, opaque=7, **kw):
    req = pull_req(offset, queue_id=queue_id, flag=FLAG_SUBSCRIPTION | FLAG_SUSPEND, suspend_ms=suspend_ms, **kw)
    return attrs.evolve(req, opaque=opaque)


async def test_parked_pulls_are_answered_by_arrival_or_deadline(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g, leader = await loaded_group(tmp_path, nursery)
        p = pull_processor(leader)
        await nursery.start(p.run)
        conn = AnsweringConn("10.0.0.1:5000")
        late = []
        t0 = trio.current_time()
        # Parked: the handler returns at once, with nothing to send yet.
        assert await p(conn, suspended(4, opaque=1), late.append) is None
        assert await p(conn, suspended(0, queue_id=2, opaque=2, suspend_ms=3000), late.append) is None
        assert trio.current_time() == t0 and p.held == 2 and len(p.holds._watches) == 2
        assert (await send(leader, b"new", "TagA")).code == ResponseCode.SUCCESS
        [(opaque, resp)] = await conn.wait_answers(1)
        assert opaque == 1 and resp.code == ResponseCode.SUCCESS and [r.body for r in records(resp.body)] == [b"new"]
        assert late == [resp] and p.holds.table.woken == 1
        # The other one at its deadline, with a fresh (empty) read.
        answers = await conn.wait_answers(2)
        assert answers[1][0] == 2 and answers[1][1].code == ResponseCode.PULL_NOT_FOUND
        assert trio.current_time() - t0 == pytest.approx(3.0) and p.holds.table.expired == 1
        assert p.held == 0 and not p.holds._watches
        nursery.cancel_scope.cancel()


async def test_suspension_is_capped_by_the_broker(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g, leader = await loaded_group(tmp_path, nursery)
        p = pull_processor(leader)
        p.config = LiveConfig(attrs.evolve(leader.cfg, long_polling_suspend_max_ms=2000))
        await nursery.start(p.run)
        conn = AnsweringConn("10.0.0.1:5000")
        t0 = trio.current_time()
        for i, ms in enumerate((120000, 24 * 3600 * 1000, 1500)):
            assert await p(conn, suspended(4, opaque=i, suspend_ms=ms)) is None
        answers = await conn.wait_answers(3)
        assert [a[0] for a in answers] == [2, 0, 1]  # 1.5 s, then both capped at 2 s
        assert trio.current_time() - t0 == pytest.approx(2.0)
        # process() (held in the caller's task) is capped too.
        resp = await p.process(suspended(4, suspend_ms=120000))
        assert resp.code == ResponseCode.PULL_NOT_FOUND and trio.current_time() - t0 == pytest.approx(4.0)
        assert LiveConfig(leader.cfg).current.long_polling_suspend_max_ms == 30000  # the default
        nursery.cancel_scope.cancel()


async def test_held_pulls_have_budgets_of_their_own(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g, leader = await loaded_group(tmp_path, nursery)
        p = pull_processor(leader)
        p.config = LiveConfig(attrs.evolve(leader.cfg, long_polling_max_held_per_connection=2,
                                           long_polling_max_held_per_address=3, long_polling_max_held=4))
        await nursery.start(p.run)
        a1, a2 = AnsweringConn("10.0.0.1:1"), AnsweringConn("10.0.0.1:2")
        b, c = AnsweringConn("10.0.0.2:1"), AnsweringConn("[::1]:7")

        async def pull(conn, opaque):
            return await p(conn, suspended(4, opaque=opaque, suspend_ms=10000))

        assert await pull(a1, 1) is None and await pull(a1, 2) is None
        busy = await pull(a1, 3)
        assert busy.code == ResponseCode.SYSTEM_BUSY and busy.remark.startswith("[OVERLOAD]")
        assert "longPollingMaxHeldPerConnection" in busy.remark
        assert await pull(a2, 4) is None
        assert "longPollingMaxHeldPerAddress" in (await pull(a2, 5)).remark
        assert await pull(b, 6) is None
        assert "longPollingMaxHeld)" in (await pull(c, 7)).remark
        assert p.held == 4 and p.holds.table.refused == {"connection": 1, "address": 1, "broker": 1}
        # A closed connection's parked pulls go at once, making room.
        a1.closed = True
        p.forget(a1)
        assert p.held == 2 and await pull(c, 8) is None
        assert (await send(leader, b"wake", "TagA")).code == ResponseCode.SUCCESS
        await c.wait_answers(1)
        assert a1.answers == [] and [o for o, _ in a2.answers + b.answers + c.answers] == [4, 6, 8]
        assert p.held == 0 and not p.holds._watches and p.holds.table.by_address == {}
        nursery.cancel_scope.cancel()


async def test_a_parked_pull_keeps_nothing_its_client_chose_to_make_big(tmp_path, autojump_clock):
    # The budgets count pulls: each must stay small whatever its frame held.
    async with trio.open_nursery() as nursery:
        g, leader = await loaded_group(tmp_path, nursery)
        p = pull_processor(leader)
        await nursery.start(p.run)
        conn = AnsweringConn("10.0.0.1:1")
        padded = attrs.evolve(suspended(4, opaque=1), body=b"b" * (1 << 20))
        padded = attrs.evolve(padded, ext_fields={**padded.ext_fields, "junk": "j" * (1 << 20)})
        assert await p(conn, padded) is None
        [parked] = p.holds.table.by_seq.values()
        assert parked.request.body == b"" and parked.request.ext_fields == {}
        big = await p(conn, suspended(4, opaque=2, group="g" * 20000))
        assert big.code == ResponseCode.SYSTEM_BUSY and "not held" in big.remark
        assert (await send(leader, b"wake", "TagA")).code == ResponseCode.SUCCESS
        [(opaque, resp)] = await conn.wait_answers(1)
        assert opaque == 1 and resp.code == ResponseCode.SUCCESS  # answered as the request asked
        nursery.cancel_scope.cancel()


async def test_a_closed_connection_costs_no_task_to_cancel(tmp_path, autojump_clock):
    # Ten thousand held pulls were ten thousand tasks; a client closing them
    # made one scheduler round cancel them all (0.8 s in the flood of issue
    # 27, an election).  Parked, they are table entries: forget() drops them.
    async with trio.open_nursery() as nursery:
        g, leader = await loaded_group(tmp_path, nursery)
        p = pull_processor(leader)
        p.config = LiveConfig(attrs.evolve(leader.cfg, long_polling_max_held_per_connection=5000,
                                           long_polling_max_held_per_address=5000))
        await nursery.start(p.run)
        conn = AnsweringConn("10.0.0.1:1")
        for i in range(3000):
            queue_id = i % 4
            assert await p(conn, suspended(4 if queue_id == 1 else 0, queue_id=queue_id, opaque=i)) is None
        assert p.held == 3000
        # One watcher per queue and one timer, whatever the number of pulls.
        assert len(p.holds._watches) == 4 and len(p.holds._nursery.child_tasks) == 5
        conn.closed = True
        p.forget(conn)
        await trio.testing.wait_all_tasks_blocked()
        assert p.held == 0 and not p.holds._watches and conn.answers == []
        nursery.cancel_scope.cancel()


class Shelf:
    """Just what PullHoldService asks its processor for: queue max offsets
    (with their arrivals), a fresh read, the config.  No store."""

    def __init__(self) -> None:
        from types import SimpleNamespace

        from consumequeue.arrivals import QueueArrivals
        self.top: dict[tuple[str, int], int] = {}
        self.arrivals = QueueArrivals(self.max_offset)
        self.dispatcher = SimpleNamespace(arrivals=self.arrivals)
        self.config = SimpleNamespace(current=SimpleNamespace(
            long_polling_max_held_per_connection=100, long_polling_max_held_per_address=100,
            long_polling_max_held=100))

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self.top.get((topic, queue_id), -1)

    def finish(self, request, hold):
        return request.make_response(ResponseCode.SUCCESS, f"read at {self.max_offset(TOPIC, 0)}")

    def grow(self, top: int) -> None:
        self.top[TOPIC, 0] = top
        self.arrivals.check()


def held_at(offset: int, timeout: float = 60.0):
    from broker.processors.pull import Hold, PullHeader
    header = PullHeader("cg", TOPIC, 0, offset, 32, FLAG_SUBSCRIPTION | FLAG_SUSPEND, 0, 60000, "*", 0, None, None)
    return Hold(header, parse_subscription("*"), timeout)


async def test_hold_service_wakes_by_offset_rearms_for_a_lower_one_and_rereads_on_reset(autojump_clock):
    from broker.processors.pull import PullHoldService
    shelf = Shelf()
    holds = PullHoldService(shelf)
    conn = AnsweringConn("10.0.0.1:1")
    async with trio.open_nursery() as nursery:
        await nursery.start(holds.run)
        shelf.grow(10)
        assert holds.park(conn, suspended(10, opaque=1), held_at(10), None) is None
        await trio.testing.wait_all_tasks_blocked()
        assert holds._watches[TOPIC, 0].low == 10
        # A pull for an earlier offset (a queue rebased lower meanwhile): the
        # watcher must wait for that one, not the later one.
        shelf.top[TOPIC, 0] = 5
        assert holds.park(conn, suspended(5, opaque=2), held_at(5), None) is None
        await trio.testing.wait_all_tasks_blocked()
        assert holds._watches[TOPIC, 0].low == 5
        shelf.grow(7)  # past 5, not past 10
        [(opaque, resp)] = await conn.wait_answers(1)
        assert opaque == 2 and resp.remark == "read at 7" and holds.table.total == 1
        # A reset (queues rebuilt) wakes the rest to re-read, whatever their offset.
        shelf.arrivals.reset()
        answers = await conn.wait_answers(2)
        assert answers[1][0] == 1 and holds.table.total == 0 and not holds._watches
        assert holds.table.woken == 2 and holds.table.expired == 0
        nursery.cancel_scope.cancel()
