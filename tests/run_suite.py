# Owns how `make test` runs the whole suite in two pytest processes at once:
# the tests marked `slow` (multi-process clusters, stock clients, Spark
# submits; most of their time is spent waiting on timers, elections and
# subprocesses, about one core of two on the build machine) in the
# foreground, and all the others beside them under `nice`, so that they use
# the idle core without taking CPU from the timing-sensitive cluster tests.
# Run in one process after the other, the two took 13 + 5.5 minutes; side
# by side the suite takes about as long as the slow half.
#
#   python -m tests.run_suite              # the whole suite, as above
#   python -m tests.run_suite ARGS...      # plain `pytest ARGS...` (one process)
#
# The other half's output goes to a file and is printed when both are done;
# the exit code is the first non-zero one of the two (5, "no tests
# collected", counts as a failure, as in .ci/run).
import os
import signal
import subprocess
import sys
import tempfile

NICE = 10


def _pytest(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", *args]


def main(argv: list[str]) -> int:
    if argv:
        return subprocess.call(_pytest(*argv))
    with tempfile.TemporaryFile(mode="w+b", prefix="ledgermq-tests-") as log:
        quick = subprocess.Popen(_pytest("-m", "not slow", "-p", "no:cacheprovider"), stdout=log,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 preexec_fn=lambda: os.nice(NICE))
        try:
            print(f"tests not marked slow: running beside these under nice {NICE} (pid {quick.pid}); "
                  "their report follows this one", flush=True)
            slow = subprocess.call(_pytest("-m", "slow"))
            other = quick.wait()
        except BaseException:
            if quick.poll() is None:
                quick.send_signal(signal.SIGINT)  # pytest ends its session cleanly (fixtures stop clusters)
                try:
                    quick.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    quick.kill()
                    quick.wait()
            raise
        log.seek(0)
        sys.stdout.flush()
        print("\n========== the tests not marked slow ==========", flush=True)
        sys.stdout.buffer.write(log.read())
        sys.stdout.flush()
    print(f"\nslow tests: exit {slow}; the others: exit {other}", flush=True)
    return slow or other


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
