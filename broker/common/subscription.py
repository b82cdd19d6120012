# Owns what a consumer subscribes to, as broker and client both read it:
# FilterAPI.buildSubscriptionData (a tag expression to tags and their
# String.hashCode codes, the codes the consume queue stores), and the
# PullSysFlag bits of PULL_MESSAGE.  SQL92 expressions (MessageSelector.
# bySql) are compiled by broker.common.sqlfilter; the broker decides whether
# it filters by them (enablePropertyFilter), this module only parses.
#
# Limits (expressions come from consumers): a tag expression of more than
# MAX_TAG_EXPRESSION_LENGTH (16384) characters is refused with
# SUBSCRIPTION_PARSE_FAILED, as a SQL92 one past sqlfilter's limits is; so
# one subscription holds at most about 5,500 tags.  Compiled SQL92
# expressions are cached for the pulls that repeat them, at most
# _CACHE_ENTRIES of them and _CACHE_CHARS characters of text in all (a
# compiled expression takes about 80 bytes a character: ~20 MiB at most).
import collections
import threading

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
MAX_TAG_EXPRESSION_LENGTH = 16384


class SubscriptionError(ValueError):
    """An expression the broker cannot filter by (answered with `code`)."""

    def __init__(self, code: int, remark: str):
        super().__init__(remark)
        self.code, self.remark = code, remark


@attrs.frozen(kw_only=True)
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
        return Subscription(sub_string=expression or "", sub_version=sub_version, expression_type=SQL92,
                            sql=_compiled(expression or ""))
    if etype != TAG:
        raise SubscriptionError(ResponseCode.NO_PERMISSION,
                        f"The broker does not support consumer to filter message by {etype}")
    text = (expression or "").strip()
    if len(text) > MAX_TAG_EXPRESSION_LENGTH:
        raise SubscriptionError(ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                                f"parse the consumer's subscription[{text[:200]}...] failed: a tag expression of "
                                f"{len(text)} characters exceeds {MAX_TAG_EXPRESSION_LENGTH}")
    if not text or text == SUB_ALL:
        return Subscription(sub_string=SUB_ALL, sub_version=sub_version)
    # Java keeps every non-empty trimmed tag; `*` is special only as the
    # whole expression, and an expression of separators alone matches nothing.
    tags = [t for t in (t.strip() for t in text.split("||")) if t]
    return Subscription(sub_string=text, tags=frozenset(tags), codes=frozenset(java_hash_str(t) for t in tags),
                        sub_version=sub_version)


_CACHE_ENTRIES = 1024
_CACHE_CHARS = 256 * 1024


class _CompiledCache:
    """Least recently used compiled expressions, bounded by count and by
    their text's total length (a lock: the blocking client parses from
    several threads)."""

    def __init__(self, entries: int, chars: int) -> None:
        self.entries, self.chars = entries, chars
        self._lru: collections.OrderedDict[str, SqlFilter] = collections.OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def get(self, expression: str) -> SqlFilter | None:
        with self._lock:
            found = self._lru.get(expression)
            if found is not None:
                self._lru.move_to_end(expression)
            return found

    def put(self, expression: str, compiled: SqlFilter) -> None:
        if len(expression) > self.chars // 8:
            return  # one expression never takes more than an eighth of the budget
        with self._lock:
            if expression in self._lru:
                return
            self._lru[expression] = compiled
            self._held += len(expression)
            while len(self._lru) > self.entries or self._held > self.chars:
                old, _ = self._lru.popitem(last=False)
                self._held -= len(old)


_CACHE = _CompiledCache(_CACHE_ENTRIES, _CACHE_CHARS)


def _compiled(expression: str) -> SqlFilter:
    found = _CACHE.get(expression)  # pulls repeat a few expressions: compile each once
    if found is not None:
        return found
    try:
        compiled = compile_sql(expression)
    except SqlFilterError as exc:
        raise SubscriptionError(ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                                f"parse the consumer's subscription failed: {exc}") from None
    _CACHE.put(expression, compiled)
    return compiled
