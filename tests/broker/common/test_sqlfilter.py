# The SQL92 property filter (broker/common/sqlfilter.py) as a table: each
# expression against messages' properties, with the answer RocketMQ's
# evaluator gives (TRUE matches; FALSE and unknown do not), then the
# expressions it refuses, each with where it failed.
import pytest

from broker.common.sqlfilter import SqlFilterError, compile_sql
from broker.common.subscription import SQL92, SubscriptionError, parse_subscription
from broker.remoting.codes import ResponseCode

RED7 = {"a": "7", "color": "red", "TAGS": "TagA"}
BLUE3 = {"a": "3", "color": "blue", "TAGS": "TagB", "b": "1.5"}
NOTHING: dict = {}
ODD = {"a": "seven", "color": "red"}

TABLE = [
    ("a > 5 AND color = 'red'", [RED7], [BLUE3, NOTHING, ODD]),
    ("a > 5", [RED7], [BLUE3, NOTHING, ODD]),
    ("a >= 7", [RED7], [BLUE3]),
    ("a < 5", [BLUE3], [RED7, NOTHING]),
    ("a <= 3", [BLUE3], [RED7]),
    ("a = 7", [RED7], [BLUE3, ODD]),
    ("a <> 7", [BLUE3], [RED7, NOTHING]),
    ("a != 7", [BLUE3], [RED7]),
    ("b = 1.5", [BLUE3], [RED7]),
    ("b > 1", [BLUE3], [RED7]),
    ("a > -1", [RED7, BLUE3], [NOTHING]),
    ("a > 2e0", [RED7, BLUE3], []),
    ("color = 'red'", [RED7, ODD], [BLUE3, NOTHING]),
    ("color <> 'red'", [BLUE3], [RED7, NOTHING]),
    ("a BETWEEN 3 AND 7", [RED7, BLUE3], [NOTHING, ODD]),
    ("a between 4 and 10", [RED7], [BLUE3]),
    ("a NOT BETWEEN 4 AND 10", [BLUE3], [RED7, NOTHING]),
    ("color IN ('red', 'green')", [RED7, ODD], [BLUE3, NOTHING]),
    ("color NOT IN ('red')", [BLUE3], [RED7, NOTHING]),
    ("TAGS in ('TagA')", [RED7], [BLUE3]),
    ("b IS NULL", [RED7, NOTHING], [BLUE3]),
    ("b IS NOT NULL", [BLUE3], [RED7]),
    ("NOT (a > 5)", [BLUE3], [RED7, NOTHING]),
    ("not a > 5", [BLUE3], [RED7]),
    ("a > 5 OR color = 'blue'", [RED7, BLUE3], [NOTHING]),
    ("a > 100 OR b IS NULL", [RED7, NOTHING], [BLUE3]),
    ("(a > 5 OR b = 1.5) AND color IS NOT NULL", [RED7, BLUE3], [NOTHING]),
    ("x > 1 OR a = 7", [RED7], [BLUE3]),  # unknown OR TRUE is TRUE
    ("NOT (x > 1 AND a = 3)", [RED7], [BLUE3, NOTHING]),  # NOT(unknown AND FALSE) = TRUE; NOT unknown is unknown
    ("color = 'it''s'", [{"color": "it's"}], [RED7]),
    ("color CONTAINS 'e'", [RED7, BLUE3], [NOTHING]),
    ("color STARTSWITH 'bl'", [BLUE3], [RED7]),
    ("color ENDSWITH 'ed'", [RED7], [BLUE3]),
    ("TRUE", [RED7, NOTHING], []),
    ("FALSE", [], [RED7]),
    ("flag = TRUE", [{"flag": "true"}], [{"flag": "false"}, NOTHING]),
]


@pytest.mark.parametrize("expression,matching,other", TABLE, ids=[t[0] for t in TABLE])
def test_expression_table(expression, matching, other):
    f = compile_sql(expression)
    for props in matching:
        assert f.matches(props), (expression, props)
    for props in other:
        assert not f.matches(props), (expression, props)


def test_unknown_is_neither_true_nor_false():
    assert compile_sql("a > 5").evaluate({}) is None
    assert compile_sql("NOT (a > 5)").evaluate({}) is None
    assert compile_sql("a > 5 AND b = 1").evaluate({"b": "2"}) is False


BAD = [
    ("", 0), ("a >", 3), ("a > 5 AND", 9), ("color > 'red'", 6), ("a = NULL", 2), ("(a = 1", 6),
    ("a IN (1, 2)", 6), ("a IN ()", 6), ("a BETWEEN 1", 11), ("a # 1", 2), ("'x' IN ('x')", 0),
    ("a = 1 b = 2", 6), ("a NOT NULL", 6), ("a IS 5", 5),
]


@pytest.mark.parametrize("expression,position", BAD, ids=[b[0] or "<empty>" for b in BAD])
def test_bad_expressions(expression, position):
    with pytest.raises(SqlFilterError) as info:
        compile_sql(expression)
    assert info.value.position == position, str(info.value)


def test_subscription_parse_failed_code():
    sub = parse_subscription("a > 5", expression_type="sql92")
    assert sub.is_sql and not sub.is_all and sub.expression_type == SQL92 and sub.codes is None
    with pytest.raises(SubscriptionError) as info:
        parse_subscription("a >>> 5", expression_type=SQL92)
    assert info.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED


# --- limits --------------------------------------------------------------------------

def test_length_and_depth_limits_refuse_with_the_filters_error():
    from broker.common.sqlfilter import MAX_SQL_DEPTH, MAX_SQL_LENGTH
    for expression in ("(" * 10_000 + "a=1" + ")" * 10_000, " AND ".join(["a=1"] * 100_000),
                       "x" * (MAX_SQL_LENGTH + 1), "NOT " * (MAX_SQL_DEPTH + 1) + "a=1",
                       "(" * (MAX_SQL_DEPTH + 1) + "a=1" + ")" * (MAX_SQL_DEPTH + 1), "a = " + "7" * 5000):
        with pytest.raises(SqlFilterError) as info:
            compile_sql(expression)
        assert len(str(info.value)) < 400  # the text is not echoed whole
    # At the limits: parsed, and evaluated without recursion per term.
    assert compile_sql("(" * MAX_SQL_DEPTH + "a=1" + ")" * MAX_SQL_DEPTH).matches({"a": "1"})
    assert compile_sql("NOT " * MAX_SQL_DEPTH + "a=1").matches({"a": "1"})  # an even number of NOTs
    chain = " AND ".join(["a=1"] * ((MAX_SQL_LENGTH - 3) // 8 + 1))
    assert len(chain) <= MAX_SQL_LENGTH
    f = compile_sql(chain)
    assert f.matches({"a": "1"}) and not f.matches({"a": "2"}) and f.evaluate({}) is None
    g = compile_sql(" OR ".join(["a=2"] * 2000 + ["b=1"]))
    assert g.matches({"b": "1"}) and g.evaluate({"a": "3"}) is None and g.evaluate({"a": "3", "b": "2"}) is False


def test_flat_chains_keep_kleenes_tables():
    # AND: FALSE wins over unknown, unknown over TRUE; OR: TRUE wins over unknown.
    three = {"t": {"a": "1"}, "f": {"a": "2"}, "u": {}}
    for x in "tfu":
        for y in "tfu":
            for z in "tfu":
                props = {"a": three[x].get("a"), "b": three[y].get("a"), "c": three[z].get("a")}
                props = {k: v for k, v in props.items() if v is not None}
                vals = [{"t": True, "f": False, "u": None}[v] for v in (x, y, z)]
                want_and = False if False in vals else (None if None in vals else True)
                want_or = True if True in vals else (None if None in vals else False)
                assert compile_sql("a=1 AND b=1 AND c=1").evaluate(props) is want_and, (x, y, z)
                assert compile_sql("a=1 OR b=1 OR c=1").evaluate(props) is want_or, (x, y, z)
