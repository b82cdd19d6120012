# Every console script pyproject.toml declares ([project.scripts], read
# here, never a list of our own) answers --version, offers the --log-level /
# --log-file / --log-format options and -- its bad input as an operator meets
# it -- puts the cause on the first line of stderr: a bad option value, a
# missing config (or other) file, an unreachable name server.  A script
# added to pyproject without a row in CAUSES fails test_every_script_has_its_causes.
#
# In-process (the entry point called with sys.argv set, as the generated
# wrapper calls it): the same code and exit status without an interpreter
# start per case.  --version runs each entry point as a real process, once,
# so the declaration itself (module:function) is what is tested.
import logging
import socket
import sys
import tomllib
import types
from importlib import import_module

import pytest
import trio

from tests.helpers import REPO_ROOT

SCRIPTS: dict[str, str] = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once it is closed


def entry_point(name: str):
    module, _, attr = SCRIPTS[name].partition(":")
    return getattr(import_module(module), attr)


@pytest.fixture
def call(capsys, monkeypatch):
    """call(name, *args) -> (exit status, stdout, stderr): the script's
    entry point run in-process; the root logger is put back afterwards (the
    commands configure logging as a process would)."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)

    def run(name: str, *args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", [name, *args])
        # as in the generated wrapper: a __main__ that is no package, so click names the program by argv[0]
        monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
        capsys.readouterr()
        try:
            entry_point(name)()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            root.handlers[:] = saved[0]
            root.setLevel(saved[1])
        out, err = capsys.readouterr()
        assert "Traceback" not in err, err
        return code, out, err

    return run


def first_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines, "nothing on stderr"
    return lines[0]


# name -> [(argv, expected exit status, what the first line of stderr must contain)], each script's own
# bad inputs beyond the bad --log-level every script gets (test_bad_log_level_is_the_first_line).
def CAUSES(tmp) -> dict[str, list[tuple[list[str], int, list[str]]]]:
    missing = str(tmp / "missing.conf")
    dead = f"127.0.0.1:{closed_port()}"
    return {
        "mqbroker": [(["-c", missing], 1, [f"Error: {missing}: No such file or directory"]),
                     (["-c", missing, "--log-format", "xml"], 2, ["Error: Invalid value for '--log-format'", "'xml'"])],
        "mqnamesrv": [(["-c", missing], 1, [f"Error: {missing}: No such file or directory"]),
                      (["-p", "70000"], 2, ["Error: Invalid value for '-p' / '--listen-port'", "70000"])],
        "mqproxy": [(["-c", missing], 2, ["Error: Invalid value for '-c' / '--config-file'", missing,
                                          "does not exist"])],
        "mqadmin": [(["clusterList", "-n", dead], 3, [f"mqadmin: error: name server {dead}", "Connection refused"]),
                    (["migrate", "apply", "-c", missing], 2,
                     ["Error: Invalid value for '-c'", missing, "does not exist"]),
                    (["clusterList", "--timeout", "soon"], 2, ["Error: Invalid value for '--timeout'", "'soon'"])],
        "mqbench": [(["producer", "-n", dead, "--count", "1", "--seconds", "5"], 1,
                     ["Error: no message could be sent", dead, "Connection refused"]),
                    (["producer", "-s", "0"], 2,
                     ["Error: Invalid value for '-s' / '--size'", "0 is not in the range"])],
        "mqdashboard": [(["-n", "127.0.0.1:9876", "--tlsTrustCertPath", missing], 2,
                         ["Error: Invalid value for '--tlsTrustCertPath'", missing, "does not exist"]),
                        (["-n", "127.0.0.1:9876", "--port", "70000"], 2,
                         ["Error: Invalid value for '--port'", "70000"])],
    }


def test_every_script_has_its_causes(tmp_path):
    assert set(CAUSES(tmp_path)) == set(SCRIPTS), "a console script without its bad inputs in CAUSES"


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_log_options_on_every_script(name, call):
    code, out, _ = call(name, "--help")
    assert code == 0, out
    for option in ("--version", "--log-level", "--log-file", "--log-format"):
        assert option in out, (name, option)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_bad_log_level_is_the_first_line(name, call):
    code, _, err = call(name, "--log-level", "verbose")
    assert code == 2, err
    assert first_line(err).startswith("Error: Invalid value for '--log-level': 'verbose' is not one of "), err
    assert err.splitlines()[1].startswith(f"Usage: {name} "), err  # the usage follows the cause


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_causes_on_the_first_line(name, call, tmp_path):
    for argv, status, expected in CAUSES(tmp_path)[name]:
        code, out, err = call(name, *argv)
        assert code == status, (argv, code, out, err)
        line = first_line(err)
        for part in expected:
            assert part in line, (argv, part, err)


@pytest.mark.slow
async def test_version_from_each_declared_entry_point():
    """Slow: one interpreter start per console script (side by side)."""
    results: dict[str, tuple[int, str, str]] = {}

    async def version(name: str) -> None:
        module, _, attr = SCRIPTS[name].partition(":")
        code = f"import sys; from {module} import {attr}; sys.argv[0] = {name!r}; sys.exit({attr}())"
        r = await trio.run_process([sys.executable, "-c", code, "--version"], capture_stdout=True,
                                   capture_stderr=True, check=False, cwd=str(REPO_ROOT))
        results[name] = (r.returncode, r.stdout.decode(), r.stderr.decode())

    async with trio.open_nursery() as nursery:
        for name in SCRIPTS:
            nursery.start_soon(version, name)
    from broker.telemetry.logs import version_text
    for name, (code, out, err) in results.items():
        assert code == 0 and out == f"{name} (ledgermq) {version_text()}\n", (name, code, out, err)
