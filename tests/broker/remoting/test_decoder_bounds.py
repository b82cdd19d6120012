# The remoting decoder's limits (broker/remoting/codec.py): the issue's
# deep-JSON frame and everything near each bound, through the stream decoder
# with and without the C scanner in front of it.  Every refusal must be a
# RemoteProtocolError (with the opaque when the header gave one): never
# RecursionError, never another exception, never a buffer past the bound.
import json
import struct
import sys

import orjson
import pytest

from broker.remoting.codec import (
    MAX_EXT_FIELDS,
    MAX_HEADER_SIZE,
    MAX_VALUE_DEPTH,
    NEED_DATA,
    CommandDecoder,
    decode_header,
    encode_command,
)
from broker.remoting.codes import RequestCode, SerializeType
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RemoteProtocolError
from broker.remoting.jsonbound import nests_deeper_than
from native import sendpath


def frame(header: bytes, body: bytes = b"", stype: int = 0) -> bytes:
    return struct.pack(">ii", 4 + len(header) + len(body), (stype << 24) | len(header)) + header + body


def nested(depth: int, inner: str = "") -> str:
    return "[" * depth + inner + "]" * depth


def json_header(ext: str, code: int = 10, opaque: int = 7, more: str = "") -> bytes:
    return f'{{"code":{code},"opaque":{opaque},"flag":0{more},"extFields":{ext}}}'.encode()


def decoders():
    yield CommandDecoder()
    if sendpath.AVAILABLE:
        yield CommandDecoder(raw_sends=True)


def decode_stream(data: bytes, dec: CommandDecoder) -> list:
    dec.receive_data(data)
    out = []
    while (cmd := dec.next_command()) is not NEED_DATA:
        out.append(cmd)
    return out


def refused(data: bytes) -> RemoteProtocolError:
    """The error every decoder (plain, and with the C scanner) raises; the
    same reason from both."""
    errors = []
    for dec in decoders():
        with pytest.raises(RemoteProtocolError) as info:
            decode_stream(data, dec)
        errors.append(info.value)
    assert len({(e.reason, e.opaque) for e in errors}) == 1, errors
    return errors[0]


# --- the issue's frame ---------------------------------------------------------------

def test_the_issues_deep_json_frame_is_refused_with_its_opaque():
    header = json_header('{"topic":"T","x":' + nested(1000) + "}", opaque=4242)
    data = frame(header)
    assert len(data) < 2100  # the 2 KB frame of the report
    err = refused(data)
    assert err.opaque == 4242 and "deeper than 16" in err.reason
    # A value deep enough for json.dumps to overflow the interpreter's
    # stack right where the connection decodes: still a refusal.
    assert nests_deeper_than(orjson.loads(header)["extFields"]["x"], MAX_VALUE_DEPTH)


@pytest.mark.parametrize("depth", [950, 1023, 1024, 1025, 5000, 100_000])
def test_deep_values_anywhere_in_the_header_are_refused(depth):
    for ext in ('{"x":' + nested(depth) + "}", '{"x":' + "{\"a\":" * depth + "1" + "}" * depth + "}"):
        err = refused(frame(json_header(ext)))
        assert isinstance(err, RemoteProtocolError)
    # In the remark, and with a NaN that sends the parse down json's recursive path.
    refused(frame(json_header("{}", more=',"remark":' + nested(depth))))
    refused(frame(json_header('{"x":' + nested(depth, "NaN") + "}")))


def test_value_depth_limit_is_exact_and_values_keep_javas_text():
    ok = json_header('{"x":' + nested(MAX_VALUE_DEPTH, "1") + ',"n":12,"b":true,"f":1.5,"z":null}')
    [cmd] = decode_stream(frame(ok), CommandDecoder())
    assert cmd.ext_fields == {"x": nested(MAX_VALUE_DEPTH, "1"), "n": "12", "b": "true", "f": "1.5"}
    obj = "{\"a\":" * MAX_VALUE_DEPTH + "1" + "}" * MAX_VALUE_DEPTH
    [cmd] = decode_stream(frame(json_header('{"x":' + obj + "}")), CommandDecoder())
    assert json.loads(cmd.ext_fields["x"]) == json.loads(obj)
    err = refused(frame(json_header('{"x":' + nested(MAX_VALUE_DEPTH + 1) + "}")))
    assert err.opaque == 7


def test_a_bounded_value_is_decoded_even_near_the_interpreters_stack_limit():
    header = json_header('{"x":' + nested(MAX_VALUE_DEPTH) + "}")

    def at_depth(n):
        return decode_header(0, header) if n == 0 else at_depth(n - 1)

    # Leave the decoder what a broker task deep in trio and the connection leaves it.
    cmd = at_depth(sys.getrecursionlimit() - 120)
    assert cmd.ext_fields["x"] == nested(MAX_VALUE_DEPTH)


def test_fields_nobody_reads_are_not_walked():
    # An unknown key nested deep (within orjson's own bound) is ignored, as Java ignores it.
    [cmd] = decode_stream(frame(json_header('{"a":"b"}', more=',"future":' + nested(1000))), CommandDecoder())
    assert cmd.ext_fields == {"a": "b"} and cmd.opaque == 7


# --- size ------------------------------------------------------------------------------

def test_a_header_over_the_limit_is_refused_from_the_prefix():
    prefix = struct.pack(">ii", 4 + MAX_HEADER_SIZE + 1 + 10, MAX_HEADER_SIZE + 1)
    for dec in decoders():
        dec.receive_data(prefix)
        with pytest.raises(RemoteProtocolError) as info:
            dec.next_command()
        assert "exceeds the maximum" in info.value.reason and dec.buffered == len(prefix)


def test_a_header_of_exactly_the_limit_is_read():
    base = json_header("{}", more=',"remark":""')
    header = base[:-len(b',"extFields":{}}')].replace(b'"remark":""', b'"remark":"' + b"r" * (
        MAX_HEADER_SIZE - len(base)) + b'"') + b',"extFields":{}}'
    assert len(header) == MAX_HEADER_SIZE
    for dec in decoders():
        [cmd] = decode_stream(frame(header), dec)
        assert len(cmd.remark) == MAX_HEADER_SIZE - len(base)
    refused(frame(header[:-1] + b" }"))


# --- count ----------------------------------------------------------------------------

def send_header(fields: dict) -> bytes:
    cmd = RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, {
        "a": "pg", "b": "TopicA", "c": "TBW102", "d": "4", "e": "1", "f": "0", "g": "1700000000000", "h": "0",
        "i": "", **fields}, body=b"hello").as_request(opaque=99)
    return encode_command(cmd)


@pytest.mark.parametrize("stype", [SerializeType.JSON, SerializeType.ROCKETMQ])
def test_ext_field_count_limit(stype):
    def cmd_frame(n, value):
        fields = {f"k{i}": value for i in range(n)}
        return encode_command(RemotingCommand(int(RequestCode.HEART_BEAT), ext_fields=fields, opaque=5,
                                              serialize_type=stype))

    [cmd] = decode_stream(cmd_frame(MAX_EXT_FIELDS, "v"), CommandDecoder())
    assert len(cmd.ext_fields) == MAX_EXT_FIELDS
    err = refused(cmd_frame(MAX_EXT_FIELDS + 1, "v"))
    assert "extFields" in err.reason
    if stype == SerializeType.JSON:  # the slow path (a number among the values) counts too
        header = json_header("{" + ",".join(f'"k{i}":{i}' for i in range(MAX_EXT_FIELDS + 1)) + "}")
        refused(frame(header))


def test_the_c_scanner_declines_what_the_decoder_refuses_and_takes_the_rest():
    if not sendpath.AVAILABLE:
        pytest.skip("native extension not loaded (LEDGERMQ_NO_NATIVE)")
    assert sendpath.lib.LMQ_MAX_HEADER_SIZE == MAX_HEADER_SIZE
    assert sendpath.lib.LMQ_MAX_EXT_FIELDS == MAX_EXT_FIELDS
    extra = {f"x{i}": "v" for i in range(MAX_EXT_FIELDS - 9)}  # nine of a..i: exactly the limit
    ok = send_header(extra)
    [run] = decode_stream(ok, CommandDecoder(raw_sends=True))
    assert type(run).__name__ == "SendRun" and len(run) == 1
    err = refused(send_header({**extra, "y": "v"}))
    assert err.opaque == 99


@pytest.mark.parametrize("field", ["code", "opaque", "flag", "version", "language", "serializeTypeCurrentRPC"])
def test_header_fields_of_any_type_and_depth_are_refused_or_read(field):
    # Found by the live fuzzer: the error message for a nested opaque took
    # its repr, which recursed.  Every header field, as a deep value.
    for value in (nested(995), nested(40, '"x"'), '"' + "9" * 5000 + '"', "1e999", '"' + "x" * 100_000 + '"'):
        head = {"code": "10", "opaque": "7", "flag": "0", "version": "479", field: value}
        header = ("{" + ",".join(f'"{k}":{v}' for k, v in head.items()) + ',"extFields":{}}').encode()
        for dec in decoders():
            try:
                decode_stream(frame(header), dec)
            except RemoteProtocolError as e:
                assert len(e.reason) < 300
