# Owns what stands between an accepted socket and its Connection: the
# limits a server enforces against hostile or broken clients (ServerLimits,
# each a broker.conf / namesrv.conf key), the connection caps (ConnectionGate),
# and the stream wrappers (StreamAdapter: replays sniffed bytes and shows the
# socket under a TLS stream; GuardedStream: the timeouts).
#
#   limit                      key                                   default
#   frame size                 frameMaxLength                        16 MiB  (checked before the body is buffered)
#   connections, in total      serverMaxConnections                  4096
#   connections per address    serverMaxConnectionsPerAddress        1024
#   idle connection            serverChannelMaxIdleTimeSeconds       120 s   (nothing read or written)
#   one frame, first byte      serverFrameReadTimeoutMillis          30 s    (slowloris: a frame
#     to last                                                                 trickled byte by byte)
#   one write                  serverWriteTimeoutMillis              30 s    (a client that never reads)
#   TLS handshake              serverTlsHandshakeTimeoutMillis       10 s
#   requests per connection    serverMaxInFlightPerConnection        1024    (then the connection stops
#                                                                             reading: TCP pushes back)
#   request bytes per conn.    serverMaxInFlightBytesPerConnection   16 MiB  (likewise)
#   requests in the server     serverMaxInFlightRequests             10000   (then SYSTEM_BUSY, guard.py)
#
# Memory per connection is therefore bounded: the decoder holds at most one
# frame (frameMaxLength) plus one read, at most serverMaxInFlightPerConnection
# requests and about serverMaxInFlightBytesPerConnection bytes of them wait
# for their answers, and answers that cannot be written within
# serverWriteTimeoutMillis end the connection.  A timeout ends only its own
# connection (it surfaces as a broken stream, which Connection treats like a
# reset).  Timeouts of 0 are off.
import collections
import logging
import math
import os
import struct
from collections.abc import Callable
from contextlib import asynccontextmanager

import attrs
import trio

from broker.remoting.tls import ServerTls, StreamAdapter, TlsRefused, accept_stream
from commitlog.config import parse_int

log = logging.getLogger(__name__)

DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024
_I32 = struct.Struct(">i")
_JAVA_INT = 2**31 - 1


@attrs.frozen
class ServerLimits:
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_connections: int = 4096
    max_connections_per_address: int = 1024
    idle_timeout: float = 120.0
    frame_read_timeout: float = 30.0
    write_timeout: float = 30.0
    handshake_timeout: float = 10.0
    max_in_flight_per_connection: int = 1024
    max_in_flight_bytes_per_connection: int = 16 * 1024 * 1024
    max_in_flight: int = 10000


_MS = parse_int(0, _JAVA_INT)
# config key -> (ServerLimits field, parser, scale to the field's unit)
LIMIT_KEYS = {
    "frameMaxLength": ("max_frame_size", parse_int(1024, _JAVA_INT), 1),
    "serverMaxConnections": ("max_connections", parse_int(1, 1 << 20), 1),
    "serverMaxConnectionsPerAddress": ("max_connections_per_address", parse_int(1, 1 << 20), 1),
    "serverChannelMaxIdleTimeSeconds": ("idle_timeout", parse_int(0, _JAVA_INT), 1),
    "serverFrameReadTimeoutMillis": ("frame_read_timeout", _MS, 1 / 1000),
    "serverWriteTimeoutMillis": ("write_timeout", _MS, 1 / 1000),
    "serverTlsHandshakeTimeoutMillis": ("handshake_timeout", parse_int(1, _JAVA_INT), 1 / 1000),
    "serverMaxInFlightPerConnection": ("max_in_flight_per_connection", parse_int(1, 1 << 20), 1),
    "serverMaxInFlightBytesPerConnection": ("max_in_flight_bytes_per_connection", parse_int(1024, 1 << 40), 1),
    "serverMaxInFlightRequests": ("max_in_flight", parse_int(1, 1 << 24), 1),
}


def limits_from_props(props: dict[str, object], base: ServerLimits | None = None) -> ServerLimits:
    """The LIMIT_KEYS among `props` over `base` (ConfigError naming a bad one)."""
    values = {}
    for key, raw in props.items():
        if key in LIMIT_KEYS:
            field, parse, scale = LIMIT_KEYS[key]
            values[field] = parse(key, raw) * scale if scale != 1 else parse(key, raw)
    return attrs.evolve(base or ServerLimits(), **values)


class ConnectionGate:
    """Counts open connections, in total and per remote address."""

    def __init__(self, limits: ServerLimits) -> None:
        self.limits = limits
        self.total = 0
        self.by_address: collections.Counter[str] = collections.Counter()
        self.refused = 0

    def admit(self, address: str) -> str | None:
        """None (and counted) if a connection from `address` may open, else why not."""
        if self.total >= self.limits.max_connections:
            self.refused += 1
            return f"{self.total} connections open (serverMaxConnections)"
        if self.by_address[address] >= self.limits.max_connections_per_address:
            self.refused += 1
            return f"{self.by_address[address]} connections from {address} (serverMaxConnectionsPerAddress)"
        self.total += 1
        self.by_address[address] += 1
        return None

    def release(self, address: str) -> None:
        self.total -= 1
        self.by_address[address] -= 1
        if self.by_address[address] <= 0:
            del self.by_address[address]


class _FrameTracker:
    """Follows the remoting framing (i32 length, then that many bytes) over
    the bytes a connection reads, only to know whether a frame has begun and
    not ended.  The decoder proper lives in codec.py; this one never buffers
    more than a length field."""

    __slots__ = ("remaining", "prefix")

    def __init__(self) -> None:
        self.remaining = 0  # bytes of the current frame still to come
        self.prefix = b""   # a length field read in part

    @property
    def mid_frame(self) -> bool:
        return self.remaining > 0 or bool(self.prefix)

    def feed(self, data: bytes) -> bool:
        """Take the bytes read; True if a frame ended in them.  Runs on
        every read of every connection: one unpack per frame, no copies."""
        n, ended = len(data), False
        rem, i = self.remaining, 0
        if self.prefix:  # a length field split across reads
            take = min(4 - len(self.prefix), n)
            self.prefix += data[:take]
            i = take
            if len(self.prefix) < 4:
                return False
            rem = max(0, _I32.unpack(self.prefix)[0])  # (a nonsense length is the decoder's to reject)
            self.prefix = b""
        unpack = _I32.unpack_from
        while True:
            if rem:
                if rem > n - i:
                    rem -= n - i
                    break
                i += rem
                rem = 0
                ended = True
            if i + 4 > n:
                self.prefix = bytes(data[i:])
                break
            rem = max(0, unpack(data, i)[0])
            i += 4
        self.remaining = rem
        return ended


class GuardedStream(StreamAdapter):
    """Enforces the idle, frame and write timeouts of ServerLimits on one
    accepted connection.  A timeout raises trio.BrokenResourceError naming
    it (and sets `timed_out`), which ends that connection only."""

    def __init__(self, inner, limits: ServerLimits) -> None:
        super().__init__(inner)
        self.limits = limits
        self.timed_out: str | None = None
        self._tracker = _FrameTracker()
        # A Connection reports frames itself (frames_read, from its
        # decoder's state) and turns this off: no second framing pass.
        self.track_frames = True
        self._was_mid = False
        self._frame_deadline = math.inf
        self._last_activity = trio.current_time()
        self._receive_scope: trio.CancelScope | None = None

    def _idle_deadline(self) -> float:
        t = self.limits.idle_timeout
        return self._last_activity + t if t > 0 else math.inf

    def _deadline(self) -> float:
        return min(self._idle_deadline(), self._frame_deadline)

    def _active(self) -> None:
        self._last_activity = trio.current_time()
        if self._receive_scope is not None:  # a write pushes a waiting receive's idle deadline on
            self._receive_scope.deadline = self._deadline()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        with trio.CancelScope(deadline=self._deadline()) as scope:
            self._receive_scope = scope
            try:
                data = await super().receive_some(max_bytes)
            finally:
                self._receive_scope = None
        if scope.cancelled_caught:
            if self._frame_deadline <= trio.current_time():
                self.timed_out = (f"a frame was not complete {self.limits.frame_read_timeout:g} s after it began "
                                  f"(serverFrameReadTimeoutMillis)")
            else:
                self.timed_out = (f"idle for {self.limits.idle_timeout:g} s "
                                  f"(serverChannelMaxIdleTimeSeconds)")
            raise trio.BrokenResourceError(self.timed_out)
        self._track(data)
        return data

    def _track(self, data: bytes) -> None:
        if self.track_frames and self.limits.frame_read_timeout > 0:  # (none with the timeout off)
            ended = self._tracker.feed(data)
            self.frames_read(self._tracker.mid_frame, ended)
        self._active()

    def frames_read(self, mid_frame: bool, ended: bool) -> None:
        """After a read: whether a frame has begun and not ended, and
        whether one ended in that read (a reader with a decoder of its own
        says so instead of this stream following the framing)."""
        t = self.limits.frame_read_timeout
        if t <= 0:
            return
        if not mid_frame:
            self._frame_deadline = math.inf
        elif ended or not self._was_mid:
            # A new frame began in this read; one still open keeps its start.
            self._frame_deadline = trio.current_time() + t
        self._was_mid = mid_frame

    def write_now(self, data) -> int:
        """Write to the socket without waiting (see direct_writer)."""
        self._active()
        return os.write(self.inner.socket.fileno(), data)

    async def send_all(self, data) -> None:
        self._active()
        t = self.limits.write_timeout
        with trio.move_on_after(t if t > 0 else math.inf) as scope:
            await super().send_all(data)
        if scope.cancelled_caught:
            self.timed_out = (f"a write of {len(data)} bytes did not finish in {t:g} s "
                              f"(serverWriteTimeoutMillis): the peer does not read")
            raise trio.BrokenResourceError(self.timed_out)
        self._active()


def direct_writer(stream) -> Callable[[bytes], int] | None:
    """A function that writes bytes straight to the socket under `stream`
    without waiting -- it returns how many went out, raises
    BlockingIOError when none fit and OSError when the connection failed
    -- for a plain TCP stream or a GuardedStream over one; None when TLS
    (or anything else) is in between."""
    if type(stream) is GuardedStream:
        return stream.write_now if type(stream.inner) is trio.SocketStream else None
    if type(stream) is trio.SocketStream:
        sock = stream.socket
        return lambda data: os.write(sock.fileno(), data)
    return None


@asynccontextmanager
async def accepted(stream: trio.SocketStream, address: str, gate: ConnectionGate | None,
                   limits: ServerLimits | None, tls: ServerTls | None):
    """The stream a Connection should read, or None when the connection is
    refused (over a cap, or not the TLS the server's mode wants; logged).
    The connection counts against the caps until the block ends."""
    if gate is not None:
        why = gate.admit(address)
        if why is not None:
            log.warning("refused a connection from %s: %s", address, why)
            await trio.aclose_forcefully(stream)
            yield None
            return
    try:
        wrapped = stream
        if tls is not None and tls.enabled:
            timeout = limits.handshake_timeout if limits is not None else ServerLimits().handshake_timeout
            try:
                wrapped = await accept_stream(stream, tls, timeout)
            except TlsRefused as e:
                log.warning("closed a connection from %s: %s", address, e)
                await trio.aclose_forcefully(stream)
                wrapped = None
        if wrapped is not None and limits is not None:
            wrapped = GuardedStream(wrapped, limits)
        yield wrapped
    finally:
        if gate is not None:
            gate.release(address)
