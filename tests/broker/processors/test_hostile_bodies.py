# Hostile bodies and expressions reach the processors as ordinary requests:
# each decoder's refusal (broker/remoting/header.py decode_json, the SQL92
# filter, properties, batch bodies) must come back as the answer Java gives
# -- SYSTEM_ERROR, SUBSCRIPTION_PARSE_FAILED, MESSAGE_ILLEGAL -- and nothing
# half-done stays behind.  Never RecursionError, never another exception.
import json

import attrs
import trio

from broker.common.sqlfilter import MAX_SQL_DEPTH, MAX_SQL_LENGTH
from broker.common.subscription import MAX_TAG_EXPRESSION_LENGTH
from broker.config import LiveConfig
from broker.processors.client_manager import ClientManager
from broker.processors.clients import ClientProcessor
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.header import MAX_JSON_BODY, MAX_JSON_DEPTH
from consumequeue import batch as batches
from consumequeue import record as M
from native.sendpath import MAX_BATCH_MESSAGES
from tests.broker.processors.test_pull import TOPIC, loaded_group, pull_processor, pull_req, records
from tests.broker.processors.test_send import BORN, processor, v2
from tests.broker.store.test_gate import Group


class FakeConn:
    remote_address = "c1"

    def __init__(self):
        self.attributes = {}
        self.closed = False

    async def send_request_oneway(self, cmd, timeout=None):
        pass


def hb(body: bytes) -> RemotingCommand:
    return RemotingCommand.create_request(RequestCode.HEART_BEAT, body=body, opaque=3)


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


async def test_heartbeat_bodies_too_deep_or_too_big_are_system_errors():
    mgr = ClientManager()
    p = ClientProcessor(mgr)
    conn = FakeConn()
    ok = {"clientID": "c@1", "consumerDataSet": [{"groupName": "cg", "subscriptionDataSet": []}],
          "producerDataSet": [], "x": json.loads(deep(MAX_JSON_DEPTH - 1))}
    assert (await p(conn, hb(json.dumps(ok).encode()))).code == ResponseCode.SUCCESS
    for depth in (MAX_JSON_DEPTH, 1000, 100_000):
        body = ('{"clientID":"c@2","consumerDataSet":[{"groupName":"cg2","x":' + deep(depth) + '}]}').encode()
        r = await p(conn, hb(body))
        assert r.code == ResponseCode.SYSTEM_ERROR and "deeper than" in r.remark, (depth, r)
    big = json.dumps({"clientID": "c@3", "consumerDataSet": [], "pad": "x" * MAX_JSON_BODY}).encode()
    r = await p(conn, hb(big))
    assert r.code == ResponseCode.SYSTEM_ERROR and "exceeds the maximum" in r.remark
    assert mgr.group("cg2") is None


async def test_check_client_config_refuses_expressions_past_the_limits():
    p = ClientProcessor(ClientManager(), property_filter=lambda: True)

    async def check(sub: str) -> RemotingCommand:
        body = json.dumps({"clientId": "c", "group": "cg", "subscriptionData": {
            "topic": TOPIC, "subString": sub, "expressionType": "SQL92"}}).encode()
        return await p(FakeConn(), RemotingCommand.create_request(RequestCode.CHECK_CLIENT_CONFIG, body=body))

    assert (await check("a = 1")).code == ResponseCode.SUCCESS
    for sub in ("(" * 10_000 + "a=1" + ")" * 10_000, " AND ".join(["a=1"] * 100_000), "NOT " * 100 + "a=1",
                "a = " + "9" * 5000):
        r = await check(sub)
        assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED, r
        assert len(r.remark) < 1000  # the expression is not echoed whole


async def test_pulls_with_hostile_expressions_answer_parse_failed(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g, leader = await loaded_group(tmp_path, nursery, tags=())
        props = M.properties_to_string({"TAGS": "T", "a": "1"})
        assert (await processor(leader).process(v2(TOPIC, b"m0", queue_id=1, props=props), BORN)).code == \
            ResponseCode.SUCCESS
        await g.settle()
        p = pull_processor(leader)
        p.config = LiveConfig(attrs.evolve(leader.cfg, enable_property_filter=True))
        for sub in ("(" * 10_000 + "a=1" + ")" * 10_000, " AND ".join(["a=1"] * 100_000),
                    "(" * (MAX_SQL_DEPTH + 1) + "a=1" + ")" * (MAX_SQL_DEPTH + 1), "x" * (MAX_SQL_LENGTH + 1)):
            r = await p.process(pull_req(0, expressionType="SQL92", sub=sub))
            assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED, r
        tags = await p.process(pull_req(0, sub="T||" * (MAX_TAG_EXPRESSION_LENGTH // 3 + 1)))
        assert tags.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
        # The longest chains within the limits are evaluated flat: no recursion per term.
        chain = " AND ".join(["a=1"] * ((MAX_SQL_LENGTH - 3) // 8 + 1))
        nested = "(" * (MAX_SQL_DEPTH - 1) + "NOT a=2" + ")" * (MAX_SQL_DEPTH - 1)  # NOT is a level too
        for sub in (chain, " OR ".join(["a=2"] * 2000 + ["a=1"]), nested):
            found = await p.process(pull_req(0, expressionType="SQL92", sub=sub))
            assert found.code == ResponseCode.SUCCESS and [r.body for r in records(found.body)] == [b"m0"], sub[:40]
        nursery.cancel_scope.cancel()


async def test_sends_with_properties_or_batches_past_the_limits_are_illegal(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery)
        await g.start()
        leader = await g.wait_leader()
        sp = processor(leader)
        long_props = M.properties_to_string({"TAGS": "T", "big": "v" * M.MAX_PROPERTIES_LEN})
        r = await sp.process(v2(TOPIC, props=long_props), BORN)
        assert r.code == ResponseCode.MESSAGE_ILLEGAL, r
        many = batches.encode_batch([batches.BatchItem(b"", {"a": "1"})] * (MAX_BATCH_MESSAGES + 1))
        r = await sp.process(v2(TOPIC, many, code=RequestCode.SEND_BATCH_MESSAGE, props=""), BORN)
        assert r.code == ResponseCode.MESSAGE_ILLEGAL and str(MAX_BATCH_MESSAGES) in r.remark, r
        ok = batches.encode_batch([batches.BatchItem(b"b", {"a": "1"})] * 3)
        r = await sp.process(v2(TOPIC, ok, code=RequestCode.SEND_BATCH_MESSAGE, props=""), BORN)
        assert r.code == ResponseCode.SUCCESS, r
        nursery.cancel_scope.cancel()
