# The one remoting transport (broker/remoting/client.py, anyio: the client
# library, the broker, mqadmin and the tools all use it) on real TCP on
# 127.0.0.1.  Each test runs on asyncio and on trio.
#
# Against the broker's own remoting server (serve_remoting, in a trio thread
# of its own so an asyncio caller can dial it too): the same calls work from
# either loop -- shared connection, a handler's typed refusal, a timeout,
# oneway, and a request the server pushes, handled on the caller's loop.
#
# Against a bare socket server (so what reaches the wire is seen as it is):
# many requests issued together go out in few writes, each answered to its
# own caller; a request whose answer never comes times out alone; a server
# that stops reading makes senders wait once OUTBOX_LIMIT bytes are queued
# instead of queueing without bound; submitted requests (no task waits) end
# in their callbacks: answer, timeout or the connection's end, once each; a
# malformed or oversized response frame closes that connection only, its
# waiters told why; requests pushed past max_pushed are answered SYSTEM_BUSY;
# dial errors and a silent port's timeout read the same on both loops.
import socket
import struct
import threading

import anyio
import pytest
import sniffio
import trio

from broker.remoting import client as transport
from broker.remoting.client import open_remoting_client
from broker.remoting.codec import NEED_DATA, CommandDecoder, encode_command
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RemotingConnectError, RemotingConnectionLostError, RemotingTimeoutError
from broker.remoting.server import serve_remoting
from tests.broker.remoting.helpers import ECHO, ONEWAY_SINK, REFUSE, SLOW, EchoService

pytestmark = pytest.mark.anyio
CODE = 1001


def echo(cmd: RemotingCommand) -> bytes | None:
    """The bare server's default answer: the body back, except b"silent"."""
    if cmd.body == b"silent":
        return None
    return encode_command(cmd.make_response(ResponseCode.SUCCESS, body=cmd.body))


class EchoServer:
    """A bare socket server in threads: `answer` gives the bytes to send
    back for each request (None: nothing); responses the client sends (to
    pushed requests) are kept in `responses`.  Counts the recv() calls that
    carried data, and can stop reading."""

    def __init__(self, answer=echo) -> None:
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.reads = 0
        self.accepted = 0
        self.conn: socket.socket | None = None  # the latest connection
        self.responses: list[RemotingCommand] = []
        self.answered = threading.Condition()
        self.read = threading.Event()  # cleared: stop reading
        self.read.set()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed
                return
            self.accepted += 1
            self.conn = conn
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        dec = CommandDecoder()
        with conn:
            while True:
                self.read.wait()
                try:
                    data = conn.recv(1 << 20)
                except OSError:
                    return
                if not data:
                    return
                self.reads += 1
                dec.receive_data(data)
                out = []
                while (cmd := dec.next_command()) is not NEED_DATA:
                    if cmd.is_response:
                        with self.answered:
                            self.responses.append(cmd)
                            self.answered.notify_all()
                    elif (answer := self.answer(cmd)) is not None:
                        out.append(answer)
                try:
                    conn.sendall(b"".join(out))
                except OSError:
                    return

    def wait_responses(self, n: int, timeout: float = 10) -> list[RemotingCommand]:
        with self.answered:
            assert self.answered.wait_for(lambda: len(self.responses) >= n, timeout), self.responses
            return list(self.responses)

    def close(self) -> None:
        self.read.set()
        self.listener.close()


class TrioServerThread:
    """The broker's remoting server (serve_remoting with the remoting tests'
    EchoService) running trio in a thread of its own."""

    def __init__(self) -> None:
        self.svc = EchoService()
        self.started = threading.Event()
        self.thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)
        self.thread.start()
        assert self.started.wait(10), "the server thread did not start"

    async def _main(self) -> None:
        self.token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            self.scope = nursery.cancel_scope
            self.server = await nursery.start(lambda task_status: serve_remoting(
                self.svc.dispatcher, "127.0.0.1", 0, task_status=task_status))
            self.started.set()

    async def call(self, fn, *args):
        """await fn(*args) in the server's trio run, from either loop."""
        async def within() -> object:
            with trio.fail_after(10):
                return await fn(*args)
        return await anyio.to_thread.run_sync(lambda: trio.from_thread.run(within, trio_token=self.token))

    def stop(self) -> None:
        self.token.run_sync_soon(self.scope.cancel)  # (from any thread, any loop)
        self.thread.join(10)
        assert not self.thread.is_alive()


async def test_one_transport_serves_a_trio_and_an_asyncio_caller(anyio_backend):
    server = TrioServerThread()
    try:
        loops = []

        async def on_push(conn, cmd):
            loops.append(sniffio.current_async_library())
            return cmd.make_response(ResponseCode.SUCCESS, body=b"pushed " + cmd.body)

        async with open_remoting_client(handler=on_push) as client:
            addr = server.server.address
            got = {}

            async def call(i: int) -> None:
                got[i] = (await client.invoke(addr, RemotingCommand(ECHO, body=b"%d" % i), 5)).body

            async with anyio.create_task_group() as tg:
                for i in range(50):
                    tg.start_soon(call, i)
            assert got == {i: b"%d" % i for i in range(50)}
            # A handler's typed refusal comes back as its code.
            refused = await client.invoke(addr, RemotingCommand(REFUSE), 5)
            assert refused.code == ResponseCode.NO_PERMISSION and refused.remark == "not for you"
            # No answer in time: a timeout naming the request; its late answer goes to nobody.
            with pytest.raises(RemotingTimeoutError) as e:
                await client.invoke(addr, RemotingCommand(SLOW), 0.2)
            assert e.value.code == SLOW and e.value.timeout == 0.2 and e.value.addr == addr
            assert not e.value.silent  # the connection had answered before
            await server.call(_set, server.svc.release)
            # Oneway: no answer expected, the server saw it.
            await client.invoke_oneway(addr, RemotingCommand(ONEWAY_SINK, body=b"o"))
            await server.call(server.svc.oneway_seen.wait)
            assert [c.body for c in server.svc.oneways] == [b"o"] and server.svc.oneways[0].is_oneway
            # The server pushes a request on the client's connection: the
            # handler runs on the caller's own loop and its answer goes back.
            [server_side] = server.svc.connections
            pushed = await server.call(server_side.invoke, RemotingCommand(
                RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, body=b"x"), 5)
            assert pushed.body == b"pushed x" and loops == [anyio_backend]
            assert (await client.invoke(addr, RemotingCommand(ECHO, body=b"end"), 5)).body == b"end"
            assert client.dials == 1 and server.server.accepted == 1
    finally:
        server.stop()


async def _set(event) -> None:
    event.set()


async def test_dial_errors_and_a_silent_port_read_the_same_on_both_backends():
    """mqadmin prints these: a refused dial names the address and the
    errno's words (asyncio's own differ from trio's), and a port that
    accepts but never answers is named as such in the timeout."""
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    async with open_remoting_client() as client:
        with pytest.raises(RemotingConnectError) as e:
            await client.invoke(f"127.0.0.1:{port}", RemotingCommand(CODE), 5)
        assert str(e.value) == (f"connect to 127.0.0.1:{port} failed: "
                                f"Error connecting to ('127.0.0.1', {port}): Connection refused")
        with socket.create_server(("127.0.0.1", 0)) as mute:  # the kernel accepts; nothing is ever read or sent
            addr = "127.0.0.1:%d" % mute.getsockname()[1]
            with pytest.raises(RemotingTimeoutError) as t:
                await client.invoke(addr, RemotingCommand(CODE), 0.2)
            assert t.value.silent and t.value.addr == addr and "has sent nothing back" in str(t.value)


BAD_ANSWERS = {
    # a well-formed answer longer than the client's max_frame_size (1024 here)
    "oversized": lambda cmd: encode_command(cmd.make_response(ResponseCode.SUCCESS, body=b"x" * 4096)),
    # a frame prefix claiming 64 MiB: refused from the prefix, nothing buffered
    "oversized prefix": lambda cmd: struct.pack(">ii", 64 << 20, 20) + b"x" * 20,
    "bad JSON header": lambda cmd: struct.pack(">ii", 13, 9) + b"{not json",
    "not remoting at all": lambda cmd: b"SSH-2.0-OpenSSH_9.6\r\n" * 3,
}


@pytest.mark.parametrize("kind", sorted(BAD_ANSWERS))
async def test_a_malformed_or_oversized_response_closes_only_its_connection(kind):
    good, bad = EchoServer(), EchoServer(BAD_ANSWERS[kind])
    try:
        async with open_remoting_client(max_frame_size=1024) as client:
            assert (await client.invoke(good.addr, RemotingCommand(CODE, body=b"a"), 5)).body == b"a"
            good_conn = client.cached(good.addr)
            errors = []

            async def call(i: int) -> None:
                try:
                    await client.invoke(bad.addr, RemotingCommand(CODE, body=b"%d" % i), 5)
                except RemotingConnectionLostError as e:
                    errors.append(e)

            async with anyio.create_task_group() as tg:  # two in flight: both are told
                for i in range(2):
                    tg.start_soon(call, i)
            assert len(errors) == 2
            for e in errors:
                assert e.addr == bad.addr and e.reason.startswith("malformed frame: "), e
                assert str(e).endswith("(the peer does not speak RocketMQ remoting)")
            assert client.cached(bad.addr) is None
            # The other connection is the same one and still serves; the client lives.
            assert client.cached(good.addr) is good_conn and not good_conn.closed
            assert (await client.invoke(good.addr, RemotingCommand(CODE, body=b"b"), 5)).body == b"b"
            # The next call to the bad peer dials again (and meets the same answer).
            with pytest.raises(RemotingConnectionLostError, match="malformed frame"):
                await client.invoke(bad.addr, RemotingCommand(CODE, body=b"again"), 5)
            assert client.dials == 3 and good.accepted == 1 and bad.accepted == 2
    finally:
        good.close()
        bad.close()


async def test_requests_pushed_past_max_pushed_are_answered_busy():
    """A peer that pushes more requests than max_pushed at once: the rest
    are answered SYSTEM_BUSY at once (a oneway one is dropped), without a
    task each; the ones taken are answered when their handler returns."""
    server = EchoServer()
    release = anyio.Event()

    async def slow_handler(conn, cmd):
        await release.wait()
        return cmd.make_response(ResponseCode.SUCCESS, body=cmd.body)

    try:
        async with open_remoting_client(handler=slow_handler, max_pushed=2) as client:
            await client.invoke(server.addr, RemotingCommand(CODE, body=b"dial"), 5)
            conn = client.cached(server.addr)
            pushes = [encode_command(RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, opaque=op,
                                                     body=b"%d" % op)) for op in range(1, 6)]
            pushes.append(encode_command(RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, opaque=6,
                                                         flag=2, body=b"oneway")))
            server.conn.sendall(b"".join(pushes))
            busy = await anyio.to_thread.run_sync(server.wait_responses, 3)
            assert sorted((r.opaque, r.code) for r in busy) == [(3, ResponseCode.SYSTEM_BUSY),
                                                                (4, ResponseCode.SYSTEM_BUSY),
                                                                (5, ResponseCode.SYSTEM_BUSY)]
            assert conn.pushed_refused == 4  # the oneway one too, dropped
            release.set()
            answered = await anyio.to_thread.run_sync(server.wait_responses, 5)
            assert sorted((r.opaque, r.code, r.body) for r in answered[3:]) == [
                (1, ResponseCode.SUCCESS, b"1"), (2, ResponseCode.SUCCESS, b"2")]
            assert (await client.invoke(server.addr, RemotingCommand(CODE, body=b"after"), 5)).body == b"after"
            assert not conn.closed
    finally:
        server.close()


async def test_requests_issued_together_share_writes_and_each_gets_its_answer():
    server = EchoServer()
    try:
        async with open_remoting_client() as client:
            await client.invoke(server.addr, RemotingCommand.create_request(CODE, body=b"dial"), 5)
            reads_before = server.reads
            got = {}

            async def call(i: int) -> None:
                resp = await client.invoke(server.addr, RemotingCommand.create_request(CODE, body=b"%d" % i), 5)
                got[i] = resp.body

            async with anyio.create_task_group() as tg:
                for i in range(200):
                    tg.start_soon(call, i)
            assert got == {i: b"%d" % i for i in range(200)}
            assert server.reads - reads_before < 20  # not one write per request
    finally:
        server.close()


async def test_a_request_without_an_answer_times_out_alone():
    server = EchoServer()
    try:
        async with open_remoting_client() as client:
            results = {}

            async def call(body: bytes, timeout: float) -> None:
                try:
                    results[body] = (await client.invoke(server.addr, RemotingCommand.create_request(CODE, body=body),
                                                         timeout)).body
                except RemotingTimeoutError:
                    results[body] = "timeout"

            async with anyio.create_task_group() as tg:
                tg.start_soon(call, b"silent", 0.3)
                tg.start_soon(call, b"a", 5)
                tg.start_soon(call, b"b", 5)
            assert results == {b"silent": "timeout", b"a": b"a", b"b": b"b"}
            resp = await client.invoke(server.addr, RemotingCommand.create_request(CODE, body=b"after"), 5)
            assert resp.body == b"after"  # the connection lives on
    finally:
        server.close()


async def test_senders_wait_when_the_peer_stops_reading(monkeypatch):
    monkeypatch.setattr(transport, "OUTBOX_LIMIT", 64 << 10)
    server = EchoServer()
    try:
        async with open_remoting_client() as client:
            await client.invoke(server.addr, RemotingCommand.create_request(CODE, body=b"x"), 5)  # dialed
            server.read.clear()
            conn = client.cached(server.addr)
            body = b"s" * 16384
            sent = [0]

            async def flood() -> None:
                while True:
                    await client.invoke_oneway(server.addr, RemotingCommand.create_request(CODE, body=body), 60)
                    sent[0] += 1

            with anyio.move_on_after(1.5):
                await flood()
            # The socket buffers fill, then the outbox: senders wait there, bounded.
            assert conn._outbox_bytes <= transport.OUTBOX_LIMIT + len(body) + 1024
            stalled_at = sent[0]
            assert stalled_at < 10_000
            server.read.set()  # the backlog drains: a request queued behind it is answered
            resp = await client.invoke(server.addr, RemotingCommand.create_request(CODE, body=b"after"), 30)
            assert resp.body == b"after" and conn._outbox_bytes == 0
    finally:
        server.close()


async def test_submitted_requests_end_in_their_callbacks():
    """submit(): no task waits; each callback is called once, from the
    reader (answers), the sweeper (a timeout) or the connection's end (the
    rest), and a callback that raises does not end the connection."""
    server = EchoServer()
    try:
        async with open_remoting_client() as client:
            request = RemotingCommand.create_request
            assert not client.submit(server.addr, request(CODE, body=b"x"), 5, lambda r, e: None)  # not dialed
            await client.invoke(server.addr, request(CODE, body=b"dial"), 5)
            ended: dict = {}
            all_in = anyio.Event()

            def done_for(body: bytes):
                def done(resp, error):
                    assert body not in ended  # once
                    ended[body] = resp.body if resp is not None else type(error).__name__
                    if len(ended) == 102:
                        all_in.set()
                    if body == b"raises":
                        raise RuntimeError("a callback's own bug")
                return done
            for i in range(100):
                assert client.submit(server.addr, request(CODE, body=b"%d" % i), 5, done_for(b"%d" % i))
            assert client.submit(server.addr, request(CODE, body=b"raises"), 5, done_for(b"raises"))
            assert client.submit(server.addr, request(CODE, body=b"silent"), 0.2, done_for(b"silent"))
            with anyio.fail_after(10):
                await all_in.wait()
            assert ended == {**{b"%d" % i: b"%d" % i for i in range(100)}, b"raises": b"raises",
                             b"silent": "RemotingTimeoutError"}
            resp = await client.invoke(server.addr, request(CODE, body=b"after"), 5)
            assert resp.body == b"after"  # the raising callback did not end the connection
            conn = client.cached(server.addr)
            lost, gone = [], anyio.Event()

            def on_lost(resp, error):
                lost.append(error)
                gone.set()
            assert client.submit(server.addr, request(CODE, body=b"silent"), 30, on_lost)
            conn.close("closed by the test")
            with anyio.fail_after(5):
                await gone.wait()
            assert [type(e).__name__ for e in lost] == ["RemotingConnectionLostError"] and not conn._pending
            assert not conn.submit(request(CODE, body=b"late"), 5, lambda r, e: None)
    finally:
        server.close()
