# Owns the log interface the Raft core reads synchronously (etcd's Storage
# idea).  Implemented by commitlog.store.SegmentedStore (disk) and
# commitlog.raft.memlog.MemLog (tests).  The core only READS through it; every
# write is named in a Ready and performed by the shell with the write methods
# below, before the shell calls RaftCore.advance().  known_term/known_chain_crc
# are the reads that tell a deleted entry (None) from the virtual one before
# a fresh log.
from typing import Protocol, Sequence

from commitlog.entry import EntryBatch
from commitlog.errors import IndexBelowBeginError


class RaftLog(Protocol):
    """A DLedger-style log: indexes begin_index..end_index; end_index ==
    end_term == -1 when nothing was ever written (begin_index may then be -1
    or 0).

    Reads below begin_index raise IndexBelowBeginError, reads beyond
    end_index IndexBeyondEndError.  The core never asks about index -1 (the
    virtual entry before a fresh log: term -1, chainCrc 0).  The boundary
    entry begin_index - 1 should be answered after reset_to() (its term and
    chainCrc were given); after retention the log may have forgotten it --
    the core copes: a follower treats everything below its begin as
    committed (hence equal to the leader's), and a leader that cannot name
    its boundary resets lagging followers to begin_index + 1 instead.

    Retention may only delete committed entries.
    """

    # SYNC_FLUSH: the shell flush()es once per round before anything is
    # acknowledged (commitlog.config.FlushDiskType).
    sync_flush: bool

    @property
    def begin_index(self) -> int: ...

    @property
    def end_index(self) -> int: ...

    @property
    def end_term(self) -> int: ...

    @property
    def committed_index(self) -> int: ...

    def term_at(self, index: int) -> int: ...

    def chain_crc_at(self, index: int) -> int: ...

    def first_index_of_term(self, term: int) -> int:
        """First index in begin_index..end_index holding `term`, or -1."""

    def read_batch(self, first_index: int, max_bytes: int, max_count: int) -> EntryBatch:
        """Entries from first_index on, at least one (even if larger than
        max_bytes), at most max_count, stopping before max_bytes would be
        exceeded or at end_index."""

    # --- writes, done by the shell from Ready (never by the core) ---------

    def append_leader(self, bodies: Sequence[bytes], term: int, magic: int) -> list[tuple[int, int]]:
        """Encode and append one entry per body at end_index + 1...; returns
        [(index, pos)] (pos assigned by the store)."""

    def append_stamped(self, bodies: Sequence[bytes], term: int, magic: int) -> tuple[list[tuple[int, int]], object]:
        """append_leader, and what the store's append hooks returned for it:
        one value per entry (the broker's queue offsets), or None."""

    def append_follower(self, batch: EntryBatch) -> None:
        """Append encoded entries verbatim; batch.first_index == end_index + 1,
        pos and chainCrc must continue the log (AppendRejectedError if not)."""

    def truncate_from(self, index: int) -> None:
        """Drop index..end_index (never committed entries)."""

    def reset_to(self, begin_index: int, begin_pos: int, prev_term: int, prev_chain_crc: int) -> None:
        """Drop everything; the log restarts empty at begin_index, next write
        at byte begin_pos, boundary entry begin_index - 1 = (prev_term,
        prev_chain_crc).  The committed index becomes at least
        begin_index - 1."""

    def set_committed(self, index: int) -> None: ...


def known_term(log: RaftLog, index: int) -> int | None:
    """Term of `index`: -1 for the virtual entry before a fresh log, None
    when the entry is gone (below begin_index; the boundary entry
    begin_index - 1 may or may not be remembered by the log)."""
    if index == -1:
        return -1
    try:
        return log.term_at(index)
    except IndexBelowBeginError:
        return None


def known_chain_crc(log: RaftLog, index: int) -> int | None:
    """chainCrc of `index`: 0 before a fresh log, None when the entry is gone."""
    if index == -1:
        return 0
    try:
        return log.chain_crc_at(index)
    except IndexBelowBeginError:
        return None
