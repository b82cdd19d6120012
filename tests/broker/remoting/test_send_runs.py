# Runs of plain sends (codec.SendRun) on their way through a connection:
# the decoder hands out consecutive plain SEND_MESSAGE_V2s as one item,
# which counts as its requests everywhere requests are counted -- the
# connection's in-flight cap cuts a run where the room ends, admission's
# limiter admits part of a run and refuses the rest one by one -- and a
# burst processor answers a run with one bytes object or a list.  Real TCP.
import pytest
import trio

from broker.remoting.codec import NEED_DATA, CommandDecoder, RemotingCommand, SendRun, encode_command, request_count
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.pacing import _admit
from broker.remoting.guard import GuardedDispatcher, InFlightLimiter
from broker.remoting.server import RequestDispatcher, serve_remoting
from native import sendpath
from tests.broker.remoting.test_connection_coalescing import read_commands

pytestmark = pytest.mark.skipif(not sendpath.AVAILABLE, reason="the native extension is not built (make native)")


def v2(opaque: int, body: bytes = b"b", flag: int = 0) -> RemotingCommand:
    fields = {"a": "pg", "b": "TopicA", "c": "TBW102", "d": "4", "e": "1", "f": "0", "g": "1700000000000",
              "h": "0", "i": "TAGS\x01t\x02", "j": "0", "k": "false", "m": "false"}
    return RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, fields, body=body, opaque=opaque, flag=flag)


def items_of(cmds: list[RemotingCommand]) -> list:
    dec = CommandDecoder(raw_sends=True)
    dec.receive_data(b"".join(encode_command(c) for c in cmds))
    out = []
    while (cmd := dec.next_command()) is not NEED_DATA:
        out.append(cmd)
    return out


def test_plain_sends_come_as_one_run_and_others_break_it():
    other = RemotingCommand.create_request(RequestCode.HEART_BEAT, {}, body=b"hb", opaque=99)
    items = items_of([v2(1), v2(2), v2(3), other, v2(4), v2(5)])
    assert [type(i) for i in items] == [SendRun, RemotingCommand, SendRun]
    assert [len(items[0]), len(items[2])] == [3, 2] and request_count(items) == 6
    assert [s.opaque for s in items[0].sends()] == [1, 2, 3]
    assert [s.command().body for s in items[2].sends()] == [b"b", b"b"]


def test_admit_cuts_a_run_where_the_room_ends():
    other = RemotingCommand.create_request(RequestCode.HEART_BEAT, {}, opaque=99)
    items = items_of([other, *[v2(i) for i in range(10)], other])
    assert [type(i) for i in items] == [RemotingCommand, SendRun, RemotingCommand]
    part, n, nxt = _admit(items, 0, 4)  # the command and 3 of the run
    assert n == 4 and nxt == 1 and len(part[1]) == 3 and len(items[1]) == 7
    part, n, nxt = _admit(items, nxt, 4)
    assert n == 4 and nxt == 1 and [s.opaque for s in part[0].sends()] == [3, 4, 5, 6]
    part, n, nxt = _admit(items, nxt, 100)  # the rest
    assert n == 4 and nxt == 3 and [s.opaque for s in part[0].sends()] == [7, 8, 9] and part[1] is items[2]


def test_the_limiter_admits_part_of_a_run():
    lim = InFlightLimiter(5)
    assert lim.try_acquire_many(3) == 3 and lim.try_acquire_many(4) == 2 and lim.try_acquire_many(1) == 0
    assert (lim.in_flight, lim.rejected, lim.peak) == (5, 3, 5)


class RunEcho:
    """Answers a SendRun with one bytes object when its first opaque is
    even, else with a list (None for a oneway request); counts requests."""

    def __init__(self) -> None:
        self.runs: list[int] = []
        self.in_flight = 0
        self.peak = 0

    def accept_burst(self, conn, cmds):
        n = request_count(cmds)
        self.in_flight += n
        self.peak = max(self.peak, self.in_flight)
        self.runs += [len(c) for c in cmds if type(c) is SendRun]

        async def finish():
            await trio.sleep(0.01)  # answers come later, as a log's commit would
            self.in_flight -= n
            out = []
            for c in cmds:
                ones = c.sends()
                if ones[0].opaque % 2 == 0:
                    out.append(b"".join(encode_command(s.make_response(ResponseCode.SUCCESS, "blob").as_response_to(
                        s.command())) for s in ones if not s.is_oneway))
                else:
                    out.append([None if s.is_oneway else s.make_response(ResponseCode.SUCCESS, "list") for s in ones])
            return out
        return finish


async def exchange(port: int, cmds: list[RemotingCommand], expect: int) -> dict[int, RemotingCommand]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"".join(encode_command(c) for c in cmds))
        return {cmd.opaque: cmd for cmd in await read_commands(stream, expect)}


async def test_runs_through_a_capped_connection_and_a_limiter(nursery):
    echo = RunEcho()
    dispatcher = RequestDispatcher()
    dispatcher.register_burst(RequestCode.SEND_MESSAGE_V2, echo)
    limiter = InFlightLimiter(40)
    guard = GuardedDispatcher(dispatcher, limiter=limiter)
    server = await nursery.start(lambda task_status: serve_remoting(
        guard, "127.0.0.1", 0, bursts=guard, raw_sends=True, max_in_flight=16, on_close=guard.forget,
        task_status=task_status))
    # 100 pipelined sends, every 7th oneway: the connection admits at most 16 at a time
    cmds = [v2(i, flag=2 if i % 7 == 3 else 0) for i in range(100)]
    got = await exchange(server.port, cmds, expect=sum(1 for c in cmds if not c.is_oneway))
    assert sorted(got) == [c.opaque for c in cmds if not c.is_oneway]
    assert all(r.code == ResponseCode.SUCCESS and r.remark in ("blob", "list") for r in got.values())
    assert echo.peak <= 16 and sum(echo.runs) == 100 and max(echo.runs) > 1
    assert limiter.in_flight == 0
    # Past the limiter's cap: part of a run admitted, the rest SYSTEM_BUSY one by one, all answered
    limiter.limit = 5
    got = await exchange(server.port, [v2(i) for i in range(200, 230)], expect=30)
    busy = sorted(o for o, r in got.items() if r.code == ResponseCode.SYSTEM_BUSY)
    assert len(busy) >= 25 - 5 and all("[OVERLOAD]" in got[o].remark for o in busy)
    assert limiter.in_flight == 0 and limiter.rejected >= len(busy)


def test_item_checks_keep_admitted_sends_as_runs_around_the_refused():
    """GuardedDispatcher(item_checks=...): asked once per run, the refused
    sends answered alone, the others admitted as runs (the native path's),
    the limiter counting each run once; without item_checks each send is
    checked on its own and the outcome is the same.  A plain command beside
    the run goes through the same admission."""
    [run] = items_of([v2(i) for i in range(8)])
    other = RemotingCommand(RequestCode.HEART_BEAT, opaque=99)
    asked: list = []

    def deny_3_and_4(conn, one):  # the per-request check
        return one.make_response(ResponseCode.NO_PERMISSION, "no") if one.opaque in (3, 4) else None

    def item_checks(conn, item):
        asked.append(item.count)
        return [(pos, one.make_response(ResponseCode.NO_PERMISSION, "no"))
                for pos, one in enumerate(item.one_by_one()) if one.opaque in (3, 4)]

    class Conn:
        attributes: dict = {}

    for ic in (item_checks, None):
        lim = InFlightLimiter(100)
        guard = GuardedDispatcher(RequestDispatcher(), checks=[deny_3_and_4], limiter=lim, item_checks=ic)
        singles, bursts = guard.split_burst(Conn(), [run, other])
        runs = [a for a in singles if type(a) is SendRun]
        assert [[s.opaque for s in a.sends()] for a in runs] == [[0, 1, 2], [5, 6, 7]]
        assert [a for a in singles if type(a) is not SendRun] == [other]
        [(cmds, answers)] = bursts
        assert [one.opaque for one in cmds] == [3, 4]
        assert [answer.code for answer in answers.replies] == [ResponseCode.NO_PERMISSION] * 2
        assert lim.in_flight == 7
    assert asked == [8, 1]  # once per item: the whole run, the command


def test_a_run_past_the_limiter_is_cut_and_the_rest_refused_busy():
    [run] = items_of([v2(i) for i in range(8)])

    class Conn:
        attributes: dict = {}

    lim = InFlightLimiter(5)
    guard = GuardedDispatcher(RequestDispatcher(), limiter=lim)
    singles, [(cmds, answers)] = guard.split_burst(Conn(), [run])
    assert [[s.opaque for s in a.sends()] for a in singles] == [[0, 1, 2, 3, 4]]
    assert [one.opaque for one in cmds] == [5, 6, 7]
    assert all(a.code == ResponseCode.SYSTEM_BUSY and "[OVERLOAD]" in a.remark for a in answers.replies)
    assert lim.in_flight == 5 and lim.rejected == 3
