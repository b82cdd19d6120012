# Owns admission in front of dispatch: GuardedDispatcher wraps a
# RequestDispatcher (its one-by-one __call__ path and its split_burst burst
# path) so that every request first passes the admission checks the
# composition root gives it (the ACL, ...) and the in-flight limit, and a
# request refused there is answered at once and never reaches a processor.
#
#   guard = GuardedDispatcher(dispatcher, checks=[acl.check], limiter=InFlightLimiter(10000))
#   await nursery.start(serve_remoting, guard, host, port, bursts=guard)
#
# A check is `check(conn, request) -> RemotingCommand | None`: None lets the
# request through, a command is the answer to send instead.  Checks are
# synchronous (the burst path admits inside the connection's read loop).
#
# Floods: the limiter counts requests admitted and not yet answered across
# every connection; past its limit a request is answered SYSTEM_BUSY
# ("[OVERLOAD]...", as RocketMQ answers when its request queue is full), so
# the work queued in the broker stays bounded and the client backs off.  A
# request counts until its handler returns, so work a processor parks to
# answer later (the broker's held long polls) counts in that processor's
# own budget, not here: a flood of held pulls cannot take the slots that
# sends and heartbeats need.
#
# Each request is admitted exactly once.  A connection with a burst handler
# hands every request of a read to split_burst; the ones it admits and the
# wrapped dispatcher leaves to the one-by-one path come back through
# __call__, which must not admit them again (the limiter would count them
# twice).  They are noted per connection (by object, so the note also keeps
# the object alive and its id cannot be reused) and __call__ takes the note
# off before its first checkpoint.  A request that arrives at __call__
# without a note -- a connection without a burst handler -- is admitted there.
import functools
import logging
from collections.abc import Callable, Sequence

from broker.remoting.answers import BurstAnswers
from broker.remoting.codec import request_count
from broker.remoting.codes import ResponseCode
from broker.remoting.command import RemotingCommand
from commitlog import roundtrace as _rt

log = logging.getLogger(__name__)

Check = Callable[[object, RemotingCommand], RemotingCommand | None]
_ADMITTED = "ledgermq.guard.admitted"  # conn.attributes key: {id(cmd): cmd} admitted in split_burst


class InFlightLimiter:
    """How many admitted requests are unanswered, and the cap on them."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"in-flight limit must be >= 1, got {limit}")
        self.limit = limit
        self.in_flight = 0
        self.peak = 0
        self.rejected = 0

    def try_acquire(self) -> bool:
        if self.in_flight >= self.limit:
            self.rejected += 1
            return False
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        return True

    def try_acquire_many(self, n: int) -> int:
        """Acquire up to n at once; returns how many (the rest count as
        rejected)."""
        k = max(0, min(n, self.limit - self.in_flight))
        self.rejected += n - k
        self.in_flight += k
        self.peak = max(self.peak, self.in_flight)
        return k

    def release(self, n: int = 1) -> None:
        self.in_flight -= n


class GuardedDispatcher:
    """`item_checks`, when given, says of a whole item of a read (one
    request, or a codec.SendRun of many) what `checks` say of each of its
    requests -- [(position in the item, refusal)], asked once per item (the
    ACL's check_item: one array test for the usual run of sends) -- and
    must cover every check."""

    def __init__(self, inner, checks: Sequence[Check] = (), limiter: InFlightLimiter | None = None,
                 item_checks: Callable | None = None) -> None:
        self.inner = inner
        self.checks = tuple(checks)
        self.limiter = limiter
        self.item_checks = item_checks

    def _refusal(self, conn, cmd: RemotingCommand) -> RemotingCommand | None:
        """None when admitted (and counted), else the answer."""
        for check in self.checks:
            refusal = check(conn, cmd)
            if refusal is not None:
                return refusal
        if self.limiter is not None and not self.limiter.try_acquire():
            return self._overload(cmd)
        return None

    def _overload(self, cmd) -> RemotingCommand:
        return cmd.make_response(
            ResponseCode.SYSTEM_BUSY,
            f"[OVERLOAD]system busy, start flow control for a while ({self.limiter.limit} requests "
            f"in flight)")

    def _release(self, n: int) -> None:
        if self.limiter is not None and n:
            self.limiter.release(n)

    async def __call__(self, conn, cmd: RemotingCommand) -> RemotingCommand | None:
        noted = conn.attributes.get(_ADMITTED)
        if noted is None or noted.pop(id(cmd), None) is not cmd:
            refusal = self._refusal(conn, cmd)
            if refusal is not None:
                return refusal
        try:
            return await self.inner(conn, cmd)
        finally:
            self._release(1)

    def split_burst(self, conn, cmds: list) -> tuple[list, list]:
        admitted: list = []
        refused: list = []  # (request, its refusal)
        for item in cmds:
            refusals = self._item_refusals(conn, item) if self.checks else None
            if not refusals:
                self._admit_whole(item, admitted, refused)
                continue
            for piece, refusal in item.cut(refusals):  # (the admitted pieces of a run stay runs)
                if refusal is None:
                    self._admit_whole(piece, admitted, refused)
                else:
                    refused.append((piece, refusal))
        if _rt.TRACER is not None:  # tools/bench/round.py
            _rt.TRACER.mark("admitted")
        split = getattr(self.inner, "split_burst", None)
        try:
            singles, bursts = split(conn, admitted) if split is not None else (admitted, [])
        except BaseException:
            self._release(request_count(admitted))
            raise
        if singles:
            noted = conn.attributes.setdefault(_ADMITTED, {})
            for cmd in singles:
                noted[id(cmd)] = cmd
        for group, answers in bursts:
            answers.then(functools.partial(self._release, request_count(group)))
        out = list(bursts)
        if refused:
            out.append(([cmd for cmd, _ in refused], BurstAnswers.now([refusal for _cmd, refusal in refused])))
        return singles, out

    def _item_refusals(self, conn, item) -> list:
        """[(position, refusal)] of the checks for an item's requests."""
        if self.item_checks is not None:
            return self.item_checks(conn, item)
        out = []
        for pos, one in enumerate(item.one_by_one()):
            for check in self.checks:
                refusal = check(conn, one)
                if refusal is not None:
                    out.append((pos, refusal))
                    break
        return out

    def _admit_whole(self, item, admitted: list, refused: list) -> None:
        """What the limiter admits of an item whose checks passed, kept
        whole; the rest refused one by one."""
        n = item.count
        k = n if self.limiter is None else self.limiter.try_acquire_many(n)
        if k == n:
            admitted.append(item)
            return
        if k:
            head, item = item.split(k)
            admitted.append(head)
        for one in item.one_by_one():
            refused.append((one, self._overload(one)))

    def forget(self, conn) -> None:
        """A closed connection's admitted requests that never reached
        __call__ (their tasks were cancelled first) stop counting (the
        server's on_close calls this)."""
        noted = conn.attributes.pop(_ADMITTED, None)
        if noted:
            self._release(len(noted))

