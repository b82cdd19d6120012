# Owns the structure-aware hostile inputs the fuzzers send: remoting frames
# (JSON and ROCKETMQ headers) whose fields change type, length and nesting;
# the bodies behind them (HeartbeatData, lock bodies, SEND_BATCH bodies,
# properties, SQL92 and tag expressions); peer frames (HELLO, AUTH, Raft
# messages with any field values, misaddressed ones); and the issue's
# crafted inputs as seeds.  Everything comes from one random.Random, so
# (seed, index) reproduces an input.  Nothing here does I/O.
#
# Rules of the generators:
#   - mostly well-formed around one or two hostile fields, so the inputs
#     get past the first check and reach the decoders behind it;
#   - sizes stay modest (a frame under 64 KiB) except for the seeds, which
#     sit at and just past every stated limit;
#   - harmful() names what a live group must not be sent because, without
#     ACL, any client may do it by design (delete a topic, change the
#     membership, re-register the group's own broker name...): the live
#     fuzzer decodes each input first and skips those.
import functools
import json
import random
import struct

from broker.remoting.codec import MAX_EXT_FIELDS, MAX_HEADER_SIZE, MAX_VALUE_DEPTH, encode_binary_header
from broker.remoting.codes import LanguageCode, RequestCode, SerializeType
from broker.remoting.command import RemotingCommand
from commitlog.entry import EntryBatch
from commitlog.raft import wire
from commitlog.raft.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    PushRequest,
    PushResponse,
    PushType,
    ResponseCode,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from commitlog.transport.framing import FrameKind, Hello, encode_frame, frame_header
from consumequeue import batch as batches

INTERESTING = (0, 1, 0x7F, 0x80, 0xFF)
INTERESTING32 = (0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 2 ** 31 - 8, 16 * 1024 * 1024 + 1)
FUZZ_TOPIC = "FuzzTopic"  # what the inputs send to and pull from; the live fuzzer's own checks use another

# Codes whose effect is by design without ACL and would change the group
# under test (its topics, configuration, membership, registration).
HARMFUL_CODES = frozenset(int(c) for c in (
    RequestCode.UPDATE_BROKER_CONFIG, RequestCode.TRIGGER_DELETE_FILES, RequestCode.DELETE_KV_CONFIG,
    RequestCode.UNREGISTER_BROKER, RequestCode.WIPE_WRITE_PERM_OF_BROKER, RequestCode.DELETE_SUBSCRIPTIONGROUP,
    RequestCode.DELETE_TOPIC_IN_BROKER, RequestCode.DELETE_TOPIC_IN_NAMESRV, RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
    RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE, RequestCode.CLONE_GROUP_OFFSET,
    RequestCode.CLEAN_UNUSED_TOPIC, RequestCode.UPDATE_NAMESRV_CONFIG, RequestCode.LEDGERMQ_TRANSFER_LEADERSHIP,
    RequestCode.LEDGERMQ_CHANGE_MEMBERSHIP))


def harmful(cmd, protected_names: frozenset[str]) -> bool:
    """Would this decoded command change the group under test by design?
    (A registration under one of its names, or a code above.)"""
    code = getattr(cmd, "code", None)
    if code in HARMFUL_CODES:
        return True
    if code == RequestCode.REGISTER_BROKER:
        fields = cmd.ext_fields
        return any(fields.get(k) in protected_names for k in ("brokerName", "clusterName", "brokerAddr"))
    if code == RequestCode.UPDATE_AND_CREATE_TOPIC or code == RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP:
        return any(v in protected_names for v in cmd.ext_fields.values())
    return False


# --- byte mutations (what the structure does not reach) ----------------------------------------

def mutate(rng: random.Random, data: bytes, corpus: list[bytes]) -> bytes:
    """Bit flips, boundary bytes and 32-bit values, deleted, inserted,
    duplicated and zeroed ranges, truncation, splices with `corpus`."""
    b = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 3, 8))):
        op = rng.randrange(9)
        if op == 0 and b:                           # flip a bit
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and b:                         # boundary byte
            b[rng.randrange(len(b))] = rng.choice(INTERESTING)
        elif op == 2 and len(b) >= 4:               # boundary 32-bit value (lengths live here)
            i = rng.randrange(len(b) - 3)
            struct.pack_into(">I", b, i, rng.choice(INTERESTING32))
        elif op == 3 and b:                         # delete a range
            i = rng.randrange(len(b))
            del b[i:i + rng.randrange(1, 16)]
        elif op == 4:                               # insert random bytes
            i = rng.randrange(len(b) + 1)
            b[i:i] = rng.randbytes(rng.randrange(1, 16))
        elif op == 5 and b:                         # duplicate a range
            i = rng.randrange(len(b))
            b[i:i] = b[i:i + rng.randrange(1, 32)]
        elif op == 6 and b:                         # truncate
            del b[rng.randrange(len(b)):]
        elif op == 7 and corpus:                    # splice another input
            other = rng.choice(corpus)
            b = b[:rng.randrange(len(b) + 1)] + other[rng.randrange(len(other) + 1):]
        elif op == 8 and b:                         # zero a range
            i = rng.randrange(len(b))
            n = rng.randrange(1, 32)
            b[i:i + n] = bytes(len(b[i:i + n]))
    return bytes(b)


# --- JSON as text (so it can nest past what json.dumps writes) ---------------------------------

def nested(depth: int, inner: str = "", kind: str = "[") -> str:
    if kind == "[":
        return "[" * depth + inner + "]" * depth
    return '{"a":' * depth + (inner or "1") + "}" * depth


def json_text(rng: random.Random, depth: int = 0) -> str:
    """A JSON value as text: any type, sometimes deep, long, or not quite JSON."""
    r = rng.random()
    if r < 0.04:
        d = rng.choice((MAX_VALUE_DEPTH, MAX_VALUE_DEPTH + 1, 33, 500, 950, 1000, 1025, 3000))
        return nested(d, rng.choice(("", "1", "NaN", '"x"')), rng.choice("[{"))
    if r < 0.3:
        return json.dumps(rng.choice(("", "x", "TopicA", "\u0001\u0002", "\ud800", "é" * 3, "0", "-1", "true")))
    if r < 0.45:
        return str(rng.choice((0, 1, -1, 2 ** 31, -2 ** 31 - 1, 2 ** 63, 10 ** 30, rng.randrange(-999, 999))))
    if r < 0.5:
        return rng.choice(("true", "false", "null", "1.5", "1e309", "-0.0", "NaN", "Infinity", "9" * 5000))
    if r < 0.55:
        return json.dumps("x" * rng.choice((1000, 40_000)))
    if depth < 4 and r < 0.8:
        items = [json_text(rng, depth + 1) for _ in range(rng.randrange(4))]
        if rng.random() < 0.5:
            return "[" + ",".join(items) + "]"
        return "{" + ",".join(f'"k{i}":{v}' for i, v in enumerate(items)) + "}"
    return json.dumps(rng.choice(("plain", "a b", "TagA||TagB", "*")))


# --- remoting requests -------------------------------------------------------------------------

def _props(rng: random.Random) -> str:
    out = {"TAGS": rng.choice(("TagA", "", "*", "a||b")), "KEYS": "k1 k2"}
    r = rng.random()
    if r < 0.1:
        out["DELAY"] = rng.choice(("1", "0", "-3", "99", "x"))
    elif r < 0.2:
        out["UNIQ_KEY"] = rng.choice(("", "AC11", "X" * 100))
    elif r < 0.25:
        out["big"] = "v" * rng.choice((1000, 32_760, 40_000))
    elif r < 0.3:
        out.update({f"p{i}": "v" for i in range(rng.choice((100, 3000)))})
    text = "".join(f"{k}\x01{v}\x02" for k, v in out.items())
    if rng.random() < 0.1:
        text = text.replace("\x02", "", 1) + "\x01\x01\x02\x02"
    return text


def sql_expression(rng: random.Random) -> str:
    """A SQL92 filter expression: mostly valid, with nesting, length and token damage."""
    r = rng.random()
    if r < 0.05:
        return "(" * rng.choice((31, 32, 33, 200)) + "a=1" + ")" * rng.choice((31, 32, 33, 200))
    if r < 0.1:
        return " AND ".join(["a=1"] * rng.choice((10, 1000, 2047, 2100)))
    if r < 0.13:
        return "NOT " * rng.choice((5, 33, 100)) + "a > 1"
    terms = []
    for _ in range(rng.randrange(1, 6)):
        terms.append(rng.choice((
            "a > 5", "color = 'red'", "a BETWEEN 1 AND 9", "b IN ('x', 'y')", "c IS NULL", "d IS NOT NULL",
            "TAGS = 'TagA'", "e CONTAINS 'z'", "f = TRUE", "g <> 1.5e3", "h = -" + "9" * rng.choice((3, 5000)),
            "(a = 1 OR b = 2)", "NOT (a = 1)", "'x' IN ('x')", "a >", "a = NULL", "a # 1")))
    text = rng.choice((" AND ", " OR ", " and ")).join(terms)
    if rng.random() < 0.2 and text:
        i = rng.randrange(len(text))
        text = text[:i] + rng.choice(("(", ")", "'", "''", " NOT ", "\x00", "é")) + text[i:]
    return text


def heartbeat_body(rng: random.Random) -> bytes:
    subs = []
    for i in range(rng.randrange(4)):
        sql = rng.random() < 0.5
        subs.append('{"topic":"%s","subString":%s,"expressionType":"%s","subVersion":%d,"tagsSet":[],"codeSet":[]}' % (
            FUZZ_TOPIC, json.dumps(sql_expression(rng) if sql else rng.choice(("*", "TagA||TagB", "x" * 20_000))),
            "SQL92" if sql else "TAG", i))
    body = ('{"clientID":"fuzz@%d","consumerDataSet":[{"groupName":"fuzz_cg","consumeType":"CONSUME_PASSIVELY",'
            '"messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","subscriptionDataSet":[%s]}],'
            '"producerDataSet":[{"groupName":"fuzz_pg"}],"extra":%s}') % (
        rng.randrange(100), ",".join(subs), json_text(rng))
    return body.encode("utf-8", "surrogatepass")


def lock_body(rng: random.Random) -> bytes:
    mqs = ",".join('{"topic":"%s","brokerName":"fuzz-b","queueId":%s}' % (FUZZ_TOPIC, json_text(rng))
                   for _ in range(rng.randrange(4)))
    return ('{"consumerGroup":"fuzz_cg","clientId":"fuzz@1","mqSet":[%s]}' % mqs).encode("utf-8", "surrogatepass")


def batch_body(rng: random.Random) -> bytes:
    n = rng.choice((1, 2, 5, 20))
    items = [batches.BatchItem(rng.randbytes(rng.randrange(40)), {"TAGS": "t", **(
        {"UNIQ_KEY": ""} if rng.random() < 0.1 else {})}, rng.randrange(-5, 5)) for _ in range(n)]
    body = bytearray(batches.encode_batch(items))
    if body and rng.random() < 0.4:  # a length that lies
        at = rng.choice((0, 16, len(body) - 2 if len(body) > 2 else 0))
        struct.pack_into(">i", body, min(at, len(body) - 4), rng.choice((0, -1, 21, 22, 2 ** 31 - 1, len(body) + 1)))
    return bytes(body)


def _send_fields(rng: random.Random, batch: bool) -> dict[str, str]:
    return {"a": "fuzz_pg", "b": FUZZ_TOPIC, "c": "TBW102", "d": "4", "e": str(rng.randrange(-1, 5)),
            "f": str(rng.choice((0, 0, 4, 8, 0x80))), "g": "1700000000000", "h": "0", "i": _props(rng), "j": "0",
            "k": "false", "m": "true" if batch else "false", "n": "fuzz-b"}


def request_parts(rng: random.Random, namesrv: bool = False) -> tuple[int, dict[str, str], bytes]:
    """(code, extFields as text, body) of a plausible request."""
    if namesrv:
        choice = rng.choice(("route", "cluster", "register", "topics", "kv", "random"))
    else:
        choice = rng.choice(("send", "send", "batch", "pull", "pull", "heartbeat", "lock", "check", "offset",
                             "view", "back", "create", "route", "random"))
    if choice == "send":
        return RequestCode.SEND_MESSAGE_V2, _send_fields(rng, False), rng.randbytes(rng.randrange(200))
    if choice == "batch":
        return RequestCode.SEND_BATCH_MESSAGE, _send_fields(rng, True), batch_body(rng)
    if choice == "pull":
        sql = rng.random() < 0.5
        return RequestCode.PULL_MESSAGE, {
            "consumerGroup": "fuzz_cg", "topic": FUZZ_TOPIC, "queueId": str(rng.randrange(-1, 5)),
            "queueOffset": str(rng.choice((0, -1, 10 ** 12))), "maxMsgNums": str(rng.choice((1, 32, 100000))),
            "sysFlag": str(rng.choice((0, 4, 5, 8))), "commitOffset": "0", "suspendTimeoutMillis": "0",
            "subscription": sql_expression(rng) if sql else rng.choice(("*", "TagA||TagB", "||", "x" * 20_000)),
            "subVersion": "0", "expressionType": "SQL92" if sql else "TAG"}, b""
    if choice == "heartbeat":
        return RequestCode.HEART_BEAT, {}, heartbeat_body(rng)
    if choice == "lock":
        return rng.choice((RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ)), {}, lock_body(rng)
    if choice == "check":
        body = '{"clientId":"fuzz@1","group":"fuzz_cg","subscriptionData":{"topic":"%s","subString":%s,' \
               '"expressionType":"SQL92"}}' % (FUZZ_TOPIC, json.dumps(sql_expression(rng)))
        return RequestCode.CHECK_CLIENT_CONFIG, {}, body.encode("utf-8", "surrogatepass")
    if choice == "offset":
        return rng.choice((RequestCode.QUERY_CONSUMER_OFFSET, RequestCode.UPDATE_CONSUMER_OFFSET,
                           RequestCode.GET_MAX_OFFSET, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP)), {
            "consumerGroup": "fuzz_cg", "topic": FUZZ_TOPIC, "queueId": str(rng.randrange(-1, 5)),
            "commitOffset": str(rng.choice((0, -5, 2 ** 62))), "timestamp": "0"}, b""
    if choice == "view":
        offset = rng.choice((0, -1, 2 ** 62, rng.randrange(10 ** 6)))
        return RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(offset)}, b""
    if choice == "back":
        return RequestCode.CONSUMER_SEND_MSG_BACK, {
            "offset": str(rng.randrange(10 ** 6)), "group": "fuzz_cg", "delayLevel": str(rng.randrange(-2, 20)),
            "originMsgId": "00", "originTopic": FUZZ_TOPIC, "maxReconsumeTimes": "1"}, b""
    if choice == "create":
        return RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": f"Fuzz{rng.randrange(5)}", "defaultTopic": "TBW102", "readQueueNums": str(rng.randrange(-1, 9)),
            "writeQueueNums": str(rng.randrange(-1, 9)), "perm": str(rng.randrange(8)),
            "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"}, b""
    if choice == "route":
        return RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": rng.choice((FUZZ_TOPIC, "TBW102", "x" * 300))}, b""
    if choice == "cluster":
        return RequestCode.GET_BROKER_CLUSTER_INFO, {}, b""
    if choice == "register":
        body = ('{"topicConfigSerializeWrapper":{"topicConfigTable":{"%s":%s},"dataVersion":%s},'
                '"filterServerList":[]}' % (FUZZ_TOPIC, json_text(rng), json_text(rng)))
        body = body.encode("utf-8", "surrogatepass")
        return RequestCode.REGISTER_BROKER, {
            "brokerName": f"fuzz-b{rng.randrange(3)}", "brokerAddr": f"127.0.0.1:{rng.randrange(1, 9)}",
            "clusterName": "FuzzCluster", "haServerAddr": "127.0.0.1:1", "brokerId": str(rng.randrange(3)),
            "compressed": "false"}, body
    if choice == "topics":
        return RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, {}, b""
    if choice == "kv":
        return rng.choice((RequestCode.GET_KV_CONFIG, RequestCode.PUT_KV_CONFIG)), {
            "namespace": "FUZZ", "key": "k", "value": "v" * rng.randrange(50)}, b""
    return rng.randrange(-5, 10000), {f"k{i}": "v" for i in range(rng.randrange(5))}, rng.randbytes(rng.randrange(50))


def _header_json(rng: random.Random, code: int, fields: dict[str, str], opaque: int) -> bytes:
    """The header as a stock client writes it, with one or two fields made hostile."""
    ext = {k: json.dumps(v) for k, v in fields.items()}
    r = rng.random()
    if r < 0.35 and ext:  # a value of another type, or deep, or long
        for k in rng.sample(sorted(ext), min(len(ext), rng.choice((1, 1, 2)))):
            ext[k] = json_text(rng)
    elif r < 0.4:
        ext.update({f"x{i}": '"v"' for i in range(rng.choice((MAX_EXT_FIELDS - len(ext), MAX_EXT_FIELDS + 1)))})
    elif r < 0.45:
        ext[rng.choice(("k" * 40_000, "", "\u0000", "é"))] = json_text(rng)
    head = {"code": str(code), "flag": "0", "language": '"JAVA"', "opaque": str(opaque),
            "serializeTypeCurrentRPC": '"JSON"', "version": "479"}
    r = rng.random()
    if r < 0.15:  # a header field of another type
        head[rng.choice(sorted(head))] = json_text(rng)
    elif r < 0.2:
        head["remark"] = json_text(rng)
    elif r < 0.23:
        head["unknown"] = json_text(rng)
    elif r < 0.25:
        del head[rng.choice(sorted(head))]
    parts = [f'"{k}":{v}' for k, v in head.items()]
    if rng.random() > 0.03:
        parts.append('"extFields":{' + ",".join(f"{json.dumps(k)}:{v}" for k, v in ext.items()) + "}")
    else:
        parts.append('"extFields":' + json_text(rng))
    rng.shuffle(parts)
    return ("{" + ",".join(parts) + "}").encode("utf-8", "surrogatepass")


def _header_binary(rng: random.Random, code: int, fields: dict[str, str], opaque: int) -> bytes:
    cmd = RemotingCommand.trusted(code if -2 ** 15 <= code < 2 ** 15 else 0, LanguageCode.CPP, 479, opaque, 0,
                                  None, fields, b"", SerializeType.ROCKETMQ)
    try:
        raw = bytearray(encode_binary_header(cmd))
    except Exception:  # a surrogate in a value: not encodable; a plain one instead
        raw = bytearray(encode_binary_header(RemotingCommand(0, serialize_type=SerializeType.ROCKETMQ)))
    if rng.random() < 0.3 and len(raw) >= 17:  # remark or extFields length that lies
        struct.pack_into(">i", raw, rng.choice((13, len(raw) - 4 if len(raw) > 21 else 13)),
                         rng.choice((-1, 0, 1, 2 ** 31 - 1, len(raw))))
    return bytes(raw)


def remoting_frame(rng: random.Random, opaque: int, namesrv: bool = False) -> bytes:
    """One request frame, structure-aware: a plausible request with one or
    two hostile fields, sometimes a ROCKETMQ header, sometimes a prefix that lies."""
    code, fields, body = request_parts(rng, namesrv)
    binary = rng.random() < 0.15
    header = (_header_binary if binary else _header_json)(rng, int(code), fields, opaque)
    stype = 1 if binary else 0
    length, header_len = 4 + len(header) + len(body), len(header)
    r = rng.random()
    if r < 0.03:
        header_len = rng.choice((length - 3, 0xFFFFFF, MAX_HEADER_SIZE + 1, 0))
    elif r < 0.06:
        length = rng.choice((3, length - 1, length + 1, 0x7FFFFFFF))
    elif r < 0.08:
        stype = rng.choice((2, 0x7F, 0xFF))
    return struct.pack(">iI", length, ((stype << 24) | (header_len & 0xFFFFFF)) & 0xFFFFFFFF) + header + body


# --- seeds: the crafted inputs and each limit --------------------------------------------

def _frame(header: bytes, body: bytes = b"", stype: int = 0) -> bytes:
    return struct.pack(">ii", 4 + len(header) + len(body), (stype << 24) | len(header)) + header + body


def _seed_header(code: int, ext: str, opaque: int, more: str = "") -> bytes:
    return (f'{{"code":{code},"opaque":{opaque},"flag":0,"language":"JAVA","version":479{more},'
            f'"extFields":{ext}}}').encode()


def remoting_seeds(namesrv: bool = False) -> list[bytes]:
    """The issue's frames and one at (and past) every limit of the decoder
    and of the bodies behind it."""
    return list(_remoting_seeds(namesrv))


@functools.lru_cache(maxsize=2)  # (a few of them take a while to build)
def _remoting_seeds(namesrv: bool) -> tuple[bytes, ...]:
    out = [
        # The report's 2 KB frame: an extFields value holding JSON nested 1,000 deep.
        _frame(_seed_header(int(RequestCode.GET_ROUTEINFO_BY_TOPIC), '{"topic":"T","x":' + nested(1000) + "}", 1)),
        _frame(_seed_header(int(RequestCode.HEART_BEAT), '{"x":' + nested(950) + "}", 2)),
        _frame(_seed_header(10, '{"x":' + nested(MAX_VALUE_DEPTH + 1) + "}", 3)),
        _frame(_seed_header(10, "{}", 4, ',"remark":' + nested(1000, "NaN"))),
        _frame(_seed_header(10, "{" + ",".join(f'"k{i}":"v"' for i in range(MAX_EXT_FIELDS + 1)) + "}", 5)),
        _frame(_seed_header(10, "{" + ",".join(f'"k{i}":{i}' for i in range(MAX_EXT_FIELDS + 1)) + "}", 6)),
        # A header past the limit, announced and never sent; a frame announcing 2 GiB.
        struct.pack(">ii", MAX_HEADER_SIZE + 64, MAX_HEADER_SIZE + 1) + b"{" * 64,
        struct.pack(">ii", 0x7FFFFFF0, 0x10) + b"x" * 64,
    ]
    if namesrv:
        body = '{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":%s}},"filterServerList":[]}' % nested(5000)
        out.append(_frame(_seed_header(int(RequestCode.REGISTER_BROKER), json.dumps({
            "brokerName": "fuzz-b9", "brokerAddr": "127.0.0.1:9", "clusterName": "FuzzCluster",
            "brokerId": "1"}), 7), body.encode()))
        return tuple(out)
    hb = ('{"clientID":"fuzz@1","consumerDataSet":[{"groupName":"fuzz_cg","x":%s}]}' % nested(100_000)).encode()
    out.append(_frame(_seed_header(int(RequestCode.HEART_BEAT), "{}", 8), hb))
    lock = ('{"consumerGroup":"fuzz_cg","clientId":"c","mqSet":%s}' % nested(1000, "", "{")).encode()
    out.append(_frame(_seed_header(int(RequestCode.LOCK_BATCH_MQ), "{}", 9), lock))
    pull = {"consumerGroup": "fuzz_cg", "topic": FUZZ_TOPIC, "queueId": "0", "queueOffset": "0", "maxMsgNums": "1",
            "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0", "subVersion": "0",
            "expressionType": "SQL92"}
    for i, sql in enumerate(("(" * 10_000 + "a=1" + ")" * 10_000, " AND ".join(["a=1"] * 100_000),
                             " AND ".join(["a=1"] * 2047), "NOT " * 40 + "a=1")):
        out.append(_frame(_seed_header(int(RequestCode.PULL_MESSAGE), json.dumps({**pull, "subscription": sql}),
                                       10 + i)))
    send = {"a": "fuzz_pg", "b": FUZZ_TOPIC, "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1700000000000",
            "h": "0", "j": "0", "k": "false", "m": "false"}
    out.append(_frame(_seed_header(int(RequestCode.SEND_MESSAGE_V2), json.dumps(
        {**send, "i": "big\x01" + "v" * 40_000 + "\x02"}), 20), b"body"))
    many = batches.encode_batch([batches.BatchItem(b"", {"a": "1"})] * 16_385)
    out.append(_frame(_seed_header(int(RequestCode.SEND_BATCH_MESSAGE), json.dumps({**send, "i": "", "m": "true"}),
                                   21), many))
    return tuple(out)


# --- peer frames -------------------------------------------------------------------------------

TERMS = (0, 1, 2, 3, 7, 2 ** 31, 4_611_686_018_427_387_904, 2 ** 63 - 1, -1, -(2 ** 63))
INDEXES = (-1, 0, 1, 2, 5, 100, 2 ** 40, 2 ** 63 - 1, -(2 ** 63))


def raft_message(rng: random.Random, src: str, dst: str):
    """A Raft message with any field values (terms and indexes at the
    extremes too): what the core must survive or the wire refuse."""
    term, idx = rng.choice(TERMS), (lambda: rng.choice(INDEXES))
    kind = rng.randrange(7)
    if kind == 0:
        return VoteRequest(src, dst, term, idx(), rng.choice(TERMS), rng.random() < 0.5, rng.random() < 0.2)
    if kind == 1:
        return VoteResponse(src, dst, term, rng.choice(list(VoteResult)), rng.random() < 0.5)
    if kind == 2:
        return HeartbeatRequest(src, dst, term, idx())
    if kind == 3:
        return HeartbeatResponse(src, dst, term, rng.choice(list(ResponseCode)))
    if kind == 4:
        ptype = rng.choice(list(PushType))
        batch = None
        if ptype in (PushType.APPEND, PushType.TRUNCATE) and rng.random() < 0.7:
            first = rng.choice((0, 1, 5, 2 ** 40))
            batch = EntryBatch(first, 1, ((first, rng.choice(TERMS[:5])),), rng.randbytes(rng.choice((0, 48, 100))))
        return PushRequest(src, dst, term, ptype, rng.randrange(0, 2 ** 31), idx(), idx(), rng.choice(TERMS),
                           rng.randrange(2 ** 32), batch)
    if kind == 5:
        return PushResponse(src, dst, term, rng.choice(list(PushType)), rng.randrange(2 ** 31),
                            rng.choice(list(ResponseCode)), idx(), idx(), idx(), rng.choice(TERMS), idx())
    return TimeoutNow(src, dst, term)


def peer_stream(rng: random.Random, group: str, ids: list[str], target: str, identity: str = "") -> bytes:
    """What one connection to `target`'s peer port sends: a HELLO (mostly
    right, sometimes not), maybe an AUTH with a made-up proof, then Raft
    messages -- some addressed to another node, from another node, or with
    fields no replica ever sends."""
    others = [i for i in ids if i != target] or ["x"]
    dialers = [i for i in others if i < target] or others  # (the lower id dials)
    src = rng.choice(dialers) if rng.random() < 0.8 else rng.choice(others + ["", "zz", target, "n" * 300, "é"])
    hello = Hello(group if rng.random() < 0.85 else rng.choice(("", "other", group + "x")), src,
                  target if rng.random() < 0.85 else rng.choice(others + ["nobody"]),
                  identity if rng.random() < 0.8 else rng.choice(("", "origin=1", "a=b;c")),
                  rng.randbytes(16).hex() if rng.random() < 0.5 else "", "")
    try:
        payload = hello.encode()
    except Exception:
        payload = Hello(group, others[0], target).encode()
    out = [encode_frame(payload, FrameKind.HELLO)]
    if rng.random() < 0.3:
        out.append(encode_frame(rng.randbytes(64).hex().encode(), FrameKind.AUTH))
    for _ in range(rng.randrange(6)):
        dst = target if rng.random() < 0.8 else rng.choice(others + ["nobody"])
        msg_src = src if rng.random() < 0.85 else rng.choice(others + [target])
        try:
            data = wire.encode(raft_message(rng, msg_src, dst))
        except Exception:  # a field the wire cannot carry: raw bytes instead
            data = rng.randbytes(rng.randrange(40))
        out.append(encode_frame(data, rng.choice((FrameKind.DATA,) * 9 + (FrameKind.REJECT,))))
    return b"".join(out)


def peer_seeds(group: str, ids: list[str], target: str, identity: str = "") -> list[bytes]:
    """The issue's peer inputs: a heartbeat addressed to another node on a
    connection to `target`; terms near 2**63; a HELLO announcing 60 MiB; a
    frame announcing 2 GiB."""
    others = [i for i in ids if i != target] or ["x"]  # (others[0], the lowest, dials target)
    hello = encode_frame(Hello(group, others[0], target, identity).encode(), FrameKind.HELLO)
    misaddressed = wire.encode(HeartbeatRequest(others[0], others[-1] if len(others) > 1 else "nobody", 1, 0))
    huge_vote = wire.encode(VoteRequest(others[0], target, 4_611_686_018_427_387_904, 2 ** 62, 2 ** 62, True, False))
    return [
        hello + encode_frame(misaddressed),
        hello + encode_frame(huge_vote) + encode_frame(wire.encode(TimeoutNow(others[0], target, 2 ** 63 - 1))),
        frame_header(FrameKind.HELLO, 60 * 1024 * 1024, 1 << 32) + b"\x00" * 64,
        struct.pack(">HBBI", 0x4C51, 1, int(FrameKind.DATA), 0x7FFFFFF0) + b"x" * 64,
    ]
