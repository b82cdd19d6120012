# The replicated-log demo (tools/quickstart_log.py) runs end to end (3 real
# node processes, a kill -9 of the leader) and reports no lost acknowledged
# append.
# Slow: the log demo as a subprocess: three node processes, a kill -9 of the
#   leader.
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_log_demo_runs_end_to_end(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tools.quickstart_log", "--dir", str(tmp_path), "--entries", "2000"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "0 missing" in out and "identical" in out
    assert out.count(" 0 problems") == 3
    assert out.rstrip().endswith("OK")
