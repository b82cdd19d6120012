# How one Connection turns bursts into few scheduler passes and few writes
# (both measured on the broker: one Raft round and one send syscall per
# message made pipelined sends ~4x dearer than they need to be):
#   * every request decoded from one read is started before any handler
#     runs, so a pipelined burst reaches the log's group commit together;
#   * frames queued while another task holds the send lock go out with that
#     task's write, and each sender still returns only once its frame is
#     written; a sender cancelled before its frame was taken withdraws it.
import trio
import trio.testing

from broker.remoting.codec import CLOSED, NEED_DATA, CommandDecoder, encode_command
from broker.remoting.codes import ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Connection
from broker.remoting.streams import direct_writer

CODE = 1001


class CountingStream(trio.abc.HalfCloseableStream):
    """A stream wrapper that counts send_all calls."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.writes: list[int] = []

    async def send_all(self, data) -> None:
        self.writes.append(len(data))
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def receive_some(self, max_bytes=None) -> bytes:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def read_commands(stream, n: int) -> list[RemotingCommand]:
    dec, out = CommandDecoder(), []
    with trio.fail_after(10):
        while len(out) < n:
            cmd = dec.next_command()
            if cmd is NEED_DATA:
                dec.receive_data(await stream.receive_some(65536))
                continue
            assert cmd is not CLOSED
            out.append(cmd)
    return out


async def test_a_burst_starts_every_handler_before_any_runs_and_answers_in_few_writes(nursery):
    server_side, client_side = trio.testing.memory_stream_pair()
    counting = CountingStream(server_side)
    release = trio.Event()
    in_flight_when_first_ran: list[int] = []

    async def handler(conn, cmd):
        if not in_flight_when_first_ran:  # handlers started so far
            in_flight_when_first_ran.append(conn._window.requests)
        await release.wait()
        return cmd.make_response(ResponseCode.SUCCESS, body=cmd.body)

    conn = Connection(counting, handler, max_in_flight=64)
    nursery.start_soon(conn.run)
    burst = b"".join(encode_command(RemotingCommand.create_request(CODE, body=b"%d" % i).as_request(i + 1))
                     for i in range(40))
    await client_side.send_all(burst)  # one read on the server side
    await trio.testing.wait_all_tasks_blocked()
    assert in_flight_when_first_ran == [40]
    release.set()  # all 40 answer in the same scheduler pass
    responses = await read_commands(client_side, 40)
    assert sorted(r.opaque for r in responses) == list(range(1, 41))
    assert all(r.is_response and r.body == b"%d" % (r.opaque - 1) for r in responses)
    assert len(counting.writes) <= 3, counting.writes  # not one write per response
    conn.close()


async def test_every_sender_returns_after_its_frame_is_written_and_cancelled_ones_withdraw(nursery):
    server_side, client_side = trio.testing.memory_stream_pair()
    counting = CountingStream(server_side)
    conn = Connection(counting)
    nursery.start_soon(conn.run)
    frames = [encode_command(RemotingCommand.create_request(CODE, body=b"%d" % i).as_request(i + 1))
              for i in range(5)]
    done: list[int] = []
    withdrawn = trio.CancelScope()

    async def send(i: int) -> None:
        await conn._send_bytes(frames[i])
        done.append(i)

    async def cancelled_sender() -> None:
        with withdrawn:
            await send(4)

    await conn._send_lock.acquire()  # hold the lock: every sender queues behind it
    async with trio.open_nursery() as senders:
        for i in range(4):
            senders.start_soon(send, i)
        senders.start_soon(cancelled_sender)
        await trio.testing.wait_all_tasks_blocked()
        withdrawn.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert done == [] and counting.writes == []
        conn._send_lock.release()
    assert sorted(done) == [0, 1, 2, 3]
    # The first sender wrote all four frames in one write, and not the withdrawn fifth.
    assert counting.writes == [sum(len(f) for f in frames[:4])]
    got = await read_commands(client_side, 4)
    assert sorted(c.body for c in got) == [b"0", b"1", b"2", b"3"]
    conn.close()


async def test_a_read_of_more_requests_than_the_limit_is_admitted_in_parts(nursery):
    """One read holding more requests than max_in_flight (oneway floods and
    small pipelined sends do this): the first max_in_flight are handed over,
    the rest wait for their answers -- never for their own -- and every
    request is answered; the limit holds throughout."""
    server_side, client_side = trio.testing.memory_stream_pair()
    most = [0]

    async def handler(conn, cmd):
        most[0] = max(most[0], conn._window.requests)
        await trio.sleep(0)
        return cmd.make_response(ResponseCode.SUCCESS, body=cmd.body)

    conn = Connection(server_side, handler, max_in_flight=8)
    nursery.start_soon(conn.run)
    burst = b"".join(encode_command(RemotingCommand.create_request(CODE, body=b"%d" % i).as_request(i + 1))
                     for i in range(50))
    await client_side.send_all(burst)
    responses = await read_commands(client_side, 50)
    assert sorted(r.opaque for r in responses) == list(range(1, 51))
    await trio.testing.wait_all_tasks_blocked()
    assert most[0] == 8 and conn._window.requests == 0
    conn.close()


async def test_frames_go_straight_to_a_tcp_socket_and_a_part_written_is_finished_first(nursery):
    """Over plain TCP a frame is written to the socket at once when nothing
    else is being written (no lock, no trio socket round); when the socket
    takes only part of it (here: a writer that takes 1,000 bytes at most),
    the rest goes out before any frame sent after it, and the peer reads
    every frame whole."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    accepted = trio.Event()
    peer = {}

    async def serve():
        peer["stream"] = await listeners[0].accept()
        accepted.set()
    nursery.start_soon(serve)
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await accepted.wait()
    assert direct_writer(stream) is not None and direct_writer(CountingStream(stream)) is None
    conn = Connection(stream)
    direct, parts = conn._write_now, []

    def stingy(data):
        n = direct(memoryview(data)[:1000])
        parts.append((n, len(data)))
        return n
    conn._write_now = stingy
    frames = [encode_command(RemotingCommand(CODE, opaque=i, body=bytes([i]) * (30_000 + i))) for i in range(8)]

    async def send(i):
        await conn._send_bytes(frames[i])
    async with trio.open_nursery() as senders:
        for i in range(8):
            senders.start_soon(send, i)
        got = await read_commands(peer["stream"], 8)
    # (concurrent senders: any order, but never a frame cut by another)
    assert sorted((c.opaque, c.body) for c in got) == [(i, bytes([i]) * (30_000 + i)) for i in range(8)]
    assert parts and all(n == 1000 < size for n, size in parts)  # each direct write went out in part
    small = encode_command(RemotingCommand(CODE, opaque=99, body=b"s"))
    conn._write_now = direct
    await conn._send_bytes(small)  # whole, at once
    assert [c.opaque for c in await read_commands(peer["stream"], 1)] == [99]
    await stream.aclose()
    await peer["stream"].aclose()
