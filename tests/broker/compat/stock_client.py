# Runs the stock RocketMQ client (PyPI rocketmq==0.4.4: a ctypes wrapper
# bundling Apache rocketmq-client-cpp 1.0.1's librocketmq.so) against
# ledgermq, per /work/shared/spec/client-compat.md.
#
# The client lives in its own virtual environment, .venv-compat/ at the repo
# root (git-ignored), created on first use with `python -m venv` + pip from
# PyPI and cached behind a stamp file; creation is serialized with a file
# lock so parallel test processes build it once.  Scripts in scripts/ run in
# it as subprocesses with HOME set to a fresh temporary directory (the C++
# core writes ~/logs/rocketmq-cpp/) and a hard timeout; each prints one JSON
# object, which run_script() returns.
#
#   venv = ensure_venv()          # StockClientUnavailable if it cannot be built
#   r = run_script("produce.py", [namesrv, "TopicTest", "3"], timeout=60)
#   r.result["sent"], r.log_text  # JSON result, the C++ core's log files
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import attrs

from tests.helpers import REPO_ROOT

PACKAGE = "rocketmq==0.4.4"
VENV_DIR = Path(os.environ.get("LEDGERMQ_COMPAT_VENV", REPO_ROOT / ".venv-compat"))
SCRIPTS = Path(__file__).resolve().parent / "scripts"
_STAMP = ".installed-" + PACKAGE.replace("==", "-")
_LOAD_CHECK = "from rocketmq.client import Producer, PullConsumer, PushConsumer"


class StockClientUnavailable(RuntimeError):
    """The compat venv could not be built or the client does not load; the
    message says exactly which step failed and its output."""


class ScriptError(RuntimeError):
    """A script timed out, exited non-zero or printed no JSON result."""


@attrs.frozen
class CompatVenv:
    python: Path
    created: bool          # built by this call (else reused from the cache)
    setup_seconds: float   # what building it cost (0 when reused)


@attrs.frozen
class ScriptRun:
    result: dict
    returncode: int
    seconds: float
    stderr: str
    log_text: str          # everything the C++ core wrote under ~/logs


def _python() -> Path:
    return VENV_DIR / "bin" / "python"


def _run(cmd: list[str], what: str, timeout: float) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise StockClientUnavailable(f"{what} failed: {e}") from None
    if p.returncode != 0:
        tail = (p.stdout + p.stderr).strip()[-2000:]
        raise StockClientUnavailable(f"{what} failed (exit {p.returncode}): {tail}")
    return p.stdout


_cached: CompatVenv | None = None


def ensure_venv(timeout: float = 600.0) -> CompatVenv:
    """The compat venv, built on first use (cached at .venv-compat/)."""
    global _cached
    if _cached is not None:
        return _cached
    # The lock lives outside the venv (venv --clear empties it) and outside
    # the repo (nothing to git-ignore).
    key = hashlib.sha1(str(VENV_DIR).encode()).hexdigest()[:12]
    lock_path = Path(tempfile.gettempdir()) / f"ledgermq-compat-venv-{key}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = VENV_DIR / _STAMP
        created, t0 = False, time.monotonic()
        if not (stamp.exists() and _python().exists()):
            created = True
            # The base interpreter, not the test venv's: a compat venv made
            # from inside .venv would otherwise inherit nothing but still be
            # tied to its path.
            base = getattr(sys, "_base_executable", sys.executable) or sys.executable
            _run([base, "-m", "venv", "--clear", str(VENV_DIR)], f"python -m venv {VENV_DIR}", timeout)
            _run([str(_python()), "-m", "pip", "install", "-q", "--disable-pip-version-check", PACKAGE],
                 f"pip install {PACKAGE}", timeout)
        # Every first use in a process checks that librocketmq.so loads
        # (a missing system library shows up here, not as a test failure).
        _run([str(_python()), "-c", _LOAD_CHECK], f"loading the stock client ({_LOAD_CHECK})", 60)
        seconds = time.monotonic() - t0 if created else 0.0
        if created:
            stamp.write_text(json.dumps({"package": PACKAGE, "setup_seconds": round(seconds, 1)}) + "\n")
    _cached = CompatVenv(_python(), created, seconds)
    return _cached


def _read_logs(home: Path) -> str:
    parts = []
    for f in sorted((home / "logs").rglob("*")) if (home / "logs").exists() else ():
        if f.is_file():
            parts.append(f"==> {f.relative_to(home)} <==\n" + f.read_text(errors="replace"))
    return "\n".join(parts)


def run_script(name: str, args: list[str], timeout: float = 60.0, env: dict | None = None) -> ScriptRun:
    """Run scripts/<name> in the compat venv with HOME in a temporary
    directory; kill it after `timeout` seconds.  Returns its JSON result."""
    venv = ensure_venv()
    with tempfile.TemporaryDirectory(prefix="ledgermq-compat-home-") as home:
        run_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "LANG": "C.UTF-8",
                   "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(SCRIPTS)}
        run_env.update(env or {})
        t0 = time.monotonic()
        try:
            p = subprocess.run([str(venv.python), str(SCRIPTS / name), *map(str, args)], cwd=home,
                               env=run_env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            raise ScriptError(f"{name} {args} did not finish in {timeout} s; stdout: {out[-1000:]!r}; "
                              f"logs: {_read_logs(Path(home))[-3000:]}") from None
        seconds = time.monotonic() - t0
        logs = _read_logs(Path(home))
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        raise ScriptError(f"{name} {args} exited {p.returncode} without a result; "
                          f"stdout: {p.stdout[-1000:]!r}; stderr: {p.stderr[-2000:]!r}; logs: {logs[-3000:]}")
    return ScriptRun(json.loads(lines[-1]), p.returncode, seconds, p.stderr, logs)
