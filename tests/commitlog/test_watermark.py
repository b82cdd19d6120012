import pytest
import trio
import trio.testing

from commitlog.watermark import Watermark


async def test_waiters_wake_exactly_when_target_reached():
    wm = Watermark()
    woke = []

    async def waiter(n):
        await wm.wait_for(n)
        woke.append((n, wm.value))

    async with trio.open_nursery() as nursery:
        for n in (0, 3, 5):
            nursery.start_soon(waiter, n)
        await trio.testing.wait_all_tasks_blocked()
        wm.advance(2)
        await trio.testing.wait_all_tasks_blocked()
        assert woke == [(0, 2)]
        wm.advance(1)  # never goes down
        assert wm.value == 2
        wm.advance(5)
    assert sorted(woke) == [(0, 2), (3, 5), (5, 5)]


async def test_timeout_and_close():
    wm = Watermark()
    with pytest.raises(trio.TooSlowError):
        await wm.wait_for(1, timeout=0.01)
    async with trio.open_nursery() as nursery:
        async def closer():
            await trio.testing.wait_all_tasks_blocked()
            wm.close(RuntimeError("lost leadership"))
        nursery.start_soon(closer)
        with pytest.raises(RuntimeError, match="lost leadership"):
            await wm.wait_for(10)
    assert await wm.wait_for(-1) == -1  # already satisfied even when closed
