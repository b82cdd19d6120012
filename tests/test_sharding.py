# Owns the checks of tests/sharding.py, the split of the slow tests into
# shards that tests/run_suite.py runs side by side: every shard computes the
# same split, whole files, disjoint, and together every selected test.
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
        seen[i] = {k.split("::")[0].rsplit("/", 1)[-1] for k in json.loads(times.read_text())}
        assert len(json.loads(times.read_text())) == (4 if i == 0 else 6)
    assert seen == {0: {"test_four.py"}, 1: {"test_one.py", "test_two.py", "test_three.py"}}


def _suite(tmp_path, tests: dict[str, str]) -> tuple[int, str, dict]:
    """python -m tests.run_suite over a directory of `tests` (name -> source)."""
    suite = tmp_path / "suite"
    suite.mkdir()
    for name, source in tests.items():
        (suite / name).write_text(source)
    times = tmp_path / "times.json"
    env = {**os.environ, "LEDGERMQ_SUITE_PATHS": str(suite), "LEDGERMQ_SLOW_SHARDS": "2",
           "LEDGERMQ_SLOW_TIMES": str(times)}
    r = subprocess.run([sys.executable, "-m", "tests.run_suite"], capture_output=True, text=True, cwd=REPO_ROOT,
                       env=env, check=False)
    return r.returncode, r.stdout + r.stderr, json.loads(times.read_text()) if times.exists() else {}


SLOW = "import pytest\npytestmark = pytest.mark.slow\n"


def test_run_suite_runs_every_part_reports_and_fails_when_a_background_shard_fails(tmp_path):
    code, out, times = _suite(tmp_path, {
        "test_a.py": SLOW + "def test_a():\n    pass\n",                         # shard 0 (the one that streams)
        "test_b.py": SLOW + "def test_b():\n    assert False, 'shard failure'\n",  # shard 1
        "test_quick.py": "def test_q():\n    pass\n"})
    assert code == 1 and "shard failure" in out, out
    assert "slow shard 0: exit 0; slow shard 1: exit 1; the others: exit 0" in out
    assert "slowest 15 slow tests" in out and "test_a.py::test_a" in out and "test_b.py::test_b" in out
    assert sorted(k.rsplit("/", 1)[-1] for k in times) == ["test_a.py", "test_b.py"]  # kept for the next split
