# Owns whole-process profiling on request: with LEDGERMQ_PROFILE=<dir> in the
# environment, a node or broker process runs under cProfile and writes
# <dir>/<name>.prof when it stops (SIGTERM: a clean stop).  Deterministic
# call counts are what py-spy's samples lack: how many wakeups, tasks and
# syscalls one message costs.  Off (and free) without the variable.
import contextlib
import cProfile
import os

PROFILE_ENV = "LEDGERMQ_PROFILE"


@contextlib.contextmanager
def profiled(name: str):
    profile_dir = os.environ.get(PROFILE_ENV)
    if not profile_dir:
        yield
        return
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        os.makedirs(profile_dir, exist_ok=True)
        profiler.dump_stats(os.path.join(profile_dir, f"{name}.prof"))
