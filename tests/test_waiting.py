# Owns the checks of tests/helpers/waiting.py, the suite's one way to wait
# for a condition: it returns as soon as the condition holds, fails with a
# message naming what it waited for, and costs no real time on MockClock.
import pytest
import trio

from tests.helpers.waiting import WaitTimeout, eventually, wait_until, wait_until_sync


async def test_wait_until_returns_the_value_once_it_holds(autojump_clock):
    calls = []

    def grows():
        calls.append(1)
        return len(calls) if len(calls) >= 3 else 0
    assert await wait_until(grows, 5, "three calls") == 3
    assert len(calls) == 3


async def test_wait_until_takes_async_conditions_and_asserts(autojump_clock):
    box = {"n": 0}

    async def check():
        box["n"] += 1
        assert box["n"] >= 4, f"only {box['n']}"
        return "done"
    assert await eventually(check, 5) == "done"


async def test_a_condition_that_never_holds_fails_with_what_and_the_last_answer(autojump_clock):
    start = trio.current_time()
    with pytest.raises(WaitTimeout, match=r"timed out after 2 s waiting for the moon; last check: 0"):
        await wait_until(lambda: 0, 2, "the moon")
    assert trio.current_time() - start == pytest.approx(2, abs=0.1)

    def never():
        assert 1 == 2, "one is not two"
    with pytest.raises(WaitTimeout, match="one is not two") as info:
        await eventually(never, 1, "arithmetic")
    assert isinstance(info.value.__cause__, AssertionError)


async def test_other_errors_are_not_swallowed(autojump_clock):
    def broken():
        raise KeyError("nope")
    with pytest.raises(KeyError):
        await wait_until(broken, 5, "a broken condition")


def test_sync_variant():
    box = []
    assert wait_until_sync(lambda: box.append(1) or len(box) >= 2, 5, "two", interval=0.001)
    with pytest.raises(WaitTimeout, match="waiting for nothing"):
        wait_until_sync(lambda: False, 0.05, "nothing", interval=0.01)
