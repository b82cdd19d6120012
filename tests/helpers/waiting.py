# Owns the one way a test waits for something it cannot park on directly:
# `wait_until(condition, timeout=..., what=...)` checks a condition until it
# holds, and fails after `timeout` with an AssertionError that names what it
# waited for and what the condition last said.  A test that can wait on the
# thing itself (a trio.Event, a watermark's wait_for, a process's exit) does
# that instead; this is for state only reachable by asking (another process,
# a broker over TCP, a client's counters).
#
# The condition may be a plain or an async callable.  For wait_until it
# holds when it returns a true value (which wait_until returns); a falsy
# value or an AssertionError means "not yet".  `eventually(check)` is the
# same wait for a block of asserts: done when check() returns without an
# AssertionError (its value is returned), and the last failed assert is the
# failure's cause.
#
#   await wait_until(lambda: len(got) == n, 20, "every message consumed")
#   s = await eventually(puts_counted, timeout=20)
#   wait_until_sync(lambda: path.exists(), 10, "the pid file")
#
# The async variant runs on whichever loop the test runs (anyio: trio or
# asyncio), and on trio's MockClock its checks cost no real time.
import inspect
import time

import anyio

INTERVAL = 0.05


class WaitTimeout(AssertionError):
    """The condition did not hold within the deadline."""


def _failure(what: str, timeout: float, last) -> WaitTimeout:
    said = f"; last check: {last!r}" if last is not None else ""
    return WaitTimeout(f"timed out after {timeout:g} s waiting for {what}{said}")


async def wait_until(condition, timeout: float, what: str, *, interval: float = INTERVAL):
    """Until `condition()` (plain or async) returns a true value; returns it.
    Raises WaitTimeout after `timeout` seconds of the test's clock."""
    return await _wait(condition, timeout, what, interval, bool)


async def eventually(check, timeout: float = 20.0, what: str | None = None, *, interval: float = INTERVAL):
    """Until `check()` (plain or async) returns without an AssertionError;
    returns what it returned."""
    return await _wait(check, timeout, what or getattr(check, "__name__", "a check"), interval, lambda _: True)


async def _wait(condition, timeout: float, what: str, interval: float, done):
    last = None
    with anyio.move_on_after(timeout):
        while True:
            try:
                value = condition()
                if inspect.isawaitable(value):
                    value = await value
            except AssertionError as e:
                last = e
            else:
                if done(value):
                    return value
                last = value
            await anyio.sleep(interval)
    raise _failure(what, timeout, last) from (last if isinstance(last, BaseException) else None)


def wait_until_sync(condition, timeout: float, what: str, *, interval: float = INTERVAL):
    """wait_until for a test without an event loop (a plain function
    driving subprocesses); the condition is a plain callable."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            value = condition()
        except AssertionError as e:
            last = e
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise _failure(what, timeout, last) from (last if isinstance(last, BaseException) else None)
        time.sleep(interval)
