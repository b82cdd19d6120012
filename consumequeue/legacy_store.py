# Owns reading a plain (master-slave) RocketMQ store, read-only: the
# groundwork of migrating a master-slave broker onto ledgermq.
#
# ${root}/commitlog/ holds fixed-size segments named by their 20-digit start
# offset, message records back to back and, where the next record does not
# fit, the 8-byte BLANK (i32 remaining, i32 0xCBD43194) closing the segment
# (spec §1.7).  The segment size is inferred from the files (RocketMQ
# creates each at full size).  recover() finds the valid end as
# CommitLog.recoverNormally/Abnormally do (checkMessageAndReturnSize): a
# record counts while its magic is a message magic, its TOTALSIZE equals the
# length its fields add up to and its BODYCRC verifies; a BLANK moves on to
# the next segment; anything else (zeroes, garbage, a record running past
# its segment or the written data: a torn tail) ends the log there.
#
# Records are walked with the native dispatch scanner in its plain mode (one
# C call per batch).  Around the commitlog: the binary `checkpoint` (spec
# §4.1) and the `abort` flag a running or crashed broker leaves.
#
# index_coverage() says whether ${root}/index holds every message of the
# log a stock broker's index would (a message with a UNIQ_KEY or a KEYS
# token, not a transaction rollback): `migrate apply` keeps a complete
# index and rebuilds any other (missing, damaged, or with keyed messages
# outside what its files cover: before the first, between two, after the
# last).  The walk stops at the first keyed message outside the index, so
# a complete index costs a few records' reading.
#
# Also here: md5 of the last commitlog files (RocketMQ's pre-migration
# consistency check between a master and its slave, for plain and DLedger
# stores) and compare_commitlogs, the first record where two stores differ.
import hashlib
import os
from collections.abc import Iterator

import attrs

from commitlog.segments import infer_segment_size, list_segment_files
from consumequeue.checkpoint import StoreCheckpoint
from consumequeue.errors import InconsistentStateError
from consumequeue.indexfile import DEFAULT_INDEX_NUM, DEFAULT_SLOT_NUM, IndexService
from consumequeue.source import CommitlogSource
from native.dispatch import (
    ERR_TEXT,
    MODE_PLAIN,
    REC_CRC_BAD,
    REC_NO_INDEX,
    SCAN_CHECK_CRC,
    STOP_BLANK,
    STOP_CORRUPT,
    STOP_END,
    STOP_FULL,
    STOP_PARTIAL,
    STOP_ZERO,
    DispatchRecord,
    default_backend,
)

COMMITLOG_DIR = "commitlog"
ABORT_FILE = "abort"
BATCH_RECORDS = 4096
MD5_CHUNK = 1 << 20


class LegacyStoreError(ValueError):
    """Not a readable plain RocketMQ store (the files disagree)."""


@attrs.frozen(kw_only=True)
class Recovery:
    """Where a plain commitlog's valid data ends, and why."""

    begin: int  # start of the first segment
    end: int  # the valid end: the next write position
    records: int  # message records in [begin, end)
    stop: str  # "end" (clean: zeroes or the end of the last segment), "blank" (a BLANK
    # closing the last segment), "crc", "corrupt", "torn", "gap" (a segment is missing)
    reason: str = ""
    data_after: bool = False  # segments beyond the one holding `end` (recovery would drop them)

    @property
    def clean(self) -> bool:
        return self.stop in ("end", "blank")


@attrs.frozen
class IndexCoverage:
    """How much of a plain commitlog ${root}/index covers (index_coverage)."""

    state: str  # "complete", "missing" (no IndexFile, or none holds a key), "damaged", "incomplete"
    reason: str = ""  # why it is not complete
    files: int = 0
    begin_phy: int = -1  # the first file's beginPhyOffset (-1: no key indexed)
    end_phy: int = -1  # the last file's endPhyOffset

    @property
    def complete(self) -> bool:
        return self.state == "complete"

    def to_json(self) -> dict:
        return {"state": self.state, "reason": self.reason, "files": self.files, "beginPhyOffset": self.begin_phy,
                "endPhyOffset": self.end_phy}


def indexed_by_rocketmq(view, rec: DispatchRecord) -> bool:
    """Whether a stock broker's IndexService puts keys for this record: a
    UNIQ_KEY or a non-empty KEYS token, and not a transaction rollback."""
    if rec.flags & REC_NO_INDEX:
        return False
    return rec.uniq_len > 0 or any(bytes(view[rec.keys_off:rec.keys_off + rec.keys_len]).split(b" "))


class LegacyStore:
    """A plain RocketMQ store root (or its commitlog directory), read-only."""

    def __init__(self, root: str, *, segment_size: int | None = None, backend=None):
        root = os.path.abspath(root)
        if os.path.isdir(os.path.join(root, COMMITLOG_DIR)):
            self.root, self.commitlog_dir = root, os.path.join(root, COMMITLOG_DIR)
        elif os.path.isdir(root) and any(True for _ in list_segment_files(root)):
            self.root, self.commitlog_dir = os.path.dirname(root), root
        elif not os.path.exists(root):
            raise LegacyStoreError(f"{root}: no such directory")
        else:
            raise LegacyStoreError(f"{root}: no commitlog/ directory (not a plain RocketMQ store)")
        self.files = list_segment_files(self.commitlog_dir)
        self.segment_size = infer_segment_size(self.files, segment_size)
        self._check_layout()
        self.backend = backend or default_backend()
        self.source = CommitlogSource(self.commitlog_dir, segment_size=self.segment_size, mode=MODE_PLAIN)
        self._recovery: Recovery | None = None

    def _check_layout(self) -> None:
        size = self.segment_size
        for start, path, length in self.files:
            if start % size:
                raise LegacyStoreError(f"{path}: start {start} is not a multiple of the segment size {size}")
            if length > size:
                raise LegacyStoreError(f"{path}: {length} bytes, more than the segment size {size}")

    def __enter__(self) -> "LegacyStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.source.close()

    # --- the files around the commitlog ----------------------------------------

    @property
    def abort_present(self) -> bool:
        """The `abort` flag: the broker runs, or did not shut down cleanly
        (its recovery would then be the abnormal one)."""
        return os.path.exists(os.path.join(self.root, ABORT_FILE))

    def checkpoint(self) -> StoreCheckpoint | None:
        return StoreCheckpoint.load(self.root)

    # --- recovery ----------------------------------------------------------------

    @property
    def begin(self) -> int:
        return self.files[0][0] if self.files else 0

    def recover(self, *, check_crc: bool = True) -> Recovery:
        """Walk every record from the first segment to the valid end."""
        if not self.files:
            return Recovery(begin=0, end=0, records=0, stop="end")
        size = self.segment_size
        recs = self.backend.new_records(BATCH_RECORDS)
        options = SCAN_CHECK_CRC if check_crc else 0
        count = 0
        lengths = {start: length for start, _, length in self.files}
        last_start = self.files[-1][0]
        start = self.begin
        while True:
            length = lengths.get(start)
            if length is None:
                if start > last_start:
                    return Recovery(begin=self.begin, end=start, records=count, stop="end")
                return Recovery(begin=self.begin, end=start, records=count, stop="gap",
                                reason=f"segment {start:020d} is missing", data_after=True)
            off = 0
            view = self.source.view(start, start + length) if length else memoryview(b"")
            try:
                while True:
                    res = self.backend.scan(view[off:], start + off, recs, mode=MODE_PLAIN, options=options)
                    for i in range(res.n):
                        r = res.record(i)
                        if r.flags & REC_CRC_BAD:
                            return Recovery(begin=self.begin, end=r.phy_offset, records=count + i, stop="crc",
                                            reason=f"BODYCRC mismatch in the record at {r.phy_offset}",
                                            data_after=start < last_start)
                    count += res.n
                    at = start + off + res.consumed
                    if res.stop == STOP_FULL:
                        off += res.consumed
                        continue
                    if res.stop == STOP_BLANK:
                        if start == last_start:
                            return Recovery(begin=self.begin, end=at, records=count, stop="blank")
                        break
                    if res.stop == STOP_END and off + res.consumed == size:
                        break  # records fill the segment exactly
                    after = start < last_start
                    if res.stop in (STOP_END, STOP_ZERO):
                        # zeroes (or a short file) end the written data
                        return Recovery(begin=self.begin, end=at, records=count, stop="end" if not after else "corrupt",
                                        reason="" if not after else "zeroes inside the log", data_after=after)
                    bad = start + off + res.err_offset
                    if res.stop == STOP_PARTIAL:
                        return Recovery(begin=self.begin, end=bad, records=count, stop="torn",
                                        reason=f"the record at {bad} runs past its segment's data", data_after=after)
                    if res.stop == STOP_CORRUPT:
                        what = ERR_TEXT.get(res.err_code, f"error {res.err_code}")
                        return Recovery(begin=self.begin, end=bad, records=count,
                                        stop="torn" if not after else "corrupt",
                                        reason=f"{what} at {bad}", data_after=after)
                    raise AssertionError(f"unexpected scan stop {res.stop}")
            finally:
                view.release()
            start += size

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            self._recovery = self.recover()
        return self._recovery

    @property
    def end(self) -> int:
        return self.recovery.end

    # --- records -------------------------------------------------------------------

    def batches(self, begin: int | None = None, end: int | None = None, *, check_crc: bool = False):
        """(view, ScanResult) per scanned batch of records in [begin, end)
        (default: the recovered log); `begin` must be a record start.  The
        view and the result's records are valid until the next batch."""
        pos = self.begin if begin is None else begin
        end = self.end if end is None else end
        recs = self.backend.new_records(BATCH_RECORDS)
        options = SCAN_CHECK_CRC if check_crc else 0
        while pos < end:
            seg_start = pos - pos % self.segment_size
            view = self.source.view(pos, min(end, seg_start + self.segment_size))
            try:
                res = self.backend.scan(view, pos, recs, mode=MODE_PLAIN, options=options)
                if res.n:
                    yield view, res
                consumed = res.consumed
            finally:
                view.release()
            if res.stop == STOP_FULL:
                pos += consumed
            elif res.stop in (STOP_BLANK, STOP_END):
                pos = seg_start + self.segment_size
            else:
                raise LegacyStoreError(f"{self.commitlog_dir}: unreadable record at "
                                       f"{pos + res.err_offset} (inside the recovered log?)")

    def records(self, begin: int | None = None, end: int | None = None) -> Iterator[DispatchRecord]:
        """Every record's dispatch fields (position, size, topic hash, queue,
        queue offset, tags code, store time, ...), in log order."""
        for _, res in self.batches(begin, end):
            for i in range(res.n):
                yield res.record(i)

    def first_indexed(self, begin: int, end: int, *, after: int = -1) -> int | None:
        """Position of the first record in [begin, end) past `after` that a
        stock index holds (indexed_by_rocketmq), or None.  `begin` must be
        a record start (LegacyStoreError when it is not one)."""
        for view, res in self.batches(begin, end):
            for i in range(res.n):
                r = res.record(i)
                if r.phy_offset > after and indexed_by_rocketmq(view, r):
                    return r.phy_offset
        return None

    def index_coverage(self, end: int | None = None, *, slot_num: int = DEFAULT_SLOT_NUM,
                       index_num: int = DEFAULT_INDEX_NUM) -> IndexCoverage:
        """Whether ${root}/index (IndexFiles of slot_num slots and index_num
        items) holds every message of [begin, end) a stock broker's index
        would (see the module comment).  Read-only."""
        end = self.end if end is None else end
        try:
            svc = IndexService(self.root, slot_num=slot_num, index_num=index_num, readonly=True).load()
        except InconsistentStateError as exc:
            return IndexCoverage("damaged", f"an IndexFile is damaged: {exc.reason}")
        try:
            n = len(svc.files)
            used = [f.header for f in svc.files if f.header.index_count > 1]
        finally:
            svc.close()
        if not used:
            if end <= self.begin or self.first_indexed(self.begin, end) is None:
                return IndexCoverage("complete", "", n)  # nothing to index
            return IndexCoverage("missing", "the store has no IndexFile" if not n else
                                 f"its {n} IndexFile(s) hold no key", n)
        cov = {"files": n, "begin_phy": used[0].begin_phy_offset, "end_phy": used[-1].end_phy_offset}
        # The stretches no file covers: before the first, between two files
        # (one deleted), after the last; each (scan from, skip through, to).
        gaps = [(self.begin, -1, used[0].begin_phy_offset)]
        gaps += [(a.end_phy_offset, a.end_phy_offset, b.begin_phy_offset) for a, b in zip(used, used[1:])]
        gaps.append((used[-1].end_phy_offset, used[-1].end_phy_offset, end))
        for k, (start, skip, stop) in enumerate(gaps):
            where = ("before its first item" if k == 0 else "after its last item" if k == len(gaps) - 1
                     else f"between its items at {start} and {stop}")
            if start < self.begin:
                start, skip = self.begin, -1  # below the log (retention): nothing to miss there
            stop = min(stop, end)
            if start >= stop:
                continue
            try:
                at = self.first_indexed(start, stop, after=skip)
            except LegacyStoreError:
                return IndexCoverage("incomplete", f"the index names position {start}, which is not a record "
                                     f"of this commitlog", **cov)
            if at is not None:
                return IndexCoverage("incomplete", f"the index misses the message at {at} ({where})", **cov)
        return IndexCoverage("complete", "", **cov)

    def topic_of(self, view, rec: DispatchRecord) -> str:
        off = rec.topic_off
        return bytes(view[off:off + rec.topic_len]).decode("utf-8", "replace")

    def read(self, pos: int, size: int) -> bytes:
        return self.source.read(pos, size)


# --- md5 and comparison -------------------------------------------------------------

def commitlog_dir_of(root: str, self_id: str | None = None) -> str:
    """The segment directory of a store: ${root}/commitlog for a plain
    store, dledger-<id>/data for a DLedger one, or `root` itself when it
    holds the segments."""
    if os.path.isdir(os.path.join(root, COMMITLOG_DIR)) and self_id is None:
        return os.path.join(root, COMMITLOG_DIR)
    if os.path.isdir(root) and list_segment_files(root) and self_id is None:
        return root
    from commitlog.scan import resolve_store_dir
    return os.path.join(resolve_store_dir(root, self_id), "data")


@attrs.frozen
class FileDigest:
    name: str
    size: int
    md5: str


def md5_files(directory: str, last: int | None = None) -> list[FileDigest]:
    """md5 of each of the last `last` segment files (all when None)."""
    files = list_segment_files(directory)
    if last is not None:
        files = files[-last:] if last > 0 else []
    out = []
    for start, path, length in files:
        h = hashlib.md5()
        with open(path, "rb") as f:
            while chunk := f.read(MD5_CHUNK):
                h.update(chunk)
        out.append(FileDigest(os.path.basename(path), length, h.hexdigest()))
    return out


def _first_difference(a: bytes, b: bytes) -> int:
    """Index of the first differing byte of two equal-length, unequal buffers."""
    lo, hi = 0, len(a)  # the difference is in [lo, hi)
    while hi - lo > 64:
        mid = (lo + hi) // 2
        if a[lo:mid] != b[lo:mid]:
            hi = mid
        else:
            lo = mid
    return next(i for i in range(lo, hi) if a[i] != b[i])


def _as_store(x) -> tuple[LegacyStore, bool]:
    return (x, False) if isinstance(x, LegacyStore) else (LegacyStore(x), True)


def compare_commitlogs(a, b) -> int | None:
    """The commitlog offset of the first record (or BLANK) that is not the
    same in both plain stores (LegacyStore or root paths), over the range
    both hold validly (recovered, from the later first segment); None when
    they agree there (one may be ahead of the other: a lagging slave)."""
    sa, own_a = _as_store(a)
    sb, own_b = _as_store(b)
    try:
        if sa.files and sb.files and sa.segment_size != sb.segment_size:
            raise LegacyStoreError(f"segment sizes differ: {sa.segment_size} and {sb.segment_size}")
        lo, hi = max(sa.begin, sb.begin), min(sa.end, sb.end)
        size = sa.segment_size or sb.segment_size
        pos = lo
        while pos < hi:
            stop = min(hi, pos - pos % size + size, pos + MD5_CHUNK)
            x, y = sa.read(pos, stop - pos), sb.read(pos, stop - pos)
            if x != y:
                return _record_start(sa, pos + _first_difference(x, y))
            pos = stop
        return None
    finally:
        if own_a:
            sa.close()
        if own_b:
            sb.close()


def _record_start(store: LegacyStore, pos: int) -> int:
    """Start of the record holding `pos`, or of the filler after the
    segment's last record (the BLANK) when no record does."""
    seg = pos - pos % store.segment_size
    prev_end = max(seg, store.begin)
    for rec in store.records(prev_end, min(store.end, seg + store.segment_size)):
        if rec.phy_offset > pos:
            break
        if pos < rec.phy_offset + rec.size:
            return rec.phy_offset
        prev_end = rec.phy_offset + rec.size
    return prev_end
