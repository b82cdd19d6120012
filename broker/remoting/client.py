# Owns RemotingClient: request/response calls to "host:port" addresses over
# cached connections (one per address, shared by every concurrent caller,
# redialed on the next call after it breaks), for the broker (name server
# registration), the Python client library and mqadmin.
#
#   async with open_remoting_client() as client:
#       response = await client.invoke("127.0.0.1:9876", request, timeout=3)
#
# Errors: RemotingConnectError (could not connect, within the timeout),
# RemotingTimeoutError (no response in time), RemotingConnectionLostError
# (the connection broke with the request in flight), LocalProtocolError (the
# request cannot be encoded).  Requests the server pushes on a client
# connection (NOTIFY_CONSUMER_IDS_CHANGED...) go to `handler`; without one
# they are answered REQUEST_CODE_NOT_SUPPORTED.
#
# Two optional layers, as RocketMQ's NettyRemotingClient has them:
# `rpc_hook` rewrites every request just before it is sent (the ACL signer,
# broker/acl/signing.py: a signature covers the final ext fields and body),
# and `tls` (tls.ClientTls) dials with TLS, its handshake part of the dial,
# so a server certificate the client does not trust fails the dial.
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import trio

from broker.remoting.codec import DEFAULT_MAX_FRAME_SIZE
from broker.remoting.codes import SerializeType
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Connection, RequestHandler
from broker.remoting.errors import RemotingConnectError, RemotingTimeoutError
from broker.remoting.tls import ClientTls

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 3.0  # seconds; Java's default for most client calls


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


def os_error_text(e: OSError) -> str:
    """The cause of a failed connect in words ("Connection refused"):
    trio's open_tcp_stream raises "all attempts to connect ... failed"
    with the per-address errors as its cause; those are what to tell."""
    if e.strerror:
        return e.strerror
    causes, stack = [], [e.__cause__]
    while stack:
        x = stack.pop()
        if isinstance(x, BaseExceptionGroup):
            stack.extend(x.exceptions)
        elif isinstance(x, OSError):
            causes.append(x.strerror or str(x))
    return "; ".join(sorted(set(causes))) or str(e)


class RemotingClient:
    """Create with open_remoting_client(); its connections run in the
    nursery it was given and close when that nursery ends."""

    def __init__(self, nursery: trio.Nursery, *, handler: RequestHandler | None = None,
                 max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 serialize_type: SerializeType | None = None,
                 default_timeout: float = DEFAULT_TIMEOUT,
                 rpc_hook: Callable[[RemotingCommand], RemotingCommand] | None = None,
                 tls: ClientTls | None = None) -> None:
        self._nursery = nursery
        self.rpc_hook = rpc_hook
        self.tls = tls if tls is not None and tls.enabled else None
        self._handler = handler
        self.max_frame_size = max_frame_size
        # None: send each command in its own serialize_type; else override.
        self.serialize_type = serialize_type
        self.default_timeout = default_timeout
        self._conns: dict[str, Connection] = {}
        self._dial_locks: dict[str, trio.Lock] = {}
        self._closed = False
        self.dials = 0

    # --- connections -------------------------------------------------------------

    def cached(self, addr: str) -> Connection | None:
        """The open connection to addr, if there is one."""
        conn = self._conns.get(addr)
        return None if conn is None or conn.closed else conn

    async def connection(self, addr: str, timeout: float | None = None) -> Connection:
        """The connection to addr, dialing it if needed."""
        if self._closed:
            raise RemotingConnectError(addr, "the client is closed")
        if (conn := self.cached(addr)) is not None:
            return conn
        timeout = self.default_timeout if timeout is None else timeout
        with trio.move_on_after(timeout):
            return await self._dial(addr)
        raise RemotingConnectError(addr, f"timed out after {timeout:g} s")

    async def _dial(self, addr: str) -> Connection:
        lock = self._dial_locks.setdefault(addr, trio.Lock())
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
                stream = await trio.open_tcp_stream(host, port)
            except OSError as e:
                raise RemotingConnectError(addr, os_error_text(e)) from None
            if self.tls is not None:
                try:
                    stream = await self.tls.wrap(stream, host)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
                    await trio.aclose_forcefully(stream)
                    raise RemotingConnectError(addr, f"TLS handshake failed: {e.__cause__ or e}") from None
                except BaseException:
                    await trio.aclose_forcefully(stream)
                    raise
            self.dials += 1
            conn = Connection(stream, self._handler, max_frame_size=self.max_frame_size)
            self._conns[addr] = conn
            self._nursery.start_soon(self._run, addr, conn)
            return conn

    async def _run(self, addr: str, conn: Connection) -> None:
        try:
            await conn.run()
        finally:
            if self._conns.get(addr) is conn:
                del self._conns[addr]
            log.debug("connection to %s ended: %s", addr, conn.close_reason)

    def close_connection(self, addr: str) -> None:
        if (conn := self._conns.get(addr)) is not None:
            conn.close()

    def close(self) -> None:
        """Close every connection and refuse new calls."""
        self._closed = True
        for conn in list(self._conns.values()):
            conn.close("client closed")

    # --- calls -------------------------------------------------------------------

    def _outgoing(self, cmd: RemotingCommand) -> RemotingCommand:
        if self.serialize_type is not None and cmd.serialize_type != self.serialize_type:
            cmd = attrs.evolve(cmd, serialize_type=self.serialize_type)
        return cmd if self.rpc_hook is None else self.rpc_hook(cmd)

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float | None = None) -> RemotingCommand:
        """Send a request and wait for its response; `timeout` (seconds)
        covers connecting, sending and waiting."""
        timeout = self.default_timeout if timeout is None else timeout
        deadline = trio.current_time() + timeout
        conn = await self.connection(addr, timeout)
        remaining = max(0.0, deadline - trio.current_time())
        try:
            return await conn.invoke(self._outgoing(cmd), remaining)
        except RemotingTimeoutError as e:
            e.addr, e.timeout = addr, timeout  # what the caller asked for
            raise

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand, timeout: float | None = None) -> None:
        timeout = self.default_timeout if timeout is None else timeout
        deadline = trio.current_time() + timeout
        conn = await self.connection(addr, timeout)
        await conn.send_request_oneway(self._outgoing(cmd), max(0.0, deadline - trio.current_time()))


@asynccontextmanager
async def open_remoting_client(**kw) -> AsyncIterator[RemotingClient]:
    async with trio.open_nursery() as nursery:
        client = RemotingClient(nursery, **kw)
        try:
            yield client
        finally:
            client.close()
            nursery.cancel_scope.cancel()

