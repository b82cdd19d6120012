# Owns how `make test` runs the whole suite in pytest processes at once:
# the tests marked `slow` (multi-process clusters, stock clients, Spark
# submits; much of their time is spent waiting on client timers, elections
# and subprocesses) as SHARDS shards side by side in the foreground, and all
# the others beside them under `nice`, so that they use the idle CPU
# without taking it from the timing-sensitive cluster tests.  Run in one
# process after the other, the halves took 13 + 5.5 minutes; side by side
# with the slow half in one process, 13 minutes.
#
#   python -m tests.run_suite              # the whole suite, as above
#   python -m tests.run_suite ARGS...      # plain `pytest ARGS...` (one process)
#
# LEDGERMQ_SLOW_SHARDS=N sets the number of slow shards (1: one process, as
# before); LEDGERMQ_SUITE_PATHS="PATH ..." runs the same arrangement over
# those paths only (to try it on a subset).  Each shard takes whole files, balanced by their seconds in the
# last run (tests/sharding.py; the times are kept in the venv, SLOW_TIMES).
# The first shard's output streams; the others' go to files and are printed
# when all are done, then the 15 slowest slow tests of all shards.  The exit
# code is the first non-zero one (5, "no tests collected", counts as a
# failure, as in .ci/run).
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

NICE = 10
SHARDS = int(os.environ.get("LEDGERMQ_SLOW_SHARDS", "2"))
# file -> seconds, from the last run; kept only inside a venv (make test's),
# or where LEDGERMQ_SLOW_TIMES says
SLOW_TIMES = (Path(os.environ["LEDGERMQ_SLOW_TIMES"]) if os.environ.get("LEDGERMQ_SLOW_TIMES")
              else Path(sys.prefix) / "ledgermq-slow-test-seconds.json" if sys.prefix != sys.base_prefix else None)
PATHS = shlex.split(os.environ.get("LEDGERMQ_SUITE_PATHS", ""))


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


def _report_times(times_dir: Path) -> None:
    """The 15 slowest slow tests of all shards, and each file's seconds
    for the next run's split."""
    per_test: dict[str, float] = {}
    for f in sorted(times_dir.glob("shard-*.json")):
        try:
            per_test.update(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    if not per_test:
        return
    print("\n========== slowest 15 slow tests (setup + call + teardown, all shards) ==========")
    for nodeid, s in sorted(per_test.items(), key=lambda kv: -kv[1])[:15]:
        print(f"{s:8.2f}s {nodeid}")
    if SLOW_TIMES is None:
        return
    per_file: dict[str, float] = {}
    for nodeid, s in per_test.items():
        path = nodeid.split("::", 1)[0]
        per_file[path] = per_file.get(path, 0.0) + s
    try:
        known = json.loads(SLOW_TIMES.read_text()) if SLOW_TIMES.exists() else {}
        known = known if isinstance(known, dict) else {}
        known.update({k: round(v, 2) for k, v in per_file.items()})
        SLOW_TIMES.write_text(json.dumps(known, indent=0, sort_keys=True))
    except (OSError, ValueError) as e:
        print(f"(could not keep the test times in {SLOW_TIMES}: {e})")


def main(argv: list[str]) -> int:
    if argv:
        return subprocess.call(_pytest(*argv))
    shards = max(1, SHARDS)
    with tempfile.TemporaryDirectory(prefix="ledgermq-tests-") as tmp:
        tmp_dir = Path(tmp)
        logs = [open(tmp_dir / name, "w+b") for name in ["quick.log"] + [f"slow-{i}.log" for i in range(1, shards)]]
        procs: list[subprocess.Popen] = []
        try:
            procs.append(subprocess.Popen(_pytest("-m", "not slow", "-p", "no:cacheprovider", *PATHS), stdout=logs[0],
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          preexec_fn=lambda: os.nice(NICE)))
            print(f"tests not marked slow: running beside these under nice {NICE} (pid {procs[0].pid}); "
                  "their report follows", flush=True)

            def slow(i: int) -> list[str]:
                known = [f"--shard-known={SLOW_TIMES}"] if SLOW_TIMES else []
                return _pytest("-m", "slow", "-p", "tests.sharding", f"--shard={i}/{shards}", *known,
                               f"--shard-times={tmp_dir / f'shard-{i}.json'}", *PATHS)
            for i in range(1, shards):
                procs.append(subprocess.Popen(slow(i), stdout=logs[i], stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL))
            if shards > 1:
                print(f"slow tests: {shards} shards side by side; shard 0 below, the others' reports follow "
                      f"(pids {', '.join(str(p.pid) for p in procs[1:])})", flush=True)
            first = subprocess.call(slow(0))
            codes = [first] + [p.wait() for p in procs[1:]] + [procs[0].wait()]
        except BaseException:
            _stop(procs)
            raise
        for i in range(1, shards):
            _print_log(f"slow tests, shard {i} of {shards}", logs[i])
        _print_log("the tests not marked slow", logs[0])
        _report_times(tmp_dir)
        for log in logs:
            log.close()
    names = [f"slow shard {i}" for i in range(shards)] + ["the others"]
    print("\n" + "; ".join(f"{n}: exit {c}" for n, c in zip(names, codes)), flush=True)
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
