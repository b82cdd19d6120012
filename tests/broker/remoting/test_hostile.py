# Hostile and broken clients against serve_remoting with ServerLimits, on
# real sockets: a frame trickled byte by byte (slowloris), a silent
# connection, a client that never reads its answers, a flood of connections
# from one address -- each is cut off after its limit while another client
# goes on being served, and what the server holds for the bad one stays
# bounded.  (Floods of requests: test_guard.py; oversized frames and the
# same limits on a real broker group: tests/broker/acl/test_secure_group.py.)
import itertools
import random
import struct

import attrs
import trio

from broker.remoting.client import open_remoting_client
from broker.remoting.codec import encode_command
from broker.remoting.codes import ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.server import serve_remoting
from broker.remoting.streams import ServerLimits, _FrameTracker, limits_from_props
from tests.broker.remoting.helpers import ECHO, EchoService, raw_invoke, read_until_eof

BIG = 1006
FAST = ServerLimits(idle_timeout=60, frame_read_timeout=0.5, write_timeout=0.5, handshake_timeout=0.5,
                    max_connections=50, max_connections_per_address=50)


async def start(nursery, limits=FAST, **kw):
    svc = EchoService()
    server = await nursery.start(lambda task_status: serve_remoting(
        svc.dispatcher, "127.0.0.1", 0, limits=limits, max_frame_size=limits.max_frame_size,
        max_in_flight=limits.max_in_flight_per_connection, task_status=task_status, **kw))
    return svc, server


async def still_served(server) -> None:
    async with open_remoting_client() as client:
        resp = await client.invoke(server.address, RemotingCommand(ECHO, body=b"alive"), timeout=5)
        assert resp.body == b"alive"


async def closed_within(stream, seconds) -> float:
    t0 = trio.current_time()
    await read_until_eof(stream, timeout=seconds)
    return trio.current_time() - t0


async def test_slowloris_frame_is_cut_off(nursery):
    _svc, server = await start(nursery)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    frame = encode_command(RemotingCommand(ECHO, body=b"x" * 100))
    t0 = trio.current_time()

    async def trickle():
        try:
            for i in range(len(frame)):  # one byte every 0.1 s: never idle, never done
                await stream.send_all(frame[i:i + 1])
                await trio.sleep(0.1)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async with trio.open_nursery() as n:
        n.start_soon(trickle)
        await still_served(server)  # meanwhile, others are served
        # the connection tells its stream when a frame is open (from its decoder)
        assert server.connections and not any(c.stream.track_frames for c in server.connections)
        await read_until_eof(stream, timeout=5)
        n.cancel_scope.cancel()
    assert 0.4 < trio.current_time() - t0 < 3
    with trio.fail_after(5):
        while server.connections:
            await trio.sleep(0.02)
    assert server.gate.total == 0


async def test_complete_frames_sent_slowly_are_fine(nursery):
    # The frame timeout is per frame: a client sending whole frames with
    # pauses longer than it between them is not a slowloris.
    _svc, server = await start(nursery)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    for i in range(3):
        assert (await raw_invoke(stream, RemotingCommand(ECHO, opaque=i + 1, body=b"ok"))).body == b"ok"
        await trio.sleep(0.7)
    await stream.aclose()


async def test_idle_connection_is_closed(nursery):
    _svc, server = await start(nursery, attrs.evolve(FAST, idle_timeout=1))
    silent = await trio.open_tcp_stream("127.0.0.1", server.port)
    await still_served(server)
    assert 0.8 < await closed_within(silent, 5) < 3


async def test_a_client_that_never_reads_is_cut_off_with_bounded_buffers(nursery):
    limits = attrs.evolve(FAST, max_in_flight_per_connection=4)
    svc, server = await start(nursery, limits)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    body = b"z" * (256 * 1024)
    frame = encode_command(RemotingCommand(ECHO, body=body))
    sent = 0
    # Push 400 echo requests (100 MB of answers) and never read one.  The
    # server stops reading once 4 wait for their answers, so our writes
    # stall long before all of it went out, and the write timeout ends the
    # connection.
    with trio.move_on_after(5):
        try:
            for _ in range(400):
                await stream.send_all(frame)
                sent += 1
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    assert sent < 100, f"{sent} requests of 256 KiB were accepted: the server buffers without bound"
    with trio.fail_after(5):
        while server.connections:
            await trio.sleep(0.02)
    await still_served(server)
    await stream.aclose()


async def test_big_requests_never_read_are_bounded_by_bytes_not_count(nursery):
    # The count cap (1024) would let 1024 requests of 256 KiB -- 256 MiB --
    # wait on one connection for answers it never reads; the byte budget
    # stops reading after about 1 MiB of them.
    limits = attrs.evolve(FAST, write_timeout=3.0, max_in_flight_bytes_per_connection=1024 * 1024)
    svc, server = await start(nursery, limits)
    handled = []

    async def big_answer(conn, cmd):
        handled.append(len(cmd.body))
        return cmd.make_response(body=cmd.body)  # as big as the request: the client's socket fills
    svc.dispatcher.register(BIG, big_answer)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    frame = encode_command(RemotingCommand(BIG, body=b"z" * (256 * 1024)))
    with trio.move_on_after(2):
        try:
            for _ in range(400):
                await stream.send_all(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    # About 1 MiB of requests plus one read, not hundreds.
    assert 0 < len(handled) <= 8, f"{len(handled)} requests of 256 KiB taken with a 1 MiB budget"
    with trio.fail_after(10):  # the write timeout ends it
        while server.connections:
            await trio.sleep(0.02)
    await still_served(server)
    await stream.aclose()


class Admissions:
    """on_connect for serve_remoting: wait until the server made n connections."""

    def __init__(self) -> None:
        self.conns = []
        self._changed = trio.Event()

    def __call__(self, conn) -> None:
        self.conns.append(conn)
        self._changed.set()
        self._changed = trio.Event()

    async def wait(self, n: int) -> None:
        with trio.fail_after(5):
            while len(self.conns) < n:
                await self._changed.wait()


async def test_a_full_address_sheds_its_least_valuable_connection(nursery):
    # A flood of connections from one address must not lock out the working
    # clients there: past the per-address cap, each new connection sheds the
    # one that never completed a frame (then the one idle longest), not the
    # working client, and is itself admitted.
    admitted = Admissions()
    _svc, server = await start(nursery, attrs.evolve(FAST, max_connections_per_address=3, max_connections=50),
                               on_connect=admitted)
    worker = await trio.open_tcp_stream("127.0.0.1", server.port)
    assert (await raw_invoke(worker, RemotingCommand(ECHO, opaque=1, body=b"w"))).body == b"w"
    silent = []
    for i in range(6):  # never send anything
        silent.append(await trio.open_tcp_stream("127.0.0.1", server.port))
        await admitted.wait(2 + i)
    assert server.gate.by_address["127.0.0.1"] == 3 and server.gate.shed == 4
    for s in silent[:4]:  # the oldest silent ones went, in order
        assert await read_until_eof(s) == []
    assert (await raw_invoke(worker, RemotingCommand(ECHO, opaque=2, body=b"still"))).body == b"still"
    # A new real client gets in (shedding a silent one) and is served.
    newcomer = await trio.open_tcp_stream("127.0.0.1", server.port)
    assert (await raw_invoke(newcomer, RemotingCommand(ECHO, opaque=1, body=b"n"))).body == b"n"
    assert server.gate.shed == 5
    assert (await raw_invoke(worker, RemotingCommand(ECHO, opaque=3, body=b"w3"))).body == b"w3"
    # Among working clients, the one idle longest goes first.
    third = await trio.open_tcp_stream("127.0.0.1", server.port)
    await admitted.wait(9)
    assert (await raw_invoke(third, RemotingCommand(ECHO, opaque=1, body=b"t"))).body == b"t"
    assert (await raw_invoke(worker, RemotingCommand(ECHO, opaque=4, body=b"w4"))).body == b"w4"
    fourth = await trio.open_tcp_stream("127.0.0.1", server.port)
    await admitted.wait(10)
    assert await read_until_eof(newcomer) == []  # idle since its one request
    assert (await raw_invoke(worker, RemotingCommand(ECHO, opaque=5, body=b"w5"))).body == b"w5"
    for s in (worker, third, fourth, *silent):
        await s.aclose()


async def test_a_full_server_sheds_from_the_busiest_address(nursery):
    admitted = Admissions()
    _svc, server = await start(nursery, attrs.evolve(FAST, max_connections=4, max_connections_per_address=50),
                               on_connect=admitted)
    crowd = []
    for i in range(3):
        crowd.append(await trio.open_tcp_stream("127.0.0.1", server.port, local_address="127.0.0.2"))
        await admitted.wait(i + 1)
    worker = await trio.open_tcp_stream("127.0.0.1", server.port)
    assert (await raw_invoke(worker, RemotingCommand(ECHO, opaque=1, body=b"w"))).body == b"w"
    other = await trio.open_tcp_stream("127.0.0.1", server.port)  # the fifth: one of the crowd goes
    assert (await raw_invoke(other, RemotingCommand(ECHO, opaque=1, body=b"o"))).body == b"o"
    assert server.gate.shed == 1 and server.gate.total == 4
    assert server.gate.by_address == {"127.0.0.2": 2, "127.0.0.1": 2}
    assert await read_until_eof(crowd[0]) == []
    assert (await raw_invoke(worker, RemotingCommand(ECHO, opaque=2, body=b"w2"))).body == b"w2"
    await keep_closing(crowd, worker, other)
    with trio.fail_after(5):
        while server.gate.total:
            await trio.sleep(0.02)


async def keep_closing(*streams) -> None:
    for s in streams:
        for one in (s if isinstance(s, list) else [s]):
            await one.aclose()


async def test_oversized_frame_closes_only_that_connection(nursery):
    limits = attrs.evolve(FAST, max_frame_size=64 * 1024)
    _svc, server = await start(nursery, limits)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    header = b'{"code":1001,"opaque":7}'
    # Claims 1 GiB; only the header arrives, and the server must not wait for
    # (or allocate) the rest.
    await stream.send_all(struct.pack(">ii", 1 << 30, len(header)) + header)
    [answer] = await read_until_eof(stream)
    assert answer.code == ResponseCode.SYSTEM_ERROR and answer.opaque == 7
    assert "exceeds the maximum of 65536" in answer.remark
    await still_served(server)


def test_limit_keys():
    limits = limits_from_props({"serverChannelMaxIdleTimeSeconds": "0", "serverFrameReadTimeoutMillis": "1500",
                                "frameMaxLength": "2048", "serverMaxInFlightRequests": "7",
                                "serverMaxInFlightBytesPerConnection": "65536", "other": "x"})
    assert (limits.idle_timeout, limits.frame_read_timeout, limits.max_frame_size, limits.max_in_flight,
            limits.max_in_flight_bytes_per_connection) == (0, 1.5, 2048, 7, 65536)
    assert ServerLimits().max_in_flight_bytes_per_connection == 16 * 1024 * 1024


def test_frame_tracker_follows_frames_split_anywhere():
    # GuardedStream's view of "a frame has begun and not ended", against
    # the true frame ends, for reads split at every kind of place.
    rng = random.Random(7)
    frames = [encode_command(RemotingCommand(ECHO, body=b"x" * rng.randint(0, 3000))) for _ in range(300)]
    data = b"".join(frames)
    ends = set(itertools.accumulate(len(f) for f in frames))
    for _ in range(50):
        tracker, pos = _FrameTracker(), 0
        while pos < len(data):
            chunk = data[pos:pos + rng.choice([1, 2, 3, 5, rng.randint(1, 8000)])]
            pos += len(chunk)
            tracker.feed(chunk)
            assert tracker.mid_frame == (pos not in ends)
