# The pipeline from the outside, as separate processes: `mqadmin pipeline
# rebuild` end to end (its own Spark, JSON report, progress bar on stderr,
# byte-identical files), a plain `spark-submit tools/pipeline/audit.py`
# run (exit status 1 and the divergent entry), and the one-line error when
# there is no Java (JAVA_HOME pointing nowhere, no java on PATH).
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT
from tests.tools.pipeline.stores import SMALL, build_store, digests, dispatcher_output

REPO = str(REPO_ROOT)
BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    base = tmp_path_factory.mktemp("cli")
    build_store(base / "a", 300)
    build_store(base / "b", 300, diverge_at=120)
    dispatcher_output(base / "a", base / "expected")
    return base


def env(tmp_path, **extra):
    e = dict(os.environ, LEDGERMQ_SPARK_LOCAL_DIR=str(tmp_path / "spark"), PYSPARK_PYTHON=sys.executable)
    e.update(extra)
    return e


def test_mqadmin_pipeline_rebuild_end_to_end(java, stores, tmp_path):
    out = tmp_path / "out"
    p = subprocess.run([os.path.join(BIN, "mqadmin"), "pipeline", "rebuild", "--store", str(stores / "a"),
                        "--out", str(out), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
                        "--json", "--cq-file-size", str(SMALL.cq_file_size), "--index-slots",
                        str(SMALL.index_slot_num), "--index-items", str(SMALL.index_num)],
                       capture_output=True, text=True, env=env(tmp_path), timeout=300, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["stores"][0]["messages"] == 300 and report["stores"][0]["executorBackends"] == ["native"]
    assert "rebuild a" in p.stderr and "Traceback" not in p.stderr  # the progress bar
    assert digests(out) == digests(stores / "expected")


def test_spark_submit_audit_script(java, stores, tmp_path):
    p = subprocess.run([os.path.join(BIN, "spark-submit"), "--master", "local[2]", "--conf",
                        "spark.ui.enabled=false", os.path.join(REPO, "tools", "pipeline", "audit.py"),
                        "--store", str(stores / "a"), "--store", str(stores / "b"), "--json", "--no-progress"],
                       capture_output=True, text=True, env=env(tmp_path), timeout=300, cwd=str(tmp_path))
    assert p.returncode == 1, p.stderr[-3000:]
    report = json.loads(p.stdout)
    assert report["divergence"]["index"] == 120
    assert [r["entry"]["term"] for r in report["divergence"]["replicas"]] == [1, 2]


@pytest.mark.parametrize("java_home", ["/nonexistent/java-home", None])
def test_missing_java_is_one_line(stores, tmp_path, java_home):
    e = env(tmp_path, PATH=BIN)  # the venv's bin: python, mqadmin, spark-submit, no java
    e.pop("JAVA_HOME", None)
    if java_home:
        e["JAVA_HOME"] = java_home
    p = subprocess.run([os.path.join(BIN, "mqadmin"), "pipeline", "stats", "--store", str(stores / "a")],
                       capture_output=True, text=True, env=e, timeout=60)
    assert p.returncode == 3
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipeline: error: Java not found"), p.stderr
    assert (java_home or "no java on PATH") in lines[0]
