# Admission in front of dispatch (broker/remoting/guard.py) on real TCP: a
# refused request is answered and never reaches its processor, on the
# one-by-one path and on the burst path alike; each request is admitted
# once; past the in-flight cap requests are answered SYSTEM_BUSY and the
# count returns to zero.
import trio

from broker.remoting.codec import NEED_DATA, CommandDecoder, encode_command
from broker.remoting.codes import ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.guard import GuardedDispatcher, InFlightLimiter
from broker.remoting.server import serve_remoting
from tests.broker.remoting.helpers import ECHO, SLOW, EchoService

BURST = 1010


class BurstEcho:
    """A burst processor: records every request it accepted."""

    def __init__(self) -> None:
        self.seen: list[RemotingCommand] = []

    def accept_burst(self, conn, cmds):
        self.seen += cmds

        async def finish():
            return [cmd.make_response(body=b"burst:" + cmd.body) for cmd in cmds]
        return finish


def deny_marked(conn, cmd):
    if "deny" in cmd.ext_fields:
        return cmd.make_response(ResponseCode.NO_PERMISSION, f"refused {cmd.body.decode()}")
    return None


async def start(nursery, guard, bursts=True):
    return await nursery.start(lambda task_status: serve_remoting(
        guard, "127.0.0.1", 0, bursts=guard if bursts else None, on_close=guard.forget, task_status=task_status))


async def read_n(stream, n, timeout=5.0):
    dec, out = CommandDecoder(), []
    with trio.fail_after(timeout):
        while len(out) < n:
            cmd = dec.next_command()
            if cmd is NEED_DATA:
                dec.receive_data(await stream.receive_some(65536))
                continue
            out.append(cmd)
    return {c.opaque: c for c in out}


def req(code, opaque, body, deny=False):
    fields = {"deny": "1"} if deny else {}
    return encode_command(RemotingCommand(code, opaque=opaque, ext_fields=fields, body=body))


async def test_refusals_on_both_paths_never_reach_a_processor(nursery):
    svc, burst = EchoService(), BurstEcho()
    svc.dispatcher.register_burst(BURST, burst)
    echoed = []
    inner_echo = svc.echo

    async def echo(conn, cmd):
        echoed.append(cmd.body)
        return await inner_echo(conn, cmd)
    svc.dispatcher.register(ECHO, echo)

    async def burst_one_by_one(conn, cmd):  # what serves BURST on a connection without bursts
        burst.seen.append(cmd)
        return cmd.make_response(body=b"burst:" + cmd.body)
    svc.dispatcher.register(BURST, burst_one_by_one)
    limiter = InFlightLimiter(100)
    guard = GuardedDispatcher(svc.dispatcher, checks=[deny_marked], limiter=limiter)
    for with_bursts in (True, False):
        echoed.clear()
        burst.seen.clear()
        server = await start(nursery, guard, bursts=with_bursts)
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        # One write: the server reads them together (a burst when it has a burst handler).
        await stream.send_all(b"".join([
            req(ECHO, 1, b"e1"), req(ECHO, 2, b"e2", deny=True), req(BURST, 3, b"b3"),
            req(BURST, 4, b"b4", deny=True), req(BURST, 5, b"b5")]))
        got = await read_n(stream, 5)
        assert got[2].code == got[4].code == ResponseCode.NO_PERMISSION
        assert (got[2].remark, got[4].remark) == ("refused e2", "refused b4")
        assert got[1].body == b"e1" and got[3].code == ResponseCode.SUCCESS and got[5].code == ResponseCode.SUCCESS
        assert echoed == [b"e1"]
        assert sorted(c.body for c in burst.seen) == [b"b3", b"b5"]
        assert got[3].body == b"burst:b3"
        await stream.aclose()
        with trio.fail_after(5):
            while limiter.in_flight:
                await trio.sleep(0.01)
        assert limiter.in_flight == 0 and limiter.peak <= 3


async def test_past_the_in_flight_cap_requests_get_system_busy(nursery):
    svc = EchoService()
    limiter = InFlightLimiter(2)
    guard = GuardedDispatcher(svc.dispatcher, limiter=limiter)
    server = await start(nursery, guard)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(b"".join(req(SLOW, i, b"") for i in range(1, 6)))
    busy = await read_n(stream, 3)  # answered at once, while two wait
    assert all(r.code == ResponseCode.SYSTEM_BUSY and r.remark.startswith("[OVERLOAD]") for r in busy.values())
    assert limiter.in_flight == 2 and limiter.rejected == 3
    # Another client is refused too while the cap holds, then served after.
    other = await trio.open_tcp_stream("127.0.0.1", server.port)
    assert (await read_n_after(other, req(ECHO, 9, b"x")))[9].code == ResponseCode.SYSTEM_BUSY
    svc.release.set()
    done = await read_n(stream, 2)
    assert sorted(done) == sorted(set(range(1, 6)) - set(busy)) and all(r.body == b"slow done" for r in done.values())
    assert (await read_n_after(other, req(ECHO, 10, b"y")))[10].body == b"y"
    assert limiter.in_flight == 0


async def read_n_after(stream, frame):
    await stream.send_all(frame)
    return await read_n(stream, 1)


async def test_a_closed_connection_gives_its_slots_back(nursery):
    svc = EchoService()
    limiter = InFlightLimiter(10)
    guard = GuardedDispatcher(svc.dispatcher, limiter=limiter)
    server = await start(nursery, guard)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(b"".join(req(SLOW, i, b"") for i in range(1, 4)))
    with trio.fail_after(5):
        await svc.slow_started.wait()
    assert limiter.in_flight == 3
    await stream.aclose()  # the waiting handlers are cancelled after the EOF grace
    with trio.fail_after(5):
        while limiter.in_flight or server.connections:
            await trio.sleep(0.02)
