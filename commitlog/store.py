# Owns the single-node DLedger-format log: `${root}/dledger-<selfId>/data`
# and `/index` segment files (spec §5), the leader and follower append paths,
# truncation and reset.  Reads live in reads.py and flushing and checkpoints
# in durability.py (both mixed in), the trio flusher service in flusher.py,
# crash recovery in recovery.py, retention in retention.py, the file layer
# in segments.py.
#
# Invariants the code relies on:
#   * every byte of the data space at or after end_pos is zero, and so is
#     every index unit after end_index (recovery and truncation restore it);
#   * data segments start at multiples of the segment size, index unit i is
#     at byte i*32 of the index space;
#   * data is written before index units, and state changes only after both
#     writes succeeded, so a crash leaves at most a torn tail.
#
# Threading: one trio thread owns the store.  flush() may also run in a
# worker thread (commitlog/flusher.py does that, and so may the replica): flushes
# are serialized by a lock, snapshot what to sync in an order that cannot
# lose a concurrent write, and fdatasync dup()ed descriptors, so deleting a
# segment never races with a flush.
import errno
import fcntl
import logging
import os
import threading
from array import array
from collections.abc import Callable, Sequence

import attrs
import trio

from commitlog import metafiles
from commitlog.atomicfile import fsync_dir
from commitlog.config import FlushDiskType
from commitlog.durability import StoreDurability
from commitlog.entry import (
    BLANK,
    HEADER_SIZE,
    MAGIC_CONFIG_CHANGE,
    MAGIC_NOOP,
    MAGIC_NORMAL,
    MIN_BLANK_LEN,
    EntryBatch,
    EntryHeader,
)
from commitlog.entry import INDEX_UNIT_SIZE as UNIT
from commitlog.errors import (
    AppendRejectedError,
    CommittedTruncateError,
    CorruptStoreError,
    EntryTooLargeError,
    IndexBelowBeginError,
    StoreClosedError,
    StoreLockedError,
)
from commitlog.reads import StoreReads
from commitlog.recovery import RecoveryReport, recover
from commitlog.segments import SegmentList, infer_segment_size, list_segment_files
from commitlog.watermark import Watermark
from native.entries import (
    F_BATCH,
    F_CHECK_CRC,
    PROBLEM,
    R_END,
    R_MAX,
    R_ROLL,
    S_CONSUMED,
    S_CRC_MODE,
    S_DETAIL,
    S_EXPECTED,
    S_LAST_TERM,
    S_NEXT_INDEX,
    S_POS,
    S_PREV_CHAIN,
    S_SEG_END,
    layout_fill,
    layout_plan,
    layout_seal,
    new_state,
    reason_text,
    scan_entries,
)

log = logging.getLogger("ledgermq.store")


@attrs.frozen(kw_only=True)
class AppendBatch:
    """What an append hook sees: the bytes of one leader append from
    `start` on, entry headers laid out (index, term, pos assigned), CRCs not
    yet computed, so the hook may still write into the bodies."""

    out: memoryview
    start: int  # log position of out[0]
    first_index: int
    term: int
    magic: int
    positions: array  # each entry's log position
    lens: array  # each entry's body length

    def entries(self):
        """(EntryHeader, writable body view) per entry, for per-entry hooks."""
        for i, (length, pos) in enumerate(zip(self.lens, self.positions)):
            at = pos - self.start + HEADER_SIZE
            yield (EntryHeader(self.magic, HEADER_SIZE + length, self.first_index + i, self.term, pos, 0, 0, 0,
                               length), self.out[at:at + length])


# A hook returns None, or one value per entry (an array aligned with the
# append's result: the broker's queue offsets), which append_stamped hands
# back with the positions so the appender learns them without reading the
# entries back.
AppendHook = Callable[[AppendBatch], "array | None"]
LOCK_FILE = "ledgermq.lock"
# Read maps keep the last RELEASE_KEEP bytes of the log resident; older
# pages are unmapped every RELEASE_STEP bytes written (_release_pages).
RELEASE_STEP = 32 << 20
RELEASE_KEEP = 16 << 20


def _positive(_inst, attr, value):
    if value <= 0:
        raise ValueError(f"{attr.name} must be positive, got {value}")


@attrs.frozen
class StoreConfig:
    """Where and how a store keeps its files.  Segment sizes apply to a new
    store; an existing one keeps the sizes its files were written with."""

    root: str  # storePathRootDir
    self_id: str = "n0"
    data_segment_size: int = attrs.field(default=1 << 30, validator=_positive)
    index_segment_size: int = attrs.field(default=32 * 5 * 1024 * 1024, validator=_positive)
    flush_disk_type: FlushDiskType = attrs.field(default=FlushDiskType.ASYNC_FLUSH,
                                                 validator=attrs.validators.instance_of(FlushDiskType))
    flush_interval_ms: int = attrs.field(default=10, validator=_positive)
    checkpoint_interval_ms: int = attrs.field(default=3000, validator=_positive)
    file_reserved_hours: float = 72
    disk_max_used_ratio: float = 0.75
    repair: bool = False

    def __attrs_post_init__(self):
        if self.data_segment_size >= 1 << 31:
            raise ValueError("data_segment_size must stay below 2 GiB (entry sizes are 32-bit)")
        if self.index_segment_size % UNIT:
            raise ValueError(f"index_segment_size must be a multiple of {UNIT}")
        if self.data_segment_size <= HEADER_SIZE + MIN_BLANK_LEN:
            raise ValueError("data_segment_size too small for a single entry")

    @property
    def store_dir(self) -> str:
        return os.path.join(self.root, f"dledger-{self.self_id}")


def data_segment_size_of(cfg: StoreConfig) -> int:
    """The data segment size of the store `cfg` names, without opening it:
    what its files were written with, else the configured size (a new
    store).  An existing store always keeps its own size."""
    data_dir = os.path.join(cfg.store_dir, "data")
    files = list_segment_files(data_dir) if os.path.isdir(data_dir) else []
    return infer_segment_size(files, cfg.data_segment_size)


@attrs.define(eq=False)
class SegmentedStore(StoreReads, StoreDurability):
    cfg: StoreConfig
    data: SegmentList
    index: SegmentList
    recovery: RecoveryReport
    _begin: int
    _end: int
    _end_term: int
    _end_pos: int
    _end_chain: int
    _crc_mode: bool
    _committed: int
    _base: metafiles.StoreBase | None
    _lock_fd: int
    _hooks: list[AppendHook] = attrs.field(factory=list)
    # Callables returning the lowest index their owner still needs on disk
    # (the metadata snapshot's applied index, a slow consumer, ...).
    _retention_floors: list = attrs.field(factory=list)
    _flushed_end: int = -1
    # The highest end index known on disk.  Monotonic: after truncate_from it
    # may exceed end_index until the log grows past it again.
    flushed_watermark: Watermark = attrs.field(factory=Watermark)
    flush_count: int = 0  # completed flushes that had something to sync
    _unflushed: bool = False
    _checkpointed: tuple[int, int] = (-2, -2)
    _flush_lock: threading.Lock = attrs.field(factory=threading.Lock)
    _activity: trio.Event | None = None
    # Set on every write when a flusher thread waits on it (commitlog/flusher.py).
    flush_wanted: threading.Event | None = None
    _closed: bool = False
    # The last read_batch result, keyed by its arguments and end_index: the
    # leader reads the same range once per follower.  Dropped whenever
    # entries change under an unchanged end (truncate, reset, retention).
    _last_batch: tuple | None = None
    # The last leader append's entries as written -- (first index, their
    # positions, body lengths, the position the bytes start at, the bytes,
    # term) -- from which read_batch ships them without reading back what
    # this process has just sealed.  Dropped with _last_batch.
    _fresh: tuple | None = None
    _released_at: int = 0  # _end_pos at the last _release_pages()

    # --- lifecycle -----------------------------------------------------------

    @classmethod
    def open(cls, cfg: StoreConfig) -> "SegmentedStore":
        """Open (creating if needed) and recover the store; raises
        CorruptStoreError on damage in the middle of the log unless
        cfg.repair."""
        store_dir = cfg.store_dir
        data_dir, index_dir = os.path.join(store_dir, "data"), os.path.join(store_dir, "index")
        for d in (cfg.root, store_dir, data_dir, index_dir):
            if not os.path.isdir(d):
                os.makedirs(d, exist_ok=True)
                fsync_dir(os.path.dirname(os.path.abspath(d)))
        lock_fd = os.open(os.path.join(store_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise StoreLockedError(store_dir) from None
        data = index = None
        try:
            data_size = infer_segment_size(list_segment_files(data_dir), cfg.data_segment_size)
            index_size = infer_segment_size(list_segment_files(index_dir), cfg.index_segment_size)
            if index_size % UNIT:
                raise CorruptStoreError(index_dir, 0, f"index segment size {index_size} is not a multiple of {UNIT}")
            data = SegmentList.load(data_dir, data_size)
            index = SegmentList.load(index_dir, index_size)
            rec = recover(store_dir, data, index, repair=cfg.repair)
        except BaseException:
            for sl in (data, index):
                if sl is not None:
                    sl.close()
            os.close(lock_fd)
            raise
        store = cls(cfg, data, index, rec.report, rec.begin_index, rec.end_index, rec.end_term,
                    rec.end_pos, rec.end_chain_crc, rec.crc_mode, rec.committed_index, rec.base, lock_fd)
        store._flushed_end = rec.end_index
        store.flushed_watermark.advance(rec.end_index)
        return store

    def close(self) -> None:
        """Flush, write the checkpoint and release the files."""
        if self._closed:
            return
        try:
            self.flush()
            try:
                self.write_checkpoint()
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                # A full disk: the last checkpoint stands (it only bounds
                # where recovery starts scanning).
                log.error("%s: final checkpoint skipped: %s", self.store_dir, exc)
        finally:
            self._closed = True
            self._note_activity()  # a flusher still waiting wakes up and returns
            self.data.close()
            self.index.close()
            os.close(self._lock_fd)

    def __enter__(self) -> "SegmentedStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(self.cfg.store_dir)

    # --- state ---------------------------------------------------------------

    @property
    def store_dir(self) -> str:
        return self.cfg.store_dir

    @property
    def begin_index(self) -> int:
        """First readable index; -1 for a fresh empty store.  After
        reset_to(B) or a truncation of every entry it is B even while the
        log is empty (then begin_index == end_index + 1)."""
        return self._begin

    @property
    def end_index(self) -> int:
        return self._end

    @property
    def end_term(self) -> int:
        return self._end_term

    @property
    def end_pos(self) -> int:
        """The data position where the next entry would be written (before
        the blank rule is applied)."""
        return self._end_pos

    @property
    def end_chain_crc(self) -> int:
        return self._end_chain

    @property
    def committed_index(self) -> int:
        return self._committed

    @property
    def flushed_index(self) -> int:
        """The end index covered by the last completed flush."""
        return self._flushed_end

    @property
    def data_segment_size(self) -> int:
        return self.data.seg_size

    @property
    def index_segment_size(self) -> int:
        return self.index.seg_size

    @property
    def sync_flush(self) -> bool:
        """SYNC_FLUSH: whoever acknowledges appends must flush() first
        (appends never flush by themselves, so a shell can group-commit)."""
        return self.cfg.flush_disk_type is FlushDiskType.SYNC_FLUSH

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def has_unflushed(self) -> bool:
        return self._unflushed

    @property
    def checkpoint_stale(self) -> bool:
        return (self._flushed_end, self._committed) != self._checkpointed

    def _seg_end(self, pos: int) -> int:
        return self.data.aligned_start(pos) + self.data.seg_size

    # --- leader append -------------------------------------------------------

    def add_retention_floor(self, fn) -> None:
        """Retention never deletes an entry at or above fn() (called at each
        retention pass)."""
        self._retention_floors.append(fn)

    def retention_floor(self) -> int | None:
        floors = [f() for f in self._retention_floors]
        return min(floors) if floors else None

    def add_append_hook(self, fn: AppendHook) -> None:
        """Run fn(AppendBatch) on every leader append, after index/term/pos
        are assigned and before CRCs are computed and bytes are written (the
        broker writes QUEUEOFFSET and PHYSICALOFFSET = pos + 48 here)."""
        self._hooks.append(fn)

    def remove_append_hook(self, fn: AppendHook) -> None:
        self._hooks.remove(fn)

    def append_leader(self, bodies: Sequence, term: int, magic: int = MAGIC_NORMAL) -> list[tuple[int, int]]:
        """Append one entry per body; returns (index, pos) per body."""
        return self.append_stamped(bodies, term, magic)[0]

    def append_stamped(self, bodies: Sequence, term: int, magic: int = MAGIC_NORMAL) \
            -> tuple[list[tuple[int, int]], array | None]:
        """append_leader, and what the append hooks returned for it (one
        value per entry, or None).  One native layout, one native seal,
        one pwrite per segment touched."""
        self._check_open()
        if magic not in (MAGIC_NORMAL, MAGIC_NOOP, MAGIC_CONFIG_CHANGE):
            raise ValueError(f"leader appends NORMAL, NOOP or CONFIG_CHANGE entries, not magic {magic}")
        if term < max(self._end_term, 0):
            raise AppendRejectedError(f"term {term} is below the log's last term {self._end_term}")
        n = len(bodies)
        if n == 0:
            return [], None
        lens = array("q", map(len, bodies))
        positions = array("q", bytes(8 * n))
        start = self._end_pos
        end = layout_plan(lens, start, self._seg_end(start), self.data.seg_size, positions)
        if end < 0:
            raise EntryTooLargeError(HEADER_SIZE + lens[-1 - end], self.data.seg_size - MIN_BLANK_LEN)
        first = self._end + 1
        out = bytearray(end - start)
        layout_fill(out, b"".join(bodies), lens, positions, start, first, term, magic)
        stamps = None
        if self._hooks:
            batch = AppendBatch(out=memoryview(out), start=start, first_index=first, term=term, magic=magic,
                                positions=positions, lens=lens)
            for hook in self._hooks:
                got = hook(batch)
                if got is not None:
                    stamps = got
        units = bytearray(UNIT * n)
        chain = layout_seal(out, positions, start, self._end_chain, True, units)
        self._write(start, out, first, units)
        self._advance(first + n - 1, term, end, chain, True)
        self._fresh = (first, positions, lens, start, out, term)
        return list(zip(range(first, first + n), positions)), stamps


    def _write(self, pos: int, data, first_index: int, units) -> None:
        """Data first, then index units; on failure zero what was written so
        the invariants hold, and re-raise."""
        try:
            self.data.write_span(pos, data)
            self.index.write_span(first_index * UNIT, units)
        except BaseException:
            self.data.zero_from(self._end_pos)
            self.index.zero_from((self._end + 1) * UNIT)
            raise

    def _advance(self, end: int, term: int, end_pos: int, chain: int, crc_mode: bool) -> None:
        if self._begin < 0 or self._begin > self._end:
            self._begin = self._end + 1
        self._end, self._end_term, self._end_pos = end, term, end_pos
        self._end_chain, self._crc_mode = chain, crc_mode
        self._unflushed = True
        wanted = self.flush_wanted
        if wanted is not None and not wanted.is_set():  # (set: the flusher flushes this write too)
            wanted.set()
        if end_pos >= self._released_at + RELEASE_STEP:
            self._release_pages()
        self._note_activity()

    def _release_pages(self) -> None:
        """Every RELEASE_STEP bytes written, unmap the read maps' pages
        more than RELEASE_KEEP behind the end (readers of older entries
        fault them back in from the page cache): without this the RSS of a
        broker grows with every segment byte replication and pulls read."""
        self._released_at = self._end_pos
        data_keep = self._end_pos - RELEASE_KEEP
        index_keep = (self._end + 1 - RELEASE_KEEP // 1024) * UNIT
        for sl, keep in ((self.data, data_keep), (self.index, index_keep)):
            for seg in sl.segments:
                if seg.start >= keep:
                    break
                seg.release_below(keep - seg.start)

    # --- follower append -----------------------------------------------------

    def append_follower(self, batch: EntryBatch) -> None:
        """Append entries built by the leader, verifying that they continue
        this log: index == end+1, terms nondecreasing, pos == the write
        position (or the next segment start, after which the blank filler is
        written here too), CRCs and the chain when present.  Nothing is
        written unless the whole batch verifies."""
        self._check_open()
        if batch.count <= 0:
            raise AppendRejectedError("empty batch")
        if batch.first_index != self._end + 1:
            raise AppendRejectedError(f"batch starts at index {batch.first_index}, log ends at {self._end}")
        raw = memoryview(batch.raw).cast("B")
        seg_size = self.data.seg_size
        st = new_state(next_index=batch.first_index, last_term=self._end_term, pos=self._end_pos,
                       seg_end=self._seg_end(self._end_pos), seg_size=seg_size,
                       prev_chain=self._end_chain, crc_mode=self._crc_mode)
        units = bytearray(UNIT * batch.count)
        pieces: list[tuple[int, object]] = []  # (position, bytes-like), in address order
        off = 0
        while True:
            at = st[S_POS]
            r = scan_entries(raw[off:], F_BATCH | F_CHECK_CRC, batch.count - (st[S_NEXT_INDEX] - batch.first_index),
                             st, memoryview(units)[(st[S_NEXT_INDEX] - batch.first_index) * UNIT:])
            if st[S_CONSUMED]:
                pieces.append((at, raw[off:off + st[S_CONSUMED]]))
                off += st[S_CONSUMED]
            if r == R_ROLL:
                remaining = st[S_SEG_END] - st[S_POS]
                pieces.append((st[S_POS], BLANK.pack(-1, remaining) + bytes(remaining - MIN_BLANK_LEN)))
                st[S_POS], st[S_SEG_END] = st[S_SEG_END], st[S_SEG_END] + seg_size
                continue
            if r >= PROBLEM:
                raise AppendRejectedError(f"entry {st[S_NEXT_INDEX]} (batch offset {off}): "
                                          + reason_text(r, st[S_DETAIL], st[S_EXPECTED]))
            break
        accepted = st[S_NEXT_INDEX] - batch.first_index
        if r not in (R_END, R_MAX) or accepted != batch.count or off != len(raw):
            raise AppendRejectedError(f"batch claims {batch.count} entries in {len(raw)} bytes; "
                                      f"{accepted} entries in {off} bytes verified")
        if batch.term_runs and batch.last_term != st[S_LAST_TERM]:
            raise AppendRejectedError(f"batch term runs end in term {batch.last_term}, entries in {st[S_LAST_TERM]}")
        if batch.count > 1 and MAGIC_CONFIG_CHANGE in units[3::UNIT]:  # each unit's magic, low byte
            raise AppendRejectedError("a configuration entry inside a larger batch (they travel alone)")
        try:
            self._write_pieces(pieces)
            self.index.write_span(batch.first_index * UNIT, units)
        except BaseException:
            self.data.zero_from(self._end_pos)
            self.index.zero_from((self._end + 1) * UNIT)
            raise
        self._advance(batch.last_index, st[S_LAST_TERM], st[S_POS], st[S_PREV_CHAIN], bool(st[S_CRC_MODE]))

    def _write_pieces(self, pieces: list[tuple[int, object]]) -> None:
        """Write address-ordered, contiguous pieces with one pwritev per
        segment (a piece never crosses a segment boundary)."""
        group: list = []
        group_pos = group_end = -1
        for at, piece in pieces + [(-1, b"")]:
            if group and (at != group_end or self.data.aligned_start(at) != self.data.aligned_start(group_pos)):
                seg = self.data.get_or_create(group_pos)
                seg.write(group, group_pos - seg.start)
                group = []
            if at < 0:
                break
            if not group:
                group_pos = group_end = at
            group.append(piece)
            group_end += memoryview(piece).nbytes

    # --- truncation and reset ------------------------------------------------

    def truncate_from(self, index: int) -> None:
        """Drop entries index..end (a follower whose tail diverged from the
        leader).  The freed bytes become zero, exactly as if never written,
        including a blank filler that entry `index` had caused."""
        self._check_open()
        if index > self._end:
            return
        if index < 0 or (self._begin >= 0 and index < self._begin):
            raise IndexBelowBeginError(index, max(self._begin, 0))
        if index <= self._committed:
            raise CommittedTruncateError(index, self._committed)
        self._last_batch = self._fresh = None
        if index > self._begin:
            h = self._header(index - 1)[0]
            new_pos, term, chain, crc_mode = h.pos + h.size, h.term, h.chain_crc, h.has_crc
        else:  # the log becomes empty; record where it continues
            new_pos = self._unit(index)[1]
            term, chain = self._boundary(index - 1) or (-1, 0)  # unknown only below a stock log
            crc_mode = chain != 0
            self._base = metafiles.StoreBase(index=index, pos=new_pos, prev_term=term, prev_chain_crc=chain)
            metafiles.write_base(self.store_dir, self._base)
        self.flush()  # whatever was written before becomes durable first
        for sl, off in ((self.data, new_pos), (self.index, index * UNIT)):
            sl.zero_from(off)
            for seg in sl.dirty_segments():
                os.fsync(seg.fd())  # fsync, not fdatasync: the truncate changed block maps
                seg.dirty = False
        self._end, self._end_term, self._end_pos = index - 1, term, new_pos
        self._end_chain, self._crc_mode = chain, crc_mode
        self._flushed_end = min(self._flushed_end, self._end)
        self._note_activity()

    def reset_to(self, begin_index: int, begin_pos: int, prev_term: int, prev_chain_crc: int) -> None:
        """Forget every entry and continue at (begin_index, begin_pos): for a
        follower whose next entry the leader already deleted by retention.

        Naming rule: the next data segment is the one the leader has, named
        by its aligned start (begin_pos rounded down to the segment size), so
        segment boundaries and blank fillers stay identical across replicas;
        the bytes before begin_pos in it stay zero.  The index segment is
        likewise aligned.  Because such a segment does not start with an
        entry, (begin_index, begin_pos, prev_term, prev_chain_crc) is
        recorded in `ledgermq-base` next to the checkpoint; recovery and the
        offline tools start that segment's scan at begin_pos.  Stock DLedger
        cannot read a store in this state until retention removes that
        segment."""
        self._check_open()
        if begin_index < 0 or begin_pos < 0:
            raise ValueError("reset_to needs a non-negative index and position")
        if self._seg_end(begin_pos) - begin_pos < MIN_BLANK_LEN:
            raise ValueError(f"position {begin_pos} leaves no room for a blank filler in its segment")
        self.flush()
        self._last_batch = self._fresh = None
        self.data.remove_all()
        self.index.remove_all()
        self._base = metafiles.StoreBase(index=begin_index, pos=begin_pos, prev_term=prev_term,
                                         prev_chain_crc=prev_chain_crc & 0xFFFFFFFF)
        metafiles.write_base(self.store_dir, self._base)
        self._begin, self._end, self._end_term, self._end_pos = begin_index, begin_index - 1, prev_term, begin_pos
        self._end_chain, self._crc_mode = prev_chain_crc & 0xFFFFFFFF, prev_chain_crc != 0
        self._committed = self._flushed_end = begin_index - 1
        self.write_checkpoint()

    # --- commit, flush, checkpoint ---------------------------------------------

    def set_committed(self, index: int) -> None:
        """Raise the committed index (clamped to end_index; never lowered).
        Persisted by the next checkpoint."""
        index = min(index, self._end)
        if index > self._committed:
            self._committed = index
            self._note_activity()

    # --- retention -----------------------------------------------------------

    def delete_expired(self, now_ms: int, disk_used_ratio: float | None = None) -> list[str]:
        """Delete whole expired data segments; see commitlog.retention."""
        from commitlog.retention import delete_expired

        self._check_open()
        return delete_expired(self, now_ms, disk_used_ratio)

    def _set_boundary(self, base: metafiles.StoreBase) -> None:
        """Retention records the new boundary (durably) before deleting."""
        metafiles.write_base(self.store_dir, base)
        self._base = base

    def _retention_done(self, begin_index: int) -> None:
        """Called by retention after it deleted leading segments."""
        self._begin = begin_index
        self._last_batch = self._fresh = None
