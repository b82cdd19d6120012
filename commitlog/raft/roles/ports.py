# Owns what the role logic may see of its node: the RaftNode protocol (every
# member a role reads or calls, nothing else; RaftCore implements it
# structurally) and the role changes a role asks for.
#
# Rules: roles never import the core and never change role themselves.  A
# role's handler returns a Transition (or None); the core carries it out
# after the handler has returned, so a role object is never replaced in the
# middle of its own method.  Roles write the log only through the node's
# write_* methods (they become the Ready), never through `log`.
from typing import Protocol, Sequence

import attrs

from commitlog.entry import EntryBatch
from commitlog.raft.logapi import RaftLog
from commitlog.raft.membership import ConfigEntry, Membership, MembershipLog
from commitlog.raft.messages import Message
from commitlog.raft.state import LogReset, RaftConfig


class RaftNode(Protocol):
    """The node as its role logic sees it."""

    @property
    def node_id(self) -> str: ...

    @property
    def term(self) -> int: ...

    @property
    def leader_id(self) -> str | None: ...

    @property
    def commit_index(self) -> int: ...

    @property
    def now(self) -> int: ...

    @property
    def config(self) -> RaftConfig: ...

    @property
    def log(self) -> RaftLog: ...

    @property
    def membership(self) -> MembershipLog: ...

    # From the latest configuration: whom a leader replicates to, whom a
    # candidate asks, who counts for a quorum and how many make one.
    @property
    def peers(self) -> tuple[str, ...]: ...

    @property
    def voter_peers(self) -> tuple[str, ...]: ...

    @property
    def voters(self) -> tuple[str, ...]: ...

    @property
    def quorum(self) -> int: ...

    def send(self, msg: Message) -> None: ...

    def heard_leader(self, leader_id: str) -> None:
        """A message from this term's leader: the election timer restarts,
        and the leader is known from now on."""

    def set_commit(self, index: int) -> None:
        """Raise the commit index (never lowers it)."""

    # --- writes: each becomes part of the next Ready ----------------------

    def write_leader_append(self, bodies: Sequence[bytes], magic: int) -> int: ...

    def write_config_entry(self, membership: Membership) -> int: ...

    def write_follower_append(self, batch: EntryBatch) -> None: ...

    def write_truncate(self, index: int) -> None: ...

    def write_reset(self, reset: LogReset) -> None: ...

    def reset_membership(self, entry: ConfigEntry) -> None: ...


@attrs.frozen
class BecomeFollower:
    """Follow `leader_id` (None: not known yet) in `term`."""

    term: int
    leader_id: str | None


@attrs.frozen
class StartElection:
    """The election timer fired, or this term's leader sent TimeoutNow
    (`transfer`): pre-vote first if enabled and not a transfer."""

    transfer: bool


@attrs.frozen
class BecomeCandidate:
    """A quorum granted the pre-vote: campaign for real (term + 1)."""


@attrs.frozen
class BecomeLeader:
    """A quorum granted the vote."""


Transition = BecomeFollower | StartElection | BecomeCandidate | BecomeLeader
