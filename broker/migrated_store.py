# Owns the running side of a store migrated from master-slave (issue 7,
# spec §6.6): the DLedger commitlog continues the old plain commitlog at the
# divided offset, in one physical offset space.
#
#   dledger-<id>/ledgermq-divided.json   the marker `migrate apply` writes
#       last: dividedOffset (where the DLedger data begins: the old last
#       segment's end, as RocketMQ's dividedCommitlogOffset), the old
#       commitlog's first position, write position and segment size.  Its
#       presence means "this store was migrated"; RocketMQ re-derives the
#       offset from the first DLedger file's name, which retention would
#       move, so we keep it.
#   dledger-<id>/ledgermq-import.json    the old config tables (topics,
#       subscription groups, consumer offsets) for the replicated metadata.
#
# What the broker does with them:
#   * reads go through consumequeue.source.LayeredSource (old files below
#     the divided offset, DLedger above), so old consume queue units and
#     index items keep working and new dispatches continue the same queues;
#   * retention: old segments expire by the broker's rules (fileReservedTime,
#     deleteWhen, disk ratio), oldest first, the last one included; DLedger
#     segments are not deleted while any old one exists (a retention floor),
#     so deletion never leaves a hole at the boundary;
#   * the first leader imports the old tables through the log, before it
#     accepts writes (ImportingMetadata wraps the metadata service's
#     leader barrier), once: the import ends with a marker offset
#     (IMPORT_MARK_TOPIC@IMPORT_MARK_GROUP) that every later leader sees in
#     the replicated tables and so never imports again.
import json
import logging
import os
import time

import attrs

from commitlog.segments import fsync_dir, list_segment_files
from consumequeue.files import write_atomic
from consumequeue.source import CommitlogSource, LayeredSource
from native.dispatch import MODE_PLAIN

log = logging.getLogger("ledgermq.migration")

MARKER_FILE = "ledgermq-divided.json"
IMPORT_FILE = "ledgermq-import.json"
LEGACY_COMMITLOG = "commitlog"
IMPORT_MARK_TOPIC = "rmq_sys_LEDGERMQ_TOPIC_CONFIG"  # internal: hidden from topic and offset lists
IMPORT_MARK_GROUP = "LEDGERMQ_MIGRATION_IMPORT"
NO_FLOOR = 1 << 62


@attrs.frozen
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
        return cls(int(o["dividedOffset"]), int(o["legacyBegin"]), int(o["legacyEnd"]),
                   int(o["legacySegmentSize"]), int(o.get("legacyRecords", 0)), str(o.get("importId", "")))


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


def log_identity(marker: "DividedLog | None") -> dict[str, str]:
    """What replicas of one group must share for the log's positions to
    mean the same bytes, compared by the peer handshake: where the DLedger
    log begins (0, or the divided offset of a migrated store) and, for a
    migrated store, where its old data ends."""
    if marker is None:
        return {"origin": "0"}
    return {"origin": str(marker.divided), "legacyEnd": str(marker.legacy_end)}


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


def needs_upgrade(root: str, self_id: str) -> bool:
    """An old commitlog with records and no migrated DLedger store yet: what
    makes the broker upgrade in place on start (enableDLegerCommitLog)."""
    store_dir = store_dir_of(root, self_id)
    if os.path.exists(os.path.join(store_dir, MARKER_FILE)):
        return False
    return any(length > 0 for _, _, length in legacy_segments(root))


def layered_source(store, marker: DividedLog) -> LayeredSource:
    from consumequeue.service import source_for
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
    from consumequeue.dispatcher import DispatchEngine
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
    from tools.migrate.plainlog import dispatch_plain, plain_engine
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


def rebuild_migrated(root: str, store, marker: DividedLog, *, config=None, backend=None, progress=None):
    """consumequeue.rebuild.rebuild_store for a migrated store: reset, the
    old commitlog in plain mode, then the committed DLedger log."""
    import time as _time
    from consumequeue.dispatcher import DispatchEngine
    from consumequeue.rebuild import RebuildReport
    from consumequeue.service import positions
    t0 = _time.perf_counter()
    p = positions(store)
    source = layered_source(store, marker)
    engine = DispatchEngine(root, source, config=config, backend=backend)
    begin = source.begin_pos if source.legacy_present() else p.begin_pos
    try:
        engine.reset(begin)
        if source.legacy_present():
            redispatch_legacy(engine, marker)
        total = p.committed_pos - begin
        cb = (lambda pos: progress(pos - begin, total)) if progress else None
        engine.dispatch_to(p.committed_pos, progress=cb)
        engine.checkpoint()
        return RebuildReport(root, begin, p.committed_pos, p.committed_index, _time.perf_counter() - t0,
                             engine.stats, len(engine.cqs.queues), len(engine.index.files))
    finally:
        engine.close()
        source.close()


def legacy_floor(source: LayeredSource):
    """A retention floor for the DLedger store: nothing while old segments exist."""
    return lambda: 0 if source.legacy_present() else NO_FLOOR


def legacy_retention_pass(source: LayeredSource, *, file_reserved_hours: int, delete_when, max_used_ratio: float,
                          now: float | None = None, used_ratio: float | None = None) -> list[str]:
    """Delete expired old segments, oldest first (RocketMQ's rules: older
    than fileReservedTime during the deleteWhen hours, or any hour when the
    disk is fuller than the ratio).  Returns the deleted paths."""
    from commitlog.retention import disk_used_ratio
    legacy = source.legacy
    now = time.time() if now is None else now
    ratio = disk_used_ratio(legacy.data_dir) if used_ratio is None else used_ratio
    if time.localtime(now).tm_hour not in delete_when and ratio < max_used_ratio:
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


# --- the one-time import of the old config tables ------------------------------

def load_import(store_dir: str) -> dict | None:
    try:
        with open(os.path.join(store_dir, IMPORT_FILE), "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return None


def write_import(store_dir: str, data: dict) -> None:
    write_atomic(os.path.join(store_dir, IMPORT_FILE), json.dumps(data, sort_keys=True).encode())


def imported(metadata) -> bool:
    return metadata.state.offsets.query(IMPORT_MARK_TOPIC, IMPORT_MARK_GROUP, 0) is not None


def import_ops(data: dict, marker_value: int) -> list:
    """The metadata ops that carry the old tables: topic and group upserts,
    offset resets, delay offsets, and last the import mark (entries commit
    in order, so a committed mark means everything before it is in)."""
    from broker.metadata.records import DelayOffsetCommit, GroupUpsert, OffsetReset, TopicUpsert
    from broker.metadata.tables import InvalidMetadataError, SubscriptionGroupConfig, TopicConfig
    from broker.metadata import is_internal_topic
    ops = []
    for name, cfg in sorted(data.get("topics", {}).items()):
        try:
            if not is_internal_topic(name):
                ops.append(TopicUpsert(TopicConfig.from_json({**cfg, "topicName": name})))
        except (InvalidMetadataError, TypeError, ValueError) as exc:
            log.warning("not importing topic %r: %s", name, exc)
    for name, cfg in sorted(data.get("groups", {}).items()):
        try:
            ops.append(GroupUpsert(SubscriptionGroupConfig.from_json({**cfg, "groupName": name})))
        except (InvalidMetadataError, TypeError, ValueError) as exc:
            log.warning("not importing subscription group %r: %s", name, exc)
    for key, queues in sorted(data.get("offsets", {}).items()):
        try:
            ops.append(OffsetReset({key: {int(q): int(o) for q, o in queues.items()}}))
        except (InvalidMetadataError, TypeError, ValueError) as exc:
            log.warning("not importing consumer offsets of %r: %s", key, exc)
    delays = data.get("delayOffsets") or {}
    if delays:
        try:
            ops.append(DelayOffsetCommit({int(k): int(v) for k, v in delays.items()}))
        except (InvalidMetadataError, TypeError, ValueError) as exc:
            log.warning("not importing delay offsets: %s", exc)
    ops.append(OffsetReset({f"{IMPORT_MARK_TOPIC}@{IMPORT_MARK_GROUP}": {0: marker_value}}))
    return ops


class ImportingMetadata:
    """What the role gate sees as the metadata service on a migrated store:
    the leader barrier, then (once per group) the import, so the first
    master serves the old offsets from its first request on.  Everything
    else -- attribute reads and writes alike -- goes to the real service."""

    def __init__(self, metadata, store_dir: str, marker: DividedLog):
        object.__setattr__(self, "_inner", (metadata, store_dir, marker))

    async def leader_barrier(self, timeout: float = float("inf")) -> int:
        metadata, store_dir, marker = self._inner
        index = await metadata.leader_barrier(timeout)
        if imported(metadata):
            return index
        data = load_import(store_dir)
        if data is None:
            log.warning("%s: no %s; the old config tables are not imported", store_dir, IMPORT_FILE)
            return index
        ops = import_ops(data, marker.divided)
        index = await metadata.import_ops(ops)
        log.info("imported the master-slave config tables (%d ops, import %s)", len(ops), data.get("importId"))
        return index

    def __getattr__(self, name):
        return getattr(self._inner[0], name)

    def __setattr__(self, name, value):
        setattr(self._inner[0], name, value)
