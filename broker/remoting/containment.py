# Owns the accounting of failures a peer's input caused and the servers
# contained: what a server's connections count together (ConnectionStats,
# exported as metrics), the log of their tracebacks -- at most 20 a second,
# the rest counted and summed up in the next line, so a peer that can make
# its connections fail cannot flood the log (report_failure) -- and how an
# exception is described in a SYSTEM_ERROR answer or a close reason
# (exception_desc).  Containing a failure is the job of whoever serves the
# bytes (Connection.run, serve_remoting's serve_one): each closes that one
# connection and reports here; nothing a peer sends ends more than that.
import logging
import time

import attrs

log = logging.getLogger(__name__)


def exception_desc(e: BaseException) -> str:
    """What the SYSTEM_ERROR remark says about a failed handler."""
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


@attrs.define(eq=False)
class ConnectionStats:
    """What a server's connections count together (exported as metrics)."""

    connection_failures: int = 0  # connections closed by an unexpected exception
    handler_failures: int = 0  # requests answered SYSTEM_ERROR after one
    shed_unfinished: int = 0  # connections closed by the unfinished-frame budgets


class _FailureLog:
    """At most `per_second` tracebacks a second, so that a peer that can
    make its connections fail cannot flood the log; the rest are counted
    and summed up in the next line."""

    def __init__(self, per_second: int = 20, clock=time.monotonic) -> None:
        self.per_second = per_second
        self._clock = clock
        self._window = -1.0
        self._logged = 0
        self._suppressed = 0

    def report(self, address: str, where: str, error: BaseException) -> None:
        now = self._clock()
        if now - self._window >= 1.0:
            if self._suppressed:
                log.error("%d more connection failures were not logged", self._suppressed)
            self._window, self._logged, self._suppressed = now, 0, 0
        if self._logged >= self.per_second:
            self._suppressed += 1
            return
        self._logged += 1
        log.error("%s: %s failed; closing this connection only", address, where, exc_info=error)


_FAILURES = _FailureLog()


def report_failure(address: str, where: str, error: BaseException) -> None:
    """Log an exception one peer's input caused (rate-limited, with its
    traceback), for the servers' last lines of containment."""
    _FAILURES.report(address, where, error)
