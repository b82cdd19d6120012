# Owns the in-memory transport for simulation tests: a MemoryNetwork that
# hands out MemoryTransports (same API as the TCP PeerTransport) and injects
# faults -- drop, delay, duplicate, reorder, partition, isolate -- from seeded
# randomness.  Delays are trio sleeps, so under trio.testing.MockClock a whole
# cluster simulation runs in virtual time.
#
# Model: each directed link (src -> dst) is FIFO like a TCP connection, so
# random delays alone never reorder; only the `reorder` fault does (the
# message bypasses the FIFO with an extra delay and later ones overtake it).
# Connectivity (partition/isolate, peer running, same group) is checked both
# when a message is sent and when it is delivered, so a partition also eats
# messages already in flight.
#
# Backpressure mirrors TCP: a link holds at most send_queue_messages messages
# that the receiver has not consumed yet (in flight or in its inbox); beyond
# that send() returns False and counts dropped_full.
#
# Determinism: every link draws from its own random.Random seeded from
# (network seed, src, dst, src incarnation), so the faults a link sees depend
# only on the messages sent over it, not on how trio interleaves tasks.
import collections
import math
import random
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager

import attrs
import trio

from commitlog.transport.base import Counters, TransportStats
from commitlog.transport.errors import FrameError, TransportError, UnknownPeerError
from commitlog.transport.framing import DEFAULT_MAX_FRAME_SIZE


def _probability(inst, attribute, value) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{attribute.name} must be a probability in [0, 1], got {value!r}")


def _delay_range(inst, attribute, value) -> None:
    lo, hi = value
    if not 0.0 <= lo <= hi:
        raise ValueError(f"delay must be (min, max) with 0 <= min <= max, got {value!r}")


@attrs.frozen
class LinkFaults:
    """Faults applied to each message on a link (all off by default).
    delay is a uniform (min, max) range in seconds; a reordered message is
    held back reorder_delay seconds on top of its delay."""

    drop: float = attrs.field(default=0.0, validator=_probability)
    duplicate: float = attrs.field(default=0.0, validator=_probability)
    delay: tuple[float, float] = attrs.field(default=(0.0, 0.0), converter=tuple,
                                             validator=_delay_range)
    reorder: float = attrs.field(default=0.0, validator=_probability)
    reorder_delay: float = 0.05


@attrs.define(eq=False)
class _Link:
    src: str
    dst: str
    rng: random.Random
    fifo: collections.deque = attrs.field(factory=collections.deque)  # (deliver_at, payload)
    last_at: float = -math.inf
    wakeup: trio.Event = attrs.field(factory=trio.Event)
    in_flight: int = 0


class MemoryNetwork:
    """A simulated network.  Faults can be changed at any time; set_faults()
    without src/dst changes the default for every link, with them it
    overrides one direction of one link."""

    def __init__(self, *, seed: int | str = 0, faults: LinkFaults = LinkFaults(),
                 send_queue_messages: int = 1024,
                 max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.seed = seed
        self.send_queue_messages = send_queue_messages
        self.max_frame_size = max_frame_size
        self._default_faults = faults
        self._link_faults: dict[tuple[str, str], LinkFaults] = {}
        self._nodes: dict[str, MemoryTransport] = {}
        self._incarnations: collections.Counter = collections.Counter()
        self._side: dict[str, int] | None = None
        self._isolated: set[str] = set()
        self._changed = trio.Event()

    # --- fault controls ----------------------------------------------------

    def set_faults(self, faults: LinkFaults, *, src: str | None = None,
                   dst: str | None = None) -> None:
        if src is None and dst is None:
            self._default_faults = faults
        elif src is None or dst is None:
            raise ValueError("give both src and dst for a per-link fault, or neither")
        else:
            self._link_faults[(src, dst)] = faults

    def faults_for(self, src: str, dst: str) -> LinkFaults:
        return self._link_faults.get((src, dst), self._default_faults)

    def partition(self, *groups: Iterable[str]) -> None:
        """Split the network: nodes talk only within their group.  A node
        named in no group is cut off from everyone.  Replaces any earlier
        partition; isolate() still applies on top."""
        side: dict[str, int] = {}
        for i, group in enumerate(groups):
            for node in group:
                if node in side:
                    raise ValueError(f"node {node!r} is in more than one partition group")
                side[node] = i
        self._side = side
        self._notify()

    def isolate(self, node: str) -> None:
        """Cut `node` off from every other node (both directions)."""
        self._isolated.add(node)
        self._notify()

    def heal(self) -> None:
        """Undo partition() and isolate() (link faults stay as set)."""
        self._side = None
        self._isolated.clear()
        self._notify()

    def can_reach(self, src: str, dst: str) -> bool:
        if src in self._isolated or dst in self._isolated:
            return False
        if self._side is not None:
            s = self._side.get(src)
            if s is None or s != self._side.get(dst):
                return False
        a, b = self._nodes.get(src), self._nodes.get(dst)
        return a is not None and b is not None and a.group == b.group

    def _notify(self) -> None:
        event, self._changed = self._changed, trio.Event()
        event.set()

    # --- nodes -------------------------------------------------------------

    @asynccontextmanager
    async def open_transport(self, self_id: str, peer_ids: Iterable[str], *,
                             group: str = "default"):
        """Run node `self_id` on this network for the duration of the block.
        Leaving the block is a crash as far as the others can tell: its
        undelivered outbound messages and its unread inbox are lost."""
        if self_id in self._nodes:
            raise TransportError(f"node {self_id!r} is already running on this network")
        self._incarnations[self_id] += 1
        async with trio.open_nursery() as nursery:
            transport = MemoryTransport(network=self, self_id=self_id, group=group, peer_ids=peer_ids,
                                        nursery=nursery, incarnation=self._incarnations[self_id])
            self._nodes[self_id] = transport
            self._notify()
            for link in transport._links.values():
                nursery.start_soon(transport._pump, link)
            try:
                yield transport
            finally:
                nursery.cancel_scope.cancel()
                transport._shutdown()
                del self._nodes[self_id]
                self._notify()


class MemoryTransport:
    """One node's endpoint on a MemoryNetwork; see base.Transport."""

    def __init__(self, *, network: MemoryNetwork, self_id: str, group: str,
                 peer_ids: Iterable[str], nursery: trio.Nursery, incarnation: int) -> None:
        self.network = network
        self.self_id = self_id
        self.group = group
        self.identity: dict[str, str] = {}  # no handshake in memory: nothing is compared
        self._nursery = nursery
        self._closed = False
        self._incarnation = incarnation
        self._removed: set[str] = set()
        peers = [p for p in peer_ids if p != self_id]
        self._links = {p: _Link(self_id, p, random.Random(
            f"{network.seed}/{self_id}->{p}/{incarnation}")) for p in peers}
        self._counters = {p: Counters() for p in peers}
        # Unbounded: the per-link in_flight cap is the bound.
        self._inbox_send, self._inbox_recv = trio.open_memory_channel(math.inf)
        self._sink = None  # set_sink(): delivered messages are handed over directly

    @property
    def peer_ids(self) -> tuple[str, ...]:
        return tuple(self._links)

    def set_peers(self, peer_ids) -> None:
        """Replace the peer set (a mapping's keys, or ids), as the TCP
        transport's set_peers: messages from a peer that is not (or no
        longer) known are dropped on delivery, like a refused handshake."""
        wanted = [p for p in peer_ids if p != self.self_id]
        for gone in [p for p in self._links if p not in wanted]:
            link = self._links.pop(gone)
            link.fifo.clear()
            self._removed.add(gone)
        for new in wanted:
            if new not in self._links:
                self._removed.discard(new)
                link = self._links[new] = _Link(self.self_id, new, random.Random(
                    f"{self.network.seed}/{self.self_id}->{new}/{self._incarnation}/+"))
                self._counters.setdefault(new, Counters())
                self._nursery.start_soon(self._pump, link)
        self.network._notify()

    # --- sending -------------------------------------------------------------

    def send(self, peer_id: str, payload: bytes) -> bool:
        link = self._links.get(peer_id)
        if link is None:
            if peer_id in self._removed:
                return False
            raise UnknownPeerError(peer_id, tuple(self._links))
        payload = b"".join(payload) if type(payload) is tuple else bytes(payload)
        if len(payload) > self.network.max_frame_size:
            raise FrameError(f"payload of {len(payload)} bytes exceeds max_frame_size "
                             f"{self.network.max_frame_size}")
        c = self._counters[peer_id]
        if self._closed:
            return False
        if link.in_flight >= self.network.send_queue_messages:
            c.dropped_full += 1
            return False
        c.sent_frames += 1
        c.sent_bytes += len(payload)
        net = self.network
        faults = net.faults_for(self.self_id, peer_id)
        rng = link.rng
        if not net.can_reach(self.self_id, peer_id) or (faults.drop and rng.random() < faults.drop):
            c.dropped_fault += 1
            return True  # lost in the network; the sender cannot tell
        copies = 1
        if faults.duplicate and rng.random() < faults.duplicate:
            copies = 2
            c.duplicated += 1
        now = trio.current_time()
        for _ in range(copies):
            delay = rng.uniform(*faults.delay) if faults.delay[1] > 0 else 0.0
            link.in_flight += 1
            if faults.reorder and rng.random() < faults.reorder:
                c.reordered += 1
                self._nursery.start_soon(self._deliver_later, link,
                                         now + delay + faults.reorder_delay, payload)
                continue
            at = max(now + delay, link.last_at)
            link.last_at = at
            if at <= now and not link.fifo:
                self._deliver(link, payload)
            else:
                link.fifo.append((at, payload))
                link.wakeup.set()
        return True

    async def _pump(self, link: _Link) -> None:
        while True:
            if not link.fifo:
                link.wakeup = trio.Event()
                await link.wakeup.wait()
                continue
            # Later messages never have an earlier time, so the head stays
            # the head while we sleep.
            await trio.sleep_until(link.fifo[0][0])
            _, payload = link.fifo.popleft()
            self._deliver(link, payload)

    async def _deliver_later(self, link: _Link, at: float, payload: bytes) -> None:
        await trio.sleep_until(at)
        self._deliver(link, payload)

    def _deliver(self, link: _Link, payload: bytes) -> None:
        dst = self.network._nodes.get(link.dst)
        if (dst is None or dst._closed or self.self_id not in dst._links
                or not self.network.can_reach(self.self_id, link.dst)):
            link.in_flight -= 1
            self._counters[link.dst].dropped_fault += 1
            return
        if dst._sink is not None:
            dst._received(self.self_id, link, payload)
            dst._sink(self.self_id, payload)  # (no flow control to push back with here)
            return
        dst._inbox_send.send_nowait((self.self_id, payload, link))

    # --- receiving -------------------------------------------------------------

    async def receive(self) -> tuple[str, bytes]:
        src, payload, link = await self._inbox_recv.receive()
        self._received(src, link, payload)
        return src, payload

    def _received(self, src: str, link, payload: bytes) -> None:
        link.in_flight -= 1
        c = self._counters[src]
        c.received_frames += 1
        c.received_bytes += len(payload)

    def set_sink(self, sink) -> None:
        self._sink = sink
        while True:
            try:
                src, payload, link = self._inbox_recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                return
            self._received(src, link, payload)
            sink(src, payload)

    async def incoming(self) -> AsyncIterator[tuple[str, bytes]]:
        while True:
            try:
                item = await self.receive()
            except trio.EndOfChannel:
                return
            yield item

    def _shutdown(self) -> None:
        self._closed = True
        self._inbox_send.close()
        while True:  # unread messages die with the node; free their links' slots
            try:
                _, _, link = self._inbox_recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            link.in_flight -= 1

    # --- status ----------------------------------------------------------------

    def connected_peers(self) -> frozenset[str]:
        net = self.network
        if self._closed:
            return frozenset()
        return frozenset(p for p in self._links
                         if net.can_reach(self.self_id, p) and net.can_reach(p, self.self_id))

    async def wait_connected(self, peers: Iterable[str] | None = None) -> None:
        wanted = set(self._links) if peers is None else set(peers)
        for pid in wanted:
            if pid not in self._links:
                raise UnknownPeerError(pid, tuple(self._links))
        while not wanted <= self.connected_peers():
            await self.network._changed.wait()

    async def wait_state(self, predicate: Callable[[TransportStats], bool]) -> TransportStats:
        """Wait until predicate(stats()) holds; re-checked whenever the
        network's connectivity changes (nodes, partitions, isolation)."""
        while not predicate(stats := self.stats()):
            await self.network._changed.wait()
        return stats

    def stats(self) -> TransportStats:
        return TransportStats(self_id=self.self_id, peers={
            p: c.snapshot(p, connected=p in self.connected_peers(),
                          queued_messages=self._links[p].in_flight)
            for p, c in self._counters.items() if p in self._links})
