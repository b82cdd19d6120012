# Owns the client's per-send byte path, kept cheap because a producer pays
# it for every message: SendRequest (a SEND_MESSAGE_V2 or SEND_BATCH_MESSAGE
# request whose JSON header is assembled from pre-encoded pieces instead of
# a dict handed to orjson per attempt).  The read side's counterpart is
# broker/remoting/responses.py.
#
# Rules.  The bytes are the codec's (broker/remoting/codec.py): a
# SendRequest's frame(opaque) is byte-identical to encode_request() of its
# command() -- tests/broker/client/test_wire.py holds it to that over a
# corpus.  Anything off the common path goes to the codec itself: a header
# that orjson cannot encode (a lone surrogate) is encoded by
# encode_request, which raises as it always did.  An rpc_hook (ACL signing)
# gets command(), a plain RemotingCommand, as before.
import struct

import orjson

from broker.remoting.codec import DEFAULT_MAX_FRAME_SIZE, MAX_HEADER_LEN, encode_request
from broker.remoting.codes import CURRENT_VERSION, LanguageCode, RequestCode, SerializeType
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import LocalProtocolError

_PREFIX = struct.Struct(">ii")
_pack_prefix = _PREFIX.pack
_dumps = orjson.dumps
_trusted = RemotingCommand.trusted
_JSON = SerializeType.JSON
_PYTHON = LanguageCode.PYTHON

# After the extFields, in the key order orjson's OPT_SORT_KEYS writes:
# flag (0: a request, not oneway), language, then the opaque; what follows
# the opaque is the same for every request.
_BEFORE_OPAQUE = b'},"flag":0,"language":"PYTHON","opaque":'
_AFTER_OPAQUE = b',"serializeTypeCurrentRPC":"JSON","version":%d}' % CURRENT_VERSION
_AUTO_CREATE_TOPIC_KEY = "TBW102"
_PRE: dict[tuple, bytes] = {}  # (group, topic, queue nums) -> the header's first fields, encoded


class SendRequest:
    """A producer's send request (SendMessageRequestHeaderV2's short field
    names, spec §1.9) for one message or one batch.  Built once per send;
    for_queue() addresses it to a queue before each attempt (an attempt is
    encoded, or handed to the rpc_hook, before the next one readdresses
    it), frame(opaque) encodes it.  The transport takes it wherever it takes
    a RemotingCommand; command() is that command."""

    __slots__ = ("code", "body", "_values", "_pre", "_mid", "_head", "_broker")

    def __init__(self, code: int, group: str, topic: str, queue_nums: int, sysflag: int, born_ms: int, flag: int,
                 props: str, batch: bool, body: bytes) -> None:
        self.code = code
        self.body = body
        self._values = (group, topic, queue_nums, sysflag, born_ms, flag, props, batch)
        self._head: bytes | None = None
        self._broker: tuple[int, str] | None = None
        try:
            # a b c d | e | f g h i j k m | n, as sorted keys come out.
            pre = _PRE.get((group, topic, queue_nums))
            if pre is None:
                if len(_PRE) > 1024:
                    _PRE.clear()
                pre = _PRE[group, topic, queue_nums] = b'"a":%b,"b":%b,"c":"TBW102","d":%b,' % (
                    _dumps(group), _dumps(topic), _dumps(str(queue_nums)))
            self._pre = pre
            self._mid = b'"f":%b,"g":"%d","h":%b,"i":%b,"j":"0","k":"false","m":"%b",' % (
                b'"%d"' % sysflag if type(sysflag) is int else _dumps(str(sysflag)), born_ms,
                b'"%d"' % flag if type(flag) is int else _dumps(str(flag)), _dumps(props),
                b"true" if batch else b"false")
        except TypeError:  # a lone surrogate: encode_request says so when the attempt is encoded
            self._pre = self._mid = None

    def for_queue(self, queue_id: int, broker_name: str, code: int) -> "SendRequest":
        self.code = code
        self._broker = (queue_id, broker_name)
        if self._pre is not None:
            try:
                self._head = b'{"code":%d,"extFields":{%b"e":"%d",%b"n":%b' % (
                    code, self._pre, queue_id, self._mid, _dumps(broker_name))
            except TypeError:
                self._head = None
        return self

    def fields(self) -> dict[str, str]:
        group, topic, d, f, g, h, i, batch = self._values
        fields = {"a": group, "b": topic, "c": _AUTO_CREATE_TOPIC_KEY, "d": str(d), "e": "-1", "f": str(f),
                  "g": str(g), "h": str(h), "i": i, "j": "0", "k": "false", "m": "true" if batch else "false"}
        if self._broker is not None:
            fields["e"], fields["n"] = str(self._broker[0]), self._broker[1]
        return fields

    def command(self) -> RemotingCommand:
        """The same request as a RemotingCommand (what an rpc_hook rewrites)."""
        return _trusted(int(self.code), _PYTHON, CURRENT_VERSION, 0, 0, None, self.fields(), self.body, _JSON)

    def frame(self, opaque: int, oneway: bool = False, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
        """encode_request(self.command(), opaque, oneway, max_frame_size)."""
        head = self._head
        if head is None or oneway or not 0 <= opaque <= 0x7FFFFFFF:
            return encode_request(self.command(), opaque, oneway, max_frame_size)
        op = b"%d" % opaque
        header_len = len(head) + len(_BEFORE_OPAQUE) + len(op) + len(_AFTER_OPAQUE)
        total = 8 + header_len + len(self.body)
        if header_len > MAX_HEADER_LEN or total > max_frame_size:
            return encode_request(self.command(), opaque, oneway, max_frame_size)  # (it raises, naming the limit)
        return b"".join((_pack_prefix(total - 4, header_len), head, _BEFORE_OPAQUE, op, _AFTER_OPAQUE, self.body))

    def __repr__(self) -> str:
        return f"SendRequest({RequestCode(self.code).name}, {self._values[1]!r}, queue={self._broker})"


__all__ = ["LocalProtocolError", "SendRequest"]
