# The hostile-input suite: structure-aware fuzzing with hypothesis of every
# decoder that reads outside bytes, each against its one rule -- it returns
# a value or raises its documented error type, never anything else (never
# RecursionError or MemoryError), and never holds more than its stated
# bound.  Inputs are built from the formats' structure (JSON headers whose
# fields change type, length and nesting; ROCKETMQ headers and peer frames
# whose lengths lie; bodies; expressions), so they get past the first check
# and reach the code behind it; hypothesis shrinks a failure to a small one.
#
#   remoting frames   CommandDecoder, plain and with the C scanner in front:
#                     commands or RemoteProtocolError, the two agreeing
#   JSON bodies       header.decode_json: a value nesting at most
#                     MAX_JSON_DEPTH, or RequestError
#   properties        record.string_to_properties: a dict of at most 8192,
#                     or MessageFormatError (only past MAX_PROPERTIES_LEN)
#   records           record.decode / check_record with lying lengths
#   SQL92 and tags    compile_sql / parse_subscription: a filter whose
#                     evaluation gives TRUE/FALSE/unknown, or the typed error
#   peer frames       FrameDecoder, decode_hello, raft wire.decode: frames,
#                     Hello, messages (which re-encode to the same bytes),
#                     or FrameError / WireError
# Batch bodies (the C scanner against the general decoder) are in
# tests/consumequeue/test_record.py.  Settings: a bounded number of
# examples each (LEDGERMQ_HOSTILE_EXAMPLES, 150 by default), no deadline;
# the whole file takes seconds.
import json
import os
import struct

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from broker.common.sqlfilter import MAX_SQL_DEPTH, SqlFilterError, compile_sql
from broker.common.subscription import SubscriptionError, parse_subscription
from broker.remoting.codec import (
    CLOSED,
    MAX_EXT_FIELDS,
    MAX_HEADER_SIZE,
    MAX_VALUE_DEPTH,
    NEED_DATA,
    CommandDecoder,
)
from broker.remoting.errors import RemoteProtocolError, RequestError
from broker.remoting.header import MAX_JSON_BODY, MAX_JSON_DEPTH, decode_json
from broker.remoting.jsonbound import nests_deeper_than
from commitlog.errors import WireError
from commitlog.raft import wire
from commitlog.transport.errors import FrameError
from commitlog.transport.framing import CLOSED as PEER_CLOSED
from commitlog.transport.framing import NEED_DATA as PEER_NEED_DATA
from commitlog.transport.framing import FrameDecoder, FrameKind, decode_hello
from consumequeue import record as M
from native import sendpath

EXAMPLES = int(os.environ.get("LEDGERMQ_HOSTILE_EXAMPLES", "150"))  # per rule (Raft messages: more)
FAST = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                            HealthCheck.data_too_large])

# --- JSON as text, any type, any nesting ---------------------------------------------------------

DEPTHS = st.sampled_from([0, 1, 2, MAX_VALUE_DEPTH - 1, MAX_VALUE_DEPTH, MAX_VALUE_DEPTH + 1, MAX_JSON_DEPTH,
                          MAX_JSON_DEPTH + 1, 200, 990, 1000, 1025, 3000])
SCALARS = st.one_of(
    st.text(max_size=20).map(json.dumps),
    st.integers(-2 ** 70, 2 ** 70).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(json.dumps),
    st.sampled_from(["true", "false", "null", "NaN", "Infinity", "-0", "1e999", '"\\ud800"', '"\\u0000"']),
    st.sampled_from([5000, 70_000]).map(lambda n: "9" * n if n < 10_000 else json.dumps("x" * n)),
)


@st.composite
def deep_text(draw) -> str:
    depth = draw(DEPTHS)
    inner = draw(st.one_of(st.just(""), SCALARS))
    if draw(st.booleans()):
        return "[" * depth + inner + "]" * depth
    return '{"a":' * depth + (inner or "1") + "}" * depth


JSON_TEXT = st.recursive(
    st.one_of(SCALARS, deep_text()),
    lambda inner: st.one_of(st.lists(inner, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]"),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4).map(
                                lambda d: "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in d.items()) + "}")),
    max_leaves=8)


# --- remoting frames -------------------------------------------------------------------------------

SEND_FIELDS = {"a": '"pg"', "b": '"TopicA"', "c": '"TBW102"', "d": '"4"', "e": '"1"', "f": '"0"',
               "g": '"1700000000000"', "h": '"0"', "i": '"KEYS\\u0001k\\u0002"', "j": '"0"', "k": '"false"',
               "m": '"false"'}


@st.composite
def json_header(draw) -> bytes:
    head = {"code": draw(st.sampled_from(["310", "10", "105", "34", "11"])), "opaque": str(draw(st.integers(0, 99))),
            "flag": "0", "language": '"JAVA"', "version": "479", "serializeTypeCurrentRPC": '"JSON"'}
    ext = dict(SEND_FIELDS) if head["code"] == "310" else {"topic": '"T"'}
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2]))):  # fields of another type, deep, long, many
        ext[draw(st.sampled_from(sorted(ext) + ["x", "y"]))] = draw(JSON_TEXT)
    many = draw(st.sampled_from([0, 0, 0, MAX_EXT_FIELDS - len(ext), MAX_EXT_FIELDS + 1 - len(ext)]))
    ext.update({f"z{i}": '"v"' for i in range(many)})
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):  # header fields of another type, missing, unknown
        key = draw(st.sampled_from(sorted(head) + ["remark", "unknown"]))
        if draw(st.booleans()):
            head[key] = draw(JSON_TEXT)
        else:
            head.pop(key, None)
    parts = [f'"{k}":{v}' for k, v in head.items()]
    parts.append('"extFields":' + ("{" + ",".join(f'"{k}":{v}' for k, v in ext.items()) + "}"
                                   if draw(st.integers(0, 9)) < 9 else draw(JSON_TEXT)))
    text = "{" + ",".join(draw(st.permutations(parts))) + "}"
    raw = text.encode("utf-8", "surrogatepass")
    if draw(st.integers(0, 9)) == 9:  # malformed UTF-8 or JSON somewhere
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\x00", b"}", b'"', b"[" * 1100])) + raw[at:]
    return raw


@st.composite
def binary_header(draw) -> bytes:
    code, lang, version, opaque, flag = (draw(st.integers(-2 ** 15, 2 ** 15 - 1)), draw(st.integers(0, 255)),
                                         draw(st.integers(-2 ** 15, 2 ** 15 - 1)), draw(st.integers(0, 99)), 0)
    remark = draw(st.binary(max_size=20))
    ext = b""
    for _ in range(draw(st.sampled_from([0, 2, 5, MAX_EXT_FIELDS, MAX_EXT_FIELDS + 1]))):
        k, v = draw(st.sampled_from([b"k", b"topic", b"\xff\xfe"])) + str(len(ext)).encode(), b"v"
        ext += struct.pack(">h", len(k)) + k + struct.pack(">i", len(v)) + v
    out = bytearray(struct.pack(">hbhii", code, lang if lang < 128 else lang - 256, version, opaque, flag)
                    + struct.pack(">i", len(remark)) + remark + struct.pack(">i", len(ext)) + ext)
    for _ in range(draw(st.integers(0, 2))):  # a length that lies
        at = draw(st.integers(0, max(0, len(out) - 4)))
        struct.pack_into(">i", out, at, draw(st.sampled_from([-1, 0, 1, 2 ** 31 - 1, len(out), 0x7FFF])))
    return bytes(out)


@st.composite
def remoting_stream(draw) -> tuple[bytes, list[int]]:
    frames = []
    for _ in range(draw(st.integers(1, 3))):
        binary = draw(st.integers(0, 4)) == 4
        header = draw(binary_header() if binary else json_header())
        body = draw(st.binary(max_size=30))
        length, header_len = 4 + len(header) + len(body), len(header)
        lie = draw(st.integers(0, 15))
        if lie == 15:
            length = draw(st.sampled_from([0, 3, length - 1, length + 5, 0x7FFFFFFF, MAX_HEADER_SIZE + 100]))
        elif lie == 14:
            header_len = draw(st.sampled_from([0, length - 3, MAX_HEADER_SIZE + 1, 0xFFFFFF]))
        stype = draw(st.sampled_from([1, 1, 1, 1, 2, 0xFF])) if binary else draw(st.sampled_from([0] * 9 + [1]))
        frames.append(struct.pack(">iI", length, ((stype << 24) | header_len) & 0xFFFFFFFF) + header + body)
    data = b"".join(frames)
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=4)))
    return data, cuts


def run_decoder(dec: CommandDecoder, data: bytes, cuts: list[int]) -> tuple[list, str | None]:
    out, fed = [], 0
    try:
        for lo, hi in zip([0, *cuts], [*cuts, len(data)]):
            dec.receive_data(data[lo:hi]) if hi > lo else None
            fed += hi - lo
            assert dec.buffered <= fed
            while (cmd := dec.next_command()) not in (NEED_DATA, CLOSED):
                for one in (cmd.sends() if type(cmd).__name__ == "SendRun" else [cmd]):
                    c = one.command() if hasattr(one, "command") else one
                    out.append((c.code, c.opaque, c.flag, c.version, c.language, c.remark, c.ext_fields, c.body,
                                c.serialize_type))
        dec.receive_data(b"")
        while (cmd := dec.next_command()) not in (NEED_DATA, CLOSED):
            out.append(cmd)
    except RemoteProtocolError as e:
        return out, e.reason
    return out, None


@FAST
@given(remoting_stream())
def test_remoting_frames_decode_or_are_refused_and_the_c_scanner_agrees(stream):
    data, cuts = stream
    plain = run_decoder(CommandDecoder(), data, cuts)
    event(f"{len(plain[0])} decoded, {'refused' if plain[1] else 'no error'}")
    for cmd in plain[0]:
        ext = cmd[6]
        assert len(ext) <= MAX_EXT_FIELDS and all(type(v) is str for v in ext.values())
    if sendpath.AVAILABLE:
        assert run_decoder(CommandDecoder(raw_sends=True), data, cuts) == plain


# --- JSON bodies ------------------------------------------------------------------------------------

@FAST
@given(JSON_TEXT, st.sampled_from(["HeartbeatData", "LockBatchRequestBody", "RegisterBrokerBody"]),
       st.sampled_from([b"", b"\xff", b" " * 10]))
def test_json_bodies_decode_bounded_or_are_refused(text, what, tail):
    body = text.encode("utf-8", "surrogatepass") + tail
    try:
        value = decode_json(body, what)
    except RequestError as e:
        assert what in e.remark and len(e.remark) < 400
        event("refused")
        return
    event("decoded")
    assert not nests_deeper_than(value, MAX_JSON_DEPTH)


def test_json_body_size_bound_is_checked_before_parsing():
    body = b"[" + b"1," * (MAX_JSON_BODY // 2) + b"1]"
    with pytest.raises(RequestError, match="exceeds the maximum"):
        decode_json(body, "HeartbeatData")
    assert len(decode_json(body, "RegisterBrokerBody")) == MAX_JSON_BODY // 2 + 1  # bounded by the frame only


# --- properties and records ------------------------------------------------------------------------

PROPERTY_TEXT = st.one_of(
    st.text(alphabet=st.sampled_from("ab\x01\x02é\ud7ff"), max_size=60),
    st.builds(lambda n, k: "".join(f"k{i}\x01v\x02" for i in range(n)) * k, st.integers(0, 9000),
              st.sampled_from([1, 1, 2])),
    st.builds(lambda n: "a\x01" + "v" * n + "\x02", st.sampled_from([10, M.MAX_PROPERTIES_LEN - 3,
                                                                     M.MAX_PROPERTIES_LEN - 2, 10 ** 6])),
)


@FAST
@given(PROPERTY_TEXT)
def test_properties_decode_bounded_or_are_refused(text):
    try:
        props = M.string_to_properties(text)
    except M.MessageFormatError:
        assert len(text) > M.MAX_PROPERTIES_LEN
        return
    assert len(text) <= M.MAX_PROPERTIES_LEN and len(props) <= 8192


@st.composite
def lying_record(draw) -> bytes:
    rec = M.encode(M.MessageRecord(
        topic=draw(st.sampled_from(["T", "x" * 200])), body=draw(st.binary(max_size=40)),
        properties=draw(st.dictionaries(st.sampled_from(["TAGS", "KEYS", "a"]),
                                        st.text(alphabet=st.characters(blacklist_characters="\x01\x02",
                                                                       blacklist_categories=("Cs",)),
                                                min_size=1, max_size=5), max_size=3)),
        sysflag=draw(st.sampled_from([0, 0x10, 0x20, 0x30])),
        born_host=M.HostAddr("::1" if draw(st.booleans()) else "127.0.0.1", 1)))
    out = bytearray(rec)
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.sampled_from([0, 36, 84, 96, len(out) - 2, draw(st.integers(0, len(out) - 1))]))
        value = draw(st.sampled_from([0, -1, 1, 0x7FFF, 2 ** 31 - 1, len(out)]))
        if at + 4 <= len(out):
            struct.pack_into(">i", out, at, value)
        elif at + 2 <= len(out):
            struct.pack_into(">h", out, at, max(-2 ** 15, min(value, 2 ** 15 - 1)))
    return bytes(out[:draw(st.integers(0, len(out)))] if draw(st.integers(0, 5)) == 0 else out)


@FAST
@given(lying_record(), st.booleans())
def test_records_decode_or_are_refused(data, check_crc):
    try:
        M.decode(data, check_crc=check_crc)
    except M.MessageFormatError:
        pass
    reason = M.check_record(data)
    assert reason is None or isinstance(reason, str)


# --- SQL92 and tag expressions ----------------------------------------------------------------------

SQL_ATOMS = st.sampled_from(["a > 5", "color = 'red'", "a BETWEEN 1 AND 9", "b IN ('x', 'y')", "c IS NULL",
                             "d IS NOT NULL", "e CONTAINS 'z'", "f = TRUE", "TRUE", "g <> -1.5e3", "h = 1" + "9" * 20,
                             "a >", "= 1", "'x' IN ('x')", "a IN ()", "b = NULL", "x # 1", "'open",
                             "h = " + "9" * 5000])


SQL = st.recursive(
    SQL_ATOMS,
    lambda inner: st.one_of(
        st.lists(inner, min_size=2, max_size=5).map(" AND ".join),
        st.lists(inner, min_size=2, max_size=5).map(" or ".join),
        inner.map(lambda e: f"({e})"), inner.map(lambda e: f"NOT {e}"),
        st.tuples(inner, st.sampled_from([1, 10, MAX_SQL_DEPTH - 1, MAX_SQL_DEPTH, MAX_SQL_DEPTH + 1, 5000])).map(
            lambda t: "(" * t[1] + t[0] + ")" * t[1]),
        st.tuples(inner, st.sampled_from([2, 500, 2100, 10 ** 5])).map(
            lambda t: " AND ".join([t[0]] * t[1]) if len(t[0]) * t[1] < 10 ** 6 else t[0]),  # (the test's memory)
    ), max_leaves=10)


@FAST
@given(SQL, st.dictionaries(st.sampled_from("abcdefgh"), st.sampled_from(["7", "red", "x", "true", "1e3", ""]),
                            max_size=5))
def test_sql92_expressions_compile_and_evaluate_or_are_refused(expression, props):
    try:
        f = compile_sql(expression)
    except SqlFilterError as e:
        assert len(str(e)) < 400
        event("refused")
        return
    event("compiled")
    assert f.evaluate(props) in (True, False, None)


@FAST
@given(st.one_of(st.text(max_size=40), st.builds(lambda t, n: "||".join([t] * n), st.text(max_size=5),
                                                   st.sampled_from([1, 10, 6000]))),
       st.sampled_from(["TAG", "SQL92", "sql92", "", "CLASS", None]))
def test_subscriptions_parse_or_are_refused(text, etype):
    try:
        sub = parse_subscription(text, 0, etype)
    except SubscriptionError as e:
        assert len(e.remark) < 1000
        return
    assert sub.is_all or sub.is_sql or sub.codes is not None


# --- peer frames, HELLO, Raft messages --------------------------------------------------------------

IDS = st.sampled_from(["n0", "n1", "n2", "", "é", "odd"]).flatmap(
    lambda i: st.binary(max_size=300) if i == "odd" else st.just(i))


I64 = st.sampled_from([0, 1, 7, -1, 2 ** 62, 2 ** 63 - 1, -(2 ** 63)])
BODIES = {  # per message type: its fixed fields (struct format, a strategy for each)
    1: (">qqB", (I64, I64, st.integers(0, 4))),
    2: (">BB", (st.integers(0, 12), st.integers(0, 2))),
    3: (">q", (I64,)),
    4: (">H", (st.sampled_from([200, 403, 406, 409, 0, 65535]),)),
    6: (">BqHqqqqq", (st.integers(0, 5), I64, st.sampled_from([200, 403, 406, 409, 1]), I64, I64, I64, I64, I64)),
    7: ("", ()),
}


@st.composite
def raft_bytes(draw) -> bytes:
    """A Raft message laid out as wire.py does, with any field values, and
    now and then a length that lies, a byte too many or too few."""
    t = draw(st.sampled_from([1, 2, 3, 4, 5, 5, 5, 6, 7, 0, 8]))
    out = struct.pack(">BB", draw(st.sampled_from([1] * 9 + [0, 2])), t)
    for _ in range(2):
        ident = draw(IDS)
        raw = ident.encode() if isinstance(ident, str) else ident
        out += struct.pack(">H", draw(st.sampled_from([len(raw)] * 9 + [len(raw) + 1, 0xFFFF]))) + raw
    out += struct.pack(">q", draw(I64))
    if t == 5:
        flags = draw(st.sampled_from([0, 1, 1, 2, 3, 4]))
        out += struct.pack(">BqqqqIB", draw(st.integers(0, 6)), draw(I64), draw(I64), draw(I64), draw(I64),
                           draw(st.integers(0, 2 ** 32 - 1)), flags)
        if flags & 1:
            first, count = draw(st.sampled_from([0, 5, 2 ** 62])), draw(st.integers(0, 5))
            nruns = draw(st.sampled_from([1, 1, 2, 0, 2 ** 32 - 1]))
            out += struct.pack(">qII", first, count, nruns)
            terms = sorted(draw(st.lists(st.integers(0, 9), min_size=3, max_size=3, unique=True)))
            for k in range(min(nruns, 3)):
                out += struct.pack(">qq", first + k, terms[k])
            raw = draw(st.binary(max_size=60))
            out += struct.pack(">I", draw(st.sampled_from([len(raw)] * 5 + [len(raw) + 1, 2 ** 32 - 1]))) + raw
        if flags & 2:
            cfg = draw(st.binary(max_size=20))
            out += struct.pack(">qqI", draw(I64), draw(I64), len(cfg)) + cfg
    elif t in BODIES:
        fmt, fields = BODIES[t]
        if fmt:
            out += struct.pack(fmt, *(draw(f) for f in fields))
    tail = draw(st.sampled_from([0] * 8 + [1, -1]))
    return out + b"\x00" if tail > 0 else (out[:-1] if tail < 0 else out)


@settings(FAST, max_examples=EXAMPLES * 3)
@given(raft_bytes())
def test_raft_messages_decode_and_reencode_or_are_refused(data):
    try:
        msg = wire.decode(data)
    except WireError:
        event("refused")
        return
    event(f"decoded {type(msg).__name__}")
    assert wire.encode(msg) == data


@FAST
@given(st.lists(st.tuples(st.sampled_from([0, 1, 2, 3, 4, 5, 6, 255]), st.binary(max_size=40),
                          st.sampled_from([None, None, None, 0, 2 ** 32 - 1, 64 * 2 ** 20])), min_size=1, max_size=4),
       st.sampled_from([0x4C51, 0x4C51, 0x4C51, 0]), st.sampled_from([1, 1, 1, 2]),
       st.lists(st.integers(0, 400), max_size=4))
def test_peer_frames_and_hellos_decode_or_are_refused(frames, magic, version, cuts):
    limit = 1 << 16
    data = b"".join(struct.pack(">HBBI", magic, version, kind, len(p) if n is None else n) + p for kind, p, n in frames)
    dec = FrameDecoder(max_frame_size=limit)
    fed = 0
    try:
        for lo, hi in zip([0, *sorted(cuts)], [*sorted(cuts), len(data)]):
            if hi <= lo:
                continue
            dec.receive_data(data[lo:hi])
            fed += hi - lo
            assert dec.buffered <= min(fed, limit + 8 + (hi - lo))
            while (frame := dec.next_frame()) not in (PEER_NEED_DATA, PEER_CLOSED):
                if frame.kind is FrameKind.HELLO:
                    try:
                        decode_hello(frame.payload)
                    except FrameError:
                        pass
                elif frame.kind is FrameKind.DATA:
                    try:
                        wire.decode(frame.payload)
                    except WireError:
                        pass
    except FrameError:
        pass


@FAST
@given(st.lists(IDS, max_size=7), st.sampled_from([b"", b"\x00", b"\xff\xff"]))
def test_hello_payloads_decode_or_are_refused(fields, tail):
    payload = b""
    for f in fields:
        raw = f.encode() if isinstance(f, str) else f
        payload += struct.pack(">H", len(raw)) + raw
    try:
        hello = decode_hello(payload + tail)
    except FrameError:
        return
    assert hello.encode() == payload + tail or not tail
