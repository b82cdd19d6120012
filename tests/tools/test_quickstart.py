# `make quickstart`'s main job (tools/quickstart.py) end to end, as a
# subprocess: a name server and three mqbroker processes, the Python client
# producing and push-consuming, kill -9 of the master in the middle of the
# second batch.  It must exit 0 and its summary must show every message
# acknowledged and consumed, none lost, the master changed, and a clean
# offline verification of all three stores.  (Smaller batches than the
# default 10,000 + 5,000 to keep the suite quick.)
# Slow: the quickstart's whole job as a subprocess: a real group, thousands of
#   messages, a kill -9.
import os
import re
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

FIRST, SECOND = 2000, 1500


def summary_value(out: str, label: str) -> str:
    m = re.search(rf"^\s*{re.escape(label)}\s+│\s+(.+?)\s*$", out, re.M)
    assert m, f"no {label!r} row in:\n{out}"
    return m.group(1)


def test_quickstart_fails_over_without_losing_a_message(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tools.quickstart", "--dir", str(tmp_path),
                           "--messages", str(FIRST), "--second", str(SECOND)],
                          capture_output=True, text=True, timeout=240)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    total = f"{FIRST + SECOND:,}"
    assert summary_value(out, "messages sent") == total
    assert summary_value(out, "acknowledged (SEND_OK)") == total
    assert summary_value(out, "never acknowledged") == "0"
    assert summary_value(out, "consumed (distinct)") == total
    assert summary_value(out, "lost (acknowledged, never consumed)") == "0"
    assert summary_value(out, "consumed at another offset than acknowledged") == "0"
    assert summary_value(out, "store verification") == "clean"
    before, after = summary_value(out, "master before / after").split(" -> ")
    assert before != after and {before, after} <= {"n0", "n1", "n2"}
    assert re.fullmatch(r"\d+\.\d\d s", summary_value(out, "failover (kill -9 to first SEND_OK on the new master)"))
    assert len(re.findall(r"^\s+n\d: [\d,]+ entries, [\d,]+ messages in consume queues, 0 problems$", out, re.M)) == 3
    # The restarted broker rejoined as a slave and every node holds the same committed index.
    rows = re.findall(r"^(n\d)\s+│\s+\S+\s+│\s+(\S+)\s+│\s+(\d+)\s+│\s+(\d+)\s+│\s+(\d+)\s+│", out, re.M)
    assert len(rows) == 3 and len({r[4] for r in rows}) == 1, rows
    assert dict((r[0], r[1]) for r in rows)[before] == "SLAVE"
    assert out.rstrip().endswith("result: OK")


def test_quickstart_keep_leaves_the_group_running(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tools.quickstart", "--dir", str(tmp_path), "--keep",
                           "--messages", "300", "--second", "300"], capture_output=True, text=True, timeout=240)
    out = proc.stdout
    pids = [int(p) for p in re.search(r"stop it with: kill ([\d ]+)$", out, re.M).group(1).split()]
    try:
        assert proc.returncode == 0, out + proc.stderr
        assert re.search(r"^  export NAMESRV_ADDR=127\.0\.0\.1:\d+$", out, re.M)
        assert "mqadmin clusterList" in out and len(pids) == 4  # three brokers and the name server
        for pid in pids:
            os.kill(pid, 0)  # still running after the quickstart exited
    finally:
        for pid in pids:  # processes this test started (through the quickstart), by PID
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
