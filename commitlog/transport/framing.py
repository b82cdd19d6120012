# Owns the byte layout of peer-to-peer frames and its sans-IO codec (h11
# style: the decoder is fed bytes and hands back frames; it never touches a
# socket, so it is tested and fuzzed without any I/O).
#
# Frame (8-byte header, big-endian like everything else in the spec):
#   u16 magic 0x4C51 ("LQ") | u8 version (1) | u8 kind | u32 length | payload
#
# Kinds:
#   HELLO    (1) dialer -> acceptor, first frame of every connection.
#   HELLO_OK (2) acceptor -> dialer, handshake accepted (acceptor's own Hello).
#   REJECT   (3) either way, UTF-8 reason, sent best-effort just before close.
#   DATA     (4) an opaque message (a Raft message encoded by raft/wire.py).
#   AUTH     (5) dialer -> acceptor, the dialer's proof (peer authentication).
#
# Hello payload: u16-length-prefixed UTF-8 strings: group, src, dst, and
# optionally identity, nonce and proof (see "peer authentication" below).  Carrying dst lets the acceptor detect a dialer whose
# peer table maps the address to a different node (misconfiguration, or a
# TCP self-connect).  identity is "key=value;key=value" (sorted keys): what
# the replicas of one group must agree on for log positions to mean the same
# bytes (the log's origin, the data segment size, ...).  The transport only
# compares it (identity_mismatch); the layer above decides what goes in.
#
# Kind 0 is invalid on purpose so that zero-filled garbage fails at once.
# `length` is checked against max_frame_size as soon as the header is in, so
# a corrupt or hostile length never makes the decoder buffer gigabytes.
import enum
import hashlib
import hmac
import os
import struct
from typing import Literal

import attrs

from commitlog.transport.errors import FrameError

MAGIC = 0x4C51
VERSION = 1
HEADER = struct.Struct(">HBBI")
HEADER_SIZE = HEADER.size  # 8
DEFAULT_MAX_FRAME_SIZE = 64 * 1024 * 1024
_U16 = struct.Struct(">H")


class FrameKind(enum.IntEnum):
    HELLO = 1
    HELLO_OK = 2
    REJECT = 3
    DATA = 4
    AUTH = 5


_KINDS = frozenset(int(k) for k in FrameKind)


class FrameEvent(enum.Enum):
    NEED_DATA = "NEED_DATA"
    CLOSED = "CLOSED"

    def __repr__(self) -> str:
        return self.value


# next_frame() results besides a Frame: more bytes are needed, or the peer
# closed cleanly on a frame boundary.
NEED_DATA = FrameEvent.NEED_DATA
CLOSED = FrameEvent.CLOSED


@attrs.frozen
class Frame:
    kind: FrameKind
    payload: bytes


def frame_header(kind: FrameKind, length: int, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    if length > max_frame_size:
        raise FrameError(f"frame of {length} bytes exceeds the maximum of {max_frame_size}")
    return HEADER.pack(MAGIC, VERSION, kind, length)


def encode_frame(payload: bytes, kind: FrameKind = FrameKind.DATA,
                 max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    return frame_header(kind, len(payload), max_frame_size) + bytes(payload)


class ByteStreamDecoder:
    """The receive side every sans-IO decoder here shares: bytes fed with
    receive_data() (b"" means EOF) accumulate in _buf; _pos is the prefix
    already returned, compacted lazily on the next receive_data() so draining
    many small messages from one chunk stays linear.  After an error the
    decoder stays failed (_error is raised again), because the stream has
    lost its message boundaries.  Subclasses parse from _buf[_pos:] and
    define _fail(reason), which must set _error and raise it."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._eof = False
        self._error: Exception | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as messages."""
        return len(self._buf) - self._pos

    def receive_data(self, data: bytes) -> None:
        if self._error is not None:
            raise self._error
        if self._eof:
            if data:
                self._fail("data after end of stream")
            return
        if not data:
            self._eof = True
            return
        if self._pos:
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += data

    def _fail(self, reason: str):
        raise NotImplementedError


class FrameDecoder(ByteStreamDecoder):
    """Incremental decoder.  Feed with receive_data() (b"" means EOF), drain
    with next_frame() until it returns NEED_DATA or CLOSED.  After a
    FrameError the decoder stays failed: every later call raises the same
    error, because the stream has lost its frame boundaries."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if not 0 < max_frame_size <= 0xFFFFFFFF:
            raise ValueError(f"max_frame_size must be in (0, 2**32), got {max_frame_size}")
        super().__init__()
        self.max_frame_size = max_frame_size

    @property
    def pending_length(self) -> int | None:
        """The payload length of the frame whose header is in but whose
        payload is not all in yet (None when no header waits; meaningful
        after next_frame() returned NEED_DATA, which checked that header)."""
        if len(self._buf) - self._pos < HEADER_SIZE:
            return None
        return HEADER.unpack_from(self._buf, self._pos)[3]

    def next_frame(self) -> Frame | Literal[FrameEvent.NEED_DATA, FrameEvent.CLOSED]:
        if self._error is not None:
            raise self._error
        avail = len(self._buf) - self._pos
        if avail < HEADER_SIZE:
            if not self._eof:
                return NEED_DATA
            if avail == 0:
                return CLOSED
            self._fail(f"stream ended inside a frame header ({avail} of {HEADER_SIZE} bytes)")
        magic, version, kind, length = HEADER.unpack_from(self._buf, self._pos)
        if magic != MAGIC:
            self._fail(f"bad magic {magic:#06x} (expected {MAGIC:#06x})")
        if version != VERSION:
            self._fail(f"unsupported frame version {version} (this node speaks {VERSION})")
        if kind not in _KINDS:
            self._fail(f"unknown frame kind {kind}")
        if length > self.max_frame_size:
            self._fail(f"frame length {length} exceeds the maximum of {self.max_frame_size}")
        if avail < HEADER_SIZE + length:
            if self._eof:
                self._fail(f"stream ended inside a {length}-byte frame "
                           f"({avail - HEADER_SIZE} payload bytes received)")
            return NEED_DATA
        start = self._pos + HEADER_SIZE
        end = start + length
        with memoryview(self._buf) as view:  # one copy, released before any resize
            payload = bytes(view[start:end])
        self._pos = end
        return Frame(FrameKind(kind), payload)

    def _fail(self, reason: str):
        self._error = FrameError(reason)
        raise self._error


# --- handshake payload ---------------------------------------------------------

def encode_identity(identity: "dict[str, str] | None") -> str:
    items = sorted((identity or {}).items())
    for k, v in items:
        if not k or any(c in k + v for c in "=;"):
            raise ValueError(f"identity entry {k!r}={v!r} must not be empty or contain '=' or ';'")
    return ";".join(f"{k}={v}" for k, v in items)


def decode_identity(text: str) -> dict[str, str]:
    out = {}
    for part in filter(None, text.split(";")):
        key, sep, value = part.partition("=")
        if not sep:
            raise FrameError(f"identity entry {part!r} is not key=value")
        out[key] = value
    return out


def identity_mismatch(me: str, mine: "dict[str, str]", peer: str, theirs: "dict[str, str]") -> str | None:
    """None when the two identities agree on every key both carry, else the
    reason naming both nodes and both values of each difference."""
    diffs = [f"{k} {mine[k]} at {me}, {theirs[k]} at {peer}" for k in sorted(mine.keys() & theirs.keys())
             if mine[k] != theirs[k]]
    return "log identity differs: " + "; ".join(diffs) if diffs else None


@attrs.frozen
class Hello:
    group: str
    src: str
    dst: str
    identity: str = ""
    nonce: str = ""  # peer authentication: this side's challenge
    proof: str = ""  # peer authentication: the acceptor's answer to the dialer's nonce

    def encode(self) -> bytes:
        out = bytearray()
        fields = [self.group, self.src, self.dst, self.identity, self.nonce, self.proof]
        while len(fields) > 3 and not fields[-1]:
            fields.pop()  # trailing empty fields are left out (older peers send three or four)
        for field in fields:
            raw = field.encode("utf-8")
            if len(raw) > 0xFFFF:
                raise FrameError(f"hello field of {len(raw)} bytes is too long")
            out += _U16.pack(len(raw)) + raw
        return bytes(out)


def decode_hello(payload: bytes) -> Hello:
    fields = []
    off = 0
    for name in ("group", "src", "dst", "identity", "nonce", "proof"):
        if name not in ("group", "src", "dst") and off == len(payload):
            break  # a peer that sends no identity (or no authentication)
        if off + 2 > len(payload):
            raise FrameError(f"hello payload truncated before {name}")
        (n,) = _U16.unpack_from(payload, off)
        off += 2
        if off + n > len(payload):
            raise FrameError(f"hello field {name} runs past the payload")
        try:
            fields.append(payload[off:off + n].decode("utf-8"))
        except UnicodeDecodeError:
            raise FrameError(f"hello field {name} is not UTF-8") from None
        off += n
    if off != len(payload):
        raise FrameError(f"{len(payload) - off} trailing bytes after hello")
    return Hello(*fields)


def decode_reject(payload: bytes) -> str:
    # Reasons are informational; never fail on them.
    return payload.decode("utf-8", errors="replace")


# --- peer authentication ----------------------------------------------------------
#
# With a group secret configured (dLegerPeerSecret), a connection carries no
# DATA until both ends proved they hold it, by HMAC challenge-response keyed
# per group (the same secret in two groups gives two keys):
#
#   dialer   -> HELLO(..., nonce=Nd)
#   acceptor -> HELLO_OK(..., nonce=Na, proof=P("acceptor"))   or REJECT
#   dialer      checks P("acceptor"), else closes (the acceptor is no member)
#   dialer   -> AUTH(P("dialer"))
#   acceptor    checks P("dialer") before it reads anything else, else REJECT
#
#   P(role) = hex HMAC-SHA256(key, role|group|dialer|acceptor|Nd|Na)
#   key     = HMAC-SHA256(secret, "ledgermq-peer-auth|" + group)
#
# Fresh 128-bit nonces on both sides make a recorded handshake useless, the
# role in the proof keeps one side's answer from serving as the other's, and
# the ids in it bind the proof to this pair.  It authenticates; it does not
# encrypt the Raft traffic that follows.

NONCE_BYTES = 16


class PeerAuth:
    """The group's key, and the proofs of one handshake.  repr hides it."""

    def __init__(self, secret: str | bytes, group: str) -> None:
        raw = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
        if not raw:
            raise ValueError("the peer secret must not be empty")
        self._key = hmac.new(raw, b"ledgermq-peer-auth|" + group.encode("utf-8"), hashlib.sha256).digest()
        self.group = group

    def __repr__(self) -> str:
        return f"PeerAuth(group={self.group!r})"

    @staticmethod
    def new_nonce() -> str:
        # os.urandom, never the node's seeded Random: a guessable nonce
        # would let a recorded handshake be replayed.
        return os.urandom(NONCE_BYTES).hex()

    def proof(self, role: str, dialer: str, acceptor: str, dialer_nonce: str, acceptor_nonce: str) -> str:
        text = "|".join((role, self.group, dialer, acceptor, dialer_nonce, acceptor_nonce))
        return hmac.new(self._key, text.encode("utf-8"), hashlib.sha256).hexdigest()

    def verify(self, given: str, role: str, dialer: str, acceptor: str, dialer_nonce: str,
               acceptor_nonce: str) -> bool:
        if len(dialer_nonce) != 2 * NONCE_BYTES or len(acceptor_nonce) != 2 * NONCE_BYTES:
            return False
        expected = self.proof(role, dialer, acceptor, dialer_nonce, acceptor_nonce)
        return hmac.compare_digest(expected.encode(), given.encode("utf-8", "replace"))
