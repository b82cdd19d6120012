# Owns the leader: proposals, heartbeats, one Replicator per follower and
# learner, the quorum-ack (commit) computation over voters, check-quorum,
# leadership transfer, the preferred-leader hand-back, and the checks a
# membership change must pass before its entry is appended (membership.py).
#
# Commit rule (Raft §5.4.2): the commit index moves to the quorum median of
# the match indexes (the leader's own = its persisted end) only when that
# entry is of the current term; the NOOP appended on election is the first
# such entry, so earlier terms' entries commit through it.
from typing import Sequence

from commitlog.entry import MAGIC_NOOP, MAGIC_NORMAL
from commitlog.errors import LeadershipTransferError, LeaderTransferringError
from commitlog.raft.membership import ChangeKind, ConfChange, MembershipChangeError
from commitlog.raft.messages import HeartbeatRequest, HeartbeatResponse, PushResponse, TimeoutNow
from commitlog.raft.quorum import quorum_match_index
from commitlog.raft.roles.base import RoleLogic
from commitlog.raft.roles.replicator import Replicator
from commitlog.raft.state import Ready, Role


class LeaderRole(RoleLogic):
    role = Role.LEADER

    def __init__(self, core) -> None:
        super().__init__(core)
        self.replicators: dict[str, Replicator] = {p: Replicator(core, p) for p in core.peers}
        self.noop_index = -1
        self.heartbeat_elapsed = 0
        self.quorum_elapsed = 0
        self.preferred_elapsed = 0
        self.transfer_target: str | None = None
        self.transfer_elapsed = 0
        self.timeout_now_sent = False

    def start(self) -> None:
        end = self.core.log.end_index
        for r in self.replicators.values():
            r.probe(end)       # DLedger: start each follower with COMPARE of our last entry

    def members_changed(self) -> None:
        core = self.core
        wanted = set(core.peers)
        for gone in [p for p in self.replicators if p not in wanted]:
            del self.replicators[gone]
            if self.transfer_target == gone:
                self.transfer_target = None
        for new in [p for p in core.peers if p not in self.replicators]:
            r = self.replicators[new] = Replicator(core, new)
            r.probe(core.log.end_index)

    # --- time -------------------------------------------------------------

    def tick(self) -> None:
        core = self.core
        cfg = core.config
        self.heartbeat_elapsed += 1
        if self.heartbeat_elapsed >= cfg.heartbeat_ticks:
            self.heartbeat_elapsed = 0
            for peer in core.peers:
                core.send(HeartbeatRequest(core.node_id, peer, core.term, core.commit_index))
        needs_entry = False
        for r in self.replicators.values():
            r.tick()
            needs_entry |= r.needs_entry
            r.needs_entry = False
        if cfg.check_quorum:
            self.quorum_elapsed += 1
            if self.quorum_elapsed >= cfg.election_timeout_min:
                self.quorum_elapsed = 0
                active = 1
                voters = core.voters
                for p, r in self.replicators.items():
                    active += r.recent_active and p in voters   # learners keep no leader in office
                    r.recent_active = False
                if active < core.quorum:
                    # Cannot hear a majority: stop accepting appends.  The term
                    # stays (DLedger: stepping down must not bump it).
                    core.become_follower(core.term, None)
                    return
        if needs_entry and self.transfer_target is None:
            # A follower must be reset but retention left nothing after our
            # boundary to send it: give it an entry (idle groups only).
            core.write_leader_append((b"",), MAGIC_NOOP)
        if self.transfer_target is not None:
            self.transfer_elapsed += 1
            if self.transfer_elapsed >= cfg.transfer_timeout_ticks:
                self.transfer_target = None       # give up; accept appends again
        if cfg.preferred_leader is not None:
            self.preferred_elapsed += 1
            if self.preferred_elapsed >= cfg.preferred_check_ticks:
                self.preferred_elapsed = 0
                self._hand_back_to_preferred()

    # --- proposals --------------------------------------------------------

    def propose(self, bodies: Sequence[bytes]) -> int:
        if self.transfer_target is not None:
            raise LeaderTransferringError(self.transfer_target)
        return self.core.write_leader_append(bodies, MAGIC_NORMAL)

    def after_persist(self, rd: Ready) -> None:
        if rd.leader_append is not None:
            for r in self.replicators.values():
                r.pump()
            self.maybe_commit()

    def maybe_commit(self) -> None:
        core = self.core
        log = core.log
        voters = core.voters
        matches = [r.match_index for p, r in self.replicators.items() if p in voters]
        matches.append(log.end_index)
        index = quorum_match_index(matches)
        if index > core.commit_index and log.term_at(index) == core.term:
            core.set_commit(index)

    # --- responses --------------------------------------------------------

    def on_push_response(self, m: PushResponse) -> None:
        r = self.replicators.get(m.src)
        if r is None:
            return  # no longer replicated to (removed, its removal committed)
        if r.on_response(m):
            self.maybe_commit()
            if m.src == self.transfer_target:
                self._maybe_timeout_now()

    def on_heartbeat_response(self, m: HeartbeatResponse) -> None:
        r = self.replicators.get(m.src)
        if r is None:
            return
        r.recent_active = True
        r.last_ack_tick = self.core.now

    # --- leadership transfer ---------------------------------------------

    def transfer_leadership(self, target: str) -> None:
        core = self.core
        if target == core.node_id:
            return
        if target not in self.replicators or target not in core.voters:
            raise LeadershipTransferError(target, "UNKNOWN_MEMBER: not a voter of this group")
        if self.transfer_target is not None:
            if self.transfer_target == target:
                return
            raise LeadershipTransferError(target, f"LEADER_TRANSFERRING: already to {self.transfer_target}")
        lag = core.log.end_index - self.replicators[target].match_index
        if lag > core.config.max_transfer_lag:
            raise LeadershipTransferError(target, f"FALL_BEHIND_TOO_MUCH: {lag} entries behind")
        self.transfer_target = target
        self.transfer_elapsed = 0
        self.timeout_now_sent = False
        self._maybe_timeout_now()

    def _maybe_timeout_now(self) -> None:
        core = self.core
        target = self.transfer_target
        if (target is not None and not self.timeout_now_sent
                and self.replicators[target].match_index == core.log.end_index):
            self.timeout_now_sent = True
            core.send(TimeoutNow(core.node_id, target, core.term))

    def _hand_back_to_preferred(self) -> None:
        core = self.core
        preferred = core.config.preferred_leader
        r = self.replicators.get(preferred)
        if r is None or self.transfer_target is not None or preferred not in core.voters:
            return
        if r.match_index == core.log.end_index and r.last_ack_tick >= core.now - core.config.election_timeout_min:
            self.transfer_leadership(preferred)

    # --- membership -------------------------------------------------------

    def propose_conf_change(self, change: ConfChange) -> int:
        core = self.core
        latest = core.membership.latest_entry
        if self.transfer_target is not None:
            raise MembershipChangeError("TRANSFERRING", f"leadership is being transferred to {self.transfer_target}")
        if core.commit_index < self.noop_index:
            # The single-server-change bug fix: an uncommitted change of an
            # earlier leader we cannot see must be settled first.
            raise MembershipChangeError("NOT_READY", f"the leader has not committed an entry of term {core.term} "
                                                     f"yet (its NOOP is {self.noop_index})")
        if latest.index > core.commit_index:
            raise MembershipChangeError("PENDING", f"the configuration at entry {latest.index} "
                                                   f"({latest.membership.describe()}) is not committed yet")
        if change.kind is ChangeKind.REMOVE and change.node_id == core.node_id:
            raise MembershipChangeError("IS_LEADER", f"{core.node_id} is the leader; transfer leadership first")
        membership = latest.membership.apply(change)
        if change.kind is ChangeKind.PROMOTE:
            # Caught up, and holding the configuration that names it: a
            # voter that does not know it is one refuses every candidate
            # (they are not members of its empty configuration).
            r = self.replicators.get(change.node_id)
            match = r.match_index if r is not None else -1
            lag = core.log.end_index - match
            if match < latest.index or lag > core.config.max_promote_lag:
                raise MembershipChangeError("FALL_BEHIND", f"{change.node_id} is {lag} entries behind "
                                                           f"(at most {core.config.max_promote_lag}, and it must "
                                                           f"hold entry {latest.index})")
        return core.write_config_entry(membership)

    # --- status -----------------------------------------------------------

    def status_fields(self) -> dict:
        core = self.core
        return dict(peers=tuple(r.status() for r in self.replicators.values()),
                    uncommitted=core.log.end_index - core.commit_index,
                    transferring_to=self.transfer_target)
