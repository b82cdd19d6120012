# Owns how `make test` runs the whole suite in pytest processes at once:
# the tests marked `slow` (multi-process clusters, stock clients, Spark
# submits; much of their time is spent waiting on client timers, elections
# and subprocesses) as SLOW_SHARDS shards side by side in the foreground,
# and all the others as QUICK_SHARDS shards beside them under `nice`, so
# that while the slow shards wait on timers both cores do quick work,
# without taking CPU from the timing-sensitive cluster tests.
#
#   python -m tests.run_suite              # the whole suite, as above
#   python -m tests.run_suite ARGS...      # plain `pytest ARGS...` (one process)
#
# Knobs (environment):
#   LEDGERMQ_SLOW_SHARDS=N   slow shards (default 2; 1: one process, as before)
#   LEDGERMQ_QUICK_SHARDS=N  shards of the tests not marked slow (default 2;
#                            1: one process under nice, as before)
#   LEDGERMQ_SUITE_PATHS="PATH ..."  the same arrangement over those paths only
#   LEDGERMQ_SLOW_TIMES / LEDGERMQ_QUICK_TIMES  where each half's times are kept
#
# Each shard takes whole files, balanced by their seconds in the last run
# (tests/sharding.py).  The times are kept per half (a file may hold slow
# and quick tests), not for a file with a failed test: inside a venv,
# SLOW_TIMES and QUICK_TIMES next to it; outside one only where the knobs say.  The first slow shard's output
# streams; the others' go to files and are printed when all are done, then
# the 15 slowest tests of all shards.  The exit code is the first non-zero
# one (5, "no tests collected", counts as a failure, as in .ci/run).
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import attrs

NICE = 10
SLOW_SHARDS = int(os.environ.get("LEDGERMQ_SLOW_SHARDS", "2"))
QUICK_SHARDS = int(os.environ.get("LEDGERMQ_QUICK_SHARDS", "2"))
_IN_VENV = sys.prefix != sys.base_prefix


def _times_file(kind: str) -> Path | None:
    """file -> seconds of the last run of one half; kept only inside a venv
    (make test's), or where LEDGERMQ_<KIND>_TIMES says (the quick half's
    beside LEDGERMQ_SLOW_TIMES when only that is set)."""
    own = os.environ.get(f"LEDGERMQ_{kind.upper()}_TIMES")
    if own:
        return Path(own)
    slow = os.environ.get("LEDGERMQ_SLOW_TIMES")
    if slow:
        return Path(slow).with_name(f"{Path(slow).stem}-{kind}.json")
    return Path(sys.prefix) / f"ledgermq-{kind}-test-seconds.json" if _IN_VENV else None


SLOW_TIMES = _times_file("slow")
QUICK_TIMES = _times_file("quick")
PATHS = shlex.split(os.environ.get("LEDGERMQ_SUITE_PATHS", ""))


@attrs.frozen
class Part:
    """One pytest process: shard `index` of `count` of one half."""
    kind: str   # "slow" or "quick"
    index: int
    count: int

    @property
    def name(self) -> str:
        return f"{self.kind} shard {self.index}"

    def times_out(self, tmp_dir: Path) -> Path:
        return tmp_dir / f"{self.kind}-{self.index}.json"

    def argv(self, tmp_dir: Path) -> list[str]:
        known = SLOW_TIMES if self.kind == "slow" else QUICK_TIMES
        return _pytest("-m", "slow" if self.kind == "slow" else "not slow", "-p", "no:cacheprovider",
                       "-p", "tests.sharding", f"--shard={self.index}/{self.count}", f"--shard-kind={self.kind}",
                       *([f"--shard-known={known}"] if known else []),
                       f"--shard-times={self.times_out(tmp_dir)}", *PATHS)


def _pytest(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", *args]


def _stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)  # pytest ends its session cleanly (fixtures stop clusters)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _print_log(title: str, log) -> None:
    log.seek(0)
    sys.stdout.flush()
    print(f"\n========== {title} ==========", flush=True)
    sys.stdout.buffer.write(log.read())
    sys.stdout.flush()


def _keep(path: Path | None, per_test: dict[str, float], failed: set[str]) -> None:
    """Each file's seconds, for the next run's split of that half; a file
    with a failed test keeps its old time (a failure is often fast)."""
    if path is None or not per_test:
        return
    bad = {nodeid.split("::", 1)[0] for nodeid in failed}
    per_file: dict[str, float] = {}
    for nodeid, s in per_test.items():
        f = nodeid.split("::", 1)[0]
        if f not in bad:
            per_file[f] = per_file.get(f, 0.0) + s
    try:
        known = json.loads(path.read_text()) if path.exists() else {}
        known = known if isinstance(known, dict) else {}
        known.update({k: round(v, 2) for k, v in per_file.items()})
        path.write_text(json.dumps(known, indent=0, sort_keys=True))
    except (OSError, ValueError) as e:
        print(f"(could not keep the test times in {path}: {e})")


def _read(path: Path) -> tuple[dict[str, float], set[str]]:
    """A shard's times and failed tests (tests/sharding.py writes them)."""
    try:
        data = json.loads(path.read_text())
        return dict(data["seconds"]), set(data["failed"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}, set()


def _report_times(parts: list[Part], tmp_dir: Path) -> None:
    """The 15 slowest tests of all shards, slow and quick, and each half's
    per-file seconds for the next run's split."""
    halves: dict[str, dict[str, float]] = {"slow": {}, "quick": {}}
    failed: set[str] = set()
    for part in parts:
        seconds, bad = _read(part.times_out(tmp_dir))
        halves[part.kind].update(seconds)
        failed |= bad
    every = [(s, kind, nodeid) for kind, tests in halves.items() for nodeid, s in tests.items()]
    if every:
        print("\n========== slowest 15 tests (setup + call + teardown, all shards, slow and quick) ==========")
        for s, kind, nodeid in sorted(every, key=lambda t: (-t[0], t[2]))[:15]:
            print(f"{s:8.2f}s {kind:5} {nodeid}" + ("  (failed)" if nodeid in failed else ""))
    _keep(SLOW_TIMES, halves["slow"], failed)
    _keep(QUICK_TIMES, halves["quick"], failed)


def main(argv: list[str]) -> int:
    if argv:
        return subprocess.call(_pytest(*argv))
    slow_n, quick_n = max(1, SLOW_SHARDS), max(1, QUICK_SHARDS)
    parts = [Part("slow", i, slow_n) for i in range(slow_n)] + [Part("quick", i, quick_n) for i in range(quick_n)]
    streamed, background = parts[0], parts[1:]
    with tempfile.TemporaryDirectory(prefix="ledgermq-tests-") as tmp:
        tmp_dir = Path(tmp)
        logs = [open(tmp_dir / f"{p.kind}-{p.index}.log", "w+b") for p in background]
        procs: list[subprocess.Popen] = []
        try:
            for part, log in zip(background, logs):
                procs.append(subprocess.Popen(part.argv(tmp_dir), stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL,
                                              preexec_fn=(lambda: os.nice(NICE)) if part.kind == "quick" else None))
            print(f"slow tests: {slow_n} shard(s) in the foreground; tests not marked slow: {quick_n} shard(s) "
                  f"beside them under nice {NICE}. {streamed.name} below; the others' reports follow ("
                  + ", ".join(f"{p.name} pid {proc.pid}" for p, proc in zip(background, procs)) + ")", flush=True)
            first = subprocess.call(streamed.argv(tmp_dir))
            codes = [first] + [p.wait() for p in procs]
        except BaseException:
            _stop(procs)
            raise
        for part, log in zip(background, logs):
            _print_log(f"{'slow tests' if part.kind == 'slow' else 'the tests not marked slow'}, "
                       f"{part.name} of {part.count}", log)
        _report_times(parts, tmp_dir)
        for log in logs:
            log.close()
    print("\n" + "; ".join(f"{p.name}: exit {c}" for p, c in zip(parts, codes)), flush=True)
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
