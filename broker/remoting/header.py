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
#
# JSON bodies (decode_json) are outside bytes too.  Limits, each refused
# with RequestError(SYSTEM_ERROR) naming the body, never another error:
#   size   MAX_JSON_BODY (1 MiB) before parsing, or the body's own bound in
#          _BODY_LIMITS: those that grow with the topics of a cluster
#          (RegisterBrokerBody, TopicList, ClusterInfo) are bounded only by
#          the frame (16 MiB).  A stock client's HeartbeatData or lock body
#          is a few KiB.
#   depth  MAX_JSON_DEPTH (32) levels of arrays/objects, checked after
#          parsing without recursion (broker/remoting/jsonbound.py); json's
#          own recursion past the interpreter's limit is a refusal too.
#          RocketMQ's bodies nest 5 deep at most.
from __future__ import annotations  # the methods named str/int/bool shadow builtins in annotations

import json
import re
from collections.abc import Mapping

from broker.remoting.codes import ResponseCode
from broker.remoting.errors import RequestError
from broker.remoting.jsonbound import nests_deeper_than

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
            raise _bad(f"the custom field <{name}> is not a valid {java}: {value[:64]!r}")
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


MAX_JSON_BODY = 1 << 20
MAX_JSON_DEPTH = 32
_FRAME_BOUND = 16 << 20
_BODY_LIMITS = {"RegisterBrokerBody": _FRAME_BOUND, "TopicList": _FRAME_BOUND, "ClusterInfo": _FRAME_BOUND}


def decode_json(body: bytes, what: str, max_size: int | None = None) -> object:
    """A JSON body (`what` names its Java class); RequestError(SYSTEM_ERROR)
    naming `what` if it is not JSON or exceeds the limits above (max_size:
    the size bound, by default the body's)."""
    limit = _BODY_LIMITS.get(what, MAX_JSON_BODY) if max_size is None else max_size
    if len(body) > limit:
        raise _bad(f"{what} of {len(body)} bytes exceeds the maximum of {limit}")
    try:
        text = bytes(body).decode("utf-8")
        obj = json.loads(text)
    except RecursionError:
        raise _bad(f"{what} nests arrays/objects deeper than {MAX_JSON_DEPTH}") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise _bad(f"{what} is not valid JSON: {str(e)[:200]}") from None
    # Fewer brackets than the bound cannot nest past it: most bodies skip the walk.
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and nests_deeper_than(obj, MAX_JSON_DEPTH):
        raise _bad(f"{what} nests arrays/objects deeper than {MAX_JSON_DEPTH}")
    return obj
