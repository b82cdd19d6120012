# Owns the (pre-)candidate: asks every peer for its vote and counts the
# answers.  A pre-candidate (Raft thesis §9.6) asks with term + 1 WITHOUT
# bumping its own term, so a node cut off from the cluster can campaign
# forever without inflating everybody's term when it comes back; only a
# quorum of pre-votes makes it a real candidate (term + 1, vote for self,
# persisted before the requests leave).
from commitlog.raft.messages import VoteRequest, VoteResponse
from commitlog.raft.roles.base import RoleLogic
from commitlog.raft.state import Role


class CandidateRole(RoleLogic):

    def __init__(self, core, *, pre_vote: bool, transfer: bool) -> None:
        super().__init__(core)
        self.pre_vote = pre_vote
        self.transfer = transfer
        self.role = Role.PRE_CANDIDATE if pre_vote else Role.CANDIDATE
        self.granted: set[str] = {core.node_id}
        self.rejected: set[str] = set()

    @property
    def request_term(self) -> int:
        return self.core.term + 1 if self.pre_vote else self.core.term

    def start(self) -> None:
        core = self.core
        if self._decide():
            return
        log = core.log
        last_index, last_term = log.end_index, log.end_term
        term = self.request_term
        for peer in core.voter_peers:
            core.send(VoteRequest(core.node_id, peer, term, last_index, last_term,
                                  pre_vote=self.pre_vote, transfer=self.transfer))

    def on_vote_response(self, m: VoteResponse) -> None:
        # A grant echoes our request term; a refusal carries the voter's
        # term (<= ours, or the core would have made us follow it).
        if m.pre_vote != self.pre_vote or (m.granted and m.term != self.request_term):
            return  # an answer to an earlier round
        if m.src not in self.core.voters:
            return  # only voters count (a learner may answer all the same)
        (self.granted if m.granted else self.rejected).add(m.src)
        self._decide()

    def _decide(self) -> bool:
        core = self.core
        if len(self.granted) >= core.quorum:
            if self.pre_vote:
                core.become_candidate(transfer=False)
            else:
                core.become_leader()
            return True
        if len(self.rejected) >= core.quorum:
            # Lost this round; wait for a leader or the next timeout as a
            # follower (term unchanged for a pre-vote round).
            core.become_follower(core.term, None)
            return True
        return False
