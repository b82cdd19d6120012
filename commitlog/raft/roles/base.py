# Owns the interface every role object implements.  RaftCore handles what is
# common to all roles (terms, votes, the election timer, the Ready
# bookkeeping) and hands each current-term message to the role object; the
# defaults here ignore it, so a role only writes the handlers that mean
# something to it.  A role sees its node only as the RaftNode protocol
# (ports.py); handlers that may change the role return a Transition, which
# the core carries out once the handler has returned.
from typing import Sequence

from commitlog.raft.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    PushRequest,
    PushResponse,
    TimeoutNow,
    VoteResponse,
)
from commitlog.raft.roles.ports import RaftNode, Transition
from commitlog.raft.state import Ready, Role


class RoleLogic:
    role: Role

    def __init__(self, node: RaftNode) -> None:
        self.node = node

    def start(self) -> Transition | None:
        """Called once the core has switched to this role."""
        return None

    def tick(self) -> Transition | None:
        """One tick of the leader's timers (the core runs the election
        timer of the other roles)."""
        return None

    def on_push(self, m: PushRequest) -> None:
        pass

    def on_push_response(self, m: PushResponse) -> None:
        pass

    def on_heartbeat(self, m: HeartbeatRequest) -> None:
        pass

    def on_heartbeat_response(self, m: HeartbeatResponse) -> None:
        pass

    def on_vote_response(self, m: VoteResponse) -> Transition | None:
        return None

    def on_timeout_now(self, m: TimeoutNow) -> Transition | None:
        return None

    def after_persist(self, rd: Ready) -> None:
        """The shell persisted the writes of `rd` (called from advance())."""

    def members_changed(self) -> None:
        """The configuration (or whom to replicate to) changed."""

    def propose(self, bodies: Sequence[bytes]) -> int:
        raise AssertionError("only the leader proposes")

    def transfer_leadership(self, target: str) -> None:
        raise AssertionError("only the leader transfers leadership")

    def propose_conf_change(self, change) -> int:
        raise AssertionError("only the leader changes the membership")
