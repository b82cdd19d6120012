# Owns the byte layout of RocketMQ remoting frames (spec §8.1-8.4) and its
# sans-IO codec: encode_command() makes one frame of a RemotingCommand;
# CommandDecoder is fed bytes and hands back commands, never touching a socket.
#
# Frame:  i32 length (bytes after this field) | i32 (serializeType << 24 |
#         headerLen) | header | body
# Header: JSON (type 0; fastjson-like: sorted keys, nulls omitted, enums by
#         name) or ROCKETMQ binary (type 1; RocketMQSerializable).
#
# Rules.  The size limit counts the whole frame with its length field (Netty's
# LengthFieldBasedFrameDecoder(16 MiB, 0, 4, 0, 4)); an oversized length is
# reported once the header behind it has arrived (so the answer carries the
# opaque), the body never buffered.  Decoding is tolerant where stock clients
# differ (client-compat #1, #2): numeric strings for ints, any scalar JSON in
# extFields, unknown languages, Java's defaults for missing fields.  Every
# refusal is a RemoteProtocolError (with the opaque when known), answered
# SYSTEM_ERROR then closed; no input raises anything else.  Limits:
#   MAX_HEADER_SIZE  1 MiB per header, refused from the frame prefix (a stock
#                    send with 32 KiB of properties stays under 200 KiB);
#   MAX_EXT_FIELDS   1024 extFields (a stock request carries under 30);
#   MAX_VALUE_DEPTH  16 levels in a non-text extFields value or remark;
#   JSON nesting     1024 (orjson refuses more, without recursion).
# The common frame (integers where they belong, text extFields values) takes
# the fast path, which checks only the count; every other check is on the
# slow path.  raw_sends=True scans each read's frames in C (native/sendpath.py):
# a plain SEND_MESSAGE_V2 comes out as a RawSend (a command.OneRequest, like a
# RemotingCommand) and consecutive ones as a SendRun, which stays inside the
# codec, the ACL fast path and the send pipeline; every other frame, and every
# send the scanner declines, is decoded exactly as without it.
import json
import re
import struct
from typing import Literal

import orjson

from broker.remoting.codes import (
    CURRENT_VERSION,
    RPC_ONEWAY,
    RPC_TYPE_RESPONSE,
    LanguageCode,
    RequestCode,
    SerializeType,
)
from broker.remoting.command import OneRequest, RemotingCommand, coerce_fields, java_text
from broker.remoting.errors import LocalProtocolError, RemoteProtocolError
from broker.remoting.jsonbound import nests_deeper_than
from commitlog.transport.framing import CLOSED, NEED_DATA, ByteStreamDecoder, FrameEvent
from native import sendpath

__all__ = ["CLOSED", "NEED_DATA", "DEFAULT_MAX_FRAME_SIZE", "MAX_EXT_FIELDS", "MAX_HEADER_SIZE", "MAX_VALUE_DEPTH",
           "CommandDecoder", "RawSend", "encode_command", "encode_header", "decode_header"]

DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024
MAX_HEADER_LEN = 0xFFFFFF  # 24 bits next to the serialize type: what the encoder can write
MAX_HEADER_SIZE = 1 << 20  # what the decoder reads (native/src/sendpath.h LMQ_MAX_HEADER_SIZE)
MAX_EXT_FIELDS = 1024  # (native/src/sendpath.h LMQ_MAX_EXT_FIELDS)
MAX_VALUE_DEPTH = 16

_I32 = struct.Struct(">i")
_PREFIX = struct.Struct(">ii")            # length, headerLenAndType
_BIN_FIXED = struct.Struct(">hbhii")      # code, language, version, opaque, flag
_I16 = struct.Struct(">h")
_INT_TEXT = re.compile(r"\s*[+-]?[0-9]{1,19}\s*")

I16 = (-(1 << 15), (1 << 15) - 1)
I32 = (-(1 << 31), (1 << 31) - 1)


def _check_range(name: str, value: int, bounds: tuple[int, int], what: str) -> None:
    if not isinstance(value, int) or not bounds[0] <= value <= bounds[1]:
        raise LocalProtocolError(f"{name}={value!r} does not fit {what}")


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise LocalProtocolError(f"{what} is not encodable as UTF-8: {e}") from None


# --- encoding ------------------------------------------------------------------

# orjson (sorted keys, no spaces, UTF-8 as is) writes the same bytes as
# json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False) in a
# fraction of the time: every response pays this.
_SORTED = orjson.OPT_SORT_KEYS


def encode_json_header(cmd: RemotingCommand) -> bytes:
    for name in ("code", "version", "opaque", "flag"):
        _check_range(name, getattr(cmd, name), I32, "a Java int")
    obj: dict[str, object] = {
        "code": cmd.code, "flag": cmd.flag, "language": cmd.language.name,
        "opaque": cmd.opaque, "serializeTypeCurrentRPC": "JSON", "version": cmd.version,
    }
    if cmd.ext_fields:
        obj["extFields"] = cmd.ext_fields
    if cmd.remark is not None:
        obj["remark"] = cmd.remark
    try:
        return orjson.dumps(obj, option=_SORTED)
    except TypeError as e:  # a lone surrogate in a text field
        raise LocalProtocolError(f"header is not encodable as UTF-8: {e}") from None


def encode_binary_header(cmd: RemotingCommand) -> bytes:
    _check_range("code", cmd.code, I16, "the i16 code of a ROCKETMQ header")
    _check_range("version", cmd.version, I16, "the i16 version of a ROCKETMQ header")
    _check_range("opaque", cmd.opaque, I32, "a Java int")
    _check_range("flag", cmd.flag, I32, "a Java int")
    out = bytearray(_BIN_FIXED.pack(cmd.code, int(cmd.language), cmd.version, cmd.opaque, cmd.flag))
    remark = _utf8(cmd.remark, "remark") if cmd.remark else b""
    out += _I32.pack(len(remark)) + remark
    ext = bytearray()
    for key, value in sorted(cmd.ext_fields.items()):
        k, v = _utf8(key, f"extFields key {key!r}"), _utf8(value, f"extFields[{key!r}]")
        if len(k) > I16[1]:
            raise LocalProtocolError(f"extFields key of {len(k)} bytes is longer than 32767")
        ext += _I16.pack(len(k)) + k + _I32.pack(len(v)) + v
    out += _I32.pack(len(ext)) + ext
    return bytes(out)


def encode_header(cmd: RemotingCommand) -> bytes:
    if cmd.serialize_type == SerializeType.ROCKETMQ:
        return encode_binary_header(cmd)
    return encode_json_header(cmd)


def encode_response(request: RemotingCommand, code: int, remark: str | None, ext_fields: dict[str, str]) -> bytes:
    """The frame answering `request` with `code` (no body), built directly:
    the same bytes as encode_command(request.make_response(code, remark,
    ext_fields)) without the intermediate commands -- the send path answers
    every message this way.  `ext_fields` values must be text already."""
    if request.serialize_type != SerializeType.JSON:
        return encode_command(request.make_response(code, remark, ext_fields))
    obj = {"code": code, "flag": RPC_TYPE_RESPONSE, "language": "JAVA", "opaque": request.opaque,
           "serializeTypeCurrentRPC": "JSON", "version": CURRENT_VERSION}
    if ext_fields:
        obj["extFields"] = ext_fields
    if remark is not None:
        obj["remark"] = remark
    try:
        header = orjson.dumps(obj, option=_SORTED)
    except TypeError as e:
        raise LocalProtocolError(f"header is not encodable as UTF-8: {e}") from None
    return _PREFIX.pack(4 + len(header), len(header)) + header


def encode_request(cmd: RemotingCommand, opaque: int, oneway: bool = False,
                   max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    """encode_command(cmd.as_request(opaque, oneway), max_frame_size) without
    the intermediate command (the same bytes): a client pays this per
    request."""
    if cmd.serialize_type != SerializeType.JSON:
        return encode_command(cmd.as_request(opaque, oneway), max_frame_size)
    code, version, flag = cmd.code, cmd.version, (cmd.flag & ~(RPC_TYPE_RESPONSE | RPC_ONEWAY)) | (
        RPC_ONEWAY if oneway else 0)
    if not (type(code) is int and type(version) is int and I32[0] <= code <= I32[1] and I32[0] <= version <= I32[1]
            and I32[0] <= opaque <= I32[1] and I32[0] <= flag <= I32[1]):
        return encode_command(cmd.as_request(opaque, oneway), max_frame_size)  # it names the bad field
    obj: dict[str, object] = {
        "code": code, "flag": flag, "language": cmd.language.name,
        "opaque": opaque, "serializeTypeCurrentRPC": "JSON", "version": version,
    }
    if cmd.ext_fields:
        obj["extFields"] = cmd.ext_fields
    if cmd.remark is not None:
        obj["remark"] = cmd.remark
    try:
        header = orjson.dumps(obj, option=_SORTED)
    except TypeError as e:  # a lone surrogate in a text field
        raise LocalProtocolError(f"header is not encodable as UTF-8: {e}") from None
    body = cmd.body
    if len(header) > MAX_HEADER_LEN:
        raise LocalProtocolError(f"header of {len(header)} bytes exceeds {MAX_HEADER_LEN}")
    total = 8 + len(header) + len(body)
    if total > max_frame_size:
        raise LocalProtocolError(f"frame of {total} bytes exceeds the maximum of {max_frame_size}")
    return b"".join((_PREFIX.pack(total - 4, len(header)), header, body))


def encode_command(cmd: RemotingCommand, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    """One complete frame.  Raises LocalProtocolError if a field does not
    fit its wire type or the frame would exceed max_frame_size."""
    header = encode_header(cmd)
    if len(header) > MAX_HEADER_LEN:
        raise LocalProtocolError(f"header of {len(header)} bytes exceeds {MAX_HEADER_LEN}")
    total = 8 + len(header) + len(cmd.body)
    if total > max_frame_size:
        raise LocalProtocolError(f"frame of {total} bytes exceeds the maximum of {max_frame_size}")
    return b"".join((_PREFIX.pack(total - 4, (int(cmd.serialize_type) << 24) | len(header)),
                     header, cmd.body))


# --- header decoding -------------------------------------------------------------

class _HeaderError(Exception):
    """Internal: a bad header; decode_header() adds the opaque if known."""


def _shown(value: object) -> str:
    """A header value for an error message: bounded, and never the repr of
    a nested value (which recurses)."""
    if type(value) is list or type(value) is dict:
        return f"a JSON {'array' if type(value) is list else 'object'} of {len(value)}"
    try:
        text = repr(value)
    except ValueError:  # an integer of more digits than repr() writes
        return "an integer of thousands of digits"
    return text if len(text) <= 64 else text[:64] + "..."


def _json_int(obj: dict, key: str, default: int, bounds: tuple[int, int] = I32) -> int:
    value = obj.get(key)
    if type(value) is int and bounds[0] <= value <= bounds[1]:
        return value  # the usual case, first: four of these per frame
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _HeaderError(f"header field {key!r} is not an integer: {_shown(value)}")
    if isinstance(value, str):
        # fastjson reads "105" into an int field; so do we.
        if not _INT_TEXT.fullmatch(value):
            raise _HeaderError(f"header field {key!r} is not an integer: {_shown(value)}")
        value = int(value)
    if not bounds[0] <= value <= bounds[1]:
        raise _HeaderError(f"header field {key!r}={_shown(value)} is out of range")
    return value


_LANGUAGES = {m.name: m for m in LanguageCode}  # (Enum's own name lookup costs more than a frame's header)


def _json_language(value: object) -> LanguageCode:
    # Unknown languages are not an error: Java decodes them to null and
    # nothing depends on the value.
    try:
        if isinstance(value, str):
            return _LANGUAGES[value]
        if isinstance(value, int) and not isinstance(value, bool):
            return LanguageCode(value)
    except (KeyError, ValueError):
        pass
    return LanguageCode.JAVA if value is None else LanguageCode.OTHER


def _parse_json_slowly(raw: bytes) -> object:
    """A header orjson refused as it came.  Java decodes malformed UTF-8 to
    U+FFFD: so do we, then parse again; json last, for what orjson refuses
    and json reads (NaN, integers over 64 bits), and to name the position
    of a syntax error.  json recurses: past the interpreter's depth it
    raises RecursionError, which is a refusal like any other."""
    text = raw.decode("utf-8", errors="replace")
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as e:
        refused = e  # (it names a nesting too deep as such)
    try:
        return json.loads(text)
    except RecursionError:
        raise _HeaderError(f"header is not valid JSON: {str(refused)[:200]}") from None
    except ValueError as e:
        raise _HeaderError(f"header is not valid JSON: {str(e)[:200]}") from None


def _value_text(name: str, value: object) -> str:
    """A non-text header value as Java's toString() gives it, refused if it
    nests deeper than MAX_VALUE_DEPTH."""
    if (type(value) is list or type(value) is dict) and nests_deeper_than(value, MAX_VALUE_DEPTH):
        raise _HeaderError(f"{name} nests arrays/objects deeper than {MAX_VALUE_DEPTH}")
    return java_text(value)


def _ext_text(ext: dict) -> dict[str, str]:
    """extFields with values that are not all text: each as text, null dropped."""
    if len(ext) > MAX_EXT_FIELDS:
        raise _HeaderError(f"{len(ext)} extFields, more than {MAX_EXT_FIELDS}")
    return {k: v if type(v) is str else _value_text(f"extFields[{k[:64]!r}]", v)
            for k, v in ext.items() if v is not None}


def _decode_json_header(raw: bytes, body: bytes, found: dict) -> RemotingCommand:
    try:
        obj = orjson.loads(raw)  # the usual case: valid UTF-8, strict JSON
    except orjson.JSONDecodeError:
        obj = _parse_json_slowly(raw)
    if not isinstance(obj, dict):
        raise _HeaderError(f"header is JSON {type(obj).__name__}, not an object")
    code, opaque, flag, ext = obj.get("code"), obj.get("opaque"), obj.get("flag"), obj.get("extFields")
    if (type(code) is int and type(opaque) is int and type(flag) is int and type(ext) is dict
            and -0x80000000 <= code <= 0x7FFFFFFF and -0x80000000 <= opaque <= 0x7FFFFFFF
            and -0x80000000 <= flag <= 0x7FFFFFFF and (n := len(ext)) <= MAX_EXT_FIELDS
            and list(map(type, ext.values())).count(str) == n):  # (every value text; cheaper than a set of types)
        # The usual frame, as every RocketMQ party writes it: the checks
        # below would pass; only version, language and remark are left.
        version, remark = obj.get("version"), obj.get("remark")
        if type(version) is int and -0x80000000 <= version <= 0x7FFFFFFF and (remark is None or type(remark) is str):
            language = obj.get("language")
            lang = _LANGUAGES.get(language) if type(language) is str else None
            return RemotingCommand.trusted(code, _json_language(language) if lang is None else lang, version,
                                           opaque, flag, remark, ext, body, SerializeType.JSON)
    found["opaque"] = opaque = _json_int(obj, "opaque", 0)
    ext = obj.get("extFields")
    if ext is not None and not isinstance(ext, dict):
        raise _HeaderError(f"extFields is JSON {type(ext).__name__}, not an object")
    remark = obj.get("remark")
    if ext is None:
        ext = {}
    elif len(ext) > MAX_EXT_FIELDS or not all(type(v) is str for v in ext.values()):
        ext = _ext_text(ext)
    # Every field below is already converted: skip RemotingCommand's converters.
    return RemotingCommand.trusted(
        _json_int(obj, "code", 0), _json_language(obj.get("language")), _json_int(obj, "version", 0),
        opaque, _json_int(obj, "flag", 0), remark if remark is None or type(remark) is str
        else _value_text("remark", remark),
        ext, body, SerializeType.JSON)  # (a decoded extFields of text values is used as is: nobody else holds it)


def _decode_binary_header(raw: bytes, body: bytes, found: dict) -> RemotingCommand:
    if len(raw) < _BIN_FIXED.size + 8:
        raise _HeaderError(f"ROCKETMQ header of {len(raw)} bytes is shorter than the "
                           f"{_BIN_FIXED.size + 8}-byte minimum")
    code, lang, version, opaque, flag = _BIN_FIXED.unpack_from(raw, 0)
    found["opaque"] = opaque
    pos = _BIN_FIXED.size

    def take(n: int, what: str) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > len(raw):
            raise _HeaderError(f"{what} length {n} runs past the {len(raw)}-byte header")
        chunk = raw[pos:pos + n]
        pos += n
        return chunk

    def take_int(fmt: struct.Struct, what: str) -> int:
        return fmt.unpack(take(fmt.size, what))[0]

    # Java decodes with new String(bytes, UTF_8): malformed bytes become U+FFFD.
    remark_len = take_int(_I32, "remark")
    remark = take(remark_len, "remark").decode("utf-8", "replace") if remark_len else None
    ext_len = take_int(_I32, "extFields")
    ext_raw = take(ext_len, "extFields")
    if pos != len(raw):
        raise _HeaderError(f"{len(raw) - pos} bytes after the extFields of a ROCKETMQ header")
    fields: dict[str, str] = {}
    epos = 0
    while epos < len(ext_raw):
        if epos + 2 > len(ext_raw):
            raise _HeaderError("extFields truncated inside a key length")
        (klen,) = _I16.unpack_from(ext_raw, epos)
        epos += 2
        if klen < 0 or epos + klen + 4 > len(ext_raw):
            raise _HeaderError(f"extFields key length {klen} runs past the map")
        key = ext_raw[epos:epos + klen].decode("utf-8", "replace")
        epos += klen
        (vlen,) = _I32.unpack_from(ext_raw, epos)
        epos += 4
        if vlen < 0 or epos + vlen > len(ext_raw):
            raise _HeaderError(f"extFields value length {vlen} runs past the map")
        fields[key] = ext_raw[epos:epos + vlen].decode("utf-8", "replace")
        epos += vlen
        if len(fields) > MAX_EXT_FIELDS:
            raise _HeaderError(f"more than {MAX_EXT_FIELDS} extFields")
    try:
        language = LanguageCode(lang)
    except ValueError:
        language = LanguageCode.OTHER
    return RemotingCommand.trusted(code, language, version, opaque, flag, remark, fields, body,
                                   SerializeType.ROCKETMQ)


def decode_header(serialize_type: int, raw: bytes, body: bytes = b"") -> RemotingCommand:
    """Header bytes (and the body) to a command; RemoteProtocolError if the
    header is malformed or over the limits above, with the opaque attached
    when it could be read.  (MAX_HEADER_SIZE is the stream decoder's: it
    refuses a longer header from the frame prefix, before reading it.)"""
    found: dict = {}
    try:
        if serialize_type == SerializeType.JSON:
            return _decode_json_header(raw, body, found)
        if serialize_type == SerializeType.ROCKETMQ:
            return _decode_binary_header(raw, body, found)
        raise _HeaderError(f"unknown serialize type {serialize_type}")
    except _HeaderError as e:
        raise RemoteProtocolError(str(e), found.get("opaque"),
                                  serialize_type if serialize_type in (0, 1) else None) from None


# --- raw sends ------------------------------------------------------------------

class RawSend(OneRequest):
    """One plain SEND_MESSAGE_V2 the native scanner parsed: frame `index`
    of `scan` (a native.sendpath.SendScan).  The send processor reads its
    fields from the scan; everything else -- the connection's bookkeeping,
    error answers, the general send path -- gets the RemotingCommand
    interface it needs, decoded from the same header on first use
    (command(); the scanner takes only headers that decode without error)."""

    __slots__ = ("scan", "index", "opaque", "flag", "_command")

    code = int(RequestCode.SEND_MESSAGE_V2)
    serialize_type = SerializeType.JSON
    is_response = False

    def __init__(self, scan, index: int, opaque: int, flag: int) -> None:
        self.scan, self.index, self.opaque, self.flag = scan, index, opaque, flag
        self._command: RemotingCommand | None = None

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & RPC_ONEWAY)

    def command(self) -> RemotingCommand:
        if self._command is None:
            self._command = decode_header(SerializeType.JSON, self.scan.header(self.index),
                                          self.scan.body(self.index))
        return self._command

    @property
    def ext_fields(self) -> dict[str, str]:
        return self.command().ext_fields

    @property
    def body(self) -> bytes:
        return self.scan.body(self.index)

    def make_response(self, code: int, remark: str | None = None, ext_fields=None,
                      body: bytes = b"") -> RemotingCommand:
        """As RemotingCommand.make_response (same opaque, JSON)."""
        return RemotingCommand.trusted(int(code), LanguageCode.JAVA, CURRENT_VERSION, self.opaque,
                                       RPC_TYPE_RESPONSE, remark, coerce_fields(ext_fields), bytes(body),
                                       SerializeType.JSON)

    def __repr__(self) -> str:
        return f"RawSend(opaque={self.opaque}, index={self.index})"


class SendRun:
    """Consecutive plain SEND_MESSAGE_V2 requests, frames [lo, hi) of one
    scan, handed out as one item so that a pipelined burst costs no Python
    object per message on its way to the send processor (which checks and
    encodes the run in C, send_native.py).  It counts as len() requests
    wherever requests are counted; whoever needs them one by one takes
    sends() (RawSends).  Its answer is either one bytes object holding
    every answer of the run back to back, or a list with one answer (or
    None) per request, as sends() lists them."""

    __slots__ = ("scan", "lo", "hi")

    code = int(RequestCode.SEND_MESSAGE_V2)
    serialize_type = SerializeType.JSON
    is_response = False

    def __init__(self, scan, lo: int, hi: int) -> None:
        self.scan, self.lo, self.hi = scan, lo, hi

    def __len__(self) -> int:
        return self.hi - self.lo

    def sends(self) -> list[RawSend]:
        return [self.send(i) for i in range(self.lo, self.hi)]

    def send(self, i: int) -> RawSend:
        """Frame i of the scan (lo <= i < hi) as a RawSend."""
        r = self.scan.reqs[i]
        return RawSend(self.scan, i, r.opaque, r.flag)

    def split(self, k: int) -> tuple["SendRun", "SendRun"]:
        """The first k requests and the rest (0 < k < len)."""
        return SendRun(self.scan, self.lo, self.lo + k), SendRun(self.scan, self.lo + k, self.hi)

    # The members every item of a read has (command.OneRequest for one request).

    @property
    def count(self) -> int:
        return self.hi - self.lo

    def one_by_one(self) -> list[RawSend]:
        return self.sends()

    def answer_all(self, code: int, remark: str | None) -> list[RemotingCommand]:
        return [one.make_response(code, remark) for one in self.sends()]

    def each_answer(self, answer) -> list | tuple:
        """A whole-run answer (bytes) is one pair with no request."""
        if type(answer) is bytes:
            return ((None, answer),)
        return list(zip(self.sends(), answer))

    def cut(self, refusals: list) -> list:
        """Positions count from the run's first request; the kept pieces
        stay runs (so they keep the native path)."""
        out: list = []
        start = self.lo
        for pos, refusal in refusals:
            i = self.lo + pos
            if i > start:
                out.append((SendRun(self.scan, start, i), None))
            out.append((self.send(i), refusal))
            start = i + 1
        if start < self.hi:
            out.append((self if start == self.lo else SendRun(self.scan, start, self.hi), None))
        return out

    def __repr__(self) -> str:
        return f"SendRun({self.lo}..{self.hi})"


def request_count(items) -> int:
    """Requests in a list of a read's items."""
    n = 0
    for item in items:
        n += item.count
    return n


# --- the stream decoder -----------------------------------------------------------

class CommandDecoder(ByteStreamDecoder):
    """Incremental decoder.  Feed with receive_data() (b"" means EOF), drain
    with next_command() until it returns NEED_DATA or CLOSED.  After a
    RemoteProtocolError the decoder stays failed: every later call raises
    the same error, because the stream has lost its frame boundaries."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, raw_sends: bool = False) -> None:
        if not 12 <= max_frame_size <= 0x7FFFFFFF:
            raise ValueError(f"max_frame_size must be in [12, 2**31), got {max_frame_size}")
        super().__init__()
        self.max_frame_size = max_frame_size
        self.raw_sends = raw_sends and sendpath.AVAILABLE
        self._scan = None  # the frames scanned at _pos and after; _scan_next is the next one's index
        self._scan_next = 0

    def next_command(self) -> RemotingCommand | SendRun | Literal[FrameEvent.NEED_DATA, FrameEvent.CLOSED]:
        if self._error is not None:
            raise self._error
        if self.raw_sends:
            scan = self._scan
            if scan is None or self._scan_next >= scan.n:
                scan = self._scan = sendpath.scan_requests(self._buf, self._pos, self.max_frame_size)
                self._scan_next = 0
            if scan is not None:
                i = self._scan_next
                end = sendpath.run_end(scan, i)
                if end > i:  # plain sends: one run
                    self._scan_next = end
                    reqs = scan.reqs
                    last = reqs[end - 1]
                    self._pos += last.frame_off + last.frame_len - reqs[i].frame_off
                    return SendRun(scan, i, end)
                self._scan_next = i + 1
                # Declined: the frame at _pos is this one; decoded below as always.
        avail = len(self._buf) - self._pos
        if avail < 8:
            if not self._eof:
                return NEED_DATA
            if avail == 0:
                return CLOSED
            self._fail(f"stream ended inside a frame prefix ({avail} of 8 bytes)")
        length, len_and_type = _PREFIX.unpack_from(self._buf, self._pos)
        if length < 4:
            self._fail(f"frame length {length} is too small (at least 4)")
        stype, header_len = (len_and_type >> 24) & 0xFF, len_and_type & 0xFFFFFF
        if header_len > length - 4 or header_len > MAX_HEADER_SIZE:
            self._fail(f"header length {header_len} exceeds the frame length {length}" if header_len > length - 4
                       else f"header of {header_len} bytes exceeds the maximum of {MAX_HEADER_SIZE}")
        if stype not in (SerializeType.JSON, SerializeType.ROCKETMQ):
            self._fail(f"unknown serialize type {stype}")
        if length + 4 > self.max_frame_size:
            return self._oversized(length, stype, header_len, avail)
        if avail < 4 + length:
            if self._eof:
                self._fail(f"stream ended inside a {length + 4}-byte frame "
                           f"({avail} bytes received)")
            return NEED_DATA
        start = self._pos + 8
        with memoryview(self._buf) as view:  # copies released before any resize
            header = bytes(view[start:start + header_len])
            body = bytes(view[start + header_len:self._pos + 4 + length])
        self._pos += 4 + length
        try:
            return decode_header(stype, header, body)
        except RemoteProtocolError as e:
            self._error = e
            raise

    def _oversized(self, length: int, stype: int, header_len: int, avail: int):
        reason = f"frame of {length + 4} bytes exceeds the maximum of {self.max_frame_size}"
        # Wait for the header (bounded: it is shorter than the limit) so the
        # error can name the opaque; never for the body.
        if 8 + header_len <= self.max_frame_size:
            if avail < 8 + header_len:
                if not self._eof:
                    return NEED_DATA
                self._fail(reason)
            header = bytes(self._buf[self._pos + 8:self._pos + 8 + header_len])
            try:
                cmd = decode_header(stype, header)
            except RemoteProtocolError as e:
                self._fail(reason, e.opaque, stype)
            self._fail(reason, cmd.opaque, stype)
        self._fail(reason)

    def _fail(self, reason: str, opaque: int | None = None, stype: int | None = None):
        self._error = RemoteProtocolError(reason, opaque, stype)
        raise self._error
