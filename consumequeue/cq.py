# Owns RocketMQ's ConsumeQueue files (spec §2), one queue per
# ${root}/consumequeue/<topic>/<queueId>/, and the set of them.
#
# Unit: i64 commitlog PHYSICALOFFSET | i32 TOTALSIZE | i64 tagsCode (20 B).
# Logical offset N lives at byte N*20 of the queue's address space; files
# hold 300,000 units (6,000,000 bytes) and are named by their 20-digit byte
# start.  Writes are pwrite()s into full-size sparse files, so the bytes on
# disk are exactly what RocketMQ's mmapped files hold.
#
# Rules kept from ConsumeQueue.java, and why they matter here:
#  * putMessagePositionInfo skips units already present (queue offset below
#    the write position, or phy+size <= maxPhysicOffset), which makes
#    re-dispatching a range idempotent;
#  * the first file of a queue whose first message is not at offset 0 gets
#    "pre-blank" units (0, Integer.MAX_VALUE, 0) up to it (fillPreBlank);
#  * recover() reads from the third-to-last file until a unit with
#    offset < 0 or size <= 0.
# Deviations, for byte equality with a clean rebuild: truncation zeroes the
# units it removes (RocketMQ only moves the write position), drops a file
# left without real units, and a hole in queue offsets (a bug upstream) is
# filled with pre-blank units and counted instead of written out of place.
#
# A queue can also hold no real unit at all, only pre-blank units up to its
# max offset: what rebase() leaves of a queue whose every message is below a
# log that was reset past it (a follower's reset_to).  It keeps the queue's
# numbering (consumers' offsets, a future leader's offset table) until its
# next message arrives, which replaces it with what a clean rebuild writes.
import errno
import logging
import os
import shutil

import attrs

from commitlog.atomicfile import fsync_dir
from consumequeue.errors import BadTopicError
from consumequeue.files import FdCache, makedirs_durable, segment_name
from native.dispatch import UNIT, UNIT_SIZE, default_backend

log = logging.getLogger(__name__)

CQ_UNIT_SIZE = UNIT_SIZE
UNITS_PER_FILE = 300_000
DEFAULT_FILE_SIZE = UNITS_PER_FILE * CQ_UNIT_SIZE  # 6,000,000
BLANK_SIZE = 0x7FFFFFFF
PRE_BLANK_UNIT = UNIT.pack(0, BLANK_SIZE, 0)
PENDING_LIMIT = 256 << 10


def check_topic(topic: str) -> None:
    if not topic or topic in (".", "..") or "/" in topic or "\0" in topic:
        raise BadTopicError(topic)


@attrs.frozen
class CQUnit:
    offset: int  # logical queue offset
    phy: int
    size: int
    tags_code: int

    @property
    def is_blank(self) -> bool:
        return self.phy == 0 and self.size == BLANK_SIZE and self.tags_code == 0


def _is_blank(phy: int, size: int, tags: int) -> bool:
    return phy == 0 and size == BLANK_SIZE and tags == 0


class ConsumeQueue:
    def __init__(self, root: str, topic: str, queue_id: int, *, fds: FdCache,
                 file_size: int = DEFAULT_FILE_SIZE, backend=None):
        check_topic(topic)
        if file_size % CQ_UNIT_SIZE:
            raise ValueError(f"consume queue file size {file_size} is not a multiple of 20")
        self.topic = topic
        self.queue_id = queue_id
        self.dir = os.path.join(root, "consumequeue", topic, str(queue_id))
        self.file_size = file_size
        self.fds = fds
        self.backend = backend or default_backend()
        self.starts: list[int] = []  # byte starts of the files, ascending
        self.max_offset = 0  # next logical offset to write
        self.min_offset = 0
        self.max_phy_end = -1  # phy+size of the last real unit
        self.first_phy = -1  # phy of the unit at min_offset (-1: empty)
        self.gaps = 0  # units filled with blanks because queue offsets jumped
        self._pend = bytearray()  # units accepted but not yet written
        self._pend_pos = 0  # their byte position in the queue's address space
        self.problems: list[str] = []

    # --- loading ----------------------------------------------------------

    def _path(self, start: int) -> str:
        return os.path.join(self.dir, segment_name(start))

    def load(self) -> "ConsumeQueue":
        names = sorted(n for n in os.listdir(self.dir) if len(n) == 20 and n.isdigit())
        self.starts = [int(n) for n in names]
        for a, b in zip(self.starts, self.starts[1:]):
            if b != a + self.file_size:
                self.problems.append(f"{self.dir}: file {segment_name(b)} does not follow "
                                     f"{segment_name(a)} (missing file?)")
        for s in self.starts:
            if s % self.file_size:
                self.problems.append(f"{self.dir}: file {segment_name(s)} is not on a file boundary")
        self.recover()
        return self

    def _read_file(self, start: int, offset: int = 0, size: int | None = None) -> bytes:
        size = self.file_size - offset if size is None else size
        return self.fds.pread(self._path(start), size, offset)

    def recover(self) -> None:
        """ConsumeQueue.recover: scan from the third-to-last file to the first
        invalid unit; files after it are removed and the rest of its file is
        zeroed."""
        if not self.starts:
            self.max_offset = self.min_offset = 0
            self.max_phy_end = -1
            return
        k = max(0, len(self.starts) - 3)
        end_file, valid = self.starts[k], 0
        for i in range(k, len(self.starts)):
            end_file = self.starts[i]
            valid = self.backend.cq_valid_units(self._read_file(end_file))
            if valid * CQ_UNIT_SIZE < self.file_size:
                break
        end = end_file + valid * CQ_UNIT_SIZE
        if self.fds.readonly:  # verification: take the valid end, repair nothing
            self.starts = [s for s in self.starts if s <= end_file]
            self._recovered(end)
            return
        for s in [s for s in self.starts if s > end_file]:
            self._remove_file(s)
        if valid == 0:
            self._remove_file(end_file)  # created, never written: a rebuild has no such file
        else:
            self.fds.zero_range(self._path(end_file), end - end_file, self.file_size, self.file_size)
        if not self.starts:
            self.max_offset = self.min_offset = 0
            self.max_phy_end = -1
            return
        self._recovered(end)

    def _recovered(self, end: int) -> None:
        self.max_offset = end // CQ_UNIT_SIZE
        self.min_offset = self._first_real_offset(self.starts[0])
        if self.min_offset >= self.max_offset:  # only pre-blank units: a placeholder
            self.max_phy_end = -1
        else:
            self.max_phy_end = self._last_real_end()
        self._note_first()

    @property
    def is_placeholder(self) -> bool:
        """Files, but no real unit: the numbering of a queue whose messages
        are all gone (see rebase)."""
        return bool(self.starts) and self.max_phy_end < 0

    def _note_first(self) -> None:
        self.first_phy = self.get_unit(self.min_offset).phy if self.min_offset < self.max_offset else -1

    def _first_real_offset(self, start: int) -> int:
        """Logical offset of the first non-blank unit in the file at `start`
        (the file's end if there is none)."""
        limit = min(self.file_size, self.max_offset * CQ_UNIT_SIZE - start)
        data = self._read_file(start, 0, max(limit, 0))
        # Pre-blank units form a prefix: binary search its length with C-level
        # compares instead of a Python loop over up to 300,000 units.
        lo, hi = 0, len(data) // CQ_UNIT_SIZE  # data[:lo] is all blank
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if data.startswith(PRE_BLANK_UNIT * mid):
                lo = mid
            else:
                hi = mid - 1
        return start // CQ_UNIT_SIZE + lo

    def _last_real_end(self) -> int:
        """phy+size of the last non-blank unit (-1 if none)."""
        if not self.starts:
            return -1
        off = self.max_offset - 1
        while off >= self.starts[0] // CQ_UNIT_SIZE:
            u = self.get_unit(off)
            if not u.is_blank:
                return u.phy + u.size
            off -= 1
        return -1

    def _remove_file(self, start: int) -> None:
        self.fds.unlink(self._path(start))
        self.starts.remove(start)

    # --- writing ----------------------------------------------------------

    def _write(self, offset: int, data: bytes) -> None:
        """Write units at logical `offset`, creating files as needed."""
        pos = offset * CQ_UNIT_SIZE
        view = memoryview(data)
        while view:
            start = pos - pos % self.file_size
            n = min(len(view), start + self.file_size - pos)
            path = self._path(start)
            if start not in self.starts:
                makedirs_durable(self.dir, self.fds.dirty_dirs)
                self.fds.get(path, create_size=self.file_size)
                self.starts.append(start)
                self.starts.sort()
            self.fds.pwrite(path, view[:n], pos - start)
            view, pos = view[n:], pos + n

    def put_units(self, first_offset: int, units: bytes) -> int:
        """Append units whose queue offsets run from `first_offset` without a
        hole.  Returns how many were written (duplicates are skipped)."""
        n = len(units) // CQ_UNIT_SIZE
        if self.is_placeholder:
            # The queue's first message after a log reset: from here on the
            # queue is what a clean rebuild writes (fillPreBlank up to it).
            for start in list(self.starts):
                self._remove_file(start)
            self.max_offset = self.min_offset = 0
        if first_offset == self.max_offset and self.starts:
            # The common case: exactly the next units of a queue that exists.
            # They collect in a write-behind buffer (one pwrite per 256 KiB
            # instead of one per batch); every reader flushes it first.
            phy, size, _ = UNIT.unpack_from(units, 0)
            if phy + size > self.max_phy_end:
                pos = first_offset * CQ_UNIT_SIZE
                start = pos - pos % self.file_size
                if start == self.starts[-1] and pos + len(units) <= start + self.file_size:
                    if self._pend or len(units) < PENDING_LIMIT:
                        if not self._pend:
                            self._pend_pos = pos
                        self._pend += units
                        if len(self._pend) >= PENDING_LIMIT:
                            self.write_pending()
                    else:  # large enough on its own: no copy into the buffer
                        self.fds.pwrite(self._path(start), units, pos - start)
                    self.max_offset = first_offset + n
                    phy, size, _ = UNIT.unpack_from(units, len(units) - CQ_UNIT_SIZE)
                    self.max_phy_end = phy + size
                    return n
        self.write_pending()
        skip = 0
        while skip < n:
            phy, size, _ = UNIT.unpack_from(units, skip * CQ_UNIT_SIZE)
            if first_offset + skip >= self.max_offset and phy + size > self.max_phy_end:
                break
            skip += 1  # already in the queue: a re-dispatch
        if skip == n:
            return 0
        q0 = first_offset + skip
        units = units[skip * CQ_UNIT_SIZE:]
        if q0 > self.max_offset:
            if not self.starts:
                # fillPreBlank: a queue whose first message is not at 0.
                file_start = q0 * CQ_UNIT_SIZE // self.file_size * self.file_size // CQ_UNIT_SIZE
                self._write(file_start, PRE_BLANK_UNIT * (q0 - file_start))
                self.min_offset = q0
            else:
                log.warning("consume queue %s/%d: queue offsets jump from %d to %d; "
                            "filling the hole with blank units", self.topic, self.queue_id,
                            self.max_offset, q0)
                self.gaps += q0 - self.max_offset
                self._write(self.max_offset, PRE_BLANK_UNIT * (q0 - self.max_offset))
        elif not self.starts:
            self.min_offset = q0
        if self.first_phy < 0:
            self.first_phy = UNIT.unpack_from(units, 0)[0]
        self._write(q0, units)
        count = len(units) // CQ_UNIT_SIZE
        self.max_offset = q0 + count
        phy, size, _ = UNIT.unpack_from(units, (count - 1) * CQ_UNIT_SIZE)
        self.max_phy_end = phy + size
        return count

    def write_pending(self) -> None:
        """Write the buffered units (they never cross a file boundary)."""
        if self._pend:
            start = self._pend_pos - self._pend_pos % self.file_size
            self.fds.pwrite(self._path(start), self._pend, self._pend_pos - start)
            self._pend = bytearray()

    def put(self, queue_offset: int, phy: int, size: int, tags_code: int) -> int:
        return self.put_units(queue_offset, UNIT.pack(phy, size, tags_code))

    # --- reading ----------------------------------------------------------

    def read_raw(self, offset: int, max_count: int) -> bytes:
        """Units from logical `offset` (clamped to [min, max)), as bytes."""
        readable_end = self.max_offset
        try:
            self.write_pending()
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # A full disk: serve what is in the files; the buffered units
            # are written by a later read or checkpoint once there is room.
            readable_end = self._pend_pos // CQ_UNIT_SIZE
        offset = max(offset, self.min_offset)
        count = min(max_count, readable_end - offset)
        out = bytearray()
        pos = offset * CQ_UNIT_SIZE
        while count > 0:
            start = pos - pos % self.file_size
            if start not in self.starts:
                break
            n = min(count * CQ_UNIT_SIZE, start + self.file_size - pos)
            out += self._read_file(start, pos - start, n)
            pos += n
            count -= n // CQ_UNIT_SIZE
        return bytes(out)

    def read(self, offset: int, max_count: int) -> list[CQUnit]:
        offset = max(offset, self.min_offset)
        raw = self.read_raw(offset, max_count)
        return [CQUnit(offset + i, *UNIT.unpack_from(raw, i * CQ_UNIT_SIZE))
                for i in range(len(raw) // CQ_UNIT_SIZE)]

    def get_unit(self, offset: int) -> CQUnit:
        self.write_pending()
        pos = offset * CQ_UNIT_SIZE
        start = pos - pos % self.file_size
        return CQUnit(offset, *UNIT.unpack(self._read_file(start, pos - start, CQ_UNIT_SIZE)))

    def offset_by_time(self, timestamp: int, store_timestamp_of, *, boundary: str = "lower") -> int:
        """Binary search by store time (SEARCH_OFFSET_BY_TIMESTAMP).  "lower":
        the first offset stored at or after `timestamp` (max_offset if none);
        "upper": the last offset stored at or before it (min_offset if none).
        `store_timestamp_of(phy, size)` reads the commitlog."""
        if boundary not in ("lower", "upper"):
            raise ValueError(f"boundary must be lower or upper, not {boundary!r}")
        lo, hi = self.min_offset, self.max_offset  # find first offset with ts > or >= timestamp
        while lo < hi:
            mid = (lo + hi) // 2
            u = self.get_unit(mid)
            ts = store_timestamp_of(u.phy, u.size) if not u.is_blank else None
            ts = -(1 << 63) if ts is None else ts
            if ts < timestamp or (boundary == "upper" and ts == timestamp):
                lo = mid + 1
            else:
                hi = mid
        if boundary == "lower":
            return lo
        return max(lo - 1, self.min_offset)

    # --- truncation and retention -----------------------------------------

    def truncate_phy(self, limit: int) -> int:
        """Remove every unit pointing at or beyond commitlog position `limit`
        (truncateDirtyLogicFiles), zeroing the bytes.  Returns units removed."""
        self.write_pending()
        removed = 0
        if self.is_placeholder:
            return 0  # no unit points anywhere: nothing to cut
        while self.starts:
            start = self.starts[-1]
            data = self._read_file(start)
            valid = self.backend.cq_valid_units(data)
            i = valid
            while i > 0:
                phy, size, tags = UNIT.unpack_from(data, (i - 1) * CQ_UNIT_SIZE)
                if phy < limit and not _is_blank(phy, size, tags):
                    break
                i -= 1
            if i == 0:
                self._remove_file(start)
                removed += valid
                continue
            if i < valid:
                self.fds.zero_range(self._path(start), i * CQ_UNIT_SIZE, valid * CQ_UNIT_SIZE,
                                    self.file_size)
                removed += valid - i
            self.max_offset = (start + i * CQ_UNIT_SIZE) // CQ_UNIT_SIZE
            break
        if not self.starts:
            self.max_offset = self.min_offset = 0
            self.max_phy_end = self.first_phy = -1
        else:
            self.max_phy_end = self._last_real_end()
            self.min_offset = min(self.min_offset, self.max_offset)
        return removed

    def delete_expired(self, min_phy: int) -> int:
        """deleteExpiredFile: remove leading files (never the last) whose last
        unit points below the commitlog's first position, then correct the
        min offset.  Returns files removed."""
        self.write_pending()
        removed = 0
        while len(self.starts) > 1:
            phy, size, _ = UNIT.unpack(self._read_file(self.starts[0], self.file_size - CQ_UNIT_SIZE,
                                                       CQ_UNIT_SIZE))
            if not (size > 0 and phy < min_phy):
                break
            self._remove_file(self.starts[0])
            removed += 1
        self.correct_min_offset(min_phy)
        return removed

    def rebase(self, begin: int) -> bool:
        """The log now begins at `begin` and nothing below it will ever be
        read again on this node (a follower reset past its log): make the
        queue what a clean rebuild of the log from `begin` writes, keeping
        the queue offsets.  The first real unit at or after `begin` keeps its
        offset and everything before it in its file becomes pre-blank units
        (earlier files go); with no such unit the queue becomes a
        placeholder: pre-blank units up to its max offset in the file holding
        the last one.  Returns whether anything changed (False: already so)."""
        self.write_pending()
        if not self.starts or self.is_placeholder:
            return False
        keep = self._first_unit_at_or_after(begin) if self.max_phy_end > begin else None
        if keep is None:
            self.make_placeholder(self.max_offset)
            return True
        keep_at, first_phy = keep
        file_start = keep_at * CQ_UNIT_SIZE // self.file_size * self.file_size
        if keep_at == self.min_offset and file_start == self.starts[0] \
                and self._first_real_offset(file_start) == keep_at:
            return False  # only pre-blank units before it already
        for start in [s for s in self.starts if s < file_start]:
            self._remove_file(start)
        first = file_start // CQ_UNIT_SIZE
        self._write(first, PRE_BLANK_UNIT * (keep_at - first))
        self.min_offset = keep_at
        self.first_phy = first_phy
        return True

    def make_placeholder(self, max_offset: int) -> None:
        """Replace the queue by pre-blank units up to `max_offset` (> 0) in
        the file holding the last of them."""
        self.write_pending()
        for start in list(self.starts):
            self._remove_file(start)
        last = (max_offset - 1) * CQ_UNIT_SIZE
        first = (last - last % self.file_size) // CQ_UNIT_SIZE
        self._write(first, PRE_BLANK_UNIT * (max_offset - first))
        self.min_offset = self.max_offset = max_offset
        self.max_phy_end = self.first_phy = -1

    def _first_unit_at_or_after(self, phy_limit: int) -> tuple[int, int] | None:
        """(offset, phy) of the first real unit whose phy >= phy_limit."""
        for start in self.starts:
            data = self._read_file(start, 0, min(self.file_size, self.max_offset * CQ_UNIT_SIZE - start))
            n = len(data) // CQ_UNIT_SIZE
            if n == 0:
                continue
            phy, size, tags = UNIT.unpack_from(data, (n - 1) * CQ_UNIT_SIZE)
            if phy < phy_limit and not _is_blank(phy, size, tags):
                continue  # units are in log order: the whole file is below
            for i, (phy, size, tags) in enumerate(UNIT.iter_unpack(data[:n * CQ_UNIT_SIZE])):
                if phy >= phy_limit and not _is_blank(phy, size, tags):
                    return start // CQ_UNIT_SIZE + i, phy
        return None

    def correct_min_offset(self, min_phy: int) -> None:
        """The first real unit at or after `min_phy` in the first file."""
        self.write_pending()
        if not self.starts:
            return
        start = self.starts[0]
        raw = self._read_file(start, 0, min(self.file_size, self.max_offset * CQ_UNIT_SIZE - start))
        for i in range(len(raw) // CQ_UNIT_SIZE):
            phy, size, tags = UNIT.unpack_from(raw, i * CQ_UNIT_SIZE)
            if not _is_blank(phy, size, tags) and phy >= min_phy:
                self.min_offset = max(self.min_offset, start // CQ_UNIT_SIZE + i)
                self._note_first()
                return
        self.min_offset = max(self.min_offset, (start + len(raw)) // CQ_UNIT_SIZE)
        self._note_first()



def _remove_empty_dirs(queue_dir: str, dirty_dirs: set[str]) -> None:
    for d in (queue_dir, os.path.dirname(queue_dir)):
        try:
            os.rmdir(d)
            dirty_dirs.add(os.path.dirname(d))
        except OSError:
            break


class ConsumeQueueStore:
    """Every ConsumeQueue under ${root}/consumequeue."""

    def __init__(self, root: str, *, file_size: int = DEFAULT_FILE_SIZE, backend=None,
                 readonly: bool = False):
        self.root = root
        self.dir = os.path.join(root, "consumequeue")
        self.file_size = file_size
        self.backend = backend or default_backend()
        self.readonly = readonly
        self.fds = FdCache(readonly=readonly)
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}

    def _new(self, topic: str, queue_id: int) -> ConsumeQueue:
        return ConsumeQueue(self.root, topic, queue_id, fds=self.fds, file_size=self.file_size,
                            backend=self.backend)

    def load(self) -> "ConsumeQueueStore":
        if os.path.isdir(self.dir):
            for topic in sorted(os.listdir(self.dir)):
                tdir = os.path.join(self.dir, topic)
                if not os.path.isdir(tdir):
                    continue
                for qid in sorted(os.listdir(tdir)):
                    if not qid.lstrip("-").isdigit() or not os.path.isdir(os.path.join(tdir, qid)):
                        continue
                    cq = self._new(topic, int(qid)).load()
                    if cq.starts:
                        self.queues[(topic, int(qid))] = cq
                    elif not self.readonly:
                        _remove_empty_dirs(cq.dir, self.fds.dirty_dirs)
        return self

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            cq = self.queues[(topic, queue_id)] = self._new(topic, queue_id)
        return cq

    def problems(self) -> list[str]:
        return [p for cq in self.queues.values() for p in cq.problems]

    def max_offset_table(self) -> dict[tuple[str, int], int]:
        return {k: cq.max_offset for k, cq in self.queues.items() if cq.starts}

    def queue_table(self) -> dict[tuple[str, int], tuple[int, int]]:
        """(max offset, phy of the first unit) of every queue."""
        return {k: (cq.max_offset, cq.first_phy) for k, cq in self.queues.items() if cq.starts}

    def truncate_phy(self, limit: int) -> int:
        removed = 0
        for key, cq in list(self.queues.items()):
            removed += cq.truncate_phy(limit)
            if not cq.starts:
                _remove_empty_dirs(cq.dir, self.fds.dirty_dirs)
                del self.queues[key]
        return removed

    def delete_expired(self, min_phy: int) -> int:
        return sum(cq.delete_expired(min_phy) for cq in self.queues.values())

    def rebase(self, begin: int) -> int:
        """ConsumeQueue.rebase on every queue; returns how many changed."""
        return sum(cq.rebase(begin) for cq in self.queues.values())

    def write_pending(self) -> None:
        for cq in self.queues.values():
            cq.write_pending()

    def flush(self) -> None:
        self.write_pending()
        self.fds.flush()

    def destroy(self) -> None:
        """Remove every consume queue file (before a full rebuild)."""
        self.fds.close()
        self.fds = FdCache(readonly=self.readonly)
        self.queues.clear()
        if os.path.isdir(self.dir):
            shutil.rmtree(self.dir)
            fsync_dir(self.root)

    def close(self) -> None:
        if not self.readonly:
            self.write_pending()
        self.fds.close()


def unit_bytes(phy: int, size: int, tags_code: int) -> bytes:
    return UNIT.pack(phy, size, tags_code)

