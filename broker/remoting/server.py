# Owns the remoting server: the TCP listener, one Connection (and task) per
# accepted socket, and RequestDispatcher, the code -> processor table that
# answers REQUEST_CODE_NOT_SUPPORTED for codes nobody registered (Java's
# NettyRemotingServer + registerProcessor).
#
#   async with trio.open_nursery() as n:
#       server = await n.start(serve_remoting, dispatcher, "127.0.0.1", 0)
#       server.port  # the bound port
#
# The handler gets (connection, request) and returns the response, or None
# when it has nothing to send (oneway requests never get one; a handler may
# also answer later through conn.send_response).  A processor registered
# with register_burst() instead gets every request of its codes that one
# read brought, at once (RequestDispatcher is a connection.BurstHandler):
# accept_burst(conn, cmds) runs synchronously in the read loop and returns
# their BurstAnswers (answers.py; a plain async function that returns the
# answers is taken as one given that way).
#
# With `limits` every connection shares the server's budgets: one
# FrameBudget (bytes of unfinished frames), one Pacer (requests handed over
# per scheduler round, installed as a trio instrument while the server
# runs) and the ConnectionGate's caps.  What goes wrong in one connection
# stays there: serve_one contains anything that escapes it (logged, counted
# in RemotingServer.stats), so the serving nursery -- and with it the
# process -- never sees a peer's input.
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from broker.remoting.answers import BurstAnswers, BurstFinish, as_answers
from broker.remoting.codec import DEFAULT_MAX_FRAME_SIZE
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import (
    DEFAULT_MAX_IN_FLIGHT,
    BurstHandler,
    Connection,
    RequestHandler,
    not_supported,
    peer_address,
)
from broker.remoting.containment import ConnectionStats, report_failure
from broker.remoting.pacing import Pacer
from broker.remoting.streams import ConnectionGate, FrameBudget, ServerLimits, accepted, return_freed_memory
from broker.remoting.tls import ServerTls

log = logging.getLogger(__name__)

Processor = Callable[[Connection, RemotingCommand], Awaitable[RemotingCommand | None]]


class BurstProcessor(Protocol):
    def accept_burst(self, conn: Connection, cmds: list[RemotingCommand]) -> BurstAnswers | BurstFinish: ...


class RequestDispatcher:
    """A RequestHandler that routes by request code."""

    def __init__(self, default: Processor = not_supported) -> None:
        self._processors: dict[int, Processor] = {}
        self._bursts: dict[int, BurstProcessor] = {}
        self._default = default

    def register(self, code: int, processor: Processor) -> None:
        self._processors[int(code)] = processor

    def register_burst(self, code: int, processor: BurstProcessor) -> None:
        """Requests of `code` read together go to processor.accept_burst
        (a code registered both ways is served as a burst)."""
        self._bursts[int(code)] = processor

    @property
    def codes(self) -> frozenset[int]:
        return frozenset(self._processors) | frozenset(self._bursts)

    def serves(self, code: int) -> bool:
        """Whether a processor is registered for `code`."""
        return code in self._processors or code in self._bursts

    def split_burst(self, conn: Connection, cmds: list[RemotingCommand]) -> tuple[list, list]:
        bursts = self._bursts
        if not bursts:
            return cmds, []
        singles: list[RemotingCommand] = []
        groups: dict[int, tuple[BurstProcessor, list[RemotingCommand]]] = {}  # by processor, in arrival order
        for cmd in cmds:
            processor = bursts.get(cmd.code)
            if processor is None:
                singles.extend(cmd.one_by_one())  # (a run of sends: one by one)
            else:
                groups.setdefault(id(processor), (processor, []))[1].append(cmd)
        return singles, [(group, as_answers(processor.accept_burst(conn, group)))
                         for processor, group in groups.values()]

    async def __call__(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        processor = self._processors.get(cmd.code, self._default)
        return await processor(conn, cmd)


class RemotingServer:
    """What serve_remoting() hands to task_status.started()."""

    def __init__(self, listeners: list[trio.SocketListener]) -> None:
        self.listeners = listeners
        self.connections: set[Connection] = set()
        self.accepted = 0
        self.stats = ConnectionStats()  # failures contained, connections shed by the budgets
        self.gate: ConnectionGate | None = None  # the connection caps, when limits are set
        self.budget: FrameBudget | None = None  # unfinished frames, when limits are set
        self.pacer: Pacer | None = None  # requests per scheduler round, when limits are set

    def hostile_metrics(self) -> list[tuple[str, str, str, dict, float]]:
        """What the server counts against hostile input, for the metrics
        collectors: (kind "counter" or "gauge", name, help, extra labels, value)."""
        stats, budget = self.stats, self.budget
        out = [
            ("counter", "ledgermq_remoting_connection_failures", "Connections closed by an unexpected exception "
             "while serving their bytes (decoder, burst handler, encoding, a bug): logged and contained", {},
             stats.connection_failures),
            ("counter", "ledgermq_remoting_handler_failures", "Requests answered SYSTEM_ERROR after their "
             "handler raised an unexpected exception", {}, stats.handler_failures),
            ("counter", "ledgermq_remoting_connections_shed", "Connections closed to keep a budget",
             {"budget": "unfinished_frames"}, stats.shed_unfinished),
            ("counter", "ledgermq_remoting_connections_shed", "Connections closed to keep a budget",
             {"budget": "connections"}, self.gate.shed if self.gate is not None else 0),
            ("gauge", "ledgermq_remoting_unfinished_frame_bytes", "Bytes of frames begun and not complete that "
             "the connections hold (serverMaxUnfinishedFrameBytes)", {}, budget.used if budget else 0),
        ]
        if self.pacer is not None:
            out.append(("counter", "ledgermq_remoting_rounds_deferred", "Times a connection left requests for "
                        "the next scheduler round (serverRequestsPerRound)", {}, self.pacer.deferred))
        return out

    @property
    def sockname(self) -> tuple[str, int]:
        return self.listeners[0].socket.getsockname()[:2]

    @property
    def port(self) -> int:
        return self.sockname[1]

    @property
    def address(self) -> str:
        """host:port of the first listener (what a client on this machine
        dials; 0.0.0.0 is shown as 127.0.0.1)."""
        host, port = self.sockname
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def serve_remoting(handler: RequestHandler, host: str | None, port: int, *,
                         max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                         max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                         on_connect: Callable[[Connection], None] | None = None,
                         on_close: Callable[[Connection], None] | None = None,
                         bursts: BurstHandler | None = None,
                         raw_sends: bool = False,
                         tls: ServerTls | None = None,
                         limits: ServerLimits | None = None,
                         task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Listen on host:port (port 0 picks one; host None means every
    interface) and serve until cancelled.  raw_sends: plain SEND_MESSAGE_V2
    requests reach `bursts` as codec.RawSend (its send processor takes them).
    `tls` and `limits` (streams.py: connection caps, idle/frame/write
    timeouts) apply to every accepted socket before it becomes a Connection;
    without them a socket is served as it comes."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    server = RemotingServer(listeners)
    gate = ConnectionGate(limits) if limits is not None else None
    server.gate = gate
    if limits is not None:
        server.budget = FrameBudget(limits.max_unfinished_bytes)
        server.pacer = Pacer(limits.requests_per_round)
        return_freed_memory()  # (what the budget lets connections hold goes back once they are shed)
    stats = server.stats

    async def serve_one(stream: trio.SocketStream) -> None:
        peer = peer_address(stream)
        address = peer.rpartition(":")[0]
        try:
            async with accepted(stream, address, gate, limits, tls) as admitted:
                if admitted is not None:
                    await serve_connection(admitted)
        except* Exception as group:  # (Connection.run contains its own; this is the last line)
            stats.connection_failures += 1
            error = group.exceptions[0]
            report_failure(peer, "serving a connection", error)

    async def serve_connection(stream) -> None:
        conn = Connection(stream, handler, bursts=bursts, max_frame_size=max_frame_size,
                          max_in_flight=max_in_flight, raw_sends=raw_sends,
                          max_in_flight_bytes=limits.max_in_flight_bytes_per_connection if limits else None,
                          max_unfinished=limits.max_unfinished_bytes_per_connection if limits else None,
                          budget=server.budget, pacer=server.pacer, stats=stats)
        server.connections.add(conn)
        server.accepted += 1
        log.debug("accepted %r", conn)
        try:
            if on_connect is not None:
                on_connect(conn)
            await conn.run()
        finally:
            server.connections.discard(conn)
            if on_close is not None:
                on_close(conn)

    if server.pacer is not None:
        trio.lowlevel.add_instrument(server.pacer)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(trio.serve_listeners, serve_one, listeners,
                                                  handler_nursery=nursery))
            task_status.started(server)
    finally:
        if server.pacer is not None:
            trio.lowlevel.remove_instrument(server.pacer)
