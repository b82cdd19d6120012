# Owns the fault-injecting TCP relay that the nemesis puts in front of every
# link it may break: one listener per directed link ("n0>n1" is the address
# n0 dials to reach n1's DLedger peer port, "n0>ns0" the one n0 registers
# with name server 0 through).  Each link forwards bytes both ways, and can
# be
#   cut        existing connections are reset (SO_LINGER 0) and new ones are
#              accepted but black-holed (held open, nothing forwarded) until
#              the link heals, like a partition in which SYNs still complete
#              but nothing else gets through;
#   slowed     every chunk waits `delay` +- `jitter` seconds, and with
#              probability `loss` another 0.2-0.6 s (what a lost segment
#              costs TCP: one retransmission timeout).
#
# Why a relay and not network namespaces with veth pairs and tc netem: the
# relay needs no privileges or kernel modules (CI runs it in any container),
# keeps every byte on 127.0.0.1, and gives per directed link control, which
# the non-transitive partitions (bridge, ring) need without per-pair iptables
# rules.  What it cannot do: reorder or drop bytes inside a TCP stream (TCP
# would not either: netem loss becomes retransmission delay, which is what
# `loss` models), and it does not sit between clients and brokers.
import logging
import random
import socket
import struct

import attrs
import trio

log = logging.getLogger("ledgermq.chaos.relay")

CHUNK = 64 * 1024
CONNECT_TIMEOUT = 2.0
_LINGER0 = struct.pack("ii", 1, 0)  # close() sends RST


def _reset(stream: trio.SocketStream) -> None:
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER0)
    except OSError:
        pass


@attrs.define(eq=False)
class Link:
    """One directed link: connections to `port` on 127.0.0.1 are forwarded
    to `target`."""

    name: str
    target: tuple[str, int]
    rng: random.Random
    port: int = 0
    cut: bool = False
    delay: float = 0.0
    jitter: float = 0.0
    loss: float = 0.0
    connections: int = 0   # accepted so far
    resets: int = 0        # connections reset by a cut
    sock: socket.socket | None = None  # pre-bound listening socket (bound before the config is written)
    _scopes: set = attrs.Factory(set)
    _healed: trio.Event = attrs.Factory(trio.Event)

    # --- the nemesis' controls -----------------------------------------------------

    def set_cut(self, cut: bool) -> None:
        if cut and not self.cut:
            self.cut = True
            self._healed = trio.Event()
            for scope in list(self._scopes):
                scope.cancel()
        elif not cut and self.cut:
            self.cut = False
            self._healed.set()

    def set_slow(self, delay: float = 0.0, jitter: float = 0.0, loss: float = 0.0) -> None:
        self.delay, self.jitter, self.loss = delay, jitter, loss

    # --- serving ------------------------------------------------------------------------

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        if self.sock is not None:
            listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(self.sock))]
        else:
            listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, downstream: trio.SocketStream) -> None:
        self.connections += 1
        with trio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                if self.cut:
                    await self._blackhole(downstream)
                    return
                try:
                    with trio.fail_after(CONNECT_TIMEOUT):
                        upstream = await trio.open_tcp_stream(*self.target)
                except (OSError, trio.TooSlowError):
                    _reset(downstream)
                    return
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._pump, downstream, upstream, nursery.cancel_scope)
                        nursery.start_soon(self._pump, upstream, downstream, nursery.cancel_scope)
                finally:
                    if scope.cancel_called:  # cut: both ends see a reset, not a clean close
                        self.resets += 1
                        _reset(upstream)
                        _reset(downstream)
                    with trio.CancelScope(shield=True):
                        await upstream.aclose()
            finally:
                self._scopes.discard(scope)
                if scope.cancel_called:
                    _reset(downstream)
                with trio.CancelScope(shield=True):
                    await downstream.aclose()

    async def _blackhole(self, stream: trio.SocketStream) -> None:
        """Hold the connection, discarding what arrives, until the link heals;
        then reset it (the other side must reconnect, as after a real
        partition that outlived its TCP timeouts)."""
        async with trio.open_nursery() as nursery:
            async def drain():
                try:
                    while await stream.receive_some(CHUNK):
                        pass
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass
                nursery.cancel_scope.cancel()
            nursery.start_soon(drain)
            await self._healed.wait()
            nursery.cancel_scope.cancel()
        _reset(stream)

    async def _pump(self, src: trio.SocketStream, dst: trio.SocketStream, done: trio.CancelScope) -> None:
        try:
            while True:
                data = await src.receive_some(CHUNK)
                if not data:
                    break
                wait = self.delay
                if self.jitter:
                    wait = max(0.0, wait + self.rng.uniform(-self.jitter, self.jitter))
                if self.loss and self.rng.random() < self.loss:
                    wait += self.rng.uniform(0.2, 0.6)
                if wait:
                    await trio.sleep(wait)
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        done.cancel()


@attrs.define(eq=False)
class RelayMesh:
    """Every link of one cluster, by name."""

    rng: random.Random
    links: dict[str, Link] = attrs.Factory(dict)
    _nursery: trio.Nursery | None = None

    async def add(self, name: str, target: tuple[str, int]) -> Link:
        if self._nursery is None:
            raise RuntimeError("RelayMesh.run() is not running")
        link = Link(name, target, random.Random(self.rng.random()))
        await self._nursery.start(link.serve)
        self.links[name] = link
        return link

    def add_bound(self, name: str, target: tuple[str, int], sock: socket.socket) -> Link:
        """A link on an already listening socket (its port is known at once;
        connections wait in the backlog until the relay task runs)."""
        if self._nursery is None:
            raise RuntimeError("RelayMesh.run() is not running")
        link = Link(name, target, random.Random(self.rng.random()), port=sock.getsockname()[1], sock=sock)
        self._nursery.start_soon(link.serve)
        self.links[name] = link
        return link

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started(self)
            await trio.sleep_forever()

    def between(self, a: str, b: str) -> list[Link]:
        """Both directed links of a pair (those that exist)."""
        return [link for name in (f"{a}>{b}", f"{b}>{a}") if (link := self.links.get(name)) is not None]

    def heal(self) -> None:
        for link in self.links.values():
            link.set_cut(False)
            link.set_slow()
