# Owns what the Raft shell (replica.py) does when a Ready cannot be carried
# out or a peer message breaks the core: the store refused a leader's
# entries (fence that leader for its term), the disk has no space (drop the
# Ready, no fence), or the core raised on an admitted message (drop it,
# fence a pushing leader).  Each rebuilds the core from what is durable, as
# a restart would, so nothing unwritten is acknowledged and the node stays
# up.  A mixin of ReplicaNode: it works on the node's own state.
#
#   refused leader  an entry this follower cannot place (its log does not
#                   continue where the leader's entry says: another origin
#                   or segment size, a damaged store): nothing is written or
#                   acknowledged, messages from that leader in that term are
#                   dropped, the reason is in status() and the log; a new
#                   term lifts the fence (and refuses again if nothing
#                   changed), a restart after the operator fixed the store
#                   starts clean.
#   no space        ENOSPC/EDQUOT on the hard state, an append or a
#                   truncation: the store zeroed what it began, nothing of
#                   that Ready takes effect or leaves the node; no fence, so
#                   replication resumes once the leader retries into freed
#                   space.
#   core raised     on an admitted message (a push that would cut committed
#                   entries: a forged or broken leader): the message is
#                   dropped (peer_messages_failed), a push also fences its
#                   leader for its term.  Nothing a peer sends ends the process.
import logging

import trio

from commitlog.appends import RefusedLeader
from commitlog.errors import AppendRejectedError, DiskFullError
from commitlog.members import recover
from commitlog.raft.core import RaftCore
from commitlog.raft.membership import MembershipLog
from commitlog.raft.messages import PushRequest
from commitlog.raft.state import HardState

log = logging.getLogger("ledgermq.replica")

NO_SPACE_LOG_EVERY = 10.0  # seconds between repeats of the out-of-space error


class FaultRecovery:
    """ReplicaNode's recovery from Readies it cannot carry out."""

    __slots__ = ()

    def _refuse_leader(self, exc: AppendRejectedError) -> None:
        """The store refused the leader's entries (nothing was written).
        Drop this Ready (its messages would acknowledge them) and rebuild
        the core from the durable state: the hard state this Ready carried
        is already persisted, the log is as before the append, and commit is
        what was published."""
        old = self.core
        self.refused = RefusedLeader(old.leader_id or "?", old.term, str(exc))
        self.stats["refused_appends"] += 1
        log.error("%s: cannot place entries from leader %s (term %d): %s; not replicating from it in this term "
                  "(fix this store and restart the node)", self.node_id, self.refused.leader, old.term, exc)
        self._rebuild_core(HardState(old.term, old.voted_for))

    def _no_space(self, exc: Exception) -> None:
        """A write of the current Ready found no space: drop the Ready (its
        messages would promise what is not on disk) and rebuild the core
        from what is durable, as _refuse_leader does but without a fence."""
        self.out_of_space = DiskFullError(getattr(self.log, "store_dir", "?"), 1.0)
        self.stats["out_of_space"] += 1
        now = trio.current_time()
        if self._no_space_logged is None or now - self._no_space_logged >= NO_SPACE_LOG_EVERY:
            self._no_space_logged = now
            log.error("%s: no space left to write (%s; %d times so far): nothing written or acknowledged; "
                      "replicating again once space is freed", self.node_id, exc, self.stats["out_of_space"])
        self._rebuild_core(self._durable_hard)

    def _step_failed(self, msg, exc: Exception) -> None:
        """The core raised on an admitted peer message (a push that would
        drop committed entries, a check admission.py lacks, a bug): the
        message is dropped and the core, which may have stopped half-way
        through it, is rebuilt from what is durable, as after a restart.
        A push that failed fences its leader for its term, as entries this
        node cannot place do.  The node keeps running."""
        self.stats["peer_messages_failed"] += 1
        self._log_budget.log(log, logging.ERROR, trio.current_time(),
                             "%s: %s from %s (term %d) failed in the Raft core (%s: %s); dropped, core rebuilt "
                             "from the durable state", self.node_id, type(msg).__name__, msg.src, msg.term,
                             type(exc).__name__, exc, exc_info=exc)
        if isinstance(msg, PushRequest):
            self.refused = RefusedLeader(msg.src, msg.term, f"{type(exc).__name__}: {exc}")
        self._rebuild_core(self._durable_hard)

    def _rebuild_core(self, hard_state: HardState) -> None:
        """A new core from `hard_state`, the log as it is, the published
        commit and the configurations the log holds (what a restart reads)."""
        old = self.core
        self.core = RaftCore(old.node_id, old.voters, old.log, old.rng, old.config,
                             hard_state=hard_state, committed_index=self.committed.value,
                             membership=MembershipLog(recover(old.membership.snapshot(), old.log)))
        ss = self.core.soft_state()
        if ss != self.soft_state:
            self._on_soft_state(ss)
