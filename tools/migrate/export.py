# Owns the way back (`mqadmin migrate export --store ROOT --to DIR`): a
# plain master-slave store written from a stopped ledgermq store's
# committed data, in the formats a stock RocketMQ broker reads --
#
#   commitlog/   every committed message record, in log order: the old
#                commitlog's records of a migrated store first (while they
#                exist), then the body of every committed NORMAL DLedger
#                entry; records are copied unchanged except PHYSICALOFFSET
#                (their new position: the DLedger headers are gone, so
#                offsetMsgIds change) -- QUEUEOFFSETs are kept, so consumer
#                offsets stay valid; BLANK fillers at segment ends
#   consumequeue/, index/   dispatched from that commitlog (plain mode)
#   checkpoint   stock format
#   config/      topics, subscription groups, consumer offsets (and delay
#                offsets): the replicated metadata as of the last committed
#                entry (snapshot + replay of the log after it)
#
# The metadata records themselves (internal rmq_sys_LEDGERMQ_* topics) and
# NOOP entries are not exported.  The store is written under DIR.partial
# and renamed to DIR when complete; an interrupted export is started over.
# The result is read back (consumequeue.legacy_store recovery + the consume queue
# verifier) before export() returns.
import os
import shutil

import attrs

from broker.metadata import snapshot as meta_snapshot
from broker.metadata.records import INTERNAL_TOPICS, parse_op
from broker.store.migrated import IMPORT_MARK_GROUP
from commitlog.atomicfile import fsync_dir
from commitlog.entry import MAGIC_NORMAL
from consumequeue import record as M
from consumequeue.legacy_store import LegacyStore
from consumequeue.migrated import load_marker
from consumequeue.plainlog import (
    PlainCommitlogWriter,
    dispatch_plain,
    plain_engine,
    write_fastjson,
    write_stock_checkpoint,
)

READ_BATCH = 256


@attrs.define
class ExportReport:
    root: str
    to: str
    legacy_records: int = 0
    dledger_records: int = 0
    skipped: int = 0  # metadata records and NOOPs
    end: int = 0
    committed_index: int = -1
    problems: list = attrs.Factory(list)
    dry_run: bool = False

    @property
    def records(self) -> int:
        return self.legacy_records + self.dledger_records

    def to_json(self) -> dict:
        return {"root": self.root, "to": self.to, "legacyRecords": self.legacy_records,
                "dledgerRecords": self.dledger_records, "records": self.records, "skipped": self.skipped,
                "end": self.end, "committedIndex": self.committed_index, "problems": self.problems,
                "dryRun": self.dry_run}


def _legacy_part(root: str, marker):
    """LegacyStore of a migrated store's old commitlog while it exists."""
    if marker is None or not os.path.isdir(os.path.join(root, "commitlog")):
        return None
    try:
        return LegacyStore(root)
    except ValueError:
        return None  # retention removed every old segment


def export(root: str, to: str, *, self_id: str | None = None, segment_size: int | None = None,
           dry_run: bool = False, progress=None) -> ExportReport:
    """Write the plain store (see the module comment); `progress(done,
    total)` counts DLedger entries."""
    from consumequeue.rebuild import find_self_id, open_store
    root, to = os.path.abspath(root), os.path.abspath(to)
    self_id = self_id or find_self_id(root)
    report = ExportReport(root, to, dry_run=dry_run)
    if os.path.exists(to) and os.listdir(to):
        raise ValueError(f"{to} exists and is not empty")
    store = open_store(root, self_id)  # its lock keeps a running broker out
    marker = load_marker(store.store_dir)
    legacy = _legacy_part(root, marker)
    seg = segment_size or (legacy.segment_size if legacy is not None else store.data_segment_size)
    partial = to + ".partial"
    try:
        state = meta_snapshot.load_snapshot(root).state
        report.committed_index = committed = store.committed_index
        if dry_run:
            if legacy is not None:
                report.legacy_records = legacy.recovery.records
            report.dledger_records = max(0, committed - max(store.begin_index, 0) + 1)
            return report
        shutil.rmtree(partial, ignore_errors=True)
        writer = PlainCommitlogWriter(partial, seg)
        last_ts = 0
        try:
            if legacy is not None:
                end = min(legacy.end, marker.legacy_end)
                for view, res in legacy.batches(legacy.begin, end):
                    for i in range(res.n):
                        r = res.record(i)
                        writer.append(legacy.read(r.phy_offset, r.size))
                        last_ts = max(last_ts, r.store_timestamp)
                        report.legacy_records += 1
            first = max(store.begin_index, 0)
            for index in range(first, committed + 1):
                e = store.get(index)
                if e.magic != MAGIC_NORMAL or not M.looks_like_record(e.body):
                    report.skipped += 1
                    continue
                topic, _, _ = M.read_topic_queue(e.body)
                if topic in INTERNAL_TOPICS:
                    if index > state.applied_index:
                        rec = M.decode(e.body)
                        state.apply(parse_op(topic, rec.body), index, rec.store_timestamp)
                    report.skipped += 1
                    continue
                writer.append(bytes(e.body))
                last_ts = max(last_ts, M.read_store_timestamp(e.body))
                report.dledger_records += 1
                if progress and index % READ_BATCH == 0:
                    progress(index - first + 1, committed - first + 1)
        finally:
            writer.close()
        report.end = writer.pos
        engine = plain_engine(partial, segment_size=seg)
        try:
            dispatch_plain(engine, 0, writer.pos)
        finally:
            engine.close()
            engine.source.close()
        write_stock_checkpoint(partial, last_ts, last_ts, last_ts)
        _write_configs(partial, state)
    finally:
        if legacy is not None:
            legacy.close()
        store.close()
    if os.path.isdir(to):
        os.rmdir(to)
    os.replace(partial, to)
    fsync_dir(os.path.dirname(to))
    report.problems = verify_plain_store(to, expect_records=report.records)
    return report


def _write_configs(root: str, state) -> None:
    from broker.metadata.records import is_internal_topic
    cdir = os.path.join(root, "config")
    write_fastjson(os.path.join(cdir, "topics.json"), {
        "dataVersion": state.topics.data_version.to_json(),
        "topicConfigTable": {n: c.to_json() for n, c in state.topics.topics.items() if not is_internal_topic(n)}})
    write_fastjson(os.path.join(cdir, "subscriptionGroup.json"), {
        "dataVersion": state.groups.data_version.to_json(),
        "subscriptionGroupTable": {n: c.to_json() for n, c in state.groups.groups.items()
                                   if n != IMPORT_MARK_GROUP}})
    write_fastjson(os.path.join(cdir, "consumerOffset.json"), {
        "dataVersion": state.offsets.data_version.to_json(),
        "offsetTable": {k: {int(q): o for q, o in v.items()} for k, v in state.offsets.offsets.items()
                        if not is_internal_topic(k.partition("@")[0])}})
    delays = getattr(state, "delay_offsets", None)
    write_fastjson(os.path.join(cdir, "delayOffset.json"),
                   {"offsetTable": {int(k): v for k, v in sorted(delays.offsets.items())} if delays else {}})


def verify_plain_store(root: str, *, expect_records: int | None = None) -> list[str]:
    """Read a plain store back: recovery must be clean (and find the
    expected records), and the consume queues and index must match the
    commitlog (consumequeue.verify)."""
    from consumequeue.source import CommitlogSource
    from consumequeue.verify import verify
    from native.dispatch import MODE_PLAIN
    problems = []
    with LegacyStore(root) as s:
        rec = s.recover()
        if not rec.clean:
            problems.append(f"commitlog: {rec.stop} at {rec.end}: {rec.reason}")
        if expect_records is not None and rec.records != expect_records:
            problems.append(f"commitlog: {rec.records} records, expected {expect_records}")
        source = CommitlogSource(s.commitlog_dir, segment_size=s.segment_size, mode=MODE_PLAIN)
        try:
            rep = verify(source, rec.begin, rec.end, root=root, check_cq=True)
        finally:
            source.close()
    problems += [str(p) for p in rep.problems]
    return problems
