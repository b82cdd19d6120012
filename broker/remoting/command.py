# Owns RemotingCommand, the one value every remoting frame carries (Java's
# RemotingCommand): header fields, extFields and body, plus the helpers to
# build requests and the matching responses.  Encoding lives in codec.py.
#
# extFields are text on the wire but stock clients send JSON numbers and
# booleans too (client-compat #1), and handlers like to pass ints; the
# converter turns every value into the text Java's toString() would give
# ("true", not "True") and drops None, as Java omits null header fields.
# json.dumps of a nested value recurses: values from outside bytes reach it
# only through the decoder, which refuses nesting past its MAX_VALUE_DEPTH
# first (codec.py).
import enum
import json
from collections.abc import Mapping

import attrs

from broker.remoting.codes import (
    CURRENT_VERSION,
    RPC_ONEWAY,
    RPC_TYPE_RESPONSE,
    LanguageCode,
    ResponseCode,
    SerializeType,
)


def java_text(value: object) -> str:
    """A header value as the text Java's toString()/fastjson gives."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    return str(value)


def coerce_fields(fields: Mapping[str, object] | None) -> dict[str, str]:
    if not fields:
        return {}
    # Text values (all of a decoded header, most of a handler's) skip the call: every command pays this.
    return {str(k): v if type(v) is str else java_text(v) for k, v in fields.items() if v is not None}


def _language(value: object) -> LanguageCode:
    if isinstance(value, LanguageCode):
        return value
    if isinstance(value, str):
        return LanguageCode[value]
    return LanguageCode(value)


def _body(value: object) -> bytes:
    return b"" if value is None else bytes(value)


_new = object.__new__
_FIELDS = ("code", "language", "version", "opaque", "flag", "remark", "ext_fields", "body", "serialize_type")


class OneRequest:
    """An item of a read that is one request (a RemotingCommand, or a
    codec.RawSend the native scanner parsed).  codec.SendRun, the other kind
    of item, holds many; the connection, the guard and the pacer take items
    through these members alone, whatever their kind."""

    __slots__ = ()
    count = 1  # requests in the item

    def one_by_one(self) -> tuple:
        """The item's requests, each served on its own."""
        return (self,)

    def answer_all(self, code: int, remark: str | None) -> "RemotingCommand":
        """The item's answer when every request in it is refused alike."""
        return self.make_response(code, remark)

    def each_answer(self, answer) -> tuple:
        """(request, its answer) pairs of the item's answer."""
        return ((self, answer),)

    def cut(self, refusals: list) -> list:
        """The item cut where `refusals` [(position, answer)] say: pieces
        (piece, None) kept and (request, answer) refused, in order."""
        return [(self, refusals[0][1])] if refusals else [(self, None)]


@attrs.frozen
class RemotingCommand(OneRequest):
    code: int
    language: LanguageCode = attrs.field(default=LanguageCode.JAVA, converter=_language)
    version: int = CURRENT_VERSION
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = attrs.field(factory=dict, converter=coerce_fields)
    # Bodies can be megabytes: keep them out of reprs and logs.
    body: bytes = attrs.field(default=b"", converter=_body,
                              repr=lambda b: f"<{len(b)} bytes>")
    serialize_type: SerializeType = attrs.field(default=SerializeType.JSON, converter=SerializeType)

    @classmethod
    def trusted(cls, code: int, language: LanguageCode, version: int, opaque: int, flag: int,
                remark: str | None, ext_fields: dict[str, str], body: bytes,
                serialize_type: SerializeType) -> "RemotingCommand":
        """Every field already in its converted form (an int code, a
        LanguageCode, a dict of str to str with no None, bytes, a
        SerializeType): the converters are skipped.  Every frame goes through
        here twice (decoded request, built response), and the converters
        (coerce_fields above all) cost more than the rest of the object."""
        self = _new(cls)
        s = _SLOT_SETTERS  # the slots' own setters, unrolled: a third of object.__setattr__'s cost
        s[0](self, code)
        s[1](self, language)
        s[2](self, version)
        s[3](self, opaque)
        s[4](self, flag)
        s[5](self, remark)
        s[6](self, ext_fields)
        s[7](self, body)
        s[8](self, serialize_type)
        return self

    @property
    def is_response(self) -> bool:
        return bool(self.flag & RPC_TYPE_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & RPC_ONEWAY)

    @classmethod
    def create_request(cls, code: int, ext_fields: Mapping[str, object] | None = None,
                       body: bytes = b"", **kw) -> "RemotingCommand":
        """A request; the opaque is assigned when it is sent."""
        return cls(int(code), ext_fields=ext_fields, body=body, **kw)

    def make_response(self, code: int = ResponseCode.SUCCESS, remark: str | None = None,
                      ext_fields: Mapping[str, object] | None = None,
                      body: bytes = b"") -> "RemotingCommand":
        """The response to this request: same opaque, response flag, and
        the serialization the request used (client-compat #2)."""
        return RemotingCommand.trusted(int(code), LanguageCode.JAVA, CURRENT_VERSION, self.opaque,
                                       RPC_TYPE_RESPONSE, remark, coerce_fields(ext_fields), _body(body),
                                       self.serialize_type)

    def as_request(self, opaque: int, oneway: bool = False) -> "RemotingCommand":
        flag = self.flag & ~(RPC_TYPE_RESPONSE | RPC_ONEWAY)
        # Every field of self is converted already: no converters again (every request pays this).
        return RemotingCommand.trusted(self.code, self.language, self.version, opaque,
                                       flag | (RPC_ONEWAY if oneway else 0), self.remark, self.ext_fields,
                                       self.body, self.serialize_type)

    def as_response_to(self, request: "RemotingCommand") -> "RemotingCommand":
        """This command fixed up to answer `request` (whatever a handler
        built, the reply must echo the opaque and use the request's
        serialization)."""
        flag = (self.flag | RPC_TYPE_RESPONSE) & ~RPC_ONEWAY
        if (self.opaque, self.flag, self.serialize_type) == (request.opaque, flag, request.serialize_type):
            return self
        return attrs.evolve(self, opaque=request.opaque, flag=flag,
                            serialize_type=request.serialize_type)


# RemotingCommand is slotted (attrs.frozen): each field is a member
# descriptor whose __set__ writes the slot, bypassing the frozen __setattr__.
_SLOT_SETTERS = tuple(RemotingCommand.__dict__[name].__set__ for name in _FIELDS)
