# Owns the moving parts of the process chaos test (tests/commitlog/test_cluster_chaos.py):
# the appending clients, the per-node status samplers, the seeded nemesis
# (kill -9 / SIGSTOP leaders and followers, restart the dead), healing, and
# the history checks run afterwards.  Everything the test later asserts on is
# recorded in one ChaosRun; the checks return readable problem strings rather
# than raising, so one failure message can list every broken invariant
# together with the seed and the nemesis timeline needed to replay it.
#
# Replaying a seed (LEDGERMQ_CHAOS_SEED) repeats the nemesis' choices and
# delays, not the exact interleaving: processes and the scheduler still race.
import base64
import collections
import random

import attrs
import trio

from tools.localcluster import LocalCluster

# What a client or sampler may see from a node that is dead, paused, just
# restarted or closing the connection; all of them mean "try again".
CONN_ERRORS = (OSError, trio.TooSlowError, trio.BrokenResourceError, ValueError)

# A client gives up on one admin call after this long and tries the next
# node.  Shorter than the node's own maxWaitAckTimeMs (2.5 s): with a longer
# one every client sits on a SIGSTOPped leader for the whole pause and the
# failover figures measure the pause, not the election.  An append cut off
# this way may still commit; it is simply not counted as acknowledged.
CLIENT_CALL_TIMEOUT = 1.5
STATUS_TIMEOUT = 1.0
SAMPLE_INTERVAL = 0.1


@attrs.frozen
class Ack:
    index: int
    body: bytes
    at: float       # trio time the client received the acknowledgement
    node: str       # who acknowledged it
    client: str


@attrs.frozen
class Sample:
    at: float
    pid: int        # the process incarnation that answered
    term: int
    role: str
    leader: str | None
    committed: int


@attrs.define
class Disruption:
    """One nemesis action and, once healed, when the cluster served again."""

    kind: str                   # kill_leader, kill_follower, pause_leader, pause_follower, restart
    node: str
    at: float
    term: int | None = None     # the victim's term when it was hit (leaders)
    ended: float | None = None  # SIGCONT / restart done
    stepped_down_after: float | None = None  # paused leader: seconds from SIGCONT to giving up its term


@attrs.define
class ChaosRun:
    seed: int
    t0: float
    acks: list[Ack] = attrs.Factory(list)
    samples: dict[str, list[Sample]] = attrs.Factory(lambda: collections.defaultdict(list))
    disruptions: list[Disruption] = attrs.Factory(list)
    # node -> "dead" | "paused" while the nemesis holds it down
    down: dict[str, str] = attrs.Factory(dict)
    client_errors: collections.Counter = attrs.Factory(collections.Counter)
    problems: list[str] = attrs.Factory(list)
    skipped_actions: int = 0

    def rel(self, t: float) -> float:
        return round(t - self.t0, 2)

    def timeline(self) -> str:
        lines = []
        for d in self.disruptions:
            extra = f" until {self.rel(d.ended)}" if d.ended is not None else ""
            term = f" term={d.term}" if d.term is not None else ""
            lines.append(f"  {self.rel(d.at):7.2f}s {d.kind:<15} {d.node}{term}{extra}")
        return "\n".join(lines)


def body_b64(body: bytes) -> str:
    return base64.b64encode(body).decode()


# ---------------------------------------------------------------------------
# load and observation
# ---------------------------------------------------------------------------

async def client(cluster: LocalCluster, run: ChaosRun, name: str, rng: random.Random, stop: trio.Event) -> None:
    """Append numbered bodies to whoever leads.  Every attempt uses fresh
    bodies, so a body that committed without being acknowledged (timeout,
    term change) can never be mistaken for a later acknowledged one."""
    ids = sorted(cluster.nodes)
    target = rng.choice(ids)
    seq = 0

    def other(node):
        return ids[(ids.index(node) + 1) % len(ids)]

    while not stop.is_set():
        bodies = [f"{name}-{seq}-{k}".encode() for k in range(rng.randint(1, 4))]
        seq += 1
        try:
            reply = await cluster.call(target, {"op": "append", "bodies": [body_b64(b) for b in bodies]},
                                       timeout=CLIENT_CALL_TIMEOUT)
        except CONN_ERRORS as exc:
            run.client_errors[type(exc).__name__] += 1
            target = other(target)
            await trio.sleep(0.02)
            continue
        if reply.get("ok"):
            now = trio.current_time()
            for (index, _pos), body in zip(reply["entries"], bodies, strict=True):
                run.acks.append(Ack(index, body, now, target, name))
            continue
        run.client_errors[reply.get("type") or "error"] += 1
        if reply.get("type") == "NotLeaderError":
            hint = reply.get("leader")
            if hint in cluster.nodes and hint != target:
                target = hint
                continue
            target = other(target)  # no leader known here yet
        await trio.sleep(0.05)      # timeouts, term changes, backpressure: back off a little


async def sampler(cluster: LocalCluster, run: ChaosRun, node_id: str, stop: trio.Event) -> None:
    """Poll one node's status while it is up (one request at a time, so the
    samples of a node are in the order it answered them)."""
    while not stop.is_set():
        node = cluster.nodes[node_id]
        if node_id not in run.down and node.alive:
            pid = node.process.pid
            try:
                st = await cluster.call(node_id, {"op": "status"}, timeout=STATUS_TIMEOUT)
            except CONN_ERRORS:
                st = None
            if st and st.get("ok"):
                run.samples[node_id].append(Sample(trio.current_time(), pid, st["term"], st["role"],
                                                   st.get("leader"), st["committedIndex"]))
        await trio.sleep(SAMPLE_INTERVAL)


async def status_of(cluster: LocalCluster, node_id: str, timeout: float = STATUS_TIMEOUT) -> dict | None:
    try:
        st = await cluster.call(node_id, {"op": "status"}, timeout=timeout)
    except CONN_ERRORS:
        return None
    return st if st.get("ok") else None


async def statuses_of(cluster: LocalCluster, node_ids) -> dict[str, dict]:
    """Status of several nodes concurrently (a SIGSTOPped one costs one
    timeout, not one per node)."""
    out: dict[str, dict] = {}

    async def one(nid):
        st = await status_of(cluster, nid)
        if st is not None:
            out[nid] = st

    async with trio.open_nursery() as nursery:
        for nid in node_ids:
            nursery.start_soon(one, nid)
    return out


async def current_leader(cluster: LocalCluster, run: ChaosRun, timeout: float) -> tuple[str, int] | None:
    """(leader, term) as the up nodes see it: the self-declared leader of the
    highest term, once a majority of the group reports that leader."""
    with trio.move_on_after(timeout):
        while True:
            up = [n for n in cluster.nodes if n not in run.down]
            sts = await statuses_of(cluster, up)
            leaders = [(st["term"], nid) for nid, st in sts.items() if st["role"] == "leader"]
            if leaders:
                term, nid = max(leaders)
                agree = sum(1 for st in sts.values() if st["term"] == term and st.get("leader") == nid)
                if agree * 2 > len(cluster.nodes):
                    return nid, term
            await trio.sleep(0.05)
    return None


# ---------------------------------------------------------------------------
# the nemesis
# ---------------------------------------------------------------------------

FAULTS = ("kill_leader", "kill_follower", "pause_leader", "pause_follower")


def check_unexpected_exits(cluster: LocalCluster, run: ChaosRun) -> None:
    """A node we did not kill must not have exited (RaftSafetyError, a
    crash in recovery, ...)."""
    for nid, node in cluster.nodes.items():
        if run.down.get(nid) != "dead" and not node.alive:
            run.problems.append(f"{nid} exited on its own (returncode {node.process.returncode}) "
                                f"at {run.rel(trio.current_time())}s; see {cluster.root}/{nid}.log")
            run.down[nid] = "dead"  # restart it so the run can finish and report


async def nemesis(cluster: LocalCluster, run: ChaosRun, rng: random.Random, until: float,
                  min_faults: int = 0) -> None:
    """Hit the group until `until`, never holding down more than one node:
    a dead node is always the next thing restarted, and a pause ends inside
    its own action.  The first two faults are a leader kill and a leader
    pause (in seeded order), so every run exercises failover both ways.  On
    a slow machine it runs past `until` until `min_faults` were injected
    (the caller bounds the whole run)."""
    must = ["kill_leader", "pause_leader"]
    rng.shuffle(must)
    while True:
        await trio.sleep(rng.uniform(0.4, 1.2))
        check_unexpected_exits(cluster, run)
        dead = sorted(n for n, s in run.down.items() if s == "dead")
        now = trio.current_time()
        if dead:
            await restart(cluster, run, dead[0])
            continue
        injected = sum(1 for d in run.disruptions if d.kind != "restart")
        # Stop when the longest fault (a 3 s pause) would overrun the budget.
        if now + 3.5 > until and injected >= min_faults and not must:
            return
        if now > until + 30:
            return  # faults keep failing to find a target: let the caller's floors report it
        kind = must.pop(0) if must else rng.choice(FAULTS)
        await FAULT_ACTIONS[kind](cluster, run, rng)


async def restart(cluster: LocalCluster, run: ChaosRun, node_id: str) -> None:
    d = Disruption("restart", node_id, trio.current_time())
    run.disruptions.append(d)
    await cluster.start(node_id)
    d.ended = trio.current_time()
    del run.down[node_id]


async def _pick(cluster: LocalCluster, run: ChaosRun, rng: random.Random, leader: bool):
    found = await current_leader(cluster, run, timeout=5)
    if found is None:
        run.skipped_actions += 1  # no settled leader to aim at (rare: an election that keeps failing)
        return None
    lead, term = found
    if leader:
        return lead, term
    return rng.choice(sorted(n for n in cluster.nodes if n != lead)), None


async def kill_leader(cluster, run, rng):
    await _kill(cluster, run, rng, leader=True)


async def kill_follower(cluster, run, rng):
    await _kill(cluster, run, rng, leader=False)


async def _kill(cluster, run, rng, *, leader: bool):
    picked = await _pick(cluster, run, rng, leader)
    if picked is None:
        return
    victim, term = picked
    run.down[victim] = "dead"
    run.disruptions.append(Disruption("kill_leader" if leader else "kill_follower", victim,
                                      trio.current_time(), term))
    cluster.kill(victim)
    await cluster.wait_dead(victim)


async def pause_leader(cluster, run, rng):
    await _pause(cluster, run, rng, leader=True)


async def pause_follower(cluster, run, rng):
    await _pause(cluster, run, rng, leader=False)


async def _pause(cluster, run, rng, *, leader: bool):
    picked = await _pick(cluster, run, rng, leader)
    if picked is None:
        return
    victim, term = picked
    d = Disruption("pause_leader" if leader else "pause_follower", victim, trio.current_time(), term)
    run.down[victim] = "paused"
    run.disruptions.append(d)
    cluster.pause(victim)
    try:
        await trio.sleep(rng.uniform(1.0, 3.0))
    finally:
        cluster.resume(victim)
        d.ended = trio.current_time()
        del run.down[victim]
    if leader:
        await _watch_stale_leader(cluster, run, d)


async def _watch_stale_leader(cluster: LocalCluster, run: ChaosRun, d: Disruption) -> None:
    """A leader that wakes from SIGSTOP into a group that elected someone
    else in a newer term must give up its old term promptly.  (If nobody
    was elected while it slept, staying leader is correct.)"""
    deadline = d.ended + 5.0
    while trio.current_time() < deadline:
        st = await status_of(cluster, d.node)
        if st is not None and (st["role"] != "leader" or st["term"] > d.term):
            d.stepped_down_after = trio.current_time() - d.ended
            return
        newer = [s for nid, ss in run.samples.items() if nid != d.node
                 for s in ss if s.at >= d.at and s.role == "leader" and s.term > d.term]
        if st is not None and not newer and trio.current_time() > d.ended + 1.0:
            return  # still leader of its term and nobody replaced it: nothing to step down from
        await trio.sleep(0.05)
    run.problems.append(f"{d.node} woke from SIGSTOP at {run.rel(d.ended)}s still leader of term {d.term} "
                        f"5 s later although a newer leader had been elected")


FAULT_ACTIONS = {"kill_leader": kill_leader, "kill_follower": kill_follower,
                 "pause_leader": pause_leader, "pause_follower": pause_follower}


# ---------------------------------------------------------------------------
# healing and reading back
# ---------------------------------------------------------------------------

async def heal(cluster: LocalCluster, run: ChaosRun) -> None:
    check_unexpected_exits(cluster, run)
    for nid, state in sorted(run.down.items()):
        if state == "paused":
            cluster.resume(nid)
            del run.down[nid]
    for nid in sorted(n for n, s in run.down.items() if s == "dead"):
        await restart(cluster, run, nid)


async def wait_converged(cluster: LocalCluster, upto: int, timeout: float) -> dict[str, dict]:
    """Every node answers, all name the same leader in the same term, that
    node says it leads, and everybody's committed index reached `upto`.
    Returns the statuses; raises trio.TooSlowError with the last ones."""
    last: dict[str, dict] = {}
    try:
        with trio.fail_after(timeout):
            while True:
                last = await statuses_of(cluster, cluster.nodes)
                if len(last) == len(cluster.nodes):
                    views = {(st["term"], st.get("leader")) for st in last.values()}
                    if len(views) == 1:
                        term, leader = views.pop()
                        if (leader in last and last[leader]["role"] == "leader"
                                and all(st["committedIndex"] >= upto for st in last.values())):
                            return last
                await trio.sleep(0.05)
    except trio.TooSlowError:
        brief = {nid: {k: st.get(k) for k in ("role", "term", "leader", "committedIndex", "ledgerEndIndex")}
                 for nid, st in last.items()}
        raise AssertionError(f"cluster did not converge within {timeout}s to committedIndex >= {upto}: "
                             f"{brief}") from None


async def read_committed_log(cluster: LocalCluster, node_id: str, upto: int) -> dict[int, tuple[int, bytes]]:
    """index -> (term, body) for every committed entry up to `upto`."""
    out, nxt = {}, 0
    while nxt <= upto:
        reply = await cluster.call(node_id, {"op": "read", "from": nxt, "count": 2000})
        assert reply["ok"], reply
        if not reply["entries"]:
            break
        for index, term, body in reply["entries"]:
            if index <= upto:
                out[index] = (term, base64.b64decode(body))
        nxt = reply["entries"][-1][0] + 1
    return out


# ---------------------------------------------------------------------------
# history checks (each returns problem strings)
# ---------------------------------------------------------------------------

def check_acks_unique(acks: list[Ack]) -> list[str]:
    """No index acknowledged with two different bodies, and no body
    acknowledged twice (each attempt's bodies are fresh)."""
    problems = []
    by_index: dict[int, Ack] = {}
    by_body: dict[bytes, Ack] = {}
    for a in acks:
        prev = by_index.setdefault(a.index, a)
        if prev.body != a.body:
            problems.append(f"index {a.index} acknowledged twice: {prev.body!r} by {prev.node} and "
                            f"{a.body!r} by {a.node}")
        prev = by_body.setdefault(a.body, a)
        if prev.index != a.index:
            problems.append(f"body {a.body!r} acknowledged at {prev.index} and {a.index}")
    return problems


def check_logs(acks: list[Ack], logs: dict[str, dict[int, tuple[int, bytes]]]) -> list[str]:
    """Every acknowledged append on every node at its index; all committed
    logs identical; no client body committed twice."""
    problems = []
    for nid, entries in logs.items():
        missing = [a for a in acks if entries.get(a.index, (None, None))[1] != a.body]
        if missing:
            shown = ", ".join(f"{a.index}:{a.body!r} (acked by {a.node}, found "
                              f"{entries.get(a.index, (None, None))[1]!r})" for a in missing[:5])
            problems.append(f"{nid} lacks {len(missing)} acknowledged entries: {shown}")
        seen: dict[bytes, int] = {}
        for index, (_term, body) in sorted(entries.items()):
            if body and seen.setdefault(body, index) != index:
                problems.append(f"{nid}: body {body!r} committed at {seen[body]} and {index}")
                break
    ref_id = sorted(logs)[0]
    for nid, entries in logs.items():
        if entries != logs[ref_id]:
            diff = sorted(i for i in set(entries) | set(logs[ref_id]) if entries.get(i) != logs[ref_id].get(i))
            problems.append(f"{nid} and {ref_id} committed different histories, first difference at "
                            f"index {diff[0]}: {entries.get(diff[0])!r} vs {logs[ref_id].get(diff[0])!r}")
    return problems


def check_samples(run: ChaosRun) -> list[str]:
    """Per node: the term never goes back (it is persisted across restarts);
    per process incarnation: the committed index never goes back.  Across
    nodes: at most one node ever claimed leadership of a term."""
    problems = []
    leaders_of: dict[int, set[str]] = collections.defaultdict(set)
    for nid, ss in run.samples.items():
        for prev, cur in zip(ss, ss[1:]):
            if cur.term < prev.term:
                problems.append(f"{nid}: term went back from {prev.term} to {cur.term} "
                                f"({run.rel(prev.at)}s -> {run.rel(cur.at)}s)")
            if cur.pid == prev.pid and cur.committed < prev.committed:
                problems.append(f"{nid}: committedIndex went back from {prev.committed} to {cur.committed} "
                                f"in one process ({run.rel(prev.at)}s -> {run.rel(cur.at)}s)")
        for s in ss:
            if s.role == "leader":
                leaders_of[s.term].add(nid)
    for term, nodes in sorted(leaders_of.items()):
        if len(nodes) > 1:
            problems.append(f"term {term} had two leaders: {sorted(nodes)}")
    return problems


@attrs.frozen
class Failover:
    disruption: Disruption
    elected_after: float | None  # first sampled leader of a newer term (sampling resolution)
    served_after: float | None   # first acknowledgement by a node other than the victim,
    #                              or by the victim once awake again


def failover_times(run: ChaosRun) -> list[Failover]:
    """How long each leader kill or pause kept the group from serving."""
    out = []
    acks = sorted(run.acks, key=lambda a: a.at)
    samples = sorted((s for ss in run.samples.values() for s in ss), key=lambda s: s.at)
    for d in run.disruptions:
        if d.kind not in ("kill_leader", "pause_leader"):
            continue
        awake = d.ended if d.kind == "pause_leader" and d.ended is not None else float("inf")
        served = next((a.at for a in acks if a.at > d.at and (a.node != d.node or a.at > awake)), None)
        elected = next((s.at for s in samples if s.at > d.at and s.role == "leader" and s.term > d.term), None)
        out.append(Failover(d, None if elected is None else elected - d.at,
                            None if served is None else served - d.at))
    return out
