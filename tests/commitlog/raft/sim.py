# Owns the deterministic cluster simulation for the Raft core: a logical
# clock (MockClock: one tick per step), an in-memory network with seeded
# fault injection (drop, delay, duplicate, reorder, partition, isolate,
# per-message filters), nodes whose MemLog and hard state survive restarts,
# a client that records which appends were acknowledged, and the Raft
# invariants checked after every single step:
#   * at most one leader per term (§5.2),
#   * per node: term never decreases, vote never changes within a term,
#     commit index never decreases,
#   * every replica's committed prefix equals every other's (chain CRC at
#     the commit index against the global committed history),
#   * a new leader holds every committed entry (§5.4 leader completeness),
#   * acknowledged appends are in the committed history with their bodies,
#   * membership: a leader is a voter of its own configuration, no two
#     successive configurations of a log differ by more than one server, a
#     node's configuration history names exactly the configuration entries
#     of its log (checked after every restart, which recovers it the way
#     the disk shell does, and at the end), and removed or joining nodes
#     follow the same rules,
#   * the shell's admission (commitlog/admission.py) refuses no message
#     an honest group sends, whatever the network does to it.
import heapq
import random
from typing import Callable

import attrs

from commitlog.admission import refusal
from commitlog.entry import MAGIC_CONFIG_CHANGE
from commitlog.members import config_entries, recover
from commitlog.raft import wire
from commitlog.raft.core import RaftCore
from commitlog.raft.membership import ConfigEntry, Membership, MembershipLog
from commitlog.raft.memlog import MemLog
from commitlog.raft.messages import Message
from commitlog.raft.state import HardState, RaftConfig, Ready, Role

# Simulation timing: 1 tick = 10 ms; shorter push timeout than the default
# because the simulated network loses messages far more often than TCP.
SIM_CONFIG = RaftConfig(heartbeat_ticks=5, election_timeout_min=20, election_timeout_max=40,
                        push_timeout_ticks=15, max_batch_bytes=2048, max_batch_count=16,
                        max_inflight_pushes=4, max_inflight_bytes=16 * 1024,
                        transfer_timeout_ticks=60, preferred_check_ticks=50)


class InvariantError(AssertionError):
    pass


@attrs.define
class MockClock:
    now: int = 0

    def advance(self) -> int:
        self.now += 1
        return self.now


@attrs.define
class Network:
    rng: random.Random
    clock: MockClock
    drop_rate: float = 0.0
    dup_rate: float = 0.0
    min_delay: int = 1
    max_delay: int = 1              # > min_delay reorders messages
    use_wire: bool = True
    blocked: set = attrs.Factory(set)            # (src, dst) pairs that lose everything
    filters: list = attrs.Factory(list)          # callables(msg) -> True to drop
    _queue: list = attrs.Factory(list)
    _seq: int = 0
    sent: int = 0
    delivered: int = 0

    def send(self, msg: Message) -> None:
        self.sent += 1
        if (msg.src, msg.dst) in self.blocked or any(f(msg) for f in self.filters):
            return
        rng = self.rng
        if self.drop_rate and rng.random() < self.drop_rate:
            return
        copies = 2 if self.dup_rate and rng.random() < self.dup_rate else 1
        payload = wire.encode(msg) if self.use_wire else msg
        for _ in range(copies):
            at = self.clock.now + rng.randint(self.min_delay, self.max_delay)
            self._seq += 1
            heapq.heappush(self._queue, (at, self._seq, payload))

    def due(self):
        """Pop every message due now (in delivery order)."""
        q, now = self._queue, self.clock.now
        while q and q[0][0] <= now:
            payload = heapq.heappop(q)[2]
            msg = wire.decode(payload) if self.use_wire else payload
            if (msg.src, msg.dst) in self.blocked:
                continue       # partition raised while in flight
            self.delivered += 1
            yield msg

    def partition(self, *groups) -> None:
        """Only nodes in the same group can talk."""
        self.blocked.clear()
        for g in groups:
            for h in groups:
                if g is not h:
                    self.blocked.update((a, b) for a in g for b in h)

    def isolate(self, node: str, others) -> None:
        self.blocked.update((node, o) for o in others if o != node)
        self.blocked.update((o, node) for o in others if o != node)

    def heal(self) -> None:
        self.blocked.clear()


@attrs.define
class SimNode:
    node_id: str
    log: MemLog
    hard: HardState = HardState()
    core: RaftCore | None = None
    restarts: int = 0
    members: tuple | None = None    # the persisted configuration history (None: never written)
    joining: bool = False           # started without a configuration (dLegerJoin)
    removed: bool = False           # stopped for good after its removal committed

    @property
    def up(self) -> bool:
        return self.core is not None


@attrs.define
class Cluster:
    ids: tuple
    seed: int
    config: RaftConfig = SIM_CONFIG
    configs: dict = attrs.Factory(dict)    # per-node config overrides
    use_wire: bool = True
    clock: MockClock = attrs.Factory(MockClock)
    rng: random.Random = attrs.field(init=False)
    net: Network = attrs.field(init=False)
    nodes: dict = attrs.field(init=False)
    # invariant state
    leaders_by_term: dict = attrs.field(init=False, factory=dict)
    history: dict = attrs.field(init=False, factory=dict)     # index -> chain crc (committed)
    max_committed: int = attrs.field(init=False, default=-1)
    seen_commit: dict = attrs.field(init=False, factory=dict)
    seen_hard: dict = attrs.field(init=False, factory=dict)
    # client bookkeeping
    pending: dict = attrs.field(init=False, factory=dict)     # (leader, term) -> [(index, body)]
    acked: dict = attrs.field(init=False, factory=dict)       # index -> body
    proposals: int = attrs.field(init=False, default=0)
    crash_mid_ready: float = 0.0     # chance a Ready dies after its writes, before its sends
    # chance a Ready dies after persisting hard state and membership but
    # before any log write (what recovery of the membership file must cope with)
    crash_before_log: float = 0.0
    crashed_before_log: int = attrs.field(init=False, default=0)
    on_ready: Callable | None = None

    def __attrs_post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.net = Network(random.Random(self.seed * 7919 + 1), self.clock, use_wire=self.use_wire)
        self.nodes = {i: SimNode(i, MemLog()) for i in self.ids}
        for i in self.ids:
            self.start(i)

    # --- node lifecycle ---------------------------------------------------

    def start(self, node_id: str) -> None:
        n = self.nodes[node_id]
        if n.removed:
            return
        if n.members is not None:
            # What the disk shell does at start-up (commitlog/members.py).
            membership = MembershipLog(recover(n.members, n.log))
        elif n.joining:
            membership = MembershipLog([ConfigEntry(-1, 0, Membership())])
        else:
            membership = MembershipLog.bootstrap(self.ids)
        n.core = RaftCore(node_id, self.ids, n.log, rng=random.Random(f"{self.seed}/{node_id}/{n.restarts}"),
                          config=self.configs.get(node_id, self.config), hard_state=n.hard,
                          committed_index=n.log.committed_index, membership=membership)
        n.restarts += 1
        self.check_membership_matches_log(n)

    def add_node(self, node_id: str) -> SimNode:
        """A fresh node that joins (dLegerJoin): no log, no configuration."""
        n = self.nodes[node_id] = SimNode(node_id, MemLog(), joining=True)
        self.start(node_id)
        return n

    def retire(self, node_id: str) -> None:
        """Stop a removed node for good (what an operator does)."""
        self.crash(node_id)
        self.nodes[node_id].removed = True

    def members(self) -> list[str]:
        """Nodes that are not retired."""
        return [i for i, n in self.nodes.items() if not n.removed]

    def change(self, change) -> int | None:
        """Propose a membership change on the leader; the entry's index, or
        None if there is no leader or it refused."""
        lead = self.leader()
        if lead is None:
            return None
        try:
            index = lead.core.propose_conf_change(change)
        except Exception:
            return None
        self.drain(lead)
        return index

    def crash(self, node_id: str) -> None:
        """Lose everything volatile; the MemLog and hard state stay (they
        were persisted before any message promising them left)."""
        n = self.nodes[node_id]
        n.core = None
        for key in [k for k in self.pending if k[0] == node_id]:
            del self.pending[key]

    def restart(self, node_id: str) -> None:
        self.crash(node_id)
        self.start(node_id)

    # --- driving ----------------------------------------------------------

    def drain(self, n: SimNode) -> None:
        core = n.core
        while core is not None and core.has_ready():
            rd = core.ready()
            self.apply(n, rd)
            if n.core is None:
                return
            core.advance(rd)

    def apply(self, n: SimNode, rd: Ready) -> None:
        log = n.log
        if rd.hard_state is not None:
            n.hard = rd.hard_state
        if rd.membership is not None:
            n.members = rd.membership
            if self.crash_before_log and self.rng.random() < self.crash_before_log:
                self.crashed_before_log += 1
                self.crash(n.node_id)      # the history names entries the log never got
                return
        if rd.reset_to is not None:
            r = rd.reset_to
            log.reset_to(r.begin_index, r.begin_pos, r.prev_term, r.prev_chain_crc)
        if rd.truncate_from is not None:
            log.truncate_from(rd.truncate_from)
        if rd.leader_append is not None:
            la = rd.leader_append
            got = log.append_leader(la.bodies, la.term, la.magic)
            assert got[0][0] == la.first_index
        if rd.follower_append is not None:
            log.append_follower(rd.follower_append)
        if rd.committed_index is not None:
            log.set_committed(rd.committed_index)
        if self.on_ready is not None:
            self.on_ready(n, rd)
        if self.crash_mid_ready and self.rng.random() < self.crash_mid_ready:
            self.crash(n.node_id)          # persisted, but the messages never left
            return
        for m in rd.messages:
            self.net.send(m)
        self.check_node(n, rd)

    def step_all(self) -> None:
        """One tick: every live node ticks, then every message due is
        delivered; invariants are checked after each."""
        self.clock.advance()
        for n in self.nodes.values():
            if n.core is not None:
                n.core.tick()
                self.drain(n)
        for msg in self.net.due():
            n = self.nodes[msg.dst]
            if n.core is not None:
                core = n.core
                reason = refusal(msg, msg.src, core.node_id, core.term,
                                 core.log.end_index if core.role is Role.LEADER else None)
                if reason is not None:
                    raise InvariantError(f"seed {self.seed}: admission refused an honest {msg!r:.300}: {reason}")
                core.step(msg)
                self.drain(n)
        self.settle_clients()

    def run(self, ticks: int) -> None:
        for _ in range(ticks):
            self.step_all()

    def run_until(self, cond: Callable[[], bool], limit: int, what: str = "condition") -> int:
        for t in range(limit):
            if cond():
                return t
            self.step_all()
        if cond():
            return limit
        raise InvariantError(f"seed {self.seed}: {what} not reached within {limit} ticks\n{self.describe()}")

    # --- clients ----------------------------------------------------------

    def leader(self) -> SimNode | None:
        """The live leader with the highest term (None if none)."""
        best = None
        for n in self.nodes.values():
            if n.core is not None and n.core.role is Role.LEADER:
                if best is None or n.core.term > best.core.term:
                    best = n
        return best

    def propose(self, count: int = 1, node: SimNode | None = None) -> bool:
        n = node or self.leader()
        if n is None or n.core is None or n.core.role is not Role.LEADER:
            return False
        bodies = [f"{self.seed}:{self.proposals + k}:{n.node_id}".encode() * self.rng.randint(1, 4)
                  for k in range(count)]
        try:
            first = n.core.propose(bodies)
        except Exception:
            return False
        self.proposals += count
        self.drain(n)
        self.pending.setdefault((n.node_id, n.core.term if n.core else -1), []).extend(
            (first + k, b) for k, b in enumerate(bodies))
        return True

    def settle_clients(self) -> None:
        """A pending append is acknowledged once its leader, still leading
        in the same term, has committed it (what the shell's watermark does)."""
        for (nid, term), items in list(self.pending.items()):
            core = self.nodes[nid].core
            if core is None or core.term != term or core.role is not Role.LEADER:
                del self.pending[(nid, term)]       # fate unknown to the client
                continue
            keep = []
            for index, body in items:
                if index <= core.commit_index:
                    if index in self.acked:
                        raise InvariantError(f"index {index} acknowledged twice")
                    self.acked[index] = body
                else:
                    keep.append((index, body))
            self.pending[(nid, term)] = keep

    # --- invariants -------------------------------------------------------

    def check_node(self, n: SimNode, rd: Ready) -> None:
        core, log, nid = n.core, n.log, n.node_id
        hard = n.hard
        prev = self.seen_hard.get(nid)
        if prev is not None:
            if hard.term < prev.term:
                raise InvariantError(f"{nid}: term went back {prev.term} -> {hard.term}")
            if hard.term == prev.term and prev.voted_for is not None and hard.voted_for != prev.voted_for:
                raise InvariantError(f"{nid}: vote changed within term {hard.term}")
        self.seen_hard[nid] = hard
        if core.term != hard.term:
            raise InvariantError(f"{nid}: core term {core.term} not persisted ({hard.term})")
        if core.role is Role.LEADER:
            other = self.leaders_by_term.setdefault(core.term, nid)
            if other != nid:
                raise InvariantError(f"two leaders in term {core.term}: {other} and {nid}")
            if not core.is_voter:
                raise InvariantError(f"leader {nid} is not a voter of its configuration {core.membership!r}")
        if rd.membership is not None:
            self._check_single_server_steps(nid, rd.membership)
        la = rd.leader_append
        if la is not None and la.magic == MAGIC_CONFIG_CHANGE:
            # The rules a leader must pass before it adds a configuration.
            entries = core.membership.entries
            prev = entries[-2] if len(entries) > 1 else None
            noop = core.leader_role.noop_index if core.leader_role is not None else -1
            if prev is not None and prev.index > core.commit_index:
                raise InvariantError(f"{nid}: configuration {la.first_index} proposed while {prev.index} is "
                                     f"uncommitted (commit {core.commit_index})")
            if core.commit_index < noop:
                raise InvariantError(f"{nid}: configuration {la.first_index} proposed before the leader's NOOP "
                                     f"{noop} committed")
            if rd.soft_state is not None and rd.soft_state.role is Role.LEADER:
                self._check_holds_committed(n)
        commit = log.committed_index
        if commit < self.seen_commit.get(nid, -1):
            raise InvariantError(f"{nid}: commit went back")
        if commit != core.commit_index:
            raise InvariantError(f"{nid}: core commit {core.commit_index} != persisted {commit}")
        old = self.seen_commit.get(nid, -1)
        begin = max(log.begin_index, 0)
        if commit > old:
            for i in range(max(old + 1, begin), commit + 1):
                self._record(nid, i, log.chain_crc_at(i))
            self.seen_commit[nid] = commit
        if commit >= begin:
            self._record(nid, commit, log.chain_crc_at(commit))

    def _check_single_server_steps(self, nid: str, history) -> None:
        for a, b in zip(history, history[1:]):
            if a.index < 0 and not a.membership.voters:
                continue                   # a joining node's empty start
            va, vb = set(a.membership.voters), set(b.membership.voters)
            if len(va ^ vb) > 1:
                raise InvariantError(f"{nid}: configurations {a.index} and {b.index} differ by more than one "
                                     f"voter: {sorted(va)} -> {sorted(vb)}")

    def check_membership_matches_log(self, n: SimNode) -> None:
        """The core's configuration history names every configuration
        entry of the log, and only those (entries below begin aside)."""
        core, log = n.core, n.log
        in_log = {(i, t, m) for i, t, m in config_entries(log, log.begin_index, log.end_index)}
        known = {(e.index, e.term, e.membership) for e in core.membership.entries
                 if e.index >= max(log.begin_index, 0)}
        if in_log != known:
            raise InvariantError(f"{n.node_id}: configuration history {core.membership!r} does not match the "
                                 f"log's configuration entries {sorted(i for i, _, _ in in_log)}")
        latest = max(in_log, default=None, key=lambda x: x[0])
        if latest is not None and core.membership.latest != latest[2]:
            raise InvariantError(f"{n.node_id}: uses {core.membership.latest.describe()} but its log's latest "
                                 f"configuration is {latest[2].describe()}")

    def _record(self, nid: str, index: int, crc: int) -> None:
        if index < 0:
            return
        known = self.history.setdefault(index, crc)
        if known != crc:
            raise InvariantError(f"{nid}: committed entry {index} differs (chain crc {crc:#x} vs {known:#x})")
        if index > self.max_committed:
            self.max_committed = index

    def _check_holds_committed(self, n: SimNode) -> None:
        log = n.log
        top = self.max_committed
        if top < 0:
            return
        if log.end_index < top:
            raise InvariantError(f"new leader {n.node_id} (term {n.core.term}) lacks committed entry {top}")
        if top >= log.begin_index and log.chain_crc_at(top) != self.history[top]:
            raise InvariantError(f"new leader {n.node_id} holds a different entry {top}")

    def check_final(self) -> None:
        """Once quiescent: identical logs, and every acknowledged append is
        committed everywhere with its body."""
        live = [n for n in self.nodes.values() if n.core is not None]
        for n in live:
            self.check_membership_matches_log(n)
        lead = self.leader()
        if lead is not None:
            for n in live:
                if n.core.membership.latest != lead.core.membership.latest:
                    raise InvariantError(f"{n.node_id} has configuration {n.core.membership.latest.describe()}, "
                                         f"the leader {lead.core.membership.latest.describe()}")
        ref = max(live, key=lambda n: n.log.end_index)
        for n in live:
            if n.log.end_index != ref.log.end_index or n.log.chain_crc_at(n.log.end_index) != ref.log.chain_crc_at(ref.log.end_index):
                raise InvariantError(f"{n.node_id} log differs from {ref.node_id}\n{self.describe()}")
        for index, body in self.acked.items():
            for n in live:
                if index < n.log.begin_index:
                    continue
                if index > n.log.committed_index or n.log.body_at(index) != body:
                    raise InvariantError(f"acknowledged append {index} lost on {n.node_id}")

    def quiescent(self) -> bool:
        lead = self.leader()
        if lead is None:
            return False
        end = lead.log.end_index
        if lead.core.commit_index != end or lead.log.term_at(end) != lead.core.term:
            return False
        for n in self.nodes.values():
            if n.removed:
                continue
            if n.core is None or n.log.end_index != end or n.log.committed_index != end:
                return False
            if n.core.leader_id != lead.node_id or n.core.term != lead.core.term:
                return False
        return True

    def describe(self) -> str:
        lines = [f"tick {self.clock.now}"]
        for n in self.nodes.values():
            if n.removed:
                lines.append(f"  {n.node_id}: REMOVED")
                continue
            if n.core is None:
                lines.append(f"  {n.node_id}: DOWN log [{n.log.begin_index}, {n.log.end_index}] commit {n.log.committed_index}")
                continue
            s = n.core.status()
            lines.append(f"  {n.node_id}: {s.role.value} term {s.term} leader {s.leader_id} "
                         f"log [{s.begin_index}, {s.end_index}] end_term {n.log.end_term} commit {s.commit_index} "
                         f"peers {[(p.peer_id, p.state, p.match_index, p.next_index) for p in s.peers]} "
                         f"voters {','.join(s.voters)} learners {','.join(s.learners)} config@{s.config_index}")
        lines.append(f"  blocked {sorted(self.net.blocked)}")
        return "\n".join(lines)
