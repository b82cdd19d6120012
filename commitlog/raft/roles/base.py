# Owns the interface every role object implements.  RaftCore handles what is
# common to all roles (terms, votes, the Ready bookkeeping) and hands each
# current-term message to the role object; the defaults here ignore it, so a
# role only writes the handlers that mean something to it.
from typing import TYPE_CHECKING, Sequence

from commitlog.raft.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    PushRequest,
    PushResponse,
    TimeoutNow,
    VoteResponse,
)
from commitlog.raft.state import Ready, Role

if TYPE_CHECKING:
    from commitlog.raft.core import RaftCore


class RoleLogic:
    role: Role

    def __init__(self, core: "RaftCore") -> None:
        self.core = core

    def start(self) -> None:
        """Called once the core has switched to this role."""

    def tick(self) -> None:
        core = self.core
        core.election_elapsed += 1
        if core.election_elapsed >= core.election_timeout:
            core.start_election(transfer=False)

    def on_push(self, m: PushRequest) -> None:
        pass

    def on_push_response(self, m: PushResponse) -> None:
        pass

    def on_heartbeat(self, m: HeartbeatRequest) -> None:
        pass

    def on_heartbeat_response(self, m: HeartbeatResponse) -> None:
        pass

    def on_vote_response(self, m: VoteResponse) -> None:
        pass

    def on_timeout_now(self, m: TimeoutNow) -> None:
        pass

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
