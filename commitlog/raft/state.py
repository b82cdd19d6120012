# Owns the values that cross the boundary between the pure Raft core and the
# shell that drives it: configuration (in ticks), the persisted hard state,
# the Ready batch of work the shell must carry out, and the status snapshot the
# admin port shows.  Values only; the behaviour lives in core.py and roles.
import enum
from typing import Sequence

import attrs

from commitlog.entry import EntryBatch
from commitlog.raft.messages import Message


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"   # collecting pre-votes; term not bumped
    CANDIDATE = "candidate"
    LEADER = "leader"


@attrs.frozen
class RaftConfig:
    """Timing is in ticks; the shell decides how long a tick is (defaults
    assume 1 tick = 10 ms: heartbeat 100 ms, election timeout 300-600 ms, so
    failover on loopback takes well under a second)."""

    heartbeat_ticks: int = 10
    # Each follower/candidate draws its timeout from [min, max) after every
    # reset (randomized, Raft §5.2).  A follower that heard from a leader less
    # than election_timeout_min ticks ago refuses votes (leader lease), and a
    # leader that did not hear from a majority for election_timeout_min ticks
    # steps down (check-quorum), keeping its term.
    election_timeout_min: int = 30
    election_timeout_max: int = 60
    pre_vote: bool = True
    check_quorum: bool = True
    # A COMPARE/TRUNCATE/oldest APPEND not answered within this is resent.
    push_timeout_ticks: int = 30
    # Replication: one push carries at most this much; at most this many
    # pushes / bytes may be unacknowledged per follower (flow control).
    max_batch_bytes: int = 512 * 1024
    max_batch_count: int = 4096
    max_inflight_pushes: int = 32
    max_inflight_bytes: int = 16 * 1024 * 1024
    # Leadership transfer (DLedger: maxLeadershipTransferWaitIndex = 1000,
    # leadershipTransferWaitTimeout = 1000 ms).
    max_transfer_lag: int = 1000
    transfer_timeout_ticks: int = 100
    # A learner is promoted to voter only within this many entries of the
    # leader's end (membership.py).
    max_promote_lag: int = 1000
    # Optional preferred leader; the leader hands over to it once it is
    # caught up (checked every preferred_check_ticks, DLedger: 1 s).
    preferred_leader: str | None = None
    preferred_check_ticks: int = 100

    def __attrs_post_init__(self) -> None:
        if not 0 < self.heartbeat_ticks < self.election_timeout_min < self.election_timeout_max:
            raise ValueError("need 0 < heartbeat_ticks < election_timeout_min < election_timeout_max")
        if self.max_batch_count < 1 or self.max_inflight_pushes < 1:
            raise ValueError("batch count and in-flight window must be >= 1")


@attrs.frozen
class HardState:
    """What must be on disk before any message of the same Ready leaves:
    DLedger's `currterm` file (currTerm, voteLeader)."""

    term: int = 0
    voted_for: str | None = None


@attrs.frozen
class SoftState:
    """Role and leader as of this Ready (volatile; reported when changed so the
    shell can fail pending appends and switch the broker role)."""

    role: Role
    term: int
    leader_id: str | None


@attrs.frozen
class LeaderAppend:
    """Leader write: shell calls log.append_leader(bodies, term, magic); the
    entries get indexes first_index .. first_index + len(bodies) - 1."""

    term: int
    bodies: Sequence[bytes]
    magic: int
    first_index: int

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.bodies) - 1


@attrs.frozen
class LogReset:
    """Retention reset: shell calls log.reset_to(begin_index, begin_pos,
    prev_term, prev_chain_crc) before appending Ready.follower_append."""

    begin_index: int
    begin_pos: int
    prev_term: int
    prev_chain_crc: int


@attrs.frozen
class Ready:
    """One batch of work for the shell.  Carry it out IN THIS ORDER:

      1. hard_state       -> persist (term, vote)            [if not None]
         membership       -> persist the configuration history [if not None]
                             (before the log changes: the history may name
                             an entry not written yet, which recovery drops,
                             never miss one the log holds -- except that a
                             truncation may leave one behind in the
                             uncommitted tail, which recovery re-reads;
                             commitlog/members.py)
      2. reset_to         -> log.reset_to(...)               [if not None]
      3. truncate_from    -> log.truncate_from(i)            [if not None]
      4. leader_append    -> log.append_leader(...)          [if not None]
         follower_append  -> log.append_follower(batch)      [if not None]
      5. committed_index  -> log.set_committed(i), wake waiters [if not None]
      6. messages         -> hand to the transport (only now: a vote or an
                             append response must never leave before the
                             state it promises is persisted)
      7. core.advance(ready)

    advance() needs only steps 1-4 to be visible to the log's reads.  A
    shell may therefore advance right after the writes and make them
    durable later (group commit: one fdatasync for several Readies),
    provided that nothing of this Ready or a later one -- messages, the
    committed index handed to clients -- is released before that flush.

    soft_state is informational (role/leader changed: fail pending appends
    with NotLeaderError / TermChangedError, switch broker role).
    membership also changes whom the shell's transport talks to (the
    core's `peers` and member_addresses()).
    """

    hard_state: HardState | None = None
    soft_state: SoftState | None = None
    reset_to: LogReset | None = None
    truncate_from: int | None = None
    leader_append: LeaderAppend | None = None
    follower_append: EntryBatch | None = None
    committed_index: int | None = None
    messages: tuple[Message, ...] = ()
    # The configuration history (membership.ConfigEntry, oldest first), when
    # it or the set of peers to replicate to changed.
    membership: tuple | None = None

    @property
    def must_persist(self) -> bool:
        return (self.hard_state is not None or self.reset_to is not None or self.truncate_from is not None
                or self.leader_append is not None or self.follower_append is not None
                or self.membership is not None)


@attrs.frozen
class PeerStatus:
    """The leader's view of one follower (admin port)."""

    peer_id: str
    state: str                 # "probe" | "truncate" | "reset" | "replicate"
    match_index: int
    next_index: int
    inflight_pushes: int
    inflight_bytes: int
    last_ack_tick: int         # tick of the last response of the current term, -1 never


@attrs.frozen
class RaftStatus:
    node_id: str
    role: Role
    term: int
    voted_for: str | None
    leader_id: str | None
    commit_index: int
    begin_index: int
    end_index: int
    tick: int
    # Leader only (empty elsewhere): per follower progress, and what is in
    # flight: entries appended but not yet committed.
    peers: tuple[PeerStatus, ...] = ()
    uncommitted: int = 0
    transferring_to: str | None = None
    # The latest configuration in the log and the index of its entry (-1:
    # the bootstrap configuration of dLegerPeers).
    voters: tuple[str, ...] = ()
    learners: tuple[str, ...] = ()
    config_index: int = -1
