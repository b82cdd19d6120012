# The pipeline on old master-slave stores (tests/helpers/legacy_fixtures.py: plain
# commitlog/ with BLANK-closed segments) and on a store migrated from one
# (old commitlog below the divided offset, DLedger above, an uncommitted
# DLedger tail): rebuild equals the dispatcher's own output (plain mode for
# the old part, then the migrated broker's dispatch), export and stats
# cover exactly the valid/committed messages of both parts, and a torn old
# tail ends the old log where recovery ends it.
import os
import shutil

import pytest

from commitlog.store import SegmentedStore, StoreConfig
from consumequeue import record as M
from consumequeue.legacy_store import LegacyStore
from consumequeue.queue_offsets import QueueOffsetTable
from consumequeue.service import positions
from tests.helpers.legacy_fixtures import build_master_slave_store
from tests.tools.pipeline.stores import SMALL, SMALL_ARGS, committed_messages, digests
from tools.pipeline import export, rebuild, stats
from tools.pipeline import jobcommon as J
from tools.pipeline import splits as S

SEG = 8192


def opts(*roots, **kw):
    return J.JobOptions(tuple(str(r) for r in roots), progress=False, **kw)


def plain_reference(fx_root, out, end, config=SMALL) -> None:
    """The dispatch engine in plain mode over [0, end) of the old commitlog
    (what the migration and the fixtures use as RocketMQ's reput)."""
    from consumequeue.plainlog import dispatch_plain, plain_engine
    engine = plain_engine(str(out), os.path.join(str(fx_root), "commitlog"), segment_size=SEG, config=config)
    try:
        dispatch_plain(engine, 0, end)
    finally:
        engine.close()
        engine.source.close()


def legacy_messages(root) -> list[tuple[int, M.MessageRecord]]:
    with LegacyStore(str(root)) as s:
        return [(r.phy_offset, M.decode(s.read(r.phy_offset, r.size))) for r in s.records()]


def test_master_slave_store(spark, tmp_path):
    fx = build_master_slave_store(tmp_path / "ms", segment_size=SEG, with_cq=False)
    assert len(os.listdir(fx.commitlog_dir)) >= 5
    plain_reference(fx.root, tmp_path / "expected", fx.end)
    result, code = rebuild.run(spark, opts(fx.root, out=str(tmp_path / "out"), extra=SMALL_ARGS))
    (rep,) = result["stores"]
    assert code == 0 and (rep["kind"], rep["messages"], rep["endPos"]) == ("plain", 160, fx.end)
    assert digests(tmp_path / "out") == digests(tmp_path / "expected")
    result, _ = export.run(spark, opts(fx.root, out=str(tmp_path / "pq")))
    rows = {r.physicalOffset: r for r in spark.read.parquet(str(tmp_path / "pq")).collect()}
    direct = legacy_messages(fx.root)
    assert result["rows"] == len(rows) == len(direct) == 160
    for phy, m in direct:
        r = rows[phy]
        assert (r.topic, r.queueId, r.queueOffset, bytes(r.body), r.keys, r.entryIndex) == \
            (m.topic, m.queue_id, m.queue_offset, m.body, m.keys, None)


def test_torn_old_tail_ends_where_recovery_ends(spark, tmp_path):
    fx = build_master_slave_store(tmp_path / "torn", segment_size=SEG, with_cq=False)
    last = fx.messages[-1]
    with open(os.path.join(fx.commitlog_dir, f"{last.phy - last.phy % SEG:020d}"), "r+b") as f:
        f.seek(last.phy % SEG + last.size // 2)
        f.write(bytes(last.size - last.size // 2))  # the last write was torn
    with LegacyStore(fx.root) as s:
        rec = s.recover()
    assert rec.stop == "torn" and rec.end == last.phy
    (plan,) = J.plan_inputs(spark, [fx.root])
    assert plan.plain_end == rec.end
    result, _ = stats.run(spark, opts(fx.root))
    assert result["messages"] == rec.records == 159


@pytest.fixture
def migrated(tmp_path):
    """A master-slave store migrated in place (`migrate apply`), then 90
    messages appended by the DLedger leader continuing the old queues (two
    4 KiB segments and more), 85 of them committed and dispatched by the
    migrated broker's engine."""
    from broker.store.upgrade import apply
    from consumequeue.migrated import load_marker, open_migrated_engine
    fx = build_master_slave_store(tmp_path / "n0", segment_size=SEG)
    apply(fx.root, "n0", data_segment_size=4096)
    store = SegmentedStore.open(StoreConfig(fx.root, self_id="n0", data_segment_size=4096))
    marker = load_marker(store.store_dir)
    engine, _ = open_migrated_engine(store, marker)
    try:
        table = QueueOffsetTable()
        table.rebuild_from_consume_queues(engine.cqs, engine.source, engine.pos, store.end_pos)
        store.add_append_hook(table.append_hook)
        for a in range(0, 90, 10):
            store.append_leader([M.MessageRecord(topic=("TopicA", "TopicB")[i % 2], queue_id=i % 4,
                                                 body=b"new %d " % i * 5, store_timestamp=1_800_000_000_000 + i,
                                                 properties={"TAGS": "tag9", "KEYS": f"newkey{i}"}).encode()
                                 for i in range(a, a + 10)], term=1)
        store.set_committed(store.end_index - 5)
        engine.dispatch_to(positions(store).committed_pos)
        engine.checkpoint()
    finally:
        engine.close()
        engine.source.close()
        store.close()
    return fx, marker


def test_mixed_store_after_migration(spark, migrated, tmp_path):
    fx, marker = migrated
    expected = digests(fx.root)
    assert any(k.startswith("cq/TopicA/1/") for k in expected) and "index#0" in expected
    (plan,) = J.plan_inputs(spark, [fx.root])
    assert plan.kind == S.KIND_MIXED and plan.divided_offset == marker.divided
    assert plan.plain_end == marker.legacy_end and plan.committed_index == 84
    result, code = rebuild.run(spark, opts(fx.root, out=str(tmp_path / "out")))  # the broker's default sizes
    (rep,) = result["stores"]
    assert code == 0 and (rep["kind"], rep["messages"]) == ("mixed", 160 + 85)
    assert digests(tmp_path / "out") == expected
    result, _ = export.run(spark, opts(fx.root, out=str(tmp_path / "pq")))
    rows = {r.physicalOffset: r for r in spark.read.parquet(str(tmp_path / "pq")).collect()}
    new = committed_messages(fx.root)
    assert len(new) == 85 and all(phy >= marker.divided for phy, _ in new)
    direct = legacy_messages(fx.root) + new
    assert result["rows"] == len(rows) == len(direct)
    for phy, m in direct:
        r = rows[phy]
        assert (r.topic, r.queueId, r.queueOffset, bytes(r.body)) == (m.topic, m.queue_id, m.queue_offset, m.body)
        assert (r.entryIndex is None) == (phy < marker.divided)
    # Without the marker (a store migrated by stock RocketMQ), the old
    # part's end is found by scanning it: the same plan.
    shutil.copytree(fx.root, tmp_path / "copy")
    os.unlink(tmp_path / "copy" / "dledger-n0" / "ledgermq-divided.json")
    (plan2,) = J.plan_inputs(spark, [tmp_path / "copy"])
    assert plan2.plain_end == plan.plain_end and len(plan2.splits) == len(plan.splits)


def test_audit_of_master_slave_replicas(spark, tmp_path):
    from tools.pipeline import audit
    master = build_master_slave_store(tmp_path / "master", segment_size=SEG, with_cq=False)
    lagging = build_master_slave_store(tmp_path / "lagging", segment_size=SEG, with_cq=False,
                                       limit=len(master.messages) - 13)
    diverged = build_master_slave_store(tmp_path / "diverged", segment_size=SEG, with_cq=False, diverge_at=100)
    result, code = audit.run(spark, opts(master.root, lagging.root))
    assert code == 0 and result["divergence"] is None and result["commonEndPos"] == lagging.end
    result, code = audit.run(spark, opts(master.root, lagging.root, diverged.root))
    d = result["divergence"]
    assert code == 1 and d["position"] == master.messages[100].phy and d["index"] is None
    assert [rep["entry"]["pos"] for rep in d["replicas"]] == [master.messages[100].phy] * 3
    assert d["replicas"][0]["entry"]["bodyCrc32"] == d["replicas"][1]["entry"]["bodyCrc32"] != \
        d["replicas"][2]["entry"]["bodyCrc32"]


def test_plain_end_follows_recovery_rules():
    from native.dispatch import STOP_BLANK, STOP_CORRUPT, STOP_END, STOP_ZERO
    seg = 100
    full = [S.PlainSummary(0, seg, 92, STOP_BLANK, 3), S.PlainSummary(100, seg, 200, STOP_END, 4)]
    assert S.plain_end(full + [S.PlainSummary(200, seg, 250, STOP_ZERO, 2)]) == (250, "end")
    assert S.plain_end(full) == (200, "end")  # records fill the last segment exactly
    assert S.plain_end(full + [S.PlainSummary(300, seg, 350, STOP_ZERO, 2)]) == \
        (200, "segment 00000000000000000200 is missing")
    assert S.plain_end(full + [S.PlainSummary(200, seg, 230, STOP_END, 1, crc_bad_at=210)])[0] == 210
    end, why = S.plain_end(full + [S.PlainSummary(200, seg, 240, STOP_CORRUPT, 1, reason="bad record magic at 240")])
    assert (end, why) == (240, "bad record magic at 240")
    assert S.plain_end([S.PlainSummary(0, seg, 60, STOP_BLANK, 1)]) == (60, "end")  # BLANK closes the last one
