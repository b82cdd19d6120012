# Owns the client library's remoting IO on anyio, so the library runs under
# asyncio and trio alike: ClientConnection (one dialed TCP connection:
# requests out with their opaque, responses matched back, requests the
# broker pushes handed to a handler in their own task) and RemotingClient
# (one cached connection per "host:port", redialed on the next call after it
# breaks, with the same calls and errors as broker.remoting.client's trio
# one, which the server side keeps).
#
# The bytes are the sans-IO codec's (broker/remoting/codec.py), through the
# client's cheap per-send forms of it (wire.py: a producer's SendRequest is
# taken wherever a RemotingCommand is, and each read is decoded in one go by
# a ResponseDecoder): this module only moves them.  Errors are broker.remoting.errors' (RemotingConnectError,
# RemotingTimeoutError, RemotingConnectionLostError); the library's
# ClientInstance turns them into ClientErrors at its one translation point.
#
# Two optional layers, as broker.remoting.client has them: `rpc_hook`
# rewrites every request just before it is sent (the ACL signer,
# broker/acl/signing.py: a signature covers the final ext fields and body),
# and `tls` (broker.remoting.tls.ClientTls) dials with TLS, the handshake
# part of the dial, so a server certificate the client does not trust fails
# the dial, not the first request.
#
#   async with open_remoting_client(handler=on_push) as client:
#       response = await client.invoke("127.0.0.1:9876", request, timeout=3)
import itertools
import logging
import math
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import sniffio

from broker.client.wire import ResponseDecoder, SendRequest
from broker.remoting.codec import DEFAULT_MAX_FRAME_SIZE, encode_command, encode_request
from broker.remoting.codes import RPC_TYPE_RESPONSE, ResponseCode, code_name
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import (
    LocalProtocolError,
    RemotingConnectError,
    RemotingConnectionLostError,
    RemotingTimeoutError,
)
from broker.remoting.tls import ClientTls

log = logging.getLogger("ledgermq.client.transport")

Handler = Callable[["ClientConnection", RemotingCommand], Awaitable[RemotingCommand | None]]
DEFAULT_TIMEOUT = 3.0
RECV_CHUNK = 64 * 1024
OUTBOX_LIMIT = 4 << 20  # bytes queued for a connection's writer before senders wait
SWEEP_INTERVAL = 0.05  # how late a request's timeout may fire, at most
_IO_ERRORS = (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)
_MAX_OPAQUE = (1 << 31) - 1


def parse_addr(addr: str) -> tuple[str, int]:
    """"host:port" or "[v6]:port" to (host, port); ValueError otherwise."""
    text = addr.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
    else:
        host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad address {addr!r} (expected host:port)")
    return host, int(port)


def _connect_reason(e: OSError) -> str:
    """What failed: anyio.connect_tcp wraps each address's own error
    ("Connection refused") in one "All connection attempts failed"."""
    causes = [e, e.__cause__, *getattr(e.__cause__, "exceptions", ())]
    for inner in causes:  # the errno's own words, the same on every backend
        if isinstance(inner, OSError) and inner.errno:
            return os.strerror(inner.errno)
    return e.strerror or repr(e)


async def not_supported(conn, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.make_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported")


def _native_event_class() -> type:
    """The running loop's own Event class (trio.Event or asyncio.Event):
    anyio.Event wraps one of them behind a backend lookup per creation, and
    every request makes one.  Both have set(), is_set() and an awaitable
    wait() that the loop can cancel, which is all a waiter uses."""
    if sniffio.current_async_library() == "trio":
        import trio
        return trio.Event
    import asyncio
    return asyncio.Event


Done = Callable[[RemotingCommand | None, Exception | None], None]


class _Waiter:
    """One request waiting for its response (a plain slotted class: one is
    made per request): a task parked on `event` (invoke), or a `done`
    callback the connection calls itself (submit)."""

    __slots__ = ("event", "response", "error", "code", "timeout", "deadline", "done")

    def __init__(self, event, code: int, timeout: float, done: Done | None = None) -> None:
        self.event = event
        self.done = done
        self.response: RemotingCommand | None = None
        self.error: Exception | None = None
        self.code = code
        self.timeout = timeout
        # Set by the sweeper the first time it sees this request: a timeout
        # fires between `timeout` and `timeout` + 2 * SWEEP_INTERVAL after
        # the request, without a clock read per request.
        self.deadline = math.inf


class ClientConnection:
    """One dialed connection; `run()` (started by RemotingClient) reads it
    until it ends."""

    def __init__(self, stream: anyio.abc.SocketStream, addr: str, handler: Handler | None = None, *,
                 max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.stream = stream
        self.remote_address = addr
        self.max_frame_size = max_frame_size
        self.close_reason: str | None = None
        self._handler = handler or not_supported
        self._decoder = ResponseDecoder(max_frame_size)
        # Frames wait in the outbox for the connection's writer task, which
        # sends everything queued in one write: pipelined requests cost one
        # send syscall per burst, not one each, and a requester's timeout
        # never cuts a frame in half.  Past OUTBOX_LIMIT bytes, senders wait
        # for the writer (a peer that stops reading stops the senders).
        self._outbox: list[bytes] = []
        self._outbox_bytes = 0
        self._queued = anyio.Event()  # set when the outbox gets a frame
        self._drained = anyio.Event()  # set when the writer emptied a full outbox
        self._sweep = anyio.Event()  # set when a request is pending again (wakes the sweeper)
        self._pending: dict[int, _Waiter] = {}
        self._new_event = _native_event_class()
        self._opaques = itertools.count(1)
        self._closed = False
        self._scope = anyio.CancelScope()

    def __repr__(self) -> str:
        return f"<ClientConnection -> {self.remote_address}>"

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, reason: str = "closed locally") -> None:
        if self.close_reason is None:
            self.close_reason = reason
        self._closed = True
        self._scope.cancel()

    def _next_opaque(self) -> int:
        while True:
            opaque = next(self._opaques)
            if opaque > _MAX_OPAQUE:
                self._opaques = itertools.count(1)
                continue
            if opaque not in self._pending:
                return opaque

    async def _send(self, data: bytes) -> None:
        """Queue one whole frame for the writer."""
        while True:
            if self._closed:
                raise RemotingConnectionLostError(self.remote_address, self.close_reason or "connection closed")
            if self._outbox_bytes < OUTBOX_LIMIT:
                break
            if self._drained.is_set():
                self._drained = anyio.Event()
            await self._drained.wait()
        self._queue(data)

    def _queue(self, data: bytes) -> None:
        self._outbox.append(data)
        self._outbox_bytes += len(data)
        self._queued.set()

    async def _sweeper(self) -> None:
        """Fail the requests whose deadline passed, checking every
        SWEEP_INTERVAL while any is pending (RocketMQ's clients scan their
        response table the same way); parked while none is."""
        while True:
            if not self._pending:
                await self._sweep.wait()
                self._sweep = anyio.Event()
                continue
            await anyio.sleep(SWEEP_INTERVAL)
            now = anyio.current_time()
            for opaque, waiter in list(self._pending.items()):
                if waiter.deadline == math.inf:  # new since the last sweep: sent at most SWEEP_INTERVAL ago
                    waiter.deadline = now + waiter.timeout
                if waiter.deadline > now:
                    continue
                error = RemotingTimeoutError(self.remote_address, waiter.code, waiter.timeout)
                if waiter.done is not None:
                    self._call_done(opaque, waiter, None, error)
                elif not waiter.event.is_set():
                    waiter.error = error
                    waiter.event.set()

    async def _writer(self) -> None:
        """Send what the outbox holds, one write per wakeup; a failed write
        ends the connection (every waiter learns it from _fail_pending)."""
        while True:
            await self._queued.wait()
            self._queued = anyio.Event()
            while self._outbox:
                frames, self._outbox, self._outbox_bytes = self._outbox, [], 0
                self._drained.set()
                try:
                    await self.stream.send(frames[0] if len(frames) == 1 else b"".join(frames))
                except _IO_ERRORS as e:
                    self.close(f"send failed: {e!r}")
                    return

    async def invoke(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send a request, wait for its answer.  The timeout is kept by the
        connection's sweeper, not by a cancel scope per request (every
        pipelined send paid for one); only a send that must wait for room
        in the outbox takes a scope."""
        if self._closed:
            raise RemotingConnectionLostError(self.remote_address, self.close_reason or "connection closed")
        opaque = self._next_opaque()
        data = cmd.frame(opaque, False, self.max_frame_size) if type(cmd) is SendRequest else \
            encode_request(cmd, opaque, False, self.max_frame_size)
        waiter = _Waiter(self._new_event(), cmd.code, timeout)
        self._pending[opaque] = waiter
        try:
            if self._outbox_bytes < OUTBOX_LIMIT:
                self._queue(data)
            else:
                with anyio.move_on_after(timeout) as scope:
                    await self._send(data)
                if scope.cancelled_caught:
                    raise RemotingTimeoutError(self.remote_address, cmd.code, timeout)
            if len(self._pending) == 1:
                self._sweep.set()  # the sweeper was idle
            await waiter.event.wait()
            if waiter.response is not None:
                return waiter.response
            raise waiter.error or RemotingTimeoutError(self.remote_address, cmd.code, timeout)
        finally:
            self._pending.pop(opaque, None)

    def submit(self, cmd: RemotingCommand, timeout: float, done: Done) -> bool:
        """Send a request without a task waiting for it: `done(response,
        None)` or `done(None, error)` is called from this connection's read
        loop (or its sweeper, or when it ends) exactly once.  False, and
        nothing sent, when the connection is closed or its outbox full (the
        caller takes the waiting path, invoke)."""
        if self._closed or self._outbox_bytes >= OUTBOX_LIMIT:
            return False
        opaque = self._next_opaque()
        data = cmd.frame(opaque, False, self.max_frame_size) if type(cmd) is SendRequest else \
            encode_request(cmd, opaque, False, self.max_frame_size)
        self._pending[opaque] = _Waiter(None, cmd.code, timeout, done)
        self._queue(data)
        if len(self._pending) == 1:
            self._sweep.set()  # the sweeper was idle
        return True

    def _call_done(self, opaque: int, waiter: _Waiter, response, error) -> None:
        """A submitted request's end: forgotten, then its callback (whose
        failure is logged: it must not end the connection)."""
        del self._pending[opaque]
        try:
            waiter.done(response, error)
        except Exception:
            log.exception("%s: the callback of request %d failed", self.remote_address, opaque)

    async def send_request_oneway(self, cmd: RemotingCommand, timeout: float = math.inf) -> None:
        opaque = self._next_opaque()
        data = cmd.frame(opaque, True, self.max_frame_size) if type(cmd) is SendRequest else \
            encode_request(cmd, opaque, True, self.max_frame_size)
        with anyio.move_on_after(timeout):
            await self._send(data)
            return
        raise RemotingTimeoutError(self.remote_address, cmd.code, timeout)

    async def run(self) -> None:
        try:
            with self._scope:
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._writer)
                    tasks.start_soon(self._sweeper)
                    await self._read_loop(tasks)
                    tasks.cancel_scope.cancel()
        finally:
            self._closed = True
            self._drained.set()  # senders waiting for room learn it is closed
            self._fail_pending()
            with anyio.CancelScope(shield=True):
                await self.stream.aclose()
            log.debug("%r closed: %s", self, self.close_reason)

    async def _read_loop(self, tasks) -> None:
        decoder, pending, receive = self._decoder, self._pending, self.stream.receive
        while True:
            try:
                data = await receive(RECV_CHUNK)
            except anyio.EndOfStream:
                data = b""
            except _IO_ERRORS as e:
                self.close_reason = f"receive failed: {e!r}"
                return
            for cmd in decoder.feed(data):
                if cmd.flag & RPC_TYPE_RESPONSE:
                    waiter = pending.get(cmd.opaque)
                    if waiter is None:
                        continue
                    if waiter.done is not None:
                        self._call_done(cmd.opaque, waiter, cmd, None)
                    elif not waiter.event.is_set():
                        waiter.response = cmd
                        waiter.event.set()
                    continue
                tasks.start_soon(self._serve, cmd)
            if decoder.error is not None:
                self.close_reason = f"malformed frame: {decoder.error}"
                return
            if decoder.closed:
                self.close_reason = self.close_reason or "closed by peer"
                return

    def _fail_pending(self) -> None:
        for opaque, waiter in list(self._pending.items()):
            error = RemotingConnectionLostError(self.remote_address, self.close_reason or "connection closed")
            if waiter.done is not None:
                self._call_done(opaque, waiter, None, error)
            elif not waiter.event.is_set():
                waiter.error = error
                waiter.event.set()

    async def _serve(self, cmd: RemotingCommand) -> None:
        try:
            response = await self._handler(self, cmd)
        except Exception as e:  # a bug in a handler answers SYSTEM_ERROR; the connection stays
            log.exception("%s: handler for %s failed", self.remote_address, code_name(cmd.code))
            response = cmd.make_response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
        if response is None or cmd.is_oneway:
            return
        try:
            data = encode_command(response.as_response_to(cmd), self.max_frame_size)
        except LocalProtocolError as e:
            data = encode_command(cmd.make_response(ResponseCode.SYSTEM_ERROR, f"response could not be encoded: {e}"),
                                  self.max_frame_size)
        try:
            await self._send(data)
        except RemotingConnectionLostError:
            pass


class RemotingClient:
    """Create with open_remoting_client(); connections run in its task group."""

    def __init__(self, tasks, *, handler: Handler | None = None, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 default_timeout: float = DEFAULT_TIMEOUT,
                 rpc_hook: Callable[[RemotingCommand], RemotingCommand] | None = None,
                 tls: ClientTls | None = None) -> None:
        self._tasks = tasks
        self.rpc_hook = rpc_hook
        self.tls = tls if tls is not None and tls.enabled else None
        self._handler = handler
        self.max_frame_size = max_frame_size
        self.default_timeout = default_timeout
        self._conns: dict[str, ClientConnection] = {}
        self._dial_locks: dict[str, anyio.Lock] = {}
        self._closed = False
        self.dials = 0

    def cached(self, addr: str) -> ClientConnection | None:
        conn = self._conns.get(addr)
        return None if conn is None or conn.closed else conn

    async def connection(self, addr: str, timeout: float | None = None) -> ClientConnection:
        if self._closed:
            raise RemotingConnectError(addr, "the client is closed")
        if (conn := self.cached(addr)) is not None:
            return conn
        timeout = self.default_timeout if timeout is None else timeout
        with anyio.move_on_after(timeout):
            return await self._dial(addr)
        raise RemotingConnectError(addr, f"timed out after {timeout:g} s")

    async def _dial(self, addr: str) -> ClientConnection:
        lock = self._dial_locks.setdefault(addr, anyio.Lock())
        async with lock:  # concurrent callers share one dial
            if (conn := self.cached(addr)) is not None:
                return conn
            if self._closed:
                raise RemotingConnectError(addr, "the client is closed")
            try:
                host, port = parse_addr(addr)
            except ValueError as e:
                raise RemotingConnectError(addr, str(e)) from None
            try:
                if self.tls is None:
                    stream = await anyio.connect_tcp(host, port)
                else:
                    stream = await anyio.connect_tcp(host, port, ssl_context=self.tls.context, tls_hostname=host,
                                                     tls_standard_compatible=False)
            except ssl.SSLError as e:  # (an OSError too: before the plain dial errors)
                raise RemotingConnectError(addr, f"TLS handshake failed: {e}") from None
            except anyio.BrokenResourceError as e:
                raise RemotingConnectError(addr, f"TLS handshake failed: {e.__cause__ or e!r}") from None
            except OSError as e:
                raise RemotingConnectError(addr, _connect_reason(e)) from None
            self.dials += 1
            conn = ClientConnection(stream, addr, self._handler, max_frame_size=self.max_frame_size)
            self._conns[addr] = conn
            self._tasks.start_soon(self._run, addr, conn)
            return conn

    async def _run(self, addr: str, conn: ClientConnection) -> None:
        try:
            await conn.run()
        finally:
            if self._conns.get(addr) is conn:
                del self._conns[addr]

    def close_connection(self, addr: str) -> None:
        if (conn := self._conns.get(addr)) is not None:
            conn.close()

    def close(self) -> None:
        self._closed = True
        for conn in list(self._conns.values()):
            conn.close("client closed")

    def _outgoing(self, cmd: RemotingCommand | SendRequest) -> RemotingCommand | SendRequest:
        if self.rpc_hook is None:
            return cmd
        return self.rpc_hook(cmd.command() if type(cmd) is SendRequest else cmd)

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float | None = None) -> RemotingCommand:
        cmd = self._outgoing(cmd)
        timeout = self.default_timeout if timeout is None else timeout
        conn = self._conns.get(addr)
        if conn is None or conn._closed or self._closed:  # dial (or learn why not) first, within the timeout
            deadline = anyio.current_time() + timeout
            conn = await self.connection(addr, timeout)
            remaining = max(0.0, deadline - anyio.current_time())
        else:
            remaining = timeout  # (a cached connection: no clock reads, nothing awaited before the request)
        try:
            return await conn.invoke(cmd, remaining)
        except RemotingTimeoutError as e:
            e.addr, e.timeout = addr, timeout
            raise

    def submit(self, addr: str, cmd: RemotingCommand, timeout: float, done: Done) -> bool:
        """ClientConnection.submit on the cached connection to `addr`; False
        when there is none (dialing waits: the caller takes invoke)."""
        conn = self.cached(addr)
        return conn is not None and conn.submit(self._outgoing(cmd), timeout, done)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand, timeout: float | None = None) -> None:
        cmd = self._outgoing(cmd)
        timeout = self.default_timeout if timeout is None else timeout
        deadline = anyio.current_time() + timeout
        conn = await self.connection(addr, timeout)
        await conn.send_request_oneway(cmd, max(0.0, deadline - anyio.current_time()))


@asynccontextmanager
async def open_remoting_client(**kw) -> AsyncIterator[RemotingClient]:
    async with anyio.create_task_group() as tasks:
        client = RemotingClient(tasks, **kw)
        try:
            yield client
        finally:
            client.close()
            tasks.cancel_scope.cancel()
