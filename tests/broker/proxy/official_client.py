# Runs the official RocketMQ 5.x Python client (PyPI rocketmq-python-client,
# gRPC) against mqproxy, as tests/broker/compat/stock_client.py runs the
# stock C++ client: in a virtual environment of its own, .venv-grpc-client/
# at the repo root (git-ignored), built on first use with `python -m venv` +
# pip and reused behind a stamp file; building is serialized with a file
# lock.  Scripts in scripts/ run in it as subprocesses with HOME in a fresh
# temporary directory (the client logs to ~/logs/rocketmq_python/); each
# prints JSON lines, the last {"result": ...}.
#
#   ensure_venv()                                   # OfficialClientUnavailable if it cannot be built
#   r = run_script("produce.py", [endpoint, ak, sk, "Orders", "normal", 10])
#   p = start_script(...); for event in events(p): ...   # a script the test watches as it runs
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

PACKAGE = "rocketmq-python-client==5.1.2"
VENV_DIR = Path(os.environ.get("LEDGERMQ_GRPC_CLIENT_VENV", REPO_ROOT / ".venv-grpc-client"))
SCRIPTS = Path(__file__).resolve().parent / "scripts"
_STAMP = ".installed-" + PACKAGE.replace("==", "-")
_LOAD_CHECK = "from rocketmq import Producer, SimpleConsumer, PushConsumer"


class OfficialClientUnavailable(RuntimeError):
    """The venv could not be built or the client does not load (the step and its output)."""


class ScriptError(RuntimeError):
    """A script timed out, exited non-zero or printed no result."""


def _python() -> Path:
    return VENV_DIR / "bin" / "python"


def _run(cmd: list[str], what: str, timeout: float) -> None:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise OfficialClientUnavailable(f"{what} failed: {e}") from None
    if p.returncode != 0:
        raise OfficialClientUnavailable(f"{what} failed (exit {p.returncode}): {(p.stdout + p.stderr)[-2000:]}")


_ready = False


def ensure_venv(timeout: float = 900.0) -> Path:
    global _ready
    if _ready:
        return _python()
    key = hashlib.sha1(str(VENV_DIR).encode()).hexdigest()[:12]
    with open(Path(tempfile.gettempdir()) / f"ledgermq-grpc-client-venv-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = VENV_DIR / _STAMP
        if not (stamp.exists() and _python().exists()):
            base = getattr(sys, "_base_executable", sys.executable) or sys.executable
            _run([base, "-m", "venv", "--clear", str(VENV_DIR)], f"python -m venv {VENV_DIR}", timeout)
            _run([str(_python()), "-m", "pip", "install", "-q", "--disable-pip-version-check", PACKAGE],
                 f"pip install {PACKAGE}", timeout)
            stamp.write_text(PACKAGE + "\n")
        _run([str(_python()), "-c", _LOAD_CHECK], f"loading the official client ({_LOAD_CHECK})", 120)
    _ready = True
    return _python()


@attrs.define
class Running:
    process: subprocess.Popen
    home: tempfile.TemporaryDirectory
    name: str
    lines: list = attrs.Factory(list)

    def events(self, timeout: float):
        """Each JSON line as the script prints it; ScriptError past `timeout`."""
        deadline = time.monotonic() + timeout
        for line in self.process.stdout:
            if line.startswith("{"):
                event = json.loads(line)
                self.lines.append(event)
                yield event
            if time.monotonic() > deadline:
                break
        self.finish(max(1.0, deadline - time.monotonic()))

    def finish(self, timeout: float) -> dict:
        try:
            rest, err = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            rest, err = self.process.communicate()
            raise ScriptError(f"{self.name} did not finish; stderr: {err[-2000:]}; {self.client_log()}") from None
        self.lines += [json.loads(x) for x in rest.splitlines() if x.startswith("{")]
        results = [e["result"] for e in self.lines if "result" in e]
        if self.process.returncode != 0 or not results:
            raise ScriptError(f"{self.name} exited {self.process.returncode} without a result; stderr: "
                              f"{err[-3000:]}; {self.client_log()}")
        return results[-1]

    def client_log(self) -> str:
        logs = sorted(Path(self.home.name).rglob("*.log"))
        return "".join(f"==> {f.name} <==\n{f.read_text(errors='replace')[-3000:]}" for f in logs)


def start_script(name: str, args: list) -> Running:
    python = ensure_venv()
    home = tempfile.TemporaryDirectory(prefix="ledgermq-grpc-client-home-")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home.name, "LANG": "C.UTF-8",
           "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(SCRIPTS)}
    p = subprocess.Popen([str(python), str(SCRIPTS / name), *map(str, args)], cwd=home.name, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return Running(p, home, f"{name} {args}")


def run_script(name: str, args: list, timeout: float = 90.0) -> dict:
    r = start_script(name, args)
    try:
        return r.finish(timeout)
    finally:
        r.home.cleanup()
