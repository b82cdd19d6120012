# QueueArrivals (consumequeue/arrivals.py): a waiter wakes when its own queue
# moves past its offset -- not when another queue does -- and on a reset; a
# cancelled waiter leaves nothing behind.
import trio
import trio.testing

from consumequeue.arrivals import QueueArrivals


async def test_waiters_wake_per_queue_and_on_reset():
    tops = {("T", 0): 4, ("T", 1): -1}
    arrivals = QueueArrivals(lambda topic, qid: tops.get((topic, qid), -1))
    woken = []

    async def wait(name, topic, qid, offset):
        await arrivals.wait_beyond(topic, qid, offset)
        woken.append(name)

    async with trio.open_nursery() as nursery:
        await wait("already", "T", 0, 3)  # the queue holds offset 3: no wait at all
        nursery.start_soon(wait, "q0@4", "T", 0, 4)
        nursery.start_soon(wait, "q0@6", "T", 0, 6)
        nursery.start_soon(wait, "q1@0", "T", 1, 0)
        nursery.start_soon(wait, "other", "U", 0, 0)
        await trio.testing.wait_all_tasks_blocked()
        assert arrivals.waiters == 4
        tops[("T", 1)] = 0  # max offset 0: offset 0 is not there yet
        arrivals.check()
        await trio.testing.wait_all_tasks_blocked()
        assert woken == ["already"]
        tops[("T", 0)] = 5  # offset 4 arrived on queue 0 only
        arrivals.check()
        await trio.testing.wait_all_tasks_blocked()
        assert woken == ["already", "q0@4"] and arrivals.waiters == 3
        tops[("T", 1)] = 1
        arrivals.check()
        await trio.testing.wait_all_tasks_blocked()
        assert woken[-1] == "q1@0" and arrivals.waiters == 2
        arrivals.reset()  # rebuilt queues: everyone re-reads
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(woken[-2:]) == ["other", "q0@6"] and arrivals.waiters == 0


async def test_cancelled_waiter_is_forgotten():
    arrivals = QueueArrivals(lambda topic, qid: -1)
    with trio.move_on_after(0.01):
        await arrivals.wait_beyond("T", 0, 0)
    assert arrivals.waiters == 0
    arrivals.check()  # nothing to wake, nothing fails


async def test_many_waiters_of_one_queue_cancelled_together_leave_nothing():
    # A closed flood of long polls: thousands of waiters on one queue are
    # cancelled in one round, some after a check woke part of them.
    tops = {("T", 0): 0}
    arrivals = QueueArrivals(lambda topic, qid: tops.get((topic, qid), -1))
    woken = 0

    async def wait(offset):
        nonlocal woken
        await arrivals.wait_beyond("T", 0, offset)
        woken += 1

    async with trio.open_nursery() as nursery:
        for i in range(5000):
            nursery.start_soon(wait, i % 2)  # half at offset 0, half at offset 1
        await trio.testing.wait_all_tasks_blocked()
        assert arrivals.waiters == 5000
        tops[("T", 0)] = 1  # offset 0 arrived: the 2500 waiting for it wake
        arrivals.check()
        await trio.testing.wait_all_tasks_blocked()
        assert woken == 2500 and arrivals.waiters == 2500
        nursery.cancel_scope.cancel()
    assert arrivals.waiters == 0 and not arrivals._waiting
