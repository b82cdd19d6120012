# Owns what request handlers use to read a command: typed access to
# extFields (Java's decodeCommandCustomHeader) and the JSON bodies of
# RemotingSerializable (fastjson-like output: sorted keys, compact).
#
# Values parse the way Java parses a custom header field: Integer.parseInt /
# Long.parseLong (range-checked), Boolean.parseBoolean ("true" in any case is
# true, anything else false).  A missing required field or a value that does
# not parse raises RequestError(SYSTEM_ERROR) with Java's wording, which the
# server turns into the response.  Fields a handler does not ask for
# (AccessKey, OnsChannel, Signature from C++ clients, client-compat #6, or
# the 5.x RPC fields ns/nsd/bname/oway/lo) are simply never read.
from __future__ import annotations  # the methods named str/int/bool shadow builtins in annotations

import json
import re
from collections.abc import Mapping

from broker.remoting.codes import ResponseCode
from broker.remoting.errors import RequestError

_REQUIRED = object()
_INT = re.compile(r"[+-]?[0-9]+")
_INT_RANGE = (-(1 << 31), (1 << 31) - 1)
_LONG_RANGE = (-(1 << 63), (1 << 63) - 1)


def _bad(remark: str) -> RequestError:
    return RequestError(ResponseCode.SYSTEM_ERROR, remark)


class HeaderReader:
    """Typed, Java-compatible access to a command's extFields."""

    def __init__(self, fields: Mapping[str, str]) -> None:
        self.fields = fields

    def _raw(self, name: str, default: object) -> str | object:
        value = self.fields.get(name)
        if value is None:
            if default is _REQUIRED:
                raise _bad(f"the custom field <{name}> is null")
            return default
        return value

    def str(self, name: str, default: object = _REQUIRED):
        return self._raw(name, default)

    def _integer(self, name: str, default: object, bounds: tuple[int, int], java: str):
        value = self._raw(name, default)
        if not isinstance(value, str):
            return value
        # Plain ASCII digits in range, the usual case, without the regex.
        if value.isdigit() and value.isascii():
            number = int(value)
            if number <= bounds[1]:
                return number
        if not _INT.fullmatch(value) or not bounds[0] <= int(value) <= bounds[1]:
            raise _bad(f"the custom field <{name}> is not a valid {java}: {value!r}")
        return int(value)

    def int(self, name: str, default: object = _REQUIRED):
        return self._integer(name, default, _INT_RANGE, "int")

    def long(self, name: str, default: object = _REQUIRED):
        return self._integer(name, default, _LONG_RANGE, "long")

    def bool(self, name: str, default: object = _REQUIRED):
        value = self._raw(name, default)
        return value.lower() == "true" if isinstance(value, str) else value


# One shared encoder: json.dumps() with these arguments would build one per call.
_JSON_BODY = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def encode_json(obj: object) -> bytes:
    """A body as RocketMQ's RemotingSerializable writes it, but standard
    JSON: map keys are always quoted (client-compat #3)."""
    return _JSON_BODY.encode(obj).encode("utf-8")


def decode_json(body: bytes, what: str) -> object:
    """A JSON body; RequestError(SYSTEM_ERROR) naming `what` if it is not."""
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _bad(f"{what} is not valid JSON: {e}") from None
