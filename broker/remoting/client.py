# Owns the one remoting client, on anyio so asyncio and trio callers share
# it (the client library, the broker's name-server registration and
# forwarding, mqadmin, the dashboard, the tools): ClientConnection (one dialed
# TCP connection: requests out with their opaque, responses matched back to
# their waiter, requests the peer pushes -- NOTIFY_CONSUMER_IDS_CHANGED,
# CHECK_TRANSACTION_STATE -- handed to a handler in their own task) and
# RemotingClient (one cached connection per "host:port", shared by every
# caller, redialed on the next call after it breaks).  The bytes are the
# sans-IO codec's (encode_request, or a Framed request's own bytes; reads
# decoded by responses.ResponseDecoder); this module only moves them.
#
# Errors (errors.py): RemotingConnectError, RemotingTimeoutError (`silent`
# when the connection never received a byte), RemotingConnectionLostError
# (broken, or a malformed frame, with the request in flight),
# LocalProtocolError (the request cannot be encoded).  Callers translate them
# at their own boundary.  Optional layers, as in NettyRemotingClient:
# `rpc_hook` rewrites every request just before it is sent (the ACL signer:
# a signature covers the final ext fields and body), `tls` dials with TLS.
#
# Budgets (the peer is not trusted): a frame over max_frame_size, or one the
# codec refuses, closes that connection only (its waiters fail with
# "malformed frame: ..."); the decoder holds at most one unfinished frame; at
# most max_pushed pushed requests run at once, the rest answered SYSTEM_BUSY
# (oneway ones dropped); senders stop at OUTBOX_LIMIT queued bytes; a bug met
# while serving a connection closes it and is logged, never raised into the
# client's task group.
import itertools
import logging
import math
import os
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Protocol

import anyio
import anyio.abc
import attrs
import sniffio

from broker.remoting.codec import DEFAULT_MAX_FRAME_SIZE, encode_command, encode_request
from broker.remoting.codes import RPC_TYPE_RESPONSE, ResponseCode, SerializeType, code_name
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import (
    LocalProtocolError,
    RemotingConnectError,
    RemotingConnectionLostError,
    RemotingTimeoutError,
    RequestError,
)
from broker.remoting.responses import ResponseDecoder
from broker.remoting.tls import ClientTls

log = logging.getLogger(__name__)

Handler = Callable[["ClientConnection", RemotingCommand], Awaitable[RemotingCommand | None]]
DEFAULT_TIMEOUT = 3.0  # seconds; Java's default for most client calls
DEFAULT_MAX_PUSHED = 256  # requests pushed by the peer handled at once, per connection
RECV_CHUNK = 64 * 1024
OUTBOX_LIMIT = 4 << 20  # bytes queued for a connection's writer before senders wait
SWEEP_INTERVAL = 0.05  # how late a request's timeout may fire, at most
_IO_ERRORS = (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)
_MAX_OPAQUE = (1 << 31) - 1


class Framed(Protocol):
    """A request that encodes itself (wire.SendRequest): taken wherever a
    RemotingCommand is; frame() must equal encode_request(command(), ...)."""

    code: int

    def frame(self, opaque: int, oneway: bool = False, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes: ...

    def command(self) -> RemotingCommand: ...


Request = RemotingCommand | Framed


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


def connect_reason(e: OSError, host: str, port: int) -> str:
    """Why a dial failed, in the same words on every backend: anyio wraps
    each address's own error in one "All connection attempts failed", and
    asyncio's words for ECONNREFUSED differ from trio's; the errno's text
    is what to tell ("Error connecting to ('127.0.0.1', 9876): Connection
    refused").  A name that does not resolve says so in its own words."""
    if isinstance(e, socket.gaierror):
        return e.strerror or str(e)
    texts, stack = [], [e]
    while stack:
        x = stack.pop()
        if isinstance(x, BaseExceptionGroup):
            stack.extend(x.exceptions)
            continue
        if isinstance(x, OSError) and x.errno and x.errno > 0:
            texts.append(os.strerror(x.errno))
        elif isinstance(x, OSError) and x.__cause__ is not None:
            stack.append(x.__cause__)
    if not texts:
        return e.strerror or str(e)
    return f"Error connecting to {(host, port)!r}: {'; '.join(sorted(set(texts)))}"


async def not_supported(conn, cmd: RemotingCommand) -> RemotingCommand:
    """The handler of a connection that serves nothing (Java's wording)."""
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

    def __init__(self, stream: anyio.abc.ByteStream, addr: str, handler: Handler | None = None, *,
                 max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, max_pushed: int = DEFAULT_MAX_PUSHED) -> None:
        self.stream = stream
        self.remote_address = addr
        self.max_frame_size = max_frame_size
        self.max_pushed = max_pushed
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
        self._ended = anyio.Event()  # set when run() is over
        self._pending: dict[int, _Waiter] = {}
        self._new_event = _native_event_class()
        self._opaques = itertools.count(1)
        self._pushed = 0  # pushed requests being handled
        self.pushed_refused = 0  # pushed requests answered SYSTEM_BUSY (or dropped) past max_pushed
        self._heard = False  # any bytes read from the peer (a silent port is named in timeouts)
        self._closed = False
        self._scope = anyio.CancelScope()

    def __repr__(self) -> str:
        return f"<ClientConnection -> {self.remote_address}>"

    # --- state ---------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once the connection can no longer carry a request."""
        return self._closed

    def close(self, reason: str = "closed locally") -> None:
        if self.close_reason is None:
            self.close_reason = reason
        self._closed = True
        self._scope.cancel()

    async def wait_closed(self) -> None:
        """Returns once the connection is over (its socket closed)."""
        await self._ended.wait()

    @property
    def in_flight_responses(self) -> int:
        """Requests sent on this connection that still wait for a response."""
        return len(self._pending)

    def _lost(self) -> RemotingConnectionLostError:
        return RemotingConnectionLostError(self.remote_address, self.close_reason or "connection closed")

    # --- sending ---------------------------------------------------------------

    def _next_opaque(self) -> int:
        while True:
            opaque = next(self._opaques)
            if opaque > _MAX_OPAQUE:  # Java's AtomicInteger wraps; stay positive
                self._opaques = itertools.count(1)
                continue
            if opaque not in self._pending:
                return opaque

    async def _send(self, data: bytes) -> None:
        """Queue one whole frame for the writer, waiting for room."""
        while True:
            if self._closed:
                raise self._lost()
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
                error = RemotingTimeoutError(self.remote_address, waiter.code, waiter.timeout,
                                             silent=not self._heard)
                if waiter.done is not None:
                    self._call_done(opaque, waiter, None, error)
                elif not waiter.event.is_set():
                    waiter.error = error
                    waiter.event.set()

    def _frame(self, cmd: Request, opaque: int, oneway: bool) -> bytes:
        if type(cmd) is RemotingCommand:
            return encode_request(cmd, opaque, oneway, self.max_frame_size)
        return cmd.frame(opaque, oneway, self.max_frame_size)

    async def invoke(self, cmd: Request, timeout: float) -> RemotingCommand:
        """Send a request, wait for its answer.  The timeout is kept by the
        connection's sweeper, not by a cancel scope per request (every
        pipelined send paid for one); only a send that must wait for room
        in the outbox takes a scope."""
        if self._closed:
            raise self._lost()
        opaque = self._next_opaque()
        data = encode_request(cmd, opaque, False, self.max_frame_size) if type(cmd) is RemotingCommand else \
            cmd.frame(opaque, False, self.max_frame_size)
        waiter = _Waiter(self._new_event(), cmd.code, timeout)
        self._pending[opaque] = waiter
        try:
            if self._outbox_bytes < OUTBOX_LIMIT:
                self._queue(data)
            else:
                with anyio.move_on_after(timeout) as scope:
                    await self._send(data)
                if scope.cancelled_caught:
                    raise RemotingTimeoutError(self.remote_address, cmd.code, timeout, silent=not self._heard)
            if len(self._pending) == 1:
                self._sweep.set()  # the sweeper was idle
            await waiter.event.wait()
            if waiter.response is not None:
                return waiter.response
            raise waiter.error or RemotingTimeoutError(self.remote_address, cmd.code, timeout)
        finally:
            self._pending.pop(opaque, None)

    def submit(self, cmd: Request, timeout: float, done: Done) -> bool:
        """Send a request without a task waiting for it: `done(response,
        None)` or `done(None, error)` is called from this connection's read
        loop (or its sweeper, or when it ends) exactly once.  False, and
        nothing sent, when the connection is closed or its outbox full (the
        caller takes the waiting path, invoke)."""
        if self._closed or self._outbox_bytes >= OUTBOX_LIMIT:
            return False
        opaque = self._next_opaque()
        data = encode_request(cmd, opaque, False, self.max_frame_size) if type(cmd) is RemotingCommand else \
            cmd.frame(opaque, False, self.max_frame_size)
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

    async def send_request_oneway(self, cmd: Request, timeout: float | None = None) -> None:
        """Send `cmd` flagged oneway; the peer sends no response."""
        data = self._frame(cmd, self._next_opaque(), True)
        with anyio.move_on_after(math.inf if timeout is None else timeout):
            await self._send(data)
            return
        raise RemotingTimeoutError(self.remote_address, cmd.code, timeout)

    # --- the connection's life -------------------------------------------------

    async def run(self) -> None:
        """Read the connection until it ends; never raises what the peer's
        bytes caused (a bug met while serving it closes it and is logged)."""
        try:
            with self._scope:
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._writer)
                    tasks.start_soon(self._sweeper)
                    await self._read_loop(tasks)
                    tasks.cancel_scope.cancel()
        except Exception as e:
            if self.close_reason is None:
                self.close_reason = f"serving the connection failed: {type(e).__name__}: {e}"
            log.exception("%s: serving the connection failed", self.remote_address)
        finally:
            self._closed = True
            self._drained.set()  # senders waiting for room learn it is closed
            self._fail_pending()
            with anyio.CancelScope(shield=True):
                try:
                    await self.stream.aclose()
                except Exception:  # (a TLS close on a dead socket)
                    pass
            self._ended.set()
            log.debug("%r closed: %s", self, self.close_reason)

    async def _read_loop(self, tasks) -> None:
        decoder, pending, receive = self._decoder, self._pending, self.stream.receive
        while True:
            try:
                data = await receive(RECV_CHUNK)
            except anyio.EndOfStream:
                data = b""
            except _IO_ERRORS as e:
                self.close_reason = self.close_reason or f"receive failed: {e!r}"
                return
            self._heard = True
            try:
                cmds = decoder.feed(data)
            except Exception as e:  # a frame the decoder did not bound: as a malformed one
                log.exception("%s: decoding a frame failed", self.remote_address)
                self.close_reason = self.close_reason or f"malformed frame: {type(e).__name__}: {e}"
                return
            for cmd in cmds:
                if cmd.flag & RPC_TYPE_RESPONSE:
                    waiter = pending.get(cmd.opaque)
                    if waiter is None:
                        continue  # (usually the answer to a request that timed out)
                    if waiter.done is not None:
                        self._call_done(cmd.opaque, waiter, cmd, None)
                    elif not waiter.event.is_set():
                        waiter.response = cmd
                        waiter.event.set()
                    continue
                if self._pushed < self.max_pushed:
                    self._pushed += 1
                    tasks.start_soon(self._serve, cmd)
                else:
                    self._busy(cmd)
            if decoder.error is not None:
                self.close_reason = self.close_reason or f"malformed frame: {decoder.error}"
                log.warning("%s: %s; closing the connection", self.remote_address, self.close_reason)
                return
            if decoder.closed:
                self.close_reason = self.close_reason or "closed by peer"
                return

    def _fail_pending(self) -> None:
        for opaque, waiter in list(self._pending.items()):
            error = self._lost()
            if waiter.done is not None:
                self._call_done(opaque, waiter, None, error)
            elif not waiter.event.is_set():
                waiter.error = error
                waiter.event.set()

    # --- requests the peer pushes ----------------------------------------------

    def _busy(self, cmd: RemotingCommand) -> None:
        """A pushed request past max_pushed: SYSTEM_BUSY at once, without a
        task (dropped when oneway, or when the outbox is full: a peer that
        pushes and does not read gets nothing more queued)."""
        self.pushed_refused += 1
        if self.pushed_refused & (self.pushed_refused - 1) == 0:  # the 1st, 2nd, 4th, 8th ...: a flood logs little
            log.warning("%s: %d pushed requests in flight; %s refused (%d so far)", self.remote_address,
                        self._pushed, code_name(cmd.code), self.pushed_refused)
        if cmd.is_oneway or self._closed or self._outbox_bytes >= OUTBOX_LIMIT:
            return
        self._queue(encode_command(cmd.make_response(
            ResponseCode.SYSTEM_BUSY, f"[OVERLOAD] {self._pushed} pushed requests in flight"), self.max_frame_size))

    async def _serve(self, cmd: RemotingCommand) -> None:
        try:
            try:
                response = await self._handler(self, cmd)
            except RequestError as e:
                response = cmd.make_response(e.code, e.remark)
            except Exception as e:  # a bug in a handler answers SYSTEM_ERROR; the connection stays
                log.exception("%s: handler for %s failed", self.remote_address, code_name(cmd.code))
                response = cmd.make_response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
            if response is None or cmd.is_oneway:
                return
            try:
                data = encode_command(response.as_response_to(cmd), self.max_frame_size)
            except (LocalProtocolError, ValueError, TypeError) as e:
                data = encode_command(cmd.make_response(ResponseCode.SYSTEM_ERROR,
                                                        f"response could not be encoded: {e}"), self.max_frame_size)
            await self._send(data)
        except RemotingConnectionLostError:
            pass  # the reader notices and ends the connection
        finally:
            self._pushed -= 1


class RemotingClient:
    """Create with open_remoting_client(), or with a task group (or trio
    nursery) of the caller's; its connections run there and close when it
    ends."""

    def __init__(self, tasks, *, handler: Handler | None = None, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 serialize_type: SerializeType | None = None,
                 default_timeout: float = DEFAULT_TIMEOUT,
                 rpc_hook: Callable[[RemotingCommand], RemotingCommand] | None = None,
                 tls: ClientTls | None = None, max_pushed: int = DEFAULT_MAX_PUSHED) -> None:
        self._tasks = tasks
        self.rpc_hook = rpc_hook
        self.tls = tls if tls is not None and tls.enabled else None
        self._handler = handler
        self.max_frame_size = max_frame_size
        self.max_pushed = max_pushed
        # None: send each command in its own serialize_type; else override.
        self.serialize_type = serialize_type
        self.default_timeout = default_timeout
        self._conns: dict[str, ClientConnection] = {}
        self._dial_locks: dict[str, anyio.Lock] = {}
        self._closed = False
        self.dials = 0

    # --- connections -------------------------------------------------------------

    def cached(self, addr: str) -> ClientConnection | None:
        """The open connection to addr, if there is one."""
        conn = self._conns.get(addr)
        return None if conn is None or conn.closed else conn

    async def connection(self, addr: str, timeout: float | None = None) -> ClientConnection:
        """The connection to addr, dialing it if needed."""
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
                raise RemotingConnectError(addr, connect_reason(e, host, port)) from None
            self.dials += 1
            conn = ClientConnection(stream, addr, self._handler, max_frame_size=self.max_frame_size,
                                    max_pushed=self.max_pushed)
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
        """Close every connection and refuse new calls."""
        self._closed = True
        for conn in list(self._conns.values()):
            conn.close("client closed")

    # --- calls -------------------------------------------------------------------

    def _outgoing(self, cmd: Request) -> Request:
        if self.serialize_type is not None:
            if type(cmd) is not RemotingCommand:
                cmd = cmd.command()
            if cmd.serialize_type != self.serialize_type:
                cmd = attrs.evolve(cmd, serialize_type=self.serialize_type)
        if self.rpc_hook is None:
            return cmd
        return self.rpc_hook(cmd if type(cmd) is RemotingCommand else cmd.command())

    async def invoke(self, addr: str, cmd: Request, timeout: float | None = None) -> RemotingCommand:
        """Send a request and wait for its response; `timeout` (seconds)
        covers connecting, sending and waiting."""
        if self.rpc_hook is not None or self.serialize_type is not None:
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
            e.addr, e.timeout = addr, timeout  # what the caller asked for
            raise

    def submit(self, addr: str, cmd: Request, timeout: float, done: Done) -> bool:
        """ClientConnection.submit on the cached connection to `addr`; False
        when there is none (dialing waits: the caller takes invoke)."""
        conn = self.cached(addr)
        return conn is not None and conn.submit(self._outgoing(cmd), timeout, done)

    async def invoke_oneway(self, addr: str, cmd: Request, timeout: float | None = None) -> None:
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
