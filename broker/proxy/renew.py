# Owns the renewal of receipts a push consumer holds (ReceiveMessage with
# auto_renew, RocketMQ's ReceiptHandleManager): the client does not say how
# long it needs, so the proxy takes the message for autoRenewInvisibleMillis
# and, shortly before that runs out (a third of it, at most 10 s ahead),
# extends it again with CHANGE_MESSAGE_INVISIBLETIME, for as long as the
# client holds it (autoRenewMaxMillis at most, 3 h).  The client acks or
# nacks with the handle it was given; `take` hands back the current receipt
# (waiting for a renewal in flight, so an ack never names a receipt a
# renewal just replaced) and stops renewing it.  A client whose settings
# are forgotten (its Telemetry stream ended, NotifyClientTermination) has
# its receipts dropped: its messages come back after their invisible time.
#
# At most maxRenewedReceipts are held (past it a message is handed out
# without renewal).  The service sleeps until the earliest renewal is due
# or an earlier one is added; a renewal that fails drops the receipt (the
# message comes back by itself).
import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable

import attrs

log = logging.getLogger("ledgermq.proxy")

Change = Callable[[str, str, object, int], Awaitable[object]]  # (topic, group, receipt, invisible ms) -> new receipt


@attrs.define(eq=False, kw_only=True)
class Held:
    group: str
    topic: str
    client_id: str
    receipt: object  # consume.Receipt, the current one
    renew_at: float
    until: float
    renewing: asyncio.Event | None = None
    renewals: int = 0


class Renewals:
    def __init__(self, change: Change, *, invisible_ms: int = 60_000, max_held: int = 100_000,
                 max_ms: int = 3 * 3600 * 1000) -> None:
        self.change = change
        self.invisible_ms = invisible_ms
        self.ahead_s = min(10.0, invisible_ms / 3000)
        self.max_held = max_held
        self.max_s = max_ms / 1000
        self.held: dict[tuple[str, str], Held] = {}
        self._heap: list[tuple[float, int, tuple[str, str]]] = []
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self.renewed = 0
        self.failed = 0

    def add(self, group: str, topic: str, client_id: str, handle: str, receipt) -> bool:
        if len(self.held) >= self.max_held:
            return False
        now = time.monotonic()
        h = Held(group=group, topic=topic, client_id=client_id, receipt=receipt,
                 renew_at=now + self.invisible_ms / 1000 - self.ahead_s, until=now + self.max_s)
        self.held[(group, handle)] = h
        self._push((group, handle), h.renew_at)
        return True

    def _push(self, key, at: float) -> None:
        first = self._heap[0][0] if self._heap else None
        heapq.heappush(self._heap, (at, next(self._seq), key))
        if first is None or at < first:
            self._wake.set()

    async def take(self, group: str, handle: str):
        """The current receipt of `handle` (None if it is not renewed here),
        renewal stopped."""
        h = self.held.pop((group, handle), None)
        if h is None:
            return None
        if h.renewing is not None:
            await h.renewing.wait()
        return h.receipt

    def forget_client(self, client_id: str) -> None:
        for key in [k for k, h in self.held.items() if h.client_id == client_id]:
            del self.held[key]

    async def run(self) -> None:
        while True:
            self._wake.clear()
            now = time.monotonic()
            while self._heap and self._heap[0][0] <= now:
                at, _seq, key = heapq.heappop(self._heap)
                h = self.held.get(key)
                if h is None or h.renew_at != at:
                    continue  # taken, or already rescheduled
                await self._renew(key, h)
            delay = self._heap[0][0] - time.monotonic() if self._heap else None
            try:
                await asyncio.wait_for(self._wake.wait(), delay)  # the next renewal's time, or an earlier one added
            except asyncio.TimeoutError:
                pass

    async def _renew(self, key, h: Held) -> None:
        if time.monotonic() >= h.until:
            self.held.pop(key, None)
            return
        h.renewing = asyncio.Event()
        try:
            h.receipt = await self.change(h.topic, h.group, h.receipt, self.invisible_ms)
            h.renewals += 1
            self.renewed += 1
            h.renew_at = time.monotonic() + self.invisible_ms / 1000 - self.ahead_s
            if self.held.get(key) is h:
                self._push(key, h.renew_at)
        except Exception as e:  # the message comes back after its invisible time
            self.failed += 1
            self.held.pop(key, None)
            log.debug("renewing %s of %s failed: %s", key[1], key[0], e)
        finally:
            h.renewing.set()
            h.renewing = None
