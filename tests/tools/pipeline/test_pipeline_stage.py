# `mqadmin pipeline stage` and the URI read path: staging copies only the
# sealed, fully committed segments of a store (with sha256 checksums that
# match the copies), continues on later runs, and refuses a source that no
# longer continues the staged history; a staged store read as a file:// URI
# goes through Spark's Hadoop filesystem API (manifest on the driver,
# binaryFiles on the executors) and exports exactly the staged entries;
# a damaged staged copy fails its checksum in one line; rebuild takes
# file:// as a path and refuses hdfs:// in one line.
import hashlib
import json
import os
import subprocess
import sys

import pytest

from tests.tools.pipeline.stores import build_store, commit_up_to, committed_messages
from tools.pipeline import export, rebuild, stage
from tools.pipeline import jobcommon as J
from tools.pipeline import splits as S
from tools.pipeline.segscan import SegmentReadError

SEG = 1 << 14
BIN = os.path.dirname(sys.executable)


def _sha(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _manifest(dest) -> dict:
    with open(os.path.join(dest, stage.MANIFEST)) as f:
        return json.load(f)


def test_stage_copies_sealed_committed_segments_and_continues(tmp_path):
    src, dest = tmp_path / "live", tmp_path / "staged"
    build_store(src, 300, committed=149, seg=SEG)
    data = sorted(os.listdir(src / "dledger-n0" / "data"))
    report = stage.stage_store(str(src), str(dest))
    m = _manifest(dest)
    # Only segments whose every entry is committed (149 is in the third) and
    # that are sealed; the growing last segment is never copied.
    assert report.staged == len(m["segments"]) >= 1 and report.left >= 2
    assert m["lastIndex"] < 149 and m["segments"][-1]["lastIndex"] == m["lastIndex"]
    for s in m["segments"]:
        assert s["sha256"] == _sha(dest / "dledger-n0" / "data" / s["name"]) == \
            _sha(src / "dledger-n0" / "data" / s["name"])
    assert data[-1] not in os.listdir(dest / "dledger-n0" / "data")
    # The staged store is an ordinary DLedger store committed up to the stage.
    plan = S.plan_store(str(dest))
    assert (plan.committed_index, plan.end_pos) == (m["lastIndex"], m["endPos"])
    commit_up_to(src, 299)
    again = stage.stage_store(str(src), str(dest))
    m2 = _manifest(dest)
    assert again.kept == len(m["segments"]) and again.staged == len(m2["segments"]) - len(m["segments"]) > 0
    assert m2["segments"][:len(m["segments"])] == m["segments"]
    assert m2["lastIndex"] > m["lastIndex"] and again.left == 1  # all committed now: only the growing one left
    assert not [f for f in os.listdir(dest / "dledger-n0" / "data") if not f.isdigit()]  # no temporaries


def test_stage_refuses_a_source_with_another_history(tmp_path):
    src, dest = tmp_path / "live", tmp_path / "staged"
    build_store(src, 200, seg=SEG)
    stage.stage_store(str(src), str(dest))
    last = _manifest(dest)["lastIndex"]
    os.rename(src, tmp_path / "old")
    build_store(src, 300, seg=SEG, diverge_at=last - 3)  # rewritten from before the staged end on
    with pytest.raises(stage.StageError, match=f"entry {last + 1} does not continue the staged history"):
        stage.stage_store(str(src), str(dest))


def test_mqadmin_stage_is_one_line_on_error(tmp_path):
    p = subprocess.run([os.path.join(BIN, "mqadmin"), "pipeline", "stage", "--store", str(tmp_path / "none"),
                        "--to", str(tmp_path / "d")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 3 and p.stderr.strip().splitlines() == [
        f"mqadmin: error: {tmp_path / 'none'}: no DLedger store (dledger-<id>/data) to stage"]


def test_a_staged_store_read_through_hadoop_filesystems(spark, tmp_path):
    src, dest = tmp_path / "live", tmp_path / "staged"
    build_store(src, 300, seg=SEG)
    stage.stage_store(str(src), str(dest))
    last = _manifest(dest)["lastIndex"]
    uri = f"file://{dest}"
    result, _ = export.run(spark, J.JobOptions((uri,), out=str(tmp_path / "pq"), progress=False))
    rows = spark.read.parquet(str(tmp_path / "pq")).select("physicalOffset", "entryIndex", "store").collect()
    direct = [phy for phy, _ in committed_messages(src)][:last + 1]
    assert result["rows"] == last + 1 == len(rows)
    assert sorted(r.physicalOffset for r in rows) == direct and {r.store for r in rows} == {uri}
    # rebuild reads files itself: file:// is a path to it, hdfs:// is refused.
    out, _ = rebuild.run(spark, J.JobOptions((uri,), out=str(tmp_path / "rb"), progress=False))
    assert out["stores"][0]["messages"] == last + 1
    with pytest.raises(S.PipelineInputError, match="rebuild reads store files directly"):
        rebuild.run(spark, J.JobOptions(("hdfs://nn:8020/stage",), progress=False))
    # A damaged copy fails the manifest's checksum in the executor.
    seg0 = dest / "dledger-n0" / "data" / _manifest(dest)["segments"][0]["name"]
    with open(seg0, "r+b") as f:
        f.seek(200)
        f.write(b"\xff")
    with pytest.raises(Exception) as err:
        export.run(spark, J.JobOptions((uri,), out=str(tmp_path / "pq2"), progress=False))
    assert "differs from the stage manifest" in J.spark_error_text(err.value)
    assert J.spark_error_text(err.value).startswith(SegmentReadError.__name__)
