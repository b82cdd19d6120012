# Incremental export (`export --since-checkpoint`) in real Spark (the
# package's local[2] session): runs over a store whose committed index
# grows export exactly the new entries, and together equal a direct decode
# of everything committed; a driver killed mid-publish or before its
# checkpoint (a separate `mqadmin` process that exits at that point) is
# rerun without duplicates; a store rewritten, or reset to a later begin,
# is refused with one clear error and nothing is written; a follower reset
# right after the exported entry, with the same chain, is continued.
import os
import subprocess
import sys
import zlib
from collections import Counter

import pytest

from consumequeue import record as M
from tests.helpers.legacy_fixtures import build_master_slave_store
from tests.tools.pipeline.stores import build_reset_store, build_store, commit_up_to
from tools.pipeline import export, incremental
from tools.pipeline import jobcommon as J

BIN = os.path.dirname(sys.executable)  # the venv's bin: mqadmin


def run_since(spark, root, out, ckpt):
    return export.run(spark, J.JobOptions((str(root),), out=str(out), progress=False,
                                          extra=(("since_checkpoint", str(ckpt)),)))[0]


def exported(spark, out) -> Counter:
    """(entryIndex, physicalOffset, topic, queueId, body) of every exported
    row, counted (a duplicate shows as 2)."""
    rows = spark.read.parquet(str(out)).select("entryIndex", "physicalOffset", "topic", "queueId", "body").collect()
    return Counter((r.entryIndex, r.physicalOffset, r.topic, r.queueId, bytes(r.body)) for r in rows)


def expected(root, hi=None) -> Counter:
    """The same tuples from a direct decode of the committed entries."""
    from commitlog.metafiles import read_checkpoint
    from commitlog.scan import walk_store
    store_dir = os.path.join(str(root), "dledger-n0")
    _, committed = read_checkpoint(store_dir)
    out = Counter()
    for h, body, _, _ in walk_store(store_dir):
        if h.index > min(committed, hi if hi is not None else committed):
            break
        m = M.decode(bytes(body))
        data = zlib.decompress(m.body) if m.sysflag & M.COMPRESSED_FLAG else m.body
        out[(h.index, h.pos + 48, m.topic, m.queue_id, data)] += 1
    return out


def test_runs_export_only_what_was_committed_since(spark, tmp_path):
    root, out, ckpt = tmp_path / "s", tmp_path / "out", tmp_path / "ckpt"
    build_store(root, 400, committed=149)
    first = run_since(spark, root, out, ckpt)
    assert (first["rows"], first["stores"][0]["fromIndex"], first["stores"][0]["toIndex"]) == (150, 0, 149)
    again = run_since(spark, root, out, ckpt)  # nothing committed since: nothing exported
    assert (again["rows"], again["files"]) == (0, 0)
    commit_up_to(root, 399)
    second = run_since(spark, root, out, ckpt)
    assert (second["rows"], second["stores"][0]["fromIndex"], second["run"]) == (250, 150, 3)
    got = exported(spark, out)
    assert got == expected(root) and max(got.values()) == 1
    names = {f for _, _, fs in os.walk(out) for f in fs if f.endswith(".parquet")}
    assert names and all(f.startswith(("part-r000001-", "part-r000003-")) for f in names)
    assert sorted(os.listdir(out)) == ["topic=OrderTopic", "topic=PayTopic"]  # no _incoming left
    assert incremental.load(str(ckpt)).marks[str(root)].index == 399


@pytest.mark.parametrize("point", ["mid-publish", "after-publish"])
def test_rerun_after_a_crash_has_no_duplicates(spark, tmp_path, point):
    root, out, ckpt = tmp_path / "s", tmp_path / "out", tmp_path / "ckpt"
    build_store(root, 300, committed=99)
    run_since(spark, root, out, ckpt)
    commit_up_to(root, 299)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, LEDGERMQ_SPARK_LOCAL_DIR=str(tmp_path / "spark"),
               **{incremental.CRASH_ENV: point})
    p = subprocess.run([os.path.join(BIN, "mqadmin"), "pipeline", "export", "--store", str(root), "--out", str(out),
                        "--since-checkpoint", str(ckpt), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                        "--no-progress"], capture_output=True, text=True, env=env, timeout=240)
    assert p.returncode == 86, p.stderr[-2000:]
    published = [f for _, _, fs in os.walk(out) for f in fs if f.startswith("part-r000002-")]
    assert published, "the crashed run published nothing: the crash point was not reached"
    assert incremental.load(str(ckpt)).run == 1  # the checkpoint still names the first run
    if point == "after-publish":  # all of run 2 was there: rows 100..299 twice over without the roll-back
        assert sum(exported(spark, out).values()) == 300
    rerun = run_since(spark, root, out, ckpt)
    assert rerun["rolledBack"] == len(published) and rerun["rows"] == 200
    got = exported(spark, out)
    assert got == expected(root) and max(got.values()) == 1


def _exported_once(spark, tmp_path, n=300):
    ref, out, ckpt = tmp_path / "ref", tmp_path / "out", tmp_path / "ckpt"
    build_store(ref, 450, committed=n - 1)
    run_since(spark, ref, out, ckpt)
    return ref, out, ckpt


def _refused(spark, root, out, ckpt, match):
    before = (incremental.load(str(ckpt)), sorted(f for _, _, fs in os.walk(out) for f in fs))
    with pytest.raises(incremental.ExportCheckpointError, match=match):
        run_since(spark, root, out, ckpt)
    assert (incremental.load(str(ckpt)), sorted(f for _, _, fs in os.walk(out) for f in fs)) == before


def test_a_rewritten_store_is_refused(spark, tmp_path):
    ref, out, ckpt = _exported_once(spark, tmp_path)
    other = tmp_path / "other"  # the same root rewritten: another history from entry 100 on, longer
    build_store(other, 450, diverge_at=100)
    os.rename(ref, tmp_path / "old")
    os.rename(other, ref)
    _refused(spark, ref, out, ckpt, r"entry 299 .* is not the exported one.*rewritten")
    commit_up_to(tmp_path / "old", 449)  # while the real history, continued, still exports
    os.rename(ref, other)
    os.rename(tmp_path / "old", ref)
    assert run_since(spark, ref, out, ckpt)["rows"] == 150


def test_a_store_committed_below_the_checkpoint_is_refused(spark, tmp_path):
    ref, out, ckpt = _exported_once(spark, tmp_path)
    shorter = tmp_path / "shorter"
    build_store(shorter, 450, committed=199)
    os.rename(ref, tmp_path / "old")
    os.rename(shorter, ref)
    _refused(spark, ref, out, ckpt, "committed index is 199, below it")


def test_a_follower_reset_past_the_checkpoint_is_refused(spark, tmp_path):
    ref, out, ckpt = _exported_once(spark, tmp_path)
    commit_up_to(ref, 449)
    follower = tmp_path / "follower"  # reset to the leader's begin 350 after retention
    build_reset_store(follower, ref, 350, 450)
    os.rename(ref, tmp_path / "old")
    os.rename(follower, ref)
    _refused(spark, ref, out, ckpt, r"entries 300\.\.349 are no longer in the store")


@pytest.mark.parametrize("same_history", [True, False])
def test_a_follower_reset_right_after_the_checkpoint(spark, tmp_path, same_history):
    ref, out, ckpt = _exported_once(spark, tmp_path)
    commit_up_to(ref, 449)
    follower = tmp_path / "follower"
    build_reset_store(follower, ref, 300, 450, prev_chain_crc=None if same_history else 0x1234)
    os.rename(ref, tmp_path / "old")
    os.rename(follower, ref)
    if not same_history:
        _refused(spark, ref, out, ckpt, r"entry 300's chainCrc .* does not continue the exported entry 299")
        return
    result = run_since(spark, ref, out, ckpt)
    assert (result["rows"], result["stores"][0]["fromIndex"], result["stores"][0]["toIndex"]) == (150, 300, 449)
    got = exported(spark, out)
    assert got == expected(tmp_path / "old", hi=299) + expected(ref) and max(got.values()) == 1


def test_a_foreign_checkpoint_and_an_old_commitlog_are_refused(spark, tmp_path):
    ref, out, ckpt = _exported_once(spark, tmp_path, n=50)
    with pytest.raises(incremental.ExportCheckpointError, match=f"belongs to the export into {out}, not "):
        run_since(spark, ref, tmp_path / "elsewhere", ckpt)
    fx = build_master_slave_store(tmp_path / "ms", per_queue=2, with_cq=False)
    with pytest.raises(incremental.ExportCheckpointError, match="no entry index to continue from"):
        run_since(spark, fx.root, tmp_path / "out2", tmp_path / "ckpt2")
