# Owns the private-names rule (issue 32 part 4): no module of the packages
# reaches into another module's `_private` names -- neither `from m import
# _name` nor `m._name` through a module it imported -- and none imports a
# `_private` module of another package.  A name other modules use is public
# in its owner (or moves to its user); no re-exports.  What still breaks the
# rule is in ALLOWED with the reason; an entry that no longer occurs is stale
# and fails too, so the list only shrinks.  Dunder names are not private.
import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("native", "commitlog", "consumequeue", "broker", "tools")

# (importing module, owner module, name) -> why it is still there
ALLOWED: dict[tuple[str, str, str], str] = {
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def crossings(me: str, source: str, *, is_package: bool, is_module=lambda name: False) -> list[tuple[str, str]]:
    """(owner module, private name) for every private name module `me`
    takes from another module of the packages.  `is_module(dotted)` says
    whether a dotted name is a module (so `from pkg import mod; mod._x`
    is seen)."""
    tree = ast.parse(source)
    package = me if is_package else me.rpartition(".")[0]
    modules: dict[str, str] = {}  # local alias -> module of the packages
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                owner = ".".join(base + ([node.module] if node.module else []))
            else:
                owner = node.module or ""
            if owner.split(".")[0] not in PACKAGES:
                continue
            found += _private_module(me, owner)
            for alias in node.names:
                if is_module(f"{owner}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{owner}.{alias.name}"
                    found += _private_module(me, f"{owner}.{alias.name}")
                elif _private(alias.name) and owner != me:
                    found.append((owner, alias.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    found += _private_module(me, alias.name)
                    if alias.asname:
                        modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and _private(node.attr) and modules[node.value.id] != me):
            found.append((modules[node.value.id], node.attr))
    return found


def _private_module(me: str, owner: str) -> list[tuple[str, str]]:
    """A `_private` module is its package's own: others may not import it."""
    parts = owner.split(".")
    for i, part in enumerate(parts):
        if _private(part):
            package = ".".join(parts[:i])
            if not (me == package or me.startswith(package + ".")):
                return [(package, part)]
    return []


def _is_module(dotted: str) -> bool:
    path = REPO.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def test_no_module_takes_another_modules_private_names():
    seen: set[tuple[str, str, str]] = set()
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            me = module_name(path)
            for owner, name in crossings(me, path.read_text(), is_package=path.name == "__init__.py",
                                         is_module=_is_module):
                seen.add((me, owner, name))
    bad = sorted(seen - ALLOWED.keys())
    assert not bad, ("private names used across modules -- make them public in their owner or move them to "
                     "their user (no re-exports):\n  " + "\n  ".join(f"{m}: {o}.{n}" for m, o, n in bad))
    stale = sorted(ALLOWED.keys() - seen)
    assert not stale, f"ALLOWED names crossings that no longer occur: {stale}"


@pytest.mark.parametrize("source, expected", [
    ("from broker.remoting.codec import _Helper", [("broker.remoting.codec", "_Helper")]),
    ("from .codec import _Helper", [("broker.remoting.codec", "_Helper")]),
    ("from ..store import _x", [("broker.store", "_x")]),
    ("import consumequeue.record as M\nM._I32.pack(1)", [("consumequeue.record", "_I32")]),
    ("from consumequeue import record as R\nR._I32", [("consumequeue.record", "_I32")]),
    ("from native._native import lib", [("native", "_native")]),
    ("def f():\n    from tools.localcluster import _repo_root", [("tools.localcluster", "_repo_root")]),
    ("from broker.remoting.codec import Helper, __version__", []),
    ("from broker.remoting.connection import _own", [("broker.remoting.connection", "_own")]),
    ("import trio\ntrio._core", []),  # not ours
])
def test_the_rule_sees_each_way_in(source, expected):
    modules = {"consumequeue.record", "broker.remoting.codec", "broker.store"}
    assert crossings("broker.remoting.pacing", source, is_package=False,
                     is_module=lambda name: name in modules) == expected


def test_a_module_may_use_its_own_private_names_and_a_package_its_private_module():
    assert crossings("broker.remoting.codec", "from broker.remoting.codec import _Helper", is_package=False) == []
    assert crossings("native", "from native._native import ffi, lib", is_package=True) == []
    assert crossings("native.dispatch", "from native._native import lib", is_package=False) == []
