# Owns the client's two per-send byte paths, kept cheap because a producer
# pays them for every message: SendRequest (a SEND_MESSAGE_V2 or
# SEND_BATCH_MESSAGE request whose JSON header is assembled from pre-encoded
# pieces instead of a dict handed to orjson per attempt) and ResponseDecoder
# (every complete frame of a read decoded in one loop, instead of one
# CommandDecoder.next_command() call per frame).
#
# Rules.  The bytes are the codec's (broker/remoting/codec.py): a
# SendRequest's frame(opaque) is byte-identical to encode_request() of its
# command(), and ResponseDecoder hands back the same commands (and the same
# RemoteProtocolErrors, at the same frame) as CommandDecoder over the same
# stream -- tests/broker/client/test_wire.py holds both to that over a
# corpus.  Anything off the common path goes to the codec itself: a header
# that orjson cannot encode (a lone surrogate) is encoded by
# encode_request, which raises as it always did; a frame the fast check
# does not take is decoded by decode_header; a bad frame prefix, an
# oversized or ROCKETMQ-serialized frame, or the end of the stream hands the
# rest of the connection to a CommandDecoder.  An rpc_hook (ACL signing)
# gets command(), a plain RemotingCommand, as before.
import struct

import orjson

from broker.remoting.codec import (
    CLOSED,
    DEFAULT_MAX_FRAME_SIZE,
    MAX_EXT_FIELDS,
    MAX_HEADER_LEN,
    MAX_HEADER_SIZE,
    NEED_DATA,
    CommandDecoder,
    decode_header,
    encode_request,
)
from broker.remoting.codes import CURRENT_VERSION, LanguageCode, RequestCode, SerializeType
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import LocalProtocolError, RemoteProtocolError

_PREFIX = struct.Struct(">ii")
_pack_prefix = _PREFIX.pack
_unpack_prefix = _PREFIX.unpack_from
_dumps = orjson.dumps
_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError
_trusted = RemotingCommand.trusted
_JSON = SerializeType.JSON
_PYTHON = LanguageCode.PYTHON
_LANGUAGES = {m.name: m for m in LanguageCode}

# After the extFields, in the key order orjson's OPT_SORT_KEYS writes:
# flag (0: a request, not oneway), language, then the opaque; what follows
# the opaque is the same for every request.
_BEFORE_OPAQUE = b'},"flag":0,"language":"PYTHON","opaque":'
_AFTER_OPAQUE = b',"serializeTypeCurrentRPC":"JSON","version":%d}' % CURRENT_VERSION
_AUTO_CREATE_TOPIC_KEY = "TBW102"
_PRE: dict[tuple, bytes] = {}  # (group, topic, queue nums) -> the header's first fields, encoded


class SendRequest:
    """A producer's send request (SendMessageRequestHeaderV2's short field
    names, spec §1.9) for one message or one batch.  Built once per send;
    for_queue() addresses it to a queue before each attempt (an attempt is
    encoded, or handed to the rpc_hook, before the next one readdresses
    it), frame(opaque) encodes it.  The transport takes it wherever it takes
    a RemotingCommand; command() is that command."""

    __slots__ = ("code", "body", "_values", "_pre", "_mid", "_head", "_broker")

    def __init__(self, code: int, group: str, topic: str, queue_nums: int, sysflag: int, born_ms: int, flag: int,
                 props: str, batch: bool, body: bytes) -> None:
        self.code = code
        self.body = body
        self._values = (group, topic, queue_nums, sysflag, born_ms, flag, props, batch)
        self._head: bytes | None = None
        self._broker: tuple[int, str] | None = None
        try:
            # a b c d | e | f g h i j k m | n, as sorted keys come out.
            pre = _PRE.get((group, topic, queue_nums))
            if pre is None:
                if len(_PRE) > 1024:
                    _PRE.clear()
                pre = _PRE[group, topic, queue_nums] = b'"a":%b,"b":%b,"c":"TBW102","d":%b,' % (
                    _dumps(group), _dumps(topic), _dumps(str(queue_nums)))
            self._pre = pre
            self._mid = b'"f":%b,"g":"%d","h":%b,"i":%b,"j":"0","k":"false","m":"%b",' % (
                b'"%d"' % sysflag if type(sysflag) is int else _dumps(str(sysflag)), born_ms,
                b'"%d"' % flag if type(flag) is int else _dumps(str(flag)), _dumps(props),
                b"true" if batch else b"false")
        except TypeError:  # a lone surrogate: encode_request says so when the attempt is encoded
            self._pre = self._mid = None

    def for_queue(self, queue_id: int, broker_name: str, code: int) -> "SendRequest":
        self.code = code
        self._broker = (queue_id, broker_name)
        if self._pre is not None:
            try:
                self._head = b'{"code":%d,"extFields":{%b"e":"%d",%b"n":%b' % (
                    code, self._pre, queue_id, self._mid, _dumps(broker_name))
            except TypeError:
                self._head = None
        return self

    def fields(self) -> dict[str, str]:
        group, topic, d, f, g, h, i, batch = self._values
        fields = {"a": group, "b": topic, "c": _AUTO_CREATE_TOPIC_KEY, "d": str(d), "e": "-1", "f": str(f),
                  "g": str(g), "h": str(h), "i": i, "j": "0", "k": "false", "m": "true" if batch else "false"}
        if self._broker is not None:
            fields["e"], fields["n"] = str(self._broker[0]), self._broker[1]
        return fields

    def command(self) -> RemotingCommand:
        """The same request as a RemotingCommand (what an rpc_hook rewrites)."""
        return _trusted(int(self.code), _PYTHON, CURRENT_VERSION, 0, 0, None, self.fields(), self.body, _JSON)

    def frame(self, opaque: int, oneway: bool = False, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
        """encode_request(self.command(), opaque, oneway, max_frame_size)."""
        head = self._head
        if head is None or oneway or not 0 <= opaque <= 0x7FFFFFFF:
            return encode_request(self.command(), opaque, oneway, max_frame_size)
        op = b"%d" % opaque
        header_len = len(head) + len(_BEFORE_OPAQUE) + len(op) + len(_AFTER_OPAQUE)
        total = 8 + header_len + len(self.body)
        if header_len > MAX_HEADER_LEN or total > max_frame_size:
            return encode_request(self.command(), opaque, oneway, max_frame_size)  # (it raises, naming the limit)
        return b"".join((_pack_prefix(total - 4, header_len), head, _BEFORE_OPAQUE, op, _AFTER_OPAQUE, self.body))

    def __repr__(self) -> str:
        return f"SendRequest({RequestCode(self.code).name}, {self._values[1]!r}, queue={self._broker})"


class ResponseDecoder:
    """What a client connection reads, decoded a read at a time: feed(data)
    (b"" at the end of the stream) returns the commands completed by it, in
    order.  After the last good command of a bad stream, `error` holds the
    RemoteProtocolError CommandDecoder would have raised there; `closed`
    says the stream ended cleanly between frames."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if not 12 <= max_frame_size <= 0x7FFFFFFF:
            raise ValueError(f"max_frame_size must be in [12, 2**31), got {max_frame_size}")
        self.max_frame_size = max_frame_size
        self.error: RemoteProtocolError | None = None
        self.closed = False
        self._rest = b""  # the start of the next frame
        self._parts: list[bytes] | None = None  # a large frame's pieces, joined once it is whole
        self._have = 0
        self._need = 0
        self._slow: CommandDecoder | None = None  # the rest of the stream, once it left the common path

    def feed(self, data: bytes) -> list:
        if self._slow is not None:
            return self._drain_slow(data)
        if not data:
            rest = b"".join(self._parts) if self._parts is not None else self._rest
            if not rest:
                self.closed = True
                return []
            return self._to_slow(rest, b"")  # a frame cut short: the codec's error
        if self._parts is not None:
            self._parts.append(data)
            self._have += len(data)
            if self._have < self._need:
                return []
            buf = b"".join(self._parts)
            self._parts = None
        else:
            buf = self._rest + data if self._rest else data
        out: list = []
        pos, n, limit = 0, len(buf), self.max_frame_size
        while n - pos >= 8:
            length, len_and_type = _unpack_prefix(buf, pos)
            header_len = len_and_type & 0xFFFFFF
            if (len_and_type >> 24 or length < 4 or header_len > length - 4 or header_len > MAX_HEADER_SIZE
                    or length + 4 > limit):
                out += self._to_slow(buf[pos:], None)  # not JSON, malformed or oversized: the codec's way
                return out
            end = pos + 4 + length
            if end > n:
                break
            start = pos + 8
            hend = start + header_len
            header = buf[start:hend]
            body = buf[hend:end] if hend < end else b""
            pos = end
            try:
                obj = _loads(header)
            except _JSONDecodeError:
                obj = None
            if type(obj) is dict:
                code, opaque, flag, ext = obj.get("code"), obj.get("opaque"), obj.get("flag"), obj.get("extFields")
                version, remark, language = obj.get("version"), obj.get("remark"), obj.get("language")
                # codec._decode_json_header's fast check, the same tests in the same terms
                if (type(code) is int and type(opaque) is int and type(flag) is int and type(ext) is dict
                        and -0x80000000 <= code <= 0x7FFFFFFF and -0x80000000 <= opaque <= 0x7FFFFFFF
                        and -0x80000000 <= flag <= 0x7FFFFFFF and (k := len(ext)) <= MAX_EXT_FIELDS
                        and list(map(type, ext.values())).count(str) == k
                        and type(version) is int and -0x80000000 <= version <= 0x7FFFFFFF
                        and (remark is None or type(remark) is str)
                        and type(language) is str and (lang := _LANGUAGES.get(language)) is not None):
                    out.append(_trusted(code, lang, version, opaque, flag, remark, ext, body, _JSON))
                    continue
            try:
                out.append(decode_header(SerializeType.JSON, header, body))
            except RemoteProtocolError as e:
                self.error = e
                self._slow = CommandDecoder(limit)
                self._slow._error = e  # (stays failed, as CommandDecoder does)
                return out
        if pos < n:
            rest = buf[pos:] if pos else buf
            if n - pos >= 8:
                need = 4 + _unpack_prefix(buf, pos)[0]
                if need > 4 * len(rest):  # a large frame: collect its pieces, join them once
                    self._parts, self._have, self._need, self._rest = [rest], len(rest), need, b""
                    return out
            self._rest = rest
        else:
            self._rest = b""
        return out

    def _to_slow(self, rest: bytes, eof: bytes | None) -> list:
        self._rest, self._parts = b"", None
        self._slow = CommandDecoder(self.max_frame_size)
        out = self._drain_slow(rest)
        if eof is not None and self.error is None:
            out += self._drain_slow(eof)
        return out

    def _drain_slow(self, data: bytes) -> list:
        slow = self._slow
        out: list = []
        try:
            slow.receive_data(data)
            while True:
                cmd = slow.next_command()
                if cmd is NEED_DATA:
                    return out
                if cmd is CLOSED:
                    self.closed = True
                    return out
                out.append(cmd)
        except RemoteProtocolError as e:
            self.error = e
            return out


__all__ = ["LocalProtocolError", "ResponseDecoder", "SendRequest"]
