# Owns the typed errors of the commitlog layer.  Storage errors carry the file
# and offset they are about; replication errors carry what a client needs to
# retry elsewhere (the leader hint).  Boundaries (the broker, mqadmin) translate
# these in one place each; nothing below them formats user-facing text.
import attrs


class CommitLogError(Exception):
    """Base of every error the commitlog raises on purpose."""


# --- storage -------------------------------------------------------------

class StoreError(CommitLogError):
    pass


@attrs.define(str=False)
class CorruptStoreError(StoreError):
    """A file whose bytes violate the format where recovery must not guess."""

    path: str
    offset: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path} at offset {self.offset}: {self.reason}"


class NotAStoreError(StoreError):
    """A directory that does not look like a DLedger/ledgermq store."""


@attrs.define(str=False)
class IndexBelowBeginError(StoreError):
    """The entry was deleted by retention (or never existed on this node)."""

    index: int
    begin_index: int

    def __str__(self) -> str:
        return f"index {self.index} is below ledgerBeginIndex {self.begin_index} (deleted by retention)"


@attrs.define(str=False)
class IndexBeyondEndError(StoreError):
    index: int
    end_index: int

    def __str__(self) -> str:
        return f"index {self.index} is beyond ledgerEndIndex {self.end_index}"


@attrs.define(str=False)
class AppendRejectedError(StoreError):
    """A follower append that does not continue the local log (index, term,
    pos or chain CRC discontinuity)."""

    reason: str

    def __str__(self) -> str:
        return f"append rejected: {self.reason}"


@attrs.define(str=False)
class DiskFullError(StoreError):
    path: str
    used_ratio: float

    def __str__(self) -> str:
        return f"disk holding {self.path} is {self.used_ratio:.0%} full; writes refused"


# --- replication ---------------------------------------------------------

@attrs.define(str=False)
class NotLeaderError(CommitLogError):
    """This node cannot accept appends; `leader_hint` names the node that
    can (peer id and address), or is None when no leader is known."""

    leader_id: str | None = None
    leader_addr: str | None = None

    def __str__(self) -> str:
        if self.leader_id:
            return f"not leader; leader is {self.leader_id} at {self.leader_addr}"
        return "not leader; no leader known"


@attrs.define(str=False)
class PendingFullError(CommitLogError):
    pending: int
    limit: int

    def __str__(self) -> str:
        return f"leader has {self.pending} appends pending (limit {self.limit})"


@attrs.define(str=False)
class QuorumTimeoutError(CommitLogError):
    index: int
    timeout_ms: int

    def __str__(self) -> str:
        return f"entry {self.index} not acknowledged by a quorum within {self.timeout_ms} ms"


@attrs.define(str=False)
class TermChangedError(CommitLogError):
    """Leadership changed before the entry committed; its fate is unknown to
    this node, so the client must treat the append as failed-or-duplicated."""

    term: int
    new_term: int

    def __str__(self) -> str:
        return f"term changed from {self.term} to {self.new_term} before the append committed"


# --- raft core -----------------------------------------------------------

class RaftContractError(CommitLogError):
    """The shell broke the Ready/advance contract of commitlog.raft.core
    (an input while writes are waiting, advance() of the wrong Ready, a log
    that did not perform the write it was asked to)."""


class RaftSafetyError(CommitLogError):
    """The core was about to violate a Raft invariant (e.g. truncate a
    committed entry).  Never expected; raised instead of corrupting the log."""


@attrs.define(str=False)
class LeadershipTransferError(CommitLogError):
    """A leadership transfer request the leader refuses (DLedger:
    FALL_BEHIND_TOO_MUCH, UNKNOWN_MEMBER, LEADER_TRANSFERRING...)."""

    target: str
    reason: str

    def __str__(self) -> str:
        return f"cannot transfer leadership to {self.target}: {self.reason}"


@attrs.define(str=False)
class LeaderTransferringError(CommitLogError):
    """Appends are refused while leadership is being handed over (DLedger
    LEADER_TRANSFERRING); retry shortly, probably on `target`."""

    target: str

    def __str__(self) -> str:
        return f"leader is transferring leadership to {self.target}"


class WireError(CommitLogError, ValueError):
    """Bytes that are not a well-formed Raft message (truncated, unknown
    version or type, lengths that lie, trailing garbage)."""


# --- storage (segmented store) -----------------------------------------------

@attrs.define(str=False)
class EntryTooLargeError(StoreError):
    """An entry that cannot fit in an empty data segment (DLedger needs
    size + 8 <= segment size, so a blank filler always fits)."""

    size: int
    limit: int

    def __str__(self) -> str:
        return f"entry of {self.size} bytes does not fit a data segment (at most {self.limit} bytes)"


@attrs.define(str=False)
class CommittedTruncateError(StoreError):
    """A truncation that would drop committed entries (a Raft safety bug)."""

    index: int
    committed_index: int

    def __str__(self) -> str:
        return f"refusing to truncate from index {self.index}: entries up to {self.committed_index} are committed"


@attrs.define(str=False)
class StoreLockedError(StoreError):
    """Another SegmentedStore (in this or another process) has the store open."""

    path: str

    def __str__(self) -> str:
        return f"{self.path} is locked by another process (or already open in this one)"


@attrs.define(str=False)
class StoreClosedError(StoreError):
    path: str

    def __str__(self) -> str:
        return f"store {self.path} is closed"
