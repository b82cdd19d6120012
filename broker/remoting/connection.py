# Owns one remoting connection, the same object on both ends: the server
# wraps each accepted socket in one, RemotingClient each dialed one.  It
#   * reads frames and routes them: responses to the invoke() waiting on that
#     opaque, requests to the handler, each in its own task, so a long-poll
#     pull suspended for seconds never blocks the requests behind it -- except
#     that the requests of one read that a BurstHandler takes (the broker's
#     sends) go to it together: its synchronous half runs right here, in
#     arrival order, and one task per burst waits and writes all the answers
#     in one write;
#   * writes whole frames under a lock (responses and requests interleave
#     per frame, never within one); frames queued while the lock is held go
#     out in the holder's write, one syscall for a burst of responses;
#   * can send requests of its own either way (invoke, send_request_oneway):
#     the broker pushes NOTIFY_CONSUMER_IDS_CHANGED to connected clients.
#
# Failure policy: a malformed frame gets a SYSTEM_ERROR response when its
# opaque could be read, then a lingering close (half-close, discard what the
# peer still sends for a moment) so the response is not lost to a RST; the
# in-flight handlers of that connection are cancelled.  A clean EOF gives
# in-flight handlers `eof_grace` seconds (a oneway commit sent just before a
# client closes is still applied).  A handler exception answers SYSTEM_ERROR
# and the connection stays up.  Nothing a peer sends ends anything but its
# own connection.
import itertools
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Protocol

import attrs
import trio

from broker.remoting.codec import (
    CLOSED,
    DEFAULT_MAX_FRAME_SIZE,
    NEED_DATA,
    CommandDecoder,
    SendRun,
    encode_command,
    encode_request,
    request_count,
)
from broker.remoting.codes import RPC_TYPE_RESPONSE, ResponseCode, SerializeType, code_name
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import (
    LocalProtocolError,
    RemoteProtocolError,
    RemotingConnectionLostError,
    RemotingTimeoutError,
    RequestError,
)
from broker.remoting.streams import direct_writer

log = logging.getLogger(__name__)

RequestHandler = Callable[["Connection", RemotingCommand], Awaitable[RemotingCommand | None]]
# The async half of a burst: one answer per item, in order (None: none; for
# a codec.SendRun, its answers as one bytes object or a list, see SendRun).
BurstFinish = Callable[[], Awaitable[list]]


class BurstHandler(Protocol):
    """Takes the requests of one read that it serves as a burst."""

    def split_burst(self, conn: "Connection", cmds: list[RemotingCommand]) -> \
            tuple[list[RemotingCommand], list[tuple[list[RemotingCommand], BurstFinish]]]:
        """(the requests to serve one by one, [(requests, finish)] taken as
        bursts).  Runs in the connection's read loop: synchronous, in order."""


class ClientConnection(Protocol):
    """What the broker keeps of a client's connection (its registry, offset
    reset pushes): Connection is one; tests pass small fakes."""

    remote_address: object
    attributes: dict[str, object]

    @property
    def closed(self) -> bool: ...

    async def send_request_oneway(self, cmd: RemotingCommand, timeout: float | None = None) -> None: ...


DEFAULT_MAX_IN_FLIGHT = 1024
RECV_CHUNK = 256 * 1024
_CONN_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)
_MAX_OPAQUE = (1 << 31) - 1


async def not_supported(conn: "Connection", cmd: RemotingCommand) -> RemotingCommand:
    """The handler of a connection that serves nothing (Java's wording)."""
    return cmd.make_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                             f" request type {cmd.code} not supported")


def exception_desc(e: BaseException) -> str:
    """What the SYSTEM_ERROR remark says about a failed handler."""
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def peer_address(stream: trio.SocketStream, local: bool = False) -> str:
    try:
        sock = stream.socket
        host, port = (sock.getsockname() if local else sock.getpeername())[:2]
    except (OSError, AttributeError):
        return "?"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@attrs.define(eq=False)
class _Waiter:
    event: trio.Event = attrs.field(factory=trio.Event)
    response: RemotingCommand | None = None
    error: Exception | None = None


class Connection:
    """One remoting connection.  Someone must run `await conn.run()` (the
    server or the client does); it returns when the connection is over."""

    def __init__(self, stream: trio.SocketStream, handler: RequestHandler | None = None, *,
                 bursts: BurstHandler | None = None,
                 max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 raw_sends: bool = False,
                 max_in_flight_bytes: int | None = None,
                 eof_grace: float = 1.0, linger: float = 1.0) -> None:
        self.stream = stream
        self.remote_address = peer_address(stream)
        self.local_address = peer_address(stream, local=True)
        self.max_frame_size = max_frame_size
        self.eof_grace = eof_grace
        self.linger = linger
        # Free for the application (the name server notes which brokers
        # registered over this connection; the broker notes the client id).
        self.attributes: dict[str, object] = {}
        self.close_reason: str | None = None
        self._handler = handler or not_supported
        self._bursts = bursts
        # raw_sends: plain SEND_MESSAGE_V2 requests arrive as SendRuns (see
        # codec); only a server whose burst handler takes them asks for that.
        self._decoder = CommandDecoder(max_frame_size, raw_sends=raw_sends)
        self._send_lock = trio.Lock()
        # Writes a frame straight to the socket when nothing else is being
        # written (no lock, no trio socket round); None over TLS.
        self._write_now = direct_writer(stream)
        self._outbox: list[bytes] = []  # frames waiting for the send lock
        self._queued = 0  # frames queued so far; the last one is frame number _queued
        self._written = 0  # frames 1.._written are written
        self._send_broken = False
        self._closing = False
        self._reading = True
        self._pending: dict[int, _Waiter] = {}
        self._opaques = itertools.count(1)
        # Requests handed over and not yet answered; the reader stops
        # reading at max_in_flight and waits on _room (set when answers
        # bring the count back under).  A counter, not a Semaphore: a read
        # is admitted with one addition, not one acquire per request.
        self.max_in_flight = max_in_flight
        self._in_flight = 0
        self._room: trio.Event | None = None
        # Byte budget (servers): the bytes read are billed to the requests
        # dispatched from them and held until the last of those is answered;
        # past the budget reading stops, so a client that sends big requests
        # and never reads the answers holds at most about the budget (plus
        # one read and one frame), not max_in_flight frames.
        self._max_held = max_in_flight_bytes
        self._held = 0  # bytes billed and not yet answered
        self._unbilled = 0  # bytes read since the last dispatch
        self._held_dropped = trio.Event()
        self._scope = trio.CancelScope()
        self._closed = trio.Event()

    def __repr__(self) -> str:
        return f"<Connection {self.local_address} -> {self.remote_address}>"

    # --- state ---------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once the connection can no longer carry a request/response."""
        return self._closing or self._closed.is_set() or self._send_broken or not self._reading

    def close(self, reason: str = "closed locally") -> None:
        if self.close_reason is None:
            self.close_reason = reason
        self._closing = True
        self._scope.cancel()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    @property
    def in_flight_responses(self) -> int:
        """Requests this side sent that still wait for their response."""
        return len(self._pending)

    # --- sending ---------------------------------------------------------------

    def _next_opaque(self) -> int:
        while True:
            opaque = next(self._opaques)
            if opaque > _MAX_OPAQUE:  # Java's AtomicInteger wraps; stay positive
                self._opaques = itertools.count(1)
                continue
            if opaque not in self._pending:
                return opaque

    async def _send_bytes(self, data: bytes) -> None:
        """Write one frame; returns once it is written (by this task or by
        another that held the lock and took it along).  Frames queued while
        the lock is held go out together in one write: responses completed
        by one group commit cost one syscall, not one each."""
        # Not `self.closed`: after the peer's EOF, handlers still answer
        # during eof_grace (a half-closed peer may be reading).
        if self._closing or self._closed.is_set() or self._send_broken:
            raise RemotingConnectionLostError(self.remote_address, self.close_reason or "connection closed")
        begun = False  # part of the frame is on the wire: the rest must follow
        if self._write_now is not None and not self._outbox and not self._send_lock.locked():
            try:
                sent = self._write_now(data)
            except BlockingIOError:
                sent = 0
            except OSError as e:
                self._send_broken = True
                self.close(f"send failed: {e!r}")
                raise RemotingConnectionLostError(self.remote_address, f"send failed: {e!r}") from None
            if sent == len(data):
                return
            if sent:
                data, begun = memoryview(data)[sent:], True
        self._outbox.append(data)
        self._queued += 1
        seq = self._queued
        try:
            await self._send_lock.acquire()
        except trio.Cancelled:
            if begun:  # half a frame is out: the stream is unusable
                self._send_broken = True
                self.close("a send was cancelled mid-frame")
                raise
            # Withdraw it, unless the holder already took it into its write.
            if self._written < seq:
                self._outbox = [d for d in self._outbox if d is not data]
            raise
        try:
            if self._written >= seq:
                return  # an earlier holder wrote it with its own frames
            if self._send_broken:
                raise RemotingConnectionLostError(self.remote_address, self.close_reason or "send failed")
            batch, self._outbox, upto = self._outbox, [], self._queued
            try:
                await self.stream.send_all(batch[0] if len(batch) == 1 else b"".join(batch))
            except trio.Cancelled:
                # A frame may be half written: the stream is unusable.
                self._send_broken = True
                self.close("a send was cancelled mid-frame")
                raise
            except _CONN_ERRORS as e:
                self._send_broken = True
                self.close(f"send failed: {e!r}")
                raise RemotingConnectionLostError(self.remote_address, f"send failed: {e!r}") from None
            self._written = upto
        finally:
            self._send_lock.release()

    async def invoke(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send `cmd` as a request and wait up to `timeout` seconds for the
        response with its opaque."""
        if self.closed:  # no response could ever be read
            raise RemotingConnectionLostError(self.remote_address, self.close_reason or "connection closed")
        opaque = self._next_opaque()
        data = encode_request(cmd, opaque, False, self.max_frame_size)
        waiter = _Waiter()
        self._pending[opaque] = waiter
        try:
            with trio.move_on_after(timeout):
                await self._send_bytes(data)
                await waiter.event.wait()
            if waiter.response is not None:
                return waiter.response
            if waiter.error is not None:
                raise waiter.error
            raise RemotingTimeoutError(self.remote_address, cmd.code, timeout)
        finally:
            self._pending.pop(opaque, None)

    async def send_request_oneway(self, cmd: RemotingCommand, timeout: float = math.inf) -> None:
        """Send `cmd` flagged oneway; the peer sends no response."""
        data = encode_request(cmd, self._next_opaque(), True, self.max_frame_size)
        with trio.move_on_after(timeout):
            await self._send_bytes(data)
            return
        raise RemotingTimeoutError(self.remote_address, cmd.code, timeout)

    async def send_response(self, request: RemotingCommand, response: RemotingCommand) -> None:
        """Answer `request` (for handlers that returned None and reply
        later).  A response that cannot be encoded becomes SYSTEM_ERROR."""
        try:
            data = encode_command(response.as_response_to(request), self.max_frame_size)
        except LocalProtocolError as e:
            log.error("%s: response to %s cannot be encoded: %s", self.remote_address,
                      code_name(request.code), e)
            data = encode_command(request.make_response(
                ResponseCode.SYSTEM_ERROR, f"response could not be encoded: {e}"), self.max_frame_size)
        await self._send_bytes(data)

    # --- the connection's life ---------------------------------------------------

    async def run(self) -> None:
        failure: RemoteProtocolError | str | None = None
        try:
            with self._scope:
                async with trio.open_nursery() as tasks:
                    failure = await self._read_loop(tasks)
                    self._reading = False
                    self._fail_pending()
                    if failure is None:
                        tasks.cancel_scope.deadline = trio.current_time() + self.eof_grace
                    else:
                        tasks.cancel_scope.cancel()
                if isinstance(failure, RemoteProtocolError):
                    await self._reject(failure)
        finally:
            self._reading = False
            self._fail_pending()
            await trio.aclose_forcefully(self.stream)
            self._closed.set()
            log.debug("%r closed: %s", self, self.close_reason)

    async def _read_loop(self, tasks: trio.Nursery) -> RemoteProtocolError | str | None:
        """Returns None on a clean EOF, else why reading stopped."""
        requests: list = []  # those of the bytes read so far: commands and SendRuns
        count = 0  # the requests in them
        # A stream enforcing a frame-read timeout learns from our decoder
        # whether a frame is open (instead of following the framing again).
        frames_read = getattr(self.stream, "frames_read", None)
        if frames_read is not None:
            self.stream.track_frames = False
        decoded = False  # a frame ended since the last read
        while True:
            try:
                cmd = self._decoder.next_command()
            except RemoteProtocolError as e:
                self.close_reason = f"malformed frame: {e}"
                await self._dispatch(tasks, requests, count)  # the ones before it are answered
                return e
            if cmd is NEED_DATA:
                if frames_read is not None:
                    frames_read(self._decoder.buffered > 0, decoded)
                    decoded = False
                await self._dispatch(tasks, requests, count)
                requests, count = [], 0
                try:
                    data = await self.stream.receive_some(RECV_CHUNK)
                except _CONN_ERRORS as e:
                    self.close_reason = f"receive failed: {e!r}"
                    return self.close_reason
                self._decoder.receive_data(data)
                self._unbilled += len(data)
                continue
            if cmd is CLOSED:
                await self._dispatch(tasks, requests, count)
                self.close_reason = self.close_reason or "closed by peer"
                return None
            decoded = True
            if type(cmd) is SendRun:
                count += cmd.hi - cmd.lo
            elif cmd.is_response:
                self._deliver(cmd)
                continue
            else:
                count += 1
            requests.append(cmd)

    async def _dispatch(self, tasks: trio.Nursery, requests: list, count: int) -> None:
        """Hand over the requests of one read: as many as max_in_flight
        admits at once, bursts first (in order), then a task each for the
        rest; then wait for room for the next ones (backpressure: the
        reader stops reading while the connection is full).  Admitting a
        read whole, not one awaited acquire per request, keeps a pipelined
        burst together until the log's group commit; admitting it in
        pieces keeps a read of more requests than the limit from waiting
        for answers to requests it has not handed over (a SendRun is cut
        where the room ends)."""
        start = 0
        while start < len(requests):
            room = self.max_in_flight - self._in_flight
            if room <= 0:
                self._room = trio.Event()
                await self._room.wait()
                continue
            if start == 0 and room >= count:
                part, n, start = requests, count, len(requests)
            else:
                part, n, start = _admit(requests, start, room)
            count -= n
            self._in_flight += n
            self._hand_over(tasks, part, n)
        while self._max_held is not None and self._held > self._max_held:
            self._held_dropped = trio.Event()
            await self._held_dropped.wait()

    def _hand_over(self, tasks: trio.Nursery, requests: list, count: int) -> None:
        bill = None
        if self._max_held is not None:
            bill = [count, self._unbilled]  # requests not yet answered, bytes
            self._held += self._unbilled
            self._unbilled = 0
        singles = requests
        if self._bursts is not None:
            try:
                singles, bursts = self._bursts.split_burst(self, requests)
            except Exception:  # a bug in a burst handler: answer, never kill the connection
                log.exception("%s: burst handler failed", self.remote_address)
                singles, bursts = requests, []
            for cmds, finish in bursts:
                tasks.start_soon(self._serve_burst, cmds, finish, bill)
        for cmd in singles:
            if type(cmd) is SendRun:  # (no burst handler took it) one by one
                for one in cmd.sends():
                    tasks.start_soon(self._serve, one, bill)
                continue
            tasks.start_soon(self._serve, cmd, bill)

    def _settle(self, bill: list | None, n: int) -> None:
        """`n` requests of `bill` are answered (or dropped)."""
        if bill is not None:
            bill[0] -= n
            if bill[0] == 0:
                self._held -= bill[1]
                self._held_dropped.set()

    def _answered(self, n: int) -> None:
        self._in_flight -= n
        if self._room is not None and self._in_flight < self.max_in_flight:
            self._room.set()
            self._room = None

    def _deliver(self, response: RemotingCommand) -> None:
        waiter = self._pending.get(response.opaque)
        if waiter is None or waiter.event.is_set():
            # Java logs the same: usually a response that arrived after its
            # request timed out.
            log.debug("%s: response %d with opaque %d matches no request", self.remote_address,
                      response.code, response.opaque)
            return
        waiter.response = response
        waiter.event.set()

    def _fail_pending(self) -> None:
        for waiter in self._pending.values():
            if not waiter.event.is_set():
                waiter.error = RemotingConnectionLostError(self.remote_address,
                                                           self.close_reason or "connection closed")
                waiter.event.set()

    async def _serve(self, cmd: RemotingCommand, bill: list | None = None) -> None:
        try:
            try:
                response = await self._handler(self, cmd)
            except RequestError as e:
                response = cmd.make_response(e.code, e.remark)
            except Exception as e:
                log.exception("%s: handler for %s failed", self.remote_address, code_name(cmd.code))
                response = cmd.make_response(ResponseCode.SYSTEM_ERROR, exception_desc(e))
            if response is not None and not cmd.is_oneway:
                await self.send_response(cmd, response)
        except RemotingConnectionLostError:
            pass  # the reader notices and ends the connection
        finally:
            self._answered(1)
            self._settle(bill, 1)

    async def _serve_burst(self, cmds: list, finish: BurstFinish, bill: list | None = None) -> None:
        n = request_count(cmds)
        try:
            try:
                responses = await finish()
            except Exception as e:
                log.exception("%s: burst of %d requests failed", self.remote_address, n)
                responses = [[one.make_response(ResponseCode.SYSTEM_ERROR, exception_desc(e)) for one in cmd.sends()]
                             if type(cmd) is SendRun else cmd.make_response(ResponseCode.SYSTEM_ERROR, exception_desc(e))
                             for cmd in cmds]
            frames = []
            for cmd, response in zip(cmds, responses):
                if response is None:
                    continue
                if type(cmd) is SendRun:
                    if type(response) is bytes:  # the whole run's answers
                        frames.append(response)
                        continue
                    for one, answer in zip(cmd.sends(), response):
                        self._frame_answer(frames, one, answer)
                    continue
                self._frame_answer(frames, cmd, response)
            if frames:
                await self._send_bytes(b"".join(frames))  # one write for the burst's answers
        except RemotingConnectionLostError:
            pass  # the reader notices and ends the connection
        finally:
            self._answered(n)
            self._settle(bill, n)

    def _frame_answer(self, frames: list, cmd, response) -> None:
        if response is None or cmd.is_oneway:
            return
        try:
            frames.append(response if isinstance(response, bytes) else
                          encode_command(response.as_response_to(cmd), self.max_frame_size))
        except LocalProtocolError as e:
            frames.append(encode_command(cmd.make_response(
                ResponseCode.SYSTEM_ERROR, f"response could not be encoded: {e}"), self.max_frame_size))

    async def _reject(self, error: RemoteProtocolError) -> None:
        log.warning("%s: %s; closing the connection", self.remote_address, error)
        with trio.move_on_after(self.linger):
            try:
                if error.opaque is not None and not self._send_broken:
                    stype = SerializeType(error.serialize_type or SerializeType.JSON)
                    await self.stream.send_all(encode_command(RemotingCommand(
                        ResponseCode.SYSTEM_ERROR, remark=f"malformed frame: {error}",
                        opaque=error.opaque, flag=RPC_TYPE_RESPONSE, serialize_type=stype)))
                await self.stream.send_eof()
                while await self.stream.receive_some(RECV_CHUNK):
                    pass
            except _CONN_ERRORS:
                pass


def _admit(requests: list, start: int, room: int) -> tuple[list, int, int]:
    """Up to `room` requests from requests[start:] (a SendRun is cut where
    the room ends, its rest left at requests[start]): (the part, its
    request count, where the next part starts)."""
    part, n, i = [], 0, start
    while i < len(requests) and n < room:
        item = requests[i]
        size = len(item) if type(item) is SendRun else 1
        if n + size > room:
            item, requests[i] = item.split(room - n)
            part.append(item)
            n += len(item)
            break
        part.append(item)
        n += size
        i += 1
    return part, n, i
