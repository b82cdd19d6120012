# Owns writing a plain (master-slave) RocketMQ store's derived files and
# commitlog the way CommitLog.doAppend and ReputMessageService would:
#
#   PlainCommitlogWriter   message records back to back in fixed-size
#                          segments (created at full size, as RocketMQ
#                          preallocates them), PHYSICALOFFSET stamped with the
#                          position, the 8-byte BLANK closing a segment the
#                          next record (+ 8 bytes) does not fit (spec §1.7)
#   dispatch_plain         consume queues + index from a plain commitlog
#                          range, with the project's dispatch engine in plain
#                          mode; resumes after what the queues already hold
#   write_stock_checkpoint RocketMQ's checkpoint without ledgermq's extension
#   write_fastjson         config JSON as fastjson writes it (integer map keys
#                          unquoted), atomically
#
# Used by `mqadmin migrate export` (the way back), by `migrate apply` (to
# complete the old consume queues before the DLedger log continues them)
# and by the test fixtures (tests/helpers/legacy_fixtures.py).
import json
import os
import struct

from commitlog.atomicfile import fsync_dir, write_atomic
from consumequeue import record as M
from consumequeue.dispatcher import DispatchConfig, DispatchEngine
from consumequeue.source import CommitlogSource
from native.dispatch import MODE_PLAIN

COMMITLOG_DIR = "commitlog"


class PlainCommitlogWriter:
    """Appends records to ${root}/commitlog/ from position `start` (a record
    start or a segment start).  Not thread-safe; close() fsyncs."""

    def __init__(self, root: str, segment_size: int, *, start: int = 0):
        if segment_size < 64:
            raise ValueError(f"segment size {segment_size} is too small")
        self.dir = os.path.join(root, COMMITLOG_DIR)
        os.makedirs(self.dir, exist_ok=True)
        self.segment_size = segment_size
        self.pos = start
        self._fd: int | None = None
        self._fd_start = -1
        self._dirty: set[int] = set()

    def _file(self, seg_start: int) -> int:
        if self._fd_start != seg_start:
            self._close_fd()
            path = os.path.join(self.dir, f"{seg_start:020d}")
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(fd).st_size < self.segment_size:
                os.ftruncate(fd, self.segment_size)
            self._fd, self._fd_start = fd, seg_start
        return self._fd

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd, self._fd_start = None, -1

    def append(self, raw) -> int:
        """Write one encoded record (its PHYSICALOFFSET is set here; the
        QUEUEOFFSET is the caller's); returns its position."""
        raw = bytearray(raw)
        size = len(raw)
        if size + M.END_FILE_MIN_BLANK_LENGTH > self.segment_size:
            raise ValueError(f"a record of {size} bytes does not fit a {self.segment_size}-byte segment")
        seg = self.pos - self.pos % self.segment_size
        left = seg + self.segment_size - self.pos
        if size + M.END_FILE_MIN_BLANK_LENGTH > left:
            os.pwrite(self._file(seg), M.encode_blank(left), self.pos - seg)
            self.pos = seg = seg + self.segment_size
        M.set_physical_offset(raw, self.pos)
        os.pwrite(self._file(seg), raw, self.pos - seg)
        at = self.pos
        self.pos += size
        return at

    def close(self) -> None:
        self._close_fd()
        fsync_dir(self.dir)


def plain_engine(root: str, commitlog_dir: str | None = None, *, segment_size: int | None = None,
                 config: DispatchConfig | None = None, backend=None) -> DispatchEngine:
    """A dispatch engine over a plain commitlog, its consume queues and
    index loaded (no ledgermq dispatch state needed)."""
    source = CommitlogSource(commitlog_dir or os.path.join(root, COMMITLOG_DIR), segment_size=segment_size,
                             mode=MODE_PLAIN)
    engine = DispatchEngine(root, source, config=config, backend=backend)
    engine.cqs.load()
    engine.index.load()
    return engine


def dispatched_end(engine: DispatchEngine) -> int:
    """Where plain dispatch stopped: just after the last unit any queue
    holds (RocketMQ reputs in log order, so everything before is in)."""
    end = 0
    for cq in engine.cqs.queues.values():
        if cq.max_offset > cq.min_offset:
            u = cq.get_unit(cq.max_offset - 1)
            end = max(end, u.phy + u.size)
    return end


def dispatch_plain(engine: DispatchEngine, begin: int, end: int, *, progress=None) -> int:
    """Dispatch the plain records in [max(begin, what the queues hold), end)
    into the engine's consume queues and index, then flush them.  Returns
    the bytes dispatched.  Idempotent: a unit a queue already holds is not
    written again."""
    start = max(begin, dispatched_end(engine))
    if start >= end:
        return 0
    engine.pos, engine.last_index = start, -1
    done = engine.dispatch_to(end, progress=progress)
    engine.cqs.flush()
    for f in engine.index.files:
        f.write_header()
        f.flush()
    return done


def write_stock_checkpoint(root: str, physic_ts: int, logics_ts: int, index_ts: int) -> None:
    """${root}/checkpoint as a stock broker writes it (spec §4.1), without
    ledgermq's dispatch extension."""
    raw = struct.pack(">qqqqq", physic_ts, logics_ts, index_ts, 0, 0)
    write_atomic(os.path.join(root, "checkpoint"), raw + bytes(4096 - len(raw)))


def fastjson_dumps(obj) -> str:
    """JSON with integer dict keys unquoted, as fastjson writes Map<Integer,..>."""
    if isinstance(obj, dict):
        parts = []
        for k, v in obj.items():
            key = str(k) if isinstance(k, int) and not isinstance(k, bool) else json.dumps(str(k))
            parts.append(f"{key}:{fastjson_dumps(v)}")
        return "{" + ",".join(parts) + "}"
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(fastjson_dumps(v) for v in obj) + "]"
    return json.dumps(obj)


def write_fastjson(path: str, obj) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_atomic(path, fastjson_dumps(obj).encode())
