# Owns the segment files of one address space (DLedger data or index): fixed
# size files named by their 20-digit start offset (RocketMQ's scheme, spec
# §5.3), their file descriptors and read-only memory maps, and the small file
# system rules the store depends on (create at full size, fsync the
# directory after creating or deleting, zero a tail by truncating it away).
#
# Writes always go through os.pwrite/pwritev on the file descriptor; reads
# go through a shared read-only mmap of the same file (coherent with pwrite
# on Linux through the page cache).  A SegmentList in read-only mode never
# writes, creates, extends or deletes anything (offline tools).
import errno
import mmap
import os
import re
from collections import OrderedDict

import attrs

from commitlog.atomicfile import fsync_dir

NAME_RE = re.compile(r"^\d{20}$")
MAX_OPEN = 64  # segments whose fd/map stay open at once (LRU beyond that)


def segment_name(start: int) -> str:
    return f"{start:020d}"


def list_segment_files(directory: str) -> list[tuple[int, str, int]]:
    """(start, path, length) of every 20-digit file in `directory`, by start.
    Other names (tmp files, editor droppings) are ignored."""
    out = []
    for name in os.listdir(directory):
        if NAME_RE.match(name):
            path = os.path.join(directory, name)
            if os.path.isfile(path):
                out.append((int(name), path, os.path.getsize(path)))
    out.sort()
    return out


def infer_segment_size(files: list[tuple[int, str, int]], configured: int | None = None) -> int | None:
    """The segment size a set of files was written with.

    RocketMQ and DLedger create every file at full size, so the largest file
    length is the size unless every file was truncated; the spacing of the
    names confirms it when there are two or more.  A lone file shorter than
    the configured size is taken as a truncated file of that size.  Returns
    `configured` when there are no (non-empty) files."""
    lengths = [length for _, _, length in files if length > 0]
    if not lengths:
        return configured
    longest = max(lengths)
    starts = [start for start, _, _ in files]
    if len(starts) >= 2:
        gaps = {b - a for a, b in zip(starts, starts[1:])}
        if len(gaps) == 1:
            (gap,) = gaps
            if longest <= gap:
                return gap
    if configured and len(files) == 1 and longest < configured:
        if files[0][0] % configured and files[0][0] % longest == 0:
            # Not a truncated file of the configured size: its name is no
            # multiple of that.  A lone first segment at a non-zero offset
            # (a store migrated from master-slave) has its full length.
            return longest
        return configured
    return longest


def release_below(mm: mmap.mmap, end: int) -> None:
    """Drop this process's page-table entries for mm[0:end) (rounded down
    to a page).  For a shared file mapping the bytes stay in the page cache
    and a later read faults them back in, so a long-running broker's RSS is
    what it reads now, not every page it ever mapped."""
    try:
        end = min(end, len(mm)) // mmap.PAGESIZE * mmap.PAGESIZE
        if end > 0:
            mm.madvise(mmap.MADV_DONTNEED, 0, end)
    except ValueError:  # closed meanwhile
        pass


def tail_is_zero(fd: int, view, offset: int) -> bool:
    """True when every byte from `offset` to the end of the mapped view is 0.
    Holes are skipped with SEEK_DATA so a sparse 1 GiB tail costs nothing."""
    from native.entries import first_nonzero

    if offset >= len(view):
        return True
    try:
        data = os.lseek(fd, offset, os.SEEK_DATA)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return True  # only a hole remains
        data = offset  # SEEK_DATA unsupported: read it all
    if data >= len(view):
        return True
    return first_nonzero(view[data:]) < 0


@attrs.define(eq=False, kw_only=True)
class Segment:
    """One segment file covering [start, start + size) of its address space."""

    path: str
    start: int
    size: int
    readonly: bool = False
    dirty: bool = False  # written since the last flush
    _fd: int = -1
    _map: mmap.mmap | None = None
    _owner: "SegmentList | None" = None

    @property
    def end(self) -> int:
        return self.start + self.size

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def fd(self) -> int:
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDONLY if self.readonly else os.O_RDWR)
            if self._owner is not None:
                self._owner._touch(self)
        return self._fd

    def dup_fd(self) -> int | None:
        """A dup() of the open descriptor, for a flush in a worker thread;
        None when the segment is closed (close() synced it) - never opens."""
        fd = self._fd
        if fd < 0:
            return None
        try:
            return os.dup(fd)
        except OSError:
            return None  # closed meanwhile, and synced by close()

    def file_length(self) -> int:
        return os.fstat(self.fd()).st_size

    def view(self) -> memoryview:
        """A read-only view of the file: all `size` bytes once the file is
        full size (always, for a store that finished recovering), else the
        bytes that exist (a truncated file seen by recovery or a tool)."""
        if self._map is None:
            fd = self.fd()
            length = min(self.size, os.fstat(fd).st_size)
            if length == 0:
                return memoryview(b"")
            self._map = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ)
        return memoryview(self._map)

    def write(self, data, offset: int) -> None:
        """pwrite `data` (bytes-like, or a list of them for pwritev) at
        `offset` inside the segment, retrying short writes."""
        assert not self.readonly
        parts = data if isinstance(data, list) else [data]
        fd = self.fd()
        total = sum(memoryview(p).nbytes for p in parts)
        if offset + total > self.size:
            raise ValueError(f"write of {total} bytes at {offset} overruns segment {self.path}")
        done = os.pwritev(fd, parts, offset) if len(parts) > 1 else os.pwrite(fd, parts[0], offset)
        if done < total:  # rare short write: finish it byte-range by byte-range
            flat = memoryview(b"".join(bytes(p) for p in parts))
            while done < total:
                done += os.pwrite(fd, flat[done:], offset + done)
        self.dirty = True

    def zero_from(self, offset: int) -> None:
        """Make every byte from `offset` to the end zero, as in a fresh file.
        Truncating and re-extending turns the tail into a hole, which costs
        no writes however large it is."""
        fd = self.fd()
        if self._map is not None and len(self._map) < self.size:
            self._drop_map()  # it was mapped short; map the full file next time
        os.ftruncate(fd, offset)
        os.ftruncate(fd, self.size)
        self.dirty = True

    def ensure_full_size(self) -> bool:
        """Extend a short (truncated) file back to the segment size."""
        fd = self.fd()
        if os.fstat(fd).st_size < self.size:
            self._drop_map()
            os.ftruncate(fd, self.size)
            self.dirty = True
            return True
        return False

    def release_below(self, offset: int) -> None:
        """release_below() of this segment's read map, if it has one."""
        if self._map is not None:
            release_below(self._map, offset)

    def _drop_map(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # a caller still holds a view; the map dies with it
            self._map = None

    def close(self) -> None:
        if self._fd >= 0 and self.dirty and not self.readonly:
            os.fdatasync(self._fd)  # never lose a write by evicting its fd
            self.dirty = False
        self._drop_map()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@attrs.define(eq=False)
class SegmentList:
    """The ordered, contiguous segments of one address space."""

    directory: str
    seg_size: int
    readonly: bool = False
    segments: list[Segment] = attrs.field(factory=list)
    _open: OrderedDict = attrs.field(factory=OrderedDict, init=False)

    @classmethod
    def load(cls, directory: str, seg_size: int, *, readonly: bool = False) -> "SegmentList":
        sl = cls(directory, seg_size, readonly)
        for start, path, _ in list_segment_files(directory):
            sl.segments.append(Segment(path=path, start=start, size=seg_size, readonly=readonly, owner=sl))
        return sl

    def _touch(self, seg: Segment) -> None:
        self._open[id(seg)] = seg
        self._open.move_to_end(id(seg))
        while len(self._open) > MAX_OPEN:
            _, old = self._open.popitem(last=False)
            old.close()

    def __len__(self) -> int:
        return len(self.segments)

    @property
    def first(self) -> Segment | None:
        return self.segments[0] if self.segments else None

    @property
    def last(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    def aligned_start(self, offset: int) -> int:
        return offset // self.seg_size * self.seg_size

    def find(self, offset: int) -> Segment | None:
        """The segment holding byte `offset`, or None."""
        if not self.segments:
            return None
        k = (offset - self.segments[0].start) // self.seg_size
        if 0 <= k < len(self.segments):
            seg = self.segments[k]
            if seg.start <= offset < seg.end:
                return seg
        for seg in self.segments:  # non-contiguous lists (only while recovering)
            if seg.start <= offset < seg.end:
                return seg
        return None

    def get_or_create(self, offset: int, *, allow_gap: bool = False) -> Segment:
        """The segment holding `offset`, created (full size, sparse) when it
        is the next one after the last segment or the list is empty (or
        anywhere, with allow_gap, while recovery rebuilds an index)."""
        seg = self.find(offset)
        if seg is not None:
            return seg
        start = self.aligned_start(offset)
        if self.segments and start != self.segments[-1].end and not allow_gap:
            raise ValueError(f"segment at {start} would leave a gap after {self.segments[-1].path}")
        return self.create(start)

    def create(self, start: int) -> Segment:
        assert not self.readonly
        path = os.path.join(self.directory, segment_name(start))
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, self.seg_size)
        finally:
            os.close(fd)
        fsync_dir(self.directory)
        seg = Segment(path=path, start=start, size=self.seg_size, owner=self)
        self.segments.append(seg)
        self.segments.sort(key=lambda s: s.start)
        return seg

    def remove(self, seg: Segment, *, sync: bool = True) -> str:
        """Delete one segment file (the caller keeps the list contiguous)."""
        assert not self.readonly
        seg.dirty = False  # deleted data needs no flush
        seg.close()
        self._open.pop(id(seg), None)
        self.segments.remove(seg)
        try:
            os.unlink(seg.path)
        except FileNotFoundError:
            pass
        if sync:
            fsync_dir(self.directory)
        return seg.path

    def remove_after(self, start: int) -> list[str]:
        """Delete every segment starting at or after `start`."""
        doomed = [s for s in self.segments if s.start >= start]
        removed = [self.remove(s, sync=False) for s in doomed]
        if removed:
            fsync_dir(self.directory)
        return removed

    def remove_all(self) -> list[str]:
        return self.remove_after(self.segments[0].start) if self.segments else []

    def zero_from(self, offset: int) -> list[str]:
        """Zero everything from `offset` on: the tail of its segment and
        every later segment (deleted).  Returns the deleted paths."""
        seg = self.find(offset)
        if seg is not None and offset > seg.start:
            seg.zero_from(offset - seg.start)
            return self.remove_after(seg.end)
        return self.remove_after(self.aligned_start(offset) if seg is None else seg.start)

    def write_span(self, offset: int, data, *, allow_gap: bool = False) -> None:
        """Write `data` at absolute `offset`, one pwrite per segment touched,
        creating segments as the span reaches them."""
        mv = memoryview(data).cast("B")
        done = 0
        while done < len(mv):
            seg = self.get_or_create(offset + done, allow_gap=allow_gap)
            at = offset + done - seg.start
            n = min(len(mv) - done, seg.size - at)
            seg.write(mv[done:done + n], at)
            done += n

    def dirty_segments(self) -> list[Segment]:
        return [s for s in self.segments if s.dirty]

    def close(self) -> None:
        for seg in self.segments:
            seg.close()
        self._open.clear()
