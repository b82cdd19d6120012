# Owns RocketMQ's IndexFile (spec §3) and the service over ${root}/index/:
# hash index from "topic#key" (every KEYS token and the UNIQ_KEY) to
# commitlog positions, chained through prevIndex, files named by creation
# time (yyyyMMddHHmmssSSS, local time), rotated when full, queried newest
# file first.
#
# Layout: 40-byte header | hashSlotNum x i32 slots | indexNum x 20-byte items
# (i32 keyHash, i64 phyOffset, i32 timeDiff seconds, i32 prevIndex).  Files
# are full-size sparse files mapped read-write; the C helper writes items,
# slots and the header straight into the map.
#
# Crash repair (ledgermq): the header is written after the items of each
# batch, so after a kill the file may hold items beyond header.indexCount.
# load() undoes them newest first (a slot that points at an undone item gets
# its prevIndex back).  truncate_phy() undoes every item at or beyond a
# commitlog position the same way, so "truncate + re-dispatch" leaves the
# bytes a clean rebuild would write.
import array
import logging
import mmap
import os
import struct
import time

import attrs

from commitlog.atomicfile import fsync_dir
from consumequeue.errors import InconsistentStateError
from consumequeue.files import makedirs_durable
from native.dispatch import IndexHeader, default_backend, py_put_key
from native.hashing import java_hash_str

log = logging.getLogger(__name__)

HEADER_SIZE = 40
ITEM_SIZE = 20
DEFAULT_SLOT_NUM = 5_000_000
DEFAULT_INDEX_NUM = 20_000_000
MAX_MSGS_NUM_BATCH = 64  # maxMsgsNumBatch: the cap on one query
ITEM = struct.Struct(">iqii")
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14+
POPULATE_CHUNK = 4 << 20


def index_file_size(slot_num: int, index_num: int) -> int:
    return HEADER_SIZE + slot_num * 4 + index_num * ITEM_SIZE


def build_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"


def key_hash(key: str) -> int:
    """indexKeyHashMethod: abs(hashCode), MIN_VALUE mapped to 0."""
    h = java_hash_str(key)
    return 0 if h == -(1 << 31) else abs(h)


def time_name(ms: int) -> str:
    """UtilAll.timeMillisToHumanString: yyyyMMddHHmmssSSS in local time."""
    return time.strftime("%Y%m%d%H%M%S", time.localtime(ms // 1000)) + f"{ms % 1000:03d}"


@attrs.frozen
class IndexItem:
    number: int
    key_hash: int
    phy: int
    time_diff: int
    prev_index: int


class IndexFile:
    def __init__(self, path: str, slot_num: int, index_num: int, *,
                 create_from: tuple[int, int] | None = None, readonly: bool = False,
                 dirty_dirs: set[str] | None = None):
        """Open `path`, or create it when `create_from` = (endPhyOffset,
        endTimestamp) of the previous file (RocketMQ starts a new file with
        begin = end = those values).  Given `dirty_dirs`, the directory
        entry of a created file is noted there for the next flush instead of
        fsynced now (the dispatcher creates files on the event loop)."""
        self.path = path
        self.name = os.path.basename(path)
        self.slot_num = slot_num
        self.index_num = index_num
        self.size = index_file_size(slot_num, index_num)
        if create_from is not None:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            os.ftruncate(fd, self.size)  # sparse: metadata only, cheap
            if dirty_dirs is None:
                fsync_dir(os.path.dirname(path))
            else:
                dirty_dirs.add(os.path.dirname(path))
        else:
            fd = os.open(path, os.O_RDONLY if readonly else os.O_RDWR)
            actual = os.fstat(fd).st_size
            if actual != self.size:
                os.close(fd)
                raise ValueError(f"{path}: {actual} bytes, but slots {slot_num} and items "
                                 f"{index_num} make {self.size}")
        self.fd = fd
        self._populated = 0  # bytes from the start already faulted in
        prot = mmap.PROT_READ if readonly else mmap.PROT_READ | mmap.PROT_WRITE
        self.mm = mmap.mmap(fd, self.size, mmap.MAP_SHARED, prot)
        if create_from is not None:
            phy, ts = create_from
            self.header = IndexHeader()
            if phy > 0:
                self.header.begin_phy_offset = self.header.end_phy_offset = phy
            if ts > 0:
                self.header.begin_timestamp = self.header.end_timestamp = ts
            self.write_header()
        else:
            self.header = IndexHeader.unpack(self.mm)
            h = self.header
            if h.index_count > index_num or not 0 <= h.hash_slot_count <= slot_num:
                # A damaged header would index past the file (found by the
                # consume queue fuzzer: a struct.error out of the open).
                self.mm.close()
                os.close(fd)
                raise ValueError(f"{path}: header says {h.index_count} items and {h.hash_slot_count} slots, "
                                 f"the file holds {index_num} and {slot_num}")
            # Existing pages are in place (or on disk): populate only from
            # the next item on, never re-read a whole old file.
            written = self.item_base + self.header.index_count * ITEM_SIZE
            self._populated = written - written % mmap.PAGESIZE

    # --- page population -----------------------------------------------------

    def populate(self, end: int) -> None:
        """Fault in the file's pages up to byte `end` in one madvise: a
        write fault per fresh page of a sparse file costs several times
        more.  Best effort (older kernels refuse; then pages fault in)."""
        end = min(self.size, end)
        start = self._populated
        if end <= start:
            return
        end = min(self.size, max(end, start + POPULATE_CHUNK))
        try:
            self.mm.madvise(MADV_POPULATE_WRITE, start, end - start)
        except (OSError, ValueError):
            self.populate = lambda end: None  # unsupported here: stop trying
            return
        self._populated = end - end % mmap.PAGESIZE

    # --- basic access -------------------------------------------------------

    @property
    def is_full(self) -> bool:
        return self.header.index_count >= self.index_num

    @property
    def item_base(self) -> int:
        return HEADER_SIZE + self.slot_num * 4

    def write_header(self) -> None:
        self.mm[0:HEADER_SIZE] = self.header.pack()

    def slot(self, n: int) -> int:
        return struct.unpack_from(">i", self.mm, HEADER_SIZE + n * 4)[0]

    def item(self, number: int) -> IndexItem:
        return IndexItem(number, *ITEM.unpack_from(self.mm, self.item_base + number * ITEM_SIZE))

    def put_key(self, key: str, phy: int, store_timestamp: int) -> bool:
        """IndexFile.putKey (the slow path; batches go through the backend)."""
        if self.is_full:
            return False
        py_put_key(self.mm, self.slot_num, self.header, java_hash_str(key) & 0xFFFFFFFF, phy,
                   store_timestamp)
        self.write_header()
        return True

    # --- queries ------------------------------------------------------------

    def is_time_matched(self, begin: int, end: int) -> bool:
        h = self.header
        return (begin < h.begin_timestamp and end > h.end_timestamp) \
            or h.begin_timestamp <= begin <= h.end_timestamp \
            or h.begin_timestamp <= end <= h.end_timestamp

    def select_phy_offsets(self, out: list[int], key: str, max_num: int, begin: int, end: int) -> None:
        """IndexFile.selectPhyOffset: walk the key's chain, newest first."""
        h = self.header
        kh = key_hash(key)
        slot_value = self.slot(kh % self.slot_num)
        if slot_value <= 0 or slot_value > h.index_count or h.index_count <= 1:
            return
        nxt = slot_value
        while len(out) < max_num:
            it = self.item(nxt)
            if it.time_diff < 0:
                break
            t = h.begin_timestamp + it.time_diff * 1000
            if it.key_hash == kh and begin <= t <= end:
                out.append(it.phy)
            prev = it.prev_index
            if prev <= 0 or prev > h.index_count or prev == nxt or t < begin:
                break
            nxt = prev

    # --- repair and truncation ------------------------------------------------

    def _undo(self, number: int) -> None:
        """Remove item `number`, which must be the newest item of the file."""
        it = self.item(number)
        if it.key_hash >= 0:
            slot_pos = HEADER_SIZE + (it.key_hash % self.slot_num) * 4
            if struct.unpack_from(">i", self.mm, slot_pos)[0] == number:
                struct.pack_into(">i", self.mm, slot_pos, it.prev_index)
        base = self.item_base + number * ITEM_SIZE
        self.mm[base:base + ITEM_SIZE] = bytes(ITEM_SIZE)

    def _recount_slots(self) -> None:
        # hashSlotCount counts puts into empty slots, and slots never empty
        # again, so it equals the number of non-zero slots.
        slots = array.array("i", self.mm[HEADER_SIZE:self.item_base])
        self.header.hash_slot_count = len(slots) - slots.count(0)

    def repair(self) -> int:
        """Undo items written after the last header write (a crash mid-batch).
        Returns how many were undone."""
        n = self.header.index_count
        extra = []
        while n < self.index_num:
            base = self.item_base + n * ITEM_SIZE
            if self.mm[base:base + ITEM_SIZE] == bytes(ITEM_SIZE):
                break
            extra.append(n)
            n += 1
        for number in reversed(extra):
            self._undo(number)
        if extra:
            self._recount_slots()
            self.write_header()
        return len(extra)

    def truncate_phy(self, limit: int, store_timestamp_of) -> int:
        """Undo every item with phyOffset >= limit; the header's end fields go
        back to the newest remaining item (`store_timestamp_of(phy)` supplies
        its millisecond timestamp, which items keep only in seconds)."""
        h = self.header
        n = h.index_count
        while n > 1 and self.item(n - 1).phy >= limit:
            n -= 1
        if n == h.index_count:
            return 0
        removed = h.index_count - n
        for number in range(h.index_count - 1, n - 1, -1):
            self._undo(number)
        h.index_count = n
        self._recount_slots()
        if n > 1:
            last = self.item(n - 1)
            h.end_phy_offset = last.phy
            ts = store_timestamp_of(last.phy)
            # Gone from the commitlog: the item's own (second) resolution.
            h.end_timestamp = ts if ts is not None else h.begin_timestamp + last.time_diff * 1000
        self.write_header()
        return removed

    def flush(self) -> None:
        self.write_header()
        os.fsync(self.fd)  # covers the pages dirtied through the shared map

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)


@attrs.frozen
class QueryResult:
    phy_offsets: list[int]
    index_last_update_timestamp: int
    index_last_update_phy_offset: int


class IndexService:
    """The index files under ${root}/index, oldest first."""

    def __init__(self, root: str, *, slot_num: int = DEFAULT_SLOT_NUM,
                 index_num: int = DEFAULT_INDEX_NUM, backend=None, clock_ms=None,
                 readonly: bool = False):
        self.dir = os.path.join(root, "index")
        self.readonly = readonly
        self.slot_num = slot_num
        self.index_num = index_num
        self.backend = backend or default_backend()
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.files: list[IndexFile] = []
        # Directories whose entries changed (a created file, a created
        # index dir) and are not yet fsynced: the dispatcher's checkpoint
        # syncs them in its worker thread, as the consume queues' are, so
        # that rolling to a new file does no fsync on the event loop.
        self.dirty_dirs: set[str] = set()

    def take_dirty_dirs(self) -> list[str]:
        dirs, self.dirty_dirs = sorted(self.dirty_dirs, key=len, reverse=True), set()
        return dirs

    def load(self) -> "IndexService":
        if os.path.isdir(self.dir):
            for name in sorted(os.listdir(self.dir)):
                if len(name) == 17 and name.isdigit():
                    try:
                        f = IndexFile(os.path.join(self.dir, name), self.slot_num, self.index_num,
                                      readonly=self.readonly)
                    except ValueError as exc:  # a truncated file: derived data, rebuilt by the caller
                        self.close()
                        raise InconsistentStateError(str(exc)) from None
                    if not self.readonly and f.repair():
                        log.warning("index file %s: undid items written after its last header", name)
                    self.files.append(f)
        return self

    def _new_file(self) -> IndexFile:
        makedirs_durable(self.dir, self.dirty_dirs)
        prev = self.files[-1] if self.files else None
        ms = self.clock_ms()
        name = time_name(ms)
        while (prev is not None and name <= prev.name) or os.path.exists(os.path.join(self.dir, name)):
            ms += 1  # names must be unique and ascending; creation times may collide
            name = time_name(ms)
        create_from = (prev.header.end_phy_offset, prev.header.end_timestamp) if prev else (0, 0)
        if prev is not None:
            # Header only: its pages are fsynced by the next checkpoint (which
            # syncs every index file before it records anything), not here on
            # the event loop -- a full file's fsync can take 100+ ms.
            prev.write_header()
        f = IndexFile(os.path.join(self.dir, name), self.slot_num, self.index_num, create_from=create_from,
                      dirty_dirs=self.dirty_dirs)
        self.files.append(f)
        return f

    def writable_file(self) -> IndexFile:
        """retryGetAndCreateIndexFile: the last file, or a new one if full."""
        if not self.files or self.files[-1].is_full:
            return self._new_file()
        return self.files[-1]

    def put_batch(self, buf, res) -> None:
        """Index every record of a scan result (the backend's helper)."""
        rec, key = 0, 0
        while rec < res.n:
            f = self.writable_file()
            # The slots are hit at random and the items appended: have the
            # pages the batch will likely touch (2 keys a message) in place.
            f.populate(f.item_base + (f.header.index_count + 2 * (res.n - rec)) * ITEM_SIZE)
            rec, key = self.backend.index_put(f.mm, f.slot_num, f.index_num, f.header, buf, res, rec, key)

    def put_key(self, topic: str, key: str, phy: int, store_timestamp: int) -> None:
        f = self.writable_file()
        if not f.put_key(build_key(topic, key), phy, store_timestamp):
            self._new_file().put_key(build_key(topic, key), phy, store_timestamp)

    def query(self, topic: str, key: str, max_num: int, begin: int, end: int) -> QueryResult:
        """IndexService.queryOffset: newest file first, capped at 64."""
        max_num = min(max_num, MAX_MSGS_NUM_BATCH)
        out: list[int] = []
        last_ts = last_phy = 0
        for i in range(len(self.files) - 1, -1, -1):
            f = self.files[i]
            if i == len(self.files) - 1:
                last_ts, last_phy = f.header.end_timestamp, f.header.end_phy_offset
            if f.is_time_matched(begin, end):
                f.select_phy_offsets(out, build_key(topic, key), max_num, begin, end)
            if f.header.begin_timestamp < begin or len(out) >= max_num:
                break
        return QueryResult(out, last_ts, last_phy)

    @property
    def end_phy_offset(self) -> int:
        return self.files[-1].header.end_phy_offset if self.files else 0

    def truncate_phy(self, limit: int, store_timestamp_of) -> int:
        removed = 0
        while self.files:
            f = self.files[-1]
            removed += f.truncate_phy(limit, store_timestamp_of)
            if f.header.index_count > 1:
                break
            # Nothing left in it: a clean rebuild would not have this file.
            self.files.pop()
            f.close()
            os.unlink(f.path)
            fsync_dir(self.dir)
        return removed

    def delete_expired(self, min_phy: int) -> int:
        """deleteExpiredFile: drop files (never the last) whose endPhyOffset
        is below the commitlog's first position."""
        removed = 0
        while len(self.files) > 1 and self.files[0].header.end_phy_offset < min_phy:
            f = self.files.pop(0)
            f.close()
            os.unlink(f.path)
            removed += 1
        if removed:
            fsync_dir(self.dir)
        return removed

    def file_counts(self) -> list[tuple[str, int]]:
        return [(f.name, f.header.index_count) for f in self.files]

    def flush(self) -> None:
        for f in self.files:
            f.flush()
        for d in self.take_dirty_dirs():
            if os.path.isdir(d):
                fsync_dir(d)

    def destroy(self) -> None:
        self.close()
        if os.path.isdir(self.dir):
            for name in os.listdir(self.dir):
                os.unlink(os.path.join(self.dir, name))
            os.rmdir(self.dir)

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []
