# Owns the read-only view of a DLedger store directory for offline tools
# (mqadmin verifyStore/dumpStore, and later the consume-queue rebuild and the
# pipeline): walk every entry, check everything recovery checks, and report
# problems as {file, offset, reason} instead of raising.  Nothing here
# writes, creates or deletes a file.
#
# Segment sizes come from the files themselves (name spacing and length),
# so stores written with other settings, by us or by stock DLedger, read the
# same way.  Entries are checked natively a chunk at a time; per-entry Python
# runs only when a caller iterates entries or passes a body checker.
import os
from collections.abc import Callable, Iterator

import attrs

from commitlog.entry import HEADER, INDEX_UNIT, MAGIC_NORMAL, EntryHeader
from commitlog.entry import INDEX_UNIT_SIZE as UNIT
from commitlog.errors import CommitLogError, NotAStoreError
from commitlog.metafiles import read_base, read_checkpoint
from commitlog.segments import Segment, SegmentList, infer_segment_size, list_segment_files, tail_is_zero
from native.entries import (
    F_CHECK_CRC,
    F_SEGMENT,
    R_BLANK,
    R_END,
    R_MAX,
    R_SHORT,
    S_COUNT,
    S_DETAIL,
    S_EXPECTED,
    S_NEXT_INDEX,
    S_POS,
    S_SEG_END,
    first_diff,
    new_state,
    reason_text,
    scan_entries,
)

CHUNK = 1 << 16
MAX_INDEX_PROBLEMS = 20  # per walk; the rest are counted in one summary problem

BodyChecker = Callable[[EntryHeader, memoryview], "str | None"]


@attrs.frozen
class Problem:
    file: str
    offset: int
    reason: str

    def as_dict(self) -> dict:
        return {"file": self.file, "offset": self.offset, "reason": self.reason}


@attrs.define
class StoreSummary:
    store_dir: str
    entries: int = 0
    first_index: int = -1
    last_index: int = -1
    committed_index: int = -1
    checkpoint_end_index: int = -1
    segments: int = 0
    index_segments: int = 0
    data_segment_size: int = 0
    index_segment_size: int = 0
    problems: list[Problem] = attrs.field(factory=list)

    def as_dict(self) -> dict:
        return {
            "store": self.store_dir, "entries": self.entries, "firstIndex": self.first_index,
            "lastIndex": self.last_index, "committedIndex": self.committed_index,
            "checkpointEndIndex": self.checkpoint_end_index, "segments": self.segments,
            "indexSegments": self.index_segments, "dataSegmentSize": self.data_segment_size,
            "indexSegmentSize": self.index_segment_size,
            "problems": [p.as_dict() for p in self.problems],
        }


def resolve_store_dir(root: str, self_id: str | None = None) -> str:
    """The `dledger-<id>` directory for a storePathRootDir (or that directory
    itself).  Raises NotAStoreError, or ValueError when the choice is
    ambiguous (several stores and no self id)."""
    if not os.path.isdir(root):
        raise NotAStoreError(f"{root}: no such directory")
    if self_id is not None:
        path = os.path.join(root, f"dledger-{self_id}")
        if not os.path.isdir(os.path.join(path, "data")):
            raise NotAStoreError(f"{path}: no DLedger store for self id {self_id!r} (no data/ directory)")
        return path
    if os.path.isdir(os.path.join(root, "data")):
        return root
    found = sorted(d for d in os.listdir(root)
                   if d.startswith("dledger-") and os.path.isdir(os.path.join(root, d, "data")))
    if not found:
        raise NotAStoreError(f"{root}: not a DLedger store (no dledger-<id>/data directory)")
    if len(found) > 1:
        raise ValueError(f"{root} holds several stores ({', '.join(found)}); choose one with --self-id")
    return os.path.join(root, found[0])


@attrs.define
class _Chunk:
    """Up to CHUNK consecutive entries of one segment that verified."""

    seg: Segment
    first_index: int
    count: int
    units: memoryview  # count index units, as the data says they must be


@attrs.define(eq=False)
class StoreReader:
    store_dir: str
    data: SegmentList
    index: SegmentList
    problems: list[Problem]
    check_crc: bool = True
    _index_problems: int = 0

    @classmethod
    def open(cls, store_dir: str, problems: list[Problem] | None = None, *, check_crc: bool = True) -> "StoreReader":
        data_dir, index_dir = os.path.join(store_dir, "data"), os.path.join(store_dir, "index")
        if not os.path.isdir(data_dir):
            raise NotAStoreError(f"{store_dir}: not a DLedger store (no data/ directory)")
        problems = [] if problems is None else problems
        data_files = list_segment_files(data_dir)
        index_files = list_segment_files(index_dir) if os.path.isdir(index_dir) else []
        data_size = infer_segment_size(data_files) or 0
        index_size = infer_segment_size(index_files) or 32 * 5 * 1024 * 1024
        if index_size % UNIT:
            problems.append(Problem(index_dir, 0, f"index segment size {index_size} is not a multiple of {UNIT}"))
            index_size -= index_size % UNIT
        data = SegmentList.load(data_dir, max(data_size, 1), readonly=True)
        index = SegmentList.load(index_dir, index_size, readonly=True) if index_files else \
            SegmentList(index_dir, index_size, readonly=True)
        return cls(store_dir, data, index, problems, check_crc)

    def close(self) -> None:
        self.data.close()
        self.index.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _problem(self, file: str, offset: int, reason: str) -> None:
        self.problems.append(Problem(file, offset, reason))

    # --- layout ----------------------------------------------------------------

    def _check_files(self) -> None:
        for sl, kind in ((self.data, "data"), (self.index, "index")):
            for seg in sl.segments:
                length = seg.file_length()
                if seg.start % sl.seg_size:
                    self._problem(seg.path, 0, f"{kind} file name is not a multiple of the segment size {sl.seg_size}")
                if length < sl.seg_size:
                    self._problem(seg.path, length, f"{kind} file is {length} bytes, shorter than the segment size "
                                                    f"{sl.seg_size} (truncated)")
                elif length > sl.seg_size:
                    self._problem(seg.path, sl.seg_size, f"{kind} file is {length} bytes, longer than the segment "
                                                         f"size {sl.seg_size}")
        for a, b in zip(self.data.segments, self.data.segments[1:]):
            if b.start != a.end:
                self._problem(b.path, 0, f"data segment(s) missing between {a.name} and this file")

    # --- index units -------------------------------------------------------------

    def _check_units(self, first: int, units: memoryview) -> None:
        done, off = 0, first * UNIT
        while done < len(units):
            at = off + done
            seg = self.index.find(at)
            limit = (seg.end if seg else self.index.aligned_start(at) + self.index.seg_size) - at
            piece = units[done:done + min(len(units) - done, limit)]
            done += len(piece)
            if seg is None:
                i0, i1 = at // UNIT, (at + len(piece)) // UNIT - 1
                self._index_problem(os.path.join(self.index.directory, f"{self.index.aligned_start(at):020d}"), 0,
                                    f"index segment missing (entries {i0}..{i1} have no index units)")
                continue
            view = seg.view()
            stored = view[at - seg.start:at - seg.start + len(piece)]
            if len(stored) < len(piece):
                piece = piece[:len(stored) // UNIT * UNIT]
                stored = stored[:len(piece)]
            base = 0
            while base < len(piece):
                d = first_diff(stored[base:], piece[base:])
                if d < 0:
                    break
                u = (base + d) // UNIT * UNIT
                i = (at + u) // UNIT
                got = bytes(stored[u:u + UNIT])
                want = bytes(piece[u:u + UNIT])
                self._index_problem(seg.path, at - seg.start + u,
                                    f"index unit for entry {i} disagrees with the data "
                                    f"(stored {got.hex()}, data says {want.hex()})")
                base = u + UNIT

    def _index_problem(self, file: str, offset: int, reason: str) -> None:
        self._index_problems += 1
        if self._index_problems <= MAX_INDEX_PROBLEMS:
            self._problem(file, offset, reason)

    def _check_index_tail(self, last_index: int) -> None:
        off = (last_index + 1) * UNIT
        for seg in self.index.segments:
            if seg.end <= off:
                continue
            at = max(0, off - seg.start)
            if not tail_is_zero(seg.fd(), seg.view(), at):
                self._problem(seg.path, at, f"index units after the last entry ({last_index}); recovery removes them")
                return

    # --- the walk ----------------------------------------------------------------

    def chunks(self, from_index: int | None = None) -> Iterator[_Chunk]:
        """Verified entries chunk by chunk; problems go to self.problems."""
        segs = self.data.segments
        if from_index is None:
            self._check_files()
        base = read_base(self.store_dir)
        if base is not None and not (segs and segs[0].start == self.data.aligned_start(base.pos)):
            base = None
        units = bytearray(UNIT * CHUNK)
        flags = F_SEGMENT | (F_CHECK_CRC if self.check_crc else 0)
        st = None
        k0, start = 0, None
        if from_index is not None:
            start = self._locate(from_index)
            if start is not None:
                k0 = segs.index(start[0])
        last_index = None
        stopped_at = None  # (segment, offset) where the previous segment stopped without a blank
        for k in range(k0, len(segs)):
            seg = segs[k]
            if st is None or stopped_at is not None:
                if start is not None and k == k0:
                    st = new_state(next_index=from_index, pos=start[1], seg_end=seg.end,
                                   seg_size=self.data.seg_size, chain_known=False)
                elif k == 0 and base is not None:
                    st = new_state(next_index=base.index, last_term=base.prev_term, pos=base.pos, seg_end=seg.end,
                                   seg_size=self.data.seg_size, prev_chain=base.prev_chain_crc)
                else:
                    st = new_state(pos=seg.start, seg_end=seg.end, seg_size=self.data.seg_size, chain_known=False)
            else:
                st[S_POS] = seg.start
                st[S_SEG_END] = seg.end
            view = seg.view()
            resumed = stopped_at
            stopped_at = None
            while True:
                pos = st[S_POS]
                r = scan_entries(view[pos - seg.start:], flags, CHUNK, st, units)
                n = st[S_COUNT]
                if n:
                    first = st[S_NEXT_INDEX] - n
                    if resumed is not None:
                        rseg, roff = resumed
                        if last_index is not None and first != last_index + 1:
                            gap = f"entries {last_index + 1}..{first - 1} are missing" if first > last_index + 1 \
                                else f"index goes back from {last_index} to {first}"
                            self._problem(seg.path, 0, gap)
                        elif rseg is not None:
                            self._problem(rseg.path, roff, f"the log stops here without a blank filler but "
                                                           f"continues in {seg.name}")
                        resumed = None
                    chunk = _Chunk(seg, first, n, memoryview(units)[:n * UNIT])
                    self._check_units(first, chunk.units)
                    yield chunk
                    last_index = st[S_NEXT_INDEX] - 1
                if r != R_MAX:
                    break
            at = st[S_POS] - seg.start
            if r == R_BLANK:
                continue
            stopped_at = (seg, at) if r in (R_END, R_SHORT) else (None, 0)
            if r == R_END:
                if not tail_is_zero(seg.fd(), view, at):
                    self._problem(seg.path, at, "non-zero bytes after the end of the log (a torn write; "
                                                "recovery cuts it)")
            elif r != R_SHORT:
                where = f"entry {st[S_NEXT_INDEX]}: " if st[S_NEXT_INDEX] >= 0 else ""
                self._problem(seg.path, at, where + reason_text(r, st[S_DETAIL], st[S_EXPECTED]))
        if last_index is not None and from_index is None:
            if self._index_problems > MAX_INDEX_PROBLEMS:
                self._problem(self.index.directory, 0,
                              f"{self._index_problems - MAX_INDEX_PROBLEMS} more index units disagree with the data")
            self._check_index_tail(last_index)

    def _locate(self, index: int):
        """(segment, pos) of entry `index` when its index unit and the data
        agree; None otherwise."""
        seg = self.index.find(index * UNIT)
        if seg is None:
            return None
        view = seg.view()
        at = index * UNIT - seg.start
        if at + UNIT > len(view):
            return None
        magic, pos, size, idx, term = INDEX_UNIT.unpack_from(view, at)
        dseg = self.data.find(pos)
        if idx != index or dseg is None:
            return None
        dview = dseg.view()
        if pos - dseg.start + 48 > len(dview):
            return None
        h = HEADER.unpack_from(dview, pos - dseg.start)
        if (h[0], h[1], h[2], h[3], h[4]) != (magic, size, index, term, pos):
            return None
        return dseg, pos

    def entries(self, from_index: int | None = None) -> Iterator[tuple[EntryHeader, memoryview, str, int]]:
        """(header, body view, data file, offset in file) per verified entry."""
        for chunk in self.chunks(from_index):
            seg = chunk.seg
            view = seg.view()
            for i in range(chunk.count):
                pos = int.from_bytes(chunk.units[i * UNIT + 4:i * UNIT + 12], "big")
                at = pos - seg.start
                h = EntryHeader(*HEADER.unpack_from(view, at))
                if from_index is not None and h.index < from_index:
                    continue
                yield h, view[at + 48:at + h.size], seg.path, at


def walk_store(store_dir: str, problems: list[Problem] | None = None, *, from_index: int | None = None,
               check_crc: bool = True) -> Iterator[tuple[EntryHeader, memoryview, str, int]]:
    """Every verified entry of the store at `store_dir` (a dledger-<id>
    directory) as (header, body view, data file, offset); problems found on
    the way are appended to `problems`."""
    reader = StoreReader.open(store_dir, problems, check_crc=check_crc)
    try:
        yield from reader.entries(from_index)
    finally:
        reader.close()


def verify_store(store_dir: str, body_checker: BodyChecker | None = None) -> StoreSummary:
    """Walk and check the whole store; `body_checker(header, body)` may
    return a reason string for a bad NORMAL entry body (the RocketMQ message
    check plugs in here)."""
    summary = StoreSummary(store_dir)
    reader = StoreReader.open(store_dir, summary.problems)
    try:
        summary.segments, summary.index_segments = len(reader.data), len(reader.index)
        summary.data_segment_size = reader.data.seg_size if len(reader.data) else 0
        summary.index_segment_size = reader.index.seg_size if len(reader.index) else 0
        try:
            summary.checkpoint_end_index, summary.committed_index = read_checkpoint(store_dir)
        except CommitLogError as exc:
            summary.problems.append(Problem(os.path.join(store_dir, "checkpoint"), 0, str(exc)))
        for chunk in reader.chunks():
            if summary.entries == 0:
                summary.first_index = chunk.first_index
            summary.entries += chunk.count
            summary.last_index = chunk.first_index + chunk.count - 1
            if body_checker is None:
                continue  # no per-entry Python on the plain verify path
            view = chunk.seg.view()
            for i in range(chunk.count):
                u = chunk.units[i * UNIT:(i + 1) * UNIT]
                at = int.from_bytes(u[4:12], "big") - chunk.seg.start
                if int.from_bytes(u[0:4], "big") == MAGIC_NORMAL:
                    h = EntryHeader(*HEADER.unpack_from(view, at))
                    try:
                        reason = body_checker(h, view[at + 48:at + h.size])
                    except Exception as exc:  # a checker bug must not hide the rest of the report
                        reason = f"body check raised {type(exc).__name__}: {exc}"
                    if reason:
                        summary.problems.append(Problem(chunk.seg.path, at, f"entry {h.index}: {reason}"))
    finally:
        reader.close()
    return summary
