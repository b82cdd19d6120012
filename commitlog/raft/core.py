# Owns RaftCore, the pure Raft state machine of one replica: term/vote/leader,
# the commit index, the election timer, the vote rules, the Ready/advance
# bookkeeping, every role change (the swap of role logic, roles/follower.py,
# candidate.py, leader.py), and the group's membership (the configuration
# history of its log, membership.py: who votes, who only learns, whom the
# leader replicates to).  No trio, no clock, no sockets, no module random:
# time is tick(), randomness an injected random.Random, I/O the Ready.
# Roles see the core only as roles/ports.py's RaftNode and ask for a role
# change by returning a Transition; the core performs it (become_*) once the
# role's method has returned -- the etcd way (becomeFollower/Candidate/Leader
# in raft.go, never inside a step function's object).
import random
from typing import Sequence

import attrs

from commitlog.entry import HEADER_SIZE, MAGIC_CONFIG_CHANGE, MAGIC_NOOP, EntryBatch
from commitlog.errors import NotLeaderError, RaftContractError, RaftSafetyError
from commitlog.raft.logapi import RaftLog
from commitlog.raft.membership import (
    ConfChange,
    ConfigEntry,
    Membership,
    MembershipLog,
    is_config_entry,
)
from commitlog.raft.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    Message,
    PushRequest,
    PushResponse,
    ResponseCode,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from commitlog.raft.quorum import majority
from commitlog.raft.roles.base import RoleLogic
from commitlog.raft.roles.candidate import CandidateRole
from commitlog.raft.roles.follower import FollowerRole
from commitlog.raft.roles.leader import LeaderRole
from commitlog.raft.roles.ports import BecomeCandidate, BecomeFollower, BecomeLeader, StartElection, Transition
from commitlog.raft.state import HardState, LeaderAppend, LogReset, RaftConfig, RaftStatus, Ready, Role, SoftState


# on_setattr NO_OP: `voters` has a converter, which would otherwise make
# every attribute assignment of this hot object run attrs' Python hook.
@attrs.define(eq=False, repr=False, on_setattr=attrs.setters.NO_OP)
class RaftCore:
    """One Raft replica as a deterministic state machine.

    Inputs:   tick()                 one unit of logical time
              step(message)          a message from a peer (commitlog.raft.messages)
              propose(bodies)        leader only: append these bodies (one entry
                                     each); returns the first index assigned
              transfer_leadership(peer_id)
              propose_conf_change(change)   leader only: one single-server
                                     membership change (membership.py)
    Outputs:  has_ready() / ready()  a Ready: writes + messages (state.Ready)
              advance(ready)         "the Ready was carried out"

    Contract with the shell (the only driver):
      * After an input, drain:  while core.has_ready():
                                    rd = core.ready(); carry out rd; core.advance(rd)
        "Carry out" follows the order documented on Ready: hard state, log
        writes and the committed index are PERSISTED before rd.messages are
        sent -- a vote grant or an append acknowledgement must never leave
        before the term/vote/entries it promises are on disk.  (The writes
        must be readable before advance(); their flush may be batched as
        long as no message or commit is released ahead of it.)
      * Inputs are refused with RaftContractError while a Ready is
        outstanding (taken, not advanced) or while log/hard-state writes wait
        to be taken: the core reads the log synchronously and must see its
        own writes.  (Messages alone may accumulate over several inputs.)
      * The log is read only through RaftLog (logapi.py) and written only
        by the shell.  The leader replicates only entries already in its log
        (pos assigned by its store), so followers write identical bytes.
    """

    node_id: str
    # The bootstrap voters (dLegerPeers); once `membership` is given (the
    # configuration history recovered with the log), it decides, and this
    # becomes the latest configuration's voters.
    voters: tuple[str, ...] = attrs.field(converter=tuple)
    log: RaftLog
    rng: random.Random
    config: RaftConfig = attrs.Factory(RaftConfig)
    hard_state: HardState = attrs.Factory(HardState)
    committed_index: int = -1
    membership: MembershipLog | None = None

    # --- replica state (read-only for the outside) ------------------------
    term: int = attrs.field(init=False, default=0)
    voted_for: str | None = attrs.field(init=False, default=None)
    leader_id: str | None = attrs.field(init=False, default=None)
    commit_index: int = attrs.field(init=False, default=-1)
    now: int = attrs.field(init=False, default=0)
    election_elapsed: int = attrs.field(init=False, default=0)
    election_timeout: int = attrs.field(init=False, default=0)
    # From the latest configuration: `peers` are whom a leader replicates
    # to (voters, learners, and a removed member until its removal commits),
    # `voter_peers` whom a candidate asks; quorum counts voters only.
    peers: tuple[str, ...] = attrs.field(init=False, default=())
    voter_peers: tuple[str, ...] = attrs.field(init=False, default=())
    learners: tuple[str, ...] = attrs.field(init=False, default=())
    is_voter: bool = attrs.field(init=False, default=False)
    quorum: int = attrs.field(init=False, default=1)
    _role: RoleLogic = attrs.field(init=False, default=None)

    # --- pending output ---------------------------------------------------
    _msgs: list = attrs.field(init=False, factory=list)
    _reset: LogReset | None = attrs.field(init=False, default=None)
    _truncate: int | None = attrs.field(init=False, default=None)
    _leader_append: LeaderAppend | None = attrs.field(init=False, default=None)
    _follower_append: EntryBatch | None = attrs.field(init=False, default=None)
    _reported_hard: HardState = attrs.field(init=False, default=None)
    _reported_soft: SoftState = attrs.field(init=False, default=None)
    _reported_commit: int = attrs.field(init=False, default=-1)
    _outstanding: Ready | None = attrs.field(init=False, default=None)
    _membership_changed: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        if self.membership is None:
            if self.node_id not in self.voters or len(set(self.voters)) != len(self.voters):
                raise ValueError(f"voters {self.voters} must list {self.node_id} once")
            self.membership = MembershipLog.bootstrap(self.voters)
        self.term = self.hard_state.term
        self.voted_for = self.hard_state.voted_for
        log = self.log
        self.commit_index = max(min(self.committed_index, log.end_index), log.begin_index - 1)
        self._reported_hard = HardState(self.term, self.voted_for)
        self._reported_commit = self.commit_index
        self._update_members()
        self._membership_changed = False
        self._role = FollowerRole(self)
        self._reported_soft = self.soft_state()
        self.reset_election_timer()

    # ======================================================================
    # inputs
    # ======================================================================

    def tick(self) -> None:
        self._check_input()
        self.now += 1
        role = self._role
        if role.role is Role.LEADER:
            self._perform(role.tick())
            return
        # etcd's tickElection: followers and (pre-)candidates campaign when
        # the randomized timeout passes without a word from a leader.
        self.election_elapsed += 1
        if self.election_elapsed >= self.election_timeout:
            self.start_election(transfer=False)

    def step(self, msg: Message) -> None:
        self._check_input()
        if msg.dst != self.node_id:
            raise RaftContractError(f"message for {msg.dst} stepped into {self.node_id}")
        if isinstance(msg, VoteRequest):
            self._on_vote_request(msg)
            return
        # Raft processes RPCs whatever its configuration says: a follower
        # must follow a leader its log does not yet list (a promoted learner
        # that won), and a joining node knows nobody.  Votes are where
        # membership is checked (vote_decision), responses are matched
        # against the leader's progress records.
        if msg.term > self.term:
            if isinstance(msg, VoteResponse) and msg.pre_vote and msg.granted:
                pass  # a granted pre-vote carries the proposed term, not the voter's
            elif isinstance(msg, (PushRequest, HeartbeatRequest, TimeoutNow)):
                self.become_follower(msg.term, msg.src)
            else:
                self.become_follower(msg.term, None)
        elif msg.term < self.term:
            # A stale leader learns the newer term from the answer and steps
            # down; stale answers and stale TimeoutNow are dropped.
            if isinstance(msg, PushRequest):
                self.send(PushResponse(self.node_id, msg.src, self.term, msg.type, msg.seq,
                                       ResponseCode.EXPIRED_TERM, begin_index=self.log.begin_index,
                                       end_index=self.log.end_index))
            elif isinstance(msg, HeartbeatRequest):
                self.send(HeartbeatResponse(self.node_id, msg.src, self.term, ResponseCode.EXPIRED_TERM))
            return
        elif isinstance(msg, (PushRequest, HeartbeatRequest)) and self._role.role is not Role.FOLLOWER:
            if self._role.role is Role.LEADER:
                # Two leaders in one term cannot happen (election safety);
                # answer without touching anything.
                code = ResponseCode.INCONSISTENT_LEADER
                if isinstance(msg, PushRequest):
                    self.send(PushResponse(self.node_id, msg.src, self.term, msg.type, msg.seq, code))
                else:
                    self.send(HeartbeatResponse(self.node_id, msg.src, self.term, code))
                return
            self.become_follower(self.term, msg.src)  # a candidate meets this term's leader
        role = self._role
        if isinstance(msg, PushRequest):
            role.on_push(msg)
        elif isinstance(msg, PushResponse):
            role.on_push_response(msg)
        elif isinstance(msg, HeartbeatRequest):
            role.on_heartbeat(msg)
        elif isinstance(msg, HeartbeatResponse):
            role.on_heartbeat_response(msg)
        elif isinstance(msg, VoteResponse):
            self._perform(role.on_vote_response(msg))
        elif isinstance(msg, TimeoutNow):
            self._perform(role.on_timeout_now(msg))
        else:
            raise TypeError(f"not a raft message: {msg!r}")

    def propose(self, bodies: Sequence[bytes]) -> int:
        """Leader only: append one NORMAL entry per body.  Returns the index
        of the first; they get consecutive indexes.  Raises NotLeaderError
        (with the known leader) or LeaderTransferringError."""
        self._check_input()
        if not bodies:
            raise ValueError("propose() needs at least one body")
        if self._role.role is not Role.LEADER:
            raise NotLeaderError(self.leader_id)
        return self._role.propose(bodies)

    def transfer_leadership(self, target: str) -> None:
        """Leader only: hand leadership to `target` once it is caught up
        (TimeoutNow), refusing appends meanwhile; abandoned after
        config.transfer_timeout_ticks.  Raises LeadershipTransferError."""
        self._check_input()
        if self._role.role is not Role.LEADER:
            raise NotLeaderError(self.leader_id)
        self._role.transfer_leadership(target)

    def propose_conf_change(self, change: ConfChange) -> int:
        """Leader only: append the configuration after `change` (one
        server added as learner, promoted, or removed) as a CONFIG_CHANGE
        entry; it takes effect at once (membership.py has the rules).
        Returns the entry's index; it is done once that index is committed
        with this term.  Raises NotLeaderError or MembershipChangeError."""
        self._check_input()
        if self._role.role is not Role.LEADER:
            raise NotLeaderError(self.leader_id)
        return self._role.propose_conf_change(change)

    def campaign(self) -> None:
        """Start an election now (tests, admin `elect`): pre-vote first if
        enabled, as when the election timer fires."""
        self._check_input()
        if self._role.role is not Role.LEADER:
            self.start_election(transfer=False)

    # ======================================================================
    # outputs
    # ======================================================================

    def has_ready(self) -> bool:
        if self._outstanding is not None:
            return False
        return bool(self._msgs or self._reset is not None or self._truncate is not None
                    or self._leader_append is not None or self._follower_append is not None
                    or self._membership_changed
                    or self.commit_index != self._reported_commit
                    or self.term != self._reported_hard.term or self.voted_for != self._reported_hard.voted_for
                    or self._role.role is not self._reported_soft.role
                    or self.leader_id != self._reported_soft.leader_id
                    or self.term != self._reported_soft.term)

    def ready(self) -> Ready:
        if self._outstanding is not None:
            raise RaftContractError("ready() called again before advance()")
        hard = HardState(self.term, self.voted_for)
        soft = self.soft_state()
        rd = Ready(
            hard_state=hard if hard != self._reported_hard else None,
            soft_state=soft if soft != self._reported_soft else None,
            reset_to=self._reset,
            truncate_from=self._truncate,
            leader_append=self._leader_append,
            follower_append=self._follower_append,
            committed_index=self.commit_index if self.commit_index != self._reported_commit else None,
            messages=tuple(self._msgs),
            membership=self.membership.snapshot() if self._membership_changed else None,
        )
        self._membership_changed = False
        self._reported_hard, self._reported_soft, self._reported_commit = hard, soft, self.commit_index
        self._msgs = []
        self._reset = self._truncate = self._leader_append = self._follower_append = None
        self._outstanding = rd
        return rd

    def advance(self, rd: Ready) -> None:
        if rd is not self._outstanding:
            raise RaftContractError("advance() of a Ready that is not the outstanding one")
        self._outstanding = None
        end = self.log.end_index
        if rd.leader_append is not None and end != rd.leader_append.last_index:
            raise RaftContractError(f"leader append should end at {rd.leader_append.last_index}, log ends at {end}")
        if rd.follower_append is not None and end != rd.follower_append.last_index:
            raise RaftContractError(f"follower append should end at {rd.follower_append.last_index}, log ends at {end}")
        if rd.must_persist:
            self._role.after_persist(rd)

    # ======================================================================
    # status
    # ======================================================================

    @property
    def role(self) -> Role:
        return self._role.role

    def __repr__(self) -> str:
        return (f"<RaftCore {self.node_id} {self._role.role.value} term {self.term} leader {self.leader_id} "
                f"log [{self.log.begin_index}, {self.log.end_index}] commit {self.commit_index}>")

    def soft_state(self) -> SoftState:
        return SoftState(self._role.role, self.term, self.leader_id)

    def status(self) -> RaftStatus:
        log = self.log
        base = dict(node_id=self.node_id, role=self._role.role, term=self.term, voted_for=self.voted_for,
                    leader_id=self.leader_id, commit_index=self.commit_index,
                    begin_index=log.begin_index, end_index=log.end_index, tick=self.now,
                    voters=self.voters, learners=self.learners, config_index=self.membership.latest_index)
        if isinstance(self._role, LeaderRole):
            base.update(self._role.status_fields())
        return RaftStatus(**base)

    @property
    def leader_role(self) -> LeaderRole | None:
        return self._role if isinstance(self._role, LeaderRole) else None

    # ======================================================================
    # the RaftNode protocol (roles/ports.py): what the role logic uses
    # ======================================================================

    def send(self, msg: Message) -> None:
        self._msgs.append(msg)

    def heard_leader(self, leader_id: str) -> None:
        self.election_elapsed = 0
        if self.leader_id is None:
            self.leader_id = leader_id

    def write_reset(self, reset: LogReset) -> None:
        assert self._reset is None and self._truncate is None and self._follower_append is None
        self._reset = reset

    def write_truncate(self, index: int) -> None:
        assert self._truncate is None and self._follower_append is None and self._leader_append is None
        self._truncate = index
        if self.membership.truncate(index):
            self._membership_updated()     # back to the configuration before the dropped entry

    def write_follower_append(self, batch: EntryBatch) -> None:
        assert self._follower_append is None and self._leader_append is None
        self._follower_append = batch
        # Configuration entries travel in batches of their own (the leader's
        # progress record cuts batches there; the store refuses one inside a
        # larger batch), so a look at the first header finds every one.
        if batch.count == 1 and is_config_entry(batch.raw):
            try:
                m = Membership.decode(memoryview(batch.raw)[HEADER_SIZE:])
            except ValueError as e:
                raise RaftSafetyError(f"{self.node_id}: configuration entry {batch.first_index}: {e}") from None
            self.membership.put(batch.first_index, batch.last_term, m)
            self._membership_updated()

    def write_leader_append(self, bodies: Sequence[bytes], magic: int) -> int:
        assert self._leader_append is None and self._follower_append is None
        first = self.log.end_index + 1
        self._leader_append = LeaderAppend(self.term, bodies, magic, first)
        return first

    def write_config_entry(self, membership: Membership) -> int:
        """Leader: append `membership` as a CONFIG_CHANGE entry; in force now."""
        index = self.write_leader_append((membership.encode(),), MAGIC_CONFIG_CHANGE)
        self.membership.append(index, self.term, membership)
        self._membership_updated()
        return index

    def reset_membership(self, entry: ConfigEntry) -> None:
        """A retention reset: the configuration in force below the new log
        start comes with it (the entry itself was deleted by the leader)."""
        self.membership.reset(entry)
        self._membership_updated()

    def set_commit(self, index: int) -> None:
        if index > self.commit_index:
            old, self.commit_index = self.commit_index, index
            if old < self.membership.latest_index <= index:
                self._membership_updated()   # a removed member's replication ends on commit

    def _membership_updated(self) -> None:
        self.membership.compact(min(max(self.log.begin_index, 0), self.commit_index + 1))
        self._membership_changed = True
        self._update_members()
        self._role.members_changed()

    def _update_members(self) -> None:
        m = self.membership.latest
        me = self.node_id
        self.voters, self.learners = m.voters, m.learners
        self.is_voter = me in m.voters
        self.voter_peers = tuple(v for v in m.voters if v != me)
        self.peers = tuple(sorted(self.membership.members_since(self.commit_index) - {me}))
        self.quorum = majority(len(m.voters)) if m.voters else 1

    def member_addresses(self) -> dict[str, str]:
        """Peer addresses the configurations name (the newest wins)."""
        out: dict[str, str] = {}
        for e in self.membership.entries:
            out.update((k, v) for k, v in e.membership.addresses if v)
        return out

    def reset_election_timer(self) -> None:
        self.election_elapsed = 0
        cfg = self.config
        self.election_timeout = self.rng.randrange(cfg.election_timeout_min, cfg.election_timeout_max)

    def in_lease(self) -> bool:
        """Check-quorum lease: this node follows (or is) a leader it heard
        from within the minimum election timeout, so an election would only
        disrupt a working cluster (a rejoining partitioned node, a node with
        a flaky link)."""
        if not self.config.check_quorum or self.leader_id is None:
            return False
        return self._role.role is Role.LEADER or self.election_elapsed < self.config.election_timeout_min

    def become_follower(self, term: int, leader_id: str | None) -> None:
        if term != self.term:
            self.term, self.voted_for = term, None
        self.leader_id = leader_id
        self._swap(FollowerRole(self))
        self.reset_election_timer()

    def start_election(self, *, transfer: bool) -> None:
        if not self.is_voter:
            # A learner (or a node that knows it was removed, or one joining
            # that knows no configuration yet) never campaigns.
            self.reset_election_timer()
            return
        if self.config.pre_vote and not transfer:
            self.leader_id = None
            self._swap(CandidateRole(self, pre_vote=True, transfer=False))
        else:
            self.become_candidate(transfer=transfer)

    def become_candidate(self, *, transfer: bool) -> None:
        self.term += 1
        self.voted_for = self.node_id
        self.leader_id = None
        self._swap(CandidateRole(self, pre_vote=False, transfer=transfer))

    def become_leader(self) -> None:
        self.leader_id = self.node_id
        leader = LeaderRole(self)
        self._swap(leader)
        # Raft §5.4.2: entries of earlier terms commit only via an entry of
        # the current term; the NOOP (magic 2) is that entry.
        leader.noop_index = self.write_leader_append((b"",), MAGIC_NOOP)

    def _swap(self, role: RoleLogic) -> None:
        self._role = role
        self.reset_election_timer()
        self._perform(role.start())

    def _perform(self, t: Transition | None) -> None:
        """Carry out the role change a role's method returned."""
        if t is None:
            return
        if isinstance(t, BecomeFollower):
            self.become_follower(t.term, t.leader_id)
        elif isinstance(t, StartElection):
            self.start_election(transfer=t.transfer)
        elif isinstance(t, BecomeCandidate):
            self.become_candidate(transfer=False)
        elif isinstance(t, BecomeLeader):
            self.become_leader()
        else:
            raise TypeError(f"not a role transition: {t!r}")

    def _check_input(self) -> None:
        if self._outstanding is not None:
            raise RaftContractError("input before advance() of the outstanding Ready")
        if (self._reset is not None or self._truncate is not None or self._leader_append is not None
                or self._follower_append is not None or self._membership_changed
                or self.term != self._reported_hard.term
                or self.voted_for != self._reported_hard.voted_for):
            raise RaftContractError("input while log/hard-state writes wait to be taken with ready()")

    # ======================================================================
    # vote rules (DLedger's, with Raft's term adoption)
    # ======================================================================

    def vote_decision(self, m: VoteRequest) -> VoteResult:
        """Why this node would refuse `m` (or ACCEPT), checked in this order:
        membership, term, lease, ledger vs term, vote already cast,
        up-to-date log (Raft §5.4.1).  Pure: no state change."""
        # A candidate must be a member of our latest configuration (a
        # removed node cannot disrupt).  Our own role does not matter: a
        # learner must answer, since it may have been promoted without
        # knowing yet (etcd makes the same call).  Candidates count only
        # their voters' grants.
        if not self.membership.latest.is_member(m.src):
            return VoteResult.REJECT_UNKNOWN_LEADER
        if m.src == self.node_id:
            return VoteResult.REJECT_UNEXPECTED_LEADER
        if m.term < self.term:
            return VoteResult.REJECT_EXPIRED_VOTE_TERM
        if not m.transfer and self.in_lease():
            return VoteResult.REJECT_ALREADY_HAS_LEADER
        log = self.log
        end_term = log.end_term
        if m.term < end_term:
            # Never adopt a term older than our own entries (reachable when
            # the persisted term lags the log, e.g. a lost currterm file).
            return VoteResult.REJECT_TERM_SMALL_THAN_LEDGER
        if m.term == self.term:
            if self.voted_for is not None and self.voted_for != m.src:
                return (VoteResult.REJECT_ALREADY_HAS_LEADER if self.leader_id is not None
                        else VoteResult.REJECT_ALREADY_VOTED)
            if self.voted_for is None and self.leader_id is not None and self.leader_id != m.src:
                return VoteResult.REJECT_ALREADY_HAS_LEADER
        if m.last_term < end_term:
            return VoteResult.REJECT_EXPIRED_LEDGER_TERM
        if m.last_term == end_term and m.last_index < log.end_index:
            return VoteResult.REJECT_SMALL_LEDGER_END_INDEX
        return VoteResult.ACCEPT

    def _on_vote_request(self, m: VoteRequest) -> None:
        result = self.vote_decision(m)
        if m.pre_vote:
            # Pre-votes change nothing; a grant echoes the proposed term.
            term = m.term if result is VoteResult.ACCEPT else self.term
            self.send(VoteResponse(self.node_id, m.src, term, result, pre_vote=True))
            return
        adopt = m.term > self.term and result not in (
            VoteResult.REJECT_UNKNOWN_LEADER, VoteResult.REJECT_UNEXPECTED_LEADER,
            VoteResult.REJECT_ALREADY_HAS_LEADER, VoteResult.REJECT_TERM_SMALL_THAN_LEDGER)
        if adopt:
            # Raft: a higher term always wins (even with a stale log), unless
            # the lease protects a working leader.
            self.become_follower(m.term, None)
            result = self.vote_decision(m)
        if result is VoteResult.ACCEPT:
            self.voted_for = m.src      # persisted (Ready.hard_state) before the reply leaves
            self.reset_election_timer()
        self.send(VoteResponse(self.node_id, m.src, self.term, result))
