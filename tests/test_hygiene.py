# Owns the suite's own hygiene rules (issue 32 part 3), checked with `ast`
# over every module under tests/:
#
#   * no bare real-time waits: a `sleep(<constant>)` (trio, anyio, asyncio,
#     time) that is not inside a loop (a poll loop checks its condition each
#     time round; tests/helpers/waiting.py is the one to use) and not in a
#     test on trio's MockClock (a fixture parameter named *clock) waits a
#     fixed time for something to happen.  Wait on the thing itself (an
#     event, a watermark, a log line, wait_until).  A sleep that is the
#     test's subject (a clock that must move, a step that must block) is
#     named in ALLOWED with the reason.  The count of the others may not
#     rise above BARE_SLEEPS (the ratchet: it only goes down);
#   * every test marked `slow` says why in its docstring (or, marked for a
#     whole module through `pytestmark`, in the module's opening comment):
#     a line starting "Slow:".
import ast
from pathlib import Path

import attrs

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

# The ratchet.  Issue 32 counted 36 bare waits; this is the count now.
BARE_SLEEPS = 0

# (path under the repository, enclosing function) -> why its constant sleep
# is the test's subject, not a wait for something.
ALLOWED = {
    ("tests/commitlog/test_stallwatch.py", "blocker"):
        "blocks the event loop on purpose: the stall watch must report it",
    ("tests/commitlog/transport/test_tcp.py", "test_stale_messages_expire_unsent"):
        "ages a queued message past max_queue_age: time passing is the subject",
    ("tests/broker/compat/test_planned_operations.py", "test_replace_the_master_node_fails_no_send"):
        "the drain is time itself: the stock C++ client asks for routes every 30 s, no event says it did",
    ("tests/broker/compat/test_stock_features.py", "test_stock_orderly_consumer_across_a_master_kill"):
        "puts the kill at an arbitrary point of the stock client's lock-renewal and commit timers",
    ("tests/broker/test_server.py", "slow_register"):
        "a stand-in name server registration that is slow on purpose: the send must wait for it",
    ("tests/broker/remoting/test_server.py", "slow_commit"):
        "a stand-in processor that is slow on purpose (the lead's send-path files)",
    ("tests/broker/remoting/test_send_runs.py", "finish"):
        "a stand-in that answers late on purpose (the lead's send-path files)",
}


# Slow modules being written right now by others (their owners add the
# "Slow:" line); an entry is taken out once it has its reason.
SLOW_REASON_PENDING = {
}


@attrs.frozen
class Sleep:
    path: str
    line: int
    function: str
    seconds: float
    in_loop: bool
    on_mock_clock: bool

    def where(self) -> str:
        return f"{self.path}:{self.line} in {self.function}() sleeps {self.seconds} s"


def _is_constant_sleep(node: ast.AST) -> float | None:
    if not isinstance(node, ast.Call) or not node.args:
        return None
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
    arg = node.args[0]
    if name != "sleep" or not isinstance(arg, ast.Constant) or not isinstance(arg.value, (int, float)):
        return None
    return arg.value or None  # sleep(0) is a checkpoint, not a wait


def _sleeps(path: Path) -> list[Sleep]:
    return _sleeps_in(path.read_text(), path.relative_to(REPO).as_posix())


def _sleeps_in(source: str, rel: str) -> list[Sleep]:
    found: list[Sleep] = []

    def walk(node: ast.AST, funcs: tuple, in_loop: bool) -> None:
        for child in ast.iter_child_nodes(node):
            f, loop = funcs, in_loop
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                f, loop = funcs + (child,), False  # a function defined in a loop is not the loop
            elif isinstance(child, (ast.While, ast.For, ast.AsyncFor)):
                loop = True
            seconds = _is_constant_sleep(child)
            if seconds is not None:
                mock = any(a.arg.endswith("clock") for fn in f for a in fn.args.args)
                found.append(Sleep(rel, child.lineno, f[-1].name if f else "<module>", seconds, loop, mock))
            walk(child, f, loop)

    walk(ast.parse(source, rel), (), False)
    return found


def all_sleeps() -> list[Sleep]:
    return [s for p in sorted(TESTS.rglob("*.py")) for s in _sleeps(p)]


def bare(sleeps: list[Sleep]) -> list[Sleep]:
    return [s for s in sleeps if not s.in_loop and not s.on_mock_clock and (s.path, s.function) not in ALLOWED]


def test_no_more_bare_sleeps_than_the_ratchet():
    sleeps = all_sleeps()
    waits = bare(sleeps)
    print(f"\nconstant sleeps in tests: {len(sleeps)} ({sum(s.in_loop for s in sleeps)} in poll loops, "
          f"{sum(s.on_mock_clock for s in sleeps)} on MockClock, "
          f"{sum((s.path, s.function) in ALLOWED for s in sleeps)} allowed); bare waits: {len(waits)}")
    assert len(waits) <= BARE_SLEEPS, (
        f"{len(waits)} bare real-time waits (the ratchet is {BARE_SLEEPS}); wait on the event, watermark "
        "or condition itself (tests/helpers/waiting.py), or name a sleep that is the test's subject in "
        "ALLOWED with the reason:\n" + "\n".join(s.where() for s in waits))


def test_every_allowed_sleep_still_exists():
    """An entry whose sleep is gone is taken out, so the list stays the
    list of real exceptions."""
    present = {(s.path, s.function) for s in all_sleeps()}
    assert set(ALLOWED) <= present, sorted(set(ALLOWED) - present)


def _marks_slow(decorators) -> bool:
    for d in decorators:
        text = ast.unparse(d)
        if text.endswith("mark.slow") or "mark.slow" in text.split("(")[0]:
            return True
    return False


def _module_slow(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            return "mark.slow" in ast.unparse(node.value)
    return False


def _says_slow(text: str | None) -> bool:
    return any(line.strip().startswith("Slow:") for line in (text or "").splitlines())


def _opening_comment(source: str) -> str:
    lines = []
    for line in source.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return "\n".join(lines)


def slow_tests_without_a_reason() -> list[str]:
    missing = []
    for path in sorted(TESTS.rglob("test_*.py")):
        source = path.read_text()
        tree = ast.parse(source, str(path))
        rel = path.relative_to(REPO).as_posix()
        module_slow = _module_slow(tree)
        module_says = _says_slow(ast.get_docstring(tree)) or _says_slow(_opening_comment(source))
        classes = [(None, tree.body)] + [(c, c.body) for c in tree.body if isinstance(c, ast.ClassDef)]
        for cls, body in classes:
            cls_slow = cls is not None and _marks_slow(cls.decorator_list)
            for fn in body:
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not fn.name.startswith("test"):
                    continue
                if _marks_slow(fn.decorator_list) or cls_slow:
                    if not _says_slow(ast.get_docstring(fn)):
                        missing.append(f"{rel}::{fn.name}")
                elif module_slow and not (module_says or _says_slow(ast.get_docstring(fn))):
                    missing.append(f"{rel}::{fn.name} (module pytestmark)")
    return missing


def test_every_slow_test_says_why():
    missing = [m for m in slow_tests_without_a_reason() if m.split("::")[0] not in SLOW_REASON_PENDING]
    assert not missing, ("tests marked slow without a 'Slow: <why>' line in their docstring (or, for a module's "
                         "pytestmark, in its opening comment):\n" + "\n".join(missing))


def test_every_pending_slow_module_is_still_pending():
    pending = {m.split("::")[0] for m in slow_tests_without_a_reason()}
    listed = {f for f in SLOW_REASON_PENDING if (REPO / f).exists()}  # (one not committed yet is absent)
    assert listed <= pending, f"these have their reason now, take them out: {sorted(listed - pending)}"


def test_the_checks_see_what_they_count():
    """The walkers on a known module: a bare sleep, a poll loop's, one on
    MockClock, sleep(0); a slow test with and without its reason."""
    found = _sleeps_in(
        "import pytest, trio, time\n"
        "async def test_a():\n    await trio.sleep(2)\n    while True:\n        await trio.sleep(0.1)\n"
        "    await trio.sleep(0)\n"
        "async def test_b(autojump_clock):\n    await trio.sleep(5)\n"
        "def test_c():\n    for _ in range(3):\n        def inner():\n            time.sleep(1)\n", "sample.py")
    assert [(s.function, s.seconds, s.in_loop, s.on_mock_clock) for s in found] == [
        ("test_a", 2, False, False), ("test_a", 0.1, True, False), ("test_b", 5, False, True),
        ("inner", 1, False, False)]
    assert [s.function for s in bare(found)] == ["test_a", "inner"]
    tree = ast.parse("import pytest\n@pytest.mark.slow\nasync def test_x():\n    '''Why.\n\n    Slow: a cluster.'''\n"
                     "@pytest.mark.slow\ndef test_y():\n    pass\n")
    fns = [n for n in tree.body if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef)]
    assert [_marks_slow(f.decorator_list) and _says_slow(ast.get_docstring(f)) for f in fns] == [True, False]
    assert _module_slow(ast.parse("import pytest\npytestmark = [pytest.mark.slow, pytest.mark.anyio]\n"))
    assert _says_slow(_opening_comment("# Owns x.\n# Slow: three brokers.\nimport os\n"))
