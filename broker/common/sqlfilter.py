# Owns RocketMQ's SQL92 property filter (MessageSelector.bySql, the `filter` module's SelectorParser
# subset): parsing an expression into a predicate over a message's properties, and nothing else.
# Pure: the broker evaluates it at pull time (pull.py), the client parses it before subscribing so a
# typo fails at the call site.
#
#   literals     'text' ('' escapes a quote), 12, -3, 1.5, 2e3, TRUE, FALSE, NULL
#   names        a property name: [A-Za-z_$][A-Za-z0-9_$.]*  (TAGS, KEYS... too)
#   comparison   = <> != > >= < <=
#   predicates   x [NOT] BETWEEN lo AND hi    x [NOT] IN ('a', 'b')
#                x IS [NOT] NULL    x [NOT] CONTAINS / STARTSWITH / ENDSWITH 's'
#   logic        AND, OR, NOT, parentheses; keywords in any case
#
# Values travel as text.  A comparison with a numeric literal reads the property as a number (Java's
# Long/Double parse); text that is not a number makes it unknown, not an error (one odd message must
# not fail a pull).  Two texts compare as text for = and <>; the ordering operators need numbers
# (RocketMQ refuses to order strings), so a string literal there is a parse error.  Three-valued
# logic, as SQL: a missing property makes a comparison unknown (None); NOT unknown is unknown; AND/OR
# follow Kleene's tables; a message matches only when the whole expression is TRUE.
#
# Limits (outside text): longer than MAX_SQL_LENGTH (16384) characters, or parentheses and NOTs
# nested deeper than MAX_SQL_DEPTH (32), is refused with SqlFilterError like any expression that
# does not parse (the broker answers SUBSCRIPTION_PARSE_FAILED).  AND and OR chains are flat, so
# neither parsing nor evaluation recurses deeper than the nesting limit, however many terms there
# are.  A compiled expression takes about 80 bytes of memory per character of text.
import re
from collections.abc import Callable

import attrs

Props = dict[str, str]
Pred = Callable[[Props], object]  # -> True, False or None (unknown)

MAX_SQL_LENGTH = 16384
MAX_SQL_DEPTH = 32

_KEYWORDS = {"AND", "OR", "NOT", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE", "CONTAINS", "STARTSWITH",
             "ENDSWITH"}
_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<str>'(?:[^']|'')*')
  | (?P<num>[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?)
  | (?P<name>[A-Za-z_$][A-Za-z0-9_$.]*)
  | (?P<op><>|!=|>=|<=|=|>|<|\(|\)|,|-|\+)
""", re.VERBOSE)


@attrs.define(str=False)
class SqlFilterError(ValueError):
    """An expression that does not parse; `position` is where (0-based)."""

    expression: str
    position: int
    reason: str

    def __str__(self) -> str:
        shown = repr(self.expression)
        if len(shown) > 200:  # (outside text: bounded in the remark, however it escapes)
            shown = f"{shown[:200]}... ({len(self.expression)} characters)"
        return f"{self.reason} at position {self.position} of {shown}"


@attrs.frozen
class _Tok:
    kind: str  # str, num, name, kw, op, end
    value: object
    pos: int


def _tokens(text: str) -> list[_Tok]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise SqlFilterError(text, pos, f"unexpected character {text[pos]!r}")
        kind = m.lastgroup
        raw = m.group()
        if kind == "str":
            out.append(_Tok("str", raw[1:-1].replace("''", "'"), pos))
        elif kind == "num":
            is_float = any(c in raw for c in ".eE")
            try:
                out.append(_Tok("num", float(raw) if is_float else int(raw), pos))
            except ValueError:  # more digits than int() reads (sys.get_int_max_str_digits)
                raise SqlFilterError(text, pos, f"number of {len(raw)} characters") from None
        elif kind == "name":
            upper = raw.upper()
            out.append(_Tok("kw", upper, pos) if upper in _KEYWORDS else _Tok("name", raw, pos))
        elif kind == "op":
            out.append(_Tok("op", "<>" if raw == "!=" else raw, pos))
        pos = m.end()
    out.append(_Tok("end", None, len(text)))
    return out


def _number(value) -> int | float | None:
    """A property's text as Java's Long.valueOf, else Double.valueOf; None if neither."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if not isinstance(value, str):
        return None
    text = value.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        out = float(text)
    except ValueError:
        return None
    return None if text.lower() in ("nan", "inf", "-inf", "+inf", "infinity", "-infinity") else out


def _cmp_values(lv, rv):
    """(lv, rv) made comparable, or None (unknown): numbers if either side is
    a number, else both as they are (text or booleans)."""
    if lv is None or rv is None:
        return None
    numeric = any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (lv, rv))
    if numeric:
        ln, rn = _number(lv), _number(rv)
        return None if ln is None or rn is None else (ln, rn)
    if isinstance(lv, bool) or isinstance(rv, bool):
        if isinstance(lv, str):
            lv = {"true": True, "false": False}.get(lv.lower())
        if isinstance(rv, str):
            rv = {"true": True, "false": False}.get(rv.lower())
        return None if lv is None or rv is None else (lv, rv)
    return lv, rv


_ORDER = {">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b}


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokens(text)
        self.i = 0
        self.depth = 0  # parentheses and NOTs open around the current token

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def error(self, reason: str, tok: _Tok | None = None) -> SqlFilterError:
        return SqlFilterError(self.text, (tok or self.tok).pos, reason)

    def take(self, kind: str, value=None) -> _Tok | None:
        t = self.tok
        if t.kind == kind and (value is None or t.value == value):
            self.i += 1
            return t
        return None

    def need(self, kind: str, value=None) -> _Tok:
        t = self.take(kind, value)
        if t is None:
            want = value if value is not None else kind
            got = "the end" if self.tok.kind == "end" else repr(self.tok.value)
            raise self.error(f"expected {want}, found {got}")
        return t

    # --- grammar ------------------------------------------------------------------

    def parse(self) -> Pred:
        if self.tok.kind == "end":
            raise self.error("empty expression")
        pred = self.or_expr()
        if self.tok.kind != "end":
            raise self.error(f"unexpected {self.tok.value!r}")
        return pred

    def deeper(self, tok: _Tok) -> None:
        self.depth += 1
        if self.depth > MAX_SQL_DEPTH:
            raise self.error(f"parentheses and NOTs nest deeper than {MAX_SQL_DEPTH}", tok)

    def or_expr(self) -> Pred:
        terms = [self.and_expr()]
        while self.take("kw", "OR"):
            terms.append(self.and_expr())
        return terms[0] if len(terms) == 1 else _any_of(terms)

    def and_expr(self) -> Pred:
        terms = [self.not_expr()]
        while self.take("kw", "AND"):
            terms.append(self.not_expr())
        return terms[0] if len(terms) == 1 else _all_of(terms)

    def not_expr(self) -> Pred:
        t = self.tok
        if self.take("kw", "NOT"):
            self.deeper(t)
            inner = self.not_expr()
            self.depth -= 1
            return lambda p: None if (v := inner(p)) is None else not v
        return self.predicate()

    def predicate(self) -> Pred:
        start = self.tok
        if self.take("op", "("):
            self.deeper(start)
            inner = self.or_expr()
            self.need("op", ")")
            self.depth -= 1
            return inner
        left, left_kind = self.value()
        t = self.tok
        if t.kind == "op" and t.value in ("=", "<>", ">", ">=", "<", "<="):
            self.i += 1
            right, right_kind = self.value()
            return self.comparison(t, left, left_kind, right, right_kind)
        negate = bool(self.take("kw", "NOT"))
        if self.take("kw", "BETWEEN"):
            lo, lo_kind = self.value()
            self.need("kw", "AND")
            hi, hi_kind = self.value()
            ge = self.comparison(t, left, left_kind, lo, lo_kind, ">=")
            le = self.comparison(t, left, left_kind, hi, hi_kind, "<=")
            return _not(_all_of([ge, le])) if negate else _all_of([ge, le])
        if self.take("kw", "IN"):
            if left_kind != "name":
                raise self.error("IN needs a property on its left", start)
            self.need("op", "(")
            items = [self.need("str").value]
            while self.take("op", ","):
                items.append(self.need("str").value)
            self.need("op", ")")
            found = frozenset(items)
            pred = (lambda p: None if (v := left(p)) is None else v in found)
            return _not(pred) if negate else pred
        for word, test in (("CONTAINS", str.__contains__), ("STARTSWITH", str.startswith),
                           ("ENDSWITH", str.endswith)):
            if self.take("kw", word):
                needle = self.need("str").value
                pred = (lambda p, test=test, needle=needle:
                        None if not isinstance(v := left(p), str) else test(v, needle))
                return _not(pred) if negate else pred
        if negate:
            raise self.error("expected BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH after NOT")
        if self.take("kw", "IS"):
            is_not = bool(self.take("kw", "NOT"))
            self.need("kw", "NULL")
            return (lambda p: left(p) is not None) if is_not else (lambda p: left(p) is None)
        if left_kind == "bool":
            return left
        raise self.error("expected a comparison, BETWEEN, IN or IS [NOT] NULL", t)

    def comparison(self, op_tok: _Tok, left, left_kind, right, right_kind, op: str | None = None) -> Pred:
        op = op or op_tok.value
        if "null" in (left_kind, right_kind):
            raise self.error("NULL cannot be compared; use IS [NOT] NULL", op_tok)
        if op in _ORDER:
            for kind in (left_kind, right_kind):
                if kind in ("str", "bool"):
                    raise self.error(f"only numbers can be compared with {op}", op_tok)
            order = _ORDER[op]

            def ordered(p):
                pair = _cmp_values(left(p), right(p))
                if pair is None:
                    return None
                a, b = pair
                if isinstance(a, str) or isinstance(b, str):  # two texts: numbers or unknown
                    a, b = _number(a), _number(b)
                    if a is None or b is None:
                        return None
                return order(a, b)
            return ordered

        def equal(p):
            pair = _cmp_values(left(p), right(p))
            return None if pair is None else pair[0] == pair[1]
        return equal if op == "=" else _not(equal)

    def value(self) -> tuple[Callable[[Props], object], str]:
        t = self.tok
        if self.take("name"):
            name = t.value
            return (lambda p: p.get(name)), "name"
        if self.take("str"):
            v = t.value
            return (lambda p: v), "str"
        sign = -1 if self.take("op", "-") else (1 if self.take("op", "+") else 0)
        if self.tok.kind == "num":
            v = self.tok.value * (sign or 1)
            self.i += 1
            return (lambda p: v), "num"
        if sign:
            raise self.error("expected a number after the sign")
        if self.take("kw", "TRUE"):
            return (lambda p: True), "bool"
        if self.take("kw", "FALSE"):
            return (lambda p: False), "bool"
        if self.take("kw", "NULL"):
            return (lambda p: None), "null"
        got = "the end" if t.kind == "end" else repr(t.value)
        raise self.error(f"expected a property, literal or '(', found {got}")


def _kleene(preds: list[Pred], decisive: bool) -> Pred:
    """a AND b AND ... (decisive False) or a OR b OR ... (decisive True) in
    one step, Kleene's way: the decisive value wins, then unknown."""
    preds = tuple(preds)

    def combined(p):
        unknown = False
        for pred in preds:
            x = pred(p)
            if x is decisive:
                return decisive
            if x is None:
                unknown = True
        return None if unknown else not decisive
    return combined


def _all_of(preds: list[Pred]) -> Pred:
    return _kleene(preds, False)


def _any_of(preds: list[Pred]) -> Pred:
    return _kleene(preds, True)


def _not(a: Pred) -> Pred:
    return lambda p: None if (v := a(p)) is None else not v


@attrs.frozen(eq=False)
class SqlFilter:
    """A compiled expression: `matches(properties)` is True only when the
    expression is TRUE for them."""

    expression: str
    _pred: Pred = attrs.field(repr=False)

    def evaluate(self, properties: Props):
        """True, False or None (unknown)."""
        return self._pred(properties)

    def matches(self, properties: Props) -> bool:
        return self._pred(properties) is True


def compile_sql(expression: str) -> SqlFilter:
    """Parse `expression`; SqlFilterError if it is not valid SQL92 filter
    text or exceeds the limits above."""
    if not isinstance(expression, str):
        raise SqlFilterError(str(expression)[:200], 0, "the expression must be text")
    if len(expression) > MAX_SQL_LENGTH:
        raise SqlFilterError(expression, MAX_SQL_LENGTH,
                             f"expression of {len(expression)} characters exceeds {MAX_SQL_LENGTH}")
    return SqlFilter(expression, _Parser(expression).parse())
