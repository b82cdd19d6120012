# The one remoting transport (broker/remoting/client.py, anyio) against a real TCP server on 127.0.0.1 (a
# bare socket server here, so what reaches the wire is seen as it is): many
# requests issued together go out in few writes, each answered to its own
# caller; a request whose answer never comes times out alone; a server
# that stops reading makes senders wait once OUTBOX_LIMIT bytes are queued
# instead of queueing without bound; submitted requests (no task waits)
# end in their callbacks: answer, timeout or the connection's end, once
# each.  Each test runs on asyncio and trio.
import socket
import threading

import anyio
import pytest

from broker.remoting import client as transport
from broker.remoting.client import open_remoting_client
from broker.remoting.codec import NEED_DATA, CommandDecoder, encode_command
from broker.remoting.codes import ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RemotingTimeoutError

pytestmark = pytest.mark.anyio
CODE = 1001


class EchoServer:
    """One-connection server in a thread: answers every request except
    those whose body is b"silent", counts the recv() calls that carried
    data, and can stop reading."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.reads = 0
        self.read = threading.Event()  # cleared: stop reading
        self.read.set()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        dec = CommandDecoder()
        with conn:
            while True:
                self.read.wait()
                data = conn.recv(1 << 20)
                if not data:
                    return
                self.reads += 1
                dec.receive_data(data)
                out = []
                while (cmd := dec.next_command()) is not NEED_DATA:
                    if cmd.body != b"silent":
                        out.append(encode_command(cmd.make_response(ResponseCode.SUCCESS, body=cmd.body)))
                conn.sendall(b"".join(out))

    def close(self) -> None:
        self.read.set()
        self.listener.close()


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
