# The budgets a server keeps across its connections (issue 27), on real TCP:
#   * unfinished frames: a connection never buffers past its own budget of
#     frames not yet complete, and all together never past the server's;
#     past that, the connections holding the oldest unfinished frames are
#     shed, and a client sending a fresh request is served;
#   * a decoder that passed whole frames frees their buffer at once (an idle
#     peer that sent one big frame does not keep it in memory);
#   * the Pacer: however many requests are pipelined on however many
#     connections, no scheduler round starts more than serverRequestsPerRound
#     of them.
# (The same against a real broker's RSS: test_budgets_live.py.)
import struct

import attrs
import pytest
import trio
import trio.testing

from broker.remoting.codec import encode_command
from broker.remoting.command import RemotingCommand
from broker.remoting.pacing import Pacer
from broker.remoting.server import serve_remoting
from broker.remoting.streams import FrameBudget, ServerLimits, limits_from_props
from commitlog.config import ConfigError
from tests.broker.remoting.helpers import ECHO, EchoService, raw_invoke, read_until_eof
from tests.broker.remoting.test_guard import read_n

KiB, MiB = 1024, 1024 * 1024
LIMITS = ServerLimits(max_frame_size=4 * MiB, max_unfinished_bytes=1 * MiB,
                      max_unfinished_bytes_per_connection=4 * MiB, frame_read_timeout=30)


async def start(nursery, limits=LIMITS, svc=None):
    svc = svc or EchoService()
    server = await nursery.start(lambda task_status: serve_remoting(
        svc.dispatcher, "127.0.0.1", 0, limits=limits, max_frame_size=limits.max_frame_size,
        max_in_flight=limits.max_in_flight_per_connection, task_status=task_status))
    return server


def frame_head(total_body: int, opaque: int = 1) -> bytes:
    """The first bytes of an ECHO frame whose body is `total_body` bytes."""
    header = encode_command(RemotingCommand(ECHO, opaque=opaque))[8:]
    return struct.pack(">ii", 4 + len(header) + total_body, len(header)) + header


async def holder(server, body_sent: int, frame_body: int = 3 * MiB):
    """A connection that begins a big frame, sends `body_sent` bytes of it and stops."""
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(frame_head(frame_body) + b"h" * body_sent)
    await trio.testing.wait_all_tasks_blocked()  # the server has read all of it
    return stream


async def test_the_oldest_unfinished_frames_are_shed_and_a_fresh_request_is_served(nursery):
    server = await start(nursery)
    budget = server.budget
    a1 = await holder(server, 400 * KiB)
    a2 = await holder(server, 400 * KiB)
    assert budget.holders == 2 and budget.used > 800 * KiB and budget.shed == 0
    a3 = await holder(server, 400 * KiB)  # past 1 MiB: the oldest goes
    assert budget.shed == 1 and budget.used <= budget.limit
    assert await read_until_eof(a1) == []
    a4 = await holder(server, 400 * KiB)
    assert budget.shed == 2
    assert await read_until_eof(a2) == []
    # A real client's request, bigger than what is left: the old frames
    # make room for it, not the other way round.
    legit = await trio.open_tcp_stream("127.0.0.1", server.port)
    answer = await raw_invoke(legit, RemotingCommand(ECHO, opaque=7, body=b"L" * (600 * KiB)))
    assert answer.body == b"L" * (600 * KiB)
    assert budget.shed >= 3 and server.stats.shed_unfinished == budget.shed
    assert budget.peak <= budget.limit  # never above it after a read was taken in
    for s in (a3, a4, legit):
        await s.aclose()
    await trio.testing.wait_all_tasks_blocked()
    assert budget.used == 0 and budget.holders == 0


async def test_one_connection_never_buffers_past_its_own_budget(nursery):
    limits = attrs.evolve(LIMITS, max_unfinished_bytes=64 * MiB, max_unfinished_bytes_per_connection=64 * KiB)
    server = await start(nursery, limits)
    big = await trio.open_tcp_stream("127.0.0.1", server.port)
    try:
        await big.send_all(frame_head(512 * KiB) + b"b" * (512 * KiB))
    except trio.BrokenResourceError:
        pass  # closed while we were still sending
    assert await read_until_eof(big) == []
    assert server.budget.peak <= 64 * KiB and server.stats.shed_unfinished == 1
    # A frame within it is fine.
    small = await trio.open_tcp_stream("127.0.0.1", server.port)
    assert (await raw_invoke(small, RemotingCommand(ECHO, opaque=1, body=b"s" * (60 * KiB)))).body == b"s" * (60 * KiB)


async def test_whole_frames_free_their_buffer_at_once(nursery):
    server = await start(nursery, attrs.evolve(LIMITS, max_unfinished_bytes=64 * MiB))
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    # One big request answered, then the first 10 bytes of the next, and silence.
    assert (await raw_invoke(stream, RemotingCommand(ECHO, opaque=1, body=b"x" * (2 * MiB)))).code == 0
    assert server.budget.used == 0
    await stream.send_all(encode_command(RemotingCommand(ECHO, opaque=2, body=b"y" * (2 * MiB)))
                          + frame_head(100)[:10])
    [answer] = (await read_n(stream, 1)).values()
    assert answer.opaque == 2
    await trio.testing.wait_all_tasks_blocked()
    # What the server holds for this connection is the 10 bytes, not the
    # 2 MiB frame before them.
    assert 0 < server.budget.used <= 4096
    [conn] = server.connections
    assert conn._intake.decoder.buffered == 10


def test_budget_keys_and_defaults():
    limits = limits_from_props({"serverMaxUnfinishedFrameBytes": str(32 * MiB), "frameMaxLength": str(MiB),
                                "serverMaxUnfinishedFrameBytesPerConnection": str(MiB),
                                "serverRequestsPerRound": "64"})
    assert (limits.max_unfinished_bytes, limits.max_unfinished_bytes_per_connection,
            limits.requests_per_round) == (32 * MiB, MiB, 64)
    # Not given, the budgets follow a bigger frameMaxLength; given, they must fit it.
    big = limits_from_props({"frameMaxLength": str(100 * MiB)})
    assert (big.max_unfinished_bytes_per_connection, big.max_unfinished_bytes) == (100 * MiB, 100 * MiB)
    with pytest.raises(ConfigError, match="serverMaxUnfinishedFrameBytesPerConnection"):
        limits_from_props({"serverMaxUnfinishedFrameBytesPerConnection": str(MiB)})  # < 16 MiB frames
    d = ServerLimits()
    assert (d.max_unfinished_bytes, d.max_unfinished_bytes_per_connection, d.max_connections_per_address,
            d.requests_per_round) == (64 * MiB, 16 * MiB, 256, 128)


def test_budget_sheds_oldest_first_and_skips_stale_entries():
    now = [0.0]
    shed = []

    class Holder:
        def __init__(self, name):
            self.name = name

        def shed(self, reason):
            shed.append(self.name)

    budget = FrameBudget(100, clock=lambda: now[0])
    a, b, c = Holder("a"), Holder("b"), Holder("c")
    budget.update(a, 40, True)
    now[0] = 1
    budget.update(b, 40, True)
    now[0] = 2
    budget.update(a, 10, True)  # a finished its frame and began another: now the youngest
    budget.update(c, 70, True)  # 10 + 40 + 70 > 100: b (oldest frame) goes
    assert shed == ["b"] and budget.used == 80
    for i in range(500):  # frames begun and done: the order heap stays small
        budget.update(a, 5 + i % 7, True)
    assert len(budget._order) <= 2 * budget.holders + 64
    budget.update(c, 0, False)
    budget.update(a, 0, False)
    assert budget.used == 0 and budget.holders == 0 and budget.peak <= 100


class RoundCounter(trio.abc.Instrument):
    """How many request tasks (Connection._serve) began in each scheduler round."""

    def __init__(self) -> None:
        self.rounds: list[int] = [0]
        self.seen: set = set()

    def after_io_wait(self, timeout: float) -> None:
        self.rounds.append(0)

    def before_task_step(self, task) -> None:
        if task.name.endswith("Connection._serve") and task not in self.seen:
            self.seen.add(task)  # (held: a finished task's id would be reused)
            self.rounds[-1] += 1


async def test_pipelined_floods_are_spread_over_rounds(nursery):
    per_round = 16
    server = await start(nursery, attrs.evolve(LIMITS, requests_per_round=per_round))
    assert isinstance(server.pacer, Pacer)
    streams = [await trio.open_tcp_stream("127.0.0.1", server.port) for _ in range(4)]
    counter = RoundCounter()
    trio.lowlevel.add_instrument(counter)
    try:
        n = 300
        for s in streams:
            await s.send_all(b"".join(encode_command(RemotingCommand(ECHO, opaque=i + 1, body=b"p"))
                                      for i in range(n)))
        for s in streams:
            assert len(await read_n(s, n)) == n
    finally:
        trio.lowlevel.remove_instrument(counter)
    assert len(counter.seen) == 4 * n
    assert max(counter.rounds) <= per_round, sorted(counter.rounds)[-5:]
    assert server.pacer.deferred > 0
    for s in streams:
        await s.aclose()
