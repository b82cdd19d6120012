# Owns what stands between an accepted socket and its Connection: the limits a
# server enforces against hostile or broken clients (ServerLimits, each a
# broker.conf / namesrv.conf key), the connection caps (ConnectionGate, one
# Slot per admitted connection), the budget of unfinished frames
# (FrameBudget) and the stream wrappers (StreamAdapter replays sniffed bytes
# and shows the socket under TLS; GuardedStream keeps the timeouts).
#
#   frameMaxLength                              16 MiB  (checked before the body is buffered)
#   serverMaxConnections / ...PerAddress        4096 / 256
#   serverChannelMaxIdleTimeSeconds             120 s   (nothing read or written)
#   serverFrameReadTimeoutMillis                30 s    (one frame, first byte to last: slowloris)
#   serverWriteTimeoutMillis                    30 s    (one write: a client that never reads)
#   serverTlsHandshakeTimeoutMillis             10 s
#   serverMaxInFlightPerConnection              1024    (then the connection stops reading)
#   serverMaxInFlightBytesPerConnection         16 MiB  (likewise)
#   serverMaxInFlightRequests                   10000   (then SYSTEM_BUSY, guard.py)
#   serverMaxUnfinishedFrameBytes               64 MiB  (then the oldest are shed)
#   serverMaxUnfinishedFrameBytesPerConnection  16 MiB  (reads never buffer past it)
#   serverRequestsPerRound                      128     (pacing.Pacer)
#
# So memory per connection is bounded, and a timeout (0 = off) ends only its
# own connection (a broken stream, treated like a reset).  Caps shed, they do
# not refuse: a connection over a cap is admitted and the least valuable one
# (of its address, or of the address holding the most) is closed -- one that
# never completed a frame first, then the one idle longest -- so a flood from
# one address cannot lock out the working clients there.  FrameBudget closes
# the holders of the oldest unfinished frames, never the reader of a fresh
# small request; return_freed_memory gives what it frees back to the system.
import collections
import contextlib
import ctypes
import heapq
import itertools
import logging
import math
import os
import struct
from collections.abc import Callable
from contextlib import asynccontextmanager

import attrs
import trio

from broker.remoting.tls import ServerTls, StreamAdapter, TlsRefused, accept_stream
from commitlog.config import ConfigError, parse_int

log = logging.getLogger(__name__)

DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024
_I32 = struct.Struct(">i")
_JAVA_INT = 2**31 - 1


@attrs.frozen
class ServerLimits:
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_connections: int = 4096
    max_connections_per_address: int = 256
    idle_timeout: float = 120.0
    frame_read_timeout: float = 30.0
    write_timeout: float = 30.0
    handshake_timeout: float = 10.0
    max_in_flight_per_connection: int = 1024
    max_in_flight_bytes_per_connection: int = 16 * 1024 * 1024
    max_in_flight: int = 10000
    max_unfinished_bytes: int = 64 * 1024 * 1024
    max_unfinished_bytes_per_connection: int = 16 * 1024 * 1024
    requests_per_round: int = 128


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
    "serverMaxUnfinishedFrameBytes": ("max_unfinished_bytes", parse_int(64 * 1024, 1 << 40), 1),
    "serverMaxUnfinishedFrameBytesPerConnection": ("max_unfinished_bytes_per_connection",
                                                   parse_int(1024, 1 << 40), 1),
    "serverRequestsPerRound": ("requests_per_round", parse_int(1, 1 << 20), 1),
}


def limits_from_props(props: dict[str, object], base: ServerLimits | None = None) -> ServerLimits:
    """The LIMIT_KEYS among `props` over `base` (ConfigError naming a bad one).
    The unfinished-frame budgets not given follow frameMaxLength upwards
    (a frame the server takes must fit in both); given ones must fit it."""
    values = {}
    for key, raw in props.items():
        if key in LIMIT_KEYS:
            field, parse, scale = LIMIT_KEYS[key]
            values[field] = parse(key, raw) * scale if scale != 1 else parse(key, raw)
    limits = attrs.evolve(base or ServerLimits(), **values)
    frame = limits.max_frame_size
    if "max_unfinished_bytes_per_connection" not in values:
        limits = attrs.evolve(limits, max_unfinished_bytes_per_connection=max(
            limits.max_unfinished_bytes_per_connection, frame))
    if "max_unfinished_bytes" not in values:
        limits = attrs.evolve(limits, max_unfinished_bytes=max(
            limits.max_unfinished_bytes, limits.max_unfinished_bytes_per_connection))
    for key, field in (("serverMaxUnfinishedFrameBytesPerConnection", "max_unfinished_bytes_per_connection"),
                       ("serverMaxUnfinishedFrameBytes", "max_unfinished_bytes")):
        if getattr(limits, field) < frame:
            raise ConfigError(key, getattr(limits, field), f"below frameMaxLength ({frame}): a frame the server "
                                                           f"accepts could never be read whole")
    return limits


@attrs.define(eq=False)
class Slot:
    """One admitted connection as the gate sees it: where from, how useful
    so far (frames completed, last activity: GuardedStream keeps them), and
    the scope its whole service runs in (cancelled to shed it)."""

    address: str
    last_active: float
    frames: int = 0
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    shed: str | None = None  # why the gate closed it
    released: bool = False

    def value(self) -> tuple[bool, float]:
        """Lower is shed first: never completed a frame, then idle longest."""
        return self.frames > 0, self.last_active


class ConnectionGate:
    """Counts open connections, in total and per remote address, and keeps
    both under their caps by shedding the least valuable (module header)."""

    def __init__(self, limits: ServerLimits) -> None:
        self.limits = limits
        self.total = 0
        self.by_address: collections.Counter[str] = collections.Counter()
        self._slots: dict[str, set[Slot]] = {}
        self.shed = 0  # connections closed to make room

    def admit(self, address: str, now: float) -> Slot:
        """A slot for a new connection from `address`; a connection over a
        cap sheds another (logged, counted) instead of being refused."""
        if self.by_address[address] >= self.limits.max_connections_per_address:
            self._shed_one(address, f"{self.by_address[address]} connections from {address} "
                                    f"(serverMaxConnectionsPerAddress)")
        if self.total >= self.limits.max_connections:
            busiest = max(self.by_address, key=self.by_address.__getitem__)
            self._shed_one(busiest, f"{self.total} connections open (serverMaxConnections)")
        slot = Slot(address, now)
        self._slots.setdefault(address, set()).add(slot)
        self.total += 1
        self.by_address[address] += 1
        return slot

    def _shed_one(self, address: str, why: str) -> None:
        slots = self._slots.get(address)
        if not slots:
            return
        victim = min(slots, key=Slot.value)
        victim.shed = f"shed to admit a new connection: {why}"
        log.warning("closing a connection from %s (%s, %d frames): %s", address,
                    "idle" if victim.frames else "no complete frame", victim.frames, why)
        self.shed += 1
        self.release(victim)
        victim.scope.cancel()

    def release(self, slot: Slot) -> None:
        if slot.released:
            return
        slot.released = True
        self.total -= 1
        self.by_address[slot.address] -= 1
        self._slots[slot.address].discard(slot)
        if self.by_address[slot.address] <= 0:
            del self.by_address[slot.address]
            del self._slots[slot.address]


MMAP_THRESHOLD = 256 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
_pinned = False


def return_freed_memory() -> None:
    """Pin glibc's mmap threshold at MMAP_THRESHOLD (once per process), so
    that every buffer above it -- a decoder holding part of a big frame --
    is its own mapping, given back to the system the moment it is freed.
    By default glibc raises the threshold after each such free (up to 32
    MiB) and serves the next big buffers from the heap, where what an
    attack had the connections hold stays mapped after they are shed: four
    waves of 48 unfinished 15 MiB frames left a broker 100 MiB above its
    baseline, growing; pinned, it returns to it after each.  An operator's
    MALLOC_MMAP_THRESHOLD_ wins; elsewhere than glibc this does nothing."""
    global _pinned
    if _pinned or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return
    _pinned = True
    try:
        ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    except (OSError, AttributeError):  # not glibc
        pass


@attrs.define(eq=False, slots=True)
class _Held:
    nbytes: int
    since: float  # when its unfinished frame began
    seq: int  # of its current entry in FrameBudget._order


class FrameBudget:
    """The bytes of unfinished frames (and the read buffers under them) that
    all the connections of one server hold, against one budget.  A
    connection reports what it holds after every read (update); when that
    takes the total past the budget, the holders of the oldest unfinished
    frames are shed -- their `shed(reason)` closes them -- until it fits
    again, so what the decoders keep never stays past the budget longer than
    the step that read it.  Oldest, because that is what an attacker must
    do to hold memory (begin frames and not finish them), while a real
    client's frame is young: it is still arriving."""

    def __init__(self, limit: int, clock=trio.current_time) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        self.shed = 0  # holders closed to stay within the budget
        self._clock = clock
        self._held: dict[object, _Held] = {}
        self._order: list[tuple[float, int, object]] = []  # (since, seq, holder), stale entries skipped
        self._seq = itertools.count()

    @property
    def holders(self) -> int:
        return len(self._held)

    def update(self, holder, nbytes: int, new_frame: bool) -> None:
        """`holder` now holds `nbytes` (0: nothing unfinished); new_frame: the
        frame it holds began in the read just reported."""
        held = self._held.get(holder)
        if nbytes <= 0:
            if held is not None:
                self.used -= held.nbytes
                del self._held[holder]
            return
        if held is None or new_frame:
            since, seq = self._clock(), next(self._seq)
            if held is None:
                held = self._held[holder] = _Held(0, since, seq)
            else:
                held.since, held.seq = since, seq
            heapq.heappush(self._order, (since, seq, holder))
            if len(self._order) > 2 * len(self._held) + 64:
                self._order = [(h.since, h.seq, k) for k, h in self._held.items()]
                heapq.heapify(self._order)
        self.used += nbytes - held.nbytes
        held.nbytes = nbytes
        while self.used > self.limit and self._order:
            since, seq, victim = heapq.heappop(self._order)
            h = self._held.get(victim)
            if h is None or h.seq != seq:
                continue  # stale: gone, or holding a newer frame
            self.update(victim, 0, False)
            self.shed += 1
            victim.shed(f"{h.nbytes} bytes of a frame begun {self._clock() - since:.1f} s ago shed: unfinished "
                        f"frames past serverMaxUnfinishedFrameBytes ({self.limit})")
        if self.used > self.peak:
            self.peak = self.used  # (after shedding: never above the limit)


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
    it (and sets `timed_out`), which ends that connection only.  Keeps its
    gate Slot's activity and completed frames up to date (whom to shed)."""

    def __init__(self, inner, limits: ServerLimits, slot: Slot | None = None) -> None:
        super().__init__(inner)
        self.limits = limits
        self.slot = slot
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
        self._last_activity = now = trio.current_time()
        if self.slot is not None:
            self.slot.last_active = now
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
        if ended and self.slot is not None:
            self.slot.frames += 1
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
    refused (not the TLS the server's mode wants; logged).  The connection
    counts against the caps until the block ends, and the block is
    cancelled if the gate sheds it for a newer one."""
    slot = gate.admit(address, trio.current_time()) if gate is not None else None
    try:
        with slot.scope if slot is not None else contextlib.nullcontext():
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
                wrapped = GuardedStream(wrapped, limits, slot)
            yield wrapped
    finally:
        if slot is not None:
            gate.release(slot)
