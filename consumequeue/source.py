# Owns read-only access to commitlog bytes by absolute position, for
# dispatch, rebuild and verification: the DLedger data segments
# (${root}/dledger-<id>/data/<20-digit start>) or a plain RocketMQ
# commitlog directory, mapped read-only (the page cache is shared with the
# store's pwrite()s, so committed bytes are visible without copies).
#
# A view never crosses a segment: records never span two segments, and
# the scanner meets the blank filler before a segment's end.  Maps are
# kept in a small LRU and remapped when a file has grown since it was
# mapped (a store may create segments short and extend them) or was
# replaced: a follower's truncation deletes the segments after its new end
# and recreates them, and retention deletes head segments.  A map of the
# old inode would serve stale bytes (and pin the deleted file's space), so
# every view checks that the path still names the mapped inode.
#
# LayeredSource joins an old master-slave commitlog and the DLedger data
# that continues it at the divided offset (a migrated store, spec §6.6).
import bisect
import mmap
import os
import re
import struct
from collections import OrderedDict

from commitlog.segments import release_below
from consumequeue.record import BLANK_MAGIC as _BLANK_MAGIC
from consumequeue.record import POS_SYSFLAG, store_timestamp_pos
from native.dispatch import MODE_DLEDGER

_NAME = re.compile(r"^\d{20}$")
_MAX_MAPS = 8
_MIN_MAP = 64 << 20


class CommitlogSource:
    def __init__(self, data_dir: str, *, segment_size: int | None = None, mode: int = MODE_DLEDGER,
                 populate: bool = False):
        self.data_dir = data_dir
        self.mode = mode
        self.populate = populate  # prefault whole segments (offline rebuilds)
        self._configured_size = segment_size
        self.segment_size = segment_size
        self.starts: list[int] = []
        self._maps: OrderedDict[int, tuple[mmap.mmap, int, int]] = OrderedDict()  # start -> (map, size, inode)
        self.refresh()

    def refresh(self) -> None:
        """Re-list the segment files (after the store created or deleted some)."""
        names = sorted(n for n in os.listdir(self.data_dir) if _NAME.match(n)) \
            if os.path.isdir(self.data_dir) else []
        self.starts = [int(n) for n in names]
        if self._configured_size is None and self.starts:
            sizes = [os.path.getsize(self._path(s)) for s in self.starts]
            gaps = {b - a for a, b in zip(self.starts, self.starts[1:])}
            self.segment_size = gaps.pop() if len(gaps) == 1 else max(sizes)
        for start in [s for s in self._maps if s not in self.starts]:
            self._drop(start)

    def reset(self) -> None:
        """Forget every map and re-list the segments (after the store
        replaced all of them: reset_to)."""
        for start in list(self._maps):
            self._drop(start)
        self.refresh()

    def _path(self, start: int) -> str:
        return os.path.join(self.data_dir, f"{start:020d}")

    @property
    def begin_pos(self) -> int | None:
        return self.starts[0] if self.starts else None

    def segment_start(self, pos: int) -> int:
        """Start of the segment holding `pos` (KeyError if none does)."""
        for attempt in (0, 1):
            i = bisect.bisect_right(self.starts, pos) - 1
            if i >= 0 and pos < self.starts[i] + self.segment_size:
                return self.starts[i]
            if attempt == 0:
                self.refresh()  # the store may have created it since
        raise KeyError(pos)

    def segment_end(self, pos: int) -> int:
        return self.segment_start(pos) + self.segment_size

    def _drop(self, start: int) -> None:
        entry = self._maps.pop(start, None)
        if entry is not None:
            try:
                entry[0].close()
            except BufferError:
                pass  # a view still exports it; it goes when the view does

    def _map(self, start: int, need: int) -> mmap.mmap:
        entry = self._maps.get(start)
        if entry is not None:
            try:
                ino = os.stat(self._path(start)).st_ino
            except FileNotFoundError:
                ino = None
            if ino != entry[2]:  # deleted (retention) or recreated (truncation)
                self._drop(start)
                self.refresh()
                if start not in self.starts:
                    raise KeyError(start)
                entry = None
            elif entry[1] >= need:
                self._maps.move_to_end(start)
                return entry[0]
        if entry is not None:
            self._drop(start)
        try:
            f = open(self._path(start), "rb")
        except FileNotFoundError:
            self.refresh()
            raise KeyError(start) from None
        with f:
            st = os.fstat(f.fileno())
            length = st.st_size
            if length < need or need <= 0:
                raise KeyError(start + need)
            # Map what is needed (at least 64 MiB, doubling on growth), not the
            # whole preallocated segment: MAP_POPULATE of a sparse 1 GiB tail
            # would fault in zero pages for nothing.
            old = entry[1] if entry is not None else 0
            size = min(length, max(need, 2 * old, _MIN_MAP))
            flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if self.populate else 0)
            mm = mmap.mmap(f.fileno(), size, flags, mmap.PROT_READ)
        if not self.populate:
            mm.madvise(mmap.MADV_SEQUENTIAL)
        self._maps[start] = (mm, size, st.st_ino)
        while len(self._maps) > _MAX_MAPS:
            old = self._maps.popitem(last=False)[1][0]
            try:
                old.close()
            except BufferError:
                pass
        return mm

    def view(self, pos: int, end: int) -> memoryview:
        """Bytes [pos, min(end, segment end)) as a read-only view."""
        start = self.segment_start(pos)
        end = min(end, start + self.segment_size)
        mm = self._map(start, end - start)
        return memoryview(mm)[pos - start:end - start]

    def read(self, pos: int, size: int) -> bytes:
        with self.view(pos, pos + size) as v:
            if len(v) != size:
                raise KeyError(pos + size)
            return bytes(v)

    def release_below(self, pos: int) -> None:
        """Unmap the pages of every map below `pos` (they stay in the page
        cache; a later view faults them back in): dispatch reads the log
        once, front to back, and should not keep what it read resident."""
        for start, (mm, _, _) in self._maps.items():
            if start < pos:
                release_below(mm, pos - start)

    def store_timestamp_at(self, phy: int) -> int:
        """STORETIMESTAMP of the record at `phy` (its position depends on the
        born host's address family)."""
        head = self.read(phy, POS_SYSFLAG + 4)
        (sysflag,) = struct.unpack_from(">i", head, POS_SYSFLAG)
        return struct.unpack(">q", self.read(phy + store_timestamp_pos(sysflag), 8))[0]

    def close(self) -> None:
        for mm, _, _ in self._maps.values():
            try:
                mm.close()
            except BufferError:
                pass
        self._maps.clear()


class LayeredSource:
    """The physical offset space of a store migrated from master-slave
    (spec §6.6): positions below `divided` are read from the old plain
    commitlog up to `legacy_end`, where it stopped being written; from
    there to the end of that segment reads return the BLANK RocketMQ would
    have written there (we never write into the old files), so a scan
    moves on to `divided`.  Positions at or above it come from the DLedger
    data segments.  Same interface as CommitlogSource; `mode` is the
    DLedger one because only the DLedger part is ever dispatched live (the
    old part's consume queues are completed before the log continues), and
    mode_at() tells scanners and readers how the bytes at a position are
    framed."""

    def __init__(self, legacy: CommitlogSource, dledger: CommitlogSource, divided: int, legacy_end: int):
        self.legacy, self.dledger = legacy, dledger
        self.divided, self.legacy_end = divided, legacy_end
        self.mode = dledger.mode
        self.data_dir = dledger.data_dir
        self.populate = dledger.populate

    @property
    def segment_size(self) -> int:
        return self.dledger.segment_size or self.legacy.segment_size

    @property
    def starts(self) -> list[int]:
        return [s for s in self.legacy.starts if s < self.divided] + self.dledger.starts

    def legacy_present(self) -> bool:
        """Some old commitlog segment is still on disk (retention not done)."""
        return any(s < self.divided for s in self.legacy.starts)

    def mode_at(self, pos: int) -> int:
        return self.legacy.mode if pos < self.divided else self.dledger.mode

    def refresh(self) -> None:
        self.legacy.refresh()
        self.dledger.refresh()

    def reset(self) -> None:
        self.legacy.reset()
        self.dledger.reset()

    @property
    def begin_pos(self) -> int | None:
        if self.legacy_present():
            return self.legacy.begin_pos
        return self.dledger.begin_pos

    def _in_blank(self, pos: int) -> bool:
        return self.legacy_end <= pos < self.divided

    def segment_start(self, pos: int) -> int:
        if pos >= self.divided:
            return self.dledger.segment_start(pos)
        if self._in_blank(pos) and self.legacy_present():
            return pos - pos % self.legacy.segment_size
        return self.legacy.segment_start(pos)

    def segment_end(self, pos: int) -> int:
        if pos >= self.divided:
            return self.dledger.segment_end(pos)
        if self._in_blank(pos) and self.legacy_present():
            return self.divided  # the BLANK closes the old log: the next byte is DLedger's
        return min(self.legacy.segment_end(pos), self.divided)

    def view(self, pos: int, end: int) -> memoryview:
        if pos >= self.divided:
            return self.dledger.view(pos, end)
        if self._in_blank(pos):
            self.segment_start(pos)  # KeyError once retention removed the old files
            # The 8-byte BLANK is all a scanner reads before it moves on.
            blank = struct.pack(">ii", self.divided - pos, _BLANK_MAGIC)
            return memoryview(blank[:max(0, min(end, self.divided) - pos)])
        return self.legacy.view(pos, min(end, self.legacy_end))

    def read(self, pos: int, size: int) -> bytes:
        with self.view(pos, pos + size) as v:
            if len(v) != size:
                raise KeyError(pos + size)
            return bytes(v)

    def store_timestamp_at(self, phy: int) -> int:
        return (self.legacy if phy < self.divided else self.dledger).store_timestamp_at(phy)

    def release_below(self, pos: int) -> None:
        self.legacy.release_below(pos)
        self.dledger.release_below(pos)

    def close(self) -> None:
        self.legacy.close()
        self.dledger.close()
