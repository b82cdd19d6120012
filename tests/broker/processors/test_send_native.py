# The native send path (native/sendpath.c via broker/processors/send_native.py)
# against its pure-Python twin, the general path: for any request the C
# scanner accepts, the decoded command, the header fields, the record bytes
# and the answer bytes must be exactly what the general path makes of the
# same frame -- checked on generated headers in every JSON spelling (escapes,
# whitespace, key order, duplicates, other value types) and on mangled
# bytes.  A request the scanner declines is served by the general path
# (that it is declined is fine; accepting and differing is the failure).
# Then end to end on a real 3-node group: bursts mixing native, declined
# and general requests are answered in order, each as the general path
# would, and store what it would.
import json
import struct

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.common.msgid import UniqKeyGenerator, offset_msg_id, parse_offset_msg_id
from broker.processors.send import SendProcessor, host_of, parse_send_header
from broker.remoting.codec import CommandDecoder, RawSend, SendRun, decode_header, encode_command, encode_response
from broker.remoting.codes import CURRENT_VERSION, RequestCode, ResponseCode, SerializeType
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RemoteProtocolError
from consumequeue import record as M
from native import sendpath
from tests.broker.processors.test_send import BORN, processor
from tests.broker.processors.test_send_hot_path import _processor_with_keys
from tests.broker.store.test_gate import Group

pytestmark = pytest.mark.skipif(not sendpath.AVAILABLE, reason="the native extension is not built (make native)")

CLOCK = 1_700_000_000_123


def _keys() -> UniqKeyGenerator:
    return UniqKeyGenerator(ip=b"\x7f\0\0\x01", pid=7, class_loader_hash=1, clock_ms=lambda: CLOCK)


# --- JSON in every spelling ---------------------------------------------------------

def _ws(draw) -> str:
    return draw(st.sampled_from(["", "", "", " ", "\n\t", "\r "]))


def _string(draw, text: str) -> str:
    """A JSON string for `text`, each character written plainly or escaped."""
    out = ['"']
    for ch in text:
        cp = ord(ch)
        plain = ch not in '"\\' and cp >= 0x20
        how = draw(st.integers(0, 4)) if plain else draw(st.integers(1, 4))
        if plain and how != 1:
            out.append(ch)
        elif ch in '"\\/\b\f\n\r\t' and how in (2, 3):
            out.append("\\" + {'"': '"', "\\": "\\", "/": "/", "\b": "b", "\f": "f", "\n": "n", "\r": "r",
                               "\t": "t"}[ch])
        elif cp >= 0x10000:
            hi, lo = 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF)
            out.append(f"\\u{hi:04x}\\u{lo:04X}")
        else:
            out.append(f"\\u{cp:04X}" if how == 3 else f"\\u{cp:04x}")
    out.append('"')
    return "".join(out)


def _json(draw, value) -> str:
    if isinstance(value, dict):
        items = [f"{_ws(draw)}{_string(draw, k)}{_ws(draw)}:{_ws(draw)}{_json(draw, v)}{_ws(draw)}"
                 for k, v in value.items()]
        return "{" + (",".join(items) if items else _ws(draw)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_json(draw, v) for v in value) + "]"
    if isinstance(value, str):
        return _string(draw, value)
    if isinstance(value, _Raw):
        return value.text
    return json.dumps(value)


class _Raw:
    """JSON text written as is (numbers in other spellings)."""

    def __init__(self, text: str) -> None:
        self.text = text


_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
_DIGITS = st.one_of(st.integers(0, 10**9 - 1).map(str), st.sampled_from(["007", "0", "999999999"]))
_ODD_NUMBERS = st.sampled_from(["+1", "-1", " 1", "", "1.0", "1e3", "\u0663", "2147483648", "x"])
_PROP_NAMES = st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "WAIT", "DELAY", "CLUSTER", "TRAN_MSG", "n\u00e4me",
                               "X", "TIMER_DELAY_SEC"])
_PROP_VALUES = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=10)


@st.composite
def properties(draw) -> str:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(alphabet="ab\x01\x02", max_size=8))  # any shape at all
    pairs = draw(st.lists(st.tuples(_PROP_NAMES, _PROP_VALUES), max_size=5))
    return "".join(f"{k}\x01{v}\x02" for k, v in pairs)


@st.composite
def send_headers(draw) -> bytes:
    """A SEND_MESSAGE_V2 JSON header as some client might write it."""
    def num(plain=True):
        choice = draw(st.integers(0, 9))
        if choice == 0:
            return draw(_ODD_NUMBERS)
        if choice == 1:
            return draw(st.integers(-5, 10**9))  # a JSON number, not text
        return draw(_DIGITS) if plain else draw(st.integers(0, 10**15)).__str__()

    ext = {"a": draw(st.sampled_from(["pg", "p\u00e9", "g\"1"])),
           "b": draw(st.sampled_from(["TopicA", "T_b-1", "%RETRY%g", "t\u00e9", "x" * 130])),
           "c": "TBW102", "d": num(), "e": num(), "f": draw(st.sampled_from(["0", "1", "16", "48", "4", "2"])),
           "g": num(plain=False), "h": num(), "i": draw(properties())}
    for key, value in (("j", num), ("k", lambda: draw(st.sampled_from(["false", "true"]))), ("l", num),
                       ("m", lambda: draw(st.sampled_from(["false", "true", "0", "1", "yes", False]))),
                       ("n", lambda: "broker-a")):
        if draw(st.booleans()):
            ext[key] = value()
    for key in draw(st.lists(st.sampled_from("abcdefghi"), max_size=1)):
        del ext[key]  # a required field missing
    if draw(st.integers(0, 19)) == 0:
        ext["i"] = draw(st.one_of(st.none(), st.integers(), st.booleans()))  # not text
    order = draw(st.permutations(list(ext)))
    ext = {k: ext[k] for k in order}
    top = {"code": 310 if draw(st.integers(0, 9)) else draw(st.sampled_from(["310", 311, _Raw("310.0")])),
           "extFields": ext, "flag": draw(st.sampled_from([0, 0, 2, 1, "0", -1])),
           "language": draw(st.sampled_from(["JAVA", "CPP", 5, None, "KLINGON"])),
           "opaque": draw(st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from(["7", 2**31, None]))),
           "serializeTypeCurrentRPC": "JSON", "version": draw(st.sampled_from([479, "479", 2**40, None]))}
    if draw(st.booleans()):
        top["remark"] = draw(st.sampled_from([None, "", "r\u00e9", 5]))
    if draw(st.integers(0, 5)) == 0:
        top["zzz"] = draw(st.sampled_from([[1, {"a": None}], _Raw("-0.5e-3"), True, "x"]))
    top = {k: v for k, v in top.items() if v is not None or k == "remark"}
    keys = list(top)
    if draw(st.integers(0, 4)) == 0:
        keys = draw(st.permutations(keys))
    else:
        keys.remove("code")
        keys = ["code", *keys]
    text = "{" + ",".join(f"{_string(draw, k) if k != 'code' else chr(34) + 'code' + chr(34)}:"
                          f"{_json(draw, top[k])}" for k in keys) + "}"
    if draw(st.integers(0, 19)) == 0:
        text = text[:-1] + ',"code":310}'  # a duplicate key
    return text.encode("utf-8")


def _frame(header: bytes, body: bytes, stype: int = 0) -> bytes:
    return struct.pack(">ii", 4 + len(header) + len(body), (stype << 24) | len(header)) + header + body


# --- the scanner and the records: the general path as oracle -----------------------------

_GENERAL = []


def _general_processor():
    """One general-path processor for every example (building a config is
    slow), with a fresh key generator each time."""
    if not _GENERAL:
        _GENERAL.append(_processor_with_keys())
    proc, cfg = _GENERAL[0]
    proc.uniq_keys = _keys()
    return proc, cfg


def _native_record(scan, i, cfg, born, sysflag, queue_id):
    keys = _keys()
    diff, counter = keys.reserve(1)
    env = sendpath.SendEnv(born.packed, cfg.store_host.packed, CLOCK, cfg.broker_cluster_name.encode(),
                           keys.prefix.encode(), diff, counter)
    from array import array
    buf, off, ln, uoff, ulen, _ = sendpath.encode_sends(scan, array("i", [i]), array("i", [queue_id]),
                                                        array("i", [sysflag]), env)
    return buf[off[0]:off[0] + ln[0]], buf[uoff[0]:uoff[0] + ulen[0]].decode()


def check_against_general(header: bytes, body: bytes, born_v6: bool) -> int:
    """Scan one frame; if the scanner takes it, everything it derives must
    equal the general path's.  Returns the scan status."""
    frame = _frame(header, body)
    scan = sendpath.scan_requests(bytearray(b"junk" + frame), 4, 1 << 24)
    assert scan is not None and scan.n == 1
    r = scan.reqs[0]
    assert (r.frame_off, r.frame_len, r.header_len, r.body_len) == (0, len(frame), len(header), len(body))
    if r.status != sendpath.SEND_OK:
        return r.status
    cmd = decode_header(SerializeType.JSON, header, body)  # taken: the general decoder must not fail
    assert (cmd.code, cmd.opaque, cmd.flag) == (RequestCode.SEND_MESSAGE_V2, r.opaque, r.flag)
    assert RawSend(scan, 0, r.opaque, r.flag).command() == cmd and scan.body(0) == body
    h = parse_send_header(cmd)  # nor the header reader
    assert not h.batch and h.properties_text.encode() == scan.properties(0) and h.topic.encode() == scan.topic(0)
    assert (h.queue_id, h.sys_flag, h.born_timestamp, h.flag, h.reconsume_times) == \
        (r.queue_id, r.sysflag, r.born_timestamp, r.msg_flag, r.reconsume_times)
    proc, cfg = _general_processor()
    born = host_of("[::1]:5555" if born_v6 else "127.0.0.1:5555")
    sysflag = (h.sys_flag & ~0x30) | (0x10 if born_v6 else 0)
    want = proc._plain_record(h, h.sys_flag, h.queue_id, body, born, CLOCK)
    assert want is not None, "the scanner took properties the general path declines"
    assert _native_record(scan, 0, cfg, born, sysflag, h.queue_id) == want
    return r.status


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(header=send_headers(), body=st.binary(max_size=64), born_v6=st.booleans())
def test_whatever_the_scanner_takes_equals_the_general_path(header, body, born_v6):
    check_against_general(header, body, born_v6)


@settings(max_examples=300)
@given(header=send_headers(), flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3))
def test_mangled_headers_are_declined_or_equal(header, flips):
    data = bytearray(header)
    for at, value in flips:
        data[at % len(data)] = value
    check_against_general(bytes(data), b"body", False)


def test_the_usual_clients_take_the_native_path():
    fields = {"a": "pg", "b": "TopicA", "c": "TBW102", "d": "4", "e": "1", "f": "0", "g": "1700000000000",
              "h": "0", "i": "TAGS\x01t\x02UNIQ_KEY\x01AC11\x02WAIT\x01true\x02", "j": "0", "k": "false",
              "m": "false", "n": "broker-a"}
    ours = encode_command(RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, fields, opaque=9))
    header = ours[8:]
    # the Java client (fastjson: sorted keys, the properties' \u0001 escaped) and the C++ client
    # (jsoncpp: language CPP, a remark, other escapes) write the same request differently
    java = json.dumps({"code": 310, "extFields": fields, "flag": 0, "language": "JAVA", "opaque": 9,
                       "serializeTypeCurrentRPC": "JSON", "version": 399}, separators=(",", ":")).encode()
    cpp = ('{"code":310,"extFields":' + json.dumps(fields, ensure_ascii=False) + ',"flag":0,"language":"CPP",'
           '"opaque":9,"remark":"","serializeTypeCurrentRPC":"JSON","version":399}').encode()
    for h in (header, java, cpp):
        assert check_against_general(h, b"body", False) == sendpath.SEND_OK, h


@pytest.mark.parametrize("props,status", [("DELAY\x013\x02", sendpath.SEND_PROPS),
                                          ("CLUSTER\x01c\x02", sendpath.SEND_PROPS),
                                          ("TRAN_MSG\x01true\x02", sendpath.SEND_PROPS),
                                          ("TIMER_DELIVER_MS\x011\x02", sendpath.SEND_PROPS),
                                          ("TAGS\x01t\x02TIMER_DELAY_SEC\x013\x02", sendpath.SEND_PROPS),
                                          ("TIMER_DELAY_MS\x013\x02", sendpath.SEND_PROPS),
                                          ("UNIQ_KEY\x01\x02", sendpath.SEND_PROPS),
                                          ("UNIQ_KEY\x01a\x02UNIQ_KEY\x01b\x02", sendpath.SEND_PROPS),
                                          ("TAGS\x01t", sendpath.SEND_PROPS),
                                          ("TAGS\x01t\x02", sendpath.SEND_OK)])
def test_properties_the_general_path_must_see_are_declined(props, status):
    fields = {"a": "pg", "b": "TopicA", "c": "TBW102", "d": "4", "e": "1", "f": "0", "g": "1", "h": "0",
              "i": props}
    header = encode_command(RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, fields, opaque=9))[8:]
    assert check_against_general(header, b"", False) == status


@pytest.mark.parametrize("header", [
    b'{"code":310,"extFields":{"a":"pg","b":"T","c":"T","d":"1","e":"1","f":"0","g":"1","h":"0","m":"true"},'
    b'"opaque":1}',  # a batch
    b'{"code":310,"extFields":{"a":"pg","b":"T","c":"T","d":"1","e":"-1","f":"0","g":"1","h":"0"},"opaque":1}',
    b'{"code":310,"extFields":{"a":"pg","b":"T","c":"T","d":"1","e":"1","f":"0","g":"1","h":"0","e":"2"},'
    b'"opaque":1}',  # a duplicate field
    b'{"code":310,"extFields":{"a":"pg","b":"T","c":"T","d":"1","e":"1","f":"0","g":"1","h":"0"},"opaque":1,'
    b'"flag":1}',  # a response
    b'{"code":310,"extFields":{"a":"pg","b":"\\ud800","c":"T","d":"1","e":"1","f":"0","g":"1","h":"0"},'
    b'"opaque":1}',  # a lone surrogate
    b'{"code":310,"extFields":{"a":"pg","b":"T","c":"T","d":"1","e":"1","f":"0","g":"1","h":"0"}}',  # no opaque
    b'{"code":310,"extFields":{"a":"pg","b":"T","c":"T","d":"1","e":"1","f":"0","g":"1","h":"0"},"opaque":1} x',
])
def test_unusual_requests_are_declined(header):
    assert check_against_general(header, b"", False) != sendpath.SEND_OK


# --- the answers ------------------------------------------------------------------------

@given(opaque=st.integers(-(2**31), 2**31 - 1), queue_id=st.integers(0, 2**31 - 1),
       queue_offset=st.integers(0, 2**63 - 1), phy=st.integers(0, 2**63 - 1),
       uniq=st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20),
       v6=st.booleans())
def test_answers_equal_the_general_path(opaque, queue_id, queue_offset, phy, uniq, v6):
    from array import array
    proc, _ = _general_processor()
    store = M.HostAddr("fe80::7" if v6 else "10.0.0.7", 10911)
    u = uniq.encode()
    frames, offs = sendpath.encode_send_responses(
        array("i", [opaque]), array("i", [queue_id]), array("q", [queue_offset]), array("q", [phy]), b"xx" + u,
        array("q", [2]), array("i", [len(u)]), store.packed, CURRENT_VERSION)
    request = RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=opaque)
    want = encode_response(request, ResponseCode.SUCCESS, None,
                           proc._reply_fields(queue_id, [offset_msg_id(store, phy)], queue_offset, uniq))
    assert frames == want and list(offs) == [0]


# --- the decoder: the same commands either way, whatever the chunks ------------------------

@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])  # (generation slows on a busy machine)
@given(headers=st.lists(send_headers(), min_size=1, max_size=6), data=st.data())
def test_decoder_hands_out_the_same_requests_with_raw_sends(headers, data):
    other = encode_command(RemotingCommand.create_request(RequestCode.HEART_BEAT, {"x": "1"}, body=b"hb",
                                                          opaque=5))
    stream = b"".join(_frame(h, b"body%d" % i) if i % 3 else other + _frame(h, b"b") for i, h in
                      enumerate(headers))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=4)))

    def drain(raw):
        dec, out = CommandDecoder(raw_sends=raw), []
        for a, b in zip([0, *cuts], [*cuts, len(stream)]):
            if a == b:
                continue  # (b"" would mean the end of the stream)
            dec.receive_data(stream[a:b])
            while True:
                try:
                    cmd = dec.next_command()
                except RemoteProtocolError as e:
                    return out, str(e)
                if isinstance(cmd, SendRun):  # a run of plain sends: the same commands, in order
                    out.extend(one.command() for one in cmd.sends())
                    continue
                if not isinstance(cmd, RemotingCommand):
                    break
                out.append(cmd)
        return out, None

    assert drain(True) == drain(False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["A", "B", "TopicA", "TopicB", "t%d", "caf\u00e9", "x", "y", "z", "w", "v"]),
                min_size=1, max_size=40), st.data())
def test_topic_first_names_the_first_request_with_the_same_topic(names, data):
    """The scanner's topic_first (the send path checks a topic once per
    scan by it) points at the first request with exactly the same topic
    bytes -- whatever JSON spelling each header used -- for the first 8
    distinct topics, and at the request itself after that."""
    frames = []
    for i, name in enumerate(names):
        fields = {"a": "pg", "b": name, "c": "TBW102", "d": "4", "e": "1", "f": "0", "g": "1", "h": "0",
                  "i": "TAGS\x01t\x02", "j": "0", "k": "false", "m": "false"}
        rest = _json(data.draw, {"extFields": fields, "flag": 0, "language": "JAVA", "opaque": i,
                                 "serializeTypeCurrentRPC": "JSON", "version": 399})
        frames.append(_frame(('{"code":310,' + rest.lstrip()[1:]).encode(), b"b"))
    scan = sendpath.scan_requests(bytearray(b"".join(frames)), 0, 1 << 24)
    assert scan.n == len(names)
    distinct: list[str] = []
    for i, name in enumerate(names):
        r = scan.reqs[i]
        assert r.status == sendpath.SEND_OK and scan.topic(i) == name.encode()
        if name not in distinct:
            distinct.append(name)
        if distinct.index(name) < 8:
            assert r.topic_first == names.index(name)
        else:
            assert r.topic_first == i


def test_scan_stops_before_frames_the_decoder_must_judge():
    good = _frame(b'{"code":310}', b"")
    for bad in (struct.pack(">ii", 2, 0), struct.pack(">ii", 10, 20) + b"x" * 10, struct.pack(">ii", 4, 9 << 24),
                good[:-1]):
        scan = sendpath.scan_requests(bytearray(good + good + bad), 0, 1 << 24)
        assert scan.n == 2 and scan.end == 2 * len(good)
    assert sendpath.scan_requests(bytearray(good), 0, len(good) - 1) is None  # over the size limit
    big = struct.pack(">ii", 1 << 20, 12) + b"x" * 100  # a large frame still arriving: no scan
    assert sendpath.scan_requests(bytearray(big), 0, 1 << 24) is None


# --- end to end on a real group ---------------------------------------------------------

class _Conn:
    remote_address = BORN


def _raw(cmds: list[RemotingCommand]) -> list:
    dec = CommandDecoder(raw_sends=True)
    dec.receive_data(b"".join(encode_command(c.as_request(c.opaque, c.is_oneway)) for c in cmds))
    out = []
    while isinstance(cmd := dec.next_command(), (RemotingCommand, SendRun)):
        out.append(cmd)
    return out


def _v2(topic="TopicA", body=b"hello", *, queue_id=1, props="TAGS\x01t\x02", opaque=1, flag=0, **extra):
    fields = {"a": "pg", "b": topic, "c": "TBW102", "d": "4", "e": str(queue_id), "f": "0",
              "g": "1700000000000", "h": "0", "i": props, "j": "0", "k": "false", "m": "false", **extra}
    return RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, fields, body=body, opaque=opaque, flag=flag)


def _decode_answer(reply, request) -> RemotingCommand:
    if isinstance(reply, bytes):
        dec = CommandDecoder()
        dec.receive_data(reply)
        return dec.next_command()
    return reply.as_response_to(request)


def _flat(burst: list, replies: list) -> list[tuple]:
    """(request, its answer) one by one, SendRuns taken apart: a run's
    answer in one piece is split into its frames, one per request that is
    not oneway."""
    out = []
    for c, r in zip(burst, replies):
        if not isinstance(c, SendRun):
            out.append((c, r))
            continue
        ones = c.sends()
        if isinstance(r, bytes):
            dec = CommandDecoder()
            dec.receive_data(r)
            frames = []
            while isinstance(cmd := dec.next_command(), RemotingCommand):
                frames.append(cmd)
            answered = [one for one in ones if not one.is_oneway]
            assert [f.opaque for f in frames] == [one.opaque for one in answered]
            got = dict(zip(map(id, answered), frames))
            out.extend((one, got.get(id(one))) for one in ones)
        else:
            assert len(r) == len(ones)
            out.extend(zip(ones, r))
    return out


async def _serve(send: SendProcessor, burst: list) -> list[RemotingCommand]:
    """A burst as the connection serves it (no answer to a oneway request)."""
    finish = send.accept_burst(_Conn(), burst)
    replies = await finish()
    return [None if r is None or c.is_oneway else _decode_answer(r, c) for c, r in _flat(burst, replies)]


def _comparable(resp: RemotingCommand | None, leader) -> tuple | None:
    """What an answer says, the log positions aside (the two paths write
    to different places), plus the stored record it names."""
    if resp is None:
        return None
    f = dict(resp.ext_fields)
    stored = None
    if resp.code in (ResponseCode.SUCCESS, ResponseCode.FLUSH_SLAVE_TIMEOUT) and "msgId" in f:
        recs = []
        for msg_id in f.pop("msgId").split(","):
            _, phy = parse_offset_msg_id(msg_id)
            size = int.from_bytes(leader.bs.cq.engine.source.read(phy, 4), "big")
            rec = M.decode(leader.bs.cq.engine.source.read(phy, size), check_crc=True)
            assert rec.physical_offset == phy
            recs.append(rec)
        assert int(f.pop("queueOffset")) == recs[0].queue_offset  # the offset answered is the one stored
        stored = [(r.topic, r.body, r.queue_id, r.flag, r.sysflag, str(r.born_host), r.store_timestamp,
                   {k: v for k, v in r.properties.items() if k != "UNIQ_KEY"}, r.uniq_key == f.get("transactionId"))
                  for r in recs]
        f.pop("transactionId", None)
    return resp.code, resp.opaque, resp.remark, f, stored


async def test_mixed_bursts_answer_in_order_as_the_general_path(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery, maxMessageSize="1024")
        await g.start()
        leader = await g.wait_leader()
        native, general = processor(leader), processor(leader)
        # TopicA exists with 4 queues (created by a first send); TopicM filters by MULTI_TAG
        assert (await general.process(_v2(), BORN)).code == ResponseCode.SUCCESS
        from broker.common.values import TopicConfig
        await leader.bs.metadata.update_topic(TopicConfig("TopicM", 2, 2, topic_filter_type="MULTI_TAG"))
        burst = [
            _v2(opaque=10),                                               # native
            _v2(opaque=11, props="TAGS\x01t\x02UNIQ_KEY\x01MINE\x02"),    # native, its own key
            _v2(opaque=12, props="DELAY\x011\x02"),                       # declined: the schedule topic
            RemotingCommand.create_request(RequestCode.SEND_MESSAGE, {   # another code
                "producerGroup": "pg", "topic": "TopicA", "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
                "queueId": "2", "sysFlag": "0", "bornTimestamp": "1", "flag": "3", "properties": ""},
                body=b"v1", opaque=13),
            _v2(opaque=14, queue_id=99),                                   # refused: no such queue
            _v2(opaque=15, body=b"x" * 1025),                              # refused: too large
            _v2(opaque=16, topic="NewTopic"),                             # auto-created first
            _v2(opaque=17, topic="TBW102"),                               # forbidden
            _v2(opaque=18, flag=2),                                       # oneway: stored, not answered
            _v2(opaque=19, topic="TopicM", queue_id=0, f="1"),            # MULTI_TAG, compressed bit kept
            _v2(opaque=20, props="K\x01" + "v" * 40000 + "\x02"),          # properties too long
            _v2(opaque=21, e="01"),                                       # native: plain digits
        ]
        got_native = await _serve(native, _raw(burst))
        assert sum(len(c) for c in _raw(burst) if isinstance(c, SendRun)) == 10
        assert b"TopicA" in native.native_sends.topics and not general.native_sends.topics  # each took its path
        got_general = await _serve(general, burst)
        await g.settle()
        a = [_comparable(r, leader) for r in got_native]
        b = [_comparable(r, leader) for r in got_general]
        assert a == b
        codes = [None if r is None else r.code for r in got_native]
        assert codes == [0, 0, 0, 0, ResponseCode.SYSTEM_ERROR, ResponseCode.MESSAGE_ILLEGAL, 0,
                         ResponseCode.NO_PERMISSION, None, 0, ResponseCode.MESSAGE_ILLEGAL, 0]
        assert [r.opaque for r in got_native if r is not None] == [10, 11, 12, 13, 14, 15, 16, 17, 19, 20, 21]
        assert got_native[1].ext_fields["transactionId"] == "MINE"
        assert a[9][4][0][4] & M.MULTI_TAGS_FLAG and a[9][4][0][4] & 1
        # the native answers came in one piece per message, queue offsets counting on in arrival order
        offs = [int(r.ext_fields["queueOffset"]) for r in (got_native[0], got_native[1], got_native[11])]
        assert offs[0] + 1 == offs[1] and offs[1] + 2 == offs[2]  # (the oneway in between took one)
        nursery.cancel_scope.cancel()


async def test_a_burst_at_a_follower_or_a_full_leader_is_refused_whole(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery)
        await g.start()
        leader = await g.wait_leader()
        assert (await processor(leader).process(_v2(), BORN)).code == ResponseCode.SUCCESS
        follower = next(m for m in g.alive() if m is not leader)
        await follower.bs.metadata.wait_applied(leader.bs.store.end_index)
        burst = [_v2(opaque=i) for i in range(3)]
        got = await _serve(processor(follower), _raw(burst))
        assert [(r.code, r.opaque) for r in got] == [(ResponseCode.SERVICE_NOT_AVAILABLE, i) for i in range(3)]
        assert all(f"the master is {leader.nid}" in r.remark for r in got)
        end = leader.bs.store.end_index
        leader.bs.replica.max_pending = 2
        got = await _serve(processor(leader), _raw(burst))
        assert [r.code for r in got] == [ResponseCode.SYSTEM_BUSY] * 3 and leader.bs.store.end_index == end
        nursery.cancel_scope.cancel()


async def test_a_native_burst_that_times_out_answers_with_ids(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery, maxWaitAckTimeMs="100")
        await g.start()
        leader = await g.wait_leader()
        send = processor(leader)
        assert (await send.process(_v2(), BORN)).code == ResponseCode.SUCCESS
        for m in g.alive():
            if m is not leader:
                g.net.isolate(m.nid)
        got = await _serve(send, _raw([_v2(opaque=1, body=b"one"), _v2(opaque=2, body=b"two")]))
        for r, body in zip(got, (b"one", b"two")):
            assert r.code == ResponseCode.FLUSH_SLAVE_TIMEOUT, r.remark
            _, phy = parse_offset_msg_id(r.ext_fields["msgId"])
            index = next(i for i in range(leader.bs.store.end_index, 0, -1)
                         if leader.bs.store.get(i).pos + 48 == phy)
            assert M.decode(leader.bs.store.get(index).body).body == body
        nursery.cancel_scope.cancel()


def test_uniq_keys_reserved_for_a_burst_are_the_ones_next_would_make():
    keys, one_by_one = _keys(), _keys()
    diff, first = keys.reserve(3)
    made = [one_by_one.next() for _ in range(3)]
    assert made == [keys.prefix + struct.pack(">iH", diff, first + k).hex().upper() for k in range(3)]
    assert keys.reserve(1)[1] == one_by_one.reserve(1)[1] == first + 3


def test_a_full_scratch_ends_the_scan_and_the_next_goes_on(monkeypatch):
    """The scanner's scratch is bounded: when the headers of a read do not
    fit, the scan ends before the one that does not (it is not declined)
    and the decoder's next scan takes it up; every send is still plain."""
    frames = [encode_command(_v2(opaque=i, body=b"x" * i)) for i in range(40)]
    monkeypatch.setattr(sendpath, "SCRATCH_MAX", 1000)
    scan = sendpath.scan_requests(bytearray(b"".join(frames)), 0, 1 << 24)
    assert 1 < scan.n < 40 and all(scan.reqs[i].status == sendpath.SEND_OK for i in range(scan.n))
    runs = _raw([_v2(opaque=i, body=b"x" * i) for i in range(40)])
    assert len(runs) > 1 and all(isinstance(r, SendRun) for r in runs)
    assert [s.opaque for r in runs for s in r.sends()] == list(range(40))
    assert [s.body for r in runs for s in r.sends()] == [b"x" * i for i in range(40)]
