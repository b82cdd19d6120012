# Owns what a consumer subscribes to, as broker and client both read it:
# FilterAPI.buildSubscriptionData (a tag expression to tags and their
# String.hashCode codes, the codes the consume queue stores), and the
# PullSysFlag bits of PULL_MESSAGE.  SQL92 expressions (MessageSelector.
# bySql) are compiled by broker.common.sqlfilter; the broker decides whether
# it filters by them (enablePropertyFilter), this module only parses.
import functools

import attrs

from broker.common.sqlfilter import SqlFilter, SqlFilterError, compile_sql
from broker.remoting.codes import ResponseCode
from native.hashing import java_hash_str

# PullSysFlag
FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4
FLAG_CLASS_FILTER = 0x8
FLAG_LITE_PULL = 0x10

SUB_ALL = "*"
TAG = "TAG"
SQL92 = "SQL92"


class SubscriptionError(ValueError):
    """An expression the broker cannot filter by (answered with `code`)."""

    def __init__(self, code: int, remark: str):
        super().__init__(remark)
        self.code, self.remark = code, remark


@attrs.frozen
class Subscription:
    """FilterAPI.buildSubscriptionData: `*` (every tag) or a set of tags;
    or a SQL92 expression (`sql`, every consume queue unit passes and the
    record's properties decide)."""

    sub_string: str
    tags: frozenset[str] = frozenset()
    codes: frozenset[int] | None = None  # None: every message (as far as tags go)
    sub_version: int = 0
    expression_type: str = TAG
    sql: SqlFilter | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def is_all(self) -> bool:
        return self.codes is None and self.sql is None

    @property
    def is_sql(self) -> bool:
        return self.sql is not None


def parse_subscription(expression: str | None, sub_version: int = 0,
                       expression_type: str | None = "TAG") -> Subscription:
    """`TagA || TagB` -> tags {TagA, TagB} and their String.hashCode codes;
    null, empty or `*` -> every message; with expression_type SQL92 the
    compiled expression (SUBSCRIPTION_PARSE_FAILED when it does not parse).
    Raises SubscriptionError (NO_PERMISSION) for other expression types."""
    etype = (expression_type or TAG).strip().upper() or TAG
    if etype == SQL92:
        return Subscription(expression or "", sub_version=sub_version, expression_type=SQL92,
                            sql=_compiled(expression or ""))
    if etype != TAG:
        raise SubscriptionError(ResponseCode.NO_PERMISSION,
                        f"The broker does not support consumer to filter message by {etype}")
    text = (expression or "").strip()
    if not text or text == SUB_ALL:
        return Subscription(SUB_ALL, sub_version=sub_version)
    # Java keeps every non-empty trimmed tag; `*` is special only as the
    # whole expression, and an expression of separators alone matches nothing.
    tags = [t for t in (t.strip() for t in text.split("||")) if t]
    return Subscription(text, frozenset(tags), frozenset(java_hash_str(t) for t in tags), sub_version)


@functools.lru_cache(maxsize=1024)  # pulls repeat a few expressions: compile each once
def _compiled(expression: str) -> SqlFilter:
    try:
        return compile_sql(expression)
    except SqlFilterError as exc:
        raise SubscriptionError(ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                                f"parse the consumer's subscription[{expression}] failed: {exc}") from None
