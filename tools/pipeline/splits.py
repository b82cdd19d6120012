# Owns what the pipeline reads from a store root, decided on the driver and
# read-only: the kind of store (DLedger, old master-slave `commitlog/`, or
# mixed after a migration: the old commitlog below the divided offset and
# DLedger above it), the committed bound of the DLedger part, and one Split
# per whole segment file, each with the exact byte range a task may read.
#
# The committed bound comes from the node's own files, never from a running
# process: `committedIndex` in dledger-<id>/checkpoint, clamped to the last
# entry whose index unit and data header agree (recovery's own rule), and
# that entry's end position from its index unit.  Nothing past it is ever
# scanned, so only committed entries are exported or indexed.
#
# An old commitlog has no commit point: its valid end is where recovery
# stops (a BLANK closing the last segment, zeroes, a torn record, a body CRC
# mismatch).  Finding it needs a scan, so plain splits start out covering
# their whole file and plain_end() turns the per-segment scan summaries a
# Spark job brings back (segscan.plain_summary) into the end, as
# consumequeue.legacy_store.LegacyStore.recover does sequentially.
import os

import attrs

from commitlog.entry import HEADER, HEADER_SIZE, INDEX_UNIT, INDEX_UNIT_SIZE
from commitlog.errors import CommitLogError
from commitlog.metafiles import read_base, read_checkpoint
from commitlog.scan import resolve_store_dir
from commitlog.segments import infer_segment_size, list_segment_files
from consumequeue.legacy_store import COMMITLOG_DIR
from native.dispatch import MODE_DLEDGER, MODE_PLAIN, STOP_BLANK, STOP_END, STOP_NAMES, STOP_ZERO

DEFAULT_INDEX_SEGMENT = 32 * 5 * 1024 * 1024

KIND_DLEDGER, KIND_PLAIN, KIND_MIXED = "dledger", "plain", "mixed"


class PipelineInputError(ValueError):
    """A store root the pipeline cannot read (names the file and offset)."""


@attrs.frozen
class Split:
    """One segment file and the bytes [start, end) of it a task reads
    (absolute commitlog positions; end <= start + seg_size)."""

    store: str  # the store root, as given
    seq: int  # position of this split in its store's log order
    path: str
    start: int
    seg_size: int
    end: int
    mode: int  # MODE_DLEDGER or MODE_PLAIN
    # Bytes at the head of the file that are not part of the log: the first
    # segment of a store reset to a later position (ledgermq-base) is zero
    # up to that position.
    skip: int = 0
    # The file's bytes when a task was handed them instead of a path to map
    # (segments read through Spark's Hadoop filesystems, hadoopfs.py).
    data: bytes | None = attrs.field(default=None, eq=False, repr=False)
    # The sha256 the stage manifest recorded for the file (checked by the
    # task that reads it through a Hadoop filesystem); None for local files.
    sha256: str | None = None

    @property
    def length(self) -> int:
        return self.end - self.start


@attrs.frozen
class DLedgerBound:
    store_dir: str
    begin_pos: int
    begin_index: int  # -1 when the log is empty
    committed_index: int  # -1 when nothing is committed
    committed_pos: int  # just after the committed entry (begin_pos when none)
    seg_size: int
    files: tuple  # (start, path, length) of the data segments


@attrs.frozen
class StorePlan:
    root: str
    kind: str
    splits: tuple
    dledger: DLedgerBound | None = None
    plain_begin: int = 0
    plain_end: int | None = None  # None until resolved (plain_end())
    divided_offset: int | None = None  # first DLedger position of a mixed store
    notes: tuple = ()

    @property
    def begin_pos(self) -> int:
        if self.kind == KIND_DLEDGER:
            return self.dledger.begin_pos
        return self.plain_begin

    @property
    def end_pos(self) -> int:
        if self.dledger is not None:
            return self.dledger.committed_pos
        return self.plain_end if self.plain_end is not None else self.plain_begin

    @property
    def committed_index(self) -> int:
        return self.dledger.committed_index if self.dledger is not None else -1

    @property
    def bytes(self) -> int:
        return sum(s.length for s in self.splits)

    def to_json(self) -> dict:
        return {"root": self.root, "kind": self.kind, "segments": len(self.splits),
                "beginPos": self.begin_pos, "endPos": self.end_pos, "bytes": self.bytes,
                "committedIndex": self.committed_index, "dividedOffset": self.divided_offset,
                "notes": list(self.notes)}


# --- DLedger: the committed bound from the node's files ----------------------

def pread_range(path: str, offset: int, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


class EntryUnits:
    """Index units of one DLedger store by entry index (read-only).  Local
    files by default; a staged store behind a Hadoop filesystem passes its
    manifest's index files and a reader (hadoopfs.py)."""

    def __init__(self, store_dir: str, data_files, data_size: int, *, index_files=None, pread=pread_range):
        if index_files is None:
            index_dir = os.path.join(store_dir, "index")
            index_files = list_segment_files(index_dir) if os.path.isdir(index_dir) else []
        self.size = infer_segment_size(index_files) or DEFAULT_INDEX_SEGMENT
        self.index_files = {start: (path, length) for start, path, length in index_files}
        self.data_files = {start: (path, length) for start, path, length in data_files}
        self.data_size = data_size
        self.pread = pread

    def header_at(self, pos: int):
        start = pos - pos % self.data_size
        f = self.data_files.get(start)
        if f is None or pos - start + HEADER_SIZE > f[1]:
            return None
        return HEADER.unpack(self.pread(f[0], pos - start, HEADER_SIZE))

    def entry(self, index: int):
        """(pos, size, term) of entry `index` when its index unit and its
        data header agree, else None."""
        if index < 0:
            return None
        off = index * INDEX_UNIT_SIZE
        start = off - off % self.size
        f = self.index_files.get(start)
        if f is None or off - start + INDEX_UNIT_SIZE > f[1]:
            return None
        magic, pos, size, idx, term = INDEX_UNIT.unpack(self.pread(f[0], off - start, INDEX_UNIT_SIZE))
        if idx != index or size <= HEADER_SIZE - 4:
            return None
        h = self.header_at(pos)
        if h is None or (h[0], h[1], h[2], h[3], h[4]) != (magic, size, index, term, pos):
            return None
        return pos, size, term


def dledger_bound(store_dir: str) -> DLedgerBound:
    data_dir = os.path.join(store_dir, "data")
    files = list_segment_files(data_dir)
    seg_size = infer_segment_size(files) or 0
    if not files or seg_size <= 0:
        return DLedgerBound(store_dir, 0, -1, -1, 0, seg_size, tuple(files))
    begin_pos = files[0][0]
    base = read_base(store_dir)
    if base is not None and begin_pos <= base.pos < begin_pos + seg_size:
        # A store reset to a later position (SegmentedStore.reset_to): its
        # first segment is zero up to the recorded begin position.
        begin_pos = base.pos
    units = EntryUnits(store_dir, files, seg_size)
    head = units.header_at(begin_pos)
    if head is None or head[0] in (0, -1) or head[4] != begin_pos:
        return DLedgerBound(store_dir, begin_pos, -1, -1, begin_pos, seg_size, tuple(files))
    begin_index = head[2]
    _, committed = read_checkpoint(store_dir)
    if committed < begin_index:
        return DLedgerBound(store_dir, begin_pos, begin_index, -1, begin_pos, seg_size, tuple(files))
    if units.entry(begin_index) is None:
        raise PipelineInputError(f"{os.path.join(store_dir, 'index')}: no index unit for the first entry "
                                 f"{begin_index} (run the node once to recover its index)")
    found = units.entry(committed)
    if found is None:
        # committedIndex runs past the last entry (recovery clamps it to the
        # ledger end): the last index unit that agrees with its data.
        lo, hi = begin_index, committed - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if units.entry(mid) is not None:
                lo = mid
            else:
                hi = mid - 1
        committed = lo
        found = units.entry(committed)
    pos, size, _ = found
    return DLedgerBound(store_dir, begin_pos, begin_index, committed, pos + size, seg_size, tuple(files))


# --- planning ----------------------------------------------------------------

def find_dledger_dir(root: str, self_id: str | None) -> str | None:
    try:
        return resolve_store_dir(root, self_id)
    except (CommitLogError, OSError, ValueError) as exc:
        if self_id is not None or "several stores" in str(exc):
            raise PipelineInputError(str(exc)) from None
        return None


def plan_store(root: str, self_id: str | None = None) -> StorePlan:
    """The splits of one store root (plain parts still unresolved)."""
    if not os.path.isdir(root):
        raise PipelineInputError(f"{root}: no such directory")
    store_dir = find_dledger_dir(root, self_id)
    plain_dir = os.path.join(root, COMMITLOG_DIR)
    plain_files = list_segment_files(plain_dir) if os.path.isdir(plain_dir) else []
    bound = dledger_bound(store_dir) if store_dir else None
    if bound is not None and not bound.files:
        bound = None if plain_files else bound
    if bound is None and not plain_files:
        raise PipelineInputError(f"{root}: neither a DLedger store (dledger-<id>/data) nor a "
                                 f"master-slave store (commitlog/)")
    splits = []
    divided = None
    notes = []
    if plain_files:
        if bound is not None:
            divided = bound.files[0][0]
            below = [f for f in plain_files if f[0] < divided]
            if len(below) < len(plain_files):
                notes.append(f"{len(plain_files) - len(below)} commitlog/ file(s) at or above the divided "
                             f"offset {divided} ignored (DLedger owns that range)")
            plain_files = below
        size = infer_segment_size(plain_files)
        for start, path, length in plain_files:
            if start % size:
                raise PipelineInputError(f"{path}: start {start} is not a multiple of the segment size {size}")
            splits.append(Split(root, len(splits), path, start, size, start + min(length, size), MODE_PLAIN))
    if bound is not None:
        for start, path, length in bound.files:
            if start >= bound.committed_pos:
                break  # nothing committed there
            end = min(start + min(length, bound.seg_size), bound.committed_pos)
            skip = bound.begin_pos - start if start < bound.begin_pos < start + bound.seg_size else 0
            splits.append(Split(root, len(splits), path, start, bound.seg_size, end, MODE_DLEDGER, skip))
    kind = KIND_MIXED if (plain_files and bound is not None) else (KIND_PLAIN if plain_files else KIND_DLEDGER)
    plain_begin = plain_files[0][0] if plain_files else (bound.begin_pos if bound else 0)
    plan = StorePlan(root, kind, tuple(splits), bound, plain_begin,
                     None if plain_files else plain_begin, divided, tuple(notes))
    marker = _migration_marker(store_dir) if kind == KIND_MIXED else None
    if marker is not None:
        # `migrate apply` recorded where the old data ends: no scan needed.
        plan = _cut_plain(attrs.evolve(plan, divided_offset=marker.divided), marker.legacy_end)
    return plan


def _migration_marker(store_dir: str):
    """The marker consumequeue/migrated.py keeps in a migrated store (None
    without one; then the old part's end is found by scanning)."""
    try:
        from consumequeue.migrated import load_marker
    except ImportError:  # the migration code is optional here: the scan finds the same end
        return None
    return load_marker(store_dir)


def _cut_plain(plan: StorePlan, end: int, notes: tuple = ()) -> StorePlan:
    splits = []
    for s in plan.splits:
        if s.mode == MODE_PLAIN:
            if s.start >= end:
                continue
            s = attrs.evolve(s, end=min(s.end, end))
        splits.append(attrs.evolve(s, seq=len(splits)))
    return attrs.evolve(plan, splits=tuple(splits), plain_end=end, notes=plan.notes + notes)


# --- the plain part's valid end ------------------------------------------------

@attrs.frozen
class PlainSummary:
    """How a plain segment's scan (bodies CRC-checked) ended."""

    start: int
    seg_size: int
    end: int  # absolute position where the scan stopped
    stop: int
    records: int
    crc_bad_at: int = -1  # first record whose BODYCRC does not verify
    reason: str = ""


def plain_end(summaries) -> tuple[int, str]:
    """(valid end, why) of a plain commitlog from its segments' summaries
    in log order: recovery's walk (LegacyStore.recover), one segment at a
    time.  The end closes the log; records after it are never read."""
    if not summaries:
        return 0, "empty"
    prev = None
    for s in summaries:
        if prev is not None and s.start != prev.start + prev.seg_size:
            return prev.start + prev.seg_size, f"segment {prev.start + prev.seg_size:020d} is missing"
        if s.crc_bad_at >= 0:
            return s.crc_bad_at, f"BODYCRC mismatch in the record at {s.crc_bad_at}"
        if s.stop == STOP_BLANK or (s.stop == STOP_END and s.end == s.start + s.seg_size):
            prev = s
            continue
        if s.stop in (STOP_END, STOP_ZERO):
            return s.end, "end"
        return s.end, s.reason or f"the log stops at {s.end} ({STOP_NAMES[s.stop]})"
    last = summaries[-1]
    return (last.end if last.stop == STOP_BLANK else last.start + last.seg_size), "end"


def resolve_plain(plan: StorePlan, summaries) -> StorePlan:
    """The plan with its plain splits cut at the valid end (the summaries
    of its plain splits, in order)."""
    end, why = plain_end(summaries)
    notes = () if why in ("end", "empty") else (f"old commitlog ends at {end}: {why}",)
    return _cut_plain(plan, end, notes)
