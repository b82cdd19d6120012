# Owns what a consumer subscribes to, as broker and client both read it:
# FilterAPI.buildSubscriptionData (a tag expression to tags and their
# String.hashCode codes, the codes the consume queue stores), and the
# PullSysFlag bits of PULL_MESSAGE.
import attrs

from broker.remoting.codes import ResponseCode
from native.hashing import java_hash_str

# PullSysFlag
FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4
FLAG_CLASS_FILTER = 0x8
FLAG_LITE_PULL = 0x10

SUB_ALL = "*"


class SubscriptionError(ValueError):
    """An expression the broker cannot filter by (answered with `code`)."""

    def __init__(self, code: int, remark: str):
        super().__init__(remark)
        self.code, self.remark = code, remark


@attrs.frozen
class Subscription:
    """FilterAPI.buildSubscriptionData: `*` (every tag) or a set of tags."""

    sub_string: str
    tags: frozenset[str] = frozenset()
    codes: frozenset[int] | None = None  # None: every message
    sub_version: int = 0
    expression_type: str = "TAG"

    @property
    def is_all(self) -> bool:
        return self.codes is None


def parse_subscription(expression: str | None, sub_version: int = 0,
                       expression_type: str | None = "TAG") -> Subscription:
    """`TagA || TagB` -> tags {TagA, TagB} and their String.hashCode codes;
    null, empty or `*` -> every message.  Raises SubscriptionError for
    expression types other than TAG (SQL92)."""
    etype = (expression_type or "TAG").strip().upper() or "TAG"
    if etype != "TAG":
        raise SubscriptionError(ResponseCode.NO_PERMISSION,
                        f"The broker does not support consumer to filter message by {etype}")
    text = (expression or "").strip()
    if not text or text == SUB_ALL:
        return Subscription(SUB_ALL, sub_version=sub_version)
    # Java keeps every non-empty trimmed tag; `*` is special only as the
    # whole expression, and an expression of separators alone matches nothing.
    tags = [t for t in (t.strip() for t in text.split("||")) if t]
    return Subscription(text, frozenset(tags), frozenset(java_hash_str(t) for t in tags), sub_version)
