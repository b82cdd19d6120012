# Owns the TCP peer mesh: listening, dialing, reconnect with backoff, the
# per-peer send queues, each connection's reader/writer tasks, and the
# containment that keeps a stranger's bytes from costing more than one
# connection.  The handshake is handshake.py's, the receive budget
# recvbudget.py's.
#
# Rules.  ONE TCP connection per peer pair, used both ways: the peer whose id
# sorts lower (plain string comparison) dials, the higher one only accepts, so
# there is no duplicate dial and reconnecting is the dialer's job alone; an
# acceptor replaces a peer's old connection with its new one.  A connection
# carries DATA frames, and its peer counts as connected, only once its
# handshake completed (log identity compared, the group's secret proved where
# there is one).  A bad frame, a reset, EOF, a write error or any other
# exception in a connection's tasks ends that connection only, logged (at a
# bounded rate where a remote can cause it) and counted (failed_connections);
# the peer's queue survives for the next one.  Nothing a remote sends ends the
# transport's own tasks.  Budgets (TransportConfig): handshake.py's before the
# handshake; after it one connection per member, frames up to max_frame_size,
# unfinished frames sharing recv_budget_bytes, each finished within
# frame_read_timeout (a member of a group without a secret may be a stranger).
#
# set_peers() replaces the peer set while running (the replica shell passes
# its configuration's members): a new peer is dialled if its id sorts higher
# and accepted once known; a removed one is disconnected, its queue dropped,
# and send() to it returns False instead of raising.  So a joining node needs
# nothing up front: the leader learns its address from the CONFIG_CHANGE
# entry, and the joiner accepts the leader its own dLegerPeers lists.
import collections
import functools
import logging
import math
import os
import random
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager

import attrs
import trio

from commitlog import roundtrace as _rt
from commitlog.ratelog import LogBudget
from commitlog.transport.base import Counters, TransportConfig, TransportStats, backoff_delay
from commitlog.transport.errors import CONNECTION_ERRORS, FrameError, UnknownPeerError
from commitlog.transport.framing import HEADER_SIZE as FRAME_HEADER_SIZE
from commitlog.transport.framing import CLOSED, NEED_DATA, FrameDecoder, FrameKind, PeerAuth, frame_header
from commitlog.transport.handshake import MISCONFIGURED, Handshake, peername
from commitlog.transport.recvbudget import RecvBudget

log = logging.getLogger(__name__)


class _PeerClosed(Exception):
    pass


@attrs.define(eq=False)
class _Conn:
    stream: trio.SocketStream
    remote: str
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    writing: bool = False  # its writer task is in a write (send() must not write now)


@attrs.define(eq=False)
class _Peer:
    peer_id: str
    addr: tuple[str, int]
    dials: bool
    # (enqueue time, payload, its length), oldest first.
    queue: collections.deque = attrs.field(factory=collections.deque)
    queued_bytes: int = 0
    wakeup: trio.Event = attrs.field(factory=trio.Event)
    conn: _Conn | None = None
    counters: Counters = attrs.field(factory=Counters)
    dialer: trio.CancelScope | None = None  # the dial loop, while it runs
    # The rest of a frame send() wrote in part (the stream it went to, the
    # bytes): the writer writes it before anything else, on that stream only.
    rest: tuple | None = None


class PeerTransport:
    """The TCP transport of one node.  Create it with open_peer_transport()
    or serve_peer_transport(); see base.Transport for the API contract."""

    def __init__(self, *, cfg: TransportConfig, self_id: str, group: str,
                 peers: Mapping[str, tuple[str, int]], rng: random.Random,
                 identity: Mapping[str, str] | None = None, auth: PeerAuth | None = None) -> None:
        self.cfg = cfg
        self.auth = auth
        self.self_id = self_id
        self.group = group
        self.identity = dict(identity or {})
        self._rng = rng
        self._peers = {pid: _Peer(pid, tuple(addr), self_id < pid)
                       for pid, addr in peers.items() if pid != self_id}
        self._in_send, self._in_recv = trio.open_memory_channel(cfg.recv_queue_messages)
        self._sink = None  # set_sink(): readers hand messages over directly
        self._changed = trio.Event()
        self._closed = False
        self._removed: set[str] = set()
        self._nursery: trio.Nursery | None = None  # where dial loops run (serve_peer_transport)
        self.failed_connections = 0
        self._log = LogBudget()  # lines strangers can cause
        self._handshake = Handshake(cfg=cfg, self_id=self_id, group=group, identity=self.identity, auth=auth,
                                    log_budget=self._log, notify=self._notify)
        self._budget = RecvBudget(cfg.recv_budget_bytes)
        self.listen_addresses: list[tuple[str, int]] = []

    # --- public API ------------------------------------------------------

    @property
    def peer_ids(self) -> tuple[str, ...]:
        return tuple(self._peers)

    @property
    def listen_port(self) -> int:
        return self.listen_addresses[0][1]

    @property
    def rejected_connections(self) -> int:
        return self._handshake.rejected

    @property
    def capped_connections(self) -> int:
        return self._handshake.capped

    def set_peers(self, peers: Mapping[str, tuple[str, int] | None]) -> None:
        """Make `peers` (id -> (host, port); this node's own entry ignored)
        the peer set: new ones are dialled or accepted, removed ones are
        disconnected and forgotten, a changed address is used from the
        next dial on."""
        wanted = {pid: tuple(addr) if addr is not None else None
                  for pid, addr in peers.items() if pid != self.self_id}
        for pid in [p for p in self._peers if p not in wanted]:
            peer = self._peers.pop(pid)
            self._removed.add(pid)
            if peer.dialer is not None:
                peer.dialer.cancel()
            if peer.conn is not None:
                peer.conn.scope.cancel()
            peer.queue.clear()
            log.info("%s: %s is no longer a peer", self.self_id, pid)
        for pid, addr in wanted.items():
            peer = self._peers.get(pid)
            if addr is None:           # address unknown here: keep what we have
                if peer is not None:
                    continue
                addr = ("0.0.0.0", 0)   # accepted when it dials us; dialling it fails until known
            if peer is not None:
                if peer.addr != addr:
                    log.info("%s: %s moves from %s:%d to %s:%d", self.self_id, pid, *peer.addr, *addr)
                    peer.addr = addr
                continue
            self._removed.discard(pid)
            peer = self._peers[pid] = _Peer(pid, addr, self.self_id < pid)
            log.info("%s: %s at %s:%d is a peer now", self.self_id, pid, *addr)
            if peer.dials and self._nursery is not None:
                self._nursery.start_soon(self._run_dialer, peer)
        self._notify()

    def send(self, peer_id: str, payload: bytes) -> bool:
        if peer_id in self._removed:
            return False  # a peer that left the configuration; the core's last words to it
        peer = self._peer(peer_id)
        if type(payload) is tuple:  # scattered (wire.encode_scatter): written part by part, never joined whole
            n = sum(map(len, payload))
        else:
            payload = bytes(payload)
            n = len(payload)
        if n > self.cfg.max_frame_size:
            raise FrameError(f"payload of {n} bytes exceeds max_frame_size {self.cfg.max_frame_size}")
        if self._closed:
            return False
        if peer.queue and self._queue_full(peer, n):
            self._drop_stale(peer, trio.current_time())
            if peer.queue and self._queue_full(peer, n):
                peer.counters.dropped_full += 1
                return False
        if not peer.queue and peer.rest is None and peer.conn is not None and not peer.conn.writing:
            if self._write_now(peer, payload, n):
                return True
        peer.queue.append((trio.current_time(), payload, n))
        peer.queued_bytes += n
        peer.wakeup.set()
        return True

    def _write_now(self, peer: _Peer, payload, n: int) -> bool:
        """With nothing queued or being written, write the frame straight to
        the socket from the caller (the driver): no queue, no wakeup of the
        writer task and no trio socket round per message.  False, nothing
        written, when the socket has no room (or is failing: its reader
        and writer notice, and the frame waits in the queue like any
        other); the rest of a frame written in part goes to the writer."""
        stream = peer.conn.stream
        fd = stream.socket.fileno()
        if fd < 0:
            return False
        pieces = [frame_header(FrameKind.DATA, n, self.cfg.max_frame_size)]
        pieces.extend(payload if type(payload) is tuple else (payload,))
        try:
            sent = os.writev(fd, pieces)
        except OSError:  # (BlockingIOError: no room) -> the writer's way
            return False
        c = peer.counters
        c.writes += 1
        c.sent_frames += 1
        c.sent_bytes += n
        total = FRAME_HEADER_SIZE + n
        if sent < total:
            peer.rest = (stream, b"".join(pieces)[sent:])
            peer.wakeup.set()
        return True

    async def receive(self) -> tuple[str, bytes]:
        return await self._in_recv.receive()

    async def incoming(self) -> AsyncIterator[tuple[str, bytes]]:
        async for item in self._in_recv:
            yield item

    def set_sink(self, sink) -> None:
        self._sink = sink
        while True:
            try:
                src, payload = self._in_recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                return
            sink(src, payload)

    def connected_peers(self) -> frozenset[str]:
        return frozenset(p.peer_id for p in self._peers.values() if p.conn is not None)

    async def wait_connected(self, peers: Iterable[str] | None = None) -> None:
        wanted = set(self._peers) if peers is None else set(peers)
        for pid in wanted:
            self._peer(pid)
        while not wanted <= self.connected_peers():
            await self._changed.wait()

    async def wait_state(self, predicate: Callable[[TransportStats], bool]) -> TransportStats:
        """Wait until predicate(stats()) holds; re-checked whenever a
        connection comes up, goes down, begins or ends its handshake, is
        refused at the caps, or a dial attempt fails (not per frame).
        Returns the stats that satisfied it."""
        while not predicate(stats := self.stats()):
            await self._changed.wait()
        return stats

    def stats(self) -> TransportStats:
        return TransportStats(self_id=self.self_id, peers={
            p.peer_id: p.counters.snapshot(p.peer_id, connected=p.conn is not None,
                                           queued_messages=len(p.queue),
                                           queued_bytes=p.queued_bytes)
            for p in self._peers.values()}, rejected_connections=self.rejected_connections,
            capped_connections=self.capped_connections,
            failed_connections=self.failed_connections, handshakes=self._handshake.handshakes,
            unfinished_bytes=self._budget.used, budget_waits=self._budget.waits)

    # --- queue -----------------------------------------------------------

    def _peer(self, peer_id: str) -> _Peer:
        try:
            return self._peers[peer_id]
        except KeyError:
            raise UnknownPeerError(peer_id, tuple(self._peers)) from None

    def _queue_full(self, peer: _Peer, n: int) -> bool:
        return (len(peer.queue) >= self.cfg.send_queue_messages
                or peer.queued_bytes + n > self.cfg.send_queue_bytes)

    def _drop_stale(self, peer: _Peer, now: float) -> None:
        q = peer.queue
        while q and now - q[0][0] > self.cfg.max_queue_age:
            _, _, n = q.popleft()
            peer.queued_bytes -= n
            peer.counters.dropped_stale += 1

    def _take_batch(self, peer: _Peer) -> list[tuple]:
        self._drop_stale(peer, trio.current_time())
        batch, size = [], 0
        q = peer.queue
        while q and size < self.cfg.write_batch_bytes:
            _, payload, n = q.popleft()
            peer.queued_bytes -= n
            batch.append((payload, n))
            size += n + 8
        return batch

    def _notify(self) -> None:
        event, self._changed = self._changed, trio.Event()
        event.set()

    # --- per-connection tasks ----------------------------------------------

    async def _writer(self, peer: _Peer, conn: _Conn) -> None:
        c, stream = peer.counters, conn.stream
        while True:
            if not peer.queue and peer.rest is None:
                peer.wakeup = trio.Event()
                await peer.wakeup.wait()
                continue
            conn.writing = True
            try:
                await self._write_some(peer, stream, c)
            finally:
                conn.writing = False

    async def _write_some(self, peer: _Peer, stream: trio.SocketStream, c: Counters) -> None:
        if peer.rest is not None:  # the end of a frame send() began: first, and only where it began
            owner, data = peer.rest
            peer.rest = None
            if owner is stream:
                await self._write(c, stream, data)
            return
        parts: list[bytes] = []
        frames = nbytes = 0
        limit = self.cfg.join_limit
        for payload, n in self._take_batch(peer):
            parts.append(frame_header(FrameKind.DATA, n, self.cfg.max_frame_size))
            frames += 1
            nbytes += n
            for piece in (payload if type(payload) is tuple else (payload,)):
                if len(piece) > limit:
                    # Header (plus any small frames before it) in one write,
                    # then the big piece as is: no copy of megabytes.
                    await self._write(c, stream, b"".join(parts))
                    await self._write(c, stream, piece)
                    parts = []
                else:
                    parts.append(piece)
            if not parts:
                c.sent_frames += frames
                c.sent_bytes += nbytes
                frames = nbytes = 0
        if parts:
            await self._write(c, stream, b"".join(parts))
            c.sent_frames += frames
            c.sent_bytes += nbytes

    @staticmethod
    async def _write(c: Counters, stream: trio.SocketStream, data: bytes) -> None:
        await stream.send_all(data)
        c.writes += 1

    async def _reader(self, peer: _Peer, stream: trio.SocketStream, decoder: FrameDecoder) -> None:
        c = peer.counters
        while True:
            frame = decoder.next_frame()
            if frame is NEED_DATA:
                frame = await self._budget.finish_frame(stream, decoder, self.cfg.recv_chunk_bytes,
                                                        self.cfg.frame_read_timeout)
            if frame is CLOSED:
                raise _PeerClosed("closed by peer")
            if frame.kind != FrameKind.DATA:
                raise FrameError(f"unexpected {frame.kind.name} frame after the handshake")
            c.received_frames += 1
            c.received_bytes += len(frame.payload)
            if _rt.TRACER is not None:  # tools/bench/round.py
                _rt.TRACER.frame_in(peer.peer_id)
            sink = self._sink
            if sink is None:
                await self._in_send.send((peer.peer_id, frame.payload))
            else:
                full = sink(peer.peer_id, frame.payload)
                if full is not None:
                    await full.wait()

    async def _run_connection(self, peer: _Peer, stream: trio.SocketStream,
                              decoder: FrameDecoder, remote: str) -> None:
        conn = _Conn(stream, remote)
        old, peer.conn = peer.conn, conn
        if old is not None:
            log.info("%s: new connection from %s (%s) replaces %s", self.self_id, peer.peer_id,
                     remote, old.remote)
            old.scope.cancel()
        peer.counters.connects += 1
        peer.counters.last_error = None
        self._notify()
        log.info("%s: connected to %s (%s)", self.self_id, peer.peer_id, remote)
        reason = "connection closed"

        async def run(fn, *args) -> None:
            nonlocal reason
            try:
                await fn(*args)
            except FrameError as exc:
                # No REJECT here: the writer may be half-way through a frame,
                # so anything more we wrote would be garbage to the peer.
                reason = f"bad frame: {exc}"
                peer.counters.bad_frames += 1
            except _PeerClosed as exc:
                reason = str(exc)
            except CONNECTION_ERRORS as exc:
                reason = f"{type(exc).__name__}: {exc}"
            except Exception as exc:
                reason = f"unexpected {type(exc).__name__}: {exc}"
                peer.counters.failures += 1
                self._failed(f"connection with {peer.peer_id} ({remote})", exc)
            nursery.cancel_scope.cancel()

        try:
            with conn.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(run, self._writer, peer, conn)
                    nursery.start_soon(run, self._reader, peer, stream, decoder)
            if conn.scope.cancelled_caught:
                reason = "replaced by a newer connection"
        finally:
            peer.counters.disconnects += 1
            peer.counters.last_error = reason
            if peer.conn is conn:
                peer.conn = None
                self._notify()
            if reason.startswith(("bad frame", "unexpected")):
                self._log.log(log, logging.WARNING, trio.current_time(), "%s: connection with %s (%s) closed: %s",
                              self.self_id, peer.peer_id, remote, reason)
            else:
                log.info("%s: connection with %s (%s) closed: %s", self.self_id, peer.peer_id, remote, reason)
            await trio.aclose_forcefully(stream)

    def _failed(self, what: str, exc: Exception) -> None:
        """An unexpected error ended one connection: count it, log it with
        its traceback (at a bounded rate); the transport goes on."""
        self.failed_connections += 1
        self._log.log(log, logging.ERROR, trio.current_time(), "%s: %s failed: %s: %s", self.self_id, what,
                      type(exc).__name__, exc, exc_info=exc)

    # --- dialing -----------------------------------------------------------

    async def _run_dialer(self, peer: _Peer) -> None:
        with trio.CancelScope() as scope:
            peer.dialer = scope
            await self._dial_loop(peer)

    async def _dial_loop(self, peer: _Peer) -> None:
        attempt = 0
        while True:
            try:
                stream, decoder, remote = await self._handshake.dial(peer.peer_id, peer.addr)
            except Exception as exc:
                expected = isinstance(exc, CONNECTION_ERRORS)
                reason = (str(exc) or type(exc).__name__) if expected else f"unexpected {type(exc).__name__}: {exc}"
                if not expected:
                    peer.counters.failures += 1
                    self._failed(f"dialling {peer.peer_id} at {peer.addr[0]}:{peer.addr[1]}", exc)
                elif peer.counters.last_error != reason:
                    # Log the first failure of a streak; a peer that is down
                    # would otherwise log every backoff step.
                    level = logging.ERROR if isinstance(exc, MISCONFIGURED) else logging.INFO
                    log.log(level, "%s: cannot connect to %s at %s:%d: %s", self.self_id,
                            peer.peer_id, *peer.addr, reason)
                peer.counters.last_error = reason
                self._notify()
            else:
                started = trio.current_time()
                await self._run_connection(peer, stream, decoder, remote)
                if trio.current_time() - started >= self.cfg.backoff_reset_after:
                    attempt = 0
            await trio.sleep(backoff_delay(self.cfg, attempt, self._rng))
            attempt += 1

    # --- accepting -----------------------------------------------------------

    async def _handle_inbound(self, stream: trio.SocketStream) -> None:
        remote = peername(stream)
        try:
            accepted = await self._handshake.accept(stream, remote, self._peers)
            if accepted is not None:
                hello, decoder = accepted
                peer = self._peers.get(hello.src)
                if peer is not None:  # (unless removed during the handshake)
                    await self._run_connection(peer, stream, decoder, remote)
        except Exception as exc:
            self._failed(f"inbound connection from {remote}", exc)
        finally:
            await trio.aclose_forcefully(stream)


async def serve_peer_transport(cfg: TransportConfig, self_id: str,
                               peers: Mapping[str, tuple[str, int]], *, group: str,
                               listeners: list[trio.SocketListener] | None = None,
                               rng: random.Random | None = None,
                               identity: Mapping[str, str] | None = None,
                               auth: PeerAuth | None = None,
                               task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run the transport until cancelled.  `peers` maps every member id
    (dLegerPeers) to (host, port); this node listens on its own entry's
    address unless pre-bound `listeners` are given (tests bind port 0 first,
    then tell every node the real ports).  `identity` is compared in the
    handshake (see the module comment); `auth` makes every connection prove
    the group's secret first.  task_status.started() hands back the
    PeerTransport once it is listening and dialing."""
    if not self_id:
        raise ValueError("self_id must not be empty")
    if listeners is None:
        if self_id not in peers:
            raise UnknownPeerError(self_id, tuple(peers))
        host, port = peers[self_id]
        listeners = await trio.open_tcp_listeners(port, host=host)
    transport = PeerTransport(cfg=cfg, self_id=self_id, group=group, peers=peers, rng=rng or random.Random(),
                              identity=identity, auth=auth)
    transport.listen_addresses = [tuple(l.socket.getsockname()[:2]) for l in listeners]
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, transport._handle_inbound, listeners)
            transport._nursery = nursery
            for peer in transport._peers.values():
                if peer.dials:
                    nursery.start_soon(transport._run_dialer, peer)
            task_status.started(transport)
            await trio.sleep(math.inf)
    finally:
        transport._closed = True
        transport._in_send.close()
        for peer in transport._peers.values():
            peer.conn = None


@asynccontextmanager
async def open_peer_transport(cfg: TransportConfig, self_id: str,
                              peers: Mapping[str, tuple[str, int]], *, group: str,
                              listeners: list[trio.SocketListener] | None = None,
                              rng: random.Random | None = None,
                              identity: Mapping[str, str] | None = None, auth: PeerAuth | None = None):
    """`async with open_peer_transport(...) as transport:` -- the transport
    runs for the duration of the block and is torn down at its end."""
    async with trio.open_nursery() as nursery:
        transport = await nursery.start(functools.partial(
            serve_peer_transport, cfg, self_id, peers, group=group, listeners=listeners, rng=rng,
            identity=identity, auth=auth))
        try:
            yield transport
        finally:
            nursery.cancel_scope.cancel()
