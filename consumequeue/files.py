# Owns the file plumbing shared by consume queues and index files: 20-digit
# names, an LRU of open descriptors (a broker may own thousands of queue
# files; the process may open ~1024), full-size sparse creation, and
# durable creates/renames/unlinks (fsync of the directory).
#
# A descriptor evicted from the LRU is closed without fsync; its path stays
# in the dirty set and flush() reopens it to fsync (fsync acts on the inode,
# so the pages written through the old descriptor are covered).
import os
from collections import OrderedDict

# The 20-digit naming and the directory fsync are the commitlog's (spec §5.3);
# re-exported here for the consume queue and index modules.
from commitlog.atomicfile import fsync_dir
from commitlog.segments import segment_name

__all__ = ["MAX_OPEN", "FdCache", "fsync_dir", "makedirs_durable", "segment_name", "sync_paths"]

MAX_OPEN = 256


def makedirs_durable(path: str, dirty_dirs: set[str] | None = None) -> None:
    """mkdir -p, fsyncing each parent whose entry we created (or, given
    `dirty_dirs`, noting it there for the next flush)."""
    missing = []
    p = os.path.abspath(path)
    while not os.path.isdir(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            pass
        if dirty_dirs is None:
            fsync_dir(os.path.dirname(d))
        else:
            dirty_dirs.add(os.path.dirname(d))


class FdCache:
    """Open read-write descriptors by path, least recently used closed first.

    Directory entries (created files and directories, unlinks) are made
    durable at flush(), not one fsync each: nothing is recorded as
    dispatched before a flush, so a crash in between only loses files the
    restart truncates away anyway."""

    def __init__(self, capacity: int = MAX_OPEN, *, readonly: bool = False):
        self.capacity = capacity
        self.readonly = readonly  # verification: never create, write or truncate
        self._fds: OrderedDict[str, int] = OrderedDict()
        self.dirty: set[str] = set()
        self.dirty_dirs: set[str] = set()

    def get(self, path: str, *, create_size: int | None = None) -> int:
        fd = self._fds.get(path)
        if fd is not None:
            self._fds.move_to_end(path)
            return fd
        if self.readonly:
            if create_size is not None:
                raise PermissionError(f"{path}: read-only consume queue store")
            fd = os.open(path, os.O_RDONLY)
        elif create_size is not None and not os.path.exists(path):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            os.ftruncate(fd, create_size)  # full size, sparse: reads as zeros
            self.dirty_dirs.add(os.path.dirname(path))
        else:
            fd = os.open(path, os.O_RDWR)
        self._fds[path] = fd
        while len(self._fds) > self.capacity:
            _, old = self._fds.popitem(last=False)
            os.close(old)
        return fd

    def pwrite(self, path: str, data, offset: int) -> None:
        if self.readonly:
            raise PermissionError(f"{path}: read-only consume queue store")
        fd = self.get(path)
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, offset)
            view, offset = view[n:], offset + n
        self.dirty.add(path)

    def pread(self, path: str, size: int, offset: int) -> bytes:
        return os.pread(self.get(path), size, offset)

    def zero_range(self, path: str, start: int, end: int, file_size: int) -> None:
        """Zero [start, end) of a file.  At the tail this is ftruncate down and
        back up (holes, no writes); inside the file it writes zeros."""
        if self.readonly:
            raise PermissionError(f"{path}: read-only consume queue store")
        fd = self.get(path)
        if end >= file_size:
            os.ftruncate(fd, start)
            os.ftruncate(fd, file_size)
        elif end > start:
            self.pwrite(path, bytes(end - start), start)
        self.dirty.add(path)

    def forget(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)
        self.dirty.discard(path)

    def unlink(self, path: str) -> None:
        self.forget(path)
        os.unlink(path)
        self.dirty_dirs.add(os.path.dirname(path))

    def take_dirty(self) -> tuple[list[str], list[str]]:
        """The files and directories a flush must sync, handed over (the
        sync itself may then run in another thread: it opens its own
        descriptors and never touches this cache)."""
        files, dirs = sorted(self.dirty), sorted(self.dirty_dirs, key=len, reverse=True)
        self.dirty, self.dirty_dirs = set(), set()
        return files, dirs

    def flush(self) -> None:
        sync_paths(*self.take_dirty())

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def sync_paths(files: list[str], dirs: list[str]) -> None:
    """fsync each file (by path: fsync acts on the inode, so pages written
    through any descriptor are covered), then each directory, children
    first.  Files deleted meanwhile are skipped."""
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for d in dirs:
        if os.path.isdir(d):
            fsync_dir(d)
