# Owns the follower: the follower side of replication (DLedger's
# EntryHandler) -- COMPARE/TRUNCATE/APPEND/COMMIT pushes checked against the
# local log with Raft's log matching (§5.3), answered with the follower's
# begin/end and a conflict hint.  A message of this term's leader restarts
# the node's election timer (heard_leader); the timer itself, and the
# election it starts, belong to the core.
#
# Hot path (APPEND continuing the log): a couple of term_at() calls, no loop
# over entries; the batch is handed to the shell as it arrived.  Overlaps and
# conflicts (retransmits, a new leader's divergent tail) binary-search the
# first conflicting index over the term runs in O(log n) term_at() calls.
import struct

from commitlog.entry import OFF_SIZE, POS_OFFSET, EntryBatch
from commitlog.errors import RaftSafetyError
from commitlog.raft.membership import ConfigEntry, Membership
from commitlog.raft.messages import (
    UNKNOWN_TERM,
    HeartbeatRequest,
    HeartbeatResponse,
    PushRequest,
    PushResponse,
    PushType,
    ResponseCode,
    TimeoutNow,
)
from commitlog.raft.roles.base import RoleLogic
from commitlog.raft.roles.ports import RaftNode, StartElection, Transition
from commitlog.raft.state import LogReset, Role

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


def batch_tail(batch: EntryBatch, from_index: int) -> EntryBatch:
    """The entries of `batch` from `from_index` on.  Walks the size fields of
    the skipped entries (only on retransmit/conflict paths)."""
    skip = from_index - batch.first_index
    if skip == 0:
        return batch
    if not 0 < skip < batch.count:
        raise ValueError(f"{from_index} outside batch [{batch.first_index}, {batch.last_index}]")
    raw, off = batch.raw, 0
    unpack = _I32.unpack_from
    for _ in range(skip):
        off += unpack(raw, off + OFF_SIZE)[0]
    runs = [(max(start, from_index), term) for i, (start, term) in enumerate(batch.term_runs)
            if i + 1 == len(batch.term_runs) or batch.term_runs[i + 1][0] > from_index]
    return EntryBatch(from_index, batch.count - skip, tuple(runs), raw[off:])


def first_pos(batch: EntryBatch) -> int:
    return _I64.unpack_from(batch.raw, POS_OFFSET)[0]


class FollowerRole(RoleLogic):
    role = Role.FOLLOWER

    def __init__(self, node: RaftNode) -> None:
        super().__init__(node)
        # Highest index known (in this term, in this role) to equal the
        # leader's log; the commit index never passes it, and nothing at or
        # below it is ever truncated.
        self.matched = -1

    # --- leader contact ---------------------------------------------------

    def on_heartbeat(self, m: HeartbeatRequest) -> None:
        self.node.heard_leader(m.src)
        self._commit(m.commit_index)
        node = self.node
        node.send(HeartbeatResponse(node.node_id, m.src, node.term, ResponseCode.SUCCESS))

    def on_timeout_now(self, m: TimeoutNow) -> Transition | None:
        if m.src == self.node.leader_id:
            return StartElection(transfer=True)
        return None

    # --- pushes -----------------------------------------------------------

    def on_push(self, m: PushRequest) -> None:
        self.node.heard_leader(m.src)
        t = m.type
        if t is PushType.APPEND:
            self._on_append(m, m.batch)
        elif t is PushType.COMMIT:
            self._commit(m.commit_index)
            self._reply(m, ResponseCode.SUCCESS, self.matched)
        elif t is PushType.COMPARE:
            if self._check_prev(m):
                self._matched(m.prev_index, m.commit_index)
                self._reply(m, ResponseCode.SUCCESS, m.prev_index)
        elif t is PushType.TRUNCATE:
            if m.batch is not None:
                self._on_reset(m)
            elif self._check_prev(m):
                self._on_truncate(m)

    def _reply(self, m: PushRequest, code: ResponseCode, match: int, end: int | None = None,
               conflict_term: int = -1, conflict_index: int = -1) -> None:
        node = self.node
        log = node.log
        node.send(PushResponse(node.node_id, m.src, node.term, m.type, m.seq, code, match,
                               log.begin_index, log.end_index if end is None else end,
                               conflict_term, conflict_index))

    def _check_prev(self, m: PushRequest) -> bool:
        """Raft's consistency check on (prev_index, prev_term); answers the
        leader itself when it fails.  An index below our ledgerBeginIndex
        passes unchecked: we only ever drop committed entries, and committed
        entries equal the leader's (leader completeness, Raft §5.4)."""
        log = self.node.log
        prev = m.prev_index
        if prev > log.end_index:
            self._reply(m, ResponseCode.INCONSISTENT_STATE, -1)      # gap: leader moves to our end
            return False
        if prev < max(log.begin_index, 0):
            return True
        local = log.term_at(prev)
        if m.prev_term == UNKNOWN_TERM:
            # The leader no longer has it; we can vouch for it if we told
            # this term's leader we hold it, or if it is committed here
            # (committed entries equal the leader's, which retention only
            # deletes once committed).
            self._refresh_matched()
            if prev <= self.matched or prev <= self.node.commit_index:
                return True
        elif local == m.prev_term:
            return True
        first = log.first_index_of_term(local)
        self._reply(m, ResponseCode.INCONSISTENT_STATE, -1, conflict_term=local,
                    conflict_index=first if first >= 0 else prev)
        return False

    def _matched(self, index: int, leader_commit: int) -> None:
        if index > self.matched:
            self.matched = index
        self._commit(leader_commit)

    def _refresh_matched(self) -> None:
        # A log ending in an entry of the current term came from this term's
        # only leader and so equals its log up to there (log matching): this
        # restores `matched` after a restart or a pre-vote round.
        node = self.node
        log = node.log
        if log.end_term == node.term and log.end_index > self.matched:
            self.matched = log.end_index

    def _commit(self, leader_commit: int) -> None:
        # Only what is known to match this leader may be called committed.
        self._refresh_matched()
        self.node.set_commit(min(leader_commit, self.matched))

    def _guard_cut(self, cut: int) -> None:
        node = self.node
        if cut <= node.commit_index or cut <= self.matched:
            raise RaftSafetyError(f"{node.node_id}: truncating at {cut} would drop committed/acknowledged "
                                  f"entries (commit {node.commit_index}, matched {self.matched})")

    def _on_append(self, m: PushRequest, batch: EntryBatch) -> None:
        if not self._check_prev(m):
            return
        node = self.node
        log = node.log
        end = log.end_index
        last = batch.last_index
        begin = max(log.begin_index, 0)
        if batch.first_index < begin:
            # The head is below our begin: committed here, already equal.
            if last < begin:
                self._matched(last, m.commit_index)
                self._reply(m, ResponseCode.SUCCESS, last, end=end)
                return
            batch = batch_tail(batch, begin)
        if last <= end and log.term_at(last) == batch.last_term:
            pass  # duplicate / already have all of it (log matching)
        else:
            hi = min(last, end)
            if hi >= batch.first_index and log.term_at(hi) != batch.term_at(hi):
                cut = self._first_conflict(batch, batch.first_index, hi)
                self._guard_cut(cut)
                node.write_truncate(cut)
                node.write_follower_append(batch_tail(batch, cut))
            elif hi >= batch.first_index:
                node.write_follower_append(batch_tail(batch, hi + 1))
            else:
                node.write_follower_append(batch)
            end = last
        self._matched(last, m.commit_index)
        self._reply(m, ResponseCode.SUCCESS, last, end=end)

    def _first_conflict(self, batch: EntryBatch, lo: int, hi: int) -> int:
        """Smallest index in [lo, hi] whose local term differs from the
        batch's; the term at hi is known to differ.  By log matching the
        terms agree on a prefix and disagree after, so bisect."""
        term_at = self.node.log.term_at
        while lo < hi:
            mid = (lo + hi) // 2
            if term_at(mid) == batch.term_at(mid):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _on_truncate(self, m: PushRequest) -> None:
        """prev matched; drop the divergent uncommitted tail after it.  Never
        below what is committed or acknowledged, and not at all when the last
        entry is of the current term: then the whole log came from this
        term's leader and equals its log (a stale/duplicated TRUNCATE)."""
        node = self.node
        log = node.log
        end = log.end_index
        cut = max(m.prev_index + 1, node.commit_index + 1, self.matched + 1)
        if end >= cut and log.end_term != node.term:
            self._guard_cut(cut)
            node.write_truncate(cut)
            end = cut - 1
        self._matched(m.prev_index, m.commit_index)
        self._reply(m, ResponseCode.SUCCESS, m.prev_index, end=end)

    def _on_reset(self, m: PushRequest) -> None:
        """The leader lacks what we need (its retention deleted it): unless we
        already continue from its ledgerBeginIndex, clear our log and restart
        at it (DLedger: follower reset to the leader's begin)."""
        node = self.node
        log = node.log
        batch = m.batch
        prev = m.prev_index
        if prev <= log.end_index and (prev < max(log.begin_index, 0) or log.term_at(prev) == m.prev_term):
            self._on_append(m, batch)     # our log continues: a plain append
            return
        if self.matched > prev or node.commit_index > prev:
            raise RaftSafetyError(f"{node.node_id}: reset to {prev + 1} would drop acknowledged or "
                                  f"committed entries (commit {node.commit_index}, matched {self.matched})")
        node.write_reset(LogReset(batch.first_index, first_pos(batch), m.prev_term, m.prev_chain_crc))
        if m.config:
            try:
                membership = Membership.decode(m.config)
            except ValueError as e:
                raise RaftSafetyError(f"{node.node_id}: reset from {m.src} carries a bad configuration: {e}") from None
            node.reset_membership(ConfigEntry(m.config_index, m.config_term, membership))
        node.write_follower_append(batch)
        node.set_commit(prev)        # everything before the leader's begin is committed
        self._matched(batch.last_index, m.commit_index)
        self._reply(m, ResponseCode.SUCCESS, batch.last_index, end=batch.last_index)
