# Linger (commitlog/linger.py): a pause that ends on time, or at once when
# set to 0 (a node that starts to lead), on trio's virtual clock.
import pytest
import trio

from commitlog.linger import Linger


async def test_a_linger_waits_its_time_and_is_cut_short_by_zero(autojump_clock):
    linger = Linger()
    t0 = trio.current_time()
    await linger.wait()  # 0: no wait
    assert trio.current_time() == t0
    linger.set(0.02)
    await linger.wait()
    assert trio.current_time() - t0 >= 0.02
    ended = []
    async with trio.open_nursery() as nursery:
        linger.set(10.0)

        async def waiter():
            await linger.wait()
            ended.append(trio.current_time())

        t1 = trio.current_time()
        nursery.start_soon(waiter)
        await trio.sleep(1.0)
        assert not ended
        linger.set(0)
    assert ended and ended[0] - t1 == pytest.approx(1.0)  # cut at the set, not after 10 s
    linger.set(5.0)  # a later wait waits again
    t2 = trio.current_time()
    await linger.wait()
    assert trio.current_time() - t2 >= 5.0
