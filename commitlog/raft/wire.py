# Owns the sans-IO byte codec of the Raft messages (messages.py): encode()
# turns a message into one compact byte string, decode() turns it back and
# raises WireError on anything malformed.  The transport frames these strings
# (length prefix etc.); nothing here does I/O or framing.
#
# Layout (big-endian):  u8 version (=1) | u8 type | u16 len + src utf-8
#                       | u16 len + dst utf-8 | i64 term | type-specific body
#   1 VoteRequest      i64 last_index, i64 last_term, u8 flags (1 pre_vote, 2 transfer)
#   2 VoteResponse     u8 result, u8 flags (1 pre_vote)
#   3 HeartbeatRequest i64 commit_index
#   4 HeartbeatResponse u16 code
#   5 PushRequest      u8 push type, i64 seq, i64 commit, i64 prev_index,
#                      i64 prev_term, u32 prev_chain_crc, u8 flags (1 batch, 2 config)
#                      [i64 first_index, u32 count, u32 runs, runs x (i64 index, i64 term),
#                       u32 raw length, raw bytes as-is]
#                      [i64 config_index, i64 config_term, u32 length, config body]
#   6 PushResponse     u8 push type, i64 seq, u16 code, i64 match, i64 begin,
#                      i64 end, i64 conflict_term, i64 conflict_index
#   7 TimeoutNow       -
import struct

from commitlog.entry import EntryBatch
from commitlog.errors import WireError
from commitlog.raft.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    Message,
    PushRequest,
    PushResponse,
    PushType,
    ResponseCode,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
    VoteResult,
)

VERSION = 1
MAX_ID_LEN = 255

_HEAD = struct.Struct(">BB")
_U16 = struct.Struct(">H")
_TERM = struct.Struct(">q")
_VOTE_REQ = struct.Struct(">qqB")
_VOTE_RESP = struct.Struct(">BB")
_HB_RESP = struct.Struct(">H")
_PUSH = struct.Struct(">BqqqqIB")
_BATCH = struct.Struct(">qII")
_RUN = struct.Struct(">qq")
_U32 = struct.Struct(">I")
_PUSH_RESP = struct.Struct(">BqHqqqqq")
_CONFIG = struct.Struct(">qqI")

_TYPE_OF = {VoteRequest: 1, VoteResponse: 2, HeartbeatRequest: 3, HeartbeatResponse: 4,
            PushRequest: 5, PushResponse: 6, TimeoutNow: 7}


def _id(s: str) -> bytes:
    b = s.encode("utf-8")
    if len(b) > MAX_ID_LEN:
        raise WireError(f"peer id longer than {MAX_ID_LEN} bytes")
    return _U16.pack(len(b)) + b


def encode(msg: Message) -> bytes:
    t = _TYPE_OF.get(type(msg))
    if t is None:
        raise WireError(f"not a raft message: {type(msg).__name__}")
    try:
        return _encode(t, msg)
    except struct.error as e:
        raise WireError(f"cannot encode {msg!r:.200}: {e}") from None


def encode_scatter(msg: Message) -> bytes | tuple:
    """encode(), except that a push carrying entries comes as a tuple of
    pieces whose concatenation is encode()'s bytes -- (the bytes before the
    entries, the entries' bytes as the log handed them, the bytes after) --
    so that a transport can write the entries without copying them into
    one payload first (Transport.send takes either)."""
    if type(msg) is PushRequest and msg.batch is not None:
        try:
            parts = _encode_parts(5, msg)
        except struct.error as e:
            raise WireError(f"cannot encode {msg!r:.200}: {e}") from None
        raw = msg.batch.raw
        at = next(i for i, part in enumerate(parts) if part is raw)
        return b"".join(parts[:at]), raw, b"".join(parts[at + 1:])
    return encode(msg)


def _encode(t: int, msg: Message) -> bytes:
    return b"".join(_encode_parts(t, msg))


def _encode_parts(t: int, msg: Message) -> list:
    parts = [_HEAD.pack(VERSION, t), _id(msg.src), _id(msg.dst), _TERM.pack(msg.term)]
    if t == 5:
        b = msg.batch
        cfg = msg.config
        parts.append(_PUSH.pack(msg.type, msg.seq, msg.commit_index, msg.prev_index, msg.prev_term,
                                msg.prev_chain_crc, (b is not None) | (bool(cfg) << 1)))
        if b is not None:
            parts.append(_BATCH.pack(b.first_index, b.count, len(b.term_runs)))
            parts.extend(_RUN.pack(i, term) for i, term in b.term_runs)
            parts.append(_U32.pack(len(b.raw)))
            parts.append(b.raw)
        if cfg:
            parts.append(_CONFIG.pack(msg.config_index, msg.config_term, len(cfg)))
            parts.append(cfg)
    elif t == 6:
        parts.append(_PUSH_RESP.pack(msg.type, msg.seq, msg.code, msg.match_index, msg.begin_index,
                                     msg.end_index, msg.conflict_term, msg.conflict_index))
    elif t == 1:
        parts.append(_VOTE_REQ.pack(msg.last_index, msg.last_term, msg.pre_vote | (msg.transfer << 1)))
    elif t == 2:
        parts.append(_VOTE_RESP.pack(msg.result, msg.pre_vote))
    elif t == 3:
        parts.append(_TERM.pack(msg.commit_index))
    elif t == 4:
        parts.append(_HB_RESP.pack(msg.code))
    return parts


class _Reader:
    __slots__ = ("buf", "off")

    def __init__(self, buf) -> None:
        self.buf = memoryview(buf)
        self.off = 0

    def take(self, st: struct.Struct, what: str) -> tuple:
        off = self.off
        if off + st.size > len(self.buf):
            raise WireError(f"truncated {what}: need {st.size} bytes at +{off}, have {len(self.buf) - off}")
        self.off = off + st.size
        return st.unpack_from(self.buf, off)

    def bytes(self, n: int, what: str) -> bytes:
        off = self.off
        if off + n > len(self.buf):
            raise WireError(f"{what} claims {n} bytes at +{off}, only {len(self.buf) - off} left")
        self.off = off + n
        return bytes(self.buf[off:off + n])

    def ident(self, what: str) -> str:
        (n,) = self.take(_U16, what)
        if n > MAX_ID_LEN:
            raise WireError(f"{what} length {n} > {MAX_ID_LEN}")
        try:
            return self.bytes(n, what).decode("utf-8")
        except UnicodeDecodeError as e:
            raise WireError(f"{what} is not utf-8") from e


def _enum(cls, value, what: str):
    try:
        return cls(value)
    except ValueError:
        raise WireError(f"unknown {what} {value}") from None


def _flags(value: int, allowed: int, what: str) -> int:
    if value & ~allowed:
        raise WireError(f"unknown {what} flags {value:#x}")
    return value


def _batch(r: _Reader) -> EntryBatch:
    first, count, nruns = r.take(_BATCH, "batch header")
    if count < 1:
        raise WireError("batch with no entries")
    if nruns < 1 or nruns > count:
        raise WireError(f"batch of {count} entries with {nruns} term runs")
    if nruns * _RUN.size > len(r.buf) - r.off:
        raise WireError(f"batch claims {nruns} term runs, more than the bytes left")
    runs = tuple(r.take(_RUN, "term run") for _ in range(nruns))
    if runs[0][0] != first:
        raise WireError(f"first term run starts at {runs[0][0]}, batch at {first}")
    last = first + count - 1
    for (a, ta), (b, tb) in zip(runs, runs[1:]):
        if not a < b <= last or not ta < tb:
            raise WireError("term runs not ascending inside the batch")
    (n,) = r.take(_U32, "raw length")
    return EntryBatch(first, count, runs, r.bytes(n, "raw entries"))


def decode(data) -> Message:
    r = _Reader(data)
    version, t = r.take(_HEAD, "message header")
    if version != VERSION:
        raise WireError(f"unknown wire version {version}")
    if not 1 <= t <= 7:
        raise WireError(f"unknown message type {t}")
    src, dst = r.ident("src"), r.ident("dst")
    (term,) = r.take(_TERM, "term")
    if t == 5:
        ptype, seq, commit, prev_index, prev_term, prev_crc, flags = r.take(_PUSH, "push")
        _flags(flags, 3, "push")
        batch = _batch(r) if flags & 1 else None
        cindex, cterm, cfg = -1, 0, b""
        if flags & 2:
            cindex, cterm, n = r.take(_CONFIG, "push configuration")
            cfg = r.bytes(n, "push configuration")
            if not cfg:
                raise WireError("push carries an empty configuration")
        msg = PushRequest(src, dst, term, _enum(PushType, ptype, "push type"), seq, commit, prev_index,
                          prev_term, prev_crc, batch, cindex, cterm, cfg)
    elif t == 6:
        ptype, seq, code, match, begin, end, cterm, cindex = r.take(_PUSH_RESP, "push response")
        msg = PushResponse(src, dst, term, _enum(PushType, ptype, "push type"), seq,
                           _enum(ResponseCode, code, "response code"), match, begin, end, cterm, cindex)
    elif t == 1:
        last_index, last_term, flags = r.take(_VOTE_REQ, "vote request")
        _flags(flags, 3, "vote request")
        msg = VoteRequest(src, dst, term, last_index, last_term, bool(flags & 1), bool(flags & 2))
    elif t == 2:
        result, flags = r.take(_VOTE_RESP, "vote response")
        _flags(flags, 1, "vote response")
        msg = VoteResponse(src, dst, term, _enum(VoteResult, result, "vote result"), bool(flags))
    elif t == 3:
        (commit,) = r.take(_TERM, "heartbeat commit index")
        msg = HeartbeatRequest(src, dst, term, commit)
    elif t == 4:
        (code,) = r.take(_HB_RESP, "heartbeat response")
        msg = HeartbeatResponse(src, dst, term, _enum(ResponseCode, code, "response code"))
    else:
        msg = TimeoutNow(src, dst, term)
    if r.off != len(r.buf):
        raise WireError(f"{len(r.buf) - r.off} trailing bytes after {type(msg).__name__}")
    return msg
