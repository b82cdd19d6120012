# Owns the event-loop stall watcher: a trio Instrument that times every task
# step and logs a WARNING naming the task when one step held the trio thread
# longer than a threshold.  A broker's heartbeats, acks and check-quorum all
# run on that one thread, so a synchronous fsync/ftruncate/big write there for
# more than the election timeout (300-600 ms) makes a healthy leader step
# down; this is the tool that shows which task did it.
#
# Off unless LEDGERMQ_STALL_WARN_MS is set (a positive number of ms): the
# process entry points pass `instruments_from_env()` to trio.run, which is an
# empty list when the variable is unset, so production pays nothing.
import logging
import os
import time

import trio

__all__ = ["STALL_ENV", "StallWatch", "instruments_from_env"]

STALL_ENV = "LEDGERMQ_STALL_WARN_MS"

log = logging.getLogger("ledgermq.stall")


class StallWatch(trio.abc.Instrument):
    """Times each task step; reports steps of at least `warn_s` seconds.

    `report` (default: a log WARNING) is called with (task name, seconds);
    `stalls` keeps a count and the longest step seen, for a summary at exit."""

    def __init__(self, warn_s: float, report=None, clock=time.perf_counter):
        self.warn_s = warn_s
        self._clock = clock
        self._report = report if report is not None else self._log
        self._start = None
        self.count = 0
        self.longest = (0.0, "")

    @staticmethod
    def _log(name: str, seconds: float) -> None:
        log.warning("event loop stalled %.0f ms in one step of task %s", seconds * 1000, name)

    def before_task_step(self, task) -> None:
        self._where = _suspended_at(task.coro)
        self._start = self._clock()

    def after_task_step(self, task) -> None:
        if self._start is None:
            return
        took = self._clock() - self._start
        self._start = None
        if took >= self.warn_s:
            self.count += 1
            # the step ran between these two awaits: that is where to look
            name = f"{task.name} [{self._where} -> {_suspended_at(task.coro)}]"
            if took > self.longest[0]:
                self.longest = (took, name)
            try:
                self._report(name, took)
            except Exception:  # a broken reporter must never take the run loop down
                log.exception("stall reporter failed")

    _where = "?"

    def after_run(self) -> None:
        if self.count:
            log.warning("stall summary: %d steps >= %.0f ms, longest %.0f ms in %s",
                        self.count, self.warn_s * 1000, self.longest[0] * 1000, self.longest[1])


def _suspended_at(coro) -> str:
    """file:line of the innermost await a task's coroutine is parked at
    (walks the cr_await chain; generators' gi_yieldfrom for async gens)."""
    frame = None
    seen = 0
    while coro is not None and seen < 64:
        seen += 1
        f = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
        if f is None:
            break
        if "/trio/" not in f.f_code.co_filename:  # trio's traps say nothing about the caller
            frame = f
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) or getattr(coro, "ag_await", None)
    if frame is None:
        return "?"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def instruments_from_env(environ=None) -> list:
    """[StallWatch] if LEDGERMQ_STALL_WARN_MS is a positive number, else []."""
    raw = (environ if environ is not None else os.environ).get(STALL_ENV, "").strip()
    if not raw:
        return []
    try:
        ms = float(raw)
    except ValueError:
        log.warning("%s=%r is not a number; stall watch off", STALL_ENV, raw)
        return []
    return [StallWatch(ms / 1000.0)] if ms > 0 else []
