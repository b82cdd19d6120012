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
