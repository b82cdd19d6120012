# broker/common/subscription.py's limits: a tag expression past
# MAX_TAG_EXPRESSION_LENGTH and a SQL92 one past sqlfilter's limits are
# SUBSCRIPTION_PARSE_FAILED; the compiled-expression cache stays within its
# count and its characters however many distinct expressions arrive.
import pytest

from broker.common import subscription as S
from broker.common.sqlfilter import MAX_SQL_LENGTH
from broker.remoting.codes import ResponseCode


def test_tag_expression_length_limit():
    at_limit = "||".join(f"t{i}" for i in range(3000))[:S.MAX_TAG_EXPRESSION_LENGTH].rstrip("|")
    assert len(S.parse_subscription(at_limit).tags) > 1000
    with pytest.raises(S.SubscriptionError) as info:
        S.parse_subscription("T||" * (S.MAX_TAG_EXPRESSION_LENGTH // 3 + 1))
    assert info.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and len(info.value.remark) < 400


def test_sql_refusals_are_parse_failed():
    for expression in ("(" * 10_000 + "a=1" + ")" * 10_000, " AND ".join(["a=1"] * 100_000)):
        with pytest.raises(S.SubscriptionError) as info:
            S.parse_subscription(expression, expression_type=S.SQL92)
        assert info.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and len(info.value.remark) < 1000


def test_the_compiled_cache_is_bounded_by_count_and_characters():
    cache = S._CompiledCache(entries=4, chars=800)
    for i in range(10):
        cache.put(f"a = {i}", object())
    assert len(cache._lru) == 4 and cache.get("a = 9") is not None and cache.get("a = 0") is None
    long = "a = 1 AND " * 20  # 200 characters: more than an eighth of 800, never cached
    cache.put(long, object())
    assert cache.get(long) is None
    mid = "b = 1 OR " * 10  # 90 characters each: the character budget, not the count, evicts
    cache = S._CompiledCache(entries=100, chars=800)
    for i in range(20):
        cache.put(mid + str(i), object())
    assert cache._held <= 800 and len(cache._lru) == 800 // 91
    # The broker's own: every SQL expression of the maximum length still compiles and is cached.
    expr = ("a = 1 OR " * (MAX_SQL_LENGTH // 9))[:-4]
    first = S.parse_subscription(expr, expression_type=S.SQL92).sql
    assert S.parse_subscription(expr, expression_type=S.SQL92).sql is first
    assert S._CACHE._held <= S._CACHE_CHARS
