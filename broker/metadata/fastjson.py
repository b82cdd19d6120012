# Owns reading and writing the JSON of RocketMQ's config files (spec §8.7).
#
# RocketMQ writes topics.json, subscriptionGroup.json and consumerOffset.json
# with fastjson, whose default feature set leaves non-string map keys
# unquoted:  {"offsetTable":{"t@g":{0:123,1:456}}}.  That is not JSON, so
# `loads` first tries the standard parser (fast, and what ledgermq itself
# writes) and falls back to a small recursive-descent parser that also takes
# bare keys (integers, and identifier-like words).  Bare keys come back as
# strings, exactly as their quoted form would: callers convert map keys the
# same way whichever form the file used.
#
# `dumps` writes standard JSON (every key quoted, sorted as fastjson's
# default SortField does, tab-indented like RocketMQ's pretty format), which
# fastjson reads back without special features.
import json
import re
from json.decoder import scanstring

__all__ = ["FastjsonError", "loads", "dumps"]


class FastjsonError(ValueError):
    """Text that neither standard JSON nor fastjson's dialect accepts."""

    def __init__(self, reason: str, pos: int):
        super().__init__(f"{reason} at character {pos}")
        self.reason = reason
        self.pos = pos


_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_BARE_KEY = re.compile(r"-?\d+|[A-Za-z_$][A-Za-z0-9_$]*")
_CONSTANTS = {"true": True, "false": False, "null": None}


def loads(text: str | bytes):
    """Parse standard JSON or fastjson's dialect (unquoted map keys)."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    parser = _Parser(text)
    value = parser.value()
    parser.skip_ws()
    if parser.pos != len(text):
        raise FastjsonError("trailing characters", parser.pos)
    return value


def dumps(obj) -> str:
    """Standard JSON with quoted, sorted keys (int keys become "0")."""
    return json.dumps(obj, sort_keys=True, indent="\t", ensure_ascii=False, allow_nan=False)


class _Parser:
    __slots__ = ("text", "pos")

    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def skip_ws(self) -> None:
        self.pos = _WS.match(self.text, self.pos).end()

    def _peek(self) -> str:
        self.skip_ws()
        if self.pos >= len(self.text):
            raise FastjsonError("unexpected end of text", self.pos)
        return self.text[self.pos]

    def _expect(self, ch: str) -> None:
        if self._peek() != ch:
            raise FastjsonError(f"expected {ch!r}", self.pos)
        self.pos += 1

    def value(self):
        ch = self._peek()
        if ch == "{":
            return self._object()
        if ch == "[":
            return self._array()
        if ch == '"':
            return self._string()
        m = _NUMBER.match(self.text, self.pos)
        if m:
            self.pos = m.end()
            s = m.group()
            return float(s) if any(c in s for c in ".eE") else int(s)
        for word, val in _CONSTANTS.items():
            if self.text.startswith(word, self.pos):
                self.pos += len(word)
                return val
        raise FastjsonError("expected a value", self.pos)

    def _string(self) -> str:
        try:
            s, self.pos = scanstring(self.text, self.pos + 1, True)
        except json.JSONDecodeError as exc:
            raise FastjsonError(exc.msg, exc.pos) from None
        return s

    def _key(self) -> str:
        if self._peek() == '"':
            return self._string()
        m = _BARE_KEY.match(self.text, self.pos)
        if not m:
            raise FastjsonError("expected a map key", self.pos)
        self.pos = m.end()
        return m.group()

    def _object(self) -> dict:
        self.pos += 1
        out: dict = {}
        if self._peek() == "}":
            self.pos += 1
            return out
        while True:
            key = self._key()
            self._expect(":")
            out[key] = self.value()
            ch = self._peek()
            self.pos += 1
            if ch == "}":
                return out
            if ch != ",":
                raise FastjsonError("expected ',' or '}'", self.pos - 1)

    def _array(self) -> list:
        self.pos += 1
        out: list = []
        if self._peek() == "]":
            self.pos += 1
            return out
        while True:
            out.append(self.value())
            ch = self._peek()
            self.pos += 1
            if ch == "]":
                return out
            if ch != ",":
                raise FastjsonError("expected ',' or ']'", self.pos - 1)
