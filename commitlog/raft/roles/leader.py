# Owns the leader: proposals, heartbeats, one Progress record per follower
# and learner (progress.py: it returns the pushes, the leader sends them),
# the quorum-ack (commit) computation over voters, check-quorum, leadership
# transfer, the preferred-leader hand-back, and the checks a membership
# change must pass before its entry is appended (membership.py).
#
# Commit rule (Raft §5.4.2): the commit index moves to the quorum median of
# the match indexes (the leader's own = its persisted end) only when that
# entry is of the current term; the NOOP appended on election is the first
# such entry, so earlier terms' entries commit through it.
from typing import Sequence

from commitlog.entry import MAGIC_NOOP, MAGIC_NORMAL
from commitlog.errors import LeadershipTransferError, LeaderTransferringError
from commitlog.raft.membership import ChangeKind, ConfChange, MembershipChangeError
from commitlog.raft.messages import HeartbeatRequest, HeartbeatResponse, PushRequest, PushResponse, TimeoutNow
from commitlog.raft.progress import Progress, ReplicationView
from commitlog.raft.quorum import quorum_match_index
from commitlog.raft.roles.base import RoleLogic
from commitlog.raft.roles.ports import BecomeFollower, RaftNode, Transition
from commitlog.raft.state import Ready, Role


class LeaderRole(RoleLogic):
    role = Role.LEADER

    def __init__(self, node: RaftNode) -> None:
        super().__init__(node)
        end = node.log.end_index
        self.progress: dict[str, Progress] = {p: Progress.start(p, end) for p in node.peers}
        self.noop_index = -1
        self.heartbeat_elapsed = 0
        self.quorum_elapsed = 0
        self.preferred_elapsed = 0
        self.transfer_target: str | None = None
        self.transfer_elapsed = 0
        self.timeout_now_sent = False

    def view(self) -> ReplicationView:
        """What the progress records read of this leader, now."""
        n = self.node
        return ReplicationView(n.node_id, n.term, n.commit_index, n.now, n.log, n.membership, n.config)

    def _send(self, pushes: list[PushRequest]) -> None:
        send = self.node.send
        for m in pushes:
            send(m)

    def start(self) -> Transition | None:
        v = self.view()
        end = v.log.end_index
        for pr in self.progress.values():
            self._send(pr.probe(v, end))    # DLedger: start each follower with COMPARE of our last entry
        return None

    def members_changed(self) -> None:
        node = self.node
        wanted = set(node.peers)
        for gone in [p for p in self.progress if p not in wanted]:
            del self.progress[gone]
            if self.transfer_target == gone:
                self.transfer_target = None
        new = [p for p in node.peers if p not in self.progress]
        if new:
            v = self.view()
            end = v.log.end_index
            for p in new:
                pr = self.progress[p] = Progress.start(p, end)
                self._send(pr.probe(v, end))

    # --- time -------------------------------------------------------------

    def tick(self) -> Transition | None:
        node = self.node
        cfg = node.config
        self.heartbeat_elapsed += 1
        if self.heartbeat_elapsed >= cfg.heartbeat_ticks:
            self.heartbeat_elapsed = 0
            for peer in node.peers:
                node.send(HeartbeatRequest(node.node_id, peer, node.term, node.commit_index))
        needs_entry = False
        v = self.view()
        for pr in self.progress.values():
            self._send(pr.tick(v))
            needs_entry |= pr.needs_entry
            pr.needs_entry = False
        if cfg.check_quorum:
            self.quorum_elapsed += 1
            if self.quorum_elapsed >= cfg.election_timeout_min:
                self.quorum_elapsed = 0
                active = 1
                voters = node.voters
                for p, pr in self.progress.items():
                    active += pr.recent_active and p in voters   # learners keep no leader in office
                    pr.recent_active = False
                if active < node.quorum:
                    # Cannot hear a majority: stop accepting appends.  The term
                    # stays (DLedger: stepping down must not bump it).
                    return BecomeFollower(node.term, None)
        if needs_entry and self.transfer_target is None:
            # A follower must be reset but retention left nothing after our
            # boundary to send it: give it an entry (idle groups only).
            node.write_leader_append((b"",), MAGIC_NOOP)
        if self.transfer_target is not None:
            self.transfer_elapsed += 1
            if self.transfer_elapsed >= cfg.transfer_timeout_ticks:
                self.transfer_target = None       # give up; accept appends again
        if cfg.preferred_leader is not None:
            self.preferred_elapsed += 1
            if self.preferred_elapsed >= cfg.preferred_check_ticks:
                self.preferred_elapsed = 0
                self._hand_back_to_preferred()
        return None

    # --- proposals --------------------------------------------------------

    def propose(self, bodies: Sequence[bytes]) -> int:
        if self.transfer_target is not None:
            raise LeaderTransferringError(self.transfer_target)
        return self.node.write_leader_append(bodies, MAGIC_NORMAL)

    def after_persist(self, rd: Ready) -> None:
        if rd.leader_append is not None:
            v = self.view()
            for pr in self.progress.values():
                self._send(pr.pump(v))
            self.maybe_commit()

    def maybe_commit(self) -> None:
        node = self.node
        log = node.log
        voters = node.voters
        matches = [pr.match_index for p, pr in self.progress.items() if p in voters]
        matches.append(log.end_index)
        index = quorum_match_index(matches)
        if index > node.commit_index and log.term_at(index) == node.term:
            node.set_commit(index)

    # --- responses --------------------------------------------------------

    def on_push_response(self, m: PushResponse) -> None:
        pr = self.progress.get(m.src)
        if pr is None:
            return  # no longer replicated to (removed, its removal committed)
        before = pr.match_index
        self._send(pr.on_response(self.view(), m))
        if pr.match_index > before:
            self.maybe_commit()
            if m.src == self.transfer_target:
                self._maybe_timeout_now()

    def on_heartbeat_response(self, m: HeartbeatResponse) -> None:
        pr = self.progress.get(m.src)
        if pr is not None:
            pr.heard(self.node.now)

    # --- leadership transfer ---------------------------------------------

    def transfer_leadership(self, target: str) -> None:
        node = self.node
        if target == node.node_id:
            return
        if target not in self.progress or target not in node.voters:
            raise LeadershipTransferError(target, "UNKNOWN_MEMBER: not a voter of this group")
        if self.transfer_target is not None:
            if self.transfer_target == target:
                return
            raise LeadershipTransferError(target, f"LEADER_TRANSFERRING: already to {self.transfer_target}")
        lag = node.log.end_index - self.progress[target].match_index
        if lag > node.config.max_transfer_lag:
            raise LeadershipTransferError(target, f"FALL_BEHIND_TOO_MUCH: {lag} entries behind")
        self.transfer_target = target
        self.transfer_elapsed = 0
        self.timeout_now_sent = False
        self._maybe_timeout_now()

    def _maybe_timeout_now(self) -> None:
        node = self.node
        target = self.transfer_target
        if (target is not None and not self.timeout_now_sent
                and self.progress[target].match_index == node.log.end_index):
            self.timeout_now_sent = True
            node.send(TimeoutNow(node.node_id, target, node.term))

    def _hand_back_to_preferred(self) -> None:
        node = self.node
        preferred = node.config.preferred_leader
        pr = self.progress.get(preferred)
        if pr is None or self.transfer_target is not None or preferred not in node.voters:
            return
        if pr.match_index == node.log.end_index and pr.last_ack_tick >= node.now - node.config.election_timeout_min:
            self.transfer_leadership(preferred)

    # --- membership -------------------------------------------------------

    def propose_conf_change(self, change: ConfChange) -> int:
        node = self.node
        latest = node.membership.latest_entry
        if self.transfer_target is not None:
            raise MembershipChangeError("TRANSFERRING", f"leadership is being transferred to {self.transfer_target}")
        if node.commit_index < self.noop_index:
            # The single-server-change bug fix: an uncommitted change of an
            # earlier leader we cannot see must be settled first.
            raise MembershipChangeError("NOT_READY", f"the leader has not committed an entry of term {node.term} "
                                                     f"yet (its NOOP is {self.noop_index})")
        if latest.index > node.commit_index:
            raise MembershipChangeError("PENDING", f"the configuration at entry {latest.index} "
                                                   f"({latest.membership.describe()}) is not committed yet")
        if change.kind is ChangeKind.REMOVE and change.node_id == node.node_id:
            raise MembershipChangeError("IS_LEADER", f"{node.node_id} is the leader; transfer leadership first")
        membership = latest.membership.apply(change)
        if change.kind is ChangeKind.PROMOTE:
            # Caught up, and holding the configuration that names it: a
            # voter that does not know it is one refuses every candidate
            # (they are not members of its empty configuration).
            pr = self.progress.get(change.node_id)
            match = pr.match_index if pr is not None else -1
            lag = node.log.end_index - match
            if match < latest.index or lag > node.config.max_promote_lag:
                raise MembershipChangeError("FALL_BEHIND", f"{change.node_id} is {lag} entries behind "
                                                           f"(at most {node.config.max_promote_lag}, and it must "
                                                           f"hold entry {latest.index})")
        return node.write_config_entry(membership)

    # --- status -----------------------------------------------------------

    def status_fields(self) -> dict:
        node = self.node
        return dict(peers=tuple(pr.status() for pr in self.progress.values()),
                    uncommitted=node.log.end_index - node.commit_index,
                    transferring_to=self.transfer_target)
