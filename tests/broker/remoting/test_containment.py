# No input ends a process (issue 27): whatever one connection's bytes make
# go wrong -- the decoder, a handler, a burst handler, encoding an answer,
# the connection's own hooks -- closes or answers that connection only, is
# logged once with the peer's address and counted in RemotingServer.stats;
# serve_remoting's nursery never sees it and every other client goes on
# being served.  Each failure is forced by monkeypatching the piece to
# raise (RecursionError, as a JSON nested 1,000 deep raised in the decoder,
# or any Exception), so containment is tested whether or not the decoders
# bound their input; the real 2 KB deep-JSON frame is sent as well.  Real
# TCP on 127.0.0.1.  (Live processes: test_containment_live.py.)
import logging
import struct

import pytest
import trio

import broker.remoting.connection as connection_mod
import broker.remoting.containment as containment_mod
import broker.remoting.intake as intake_mod
from broker.remoting.client import open_remoting_client
from broker.remoting.codec import CommandDecoder, encode_command
from broker.remoting.codes import ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.guard import GuardedDispatcher, InFlightLimiter
from broker.remoting.server import serve_remoting
from broker.remoting.streams import ServerLimits
from tests.broker.remoting.helpers import ECHO, EchoService, raw_invoke, read_until_eof

BOOM = 1066
BURST = 1067


def deep_json_frame(depth: int = 1000, code: int = ECHO, opaque: int = 5) -> bytes:
    """The issue's frame: one extFields value holding JSON nested `depth` deep."""
    nested = "[" * depth + "]" * depth
    header = (f'{{"code":{code},"language":"JAVA","version":1,"opaque":{opaque},"flag":0,'
              f'"extFields":{{"a":{nested}}}}}').encode()
    return struct.pack(">ii", 4 + len(header), len(header)) + header


async def start(nursery, svc, **kw):
    kw.setdefault("limits", ServerLimits())
    return await nursery.start(lambda task_status: serve_remoting(
        svc.dispatcher if hasattr(svc, "dispatcher") else svc, "127.0.0.1", 0, task_status=task_status, **kw))


async def still_served(server, body=b"alive") -> None:
    async with open_remoting_client() as client:
        resp = await client.invoke(server.address, RemotingCommand(ECHO, body=body), timeout=5)
        assert resp.body == body


def failure_lines(caplog, port: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR and f":{port}" in r.getMessage()]


async def bad_connection(server, data: bytes) -> tuple[list[RemotingCommand], int]:
    """Send `data` on a fresh connection; (what came back before the close, our port)."""
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    port = stream.socket.getsockname()[1]
    await stream.send_all(data)
    got = await read_until_eof(stream)
    await stream.aclose()
    return got, port


async def test_a_decoder_exception_closes_only_that_connection(nursery, monkeypatch, caplog):
    class Exploding(CommandDecoder):
        def next_command(self):
            cmd = super().next_command()
            if isinstance(cmd, RemotingCommand) and cmd.code == BOOM:
                raise RecursionError("maximum recursion depth exceeded while encoding a JSON object")
            return cmd

    monkeypatch.setattr(intake_mod, "CommandDecoder", Exploding)
    server = await start(nursery, EchoService())
    good = await trio.open_tcp_stream("127.0.0.1", server.port)
    assert (await raw_invoke(good, RemotingCommand(ECHO, opaque=1, body=b"a"))).body == b"a"
    got, port = await bad_connection(server, encode_command(RemotingCommand(BOOM, opaque=9)))
    assert got == []  # no opaque to answer: closed
    assert server.stats.connection_failures == 1
    [line] = failure_lines(caplog, port)  # once, naming the peer
    assert "decoding a frame" in line.getMessage() and line.exc_info[0] is RecursionError
    # The other connection and new ones are served.
    assert (await raw_invoke(good, RemotingCommand(ECHO, opaque=2, body=b"b"))).body == b"b"
    await still_served(server)
    await good.aclose()


async def test_the_deep_json_frame_of_the_issue(nursery):
    # 2 KB: an extFields value nested 1,000 deep.  Before containment its
    # RecursionError ended serve_remoting's nursery (name server and master
    # died); now it costs that connection at most, whichever way the
    # decoder takes it (answered, refused, or failed).
    frame = deep_json_frame()
    assert len(frame) < 2100
    server = await start(nursery, EchoService())
    for _ in range(3):
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        await stream.send_all(frame)
        await stream.send_eof()
        await read_until_eof(stream)
        await stream.aclose()
        await still_served(server)


async def test_a_handler_exception_is_answered_and_counted(nursery, caplog):
    svc = EchoService()

    async def recurse(conn, cmd):
        raise RecursionError("maximum recursion depth exceeded")
    svc.dispatcher.register(BOOM, recurse)
    server = await start(nursery, svc)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    answer = await raw_invoke(stream, RemotingCommand(BOOM, opaque=3))
    assert answer.code == ResponseCode.SYSTEM_ERROR and "RecursionError" in answer.remark
    assert (await raw_invoke(stream, RemotingCommand(ECHO, opaque=4, body=b"x"))).body == b"x"  # still open
    assert server.stats.handler_failures == 1 and server.stats.connection_failures == 0
    await stream.aclose()


async def test_an_answer_that_cannot_be_encoded_closes_only_that_connection(nursery, monkeypatch, caplog):
    real = connection_mod.encode_command

    def encode(cmd, *a, **kw):
        if cmd.remark == "unencodable":
            raise RuntimeError("the encoder met something it never expected")
        return real(cmd, *a, **kw)

    monkeypatch.setattr(connection_mod, "encode_command", encode)
    svc = EchoService()
    server = await start(nursery, svc)
    good = await trio.open_tcp_stream("127.0.0.1", server.port)
    assert (await raw_invoke(good, RemotingCommand(ECHO, opaque=1, body=b"a"))).body == b"a"
    got, port = await bad_connection(server, encode_command(RemotingCommand(ECHO, opaque=2, remark="unencodable")))
    assert got == []
    assert server.stats.connection_failures == 1
    [line] = failure_lines(caplog, port)
    assert "answering" in line.getMessage()
    assert (await raw_invoke(good, RemotingCommand(ECHO, opaque=3, body=b"b"))).body == b"b"
    await still_served(server)
    await good.aclose()


class ExplodingBursts:
    """A burst processor whose synchronous half raises for bodies marked
    `sync` and whose async half for bodies marked `async`."""

    def accept_burst(self, conn, cmds):
        if any(c.body == b"sync" for c in cmds):
            raise RecursionError("in accept_burst")

        async def finish():
            if any(c.body == b"async" for c in cmds):
                raise ValueError("in finish")
            return [c.make_response(body=b"ok:" + c.body) for c in cmds]
        return finish


async def test_burst_handler_exceptions_are_answered(nursery):
    svc = EchoService()
    svc.dispatcher.register_burst(BURST, ExplodingBursts())
    guard = GuardedDispatcher(svc.dispatcher, limiter=InFlightLimiter(100))
    server = await start(nursery, guard, bursts=guard, on_close=guard.forget)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    for opaque, body in ((1, b"sync"), (2, b"async"), (3, b"fine")):
        answer = await raw_invoke(stream, RemotingCommand(BURST, opaque=opaque, body=body))
        assert answer.opaque == opaque
        assert answer.code == (ResponseCode.SUCCESS if body == b"fine" else ResponseCode.SYSTEM_ERROR), answer
    assert server.stats.handler_failures == 2 and server.stats.connection_failures == 0
    assert guard.limiter.in_flight == 0
    await stream.aclose()


async def test_a_failing_hook_or_read_loop_never_reaches_the_serving_nursery(nursery, monkeypatch, caplog):
    calls = []

    def on_connect(conn):
        calls.append(conn)
        if len(calls) == 1:
            raise KeyError("a bug in on_connect")

    server = await start(nursery, EchoService(), on_connect=on_connect)
    got, port = await bad_connection(server, encode_command(RemotingCommand(ECHO, opaque=1)))
    assert got == [] and server.stats.connection_failures == 1
    assert len(failure_lines(caplog, port)) == 1
    await still_served(server)

    async def broken_loop(self, tasks):
        raise ZeroDivisionError("a bug in the read loop")

    monkeypatch.setattr(connection_mod.Connection, "_read_loop", broken_loop)
    got, port = await bad_connection(server, b"")
    assert server.stats.connection_failures == 2
    assert "serving the connection" in failure_lines(caplog, port)[0].getMessage()


@pytest.mark.parametrize("exc", [RecursionError, MemoryError, AssertionError])
async def test_whatever_the_exception_the_server_survives(nursery, monkeypatch, exc):
    class Exploding(CommandDecoder):
        def next_command(self):
            raise exc("from the decoder")

    server = await start(nursery, EchoService())
    monkeypatch.setattr(intake_mod, "CommandDecoder", Exploding)
    for _ in range(5):
        await bad_connection(server, b"\x00\x00\x00\x10")
    monkeypatch.undo()
    assert server.stats.connection_failures == 5
    await still_served(server)


def test_the_failure_log_is_rate_limited(caplog):
    now = [0.0]
    flog = containment_mod._FailureLog(per_second=3, clock=lambda: now[0])
    with caplog.at_level(logging.ERROR):
        for i in range(10):
            flog.report(f"10.0.0.1:{i}", "decoding a frame", RecursionError("deep"))
        now[0] = 1.5
        flog.report("10.0.0.1:99", "decoding a frame", RecursionError("deep"))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 5, lines  # 3, the summary of the 7 others, the next window's first
    assert "7 more connection failures" in lines[3] and "10.0.0.1:99" in lines[4]
