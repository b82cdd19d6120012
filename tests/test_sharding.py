# Owns the checks of tests/sharding.py, the split of each half of the suite
# (slow, quick) into shards that tests/run_suite.py runs side by side: every
# shard computes the same split, whole files, disjoint, and together every
# selected test; and of run_suite's arrangement, report and exit code.
import json
import os
import subprocess
import sys

from tests.helpers import REPO_ROOT
from tests.sharding import split


def test_split_balances_longest_first_and_is_the_same_everywhere():
    weights = {"a": 100.0, "b": 60.0, "c": 50.0, "d": 10.0, "e": 8.0}
    owner = split(list(weights), weights, 2)
    assert owner == split(list(reversed(weights)), weights, 2)  # the order files were found in does not matter
    loads = [sum(w for f, w in weights.items() if owner[f] == k) for k in range(2)]
    assert sorted(loads) == [110.0, 118.0]
    assert set(split(["x"], {"x": 1.0}, 3).values()) == {0}


def test_a_together_folder_goes_to_one_shard():
    """The pipeline's files share one SparkSession per process: split by
    file, they would go two ways (a, y and x, b); as one unit of 32 s they stay together."""
    weights = {"tests/tools/pipeline/test_a.py": 20.0, "tests/tools/pipeline/test_b.py": 12.0,
               "tests/x.py": 18.0, "tests/y.py": 10.0}
    owner = split(list(weights), weights, 2)
    assert owner["tests/tools/pipeline/test_a.py"] == owner["tests/tools/pipeline/test_b.py"] == 0
    assert owner["tests/x.py"] == owner["tests/y.py"] == 1


def test_shards_run_every_test_once(tmp_path):
    for name, n in (("test_one.py", 3), ("test_two.py", 2), ("test_three.py", 1), ("test_four.py", 4)):
        (tmp_path / name).write_text("".join(f"def test_{i}():\n    pass\n" for i in range(n)))
    (tmp_path / "known.json").write_text(json.dumps({"test_four.py": 50}))
    seen = {}
    for i in range(2):
        times = tmp_path / f"times-{i}.json"
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.sharding",
                            f"--shard={i}/2", f"--shard-known={tmp_path / 'known.json'}", f"--shard-times={times}",
                            "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path)],
                           capture_output=True, text=True, cwd=REPO_ROOT, check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        written = json.loads(times.read_text())
        seen[i] = {k.split("::")[0].rsplit("/", 1)[-1] for k in written["seconds"]}
        assert len(written["seconds"]) == (4 if i == 0 else 6) and written["failed"] == []
    assert seen == {0: {"test_four.py"}, 1: {"test_one.py", "test_two.py", "test_three.py"}}


def _suite(tmp_path, tests: dict[str, str], **env) -> tuple[int, str, dict, dict]:
    """python -m tests.run_suite over a directory of `tests` (name -> source);
    its exit code, output and the times it kept for each half."""
    suite = tmp_path / "suite"
    suite.mkdir()
    for name, source in tests.items():
        (suite / name).write_text(source)
    times = tmp_path / "times.json"
    env = {**os.environ, "LEDGERMQ_SUITE_PATHS": str(suite), "LEDGERMQ_SLOW_SHARDS": "2",
           "LEDGERMQ_QUICK_SHARDS": "2", "LEDGERMQ_SLOW_TIMES": str(times), **env}
    env.pop("LEDGERMQ_QUICK_TIMES", None)
    r = subprocess.run([sys.executable, "-m", "tests.run_suite"], capture_output=True, text=True, cwd=REPO_ROOT,
                       env=env, check=False)
    quick = tmp_path / "times-quick.json"

    def kept(path):
        return {k.rsplit("/", 1)[-1]: v for k, v in json.loads(path.read_text()).items()} if path.exists() else {}
    return r.returncode, r.stdout + r.stderr, kept(times), kept(quick)


SLOW = "import pytest\npytestmark = pytest.mark.slow\n"


def test_run_suite_runs_every_part_reports_and_fails_when_a_background_shard_fails(tmp_path):
    code, out, slow, quick = _suite(tmp_path, {
        "test_a.py": SLOW + "def test_a():\n    pass\n",                         # slow shard 0 (the one that streams)
        "test_b.py": SLOW + "def test_b():\n    assert False, 'shard failure'\n",  # slow shard 1
        "test_q1.py": "def test_q1():\n    pass\n",                              # quick shard 0
        "test_q2.py": "def test_q2():\n    assert False, 'quick failure'\n"})    # quick shard 1
    assert code == 1 and "shard failure" in out and "quick failure" in out, out
    assert "slow shard 0: exit 0; slow shard 1: exit 1; quick shard 0: exit 0; quick shard 1: exit 1" in out
    for n in range(2):
        assert f"the tests not marked slow, quick shard {n} of 2" in out
    top = out.split("slowest 15 tests", 1)[1]
    assert all(f"{t}.py::{t}" in top for t in ("test_a", "test_b", "test_q1", "test_q2")), out
    assert "test_b.py::test_b  (failed)" in top and "test_a.py::test_a  (failed)" not in top
    # kept for the next split, but not a failed test's file (it may have failed fast)
    assert sorted(slow) == ["test_a.py"] and sorted(quick) == ["test_q1.py"]


def test_run_suite_with_one_shard_each_runs_two_processes(tmp_path):
    """LEDGERMQ_SLOW_SHARDS=1 and LEDGERMQ_QUICK_SHARDS=1: the arrangement
    as it was, one process per half; the quick one's exit code counts."""
    code, out, slow, quick = _suite(tmp_path, {
        "test_a.py": SLOW + "def test_a():\n    pass\n",
        "test_q1.py": "def test_q1():\n    pass\n",
        "test_q2.py": "def test_q2():\n    assert False, 'quick failure'\n"},
        LEDGERMQ_SLOW_SHARDS="1", LEDGERMQ_QUICK_SHARDS="1")
    assert code == 1, out
    assert out.rstrip().endswith("slow shard 0: exit 0; quick shard 0: exit 1"), out
    assert "quick shard 0 of 1" in out and "1 failed, 1 passed" in out
    assert sorted(slow) == ["test_a.py"] and sorted(quick) == ["test_q1.py"]
