# Owns the in-place upgrade of one master-slave store onto a DLedger store
# (`mqadmin migrate apply`, and the broker's automatic upgrade on start):
#
#   1. recover the old commitlog read-only (consumequeue.legacy_store): its valid
#      end is the old write position; damage in the middle refuses
#   2. complete the old consume queues and index up to that end (plain-mode
#      dispatch; a stock broker's reput may lag its commitlog), then record
#      ledgermq's dispatch state at the divided offset, so dispatch of the
#      DLedger log continues the same queues with the next queue offsets
#   3. capture config/{topics,subscriptionGroup,consumerOffset,delayOffset}.json
#      into dledger-<id>/ledgermq-import.json (the first leader imports it
#      through the log) and move those files, unchanged, to
#      migration-backup/config/: left in config/ they would be each node's
#      own unreplicated metadata base
#   4. create the DLedger store empty, continuing at the divided offset
#      (consumequeue.migrated.divided_offset: RocketMQ's
#      dividedCommitlogOffset, from the old files alone); its first data
#      file is named by that offset rounded down to the DLedger segment size
#      (mappedFileSizeCommitLog), as DLedger's rebuildWithPos names it
#      (SegmentedStore.reset_to)
#   5. write the marker (consumequeue.migrated) -- last, atomically
#
# The old commitlog segments are never written (RocketMQ writes a BLANK at
# the old write position; we treat the rest of the last old segment as that
# BLANK instead).  Every step is idempotent, so an interrupted apply is
# resumed by running it again; plan_apply() is the dry run.
import hashlib
import json
import os

import attrs

from broker.metadata.snapshot import read_config_dir
from broker.store.migrated import IMPORT_FILE, write_import
from commitlog.atomicfile import fsync_dir
from commitlog.store import SegmentedStore, StoreConfig
from consumequeue.checkpoint import StoreCheckpoint
from consumequeue.legacy_store import LegacyStore
from consumequeue.migrated import DividedLog, divided_offset, load_marker, store_dir_of, write_marker
from consumequeue.plainlog import dispatch_plain, dispatched_end, plain_engine

BACKUP_DIR = "migration-backup"
# The DLedger data segment size when none is given: the broker's default
# mappedFileSizeCommitLog, so that `migrate apply` on one node and the
# broker's upgrade on start on another agree unless configured otherwise.
DEFAULT_DATA_SEGMENT_SIZE = StoreConfig.__attrs_attrs__.data_segment_size.default
IMPORTED_CONFIGS = ("topics.json", "subscriptionGroup.json", "consumerOffset.json", "delayOffset.json")


class MigrationError(ValueError):
    """The store cannot be migrated as it is (the message says why)."""


@attrs.define
class ApplyPlan:
    root: str
    self_id: str
    legacy_begin: int = 0
    legacy_end: int = 0
    legacy_records: int = 0
    legacy_segment_size: int = 0
    recovery: str = ""
    divided: int = 0
    data_segment_size: int = 0
    cq_resume: int = 0  # old consume queues hold everything below this
    configs: list = attrs.Factory(list)  # config files to import
    already: bool = False  # a previous apply finished
    warnings: list = attrs.Factory(list)
    actions: list = attrs.Factory(list)

    def to_json(self) -> dict:
        return {"root": self.root, "selfId": self.self_id, "legacyBegin": self.legacy_begin,
                "legacyEnd": self.legacy_end, "legacyRecords": self.legacy_records,
                "legacySegmentSize": self.legacy_segment_size, "recovery": self.recovery,
                "dividedOffset": self.divided, "dataSegmentSize": self.data_segment_size,
                "cqResume": self.cq_resume, "configs": self.configs, "alreadyApplied": self.already,
                "warnings": self.warnings, "actions": self.actions}


def _import_data(configs: dict) -> dict:
    topics = ((configs.get("topics") or {}).get("topicConfigTable") or {})
    groups = ((configs.get("subscriptionGroup") or {}).get("subscriptionGroupTable") or {})
    offsets = ((configs.get("consumerOffset") or {}).get("offsetTable") or {})
    delays = ((configs.get("delayOffset") or {}).get("offsetTable") or {})
    data = {"topics": topics, "groups": groups,
            "offsets": {k: {str(q): int(o) for q, o in v.items()} for k, v in offsets.items()},
            "delayOffsets": {str(k): int(v) for k, v in delays.items()}}
    data["importId"] = hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
    return data


def _check_not_running(root: str) -> None:
    """A stock broker holds a POSIX lock on ${root}/lock while it runs
    (FileChannel.tryLock); migrating under it would race its writes."""
    import fcntl
    path = os.path.join(root, "lock")
    if not os.path.exists(path):
        return
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(fd, fcntl.LOCK_UN)
    except OSError:
        raise MigrationError(f"{path} is locked: a broker is running on this store; stop it first") from None
    finally:
        os.close(fd)


def plan_apply(root: str, self_id: str, *, data_segment_size: int | None = None) -> ApplyPlan:
    """What apply() would do (the dry run); MigrationError when it would refuse."""
    root = os.path.abspath(root)
    plan = ApplyPlan(root, self_id)
    store_dir = store_dir_of(root, self_id)
    marker = load_marker(store_dir)
    if marker is not None:
        plan.already = True
        plan.divided, plan.legacy_end = marker.divided, marker.legacy_end
        plan.actions.append(f"nothing: {store_dir} was migrated already (divided offset {marker.divided})")
        return plan
    _check_not_running(root)
    with LegacyStore(root) as old:
        rec = old.recover()
        plan.legacy_begin, plan.legacy_end, plan.legacy_records = rec.begin, rec.end, rec.records
        plan.legacy_segment_size, plan.recovery = old.segment_size, rec.stop
        if rec.data_after:
            raise MigrationError(f"{old.commitlog_dir}: {rec.reason or rec.stop} at {rec.end} with data after it; "
                                 f"run `mqadmin migrate check` and align this copy first")
        if not rec.clean:
            plan.warnings.append(f"the old commitlog ends at {rec.end} ({rec.reason}); the bytes after it are "
                                 f"ignored as a stock broker's recovery would")
        if old.abort_present:
            plan.warnings.append("the old broker did not shut down cleanly (abort file); "
                                 "its consume queues are completed from the commitlog")
        plan.configs = sorted(n + ".json" for n in read_config_dir(root))
    seg = data_segment_size or DEFAULT_DATA_SEGMENT_SIZE
    plan.data_segment_size = seg
    plan.divided = divided_offset(plan.legacy_end, plan.legacy_segment_size)
    if seg != plan.legacy_segment_size:
        plan.warnings.append(f"mappedFileSizeCommitLog {seg} differs from the old files' segment size "
                             f"{plan.legacy_segment_size}: the old part keeps its {plan.legacy_segment_size}-byte "
                             f"segments (the divided offset {plan.divided} comes from them), the DLedger data "
                             f"uses {seg}-byte segments, and every replica of the group must use {seg} too")
    data_dir = os.path.join(store_dir, "data")
    first_file = f"{plan.divided - plan.divided % seg:020d}"
    if os.path.isdir(data_dir) and any(n != first_file for n in os.listdir(data_dir)):
        raise MigrationError(f"{data_dir} already holds DLedger data that does not start at {plan.divided}")
    engine = plain_engine(root, segment_size=plan.legacy_segment_size)
    try:
        plan.cq_resume = min(dispatched_end(engine), plan.legacy_end)
        problems = engine.cqs.problems()
    finally:
        engine.close()
        engine.source.close()
    if problems:
        plan.warnings.append("old consume queues are damaged and will be rebuilt: " + "; ".join(problems))
        plan.cq_resume = plan.legacy_begin
    todo = plan.legacy_end - max(plan.cq_resume, plan.legacy_begin)
    plan.actions.append(f"complete the old consume queues and index: dispatch {todo} bytes "
                        f"[{max(plan.cq_resume, plan.legacy_begin)}, {plan.legacy_end})" if todo > 0
                        else "old consume queues and index are complete")
    plan.actions.append(f"capture {', '.join(c for c in IMPORTED_CONFIGS if c in plan.configs) or 'no config'} "
                        f"into {os.path.join(store_dir, IMPORT_FILE)} and move them to {BACKUP_DIR}/config/")
    plan.actions.append(f"create {data_dir}/{plan.divided:020d}: the DLedger log continues at the divided offset "
                        f"{plan.divided} (old data ends at {plan.legacy_end})")
    plan.actions.append("write the migration marker; the old commitlog files are not modified")
    return plan


def apply(root: str, self_id: str, *, data_segment_size: int | None = None,
          index_segment_size: int | None = None, progress=None, dry_run: bool = False) -> ApplyPlan:
    """Migrate `root` in place (see the module comment); `progress(done,
    total)` follows the consume queue completion.  Returns the plan it
    carried out."""
    plan = plan_apply(root, self_id, data_segment_size=data_segment_size)
    if dry_run or plan.already:
        return plan
    root, store_dir = plan.root, store_dir_of(plan.root, self_id)
    _complete_consume_queues(plan, progress)
    _capture_configs(plan, store_dir)
    _create_dledger_store(plan, index_segment_size)
    write_marker(store_dir, DividedLog(plan.divided, plan.legacy_begin, plan.legacy_end, plan.legacy_segment_size,
                                       plan.legacy_records, _import_id(store_dir)))
    return plan


def _import_id(store_dir: str) -> str:
    from broker.store.migrated import load_import
    data = load_import(store_dir) or {}
    return str(data.get("importId", ""))


def _complete_consume_queues(plan: ApplyPlan, progress) -> None:
    engine = plain_engine(plan.root, segment_size=plan.legacy_segment_size)
    try:
        if engine.cqs.problems():
            engine.reset(plan.legacy_begin)
        # Units beyond the recovered end point at a torn tail: cut them.
        # Then resume after the last unit the queues hold; index items past
        # it (an interrupted earlier run wrote them before its queue units)
        # go too, or the re-dispatch would index those messages twice.
        engine.cqs.truncate_phy(plan.legacy_end)
        start = max(plan.legacy_begin, dispatched_end(engine))
        engine.index.truncate_phy(start, engine.store_timestamp_of)
        total = plan.legacy_end - start
        cb = (lambda pos: progress(pos - start, total)) if progress and total > 0 else None
        dispatch_plain(engine, plan.legacy_begin, plan.legacy_end, progress=cb)
        old = StoreCheckpoint.load(plan.root)
        engine.last_store_timestamp = old.physic_msg_timestamp if old else 0
        engine.pos, engine.last_index = plan.divided, -1
        engine.checkpoint()  # dispatch_state.json + checkpoint: DLedger dispatch resumes at the divided offset
    finally:
        engine.close()
        engine.source.close()


def _capture_configs(plan: ApplyPlan, store_dir: str) -> None:
    os.makedirs(store_dir, exist_ok=True)
    cdir = os.path.join(plan.root, "config")
    backup = os.path.join(plan.root, BACKUP_DIR, "config")
    if not os.path.exists(os.path.join(store_dir, IMPORT_FILE)):
        configs = read_config_dir(plan.root)
        for name in IMPORTED_CONFIGS:  # moved by an interrupted earlier run
            path = os.path.join(backup, name)
            if name[:-5] not in configs and os.path.exists(path):
                from broker.metadata import fastjson
                with open(path, "rb") as f:
                    configs[name[:-5]] = fastjson.loads(f.read())
        write_import(store_dir, _import_data(configs))
    os.makedirs(backup, exist_ok=True)
    moved = False
    for name in IMPORTED_CONFIGS:
        src = os.path.join(cdir, name)
        if os.path.exists(src):
            with open(src, "rb") as f:
                if b"ledgermqAppliedIndex" in f.read():
                    continue  # our own snapshot (not a stock file)
            os.replace(src, os.path.join(backup, name))
            moved = True
    if moved:
        fsync_dir(backup)
        fsync_dir(cdir)


def _create_dledger_store(plan: ApplyPlan, index_segment_size: int | None) -> None:
    kw = {"index_segment_size": index_segment_size} if index_segment_size else {}
    store = SegmentedStore.open(StoreConfig(plan.root, self_id=plan.self_id,
                                            data_segment_size=plan.data_segment_size, **kw))
    try:
        if store.end_index >= 0:
            raise MigrationError(f"{store.store_dir} already has entries; not migrating over them")
        if store.end_pos != plan.divided:
            store.reset_to(0, plan.divided, 0, 0)
        store.flush()
    finally:
        store.close()
