# Owns the read side of a store migrated from master-slave (spec §6.6): the
# DLedger commitlog continues the old plain commitlog at the divided offset,
# in one physical offset space.
#
#   dledger-<id>/ledgermq-divided.json   the marker `migrate apply` (and the
#       broker's upgrade on start, broker.store.upgrade) writes last:
#       dividedOffset (where the DLedger data begins: the old last segment's
#       end, as RocketMQ's dividedCommitlogOffset), the old commitlog's first
#       position, write position and segment size.  Its presence means "this
#       store was migrated"; RocketMQ re-derives the offset from the first
#       DLedger file's name, which retention would move, so we keep it.
#
# What reads do with it:
#   * reads go through consumequeue.source.LayeredSource (old files below
#     the divided offset, DLedger above), so old consume queue units and
#     index items keep working and new dispatches continue the same queues
#     (open_migrated_engine; consumequeue.rebuild rebuilds both parts);
#   * retention: old segments expire by the broker's rules (fileReservedTime,
#     deleteWhen, disk ratio), oldest first, the last one included; DLedger
#     segments are not deleted while any old one exists (a retention floor),
#     so deletion never leaves a hole at the boundary.
import json
import logging
import os
import time

import attrs

from commitlog.atomicfile import fsync_dir, write_atomic
from commitlog.retention import disk_used_ratio, retention_due
from commitlog.segments import list_segment_files
from consumequeue.dispatcher import DispatchEngine
from consumequeue.plainlog import dispatch_plain, plain_engine
from consumequeue.source import CommitlogSource, LayeredSource
from native.dispatch import MODE_PLAIN

log = logging.getLogger("ledgermq.migration")

MARKER_FILE = "ledgermq-divided.json"
LEGACY_COMMITLOG = "commitlog"
NO_FLOOR = 1 << 62

@attrs.frozen(kw_only=True)
class DividedLog:
    divided: int  # first DLedger position (RocketMQ's dividedCommitlogOffset)
    legacy_begin: int  # the old commitlog's first position at migration
    legacy_end: int  # the old write position (valid data ends here)
    legacy_segment_size: int
    legacy_records: int = 0
    import_id: str = ""

    def to_json(self) -> bytes:
        return json.dumps({"dividedOffset": self.divided, "legacyBegin": self.legacy_begin,
                           "legacyEnd": self.legacy_end, "legacySegmentSize": self.legacy_segment_size,
                           "legacyRecords": self.legacy_records, "importId": self.import_id},
                          sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> "DividedLog":
        o = json.loads(raw)
        return cls(divided=int(o["dividedOffset"]), legacy_begin=int(o["legacyBegin"]), legacy_end=int(o["legacyEnd"]),
                   legacy_segment_size=int(o["legacySegmentSize"]), legacy_records=int(o.get("legacyRecords", 0)),
                   import_id=str(o.get("importId", "")))


def divided_offset(legacy_end: int, legacy_segment_size: int) -> int:
    """THE divided offset of an old commitlog (used by `migrate apply`, the
    broker's upgrade on start and `migrate check`): RocketMQ's
    dividedCommitlogOffset, the end of the old segment holding the old write
    position (last old file's start + the old files' own size; the rest of
    that file is its closing BLANK).  It depends on the old files alone,
    never on the configured mappedFileSizeCommitLog, so every copy of one
    old store gets the same value however it is migrated.  When the old
    data ends exactly on a segment boundary, that boundary."""
    if legacy_segment_size <= 0:
        raise ValueError(f"old segment size must be positive, got {legacy_segment_size}")
    rest = legacy_end % legacy_segment_size
    return legacy_end if rest == 0 else legacy_end - rest + legacy_segment_size


def store_dir_of(root: str, self_id: str) -> str:
    return os.path.join(root, f"dledger-{self_id}")


def load_marker(store_dir: str) -> DividedLog | None:
    path = os.path.join(store_dir, MARKER_FILE)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    try:
        return DividedLog.from_json(raw)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: unreadable migration marker ({exc})") from None


def write_marker(store_dir: str, marker: DividedLog) -> None:
    write_atomic(os.path.join(store_dir, MARKER_FILE), marker.to_json())


def legacy_segments(root: str) -> list:
    d = os.path.join(root, LEGACY_COMMITLOG)
    return list_segment_files(d) if os.path.isdir(d) else []


def layered_source(store, marker: DividedLog) -> LayeredSource:
    from consumequeue.service import source_for  # service opens migrated stores through here
    legacy = CommitlogSource(os.path.join(store.cfg.root, LEGACY_COMMITLOG),
                             segment_size=marker.legacy_segment_size, mode=MODE_PLAIN)
    return LayeredSource(legacy, source_for(store), marker.divided, marker.legacy_end)


def offline_layered_source(root: str, dledger: CommitlogSource, marker: DividedLog, span):
    """(source, begin, committed end) of a stopped migrated store, for the
    offline verifier: `span` is consumequeue.verify.offline_span's."""
    legacy = CommitlogSource(os.path.join(root, LEGACY_COMMITLOG), segment_size=marker.legacy_segment_size,
                             mode=MODE_PLAIN)
    source = LayeredSource(legacy, dledger, marker.divided, marker.legacy_end)
    end = span.committed_pos if span.committed_index >= 0 else marker.divided
    begin = source.begin_pos if source.legacy_present() else (span.begin_pos if span.last_index >= 0 else end)
    return source, begin, end


def open_migrated_engine(store, marker: DividedLog, *, config=None, backend=None):
    """consumequeue.service.open_engine for a migrated store: the engine
    reads through a LayeredSource and the log begins at the old commitlog
    while it exists.  If the dispatch state had to be rebuilt, the old part
    is dispatched again in plain mode before the DLedger part."""
    from consumequeue.service import positions, raise_committed_from_dispatch
    root = store.cfg.root
    raise_committed_from_dispatch(store, root)
    source = layered_source(store, marker)
    engine = DispatchEngine(root, source, config=config, backend=backend)
    p = positions(store)
    begin = source.begin_pos if source.legacy_present() else p.begin_pos
    report = engine.open(begin, p.committed_pos, p.committed_index)
    if report.action == "rebuilt" and source.legacy_present():
        redispatch_legacy(engine, marker)
    return engine, report


def redispatch_legacy(engine, marker: DividedLog) -> None:
    """After a full reset of a migrated store's queues: dispatch the old
    commitlog in plain mode (a second engine on the same root), then resume
    the DLedger part at the divided offset."""
    legacy = engine.source.legacy
    engine.close()
    plain = plain_engine(engine.root, legacy.data_dir, segment_size=marker.legacy_segment_size,
                         config=engine.config)
    try:
        dispatch_plain(plain, legacy.begin_pos or 0, marker.legacy_end)
    finally:
        plain.close()
        plain.source.close()
    for field in ("messages", "bad_messages", "bytes", "skipped_topics"):
        setattr(engine.stats, field, getattr(engine.stats, field) + getattr(plain.stats, field))
    engine.cqs.load()
    engine.index.load()
    engine.pos, engine.last_index = marker.divided, -1
    engine.checkpoint()
    log.warning("consume queues of the old commitlog rebuilt up to %d; DLedger dispatch resumes at %d",
                marker.legacy_end, marker.divided)


def legacy_floor(source: LayeredSource):
    """A retention floor for the DLedger store: nothing while old segments exist."""
    return lambda: 0 if source.legacy_present() else NO_FLOOR


def legacy_retention_pass(source: LayeredSource, *, file_reserved_hours: int, delete_when, max_used_ratio: float,
                          now: float | None = None, used_ratio: float | None = None) -> list[str]:
    """Delete expired old segments, oldest first (RocketMQ's rules: older
    than fileReservedTime during the deleteWhen hours, or any hour when the
    disk is fuller than the ratio).  Returns the deleted paths."""
    legacy = source.legacy
    now = time.time() if now is None else now
    ratio = disk_used_ratio(legacy.data_dir) if used_ratio is None else used_ratio
    if not retention_due(now, delete_when, ratio, max_used_ratio):
        return []
    fs = os.statvfs(legacy.data_dir)
    fs_bytes = max(1, fs.f_blocks * fs.f_frsize)
    deleted = []
    for start, path, _ in list_segment_files(legacy.data_dir):
        if start >= source.divided:
            break
        st = os.stat(path)
        if not (st.st_mtime < now - file_reserved_hours * 3600 or ratio >= max_used_ratio):
            break  # the oldest remaining one is still reserved: so are the later ones
        os.unlink(path)
        deleted.append(path)
        ratio -= st.st_blocks * 512 / fs_bytes
    if deleted:
        fsync_dir(legacy.data_dir)
        legacy.refresh()
        log.info("retention deleted %d old commitlog segments; the log now begins at %s", len(deleted),
                 source.begin_pos)
    return deleted
