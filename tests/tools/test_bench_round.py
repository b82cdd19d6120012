# Smoke test of the waterfall of one round (tools/bench/round.py): a short
# run against real processes (a broker group, then a bare log group, each
# tracing its hops via LEDGERMQ_ROUND_TRACE) yields every hop row for the
# broker and the bare log, from complete rounds, with cumulative times that
# never go back (each row's p50 and p99 since the round began are at or past
# the row above), and task-step counts.  Nothing about speed is asserted.
# Slow: a short benchmark run against a real broker group and a bare log
#   group.
import json
import os
import signal
import subprocess
import sys

import pytest

from tools.bench.round import BROKER_HOPS, LOG_HOPS

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROUNDS = 40


def run_tool(tmp_path, *args) -> dict:
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("LEDGERMQ_ROUND_TRACE", None)
    # Its own session: on a timeout the tool and the processes it started
    # (its process group, nothing else) are stopped, not left running.
    proc = subprocess.Popen([sys.executable, "-m", "tools.bench.round", "--json", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(f"the round waterfall did not finish in 120 s:\n{err[-4000:]}")
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out)


def check_waterfall(res: dict, hops: list, steps_keys: int) -> None:
    assert res["errors"] == 0
    assert res["sent"] == ROUNDS
    assert 0 < res["complete"] <= res["rounds"]
    assert [row["hop"] for row in res["rows"]] == [label for label, _ in hops]
    prev_p50 = prev_p99 = 0.0
    for row in res["rows"]:
        for key in ("p50_us", "p99_us", "cum_p50_us", "cum_p99_us"):
            assert row[key] is not None, (row["hop"], key)
        assert row["cum_p50_us"] >= prev_p50, row
        assert row["cum_p99_us"] >= prev_p99, row
        prev_p50, prev_p99 = row["cum_p50_us"], row["cum_p99_us"]
    assert res["client_p50_us"] is not None and res["client_p99_us"] is not None
    steps = res["task_steps_p50"]
    assert len(steps) == steps_keys and all(v is not None and v >= 0 for v in steps.values()), steps
    assert res["other_follower"], "the follower off the critical path has hops too"


def test_the_waterfall_has_every_hop_in_order(tmp_path):
    res = run_tool(tmp_path, "--rounds", str(ROUNDS))
    assert res["rounds"] == ROUNDS and res["flush"] == "async"
    check_waterfall(res["broker"], BROKER_HOPS, 3)
    check_waterfall(res["log"], LOG_HOPS, 3)
    # the answer is written after the commit it waits for
    broker = {row["record"]: row for row in res["broker"]["rows"]}
    assert broker["answered"]["cum_p50_us"] >= broker["committed"]["cum_p50_us"]
