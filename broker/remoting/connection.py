# Owns the server side of one remoting connection (the server wraps each
# accepted socket in one; the client's connection is client.py's).  It
#   * reads frames and routes them: responses to the invoke() waiting on that
#     opaque, requests to the handler, each in its own task, so a slow
#     request never blocks the ones behind it -- except the requests of one
#     read a BurstHandler takes (the broker's sends): their synchronous half
#     runs in the read loop, in arrival order, and their answers (answers.py)
#     go out in one write from whichever task gives them;
#   * writes whole frames under a lock (never interleaved within a frame);
#     frames queued while the lock is held go out in the holder's write;
#   * sends requests of its own (invoke, send_request_oneway): the broker
#     pushes NOTIFY_CONSUMER_IDS_CHANGED to connected clients.
#
# Budgets (streams.ServerLimits), kept by the read loop: unfinished frames
# (intake.py: at most max_unfinished bytes per read, reported to the server's
# FrameBudget before they are buffered, decoded frames' buffer freed at once);
# requests handed over (pacing.py: an InFlightWindow of unanswered requests,
# count and bytes, past which the reader stops; the server's Pacer credits).
#
# Failure policy: a malformed frame gets SYSTEM_ERROR when its opaque could be
# read, then a lingering close so the answer is not lost to a RST, and the
# connection's in-flight handlers are cancelled.  A clean EOF gives in-flight
# handlers `eof_grace` seconds.  A handler exception answers SYSTEM_ERROR and
# the connection stays up.  Anything else raised while serving this
# connection's bytes closes it, logged once and counted (containment.py);
# run() never raises it: nothing a peer sends ends more than its connection.
import functools
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
    encode_command,
    encode_request,
    request_count,
)
from broker.remoting.answers import BurstAnswers, BurstFinish
from broker.remoting.codes import RPC_TYPE_RESPONSE, ResponseCode, SerializeType, code_name
from broker.remoting.command import RemotingCommand
from broker.remoting.containment import ConnectionStats, exception_desc, report_failure
from broker.remoting.errors import (
    LocalProtocolError,
    RemoteProtocolError,
    RemotingConnectionLostError,
    RemotingTimeoutError,
    RequestError,
)
from broker.remoting.intake import RECV_CHUNK, FrameIntake
from broker.remoting.pacing import InFlightWindow, Pacer, run_credits
from broker.remoting.streams import FrameBudget, direct_writer
from commitlog import roundtrace as _rt

log = logging.getLogger(__name__)

RequestHandler = Callable[["Connection", RemotingCommand], Awaitable[RemotingCommand | None]]


class BurstHandler(Protocol):
    """Takes the requests of one read that it serves as a burst."""

    def split_burst(self, conn: "Connection", cmds: list[RemotingCommand]) -> \
            tuple[list[RemotingCommand], list[tuple[list[RemotingCommand], BurstAnswers]]]:
        """(the requests to serve one by one, [(requests, answers)] taken as
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
_CONN_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)
_MAX_OPAQUE = (1 << 31) - 1


async def not_supported(conn: "Connection", cmd: RemotingCommand) -> RemotingCommand:
    """The handler of a connection that serves nothing (Java's wording)."""
    return cmd.make_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                             f" request type {cmd.code} not supported")


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
                 max_unfinished: int | None = None, budget: FrameBudget | None = None,
                 pacer: Pacer | None = None, stats: ConnectionStats | None = None,
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
        self.failure: BaseException | None = None  # the unexpected exception that closed it
        self.stats = stats if stats is not None else ConnectionStats()
        self._handler = handler or not_supported
        self._bursts = bursts
        # The decoder, held to this connection's cap and the server's budget
        # of unfinished frames.  raw_sends: plain SEND_MESSAGE_V2 requests
        # arrive as SendRuns (see codec); only a server whose burst handler
        # takes them asks for that.
        self._intake = FrameIntake(self, max_frame_size, raw_sends, max_unfinished, budget)
        self._pacer = pacer
        self._tasks: trio.Nursery | None = None  # while run() runs: answers sent later are written from it
        self._send_lock = trio.Lock()
        # Writes a frame straight to the socket when nothing else is being
        # written (no lock, no trio socket round); None over TLS.
        self._write_now = direct_writer(stream)
        self._outbox: list[bytes] = []  # frames waiting for the send lock
        self._queued = 0  # frames queued so far; the last one is frame number _queued
        self._written = 0  # frames 1.._written are written
        self._send_broken = False
        self._closing = False
        self._heard = False  # any bytes read from the peer (a silent port is named in timeouts)
        self._reading = True
        self._pending: dict[int, _Waiter] = {}
        self._opaques = itertools.count(1)
        # Requests handed over and not yet answered (bytes too, on servers):
        # past either cap the reader stops reading.
        self._window = InFlightWindow(max_in_flight, max_in_flight_bytes)
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

    def shed(self, reason: str) -> None:
        """Closed by the server's FrameBudget to stay within it: what its
        decoder holds is dropped now (the read loop, cancelled, never looks
        at it again), not when its task gets to run."""
        if not self._closing:
            self.stats.shed_unfinished += 1
            log.warning("%s: closing the connection: %s", self.remote_address, reason)
            self._intake.drop()
        self.close(reason)

    def _fail(self, error: BaseException, where: str, close: bool = True) -> None:
        """An unexpected exception while serving this connection: log it
        once, count it, close this connection (and only this one; with
        close=False the caller ends it)."""
        if self.failure is None:
            self.failure = error
            self.stats.connection_failures += 1
            if self.close_reason is None:
                self.close_reason = f"{where} failed: {exception_desc(error)}"
            report_failure(self.remote_address, where, error)
        if close:
            self.close(self.close_reason or where)

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
        queued = self._write_or_queue(data)
        if queued is not None:
            await self._flush(*queued)

    def _write_or_queue(self, data) -> tuple | None:
        """Write `data` at once when nothing else is being written and the
        socket takes all of it (None); else queue it, or what the socket did
        not take, and return what _flush needs to see it out."""
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
                return None
            if sent:
                data, begun = memoryview(data)[sent:], True
        self._outbox.append(data)
        self._queued += 1
        return data, self._queued, begun

    async def _flush(self, data, seq: int, begun: bool) -> None:
        """Wait for the send lock and write the outbox, unless an earlier
        holder already wrote frame `seq` (`data`) with its own."""
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

    async def _flush_quietly(self, data, seq: int, begun: bool) -> None:
        try:
            await self._flush(data, seq, begun)
        except RemotingConnectionLostError:
            pass  # the reader notices and ends the connection

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
            raise RemotingTimeoutError(self.remote_address, cmd.code, timeout, silent=not self._heard)
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
        await self._send_bytes(self._encode_answer(request, response))

    def send_response_soon(self, request: RemotingCommand, response: RemotingCommand) -> bool:
        """Answer `request` without waiting, from any task: written at once
        when the socket takes it, else queued and written by a task of this
        connection.  False when the connection can no longer answer."""
        if self._tasks is None:
            return False
        data = self._encode_answer(request, response)
        try:
            queued = self._write_or_queue(data)
        except RemotingConnectionLostError:
            return False
        if queued is not None:
            try:
                self._tasks.start_soon(self._flush_quietly, *queued)
            except RuntimeError:  # the connection's tasks are over: so is the connection
                self._send_broken = True
                self.close("closed while answering")
                return False
        return True

    def _encode_answer(self, request: RemotingCommand, response: RemotingCommand) -> bytes:
        try:
            return encode_command(response.as_response_to(request), self.max_frame_size)
        except (LocalProtocolError, ValueError, TypeError, RecursionError) as e:
            log.error("%s: response to %s cannot be encoded: %s", self.remote_address,
                      code_name(request.code), exception_desc(e))
            return encode_command(request.make_response(
                ResponseCode.SYSTEM_ERROR, f"response could not be encoded: {exception_desc(e)}"),
                self.max_frame_size)

    # --- the connection's life ---------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until it is over.  Never raises what the
        peer's bytes caused: an unexpected exception closes this connection
        (see the module's failure policy)."""
        failure: RemoteProtocolError | str | None = None
        try:
            with self._scope:
                try:
                    async with trio.open_nursery() as tasks:
                        self._tasks = tasks
                        failure = await self._read_loop(tasks)
                        self._reading = False
                        self._fail_pending()
                        if failure is None:
                            tasks.cancel_scope.deadline = trio.current_time() + self.eof_grace
                        else:
                            tasks.cancel_scope.cancel()
                except* Exception as group:  # whatever escaped: this connection's, no one else's
                    self._fail(_first_leaf(group), "serving the connection")
                    failure = None
                if isinstance(failure, RemoteProtocolError):
                    await self._reject(failure)
        finally:
            self._tasks = None
            self._reading = False
            self._fail_pending()
            self._intake.close()
            await trio.aclose_forcefully(self.stream)
            self._closed.set()
            log.debug("%r closed: %s", self, self.close_reason)

    async def _read_loop(self, tasks: trio.Nursery) -> RemoteProtocolError | str | None:
        """Returns None on a clean EOF, else why reading stopped."""
        requests: list = []  # the items (command.OneRequest or codec.SendRun) of the bytes read so far
        count = 0  # the requests in them
        # A stream enforcing a frame-read timeout learns from our decoder
        # whether a frame is open (instead of following the framing again).
        frames_read = getattr(self.stream, "frames_read", None)
        if frames_read is not None:
            self.stream.track_frames = False
        decoded = False  # a frame ended since the last read
        # Decoded requests go to the window, which hands them to _hand_over
        # as it admits them and returns when there is room for the next read.
        hand_over, give = self._window.hand_over, functools.partial(self._hand_over, tasks)
        intake = self._intake
        pacer = self._pacer
        credit = 0  # requests this reader may still decode in this round (with a pacer)
        data = b""  # the last read
        while True:
            if pacer is not None and credit <= 0:
                credit = pacer.credits()
                if credit <= 0:  # this round's are spent: hand over what is decoded, go on next round
                    await hand_over(requests, count, give)
                    requests, count = [], 0
                    await pacer.next_round()
                    continue
            try:
                cmd = intake.decoder.next_command()
            except RemoteProtocolError as e:
                self.close_reason = f"malformed frame: {e}"
                await hand_over(requests, count, give)  # the ones before it are answered
                return e
            except Exception as e:  # a frame the decoder did not bound: as a malformed one, and counted
                self._fail(e, "decoding a frame", close=False)
                await hand_over(requests, count, give)
                return RemoteProtocolError(f"frame could not be decoded: {exception_desc(e)}")
            if cmd is NEED_DATA:
                if pacer is not None:
                    pacer.refund(credit)
                    credit = 0
                buffered = intake.decoder.buffered
                if frames_read is not None:
                    frames_read(buffered > 0, decoded)
                intake.settle(data, buffered, decoded)
                decoded = False
                await hand_over(requests, count, give)
                requests, count = [], 0
                want = intake.room(buffered)
                if want <= 0:
                    self.stats.shed_unfinished += 1
                    self.close_reason = (f"an unfinished frame reached {buffered} bytes "
                                         f"(serverMaxUnfinishedFrameBytesPerConnection)")
                    log.warning("%s: %s; closing the connection", self.remote_address, self.close_reason)
                    return self.close_reason
                try:
                    data = await self.stream.receive_some(want)
                except _CONN_ERRORS as e:
                    self.close_reason = self.close_reason or f"receive failed: {e!r}"
                    return self.close_reason
                if intake.report(data, buffered) and self._closing:  # shed by the budget
                    return self.close_reason
                intake.receive(data, buffered)
                self._heard = True
                self._window.unbilled += len(data)
                if _rt.TRACER is not None:  # tools/bench/round.py
                    _rt.TRACER.read()
                continue
            if cmd is CLOSED:
                await hand_over(requests, count, give)
                self.close_reason = self.close_reason or "closed by peer"
                return None
            decoded = True
            if cmd.is_response:
                credit -= 1
                self._deliver(cmd)
                continue
            n = cmd.count
            count += n
            credit -= 1 if n == 1 else run_credits(n)
            if _rt.TRACER is not None:
                _rt.TRACER.decoded(cmd)
            requests.append(cmd)

    def _hand_over(self, tasks: trio.Nursery, requests: list, count: int, bill: list | None) -> None:
        """Hand over a part of a read that the window admitted: bursts
        first (in order), then a task each for the rest."""
        singles = requests
        if self._bursts is not None:
            try:
                singles, bursts = self._bursts.split_burst(self, requests)
            except Exception as e:  # a bug in a burst handler: answer them all, never kill the connection
                self.stats.handler_failures += 1
                log.exception("%s: burst handler failed", self.remote_address)
                singles, bursts = [], [(requests, _failed(requests, e))]
            for cmds, answers in bursts:
                answers.bind(functools.partial(self._burst_answered, cmds, bill))
        for item in singles:
            for cmd in item.one_by_one():  # (a run no burst handler took: one by one)
                tasks.start_soon(self._serve, cmd, bill)

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
                self.stats.handler_failures += 1
                log.exception("%s: handler for %s failed", self.remote_address, code_name(cmd.code))
                response = cmd.make_response(ResponseCode.SYSTEM_ERROR, exception_desc(e))
            if response is not None and not cmd.is_oneway:
                await self.send_response(cmd, response)
        except RemotingConnectionLostError:
            pass  # the reader notices and ends the connection
        except Exception as e:  # (answering failed in a way no answer can report)
            self._fail(e, f"answering {code_name(cmd.code)}")
        finally:
            self._window.answered(1, bill)

    def _burst_answered(self, cmds: list, bill: list | None, answers: BurstAnswers) -> None:
        """A burst's answers are known (BurstAnswers.bind): written now, from
        the task that gave them (the log's driver, for committed sends),
        when the socket takes them at once; a task only for what is left:
        an async half to run, or bytes the socket did not take."""
        n = request_count(cmds)
        tasks = self._tasks
        finish = answers.finish
        try:
            if finish is not None:
                if tasks is None:
                    answers.abandon()
                else:
                    try:
                        tasks.start_soon(self._serve_burst, cmds, finish, bill)
                        return
                    except RuntimeError:  # the nursery closed meanwhile: the connection is over
                        answers.abandon()
            else:
                frames = self._burst_frames(cmds, answers.replies)
                if frames:
                    queued = self._write_or_queue(b"".join(frames))  # one write for the burst's answers
                    if queued is not None:
                        if tasks is not None:
                            try:
                                tasks.start_soon(self._flush_burst, queued, n, bill)
                                return
                            except RuntimeError:  # the nursery closed meanwhile
                                pass
                    elif _rt.TRACER is not None:
                        _rt.TRACER.mark("answered")
        except RemotingConnectionLostError:
            pass  # the reader notices and ends the connection
        except Exception as e:  # (answering failed in a way no answer can report)
            self._fail(e, f"answering a burst of {n} requests")
        self._window.answered(n, bill)

    async def _flush_burst(self, queued: tuple, n: int, bill: list | None) -> None:
        try:
            await self._flush(*queued)
            if _rt.TRACER is not None:
                _rt.TRACER.mark("answered")
        except RemotingConnectionLostError:
            pass  # the reader notices and ends the connection
        except Exception as e:  # (answering failed in a way no answer can report)
            self._fail(e, f"answering a burst of {n} requests")
        finally:
            self._window.answered(n, bill)

    async def _serve_burst(self, cmds: list, finish: BurstFinish, bill: list | None = None) -> None:
        """A burst whose answers need a task: run its async half, write."""
        n = request_count(cmds)
        try:
            try:
                responses = await finish()
            except Exception as e:
                self.stats.handler_failures += 1
                log.exception("%s: burst of %d requests failed", self.remote_address, n)
                responses = _system_errors(cmds, exception_desc(e))
            frames = self._burst_frames(cmds, responses)
            if frames:
                await self._send_bytes(b"".join(frames))  # one write for the burst's answers
                if _rt.TRACER is not None:
                    _rt.TRACER.mark("answered")
        except RemotingConnectionLostError:
            pass  # the reader notices and ends the connection
        except Exception as e:  # (answering failed in a way no answer can report)
            self._fail(e, f"answering a burst of {n} requests")
        finally:
            self._window.answered(n, bill)

    def _burst_frames(self, cmds: list, responses: list) -> list:
        frames: list = []
        for item, response in zip(cmds, responses):
            if response is None:
                continue
            for cmd, answer in item.each_answer(response):
                self._frame_answer(frames, cmd, answer)
        return frames

    def _frame_answer(self, frames: list, cmd, response) -> None:
        """cmd is None for an answer framed for a whole item already."""
        if response is None or (cmd is not None and cmd.is_oneway):
            return
        if isinstance(response, bytes):
            frames.append(response)
            return
        frames.append(self._encode_answer(cmd, response))

    async def _reject(self, error: RemoteProtocolError) -> None:
        if self.failure is None:  # (a failure was logged already)
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


def _system_errors(cmds: list, remark: str) -> list:
    """A burst's answers when it failed: SYSTEM_ERROR for each request."""
    return [item.answer_all(ResponseCode.SYSTEM_ERROR, remark) for item in cmds]


def _failed(cmds: list, error: Exception) -> BurstAnswers:
    """The answers of a burst whose handler failed."""
    return BurstAnswers.now(_system_errors(cmds, exception_desc(error)))


def _first_leaf(group: BaseException) -> BaseException:
    while isinstance(group, BaseExceptionGroup) and group.exceptions:
        group = group.exceptions[0]
    return group
