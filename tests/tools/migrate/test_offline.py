# Migration from master-slave stores, offline (issue 7): fixture stores
# (tests/helpers/legacy_fixtures.py) with several segments, BLANK fillers, two
# topics x four queues, tags, keys and consumer offsets; `migrate check`
# on a lagging and a diverged slave (detected, explained, planned),
# `migrate align` (then check passes; resumable), `migrate apply` (dry run,
# then real: the divided offset, the first DLedger file's name, the old
# consume queues continued, idempotent, old files byte-identical), reads
# across the boundary through the layered source, retention across the
# boundary, and `migrate export` read back by LegacyStore and the verifier.
# apply keeps a complete old index, completes one that lags with the
# consume queues and rebuilds any other (cut, damaged; a missing one in
# test_replicated.py), saying which; it names the DLedger data file the
# first append creates.  `verifyStore --cq` is clean on every migrated store.
import json
import os

import pytest
from click.testing import CliRunner

from broker.metadata.snapshot import read_config_dir
from broker.store.migrated import MigrationImport, load_import
from commitlog.store import SegmentedStore, StoreConfig
from consumequeue import record as M
from consumequeue.legacy_store import LegacyStore
from consumequeue.migrated import legacy_floor, legacy_retention_pass, load_marker, open_migrated_engine
from consumequeue.reader import GetMessageStatus, message_at, query_by_key, read_messages
from consumequeue.service import positions
from tests.helpers.legacy_fixtures import build_master_slave_store, file_digests
from tests.tools.migrate.checks import index_digests, verify_store_cq
from tools.mqadmin import cli

SEG = 8192


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def as_json(res):
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    return json.loads(res.output)


@pytest.fixture
def trio_of_stores(tmp_path):
    """A master, a slave 13 records behind it, and a slave that took other
    writes from record 100 on."""
    master = build_master_slave_store(tmp_path / "master", segment_size=SEG)
    lagging = build_master_slave_store(tmp_path / "lagging", segment_size=SEG, limit=len(master.messages) - 13)
    diverged = build_master_slave_store(tmp_path / "diverged", segment_size=SEG, diverge_at=100)
    return master, lagging, diverged


def test_fixture_store_is_a_plain_store(trio_of_stores):
    master, _, _ = trio_of_stores
    assert len(os.listdir(master.commitlog_dir)) >= 5
    assert any(m.phy % SEG == 0 for m in master.messages[1:])  # BLANK fillers closed segments
    with LegacyStore(master.root) as s:
        rec = s.recover()
        assert (rec.end, rec.records, rec.clean) == (master.end, len(master.messages), True)
        assert read_config_dir(master.root)["consumerOffset"]["offsetTable"]["TopicA@GroupA"]["3"] == 10
    from tools.migrate.export import verify_plain_store
    assert verify_plain_store(master.root, expect_records=160) == []


def test_check_detects_lagging_and_diverged_and_align_fixes(trio_of_stores, tmp_path):
    master, lagging, diverged = trio_of_stores
    res = run("migrate", "check", "--store", master.root, "--replica", lagging.root, "--json")
    assert res.exit_code == 1
    out = as_json(res)
    rel = {s["root"]: s for s in out["stores"]}
    assert rel[master.root]["relation"] == "reference" and rel[lagging.root]["relation"] == "lagging"
    assert "prefix" in rel[lagging.root]["explanation"]
    assert [len(s["md5"]) for s in out["stores"]] == [2, 2]
    [plan] = out["plan"]
    assert plan["target"] == lagging.root and plan["source"] == master.root
    assert plan["fromOffset"] == lagging.end - lagging.end % SEG and plan["copy"][-1] == f"{master.end - master.end % SEG:020d}"
    # A diverged slave: no winner, refused, the offset named.
    res = run("migrate", "check", "--store", master.root, "--replica", lagging.root, "--replica", diverged.root,
              "--json")
    out = as_json(res)
    assert res.exit_code == 1 and out["reference"] is None and out["plan"] == []
    d = next(s for s in out["stores"] if s["root"] == diverged.root)
    assert d["relation"] == "diverged" and d["firstDifference"] == master.messages[100].phy
    assert "--winner" in d["explanation"] and "--winner" in out["problems"][0]
    text = run("migrate", "check", "--store", master.root, "--replica", diverged.root)
    assert "diverged" in text.output and "NOT READY" in text.output
    res = run("migrate", "align", "--store", master.root, "--replica", diverged.root)
    assert res.exit_code == 1 and "not aligning" in res.output
    # With the master as winner: dry run changes nothing, then align.
    before = file_digests(diverged.root)
    res = run("migrate", "align", "--store", master.root, "--replica", lagging.root, "--replica", diverged.root,
              "--winner", master.root, "--dry-run", "--json")
    assert res.exit_code == 0 and all(x.startswith("would") for x in as_json(res)["done"])
    assert file_digests(diverged.root) == before
    res = run("migrate", "align", "--store", master.root, "--replica", lagging.root, "--replica", diverged.root,
              "--winner", master.root, "--json")
    assert res.exit_code == 0, res.output
    assert any(x.startswith("copied") for x in as_json(res)["done"])
    res = run("migrate", "check", "--store", master.root, "--replica", lagging.root, "--replica", diverged.root)
    assert res.exit_code == 0, res.output
    assert "OK" in res.output.splitlines()[-1]
    # Resumable: running it again copies nothing.
    res = run("migrate", "align", "--store", master.root, "--replica", diverged.root, "--json")
    assert as_json(res)["done"] == []
    # Apply completes the cut consume queues from the aligned commitlog.
    assert run("migrate", "apply", "--store", diverged.root, "--self-id", "n2").exit_code == 0
    store = SegmentedStore.open(StoreConfig(diverged.root, self_id="n2", data_segment_size=SEG))
    engine, _ = open_migrated_engine(store, load_marker(store.store_dir))
    try:
        m = master.messages[150]
        got = read_messages(engine, m.topic, m.queue_id, m.queue_offset, 1)
        assert M.decode(got.records).body == m.body
    finally:
        engine.close()
        engine.source.close()
        store.close()
    verify_store_cq(diverged.root, "n2")


def test_apply_dry_run_then_apply_reads_across_the_boundary(tmp_path):
    fx = build_master_slave_store(tmp_path / "n0", segment_size=SEG)
    digests = file_digests(fx.root)
    res = run("migrate", "apply", "--store", fx.root, "--self-id", "n0", "--segment-size", SEG, "--dry-run", "--json")
    plan = as_json(res)
    divided = fx.end - fx.end % SEG + SEG
    assert plan["dividedOffset"] == divided and plan["legacyEnd"] == fx.end and plan["dryRun"]
    assert not os.path.exists(tmp_path / "n0" / "dledger-n0") and file_digests(fx.root) == digests
    assert plan["index"]["action"] == "keep" and plan["index"]["state"] == "complete"
    assert plan["firstDataFile"] == os.path.join(fx.root, "dledger-n0", "data", f"{divided:020d}")
    index_before = index_digests(fx.root)
    res = run("migrate", "apply", "--store", fx.root, "--self-id", "n0", "--segment-size", SEG)
    assert res.exit_code == 0, res.output
    assert "old index is complete (1 IndexFile(s)): kept as it is" in res.output
    assert index_digests(fx.root) == index_before
    assert f"dividedCommitlogOffset {divided}" in res.output
    # Idempotent: a second apply does nothing.
    assert as_json(run("migrate", "apply", "--store", fx.root, "--self-id", "n0", "--json"))["alreadyApplied"]
    moved = {k.replace("migration-backup/", ""): v for k, v in file_digests(fx.root, ("commitlog", "migration-backup/config")).items()}
    assert moved == digests  # the commitlog untouched, the config files moved unchanged
    store_dir = os.path.join(fx.root, "dledger-n0")
    imp = load_import(store_dir)
    assert imp["offsets"]["TopicB@GroupA"] == {str(q): 10 for q in range(4)}
    assert set(imp["topics"]) == {"TopicA", "TopicB"} and set(imp["groups"]) == {"GroupA", "GroupB"}

    # The DLedger log continues at the divided offset: append a few
    # messages as the leader would (the offset table continues the old
    # consume queues), dispatch, and read both sides.
    store = SegmentedStore.open(StoreConfig(fx.root, self_id="n0", data_segment_size=SEG))
    marker = load_marker(store.store_dir)
    engine, report = open_migrated_engine(store, marker)
    try:
        assert report.action == "resumed" and engine.pos == divided
        from consumequeue.queue_offsets import QueueOffsetTable
        table = QueueOffsetTable()
        table.rebuild_from_consume_queues(engine.cqs, engine.source, engine.pos, store.end_pos)
        store.add_append_hook(table.append_hook)
        new = [M.MessageRecord(topic="TopicA", queue_id=1, body=b"new %d" % i, store_timestamp=1_800_000_000_000,
                               properties={"TAGS": "tag9", "KEYS": f"newkey{i}"}).encode() for i in range(3)]
        placed = store.append_leader(new, term=1)
        store.set_committed(store.end_index)
        assert os.listdir(os.path.join(store.store_dir, "data")) == [f"{divided:020d}"]
        assert placed[0][1] == divided  # the first entry at the divided offset
        engine.dispatch_to(positions(store).committed_pos)
        got = read_messages(engine, "TopicA", 1, 18, 10)
        assert got.status is GetMessageStatus.FOUND and got.queue_offsets == [18, 19, 20, 21, 22]
        old, new_phys = got.phy_offsets[:2], got.phy_offsets[2:]
        assert all(p < fx.end for p in old) and all(p >= divided + 48 for p in new_phys)
        bodies = [M.decode(got.records, off) for off in _offsets(got.records)]
        assert [b.body for b in bodies[2:]] == [b"new 0", b"new 1", b"new 2"]
        assert [b.queue_offset for b in bodies] == [18, 19, 20, 21, 22]
        for phy in (old[0], new_phys[0]):
            assert M.decode(message_at(engine, phy)).physical_offset == phy
        q = fx.of_queue("TopicA", 1)[5]
        assert query_by_key(engine, "TopicA", q.keys).phy_offsets == [q.phy]
        assert query_by_key(engine, "TopicA", "newkey1").phy_offsets == [new_phys[1]]
        assert engine.cqs.get("TopicA", 1).min_offset == 0
        engine.checkpoint()
        store.flush()
        store.write_checkpoint()
    finally:
        engine.close()
        engine.source.close()
        store.close()
    assert {k.replace("migration-backup/", ""): v for k, v in file_digests(fx.root, ("commitlog", "migration-backup/config")).items()} == digests
    assert verify_store_cq(fx.root, "n0")["consumeQueues"]["messages"] == 163


def _offsets(records: bytes):
    off = 0
    while off < len(records):
        yield off
        off += int.from_bytes(records[off:off + 4], "big")


def test_retention_expires_old_segments_first_and_never_splits_the_boundary(tmp_path):
    fx = build_master_slave_store(tmp_path / "n0", segment_size=SEG, mtime=1_000_000)
    assert run("migrate", "apply", "--store", fx.root, "--self-id", "n0").exit_code == 0
    store = SegmentedStore.open(StoreConfig(fx.root, self_id="n0", data_segment_size=SEG))
    engine, _ = open_migrated_engine(store, load_marker(store.store_dir))
    source = engine.source
    try:
        floor = legacy_floor(source)
        assert floor() == 0  # the DLedger store keeps every segment while old ones exist
        now = 2_000_000_000.0
        hour = __import__("time").localtime(now).tm_hour
        assert legacy_retention_pass(source, file_reserved_hours=72, delete_when=(), max_used_ratio=0.99,
                                     now=now, used_ratio=0.1) == []  # not the deleteWhen hour
        young = sorted(os.listdir(fx.commitlog_dir))[-2:]
        for name in young:  # the last two are within fileReservedTime
            os.utime(os.path.join(fx.commitlog_dir, name), (now, now))
        deleted = legacy_retention_pass(source, file_reserved_hours=72, delete_when=(hour,), max_used_ratio=0.99,
                                        now=now, used_ratio=0.1)
        assert sorted(os.listdir(fx.commitlog_dir)) == young and len(deleted) == fx.end // SEG + 1 - 2
        begin = source.begin_pos
        assert begin == int(young[0]) and source.legacy_present() and floor() == 0
        engine.delete_expired(begin)
        cq = engine.cqs.get("TopicA", 0)
        first = next(m for m in fx.messages if m.phy >= begin and (m.topic, m.queue_id) == ("TopicA", 0))
        assert cq.min_offset == first.queue_offset
        got = read_messages(engine, "TopicA", 0, 0)
        assert got.status is GetMessageStatus.OFFSET_TOO_SMALL and got.next_begin_offset == first.queue_offset
        # Disk full: the rest goes too, the last old segment included; then
        # the DLedger store's floor lifts.
        legacy_retention_pass(source, file_reserved_hours=72, delete_when=(), max_used_ratio=0.5,
                              now=now, used_ratio=0.9)
        assert os.listdir(fx.commitlog_dir) == [] and not source.legacy_present() and floor() > 1 << 40
    finally:
        engine.close()
        source.close()
        store.close()


def test_export_writes_a_plain_store_that_reads_back(tmp_path):
    fx = build_master_slave_store(tmp_path / "n0", segment_size=SEG)
    assert run("migrate", "apply", "--store", fx.root, "--self-id", "n0").exit_code == 0
    store = SegmentedStore.open(StoreConfig(fx.root, self_id="n0", data_segment_size=SEG))
    engine, _ = open_migrated_engine(store, load_marker(store.store_dir))
    from consumequeue.queue_offsets import QueueOffsetTable
    table = QueueOffsetTable()
    table.rebuild_from_consume_queues(engine.cqs, engine.source, engine.pos, store.end_pos)
    store.add_append_hook(table.append_hook)
    store.append_leader([M.MessageRecord(topic="TopicB", queue_id=2, body=b"after %d" % i,
                                         properties={"KEYS": f"after{i}"}).encode() for i in range(4)], term=1)
    store.set_committed(store.end_index)
    store.flush()
    store.write_checkpoint()
    engine.close()
    engine.source.close()
    store.close()
    out = tmp_path / "exported"
    res = run("migrate", "export", "--store", fx.root, "--to", out, "--dry-run", "--json")
    assert as_json(res)["legacyRecords"] == 160 and not out.exists()
    res = run("migrate", "export", "--store", fx.root, "--to", out, "--json")
    rep = as_json(res)
    assert res.exit_code == 0 and rep["problems"] == [] and rep["records"] == 164, res.output
    with LegacyStore(out) as s:
        recs = list(s.records())
        assert len(recs) == 164 and s.recovery.clean
        tail = [r for r in recs if r.queue_id == 2 and r.phy_offset > fx.end - 1 and r.queue_offset >= 20]
        assert [r.queue_offset for r in tail][-4:] == [20, 21, 22, 23]
    # A stock broker's config: offsets of the old store (not yet imported
    # through the log here: the snapshot is empty, so none).
    assert (out / "config" / "topics.json").exists() and (out / "checkpoint").stat().st_size == 4096
    res = run("migrate", "export", "--store", fx.root, "--to", out)
    assert res.exit_code == 3 and "not empty" in res.output


def test_migration_import_imports_once(tmp_path):
    """The leader-side import (MigrationImport, the gate's before_open hook)
    against a fake metadata service: one batch of ops ending with the mark;
    a later leader sees the mark and imports nothing."""
    import trio

    from broker.metadata.records import GroupUpsert, OffsetReset, TopicUpsert
    from broker.metadata.tables import MetadataState
    from broker.store.migrated import IMPORT_MARK_GROUP, IMPORT_MARK_TOPIC, write_import

    class FakeMeta:
        write_gate = None

        def __init__(self):
            self.state = MetadataState()
            self.batches = []

        async def leader_barrier(self, timeout=None):
            return 0

        async def import_ops(self, ops):
            self.batches.append(ops)
            for op in ops:
                self.state.apply(op, len(self.batches), 0)
            return len(self.batches)

    store_dir = str(tmp_path)
    write_import(store_dir, {"topics": {"T": {"readQueueNums": 2, "writeQueueNums": 2, "perm": 6}, "bad name!": {}},
                             "groups": {"G": {}}, "offsets": {"T@G": {"0": 5, "1": 7}}, "importId": "x"})
    meta = FakeMeta()
    marker = type("M", (), {"divided": 4096})()
    hook = MigrationImport(meta, store_dir, marker)
    trio.run(hook)
    [ops] = meta.batches
    assert [type(op) for op in ops] == [TopicUpsert, GroupUpsert, OffsetReset, OffsetReset]
    assert meta.state.offsets.table_of("T", "G") == {0: 5, 1: 7}
    assert meta.state.offsets.query(IMPORT_MARK_TOPIC, IMPORT_MARK_GROUP, 0) == 4096
    assert trio.run(hook) is None
    assert len(meta.batches) == 1  # imported once


def test_check_sees_config_differences_and_align_copies_them(tmp_path):
    master = build_master_slave_store(tmp_path / "m", segment_size=SEG)
    slave = build_master_slave_store(tmp_path / "s", segment_size=SEG,
                                     consumer_offsets={"TopicA@GroupA": {0: 3}})  # synced before the last commits
    res = run("migrate", "check", "--store", master.root, "--replica", slave.root, "--json")
    out = as_json(res)
    s = next(x for x in out["stores"] if x["root"] == slave.root)
    assert res.exit_code == 1 and s["relation"] == "config-differs" and "offsets" in s["explanation"]
    assert out["plan"][0]["copy"] == []
    res = run("migrate", "align", "--store", master.root, "--replica", slave.root, "--json")
    assert any("consumerOffset.json" in x for x in as_json(res)["done"])
    assert run("migrate", "check", "--store", master.root, "--replica", slave.root).exit_code == 0


def test_apply_completes_lagging_queues_and_resumes_after_an_interruption(tmp_path):
    from broker.store.upgrade import apply
    from consumequeue.plainlog import dispatch_plain, plain_engine
    fx = build_master_slave_store(tmp_path / "n0", segment_size=SEG, with_cq=False)
    engine = plain_engine(fx.root, segment_size=SEG)
    dispatch_plain(engine, 0, fx.messages[40].phy)  # the stock broker's reput lagged its commitlog
    engine.close()
    engine.source.close()
    calls = []

    def interrupt(done, total):
        calls.append(done)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the operator's Ctrl-C in the middle
    with pytest.raises(KeyboardInterrupt):
        apply(fx.root, "n0", progress=interrupt)
    assert load_marker(os.path.join(fx.root, "dledger-n0")) is None
    plan = apply(fx.root, "n0")  # run again: resumes
    assert plan.cq_resume > fx.messages[40].phy and not plan.already
    assert plan.index_action == "complete"  # the index lagged with the queues: completed with them
    store = SegmentedStore.open(StoreConfig(fx.root, self_id="n0", data_segment_size=SEG))
    engine, _ = open_migrated_engine(store, load_marker(store.store_dir))
    try:
        for m in (fx.messages[10], fx.messages[100], fx.messages[-1]):
            got = read_messages(engine, m.topic, m.queue_id, m.queue_offset, 1)
            assert M.decode(got.records).body == m.body
            assert query_by_key(engine, m.topic, m.keys).phy_offsets == [m.phy]  # indexed once
        assert engine.cqs.get("TopicB", 3).max_offset == 20
    finally:
        engine.close()
        engine.source.close()
        store.close()
    verify_store_cq(fx.root, "n0")


def test_offline_tools_on_a_migrated_store(tmp_path):
    """verifyStore --cq walks the old commitlog and the DLedger log as one;
    rebuildConsumeQueue rebuilds the old queues too (plain mode first)."""
    fx = build_master_slave_store(tmp_path / "n0", segment_size=SEG)
    assert run("migrate", "apply", "--store", fx.root, "--self-id", "n0").exit_code == 0
    store = SegmentedStore.open(StoreConfig(fx.root, self_id="n0", data_segment_size=SEG))
    engine, _ = open_migrated_engine(store, load_marker(store.store_dir))
    from consumequeue.queue_offsets import QueueOffsetTable
    table = QueueOffsetTable()
    table.rebuild_from_consume_queues(engine.cqs, engine.source, engine.pos, store.end_pos)
    store.add_append_hook(table.append_hook)
    store.append_leader([M.MessageRecord(topic="TopicA", queue_id=0, body=b"x%d" % i).encode() for i in range(3)],
                        term=1)
    store.set_committed(store.end_index)
    engine.dispatch_to(positions(store).committed_pos)
    engine.checkpoint()
    store.flush()
    store.write_checkpoint()
    engine.close()
    engine.source.close()
    store.close()
    for _ in range(2):  # before and after the rebuild
        res = run("verifyStore", "--store", fx.root, "--cq", "--json")
        cq = json.loads(res.output)["consumeQueues"]
        assert res.exit_code == 0 and cq["ok"] and cq["messages"] == 163 and cq["unitsChecked"] == 163, res.output
        res = run("rebuildConsumeQueue", "--store", fx.root, "--json")
        assert res.exit_code == 0 and json.loads(res.output)["messages"] == 163, res.output


def test_broker_store_retention_pass_on_a_migrated_store(tmp_path):
    """BrokerStore.retention_pass: old segments first (here: disk full, so
    all of them), consume queue files behind them dropped; DLedger segments
    kept by the floor until then."""
    from broker.config import BrokerConfig
    from broker.store.broker_store import BrokerStore
    from commitlog.watermark import Watermark
    from consumequeue.service import ConsumeQueueService
    fx = build_master_slave_store(tmp_path / "n0", segment_size=SEG, mtime=1_000_000)
    assert run("migrate", "apply", "--store", fx.root, "--self-id", "n0").exit_code == 0
    cfg, _ = BrokerConfig.from_dict({"dLegerGroup": "g", "dLegerPeers": "n0-127.0.0.1:40911", "dLegerSelfId": "n0",
                                     "storePathRootDir": fx.root, "mappedFileSizeCommitLog": SEG,
                                     "brokerIP1": "127.0.0.1"})
    store = SegmentedStore.open(StoreConfig(fx.root, self_id="n0", data_segment_size=SEG))
    marker = load_marker(store.store_dir)
    engine, _ = open_migrated_engine(store, marker)
    store.add_retention_floor(legacy_floor(engine.source))
    cq = ConsumeQueueService(store, engine, Watermark(-1))
    bs = BrokerStore(cfg=cfg, store=store, replica=None, cq=cq, metadata=None, gate=None, transport=None,
                     migrated=marker)
    try:
        deleted = bs.retention_pass(now=2_000_000_000.0, used_ratio=0.99)
        assert os.listdir(fx.commitlog_dir) == [] and len(deleted) >= 1
        assert not engine.source.legacy_present() and store.retention_floor() > 1 << 40
        q = engine.cqs.get("TopicA", 2)
        assert (q.min_offset, q.max_offset) == (20, 20)  # the queue keeps its offsets for new messages
        got = read_messages(engine, "TopicA", 2, 0)
        assert (got.status, got.next_begin_offset) == (GetMessageStatus.OFFSET_TOO_SMALL, 20)
    finally:
        cq.close()
        engine.source.close()
        store.close()


def test_apply_refuses_while_a_stock_broker_holds_its_lock(tmp_path):
    import subprocess
    import sys
    fx = build_master_slave_store(tmp_path / "n0", segment_size=SEG)
    lock = os.path.join(fx.root, "lock")
    open(lock, "w").close()
    # Another process holds the POSIX lock, as a running Java broker does.
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                               f"fd = os.open({lock!r}, os.O_RDWR); fcntl.lockf(fd, fcntl.LOCK_EX)\n"
                               "print('locked', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        res = run("migrate", "apply", "--store", fx.root, "--self-id", "n0")
        assert res.exit_code == 3 and "a broker is running" in res.output
    finally:
        holder.stdin.close()
        holder.wait()
    assert run("migrate", "apply", "--store", fx.root, "--self-id", "n0").exit_code == 0


def test_apply_names_the_data_file_the_first_append_creates(tmp_path):
    """DLedger names the first data file by the divided offset rounded down
    to its segment size (MmapFileList.getLastMappedFile); apply says which
    file that is, and it is the one the first append creates."""
    fx = build_master_slave_store(tmp_path / "n0", segment_size=SEG)
    big = 8 * SEG
    divided = fx.end - fx.end % SEG + SEG
    first = f"{divided - divided % big:020d}"
    assert divided % big and first != f"{divided:020d}"  # the case the operator met
    res = run("migrate", "apply", "--store", fx.root, "--self-id", "n0", "--segment-size", big, "--json")
    out = as_json(res)
    data_dir = os.path.join(fx.root, "dledger-n0", "data")
    assert res.exit_code == 0 and out["firstDataFile"] == os.path.join(data_dir, first)
    assert any(f"is {data_dir}/{first} (the divided offset rounded down" in a for a in out["actions"]), out
    assert any(a.endswith(f"its first append creates {data_dir}/{first}") for a in out["done"]), out
    assert f"{divided:020d}" not in json.dumps(out)
    store = SegmentedStore.open(StoreConfig(fx.root, self_id="n0", data_segment_size=big))
    engine, _ = open_migrated_engine(store, load_marker(store.store_dir))
    try:
        from consumequeue.queue_offsets import QueueOffsetTable
        table = QueueOffsetTable()
        table.rebuild_from_consume_queues(engine.cqs, engine.source, engine.pos, store.end_pos)
        store.add_append_hook(table.append_hook)
        placed = store.append_leader([M.MessageRecord(topic="TopicA", queue_id=0, body=b"first").encode()], term=1)
        assert placed[0][1] == divided and os.listdir(data_dir) == [first]
        store.set_committed(store.end_index)
        engine.dispatch_to(positions(store).committed_pos)
        engine.checkpoint()
        store.flush()
        store.write_checkpoint()
    finally:
        engine.close()
        engine.source.close()
        store.close()
    assert verify_store_cq(fx.root, "n0")["consumeQueues"]["messages"] == len(fx.messages) + 1


def _cut_index(fx, at: int) -> None:
    from consumequeue.indexfile import IndexService
    from consumequeue.source import CommitlogSource
    from native.dispatch import MODE_PLAIN
    source = CommitlogSource(fx.commitlog_dir, segment_size=SEG, mode=MODE_PLAIN)
    index = IndexService(fx.root).load()
    try:
        index.truncate_phy(at, lambda phy, size=0: source.store_timestamp_at(phy))
        index.flush()
    finally:
        index.close()
        source.close()


def _damage_index(fx, at: int) -> None:
    [name] = os.listdir(os.path.join(fx.root, "index"))
    os.truncate(os.path.join(fx.root, "index", name), 4096)


@pytest.mark.parametrize("spoil, reason", [
    (_cut_index, "the index misses the message at {phy} (after its last item)"),
    (_damage_index, "an IndexFile is damaged"),
])
def test_apply_rebuilds_an_index_that_misses_messages(tmp_path, spoil, reason):
    """Consume queues complete, the index not (cut after message 100 -- a
    stock broker killed before its index flush --, or a damaged file):
    apply rebuilds it from the old commitlog, and says why; every old key
    is found exactly once."""
    fx = build_master_slave_store(tmp_path / "n0", segment_size=SEG)
    phy = fx.messages[100].phy
    spoil(fx, phy)
    dry = as_json(run("migrate", "apply", "--store", fx.root, "--self-id", "n0", "--dry-run", "--json"))
    assert dry["index"]["action"] == "rebuild" and dry["index"]["reason"].startswith(reason.format(phy=phy)), dry
    res = run("migrate", "apply", "--store", fx.root, "--self-id", "n0", "--segment-size", SEG)
    assert res.exit_code == 0, res.output
    assert f"rebuild the index from the old commitlog [0, {fx.end}): {reason.format(phy=phy)}" in res.output
    assert "done: rebuilt the index from the old commitlog: 1 IndexFile(s), 320 keys of 160 messages" in res.output
    store = SegmentedStore.open(StoreConfig(fx.root, self_id="n0", data_segment_size=SEG))
    engine, _ = open_migrated_engine(store, load_marker(store.store_dir))
    try:
        for m in fx.messages:
            assert query_by_key(engine, m.topic, m.keys).phy_offsets == [m.phy]
            assert query_by_key(engine, m.topic, m.uniq_key).phy_offsets == [m.phy]
    finally:
        engine.close()
        engine.source.close()
        store.close()
    verify_store_cq(fx.root, "n0")
