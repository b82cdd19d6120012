# The README's ACL tables come from broker/acl/table.py through
# tools/codes_table.py: the ACL section's table (acl:begin/end) and the ACL
# columns of the request-code table (codes:begin/end) are rewritten by
# `python -m tools.codes_table --write`, and this fails when README.md was
# not.  (tests/tools/test_deploy.py checks the served/refused columns.)
from broker.acl.table import RULES, Kind
from broker.remoting.codes import RequestCode as C
from tests.helpers import REPO_ROOT
from tools import codes_table


def test_readme_acl_tables_are_generated():
    readme = (REPO_ROOT / "README.md").read_text()
    assert codes_table.ACL_BEGIN in readme and codes_table.ACL_END in readme
    assert codes_table.rewrite(readme) == readme, "run: python -m tools.codes_table --write"


def test_the_acl_table_shows_every_served_code_with_its_rule():
    acl = codes_table.acl_table()
    for code in codes_table.broker_codes():
        assert f"`{C(code).name}` {code}" in acl, code
    row = next(line for line in acl.splitlines() if "`LEDGERMQ_CHANGE_MEMBERSHIP` 9103" in line)
    assert row.endswith("| an admin account |") and "`GET_BROKER_RUNTIME_INFO` 28" in row
    assert "`LOCK_BATCH_MQ` 41, `UNLOCK_BATCH_MQ` 42 | group SUB" in acl
    table = codes_table.table()
    assert "| 33 | VIEW_MESSAGE_BY_ID | answered | refused | - | resources | - |" in table
    assert "| 103 | REGISTER_BROKER | refused | answered | - | signature | admin |" in table
    assert "| 105 | GET_ROUTEINFO_BY_TOPIC | refused | answered | - | signature | open |" in table
    assert all(rule.kind in Kind for rule in RULES.values())
