# Tests for commitlog/stallwatch.py: a step that blocks the trio thread past
# the threshold is reported with its task name; steps that yield promptly are
# not.  No timing upper bounds: only "a 200 ms block is >= 50 ms".
import time

import trio

from commitlog.stallwatch import STALL_ENV, StallWatch, instruments_from_env


def test_blocking_step_reported_short_ones_not():
    seen = []
    watch = StallWatch(0.05, report=lambda name, s: seen.append((name, s)))

    async def blocker():
        time.sleep(0.2)  # deliberately blocks the event loop

    async def polite():
        for _ in range(20):
            await trio.sleep(0)

    async def main():
        async with trio.open_nursery() as n:
            n.start_soon(polite, name="polite")
            n.start_soon(blocker, name="blocker")

    trio.run(main, instruments=[watch])
    names = [n for n, _ in seen]
    assert [n.split(" ")[0] for n in names] == ["blocker"]
    assert seen[0][1] >= 0.2
    assert watch.count == 1 and watch.longest[1].startswith("blocker")


def test_broken_reporter_does_not_break_run():
    def boom(name, s):
        raise RuntimeError("x")

    async def blocker():
        time.sleep(0.06)
        return 7

    assert trio.run(blocker, instruments=[StallWatch(0.01, report=boom)]) == 7


def test_env_parsing():
    assert instruments_from_env({}) == []
    assert instruments_from_env({STALL_ENV: "0"}) == []
    assert instruments_from_env({STALL_ENV: "abc"}) == []
    [w] = instruments_from_env({STALL_ENV: "50"})
    assert isinstance(w, StallWatch) and w.warn_s == 0.05
