# The soak's verdict and exit status (tools/chaos/soak.py) do not depend on
# its chart: with matplotlib unavailable a clean run exits 0 and says in one
# line that the chart was skipped; a failed or unbounded run still exits 1.
# The nemesis run itself is replaced by its result (a long soak is not a
# unit test); the command line, report() and the files it writes are real.
import json
import sys

import attrs
import pytest

from tools.chaos import soak
from tools.chaos.checker import Verdict
from tools.chaos.nemesis import Fault
from tools.chaos.soak import Sample, report
from tools.chaos.workload import History


@pytest.fixture
def no_matplotlib(monkeypatch):
    """`import matplotlib` raises ImportError, as on a machine without it."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def flat(n: int = 20, *, anon_growth: int = 0) -> list[Sample]:
    return [Sample(60.0 + 5 * i, 100.0, 2.0, 9.0, {"n0": 50 << 20}, {"n0": 40},
                   {"n0": (30 << 20) + anon_growth * i * (1 << 20)}, {"n0": 10}) for i in range(n)]


FAULTS = [Fault("kill", "kill -9 n0", start=70.0, healed=75.0)]


def chart_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("chart skipped")]


def test_clean_run_without_matplotlib_exits_0_and_says_the_chart_was_skipped(tmp_path, capsys, no_matplotlib):
    assert report(str(tmp_path), 7, 1.5, Verdict(cycles=3), flat(), FAULTS, 0.0) == 0
    out = capsys.readouterr().out
    assert chart_lines(out) == ["chart skipped: matplotlib is not installed (pip install 'ledgermq[bench]')"]
    assert "verdict: OK" in out
    assert out.splitlines()[-1] == f"wrote {tmp_path}/soak.json"
    assert not (tmp_path / "soak.png").exists()
    written = json.loads((tmp_path / "soak.json").read_text())
    assert written["verdict"]["ok"] is True and written["seed"] == 7 and len(written["samples"]) == 20


def test_failed_verdict_exits_1_without_matplotlib(tmp_path, capsys, no_matplotlib):
    assert report(str(tmp_path), 7, 1.5, Verdict(problems=["lost: 3 acknowledged sends"]), flat(), FAULTS, 0.0) == 1
    out = capsys.readouterr().out
    assert "verdict: FAILED" in out and len(chart_lines(out)) == 1


def test_unbounded_heap_exits_1_without_matplotlib(tmp_path, capsys, no_matplotlib):
    assert report(str(tmp_path), 7, 1.5, Verdict(), flat(anon_growth=8), FAULTS, 0.0) == 1
    assert "PROBLEM: unbounded: n0: anon grew" in capsys.readouterr().out


def test_a_chart_that_fails_to_draw_is_skipped_and_the_verdict_stands(tmp_path, capsys, monkeypatch):
    def broken(*args):
        raise ValueError("no finite values to plot")
    monkeypatch.setattr(soak, "chart", broken)
    assert report(str(tmp_path), 7, 1.5, Verdict(), flat(), FAULTS, 0.0) == 0
    assert chart_lines(capsys.readouterr().out) == [
        "chart skipped: drawing it failed: ValueError: no finite values to plot"]


def test_with_matplotlib_the_chart_is_written(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert report(str(tmp_path), 7, 1.5, Verdict(), flat(), FAULTS, 0.0) == 0
    out = capsys.readouterr().out
    assert not chart_lines(out) and out.splitlines()[-1] == f"wrote {tmp_path}/soak.json and {tmp_path}/soak.png"
    assert (tmp_path / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_command_line_exits_with_the_verdict_not_the_chart(tmp_path, capsys, monkeypatch, no_matplotlib):
    """python -m tools.chaos.soak's own path: options parsed by click, the
    run's result judged by report(), its status returned by main()."""
    seen = {}

    @attrs.define
    class Ran:
        faults: list

    async def fake_run_chaos(opts, *, sampler, on_cycle):
        seen["opts"] = opts
        return Verdict(cycles=1), History(0.0), Ran(FAULTS)

    monkeypatch.setattr(soak, "run_chaos", fake_run_chaos)
    monkeypatch.delenv("LEDGERMQ_COMPAT_PYTHON", raising=False)
    assert soak.main(["--minutes", "0.5", "--seed", "11", "--nodes", "5", "--out", str(tmp_path)]) == 0
    opts = seen["opts"]
    assert (opts.seed, opts.nodes, opts.seconds, opts.stock_python) == (11, 5, 30.0, None)
    out = capsys.readouterr().out
    assert out.startswith("soak: seed 11, 0.5 min, 5 nodes") and len(chart_lines(out)) == 1
