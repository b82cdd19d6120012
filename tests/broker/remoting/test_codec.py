# Tests of broker/remoting/codec.py and command.py without any I/O: the
# spec §8 golden frames byte for byte, what stock clients send
# (client-compat #1, #2, #6), hypothesis round trips of both header types
# through arbitrary split points, malformed and oversized frames, and a
# fuzzer that feeds random and mutated bytes (only commands or
# RemoteProtocolError may come out).
import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.remoting.codec import CLOSED, NEED_DATA, CommandDecoder, decode_header, encode_command, encode_request
from broker.remoting.codes import RPC_ONEWAY, RPC_TYPE_RESPONSE, LanguageCode, RequestCode, ResponseCode, SerializeType
from broker.remoting.command import RemotingCommand, java_text
from broker.remoting.errors import LocalProtocolError, RemoteProtocolError

GOLDEN_JSON_HEADER = (b'{"code":105,"extFields":{"topic":"T"},"flag":0,"language":"JAVA","opaque":1,'
                      b'"serializeTypeCurrentRPC":"JSON","version":479}')
GOLDEN_BINARY = bytes.fromhex("00000025 01000021 0069 00 01df 00000001 00000000 00000000 0000000c "
                              "0005 746f706963 00000001 54")
ROUTE_REQUEST = RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": "T"},
                                opaque=1, version=479)


def frame(header: bytes, body: bytes = b"", stype: int = 0, length: int | None = None) -> bytes:
    n = 4 + len(header) + len(body) if length is None else length
    return struct.pack(">ii", n, (stype << 24) | len(header)) + header + body


def decode_all(data: bytes, max_frame_size: int = 16 * 1024 * 1024, eof: bool = True):
    dec = CommandDecoder(max_frame_size)
    dec.receive_data(data)
    if eof:
        dec.receive_data(b"")
    out = []
    while (cmd := dec.next_command()) not in (NEED_DATA, CLOSED):
        out.append(cmd)
    return out, cmd


# --- golden frames -------------------------------------------------------------------

def test_golden_json_frame_is_byte_exact():
    assert len(GOLDEN_JSON_HEADER) == 123
    encoded = encode_command(ROUTE_REQUEST)
    assert encoded[:8] == bytes.fromhex("0000007f0000007b")
    assert encoded == frame(GOLDEN_JSON_HEADER)
    [cmd], end = decode_all(encoded)
    assert cmd == ROUTE_REQUEST and end is CLOSED


def test_golden_binary_frame_is_byte_exact():
    cmd = RemotingCommand(105, ext_fields={"topic": "T"}, opaque=1, version=479,
                          serialize_type=SerializeType.ROCKETMQ)
    assert encode_command(cmd) == GOLDEN_BINARY
    [decoded], _ = decode_all(GOLDEN_BINARY)
    assert decoded == cmd
    assert decoded.language is LanguageCode.JAVA and decoded.remark is None


def test_body_follows_header_and_flags():
    resp = ROUTE_REQUEST.make_response(ResponseCode.TOPIC_NOT_EXIST, "no route", body=b"\x00\x01")
    assert resp.is_response and not resp.is_oneway and resp.opaque == 1
    data = encode_command(resp)
    assert data.endswith(b"\x00\x01")
    [back], _ = decode_all(data)
    assert back == resp and back.remark == "no route" and back.flag == RPC_TYPE_RESPONSE
    oneway = ROUTE_REQUEST.as_request(7, oneway=True)
    assert oneway.is_oneway and not oneway.is_response and oneway.flag == RPC_ONEWAY


def test_response_uses_the_serialization_of_the_request():
    binary_req = RemotingCommand(105, opaque=9, serialize_type=SerializeType.ROCKETMQ)
    assert binary_req.make_response().serialize_type == SerializeType.ROCKETMQ
    # A handler that built its response from scratch is fixed up too.
    fixed = RemotingCommand(0, opaque=1234).as_response_to(binary_req)
    assert (fixed.opaque, fixed.serialize_type, fixed.is_response) == (9, SerializeType.ROCKETMQ, True)


# --- what stock clients send ---------------------------------------------------------

def test_cpp_client_header_with_mixed_value_types():
    # rocketmq-client-cpp style: no serializeTypeCurrentRPC, numbers and
    # booleans among extFields, empty AccessKey/OnsChannel/Signature.
    header = json.dumps({
        "code": 310, "language": "CPP", "version": 333, "opaque": 42, "flag": 0,
        "extFields": {"a": "pg", "b": "T", "d": 4, "e": -1, "k": False, "g": 1712345678901,
                      "AccessKey": "", "OnsChannel": "ALIYUN", "Signature": "", "x": None, "f": 1.5},
    }).encode()
    [cmd], _ = decode_all(frame(header, b"hello"))
    assert cmd.code == 310 and cmd.language is LanguageCode.CPP and cmd.version == 333
    assert cmd.ext_fields == {"a": "pg", "b": "T", "d": "4", "e": "-1", "k": "false", "g": "1712345678901",
                              "AccessKey": "", "OnsChannel": "ALIYUN", "Signature": "", "f": "1.5"}
    assert cmd.body == b"hello" and cmd.serialize_type == SerializeType.JSON


def test_tolerated_header_variants():
    # Numeric strings for ints (fastjson reads them), language as ordinal or
    # an unknown name, missing fields with Java's defaults, unknown keys.
    header = b'{"code":"34","language":9,"opaque":"5","extFields":null,"whatever":[1]}'
    [cmd], _ = decode_all(frame(header))
    assert (cmd.code, cmd.language, cmd.opaque, cmd.flag, cmd.ext_fields) == (34, LanguageCode.GO, 5, 0, {})
    [cmd], _ = decode_all(frame(b'{"code":11,"language":"KOTLIN"}'))
    assert cmd.language is LanguageCode.OTHER
    [cmd], _ = decode_all(frame(b'{}'))
    assert (cmd.code, cmd.language) == (0, LanguageCode.JAVA)


def test_java_text_coercion():
    assert [java_text(v) for v in (True, False, 7, "x", 2.5, [1, "a"], {"b": 1}, LanguageCode.CPP)] == \
        ["true", "false", "7", "x", "2.5", '[1,"a"]', '{"b":1}', "CPP"]
    cmd = RemotingCommand(0, ext_fields={"n": 3, "b": True, "gone": None})
    assert cmd.ext_fields == {"n": "3", "b": "true"}


# --- round trips -------------------------------------------------------------------------

_i32 = st.integers(-(1 << 31), (1 << 31) - 1)
_i16 = st.integers(-(1 << 15), (1 << 15) - 1)
_text = st.text(max_size=20)


@st.composite
def commands(draw, stype: SerializeType):
    binary = stype == SerializeType.ROCKETMQ
    return RemotingCommand(
        code=draw(_i16 if binary else _i32),
        language=draw(st.sampled_from(LanguageCode)),
        version=draw(_i16 if binary else _i32),
        opaque=draw(_i32), flag=draw(_i32),
        # ROCKETMQ cannot tell an empty remark from none (length 0 = null).
        remark=draw(st.none() | (st.text(min_size=1, max_size=30) if binary else _text)),
        ext_fields=draw(st.dictionaries(_text, _text, max_size=6)),
        body=draw(st.binary(max_size=64)),
        serialize_type=stype)


@given(st.data())
@settings(deadline=None)  # other test runs share the machine
def test_round_trip_both_header_types(data):
    stype = data.draw(st.sampled_from(SerializeType))
    cmd = data.draw(commands(stype))
    [back], end = decode_all(encode_command(cmd))
    assert back == cmd and end is CLOSED


@given(st.data(), st.booleans())
@settings(deadline=None)
def test_encode_request_is_encode_command_of_as_request(data, oneway):
    # The clients' shortcut writes the very bytes of the general path.
    cmd = data.draw(commands(data.draw(st.sampled_from(SerializeType))))
    opaque = data.draw(_i32)
    assert encode_request(cmd, opaque, oneway) == encode_command(cmd.as_request(opaque, oneway))


def test_header_fast_path_leaves_odd_values_to_the_general_rules():
    # Headers with extFields take decode's fast path only when every value
    # is of the usual type; these must decode as the general rules say.
    cases = [
        (b'{"code":11,"extFields":{"a":"1"},"flag":0,"language":"KOTLIN","opaque":3,"version":1}',
         (11, LanguageCode.OTHER, 1, 3, 0, None, {"a": "1"})),
        (b'{"code":11,"extFields":{"a":"1"},"flag":0,"language":[1],"opaque":3,"version":1}',
         (11, LanguageCode.OTHER, 1, 3, 0, None, {"a": "1"})),
        (b'{"code":11,"extFields":{"a":"1"},"flag":0,"language":"GO","opaque":3,"remark":5,"version":1}',
         (11, LanguageCode.GO, 1, 3, 0, "5", {"a": "1"})),
        (b'{"code":"11","extFields":{"a":2,"b":null},"flag":0,"opaque":3}',
         (11, LanguageCode.JAVA, 0, 3, 0, None, {"a": "2"})),
        (b'{"code":11,"extFields":{"a":"x"},"flag":1,"language":"JAVA","opaque":3,"version":true}', None),
    ]
    for header, want in cases:
        if want is None:
            with pytest.raises(RemoteProtocolError, match="version"):
                decode_header(0, header)
            continue
        cmd = decode_header(0, header)
        assert (cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag, cmd.remark, cmd.ext_fields) == want


@given(st.lists(st.sampled_from(SerializeType), min_size=1, max_size=5).flatmap(
    lambda types: st.tuples(*[commands(t) for t in types])), st.data())
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_round_trip_through_arbitrary_split_points(cmds, data):
    stream = b"".join(encode_command(c) for c in cmds)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    dec = CommandDecoder()
    out, prev = [], 0
    for cut in cuts + [len(stream)]:
        if cut == prev:
            continue  # b"" would mean EOF
        dec.receive_data(stream[prev:cut])
        prev = cut
        while (cmd := dec.next_command()) is not NEED_DATA:
            out.append(cmd)
    dec.receive_data(b"")
    assert dec.next_command() is CLOSED
    assert out == list(cmds) and dec.buffered == 0


# --- malformed input ----------------------------------------------------------------------

@pytest.mark.parametrize("data, reason", [
    (struct.pack(">ii", 3, 0), "too small"),
    (struct.pack(">ii", -5, 0), "too small"),
    (struct.pack(">ii", 10, 20) + b"x" * 10, "header length 20 exceeds"),
    (struct.pack(">ii", 8, (7 << 24) | 4) + b"abcd", "unknown serialize type 7"),
    (frame(b"{not json"), "not valid JSON"),
    (frame(b"[1,2]"), "JSON list, not an object"),
    (frame(b'{"code":105,"extFields":[1]}'), "extFields is JSON list"),
    (frame(b"\xff\xfe\x00"), "not valid JSON"),
    (frame(b"[" * 100000), "not valid JSON"),
    (frame(b"\x00\x69\x00", stype=1), "shorter than"),
    (frame(GOLDEN_BINARY[8:] + b"zz", stype=1), "bytes after the extFields"),
])
def test_malformed_frames_raise_remote_protocol_error(data, reason):
    with pytest.raises(RemoteProtocolError, match=reason):
        decode_all(data)


def test_errors_carry_the_opaque_when_it_could_be_read():
    with pytest.raises(RemoteProtocolError) as e:
        decode_all(frame(b'{"code":"abc","opaque":77}'))
    assert e.value.opaque == 77 and e.value.serialize_type == SerializeType.JSON
    # ROCKETMQ header whose extFields length lies: the opaque is before it.
    bad = bytearray(GOLDEN_BINARY[8:])
    bad[17:21] = struct.pack(">i", 1000)  # after code..flag (13) and remarkLen (4)
    with pytest.raises(RemoteProtocolError, match="extFields length 1000") as e:
        decode_all(frame(bytes(bad), stype=1))
    assert e.value.opaque == 1 and e.value.serialize_type == SerializeType.ROCKETMQ
    with pytest.raises(RemoteProtocolError) as e:
        decode_all(frame(b"{bad"))
    assert e.value.opaque is None


def test_truncated_stream_is_an_error_only_at_eof():
    data = encode_command(ROUTE_REQUEST)
    for cut in (3, 8, len(data) - 1):
        out, end = decode_all(data[:cut], eof=False)
        assert out == [] and end is NEED_DATA
        with pytest.raises(RemoteProtocolError, match="stream ended"):
            decode_all(data[:cut])


def test_decoder_stays_failed_after_an_error():
    dec = CommandDecoder()
    dec.receive_data(struct.pack(">ii", 1, 0))
    with pytest.raises(RemoteProtocolError) as first:
        dec.next_command()
    with pytest.raises(RemoteProtocolError) as again:
        dec.receive_data(encode_command(ROUTE_REQUEST))
    assert again.value is first.value
    with pytest.raises(RemoteProtocolError):
        dec.next_command()


def test_oversized_frame_reports_the_opaque_without_buffering_the_body():
    limit = 1024
    big = RemotingCommand(10, opaque=31, body=b"x" * 5000)
    data = encode_command(big)
    dec = CommandDecoder(limit)
    dec.receive_data(data[:60])  # the prefix and part of the header only
    assert dec.next_command() is NEED_DATA
    dec.receive_data(data[60:400])
    with pytest.raises(RemoteProtocolError, match="exceeds the maximum of 1024") as e:
        dec.next_command()
    assert e.value.opaque == 31
    # A huge length with a header that cannot be inside the limit: at once.
    dec = CommandDecoder(limit)
    dec.receive_data(struct.pack(">ii", 0x7FFFFFF0, 0x00FFFFF0))
    with pytest.raises(RemoteProtocolError, match="exceeds the maximum") as e:
        dec.next_command()
    assert e.value.opaque is None
    # Exactly at the limit is fine.
    fits = RemotingCommand(10, body=b"y" * (limit - 8 - len(encode_command(RemotingCommand(10))) + 8))
    assert len(encode_command(fits)) == limit
    [back], _ = decode_all(encode_command(fits), max_frame_size=limit)
    assert back == fits


# --- local errors --------------------------------------------------------------------------

@pytest.mark.parametrize("cmd, reason", [
    (RemotingCommand(40000, serialize_type=SerializeType.ROCKETMQ), "i16 code"),
    (RemotingCommand(200050, serialize_type=SerializeType.ROCKETMQ), "i16 code"),
    (RemotingCommand(1, version=70000, serialize_type=SerializeType.ROCKETMQ), "i16 version"),
    (RemotingCommand(1, opaque=1 << 31), "Java int"),
    (RemotingCommand(1 << 31), "Java int"),
    (RemotingCommand(1, remark="\ud800"), "UTF-8"),
    (RemotingCommand(1, ext_fields={"k" * 40000: "v"}, serialize_type=SerializeType.ROCKETMQ), "32767"),
])
def test_unencodable_commands_raise_local_protocol_error(cmd, reason):
    with pytest.raises(LocalProtocolError, match=reason):
        encode_command(cmd)


def test_codes_above_i16_travel_in_json():
    cmd = RemotingCommand(200050, opaque=3)
    [back], _ = decode_all(encode_command(cmd))
    assert back.code == 200050


def test_frame_over_the_limit_is_refused_when_encoding():
    with pytest.raises(LocalProtocolError, match="exceeds the maximum of 100"):
        encode_command(RemotingCommand(10, body=b"z" * 100), max_frame_size=100)


def test_decode_header_of_unknown_type():
    with pytest.raises(RemoteProtocolError, match="unknown serialize type"):
        decode_header(5, b"{}")


# --- fuzzing -------------------------------------------------------------------------------

def _drain(dec: CommandDecoder) -> list:
    out = []
    while (cmd := dec.next_command()) not in (NEED_DATA, CLOSED):
        assert isinstance(cmd, RemotingCommand)
        out.append(cmd)
    return out


@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=6),
       st.sampled_from([16, 64, 1024, 16 * 1024 * 1024]))
@settings(max_examples=300, deadline=None)
def test_fuzz_random_bytes(data, cuts, limit):
    dec = CommandDecoder(limit)
    prev = 0
    try:
        for cut in sorted(c for c in cuts if prev < c <= len(data)) + [len(data)]:
            if cut == prev:
                continue  # b"" would mean EOF
            dec.receive_data(data[prev:cut])
            prev = cut
            _drain(dec)
        dec.receive_data(b"")
        _drain(dec)
    except RemoteProtocolError:
        pass


@given(st.data())
@settings(max_examples=300, deadline=None)
def test_fuzz_mutated_valid_frames(data):
    stype = data.draw(st.sampled_from(SerializeType))
    stream = bytearray(encode_command(data.draw(commands(stype))))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(stream) - 1))
        stream[i] = data.draw(st.integers(0, 255))
    dec = CommandDecoder(4096)
    try:
        dec.receive_data(bytes(stream))
        _drain(dec)
        dec.receive_data(b"")
        _drain(dec)
    except RemoteProtocolError:
        pass
