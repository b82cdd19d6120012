# mqadmin verifyStore / dumpStore on real stores: ours, stock-format, and
# damaged ones; exit codes 0/1/2/3 and one-line errors.
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from click.testing import CliRunner

from commitlog.store import SegmentedStore
from tests.commitlog.store_helpers import DATA_SEG, body, cfg, fill
from tests.helpers import REPO_ROOT
from tests.helpers.stock_dledger import write_stock_store
from tools.mqadmin import cli

ROOT = str(REPO_ROOT)


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def store(tmp_path):
    with SegmentedStore.open(cfg(tmp_path)) as s:
        fill(s, 40)
        s.set_committed(35)
        positions = [s.pos_of(i) for i in range(40)]
    return str(tmp_path), positions


def test_verify_clean_store_json_and_text(store):
    root, _ = store
    res = run("verifyStore", "--store", root, "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert {k: out[k] for k in ("entries", "firstIndex", "lastIndex", "committedIndex", "problems")} == \
        {"entries": 40, "firstIndex": 0, "lastIndex": 39, "committedIndex": 35, "problems": []}
    assert out["segments"] == len(os.listdir(os.path.join(root, "dledger-n0", "data")))
    assert out["dataSegmentSize"] == DATA_SEG
    res = run("verifyStore", "--store", os.path.join(root, "dledger-n0"))
    assert res.exit_code == 0 and "entries    40 (index 0 .. 39)" in res.stdout and "problems   none" in res.stdout


def test_verify_reports_problems_with_file_and_offset(store):
    root, positions = store
    victim = 20
    seg_start = positions[victim] // DATA_SEG * DATA_SEG
    path = os.path.join(root, "dledger-n0", "data", f"{seg_start:020d}")
    with open(path, "r+b") as f:
        f.seek(positions[victim] - seg_start + 60)
        f.write(b"\xff")
    res = run("verifyStore", "--store", root, "--self-id", "n0", "--json")
    assert res.exit_code == 1
    problems = json.loads(res.stdout)["problems"]
    assert problems[0] == {"file": path, "offset": positions[victim] - seg_start,
                           "reason": problems[0]["reason"]}
    assert "bodyCrc mismatch" in problems[0]["reason"] and problems[0]["reason"].startswith("entry 20:")
    res = run("verifyStore", "--store", root)
    assert res.exit_code == 1 and f"{path} at offset {positions[victim] - seg_start}: entry 20" in res.stdout


def test_verify_runs_a_body_checker(store):
    root, _ = store
    res = run("verifyStore", "--store", root, "--json", "--body-check", "tests.tools.mqadmin.test_store:odd_first_byte")
    assert res.exit_code == 1
    reasons = [p["reason"] for p in json.loads(res.stdout)["problems"]]
    expected = [i for i in range(40) if body(i) and body(i)[0] % 2]
    assert reasons == [f"entry {i}: odd first byte" for i in expected]


def odd_first_byte(header, view):
    return "odd first byte" if len(view) and view[0] % 2 else None


def test_dump_store_text_and_json_lines(store):
    root, positions = store
    res = run("dumpStore", "--store", root, "--from", "17", "--count", "4", "--json")
    assert res.exit_code == 0
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert [(r["index"], r["pos"], r["bodyLength"], r["magic"], r["term"]) for r in rows] == \
        [(i, positions[i], len(body(i)), 1, 1) for i in range(17, 21)]
    assert all(r["size"] == 48 + r["bodyLength"] for r in rows)
    res = run("dumpStore", "--store", root, "--count", "2")
    lines = res.stdout.splitlines()
    assert res.exit_code == 0 and len(lines) == 3 and lines[0].split()[:6] == \
        ["index", "term", "pos", "size", "magic", "bodyLen"]
    assert lines[2].split()[:6] == ["1", "1", str(positions[1]), str(48 + len(body(1))), "1", str(len(body(1)))]
    assert run("dumpStore", "--store", root, "--from", "39", "--count", "10", "--json").stdout.count("\n") == 1


def test_reads_a_stock_store(tmp_path):
    write_stock_store(str(tmp_path), [(body(i), 2) for i in range(50)], data_size=4096, index_size=32 * 16)
    res = run("verifyStore", "--store", str(tmp_path), "--json")
    out = json.loads(res.stdout)
    assert res.exit_code == 0 and (out["entries"], out["dataSegmentSize"], out["indexSegmentSize"]) == \
        (50, 4096, 512)
    rows = [json.loads(x) for x in run("dumpStore", "--store", str(tmp_path), "--from", "48", "--json").stdout.split("\n") if x]
    assert [(r["index"], r["chainCrc"], r["bodyCrc"]) for r in rows] == [(48, 0, 0), (49, 0, 0)]


def test_usage_and_environment_errors(tmp_path, store):
    root, _ = store
    res = run("verifyStore")
    assert res.exit_code == 2  # missing --store
    with SegmentedStore.open(cfg(root, "n1")):
        pass
    res = run("verifyStore", "--store", root)
    assert res.exit_code == 2 and "choose one with --self-id" in res.stderr
    res = run("dumpStore", "--store", root, "--self-id", "n0", "--count", "-1")
    assert res.exit_code == 2
    for args, message in ((("verifyStore", "--store", str(tmp_path / "nope")), "no such directory"),
                          (("dumpStore", "--store", str(tmp_path / "dledger-n0" / "index")), "not a DLedger store"),
                          (("verifyStore", "--store", root, "--self-id", "n7"), "no DLedger store for self id")):
        res = run(*args)
        assert res.exit_code == 3 and res.stdout == ""
        assert res.stderr.count("\n") == 1 and message in res.stderr and res.stderr.startswith("mqadmin: error:")


@pytest.mark.skipif(os.geteuid() == 0 and not shutil.which("setpriv"), reason="root without setpriv reads anything")
def test_unreadable_file_is_one_line():
    """A data file the user may not read: one line, exit 3.  As root the
    command runs without the DAC-override capabilities, so the permission
    check is real either way."""
    root = tempfile.mkdtemp(prefix="lmq-unreadable-")
    try:
        os.chmod(root, 0o755)
        with SegmentedStore.open(cfg(root)) as s:
            fill(s, 5)
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames:
                os.chmod(os.path.join(dirpath, name), 0o755)
            for name in filenames:
                os.chmod(os.path.join(dirpath, name), 0o644)
        os.chmod(os.path.join(root, "dledger-n0", "data", f"{0:020d}"), 0)
        drop = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
                "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
        res = subprocess.run([*drop, sys.executable, "-m", "tools.mqadmin", "verifyStore", "--store", root],
                             capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
        assert res.returncode == 3, res.stderr
        assert res.stderr.count("\n") == 1 and "Permission denied" in res.stderr and "Traceback" not in res.stderr
    finally:
        shutil.rmtree(root)


def test_real_process_exit_codes_and_no_traceback(store, tmp_path):
    root, _ = store
    env = {**os.environ, "PYTHONPATH": ROOT}
    ok = subprocess.run([sys.executable, "-m", "tools.mqadmin", "verifyStore", "--store", root, "--json"],
                        capture_output=True, text=True, cwd=ROOT, env=env)
    assert ok.returncode == 0 and json.loads(ok.stdout)["entries"] == 40
    bad = subprocess.run([sys.executable, "-m", "tools.mqadmin", "dumpStore", "--store", str(tmp_path / "missing")],
                         capture_output=True, text=True, cwd=ROOT, env=env)
    assert bad.returncode == 3 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
