# Owns how fast the connections' read loops hand requests over to their
# handlers, at two scales:
#   * per server and scheduler round, the Pacer (serverRequestsPerRound):
#     all the connections of one server decode and hand over at most that
#     many requests in one round, so a flood of pipelined requests is
#     spread over many short rounds and the tasks that keep time (the Raft
#     driver) run between them.  A reader takes credits a chunk at a time
#     (credits) and gives back what it did not use before it reads again
#     (refund); a request costs one credit, an item holding many plain
#     sends (checked in C) one plus one per SENDS_PER_CREDIT of them
#     (run_credits);
#   * per connection, the InFlightWindow: requests handed over and not yet
#     answered, in number (serverMaxInFlightPerConnection) and, on servers,
#     in bytes (serverMaxInFlightBytesPerConnection).  A read is handed over
#     whole when it fits, else in pieces as room comes (an item of many
#     requests is cut where the room ends); while the connection is full its reader waits,
#     and TCP pushes back on the client.  The bytes read are billed to the
#     requests handed over from them and held until the last of those is
#     answered.
# Neither refuses anything: refusing (SYSTEM_BUSY) is guard.py's.
from collections.abc import Callable

import trio


PACER_CHUNK = 32  # credits a reader takes from the Pacer at a time
SENDS_PER_CREDIT = 16  # plain sends in one item (checked in C) cost this little


def run_credits(sends: int) -> int:
    """The credits an item of `sends` plain sends costs."""
    return 1 + sends // SENDS_PER_CREDIT


class Pacer(trio.abc.Instrument):
    """How many requests all the connections of one server may decode and
    hand over in one scheduler round.  Trio runs every task that is
    runnable at the start of a round before it looks at the clock or the
    sockets again, so ten thousand pipelined requests handed over at once
    became one round of ten thousand handler steps -- most of a second in
    which no timer fired and a leader's heartbeats stopped.  Readers take
    credits (take); one out of credits hands over what it has and waits for
    the next round (next_round).  Installed as a trio instrument: its
    after_io_wait hook, called once per round, refills the credits and wakes
    the readers waiting for them."""

    def __init__(self, per_round: int) -> None:
        if per_round < 1:
            raise ValueError(f"requests per round must be >= 1, got {per_round}")
        self.per_round = per_round
        self.left = per_round
        self.deferred = 0  # times a reader waited for the next round
        self._next: trio.Event | None = None

    def after_io_wait(self, timeout: float) -> None:
        self.left = self.per_round
        if self._next is not None:
            event, self._next = self._next, None
            event.set()

    def take(self, want: int) -> int:
        k = want if want <= self.left else max(self.left, 0)
        self.left -= k
        return k

    def credits(self) -> int:
        """A reader's next chunk of credits (PACER_CHUNK, fewer or none once
        this round's are spent)."""
        return self.take(PACER_CHUNK)

    def refund(self, k: int) -> None:
        if k > 0:
            self.left += k

    async def next_round(self) -> None:
        if self._next is None:
            self._next = trio.Event()
        self.deferred += 1
        await self._next.wait()


# What a window hands a part of a read to: (the part, its request count, its bill).
HandOver = Callable[[list, int, list | None], None]


class InFlightWindow:
    """The requests one connection handed over and has not answered yet,
    against max_requests and (when given) max_bytes.  A counter, not a
    Semaphore: a read is admitted with one addition, not one acquire per
    request.  Bytes: a client that sends big requests and never reads the
    answers holds at most about max_bytes (plus one read and one frame),
    not max_requests frames."""

    def __init__(self, max_requests: int, max_bytes: int | None = None) -> None:
        self.max_requests = max_requests
        self.max_bytes = max_bytes
        self.requests = 0  # handed over, not yet answered
        self.held = 0  # bytes billed and not yet answered
        self.unbilled = 0  # bytes read since the last hand-over (the reader adds them)
        self._room: trio.Event | None = None  # set when answers bring the count back under
        self._held_dropped = trio.Event()

    async def hand_over(self, requests: list, count: int, give: HandOver) -> None:
        """Give the requests of one read (`count` requests in the items of
        `requests`) as many at a time as the window admits -- the whole
        read at once when it fits, which keeps a pipelined burst together
        until the log's group commit; in pieces otherwise, so a read of more
        requests than max_requests never waits for answers to requests it
        has not handed over -- waiting for room in between; then wait until
        the bytes held are back within max_bytes (backpressure: the reader
        stops reading while the connection is full)."""
        start = 0
        while start < len(requests):
            room = self.max_requests - self.requests
            if room <= 0:
                self._room = trio.Event()
                await self._room.wait()
                continue
            if start == 0 and room >= count:
                part, n, start = requests, count, len(requests)
            else:
                part, n, start = _admit(requests, start, room)
            count -= n
            self.requests += n
            give(part, n, self._bill(n))
        while self.max_bytes is not None and self.held > self.max_bytes:
            self._held_dropped = trio.Event()
            await self._held_dropped.wait()

    def _bill(self, n: int) -> list | None:
        """The bytes read since the last hand-over, billed to its `n`
        requests: [requests not yet answered, bytes]."""
        if self.max_bytes is None:
            return None
        bill = [n, self.unbilled]
        self.held += self.unbilled
        self.unbilled = 0
        return bill

    def answered(self, n: int, bill: list | None) -> None:
        """`n` requests of `bill` are answered (or dropped)."""
        self.requests -= n
        if self._room is not None and self.requests < self.max_requests:
            self._room.set()
            self._room = None
        if bill is not None:
            bill[0] -= n
            if bill[0] == 0:
                self.held -= bill[1]
                self._held_dropped.set()


def _admit(requests: list, start: int, room: int) -> tuple[list, int, int]:
    """Up to `room` requests from requests[start:] (an item of many is cut
    where the room ends, its rest left at requests[start]): (the part, its
    request count, where the next part starts)."""
    part, n, i = [], 0, start
    while i < len(requests) and n < room:
        item = requests[i]
        size = item.count
        if n + size > room:
            item, requests[i] = item.split(room - n)
            part.append(item)
            n += item.count
            break
        part.append(item)
        n += size
        i += 1
    return part, n, i
