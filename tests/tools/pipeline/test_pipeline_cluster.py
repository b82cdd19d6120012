# The four jobs on a real Spark standalone cluster: a master and two workers
# (1 core, own work dir each) started from the PySpark installation as
# separate JVMs on 127.0.0.1 (tools/pipeline/standalone.py, one cluster for
# the module, stopped by PID), every job submitted with `spark-submit
# --master spark://127.0.0.1:PORT tools/pipeline/<job>.py` and ledgermq
# shipped as a packed virtual environment (`spark.archives`, built once per
# tree by tools/pipeline/packenv.py).  The results are compared with the
# same jobs in local mode (the package's local[2] session): rebuild byte for
# byte, export rows and the audit report equal; and an incremental export of
# a staged store read as a file:// URI, begun in local mode and continued on
# the cluster from the same checkpoint, equals a full local export of it.
# The stats job is not submitted here: what its executors run is the scan
# export's run (rows_frame), the rest is Spark's own aggregation, and its
# figures are checked against direct counts in test_pipeline_jobs.py (each
# submit costs 15-30 s of this suite's 20 minutes).
# Slow: a Spark standalone cluster (three JVMs) and a spark-submit per job.
import json
import os

import pytest

from tests.helpers import REPO_ROOT
from tests.tools.pipeline.stores import SMALL, SMALL_ARGS, build_store, commit_up_to, digests, dispatcher_output
from tools.pipeline import audit, export, packenv, rebuild, stage
from tools.pipeline import jobcommon as J

pytestmark = pytest.mark.slow
SEG = 1 << 15
# Jobs of a few seconds on cold JVMs: C1 only cuts a submit from ~55 s to
# ~18 s on the shared 2-core machine (C2 compiles never pay off here).
QUICK_JVM = "-XX:TieredStopAtLevel=1"


@pytest.fixture(scope="session")
def packed_env():
    """The packed environment of this tree (cached in .venv-spark-pack/)."""
    return packenv.packed_env(str(REPO_ROOT))


@pytest.fixture(scope="module")
def cluster(java, packed_env, tmp_path_factory):
    from tools.pipeline.standalone import StandaloneCluster
    c = StandaloneCluster(str(tmp_path_factory.mktemp("standalone")), workers=2, cores=1, memory="1g")
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    base = tmp_path_factory.mktemp("cluster-stores")
    build_store(base / "a", 600, committed=559)
    build_store(base / "b", 600, committed=559, diverge_at=321)
    dispatcher_output(base / "a", base / "expected")
    build_store(base / "live", 400, committed=199, seg=SEG)
    return base


def submit(cluster, packed_env, tmp_path, job, *args, code=0) -> dict:
    p = cluster.submit(str(REPO_ROOT / "tools" / "pipeline" / f"{job}.py"), [*args, "--json", "--no-progress"],
                       conf={**packenv.submit_conf(packed_env), "spark.ui.enabled": "false",
                             "spark.executor.memory": "512m", "spark.sql.shuffle.partitions": "2"},
                       env={"LEDGERMQ_SPARK_LOCAL_DIR": str(tmp_path / "driver")}, jvm_opts=QUICK_JVM)
    assert p.returncode == code, p.stderr[-4000:]
    return json.loads(p.stdout)


def local(spark, job, *roots, **kw):
    return job.run(spark, J.JobOptions(tuple(str(r) for r in roots), progress=False, **kw))[0]


def test_rebuild_is_byte_identical(spark, cluster, packed_env, stores, tmp_path):
    args = ["--cq-file-size", str(SMALL.cq_file_size), "--index-slots", str(SMALL.index_slot_num),
            "--index-items", str(SMALL.index_num)]
    remote = submit(cluster, packed_env, tmp_path, "rebuild", "--store", str(stores / "a"), "--out",
                    str(tmp_path / "cluster"), *args)
    mine = local(spark, rebuild, stores / "a", out=str(tmp_path / "local"), extra=SMALL_ARGS)
    (r,) = remote["stores"]
    assert (r["messages"], r["committedIndex"], r["executorBackends"]) == (560, 559, ["native"])
    assert r["segments"] == mine["stores"][0]["segments"] >= 3
    assert digests(tmp_path / "cluster") == digests(tmp_path / "local") == digests(stores / "expected")
    # Both workers ran executors, each in the environment the job shipped.
    for k in range(cluster.workers):
        shipped = [d for d, _, files in os.walk(cluster.work_dir(k)) if d.endswith(os.path.join("site-packages",
                                                                                                 "native"))
                   and any(f.startswith("_native") and f.endswith(".so") for f in files)]
        assert shipped, f"worker {k} has no unpacked environment with the native module"


def _rows(spark, path):
    cols = [c for c, _ in export.COLUMNS if c != "store"]
    return sorted(tuple(r) for r in spark.read.parquet(str(path)).select(*cols).collect())


def test_export_equals_local(spark, cluster, packed_env, stores, tmp_path):
    remote = submit(cluster, packed_env, tmp_path, "export", "--store", str(stores / "a"), "--out",
                    str(tmp_path / "cluster"))
    mine = local(spark, export, stores / "a", out=str(tmp_path / "local"))
    assert remote["rows"] == mine["rows"] == 560
    assert _rows(spark, tmp_path / "cluster") == _rows(spark, tmp_path / "local")


def test_audit_equals_local(spark, cluster, packed_env, stores, tmp_path):
    remote = submit(cluster, packed_env, tmp_path, "audit", "--store", str(stores / "a"), "--store",
                    str(stores / "b"), code=1)
    mine = json.loads(json.dumps(local(spark, audit, stores / "a", stores / "b")))
    assert remote["divergence"]["index"] == 321 and remote == mine


def test_incremental_export_of_a_staged_uri(spark, cluster, packed_env, stores, tmp_path):
    live, staged = stores / "live", tmp_path / "staged"
    uri, out, ckpt = f"file://{staged}", tmp_path / "out", tmp_path / "ckpt"
    first_stage = stage.stage_store(str(live), str(staged))
    # The first run in local mode, the second on the cluster: the checkpoint
    # is the store's and the output's, not the Spark master's.
    first = local(spark, export, uri, out=str(out), extra=(("since_checkpoint", str(ckpt)),))
    assert first["rows"] == first_stage.last_index + 1
    commit_up_to(live, 399)
    second_stage = stage.stage_store(str(live), str(staged))
    second = submit(cluster, packed_env, tmp_path, "export", "--store", uri, "--out", str(out),
                    "--since-checkpoint", str(ckpt))
    (s,) = second["stores"]
    assert (s["fromIndex"], s["toIndex"]) == (first_stage.last_index + 1, second_stage.last_index)
    full = local(spark, export, uri, out=str(tmp_path / "full"))
    assert first["rows"] + second["rows"] == full["rows"] == second_stage.last_index + 1
    assert _rows(spark, out) == _rows(spark, tmp_path / "full")
