# Owns ResponseDecoder: what a client connection (client.py) reads,
# decoded a read at a time -- every complete frame of a read in one loop,
# instead of one CommandDecoder.next_command() call per frame.
#
# Rules.  It hands back the same commands (and the same RemoteProtocolErrors,
# at the same frame) as the codec's CommandDecoder over the same stream --
# tests/broker/client/test_wire.py holds it to that over a corpus.  Only the
# common frame takes the fast path (a JSON header that the fast check
# accepts); a header the check does not take is decoded by decode_header,
# and a bad frame prefix, an oversized or ROCKETMQ-serialized frame, or the
# end of the stream hands the rest of the connection to a CommandDecoder.
# It holds at most one unfinished frame (max_frame_size bytes) and one read.
import struct

import orjson

from broker.remoting.codec import (
    CLOSED,
    DEFAULT_MAX_FRAME_SIZE,
    MAX_EXT_FIELDS,
    MAX_HEADER_SIZE,
    NEED_DATA,
    CommandDecoder,
    decode_header,
)
from broker.remoting.codes import LanguageCode, SerializeType
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RemoteProtocolError

_unpack_prefix = struct.Struct(">ii").unpack_from
_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError
_trusted = RemotingCommand.trusted
_JSON = SerializeType.JSON
_LANGUAGES = {m.name: m for m in LanguageCode}


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
