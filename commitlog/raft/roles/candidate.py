# Owns the (pre-)candidate: asks every peer for its vote and counts the
# answers.  A pre-candidate (Raft thesis §9.6) asks with term + 1 WITHOUT
# bumping its own term, so a node cut off from the cluster can campaign
# forever without inflating everybody's term when it comes back; only a
# quorum of pre-votes makes it a real candidate (term + 1, vote for self,
# persisted before the requests leave).  The outcome of a round is a
# Transition the core carries out.
from commitlog.raft.messages import VoteRequest, VoteResponse
from commitlog.raft.roles.base import RoleLogic
from commitlog.raft.roles.ports import BecomeCandidate, BecomeFollower, BecomeLeader, RaftNode, Transition
from commitlog.raft.state import Role


class CandidateRole(RoleLogic):

    def __init__(self, node: RaftNode, *, pre_vote: bool, transfer: bool) -> None:
        super().__init__(node)
        self.pre_vote = pre_vote
        self.transfer = transfer
        self.role = Role.PRE_CANDIDATE if pre_vote else Role.CANDIDATE
        self.granted: set[str] = {node.node_id}
        self.rejected: set[str] = set()

    @property
    def request_term(self) -> int:
        return self.node.term + 1 if self.pre_vote else self.node.term

    def start(self) -> Transition | None:
        decided = self._decide()
        if decided is not None:
            return decided
        node = self.node
        log = node.log
        last_index, last_term = log.end_index, log.end_term
        term = self.request_term
        for peer in node.voter_peers:
            node.send(VoteRequest(node.node_id, peer, term, last_index, last_term,
                                  pre_vote=self.pre_vote, transfer=self.transfer))
        return None

    def on_vote_response(self, m: VoteResponse) -> Transition | None:
        # A grant echoes our request term; a refusal carries the voter's
        # term (<= ours, or the core would have made us follow it).
        if m.pre_vote != self.pre_vote or (m.granted and m.term != self.request_term):
            return None  # an answer to an earlier round
        if m.src not in self.node.voters:
            return None  # only voters count (a learner may answer all the same)
        (self.granted if m.granted else self.rejected).add(m.src)
        return self._decide()

    def _decide(self) -> Transition | None:
        node = self.node
        if len(self.granted) >= node.quorum:
            return BecomeCandidate() if self.pre_vote else BecomeLeader()
        if len(self.rejected) >= node.quorum:
            # Lost this round; wait for a leader or the next timeout as a
            # follower (term unchanged for a pre-vote round).
            return BecomeFollower(node.term, None)
        return None
