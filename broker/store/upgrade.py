# Owns the in-place upgrade of one master-slave store onto a DLedger store
# (`mqadmin migrate apply`, and the broker's automatic upgrade on start):
#
#   1. recover the old commitlog read-only (consumequeue.legacy_store): its
#      valid end is the old write position; damage in the middle refuses;
#   2. complete the old consume queues up to that end (plain-mode dispatch: a
#      stock broker's reput may lag) and the index: one holding every keyed
#      message is kept, one covering the queues' part is completed, any other
#      is rebuilt deterministically (consumequeue.rebuild.rebuild_plain_index),
#      so every replica migrated from one aligned commitlog holds the same
#      index files; then record the dispatch state at the divided offset, so
#      the DLedger log continues the same queues with the next offsets;
#   3. capture config/{topics,subscriptionGroup,consumerOffset,delayOffset}.json
#      into dledger-<id>/ledgermq-import.json (the first leader imports it
#      through the log) and move them, unchanged, to migration-backup/config/
#      (left in config/ they would be each node's unreplicated base);
#   4. create the DLedger store empty at the divided offset
#      (consumequeue.migrated.divided_offset, RocketMQ's
#      dividedCommitlogOffset); its first data file, created by the first
#      append at the segment size apply was given (else the broker names the
#      mismatch), is named by that offset rounded down to the segment size,
#      as DLedger's rebuildWithPos names it (apply's plan names the file);
#   5. write the marker (consumequeue.migrated) -- last, atomically.
#
# Rules.  The old commitlog segments are never written (the rest of the last
# old segment counts as RocketMQ's BLANK).  Every step is idempotent, so an
# interrupted apply is resumed by running it again; plan_apply() is the dry run.
import hashlib
import json
import logging
import os
from types import SimpleNamespace

import attrs

from broker.metadata.snapshot import read_config_dir
from broker.store.migrated import IMPORT_FILE, write_import
from commitlog.atomicfile import fsync_dir
from commitlog.store import SegmentedStore, StoreConfig
from consumequeue.checkpoint import StoreCheckpoint
from consumequeue.cq import ConsumeQueueStore
from consumequeue.dispatcher import DispatchConfig
from consumequeue.indexfile import IndexService
from consumequeue.legacy_store import LegacyStore
from consumequeue.migrated import DividedLog, divided_offset, load_marker, store_dir_of, write_marker
from consumequeue.plainlog import dispatch_plain, dispatched_end, plain_engine
from consumequeue.rebuild import rebuild_plain_index

log = logging.getLogger("ledgermq.migration")

BACKUP_DIR = "migration-backup"
# The DLedger data segment size when none is given: the broker's default
# mappedFileSizeCommitLog, so that `migrate apply` on one node and the
# broker's upgrade on start on another agree unless configured otherwise.
DEFAULT_DATA_SEGMENT_SIZE = StoreConfig.__attrs_attrs__.data_segment_size.default
IMPORTED_CONFIGS = ("topics.json", "subscriptionGroup.json", "consumerOffset.json", "delayOffset.json")
# What apply does with the old index (ApplyPlan.index_action).
INDEX_KEEP = "keep"  # it holds every keyed message of the old log
INDEX_COMPLETE = "complete"  # it covers the consume queues' part; the rest is indexed with them
INDEX_REBUILD = "rebuild"  # anything else: rebuilt from the old commitlog


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
    index_action: str = INDEX_KEEP
    index_reason: str = ""  # why the index is not kept as it is
    index: dict = attrs.Factory(dict)  # the old index's coverage (IndexCoverage.to_json)
    first_data_file: str = ""  # the DLedger data file the first append creates (its path)
    configs: list = attrs.Factory(list)  # config files to import
    already: bool = False  # a previous apply finished
    warnings: list = attrs.Factory(list)
    actions: list = attrs.Factory(list)
    done: list = attrs.Factory(list)  # what apply did (empty for a dry run)

    def to_json(self) -> dict:
        return {"root": self.root, "selfId": self.self_id, "legacyBegin": self.legacy_begin,
                "legacyEnd": self.legacy_end, "legacyRecords": self.legacy_records,
                "legacySegmentSize": self.legacy_segment_size, "recovery": self.recovery,
                "dividedOffset": self.divided, "dataSegmentSize": self.data_segment_size,
                "firstDataFile": self.first_data_file, "cqResume": self.cq_resume,
                "index": {**self.index, "action": self.index_action, "reason": self.index_reason},
                "configs": self.configs, "alreadyApplied": self.already,
                "warnings": self.warnings, "actions": self.actions, "done": self.done}


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
        cqs = ConsumeQueueStore(root, readonly=True).load()
        try:
            plan.cq_resume = min(dispatched_end(SimpleNamespace(cqs=cqs)), plan.legacy_end)  # (reads .cqs only)
            problems = cqs.problems()
        finally:
            cqs.close()
        if problems:
            plan.warnings.append("old consume queues are damaged and will be rebuilt: " + "; ".join(problems))
            plan.cq_resume = plan.legacy_begin
        cq_start = max(plan.cq_resume, plan.legacy_begin)
        _plan_index(plan, old, cq_start, rebuild_cqs=bool(problems))
    seg = data_segment_size or DEFAULT_DATA_SEGMENT_SIZE
    plan.data_segment_size = seg
    plan.divided = divided_offset(plan.legacy_end, plan.legacy_segment_size)
    if seg != plan.legacy_segment_size:
        plan.warnings.append(f"mappedFileSizeCommitLog {seg} differs from the old files' segment size "
                             f"{plan.legacy_segment_size}: the old part keeps its {plan.legacy_segment_size}-byte "
                             f"segments (the divided offset {plan.divided} comes from them), the DLedger data "
                             f"uses {seg}-byte segments, and every replica of the group must use {seg} too")
    data_dir = os.path.join(store_dir, "data")
    first = plan.divided - plan.divided % seg  # as DLedger's rebuildWithPos names it
    plan.first_data_file = os.path.join(data_dir, f"{first:020d}")
    if os.path.isdir(data_dir) and any(n != f"{first:020d}" for n in os.listdir(data_dir)):
        raise MigrationError(f"{data_dir} already holds DLedger data that does not start at {plan.divided}")
    todo = plan.legacy_end - cq_start
    with_index = " and index" if plan.index_action == INDEX_COMPLETE else ""
    plan.actions.append(f"complete the old consume queues{with_index}: dispatch {todo} bytes "
                        f"[{cq_start}, {plan.legacy_end})" if todo > 0 else "old consume queues are complete")
    idx = plan.index
    if plan.index_action == INDEX_KEEP:
        plan.actions.append(f"old index is complete ({idx.get('files', 0)} IndexFile(s)): kept as it is")
    elif plan.index_action == INDEX_COMPLETE:
        plan.actions.append(f"old index covers the messages below {cq_start}; the rest is indexed with the "
                            f"consume queues")
    else:
        plan.actions.append(f"rebuild the index from the old commitlog [{plan.legacy_begin}, {plan.legacy_end}): "
                            f"{plan.index_reason}")
    plan.actions.append(f"capture {', '.join(c for c in IMPORTED_CONFIGS if c in plan.configs) or 'no config'} "
                        f"into {os.path.join(store_dir, IMPORT_FILE)} and move them to {BACKUP_DIR}/config/")
    where = (f"{seg}-byte segments; {plan.divided} is a segment start" if first == plan.divided else
             f"the divided offset rounded down to the {seg}-byte segment size, as DLedger names it; the "
             f"bytes before {plan.divided} in it stay zero")
    plan.actions.append(f"create the DLedger store continuing at the divided offset {plan.divided} (old data "
                        f"ends at {plan.legacy_end}); its first data file, written by the first append, is "
                        f"{plan.first_data_file} ({where})")
    plan.actions.append("write the migration marker; the old commitlog files are not modified")
    return plan


def _plan_index(plan: ApplyPlan, old: LegacyStore, cq_start: int, *, rebuild_cqs: bool) -> None:
    """Decide what apply does with the old index (INDEX_KEEP, INDEX_COMPLETE,
    INDEX_REBUILD; see the module comment)."""
    full = old.index_coverage(plan.legacy_end)
    plan.index = full.to_json()
    if rebuild_cqs:
        plan.index_action = INDEX_REBUILD
        plan.index_reason = "the consume queues are rebuilt, and the index with them"
        return
    if full.complete:
        plan.index_action = INDEX_KEEP
        return
    if cq_start > plan.legacy_begin and full.state == "incomplete" and old.index_coverage(cq_start).complete:
        plan.index_action = INDEX_COMPLETE  # a lagging reput (or align's cut): both end about cq_start
        plan.index_reason = full.reason
        return
    plan.index_action, plan.index_reason = INDEX_REBUILD, full.reason


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
    if plan.index_action == INDEX_REBUILD:
        r = rebuild_plain_index(root, plan.legacy_begin, plan.legacy_end, segment_size=plan.legacy_segment_size,
                                progress=progress)
        plan.done.append(f"rebuilt the index from the old commitlog: {r.files} IndexFile(s), {r.keys} keys of "
                         f"{r.messages} messages")
    _record_dispatch_state(plan)
    _capture_configs(plan, store_dir)
    _create_dledger_store(plan, index_segment_size)
    write_marker(store_dir,
                 DividedLog(divided=plan.divided, legacy_begin=plan.legacy_begin, legacy_end=plan.legacy_end,
                            legacy_segment_size=plan.legacy_segment_size, legacy_records=plan.legacy_records,
                            import_id=_import_id(store_dir)))
    for line in plan.done:  # the broker's upgrade on start says it in its log
        log.info("%s: migration: %s", self_id, line)
    return plan


def _import_id(store_dir: str) -> str:
    from broker.store.migrated import load_import
    data = load_import(store_dir) or {}
    return str(data.get("importId", ""))


def _complete_consume_queues(plan: ApplyPlan, progress) -> None:
    """Dispatch the old log past what its consume queues hold (their index
    entries too with INDEX_COMPLETE; a kept index already has them, a
    rebuilt one gets them all afterwards)."""
    if plan.index_action == INDEX_REBUILD:
        IndexService(plan.root).destroy()  # perhaps damaged: rebuilt after the queues
    config = DispatchConfig(index_enabled=plan.index_action == INDEX_COMPLETE)
    engine = plain_engine(plan.root, segment_size=plan.legacy_segment_size, config=config)
    try:
        if engine.cqs.problems():
            engine.reset(plan.legacy_begin)
        # Units beyond the recovered end point at a torn tail: cut them.
        # Then resume after the last unit the queues hold; index items past
        # it (an interrupted earlier run wrote them before its queue units)
        # go too, or the re-dispatch would index those messages twice.  A
        # kept index loses only items past the recovered end.
        engine.cqs.truncate_phy(plan.legacy_end)
        start = max(plan.legacy_begin, dispatched_end(engine))
        cut = start if plan.index_action == INDEX_COMPLETE else plan.legacy_end
        engine.index.truncate_phy(cut, engine.store_timestamp_of)
        total = plan.legacy_end - start
        cb = (lambda pos: progress(pos - start, total)) if progress and total > 0 else None
        dispatch_plain(engine, plan.legacy_begin, plan.legacy_end, progress=cb)
    finally:
        engine.close()
        engine.source.close()
    if total > 0:
        plan.done.append(f"completed the old consume queues{' and index' if config.index_enabled else ''}: "
                         f"dispatched [{start}, {plan.legacy_end})")


def _record_dispatch_state(plan: ApplyPlan) -> None:
    """dispatch_state.json + checkpoint over the completed queues and index:
    DLedger dispatch resumes at the divided offset."""
    engine = plain_engine(plan.root, segment_size=plan.legacy_segment_size)
    try:
        old = StoreCheckpoint.load(plan.root)
        engine.last_store_timestamp = old.physic_msg_timestamp if old else 0
        engine.pos, engine.last_index = plan.divided, -1
        engine.checkpoint()
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
    plan.done.append(f"created the DLedger store {store.store_dir}, empty, continuing at {plan.divided}; its first "
                     f"append creates {plan.first_data_file}")
