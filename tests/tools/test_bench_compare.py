# Smoke test of the NATS JetStream comparison (tools/bench/compare/): its
# --quick run, as a subprocess with a time limit, yields every row with a
# positive figure for both systems, the failover row, CPU figures for every
# server process and the client, and a PNG chart.  Nothing about speed is
# asserted: the figures only have to exist.
# Slow: a --quick benchmark run against our group and nats-server, as
#   subprocesses.
import json
import os
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("nats", reason="the bench extra is not installed (pip install -e '.[bench]')")
pytest.importorskip("matplotlib", reason="the bench extra is not installed")
pytest.importorskip("psutil", reason="the bench extra is not installed")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LEDGERMQ_ROLES = {"master", "slave1", "slave2", "namesrv", "client"}
NATS_ROLES = {"leader", "follower1", "follower2", "client"}


def test_quick_comparison_reports_every_row(tmp_path):
    from tools.bench.compare.common import ROWS
    from tools.bench.compare.nats_side import nats_server_path

    nats_server_path()  # fails clearly when the binary is missing
    chart = tmp_path / "c.png"
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # Its own session: on a timeout the benchmark and the servers it started
    # (its process group, nothing else) are stopped, not left running.
    proc = subprocess.Popen([sys.executable, "-m", "tools.bench.compare", "--quick", "--json", "--chart", str(chart)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=420)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # it stops its clusters on SIGTERM
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(f"the quick comparison did not finish in 420 s:\n{err[-4000:]}")
    assert proc.returncode == 0, err[-4000:]
    result = json.loads(out)

    rows = result["rows"]
    assert set(rows) == {r.key for r in ROWS}
    for row in ROWS:
        s = rows[row.key]
        metrics = {"mps": ["mps"], "latency": ["p50_ms", "p99_ms"], "failover": ["seconds"]}[row.kind]
        for metric in metrics:
            for side in ("ledgermq", "nats"):
                assert s[metric][side] is not None, (row.key, metric, side)
                assert s[metric][side]["median"] > 0, (row.key, metric, side)
            assert s[metric]["ratio_ledgermq_over_nats"] > 0
        if row.kind != "failover":
            assert set(s["cpu_us"]["ledgermq"]) >= LEDGERMQ_ROLES, row.key
            assert set(s["cpu_us"]["nats"]) >= NATS_ROLES, row.key
            assert s["cpu_us"]["ledgermq"]["client"]["median"] > 0
            assert s["cpu_us"]["nats"]["client"]["median"] > 0

    # the failover row: the leader/master we killed and who took over, on both sides
    (lmq,), (nats,) = rows["failover"]["details"]["ledgermq"], rows["failover"]["details"]["nats"]
    assert lmq["killed"] != lmq["new_master"] and lmq["new_master"] is not None
    assert nats["killed"] != nats["new_leader"] and nats["new_leader"] is not None

    # every server process has an RSS figure; each round names the leader/master it measured
    assert set(result["rss_mb"]["ledgermq"]) == LEDGERMQ_ROLES - {"client"}
    assert set(result["rss_mb"]["nats"]) == NATS_ROLES - {"client"}
    assert all(v["median"] > 0 for side in result["rss_mb"].values() for v in side.values())
    (rnd,) = result["rounds"]
    assert rnd["ledgermq"]["nodes"]["master"] and rnd["nats"]["nodes"]["leader"]

    with open(chart, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
