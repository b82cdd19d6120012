# Protocol robustness of a real 3-broker DLedger group (name server + three
# `mqbroker` processes on 127.0.0.1, tools/brokercluster.py):
#
#   * malformed frames (garbage and negative lengths, an oversized frame, a
#     header length past the frame, a truncated frame, bad JSON, a JSON header
#     with bad field types, a truncated ROCKETMQ header, an unknown serialize
#     type) each close only the connection that sent them, answered with a
#     SYSTEM_ERROR response carrying the request's opaque where it could be
#     read; a second client connection opened before keeps working and the
#     broker process stays up;
#   * every request code the broker serves is answered sensibly by the master
#     and by a slave: writes (send, topic/group admin, offset commits) succeed
#     on the master and get SERVICE_NOT_AVAILABLE on a slave (the send remark
#     names the leader), reads are served by both from committed data;
#   * the binary ROCKETMQ header for real requests (answered in kind), and a
#     oneway offset commit that takes effect without a response;
#   * every code in RequestCode, and every code a broker answers, gets a
#     response on a live connection even with an empty header; unknown codes
#     get REQUEST_CODE_NOT_SUPPORTED in either serialization.
# Slow: a real name server + 3-broker group per test.
import json
import random
import struct

import attrs
import pytest
import trio

from broker.common.msgid import parse_offset_msg_id
from broker.remoting.codes import RequestCode, ResponseCode, SerializeType
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RemotingError
from consumequeue import batch as batches
from consumequeue import record as M
from tests.broker.remoting.helpers import read_until_eof
from tools.brokercluster import LocalBrokerCluster, open_broker_cluster

pytestmark = pytest.mark.slow

TOPIC = "ProtoTopic"
DOOMED = "ProtoDoomed"
GROUP = "proto_cg"
PGROUP = "proto_pg"
CLIENT_ID = "127.0.0.1@proto"
QUEUES = 4
OK, SNA = ResponseCode.SUCCESS, ResponseCode.SERVICE_NOT_AVAILABLE
FLAG_SUBSCRIPTION = 0x4
FLAG_SUSPEND = 0x2
# The codes the broker serves today (send.py, pull.py, consumer.py, admin.py);
# a code another module adds later is covered by the empty-header sweep.
EXPECTED_CODES = {
    RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE,
    RequestCode.PULL_MESSAGE, RequestCode.QUERY_CONSUMER_OFFSET, RequestCode.UPDATE_CONSUMER_OFFSET,
    RequestCode.GET_MAX_OFFSET, RequestCode.GET_MIN_OFFSET, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
    RequestCode.GET_EARLIEST_MSG_STORETIME, RequestCode.HEART_BEAT, RequestCode.UNREGISTER_CLIENT,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP, RequestCode.UPDATE_AND_CREATE_TOPIC,
    RequestCode.DELETE_TOPIC_IN_BROKER, RequestCode.GET_ALL_TOPIC_CONFIG, RequestCode.VIEW_MESSAGE_BY_ID,
    RequestCode.QUERY_MESSAGE, RequestCode.GET_BROKER_RUNTIME_INFO, RequestCode.GET_TOPIC_STATS_INFO,
    RequestCode.GET_CONSUME_STATS, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    RequestCode.DELETE_SUBSCRIPTIONGROUP,
}


# --- requests ------------------------------------------------------------------------

def req(code, fields=None, body=b"", **kw) -> RemotingCommand:
    return RemotingCommand.create_request(code, fields, body=body, **kw)


def create_topic(topic: str, queues: int = QUEUES) -> RemotingCommand:
    return req(RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": queues, "writeQueueNums": queues,
        "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False})


def send_v1(seq: int, queue_id: int = 0) -> RemotingCommand:
    props = M.properties_to_string({"TAGS": "TagA", "KEYS": f"key{seq}", "WAIT": "true"})
    return req(RequestCode.SEND_MESSAGE, {
        "producerGroup": PGROUP, "topic": TOPIC, "defaultTopic": "TBW102", "defaultTopicQueueNums": QUEUES,
        "queueId": queue_id, "sysFlag": 0, "bornTimestamp": 1_700_000_000_000, "flag": 0,
        "properties": props, "reconsumeTimes": 0, "unitMode": False}, body=f"v1-{seq}".encode())


def v2_fields(topic: str, queue_id: int, props: str) -> dict:
    return {"a": PGROUP, "b": topic, "c": "TBW102", "d": QUEUES, "e": queue_id, "f": 0,
            "g": 1_700_000_000_000, "h": 0, "i": props, "j": 0, "k": False, "m": False}


def send_v2(seq: int, queue_id: int = 0, topic: str = TOPIC) -> RemotingCommand:
    props = M.properties_to_string({"TAGS": "TagB", "KEYS": f"key{seq}"})
    return req(RequestCode.SEND_MESSAGE_V2, v2_fields(topic, queue_id, props), body=f"v2-{seq}".encode())


def send_batch(seqs, queue_id: int = 0) -> RemotingCommand:
    items = [batches.BatchItem(f"batch-{s}".encode(), {"TAGS": "TagC", "KEYS": f"key{s}"}) for s in seqs]
    fields = {**v2_fields(TOPIC, queue_id, ""), "m": True}
    return req(RequestCode.SEND_BATCH_MESSAGE, fields, body=batches.encode_batch(items))


def pull(queue_id: int, offset: int, max_nums: int = 32, wait_ms: int = 0) -> RemotingCommand:
    """A pull; with wait_ms the broker holds it (long polling) until the
    queue has data: a send's reply means committed, not yet dispatched."""
    return req(RequestCode.PULL_MESSAGE, {
        "consumerGroup": GROUP, "topic": TOPIC, "queueId": queue_id, "queueOffset": offset,
        "maxMsgNums": max_nums, "sysFlag": FLAG_SUBSCRIPTION | (FLAG_SUSPEND if wait_ms else 0),
        "commitOffset": 0, "suspendTimeoutMillis": wait_ms,
        "subscription": "*", "subVersion": 0, "expressionType": "TAG"})


def offsets_req(code, **extra) -> RemotingCommand:
    return req(code, {"topic": TOPIC, "queueId": 0, **extra})


def heartbeat() -> RemotingCommand:
    data = {"clientID": CLIENT_ID, "producerDataSet": [{"groupName": PGROUP}],
            "consumerDataSet": [{"groupName": GROUP, "consumeType": "CONSUME_PASSIVELY",
                                 "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
                                 "subscriptionDataSet": [{"topic": TOPIC, "subString": "*", "tagsSet": [],
                                                          "codeSet": [], "subVersion": 1}], "unitMode": False}]}
    return req(RequestCode.HEART_BEAT, body=json.dumps(data).encode())


def records(body: bytes) -> list[M.MessageRecord]:
    out, pos = [], 0
    while pos < len(body):
        layout = M.parse_layout(body, pos)
        out.append(M.decode(body, pos))
        pos += layout.total_size
    return out


# --- the group -------------------------------------------------------------------------

@attrs.define
class Group:
    cluster: LocalBrokerCluster
    master: str
    slaves: list[str]

    async def call(self, node: str, cmd: RemotingCommand, timeout: float = 10) -> RemotingCommand:
        return await self.cluster.remoting.invoke(self.cluster.addr(node), cmd, timeout=timeout)

    async def ok(self, node: str, cmd: RemotingCommand) -> RemotingCommand:
        resp = await self.call(node, cmd)
        assert resp.code == OK, (node, RequestCode(cmd.code).name, resp.code, resp.remark)
        return resp


async def start_group(cluster: LocalBrokerCluster) -> Group:
    master = await cluster.wait_master()
    return Group(cluster, master, sorted(n for n in cluster.brokers if n != master))


async def wait_replicated(g: Group, queue_id: int, count: int) -> None:
    """Until every slave's consume queue holds `count` messages (committed
    and dispatched there)."""
    with trio.fail_after(30):
        for node in g.slaves:
            while True:
                resp = await g.call(node, offsets_req(RequestCode.GET_MAX_OFFSET, queueId=queue_id))
                if resp.code == OK and int(resp.ext_fields["offset"]) >= count:
                    break
                await trio.sleep(0.05)


# --- malformed frames ----------------------------------------------------------------------

def frame(stype: int, header: bytes, body: bytes = b"", length: int | None = None) -> bytes:
    total = 4 + len(header) + len(body) if length is None else length
    return struct.pack(">ii", total, (stype << 24) | len(header)) + header + body


def json_header(**fields) -> bytes:
    obj = {"code": int(RequestCode.GET_BROKER_RUNTIME_INFO), "flag": 0, "language": "JAVA", "opaque": 77,
           "serializeTypeCurrentRPC": "JSON", "version": 479, **fields}
    return json.dumps(obj).encode()


MALFORMED = {
    # name: (bytes to send, EOF after them, opaque of the expected SYSTEM_ERROR or None)
    "an HTTP request": (b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", False, None),
    "random bytes": (b"\xde\xad\xbe\xef" + random.Random(5).randbytes(60), False, None),
    "negative length": (struct.pack(">ii", -5, 10) + b"x" * 32, False, None),
    "length below the prefix": (struct.pack(">ii", 2, 0), False, None),
    "huge length, no header": (struct.pack(">ii", 0x7FFFFFF0, 0) + b"x" * 16, False, None),
    "oversized frame": (frame(0, json_header(opaque=4242), length=64 * 1024 * 1024), False, 4242),
    "header longer than the frame": (struct.pack(">ii", 20, 200) + b"{" * 24, False, None),
    "truncated frame": (frame(0, json_header())[:30], True, None),
    "bad JSON header": (frame(0, b'{"code": 28, "opaque": '), False, None),
    "JSON header with bad types": (frame(0, json_header(code="twenty-eight", opaque=91)), False, 91),
    "JSON header not an object": (frame(0, b"[1, 2, 3]"), False, None),
    "ROCKETMQ header too short": (frame(1, struct.pack(">hbhii", 28, 0, 479, 55, 0) + b"\x00\x00"), False, None),
    "ROCKETMQ remark past the header": (frame(1, struct.pack(">hbhiiii", 28, 0, 479, 55, 0, 100, 0)), False, 55),
    "unknown serialize type": (frame(7, json_header()), False, None),
}


async def assert_malformed_closes_only_its_connection(g: Group, node: str, name: str) -> None:
    data, eof, opaque = MALFORMED[name]
    other = await g.ok(node, req(RequestCode.GET_BROKER_RUNTIME_INFO))  # dials the shared connection
    conn_before = g.cluster.remoting.cached(g.cluster.addr(node))
    host, port = g.cluster.addr(node).rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    try:
        try:
            await stream.send_all(data)
            if eof:
                await stream.send_eof()
        except trio.BrokenResourceError:
            pass  # the broker already closed on the first bytes
        got = await read_until_eof(stream, timeout=10)
    finally:
        await stream.aclose()
    if opaque is None:
        assert all(c.code == ResponseCode.SYSTEM_ERROR for c in got), (name, got)
    else:
        assert [(c.code, c.opaque, c.is_response) for c in got] == [(ResponseCode.SYSTEM_ERROR, opaque, True)], name
        assert "malformed frame" in got[0].remark
    # The other connection is the same one and still serves; the process lives.
    assert g.cluster.remoting.cached(g.cluster.addr(node)) is conn_before, name
    again = await g.ok(node, req(RequestCode.GET_BROKER_RUNTIME_INFO))
    assert json.loads(again.body)["table"]["brokerName"] == json.loads(other.body)["table"]["brokerName"]
    assert g.cluster.brokers[node].alive, name


async def test_malformed_frames_close_only_their_connection(tmp_path):
    async with open_broker_cluster(tmp_path) as cluster:
        g = await start_group(cluster)
        for node in (g.master, g.slaves[0]):
            for name in MALFORMED:
                await assert_malformed_closes_only_its_connection(g, node, name)
        # After all that the group still takes writes and replicates them.
        await g.ok(g.master, create_topic(TOPIC))
        await g.ok(g.master, send_v2(0))
        await wait_replicated(g, 0, 1)
        assert all(p.alive for p in cluster.brokers.values())


# --- every request code -----------------------------------------------------------------------

async def test_every_code_on_master_and_slave(tmp_path):
    async with open_broker_cluster(tmp_path) as cluster:
        g = await start_group(cluster)
        ids = {cluster.node_of(addr): bid for bid, addr in (await cluster.broker_ids()).items()}
        leader_self_id = g.master  # dLegerSelfId == node name in the harness
        await g.ok(g.master, create_topic(TOPIC))
        await g.ok(g.master, create_topic(DOOMED, 1))

        # --- sends: on the master they succeed, with contiguous queue offsets.
        r1 = await g.ok(g.master, send_v1(0))
        r2 = await g.ok(g.master, send_v2(1))
        r3 = await g.ok(g.master, send_batch([2, 3, 4]))
        assert [r.ext_fields["queueOffset"] for r in (r1, r2, r3)] == ["0", "1", "2"]
        assert len(r3.ext_fields["msgId"].split(",")) == 3
        assert all(r.ext_fields["queueId"] == "0" for r in (r1, r2, r3))
        _, phy = parse_offset_msg_id(r2.ext_fields["msgId"])
        # The ROCKETMQ (binary) header works for real requests too, answered in kind.
        rb = await g.ok(g.master, attrs.evolve(send_v2(5, queue_id=3), serialize_type=SerializeType.ROCKETMQ))
        assert rb.serialize_type == SerializeType.ROCKETMQ and rb.ext_fields["queueOffset"] == "0"
        pb = await g.ok(g.master, attrs.evolve(pull(3, 0, wait_ms=15000), serialize_type=SerializeType.ROCKETMQ))
        assert pb.serialize_type == SerializeType.ROCKETMQ and [r.body for r in records(pb.body)] == [b"v2-5"]
        # A oneway offset commit gets no response but takes effect.
        await cluster.remoting.invoke_oneway(cluster.addr(g.master), offsets_req(
            RequestCode.UPDATE_CONSUMER_OFFSET, consumerGroup=GROUP, commitOffset=1, queueId=3))
        with trio.fail_after(30):
            query = offsets_req(RequestCode.QUERY_CONSUMER_OFFSET, consumerGroup=GROUP, queueId=3)
            while (await g.call(g.master, query)).ext_fields.get("offset") != "1":
                await trio.sleep(0.05)
        await wait_replicated(g, 0, 5)
        # Consumer offsets a slave must serve (committed through the log by the master).
        await g.ok(g.master, offsets_req(RequestCode.UPDATE_CONSUMER_OFFSET, consumerGroup=GROUP, commitOffset=3,
                                         queueId=1))
        with trio.fail_after(30):  # offsets are staged, then replicated through the log
            for node in g.slaves:
                query = offsets_req(RequestCode.QUERY_CONSUMER_OFFSET, consumerGroup=GROUP, queueId=1)
                while (await g.call(node, query)).ext_fields.get("offset") != "3":
                    await trio.sleep(0.05)

        for node in [g.master, *g.slaves]:
            is_master = node == g.master
            write = OK if is_master else SNA

            async def expect(cmd, code, node=node):
                resp = await g.call(node, cmd)
                assert resp.code == code, (node, RequestCode(cmd.code).name, resp.code, resp.remark)
                return resp

            # Writes.
            for cmd in (send_v1(10), send_v2(11), send_batch([12, 13])):
                resp = await expect(cmd, write)
                if not is_master:
                    assert leader_self_id in resp.remark, resp.remark  # names the leader
            await expect(create_topic(f"ProtoNew{node}"), write)
            await expect(req(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                             body=json.dumps({"groupName": f"g_{node}", "consumeEnable": True}).encode()), write)
            await expect(req(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": f"g_{node}"}), write)
            await expect(offsets_req(RequestCode.UPDATE_CONSUMER_OFFSET, consumerGroup=GROUP, commitOffset=2), write)
            if not is_master:
                await expect(req(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": DOOMED}), SNA)

            # Reads, from committed data on every node.
            found = await expect(pull(0, 0), OK)
            got = records(found.body)
            assert [r.body for r in got[:5]] == [b"v1-0", b"v2-1", b"batch-2", b"batch-3", b"batch-4"]
            assert [r.queue_offset for r in got[:5]] == [0, 1, 2, 3, 4]
            # Where to pull next (broker/processors/pull.py's rule): always an id the route holds.
            assert int(found.ext_fields["suggestWhichBrokerId"]) in ids.values()
            empty = await expect(pull(2, 0), ResponseCode.PULL_NOT_FOUND)
            assert empty.ext_fields["nextBeginOffset"] == "0"
            assert int((await expect(offsets_req(RequestCode.GET_MAX_OFFSET), OK)).ext_fields["offset"]) >= 5
            assert (await expect(offsets_req(RequestCode.GET_MIN_OFFSET), OK)).ext_fields["offset"] == "0"
            resp = await expect(offsets_req(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, timestamp=0), OK)
            assert resp.ext_fields["offset"] == "0"
            resp = await expect(offsets_req(RequestCode.GET_EARLIEST_MSG_STORETIME), OK)
            assert int(resp.ext_fields["timestamp"]) > 1_700_000_000_000
            resp = await expect(offsets_req(RequestCode.QUERY_CONSUMER_OFFSET, consumerGroup=GROUP, queueId=1), OK)
            assert resp.ext_fields["offset"] == "3"
            viewed = await expect(req(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": phy}), OK)
            assert records(viewed.body)[0].body == b"v2-1"
            await expect(req(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": 1 << 40}), ResponseCode.SYSTEM_ERROR)
            queried = await expect(req(RequestCode.QUERY_MESSAGE, {"topic": TOPIC, "key": "key3", "maxNum": 32,
                                                                   "beginTimestamp": 0,
                                                                   "endTimestamp": 1 << 62}), OK)
            assert [r.body for r in records(queried.body)] == [b"batch-3"]
            await expect(req(RequestCode.QUERY_MESSAGE, {"topic": TOPIC, "key": "nokey", "maxNum": 32,
                                                         "beginTimestamp": 0, "endTimestamp": 1 << 62}),
                         ResponseCode.QUERY_NOT_FOUND)
            topics = json.loads((await expect(req(RequestCode.GET_ALL_TOPIC_CONFIG), OK)).body)
            assert topics["topicConfigTable"][TOPIC]["writeQueueNums"] == QUEUES
            info = json.loads((await expect(req(RequestCode.GET_BROKER_RUNTIME_INFO), OK)).body)["table"]
            assert info["brokerRole"] == ("ASYNC_MASTER" if is_master else "SLAVE")
            assert info["brokerId"] == str(ids[node])
            stats = await expect(req(RequestCode.GET_TOPIC_STATS_INFO, {"topic": TOPIC}), OK)
            assert b'"maxOffset"' in stats.body
            await expect(req(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "NoSuchTopic"}), ResponseCode.TOPIC_NOT_EXIST)
            consume = await expect(req(RequestCode.GET_CONSUME_STATS, {"consumerGroup": GROUP, "topic": TOPIC}), OK)
            assert b'"brokerOffset"' in consume.body

            # Clients: heartbeat, list, unregister (served by every node).
            await expect(heartbeat(), OK)
            listed = await expect(req(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": GROUP}), OK)
            assert json.loads(listed.body)["consumerIdList"] == [CLIENT_ID]
            await expect(req(RequestCode.UNREGISTER_CLIENT, {"clientID": CLIENT_ID, "consumerGroup": GROUP,
                                                             "producerGroup": PGROUP}), OK)
            await expect(req(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": GROUP}),
                         ResponseCode.SYSTEM_ERROR)

            # Unknown codes, in both serializations.
            for stype in SerializeType:
                for code in (9999, 32000):
                    resp = await expect(req(code, serialize_type=stype), ResponseCode.REQUEST_CODE_NOT_SUPPORTED)
                    assert resp.serialize_type == stype

        # The master's writes took effect and reached the slaves.
        await g.ok(g.master, req(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": DOOMED}))
        with trio.fail_after(30):
            for node in g.slaves:
                while True:
                    topics = json.loads((await g.ok(node, req(RequestCode.GET_ALL_TOPIC_CONFIG))).body)
                    table = topics["topicConfigTable"]
                    if DOOMED not in table and f"ProtoNew{g.master}" in table:
                        break
                    await trio.sleep(0.05)
        assert all(f"ProtoNew{s}" not in table for s in g.slaves)


async def test_every_code_gets_an_answer_with_an_empty_header(tmp_path):
    async with open_broker_cluster(tmp_path) as cluster:
        g = await start_group(cluster)
        for node in [g.master, *g.slaves]:
            conn = await cluster.remoting.connection(cluster.addr(node))
            answered = set()
            for code in sorted({int(c) for c in RequestCode} | {0, 1, 500, 9999}):
                try:
                    resp = await g.call(node, req(code))
                except RemotingError as e:  # pragma: no cover - the failure being tested for
                    pytest.fail(f"{node}: code {code} got no answer: {e}")
                assert resp.is_response
                if resp.code != ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                    answered.add(code)
                    # An empty header is refused with a reason, never accepted as a write.
                    assert resp.code != OK or code not in {
                        RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE,
                        RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.UPDATE_CONSUMER_OFFSET}, (node, code)
                    assert resp.code == OK or resp.remark, (node, code, resp.code)
            assert EXPECTED_CODES <= answered, (node, EXPECTED_CODES - answered)
            # One connection carried all of it: nothing was closed on us.
            assert cluster.remoting.cached(cluster.addr(node)) is conn
            assert cluster.brokers[node].alive
