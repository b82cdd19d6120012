# The seam between the Raft core and its roles (roles/ports.py) is kept, read
# from the source: the roles use exactly the RaftNode protocol's members,
# RaftCore has every one of them, no role or progress record writes the log,
# and no role module imports the core.
import ast
import pathlib

import attrs

import commitlog.raft
from commitlog.raft.core import RaftCore
from commitlog.raft.roles.ports import RaftNode

RAFT = pathlib.Path(commitlog.raft.__file__).parent
ROLES = sorted((RAFT / "roles").glob("*.py"))
LOG_WRITES = {"append_leader", "append_stamped", "append_follower", "truncate_from", "reset_to", "set_committed"}


def protocol_members() -> set[str]:
    tree = ast.parse((RAFT / "roles" / "ports.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RaftNode"]
    return {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}


def node_uses(path: pathlib.Path) -> set[str]:
    """Attributes read off the node: `self.node.x`, or `x` of a local bound
    to self.node (`node = self.node`, `n = self.node`)."""
    tree = ast.parse(path.read_text())
    aliases = set()
    for n in ast.walk(tree):
        if (isinstance(n, ast.Assign) and isinstance(n.value, ast.Attribute) and n.value.attr == "node"
                and isinstance(n.value.value, ast.Name) and n.value.value.id == "self"):
            aliases.update(t.id for t in n.targets if isinstance(t, ast.Name))
    used = set()
    for n in ast.walk(tree):
        if not isinstance(n, ast.Attribute):
            continue
        v = n.value
        if isinstance(v, ast.Attribute) and v.attr == "node" and isinstance(v.value, ast.Name) and v.value.id == "self":
            used.add(n.attr)
        elif isinstance(v, ast.Name) and v.id in aliases:
            used.add(n.attr)
    return used


def test_the_roles_use_exactly_what_the_protocol_lists():
    members = protocol_members()
    used = set().union(*(node_uses(p) for p in ROLES))
    assert used - members == set(), "a role uses a node member the protocol does not list"
    assert members - used == set(), "the protocol lists a member no role uses"


def test_the_core_implements_the_protocol():
    fields = {a.name for a in attrs.fields(RaftCore)}
    missing = {m for m in protocol_members() if m not in fields and not hasattr(RaftCore, m)}
    assert missing == set()
    assert getattr(RaftNode, "_is_protocol", False)      # structural: RaftCore does not inherit it
    assert RaftNode not in RaftCore.__mro__


def test_no_role_or_progress_record_writes_the_log():
    for path in [*ROLES, RAFT / "progress.py"]:
        calls = {n.func.attr for n in ast.walk(ast.parse(path.read_text()))
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
        assert calls & LOG_WRITES == set(), path.name


def test_no_role_imports_the_core_and_progress_knows_no_role():
    for path in [*ROLES, RAFT / "progress.py"]:
        tree = ast.parse(path.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "commitlog.raft.core" not in imported, path.name
        if path.name == "progress.py":
            assert not any(m.startswith("commitlog.raft.roles") for m in imported if m)
