# A burst's answers (broker/remoting/answers.py) and how a connection writes
# them: answers given synchronously from another task (as the log's driver
# gives committed sends' answers) are written at once, from that task, with
# no task of the burst's own; answers that need a task get one; the
# admission guard's slots come back in every case, also when the answers
# arrive after the connection closed.
import socket

import pytest
import trio

from broker.remoting.answers import BurstAnswers, as_answers
from broker.remoting.codes import ResponseCode
from broker.remoting.guard import GuardedDispatcher, InFlightLimiter
from tests.broker.remoting.helpers import EchoService
from tests.broker.remoting.test_guard import BURST, read_n, req, start


async def test_answers_are_given_once_and_reach_whoever_binds():
    answers = BurstAnswers()
    ran: list = []
    answers.then(lambda: ran.append("then"))
    answers.give([1, 2])
    assert ran == ["then"] and answers.replies == [1, 2] and answers.finish is None
    got: list = []
    answers.bind(got.append)  # given before bound: delivered at bind
    assert got == [answers]
    with pytest.raises(RuntimeError):
        answers.give([3])
    assert await answers() == [1, 2]
    answers.then(lambda: ran.append("late"))  # known already: at once
    assert ran == ["then", "late"]


async def test_an_async_half_runs_its_hooks_when_done_or_abandoned():
    async def finish():
        return ["x"]
    ran: list = []
    answers = as_answers(finish)
    answers.then(lambda: ran.append(1))
    assert answers.replies is None and answers.finish is not None and not ran
    assert await answers() == ["x"] and ran == [1]
    other = BurstAnswers.later(finish)
    other.then(lambda: ran.append(2))
    other.abandon()  # the connection went away before it could run it
    assert ran == [1, 2]


async def test_a_hook_that_raises_is_logged_and_the_others_run(caplog):
    answers = BurstAnswers()
    ran: list = []
    answers.then(lambda: 1 / 0)
    answers.then(lambda: ran.append(True))
    answers.give([])
    assert ran == [True] and "answer hook failed" in caplog.text


class LaterBursts:
    """A burst processor whose answers another task gives later, as the
    send path's are given by the log's driver."""

    def __init__(self) -> None:
        self.pending: list[tuple[BurstAnswers, list]] = []
        self.arrived = trio.Event()

    def accept_burst(self, conn, cmds):
        answers = BurstAnswers()
        self.conn = conn
        self.pending.append((answers, cmds))
        self.arrived.set()
        return answers

    def answer_all(self) -> None:
        pending, self.pending = self.pending, []
        for answers, cmds in pending:
            answers.give([cmd.make_response(body=b"later:" + cmd.body) for cmd in cmds])


async def test_answers_given_from_another_task_are_written_without_a_task(nursery):
    svc, bursts = EchoService(), LaterBursts()
    svc.dispatcher.register_burst(BURST, bursts)
    limiter = InFlightLimiter(100)
    guard = GuardedDispatcher(svc.dispatcher, limiter=limiter)
    server = await start(nursery, guard)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(b"".join(req(BURST, i, b"b%d" % i) for i in range(1, 4)))
    await bursts.arrived.wait()
    assert limiter.in_flight == 3
    bursts.answer_all()  # synchronously, from this (the test's) task
    # Written before answer_all returned: on loopback the bytes are already
    # readable, though no other task has run since.
    head = stream.socket._sock.recv(65536, socket.MSG_DONTWAIT | socket.MSG_PEEK)
    assert b"later:b3" in head
    got = await read_n(stream, 3)
    assert [got[i].body for i in (1, 2, 3)] == [b"later:b1", b"later:b2", b"later:b3"]
    assert limiter.in_flight == 0  # released as the answers were given
    await stream.aclose()


async def test_answers_given_after_the_connection_closed_give_the_slots_back(nursery):
    svc, bursts = EchoService(), LaterBursts()
    svc.dispatcher.register_burst(BURST, bursts)
    limiter = InFlightLimiter(100)
    guard = GuardedDispatcher(svc.dispatcher, limiter=limiter)
    server = await start(nursery, guard)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(req(BURST, 1, b"x") + req(BURST, 2, b"y"))
    await bursts.arrived.wait()
    await stream.aclose()
    with trio.fail_after(5):
        await bursts.conn.wait_closed()

    async def slow():
        return [None, None]
    answers, _cmds = bursts.pending.pop()
    answers.give_async(slow)  # a half that needs a task, for a connection that may be gone
    with trio.fail_after(5):
        while limiter.in_flight:
            await trio.sleep(0.01)
    assert limiter.in_flight == 0


async def test_a_refused_burst_member_is_answered_in_the_read_loop(nursery):
    svc, bursts = EchoService(), LaterBursts()
    svc.dispatcher.register_burst(BURST, bursts)

    def deny_b(conn, cmd):
        return cmd.make_response(ResponseCode.NO_PERMISSION, "no") if cmd.body == b"b" else None
    guard = GuardedDispatcher(svc.dispatcher, checks=[deny_b], limiter=InFlightLimiter(10))
    server = await start(nursery, guard)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(req(BURST, 1, b"a") + req(BURST, 2, b"b"))
    got = await read_n(stream, 1)  # the refusal, before anything else is answered
    assert got[2].code == ResponseCode.NO_PERMISSION
    await bursts.arrived.wait()
    bursts.answer_all()
    assert (await read_n(stream, 1))[1].body == b"later:a"
    await stream.aclose()
