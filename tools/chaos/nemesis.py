# Owns the nemesis: a seeded schedule of faults against a ChaosCluster, one
# at a time, each held for a few seconds and then healed:
#
#   kill          kill -9 a node (the master half of the time), restart it at heal
#   pause         SIGSTOP a node (the master half of the time) for longer than
#                 the election timeout, SIGCONT at heal
#   halves        the peers split into a random majority and minority
#   isolate       the master cut from every peer (clients still reach it)
#   ring          every node talks only to its two ring neighbours
#   bridge        two halves that only one bridge node connects
#   namesrv       a node (the master half of the time) cut from the name server only
#   slow          delay, jitter and loss on every peer link
#   clock         a node's wall clock jumps by up to +-5 minutes (libfaketime)
#
# Every choice comes from one random.Random(seed); the seed is printed with
# every failure and `python -m tools.chaos.run --seed S` replays the same
# choices (not the same interleaving: processes and the scheduler still race).
import random

import attrs
import trio

from tools.chaos.cluster import ChaosCluster

KINDS = ("kill", "pause", "halves", "isolate", "ring", "bridge", "namesrv", "slow", "clock")
PARTITIONS = ("halves", "isolate", "ring", "bridge")


@attrs.define
class Fault:
    kind: str
    what: str
    start: float
    healed: float | None = None
    nodes: tuple[str, ...] = ()


@attrs.define(eq=False)
class Nemesis:
    cluster: ChaosCluster
    rng: random.Random
    kinds: tuple[str, ...] = KINDS
    hold: tuple[float, float] = (2.0, 4.0)    # seconds a fault lasts
    quiet: tuple[float, float] = (1.0, 3.0)   # seconds between faults
    faults: list[Fault] = attrs.Factory(list)
    _heal: list = attrs.Factory(list)         # undo actions of the current fault

    async def _victim(self) -> str:
        """The master half of the time (when the name server knows one)."""
        nodes = self.cluster.node_ids()
        master = await self.cluster.master()
        if master is not None and self.rng.random() < 0.5:
            return master
        return self.rng.choice(nodes)

    def _cut_pairs(self, allowed: set[frozenset]) -> None:
        """Cut every peer link not in `allowed` (unordered pairs)."""
        mesh = self.cluster.mesh
        nodes = self.cluster.node_ids()
        for i, a in enumerate(nodes):
            for b in nodes[i + 1:]:
                if frozenset((a, b)) not in allowed:
                    for link in mesh.between(a, b):
                        link.set_cut(True)

    @staticmethod
    def _pairs(groups) -> set[frozenset]:
        return {frozenset((a, b)) for g in groups for a in g for b in g if a != b}

    async def inject(self, kind: str) -> Fault:
        c, rng = self.cluster, self.rng
        nodes = c.node_ids()
        now = trio.current_time()
        if kind == "kill":
            v = await self._victim()
            c.kill(v)
            await c.wait_dead(v)
            self._heal.append(lambda: c.start_broker(v))
            return Fault(kind, f"kill -9 {v}", now, nodes=(v,))
        if kind == "pause":
            v = await self._victim()
            c.pause(v)
            self._heal.append(lambda: _async(c.resume, v))
            return Fault(kind, f"SIGSTOP {v}", now, nodes=(v,))
        if kind == "halves":
            shuffled = rng.sample(nodes, len(nodes))
            k = len(nodes) // 2
            minority, majority = shuffled[:k], shuffled[k:]
            self._cut_pairs(self._pairs([minority, majority]))
            return Fault(kind, f"partition {sorted(minority)} | {sorted(majority)}", now, nodes=tuple(minority))
        if kind == "isolate":
            v = await c.master() or rng.choice(nodes)
            self._cut_pairs(self._pairs([[v], [n for n in nodes if n != v]]))
            return Fault(kind, f"isolate {v}", now, nodes=(v,))
        if kind == "ring":
            ring = rng.sample(nodes, len(nodes))
            allowed = {frozenset((ring[i], ring[(i + 1) % len(ring)])) for i in range(len(ring))}
            self._cut_pairs(allowed)
            return Fault(kind, "ring " + "-".join(ring), now, nodes=tuple(ring))
        if kind == "bridge":
            shuffled = rng.sample(nodes, len(nodes))
            bridge, rest = shuffled[0], shuffled[1:]
            left, right = rest[:len(rest) // 2], rest[len(rest) // 2:]
            self._cut_pairs(self._pairs([left + [bridge], right + [bridge]]))
            return Fault(kind, f"bridge {bridge} between {sorted(left)} and {sorted(right)}", now, nodes=(bridge,))
        if kind == "namesrv":
            v = await self._victim()
            for link in c.mesh.links.values():
                if link.name.startswith(f"{v}>ns"):
                    link.set_cut(True)
            return Fault(kind, f"{v} cut from the name server", now, nodes=(v,))
        if kind == "slow":
            delay, loss = rng.uniform(0.005, 0.05), rng.uniform(0.0, 0.1)
            for name, link in c.mesh.links.items():
                if ">ns" not in name:
                    link.set_slow(delay, delay / 2, loss)
            return Fault(kind, f"peer links slowed: {delay * 1000:.0f} ms +-50%, {loss:.0%} loss", now)
        if kind == "clock":
            v = rng.choice(nodes)
            offset = rng.choice((-1, 1)) * rng.randint(5, 300)
            c.set_clock(v, offset)
            self._heal.append(lambda: _async(c.set_clock, v, 0))
            return Fault(kind, f"clock of {v} jumps {offset:+d} s", now, nodes=(v,))
        raise ValueError(f"unknown fault kind {kind!r}")

    async def heal(self) -> None:
        """Undo the current fault: links healed, paused nodes continued,
        dead nodes restarted, clocks put back."""
        self.cluster.mesh.heal()
        actions, self._heal = self._heal, []
        for action in actions:
            await action()
        if self.faults and self.faults[-1].healed is None:
            self.faults[-1].healed = trio.current_time()

    async def run(self, cycles: int | None, deadline: float | None, on_cycle=None) -> None:
        """Fault, hold, heal, quiet; `cycles` times or until `deadline`."""
        n = 0
        try:
            while (cycles is None or n < cycles) and (deadline is None or trio.current_time() < deadline):
                kind = self.rng.choice(self.kinds)
                fault = await self.inject(kind)
                self.faults.append(fault)
                await trio.sleep(self.rng.uniform(*self.hold))
                await self.heal()
                n += 1
                if on_cycle is not None:
                    await on_cycle(n, fault)
                await trio.sleep(self.rng.uniform(*self.quiet))
        finally:
            with trio.CancelScope(shield=True):
                await self.heal()


async def _async(fn, *args) -> None:
    fn(*args)
