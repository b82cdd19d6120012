# Owns the leader's replication state for ONE follower (DLedger's
# EntryDispatcher, etcd's Progress): find the match point with COMPARE,
# drop the follower's divergent tail with TRUNCATE, reset a follower the
# leader's retention left behind, then stream pipelined APPEND batches inside
# a bounded window (pushes and bytes: the per-peer flow control).
#
# Every push carries a per-follower sequence number.  `epoch` is the first
# sequence number of the current probe/replicate round: failures answering
# an older push are stale (the network reordered or duplicated them) and are
# ignored, while successes of any age still raise match_index -- a success
# in this term stays true, since the follower never drops what it
# acknowledged to this term's leader.
import collections
import enum
from typing import TYPE_CHECKING

from commitlog.errors import IndexBelowBeginError
from commitlog.raft.messages import UNKNOWN_TERM, PushRequest, PushResponse, PushType, ResponseCode
from commitlog.raft.state import PeerStatus

if TYPE_CHECKING:
    from commitlog.raft.core import RaftCore


class PeerState(enum.Enum):
    PROBE = "probe"          # COMPARE outstanding at probe_index
    TRUNCATE = "truncate"    # TRUNCATE outstanding after a match at probe_index
    RESET = "reset"          # retention reset (TRUNCATE with batch) outstanding
    REPLICATE = "replicate"  # streaming APPENDs from next_index


class Replicator:
    __slots__ = ("core", "peer_id", "state", "match_index", "next_index", "probe_index", "next_seq",
                 "epoch", "waiting_since", "inflight", "inflight_bytes", "sent_commit",
                 "recent_active", "last_ack_tick", "last_push_tick", "needs_entry")

    def __init__(self, core: "RaftCore", peer_id: str) -> None:
        self.core = core
        self.peer_id = peer_id
        self.state = PeerState.PROBE
        self.match_index = -1
        self.next_index = core.log.end_index + 1
        self.probe_index = core.log.end_index
        self.next_seq = 1
        self.epoch = 1
        self.waiting_since = -1
        # (seq, last_index, nbytes, sent_tick) per unacknowledged APPEND, in order.
        self.inflight: collections.deque = collections.deque()
        self.inflight_bytes = 0
        self.sent_commit = -1
        self.recent_active = False
        self.last_ack_tick = -1
        self.last_push_tick = -1
        self.needs_entry = False

    # --- sending ----------------------------------------------------------

    def _push(self, type_: PushType, prev_index: int, prev_term: int, prev_crc: int = 0, batch=None,
              config=(-1, 0, b"")) -> int:
        core = self.core
        seq = self.next_seq
        self.next_seq = seq + 1
        self.sent_commit = core.commit_index
        self.last_push_tick = core.now
        core.send(PushRequest(core.node_id, self.peer_id, core.term, type_, seq, core.commit_index,
                              prev_index, prev_term, prev_crc, batch, *config))
        return seq

    def _batch_count(self, first: int) -> int:
        """How many entries a batch from `first` may hold: a configuration
        entry travels alone, so followers find it without walking batches."""
        limit = self.core.config.max_batch_count
        at = self.core.membership.next_index_from(first)
        if at is None:
            return limit
        return 1 if at == first else min(limit, at - first)

    def _new_round(self, state: PeerState) -> None:
        self.state = state
        self.epoch = self.next_seq
        self.inflight.clear()
        self.inflight_bytes = 0
        self.waiting_since = self.core.now

    def probe(self, index: int) -> None:
        """COMPARE the follower's entry at `index` with ours."""
        core = self.core
        index = min(index, core.log.end_index)
        if index <= self.match_index:
            self.replicate(self.match_index + 1)
            return
        term = self._prev_term(index)
        if term is None:
            self.reset()           # retention deleted it: we cannot compare there
            return
        self._new_round(PeerState.PROBE)
        self.probe_index = index
        self._push(PushType.COMPARE, index, term, core.chain_crc_at(index) or 0)

    def truncate(self, index: int) -> None:
        """`index` matched but the follower has more: drop its tail."""
        core = self.core
        term = self._prev_term(index)
        if term is None:
            self.reset()           # retention removed the match point meanwhile
            return
        self._new_round(PeerState.TRUNCATE)
        self.probe_index = index
        self._push(PushType.TRUNCATE, index, term, core.chain_crc_at(index) or 0)

    def reset(self) -> None:
        """Our retention deleted what the follower needs: restart it at our
        ledgerBeginIndex with our first entries, the entry before them
        becoming its boundary.  A log that no longer knows that boundary
        entry (the store forgets it with the deleted segment) restarts the
        follower one entry later, behind our first entry -- only once that
        entry is committed, since the follower will call it committed."""
        core = self.core
        log = core.log
        self._new_round(PeerState.RESET)
        begin, end = max(log.begin_index, 0), log.end_index
        prev, prev_term = begin - 1, core.term_at(begin - 1)
        if prev_term is None:
            prev = begin
            if begin > core.commit_index and begin < end:
                return  # wait for the commit index; retried by tick()
        if prev >= end:
            self.needs_entry = True     # nothing after the boundary: the leader adds a NOOP
            return
        if prev_term is None:
            prev_term = log.term_at(prev)
        batch = log.read_batch(prev + 1, core.config.max_batch_bytes, self._batch_count(prev + 1))
        self.probe_index = prev
        cfg = core.membership.at(prev)
        self._push(PushType.TRUNCATE, prev, prev_term, core.chain_crc_at(prev), batch,
                   config=(cfg.index, cfg.term, cfg.membership.encode()))

    def replicate(self, next_index: int) -> None:
        self._new_round(PeerState.REPLICATE)
        self.waiting_since = -1
        self.next_index = next_index
        self.pump()

    def pump(self) -> None:
        """Send APPENDs while the window has room and we have entries."""
        if self.state is not PeerState.REPLICATE:
            return
        core = self.core
        log = core.log
        cfg = core.config
        end = log.end_index
        inflight = self.inflight
        now = core.now
        while (self.next_index <= end and len(inflight) < cfg.max_inflight_pushes
               and self.inflight_bytes < cfg.max_inflight_bytes):
            nxt = self.next_index
            prev_term = self._prev_term(nxt - 1)
            if prev_term is None:
                self.reset()
                return
            try:
                batch = log.read_batch(nxt, cfg.max_batch_bytes, self._batch_count(nxt))
            except IndexBelowBeginError:
                self.reset()
                return
            seq = self._push(PushType.APPEND, nxt - 1, prev_term, 0, batch)
            nbytes = len(batch.raw)
            inflight.append((seq, batch.last_index, nbytes, now))
            self.inflight_bytes += nbytes
            self.next_index = batch.last_index + 1

    def _prev_term(self, index: int) -> int | None:
        """Our term at `index`; UNKNOWN_TERM for an entry our retention
        deleted that the follower may vouch for itself (it acknowledged it
        in this term, or it is committed there), which is worth asking for
        our boundary entry begin_index - 1; None below that (-> reset)."""
        core = self.core
        term = core.term_at(index)
        if term is None and (index <= self.match_index or index == core.log.begin_index - 1):
            return UNKNOWN_TERM
        return term

    def send_commit(self) -> None:
        self._push(PushType.COMMIT, -1, -1)

    # --- responses --------------------------------------------------------

    def on_response(self, m: PushResponse) -> bool:
        """Returns True when match_index moved (the leader then re-checks
        its commit index)."""
        core = self.core
        self.recent_active = True
        self.last_ack_tick = core.now
        moved = False
        if m.code is ResponseCode.SUCCESS:
            if m.match_index > self.match_index:
                self.match_index = m.match_index
                moved = True
                self._ack_inflight()
            if m.seq < self.epoch:
                if moved and self.state is PeerState.REPLICATE:
                    self.pump()       # it may have emptied the window: nothing else would refill it
                return moved
            t = m.type
            known = self.match_index
            if t is PushType.COMPARE and self.state is PeerState.PROBE:
                self._after_match(m, known)
            elif t is PushType.TRUNCATE and self.state in (PeerState.TRUNCATE, PeerState.RESET):
                self.replicate(known + 1)
            elif self.state is PeerState.REPLICATE:
                if known == core.log.end_index and m.end_index > known and not self.inflight:
                    self.truncate(known)      # caught up; the follower still holds a tail we never had
                else:
                    self.pump()
            return moved
        if m.seq < self.epoch or m.type is PushType.COMMIT:
            return moved
        self._reprobe(m)
        return moved

    def _after_match(self, m: PushResponse, known: int) -> None:
        """`known` matches and the follower may hold more.  Only a tail
        beyond OUR end is dropped with a TRUNCATE: no leader ever sent it, so
        nobody acknowledged it.  Entries up to our end may well match ours --
        and may have been acknowledged to us earlier in this term by a
        follower that restarted since and forgot it (its `matched` is not
        persisted) -- so they go through APPEND, which cuts only at a real
        term conflict (Raft §5.3: a follower holding what the leader sends
        must not truncate)."""
        if m.end_index > known and known == self.core.log.end_index:
            self.truncate(known)
        else:
            self.replicate(known + 1)

    def _ack_inflight(self) -> None:
        inflight = self.inflight
        match = self.match_index
        while inflight and inflight[0][1] <= match:
            self.inflight_bytes -= inflight.popleft()[2]

    def _reprobe(self, m: PushResponse) -> None:
        """A current push failed: pick the next index to compare from the
        follower's hints (always lower than the failed one), never below
        what is known to match, nor below the follower's ledgerBeginIndex - 1
        (all it holds before that is committed, hence equal to ours)."""
        if m.conflict_term >= 0:
            index = m.conflict_index - 1       # skip the follower's whole conflicting term
        else:
            index = m.end_index                # gap: the follower is shorter
        index = max(index, m.begin_index - 1)
        self.probe(index)

    # --- time -------------------------------------------------------------

    def tick(self) -> None:
        core = self.core
        now = core.now
        timeout = core.config.push_timeout_ticks
        if self.state is PeerState.REPLICATE:
            if self.inflight and now - self.inflight[0][3] >= timeout:
                # Oldest APPEND unanswered: assume it was lost, resend from
                # the match point (duplicates are harmless to the follower).
                self.replicate(self.match_index + 1)
            elif self.sent_commit < core.commit_index and not self.inflight:
                self.send_commit()       # idle: the commit index travels alone
        elif now - self.waiting_since >= timeout:
            if self.state is PeerState.PROBE:
                self.probe(self.probe_index)
            elif self.state is PeerState.TRUNCATE:
                self.truncate(self.probe_index)
            else:
                self.reset()

    def status(self) -> PeerStatus:
        return PeerStatus(self.peer_id, self.state.value, self.match_index,
                          self.next_index if self.state is PeerState.REPLICATE else self.probe_index + 1,
                          len(self.inflight), self.inflight_bytes, self.last_ack_tick)
