# Owns the one type a burst's answers come in (BurstAnswers): what a burst
# handler returns for the requests of one read it took (server.py's
# register_burst / accept_burst), and what the connection writes.  The
# answers arrive once, in one of two ways:
#
#   give(replies)        synchronously, from whichever task learns them --
#                        the send path answers from the log's driver as the
#                        commit covers the burst (no task of the burst's own
#                        wakes up), a refusal from the read loop itself;
#   give_async(finish)   as an async function that still has to run (a send
#                        handed on to the master, a topic to auto-create):
#                        the connection starts one task for it.
#
# replies: one per item of the burst, in order (None: no answer; for an
# item of many requests, codec.SendRun, its answers as one bytes object or
# a list).  The connection binds its writer with bind(); answers given
# before that are kept until it binds.  then(fn) runs fn once the answers are known, before they are
# written (the admission guard releases its slots there, the metrics time
# the burst), or when the connection abandons an async half it cannot run
# any more (it closed); a failing fn is logged and does not stop the others.
# Calling the object (`await answers()`) waits for the replies: how tests
# and wrappers that want the list read it.
import logging
from collections.abc import Awaitable, Callable

import attrs
import trio

log = logging.getLogger(__name__)

BurstFinish = Callable[[], Awaitable[list]]


@attrs.define(eq=False)
class BurstAnswers:
    """A burst's answers, given once (see the module comment)."""

    _deliver: Callable[["BurstAnswers"], None] | None = None
    _given: tuple | None = None
    _then: list = attrs.Factory(list)
    _waiter: trio.Event | None = None

    @classmethod
    def now(cls, replies: list) -> "BurstAnswers":
        answers = cls()
        answers.give(replies)
        return answers

    @classmethod
    def later(cls, finish: BurstFinish) -> "BurstAnswers":
        answers = cls()
        answers.give_async(finish)
        return answers

    @property
    def given(self) -> bool:
        return self._given is not None

    @property
    def replies(self) -> list | None:
        """The replies when given synchronously (else None)."""
        return None if self._given is None else self._given[0]

    @property
    def finish(self) -> BurstFinish | None:
        """The async half when given that way (else None)."""
        return None if self._given is None else self._given[1]

    def abandon(self) -> None:
        """The async half will not run (the connection is gone): run the
        hooks it would have run."""
        self._ran_then()

    def then(self, fn: Callable[[], None]) -> None:
        """Run fn once the answers are known (at once if they are)."""
        if self._given is not None and self._given[1] is None:
            _run(fn)
        else:
            self._then.append(fn)

    def bind(self, deliver: Callable[["BurstAnswers"], None]) -> None:
        """The connection's writer; called with this object once the
        answers are given, now or later."""
        self._deliver = deliver
        if self._given is not None:
            deliver(self)

    def give(self, replies: list) -> None:
        if self._given is not None:
            raise RuntimeError("a burst's answers were given twice")
        self._given = (replies, None)
        self._ran_then()
        if self._waiter is not None:
            self._waiter.set()
        if self._deliver is not None:
            self._deliver(self)

    def give_async(self, finish: BurstFinish) -> None:
        if self._given is not None:
            raise RuntimeError("a burst's answers were given twice")

        async def finished() -> list:
            try:
                return await finish()
            finally:
                self._ran_then()

        self._given = (None, finished)
        if self._waiter is not None:
            self._waiter.set()
        if self._deliver is not None:
            self._deliver(self)

    def _ran_then(self) -> None:
        hooks, self._then = self._then, []
        for fn in hooks:
            _run(fn)

    async def __call__(self) -> list:
        """The replies, once given (running the async half if that is how
        they came: only for callers that will not bind a connection)."""
        if self._given is None:
            self._waiter = trio.Event()
            await self._waiter.wait()
        replies, finish = self._given
        return replies if finish is None else await finish()


def as_answers(result) -> BurstAnswers:
    """A burst handler's result as BurstAnswers: a plain async function
    (what simple handlers return) becomes one given that way."""
    if isinstance(result, BurstAnswers):
        return result
    return BurstAnswers.later(result)


def _run(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:
        log.exception("a burst's answer hook failed")
