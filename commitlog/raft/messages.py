# Owns the messages Raft replicas exchange (DLedger semantics, spec §7.4) and
# the enums they carry.  Values only: every message is an @attrs.frozen with
# `src`, `dst` (peer ids) and `term`; the transport moves them as bytes made by
# commitlog/raft/wire.py and the core never sees a socket.
#
# DLedger's RPCs map onto these as follows:
#   VOTE (51001)                -> VoteRequest / VoteResponse (pre_vote flag added)
#   HEART_BEAT (51002)          -> HeartbeatRequest / HeartbeatResponse
#   PUSH (51004)                -> PushRequest / PushResponse
#   LEADERSHIP_TRANSFER (51005) -> TimeoutNow (leader -> transferee, "start a
#                                  forced election now"; the admin-facing
#                                  request is RaftCore.transfer_leadership())
import enum

import attrs

from commitlog.entry import EntryBatch


class VoteResult(enum.IntEnum):
    """DLedger's VoteResponse.RESULT, same order (wire value = ordinal)."""

    UNKNOWN = 0
    ACCEPT = 1
    REJECT_UNKNOWN_LEADER = 2          # candidate is not a member of the group
    REJECT_UNEXPECTED_LEADER = 3       # candidate is the voter itself
    REJECT_EXPIRED_VOTE_TERM = 4       # request term < voter's term
    REJECT_ALREADY_VOTED = 5           # voted for someone else in this term
    REJECT_ALREADY_HAS_LEADER = 6      # voter follows a live leader (lease) or
                                       # voted in this term and knows the leader
    REJECT_TERM_NOT_READY = 7          # kept for numbering; ledgermq adopts the
                                       # higher term and answers in one go
    REJECT_TERM_SMALL_THAN_LEDGER = 8  # request term < voter's ledgerEndTerm
    REJECT_EXPIRED_LEDGER_TERM = 9     # candidate ledgerEndTerm < voter's
    REJECT_SMALL_LEDGER_END_INDEX = 10  # same ledgerEndTerm, smaller end index
    REJECT_TAKING_LEADERSHIP = 11      # kept for numbering (unused)


class ResponseCode(enum.IntEnum):
    """The DLedgerResponseCode values (spec §7.5) that the core produces."""

    SUCCESS = 200
    EXPIRED_TERM = 403                 # sender's term is stale
    INCONSISTENT_STATE = 406           # push does not continue the follower log
    INCONSISTENT_LEADER = 409          # same term, different leader (a bug)


class PushType(enum.IntEnum):
    """PushEntryRequest.type.

    COMPARE  -- "is your entry at prev_index of term prev_term?" (probe).
    TRUNCATE -- without batch: drop your uncommitted tail after prev_index
                (which matched).  With batch: the retention reset; the leader no
                longer has what the follower needs, so the follower clears its
                log, restarts at batch.first_index (boundary prev_index/
                prev_term/prev_chain_crc) and appends the batch.
    APPEND   -- batch continuing after prev_index/prev_term (pipelined, seq).
    COMMIT   -- commit index only (sent when the commit advanced and no APPEND
                is carrying it).
    """

    COMPARE = 1
    TRUNCATE = 2
    APPEND = 3
    COMMIT = 4


@attrs.frozen
class VoteRequest:
    """Candidate -> voter.  `term` is the term the candidate will use (for a
    pre-vote: its current term + 1, without having bumped it).  `transfer` is
    set for elections started by TimeoutNow: voters skip the leader-lease check
    (a deliberate leadership transfer must not be refused as disruptive)."""

    src: str
    dst: str
    term: int
    last_index: int
    last_term: int
    pre_vote: bool = False
    transfer: bool = False


@attrs.frozen
class VoteResponse:
    """Voter -> candidate.  `term` is the voter's term (for a granted pre-vote,
    the request's term, so the pre-candidate can count it)."""

    src: str
    dst: str
    term: int
    result: VoteResult
    pre_vote: bool = False

    @property
    def granted(self) -> bool:
        return self.result is VoteResult.ACCEPT


@attrs.frozen
class HeartbeatRequest:
    """Leader -> follower, every heartbeat interval.  Asserts leadership and
    repeats the commit index (DLedger's carries none; this one re-delivers a
    commit whose COMMIT push was lost)."""

    src: str
    dst: str
    term: int
    commit_index: int = -1


@attrs.frozen
class HeartbeatResponse:
    src: str
    dst: str
    term: int
    code: ResponseCode


# prev_term of a push whose prev entry the leader's retention already deleted
# while the follower had acknowledged it in this term (prev_index >= 0; real
# entry terms are >= 1): the follower vouches for it from what it knows.
UNKNOWN_TERM = -1


@attrs.frozen
class PushRequest:
    """Leader -> follower.  `seq` grows by one per push to that follower
    within the leader's term; the response echoes it, so the leader can tell
    stale (pre-reprobe) responses from current ones when the network reorders
    or duplicates.  `prev_*` describe the entry just before `batch` (APPEND,
    reset TRUNCATE) or the entry being compared / kept (COMPARE, TRUNCATE);
    prev_term may be UNKNOWN_TERM (see above).  A reset TRUNCATE also
    carries the configuration in force at prev_index (`config`, the body of
    its CONFIG_CHANGE entry at config_index/config_term; index -1 for the
    bootstrap one): the follower cannot read it from entries the leader no
    longer has."""

    src: str
    dst: str
    term: int
    type: PushType
    seq: int
    commit_index: int
    prev_index: int = -1
    prev_term: int = -1
    prev_chain_crc: int = 0
    batch: EntryBatch | None = None
    config_index: int = -1
    config_term: int = 0
    config: bytes = b""


@attrs.frozen
class PushResponse:
    """Follower -> leader.  `match_index` is the last index the follower now
    knows to equal the leader's log (SUCCESS only, else -1).  begin/end are the
    follower's ledgerBeginIndex/ledgerEndIndex; on INCONSISTENT_STATE for a
    term mismatch, conflict_term is the follower's term at prev_index and
    conflict_index the first index it holds of that term (DLedger HEAD's
    xTerm/xIndex), letting the leader skip a whole term per round trip."""

    src: str
    dst: str
    term: int
    type: PushType
    seq: int
    code: ResponseCode
    match_index: int = -1
    begin_index: int = 0
    end_index: int = -1
    conflict_term: int = -1
    conflict_index: int = -1


@attrs.frozen
class TimeoutNow:
    """Leader -> transferee (leadership transfer): start a real election now,
    skipping pre-vote and the voters' lease check."""

    src: str
    dst: str
    term: int


Message = VoteRequest | VoteResponse | HeartbeatRequest | HeartbeatResponse | PushRequest | PushResponse | TimeoutNow

MESSAGE_TYPES = (VoteRequest, VoteResponse, HeartbeatRequest, HeartbeatResponse,
                 PushRequest, PushResponse, TimeoutNow)
