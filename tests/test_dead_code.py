# Owns the dead-code rule (issue 32 part 4): vulture over the packages finds
# no function, method, class or property that nothing calls, save those
# named in tests/dead_code_allowlist.py (what only tests, entry points or a
# framework calling by name use, each with who) and hooks skipped by
# decorator (attrs validators and defaults, click commands, atexit).  Dead
# code is deleted, not listed.  An allow-list name nothing in the packages
# defines any more is stale and fails too, so the list only shrinks with
# the code.
import ast
from pathlib import Path

import vulture

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ["native", "commitlog", "consumequeue", "broker", "tools"]
ALLOWLIST = REPO / "tests" / "dead_code_allowlist.py"
KINDS = {"function", "method", "class", "property"}
IGNORE_DECORATORS = ["@*.validator", "@*.default", "@*.command", "@*.group", "@atexit.register"]
MIN_CONFIDENCE = 60  # vulture's confidence for an unused def: anything lower is attributes and variables


def allowed_names() -> set[str]:
    tree = ast.parse(ALLOWLIST.read_text())
    names = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Expr):
            node = stmt.value
            names.add(node.attr if isinstance(node, ast.Attribute) else node.id)
    return names


def test_nothing_in_the_packages_is_dead():
    v = vulture.Vulture(ignore_decorators=IGNORE_DECORATORS)
    v.scavenge([str(REPO / p) for p in PACKAGES])
    allowed = allowed_names()
    dead = [f"{Path(i.filename).relative_to(REPO)}:{i.first_lineno}: {i.typ} {i.name}"
            for i in v.get_unused_code(min_confidence=MIN_CONFIDENCE) if i.typ in KINDS and i.name not in allowed]
    assert not dead, (
        "code nothing in the packages calls -- delete it, or, if only tests, an entry point or a "
        "framework calling by name uses it, name it in tests/dead_code_allowlist.py with who:\n  "
        + "\n  ".join(sorted(dead)))
    defined = {i.name for group in (v.defined_funcs, v.defined_methods, v.defined_classes, v.defined_props)
               for i in group}
    stale = sorted(allowed - defined - {"_"})
    assert not stale, f"tests/dead_code_allowlist.py names what the packages no longer define: {stale}"
