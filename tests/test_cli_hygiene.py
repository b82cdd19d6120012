# Owns the rule that the command-line entry points are on click, the
# house's CLI library (issue 32), checked over every module of the packages:
#
#   * no module imports argparse, except those in ARGPARSE_ALLOWED, each
#     with the reason (and its header says it too); an entry that no longer
#     imports argparse is stale and fails;
#   * every entry point (a module with `if __name__ == "__main__":` and a
#     main) answers -h and --help with status 0 and its usage, and refuses
#     an unknown option as a usage error: status 2 and the cause on the
#     first line of stderr (broker/telemetry/commands.py's rule), no
#     traceback.  Run in-process: the same command code and statuses as
#     `python -m ...`, without an interpreter start per module.
import ast
import importlib
from pathlib import Path

import click
import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("native", "commitlog", "consumequeue", "broker", "tools")

# path under the repository -> why it keeps argparse
ARGPARSE_ALLOWED = {
    "tools/chaos/stock_producer.py":
        "runs inside the compat venv, which holds PyPI rocketmq==0.4.4 alone (no click, never ledgermq)",
}


def modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py") if "__pycache__" not in p.parts)


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def imports_argparse(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "argparse" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "argparse":
            return True
    return False


def test_no_module_imports_argparse_but_the_allowed():
    found = {rel(p) for p in modules() if imports_argparse(ast.parse(p.read_text(), str(p)))}
    unexplained = sorted(found - set(ARGPARSE_ALLOWED))
    assert not unexplained, f"argparse in {unexplained}: use click (see tools/cli.py), or allow it here with why"
    stale = sorted(set(ARGPARSE_ALLOWED) - found)
    assert not stale, f"{stale} no longer import argparse: take them out of ARGPARSE_ALLOWED"
    for path in ARGPARSE_ALLOWED:
        assert "argparse" in header(REPO / path), f"{path}: its opening comment should say why it keeps argparse"


def header(path: Path) -> str:
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines)


def entry_points() -> list[str]:
    """Modules run as programs that define a main (the build script
    native/_build.py takes no options; __main__.py files only call one)."""
    out = []
    for path in modules():
        if rel(path) in ARGPARSE_ALLOWED or path.name == "__main__.py" and "if __name__" not in path.read_text():
            continue
        tree = ast.parse(path.read_text(), str(path))
        guarded = any(isinstance(n, ast.If) and "__name__" in ast.unparse(n.test) for n in tree.body)
        has_main = any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)
        if guarded and has_main:
            out.append(".".join(path.relative_to(REPO).with_suffix("").parts))
    return out


def test_the_entry_points_are_found():
    found = set(entry_points())
    assert {"commitlog.node", "tools.chaos.soak", "tools.bench.compare.__main__", "tools.pipeline.stats",
            "broker.server"} <= found, found
    assert len(found) >= 30, found


def call(module: str, argv: list[str]) -> int:
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in PACKAGES:
            raise
        pytest.skip(f"{module} needs {exc.name}, an optional extra that is not installed")
    main = mod.main
    try:
        status = main.main(args=argv, prog_name=module) if isinstance(main, click.Command) else main(argv)
    except SystemExit as exc:
        status = exc.code
    return status or 0


@pytest.mark.parametrize("module", entry_points())
def test_entry_point_answers_help_and_refuses_an_unknown_option_cause_first(module, capsys):
    for flag in ("-h", "--help"):
        assert call(module, [flag]) == 0, flag
        out, err = capsys.readouterr()
        assert out.startswith("Usage: ") and "--help" in out and not err, (flag, out, err)
    assert call(module, ["--no-such-option"]) == 2
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert lines and lines[0].startswith("Error: No such option") and "--no-such-option" in lines[0], err
    assert any(line.startswith("Usage: ") for line in lines[1:]) and "Traceback" not in err + out, err


def test_run_command_returns_the_callbacks_status(capsys):
    """tools.cli.run_command: click's standalone mode would exit 0 whatever
    the callback returned (a failed soak or nemesis run must exit 1)."""
    from tools.cli import CONTEXT, run_command

    @click.command(context_settings=CONTEXT)
    @click.option("--status", type=int, default=0)
    @click.option("--fail", is_flag=True)
    @click.option("--interrupt", is_flag=True)
    def command(status: int, fail: bool, interrupt: bool) -> int:
        if fail:
            raise click.ClickException("the store at /x: no such directory")
        if interrupt:
            raise KeyboardInterrupt
        return status

    assert run_command(command, ["--status", "1"], "t") == 1
    assert run_command(command, [], "t") == 0
    assert run_command(command, ["--fail"], "t") == 1
    assert capsys.readouterr().err == "Error: the store at /x: no such directory\n"
    assert run_command(command, ["--interrupt"], "t") == 130
    assert run_command(command, ["--status", "x"], "t") == 2
    assert capsys.readouterr().err.splitlines()[-3].startswith("Error: Invalid value for '--status'")
