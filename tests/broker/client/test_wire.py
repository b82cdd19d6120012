# Oracles for the client's cheap wire forms (broker/client/wire.py) against
# the codec they shortcut: a SendRequest's frame is byte-identical to
# encode_request() of the RemotingCommand the general path builds, over a
# corpus of messages (properties, tags, keys, unicode, escapes, batches,
# compressed bodies, every queue); and ResponseDecoder hands back the same
# commands and the same error, after the same good frames, as CommandDecoder
# over the same byte stream cut at random places, good and bad.  No IO.
import random
import struct
import zlib

import pytest
import trio

from broker.client import Message
from broker.client.model import MessageQueue
from broker.client.producer import Producer
from broker.client.wire import SendRequest
from broker.remoting.codec import (
    CLOSED,
    NEED_DATA,
    CommandDecoder,
    encode_command,
    encode_request,
    encode_response,
)
from broker.remoting.codes import CURRENT_VERSION, LanguageCode, RequestCode, SerializeType
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import LocalProtocolError, RemoteProtocolError
from broker.remoting.responses import ResponseDecoder
from consumequeue import record as M

UNICODE = ["plain", "ünïcödé", "汉字", "emoji \U0001F600", 'quote " and \\ backslash', "tab\tnew\nline",
           "\x00\x1f control", "\u2028\u2029 separators", "</script>"]


def general_command(code: int, group: str, topic: str, queue_nums: int, sysflag: int, born: int, flag: int,
                    props: str, batch: bool, body: bytes, mq: MessageQueue) -> RemotingCommand:
    """The request as the producer built it before wire.py: a dict of the
    V2 header's fields, through RemotingCommand's converters."""
    return RemotingCommand.create_request(code, {
        "a": group, "b": topic, "c": "TBW102", "d": str(queue_nums), "e": str(mq.queue_id), "f": str(sysflag),
        "g": str(born), "h": str(flag), "i": props, "j": "0", "k": "false", "m": "true" if batch else "false",
        "n": mq.broker_name}, body, language=LanguageCode.PYTHON)


def corpus():
    rnd = random.Random(28)
    for i in range(300):
        props = {}
        for _ in range(rnd.randrange(4)):
            props[rnd.choice(UNICODE).replace("\x00", "n") + str(rnd.randrange(9))] = rnd.choice(UNICODE)
        msg = Message(rnd.choice(["T", "BenchTopic", "%RETRY%g", "a-b_c|d"]), rnd.choice([b"x", b"\x00\xff" * 700]),
                      tags=rnd.choice([None, "A", "tag ünï", "*"]),
                      keys=rnd.choice([(), ("k1",), ("k 1", "汉字")]), properties=props, flag=rnd.choice([0, 1, -7]),
                      wait_store_msg_ok=rnd.random() < 0.8, delay_level=rnd.choice([0, 0, 3]))
        group = rnd.choice(["pg", "group ünï", 'g"\\'])
        mq = MessageQueue(msg.topic, rnd.choice(["broker-a", "b ünï", 'b"\\']), rnd.randrange(-1, 64))
        yield i, msg, group, mq


def test_send_frames_are_byte_identical_to_the_general_encoding():
    n = 0
    for i, msg, group, mq in corpus():
        props = M.properties_to_string(msg.wire_properties(f"UNIQ{i:028X}"))
        batch = i % 5 == 0
        code = int(RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2)
        sysflag = M.COMPRESSED_FLAG if i % 3 == 0 else 0
        body = zlib.compress(msg.body) if sysflag else msg.body
        born = 1_700_000_000_000 + i
        req = SendRequest(code, group, msg.topic, 4 + i % 3, sysflag, born, msg.flag, props, batch, body)
        req.for_queue(mq.queue_id, mq.broker_name, code)
        general = general_command(code, group, msg.topic, 4 + i % 3, sysflag, born, msg.flag, props, batch, body, mq)
        assert req.command() == general
        for opaque in (0, 1, 9, 10, 12345, 2**31 - 1):
            assert req.frame(opaque) == encode_request(general, opaque), (i, opaque)
        assert req.frame(7, oneway=True) == encode_request(general, 7, True)
        n += 1
    assert n == 300


def test_a_send_request_readdressed_encodes_its_new_queue():
    req = SendRequest(int(RequestCode.SEND_MESSAGE_V2), "pg", "T", 4, 0, 1, 0, "", False, b"b")
    for mq in (MessageQueue("T", "a", 0), MessageQueue("T", "b", 3)):
        req.for_queue(mq.queue_id, mq.broker_name, int(RequestCode.SEND_MESSAGE_V2))
        general = general_command(int(RequestCode.SEND_MESSAGE_V2), "pg", "T", 4, 0, 1, 0, "", False, b"b", mq)
        assert req.frame(5) == encode_request(general, 5)


def test_unencodable_and_oversized_sends_fail_as_the_codec_does():
    surrogate = SendRequest(int(RequestCode.SEND_MESSAGE_V2), "pg", "T", 4, 0, 1, 0, "a\x01\ud800\x02", False, b"b")
    surrogate.for_queue(0, "a", int(RequestCode.SEND_MESSAGE_V2))
    with pytest.raises(LocalProtocolError) as ours:
        surrogate.frame(1)
    with pytest.raises(LocalProtocolError) as codec:
        encode_request(surrogate.command(), 1)
    assert str(ours.value) == str(codec.value)
    big = SendRequest(int(RequestCode.SEND_MESSAGE_V2), "pg", "T", 4, 0, 1, 0, "", False, b"x" * 5000)
    big.for_queue(0, "a", int(RequestCode.SEND_MESSAGE_V2))
    with pytest.raises(LocalProtocolError) as ours:
        big.frame(1, max_frame_size=4096)
    with pytest.raises(LocalProtocolError) as codec:
        encode_request(big.command(), 1, max_frame_size=4096)
    assert str(ours.value) == str(codec.value)


def test_the_producer_builds_the_general_request():
    async def main():
        p = Producer(None, None, "pg ünï", default_topic_queue_nums=8)
        for i, msg, _group, mq in corpus():
            uniq, req = p._request(msg)
            p._for_queue(req, mq, RequestCode.SEND_MESSAGE_V2)
            cmd = req.command()
            born = int(cmd.ext_fields["g"])
            props = M.properties_to_string(msg.wire_properties(uniq))
            body, sysflag = msg.body, 0
            if len(body) > p.compress_over:
                body, sysflag = zlib.compress(body, 5), M.COMPRESSED_FLAG
            general = general_command(int(RequestCode.SEND_MESSAGE_V2), "pg ünï", msg.topic, 8, sysflag, born,
                                      msg.flag, props, False, body, mq)
            assert cmd == general
            assert req.frame(i + 1) == encode_request(general, i + 1)
    trio.run(main)


# --- responses ----------------------------------------------------------------------------

class _Req:
    def __init__(self, opaque):
        self.opaque, self.serialize_type = opaque, SerializeType.JSON


def good_frames(rnd: random.Random) -> list[bytes]:
    frames = []
    for opaque in range(1, 120):
        kind = rnd.randrange(8)
        if kind < 4:  # what a broker answers a send
            frames.append(encode_response(_Req(opaque), rnd.choice([0, 0, 0, 10, 14, 17]), None, {
                "msgId": "7F00000100002A9F%016X" % opaque, "queueId": str(opaque % 4),
                "queueOffset": str(opaque * 3), "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}))
        elif kind == 4:  # a body, a remark, another language, a request the broker pushes
            frames.append(encode_command(RemotingCommand(rnd.choice([0, 40]), language=rnd.choice(["JAVA", "GO"]),
                                                         opaque=opaque, flag=rnd.choice([0, 1]),
                                                         remark=rnd.choice([None, "ünï remark"]),
                                                         ext_fields={"k": "v"},
                                                         body=bytes(rnd.randrange(256) for _ in range(300)))))
        elif kind == 5:  # ROCKETMQ serialization (stock peers may answer so)
            frames.append(encode_command(RemotingCommand(0, opaque=opaque, flag=1, ext_fields={"a": "b"},
                                                         serialize_type=SerializeType.ROCKETMQ)))
        elif kind == 6:  # numbers and booleans in extFields, an unknown language, no extFields
            header = (b'{"code":0,"extFields":{"n":5,"b":true,"s":"x"},"flag":1,"language":"RUBYISH","opaque":%d,'
                      b'"serializeTypeCurrentRPC":"JSON","version":"479"}' % opaque)
            frames.append(struct.pack(">ii", 4 + len(header), len(header)) + header)
        else:
            header = b'{"code":0,"flag":1,"opaque":%d}' % opaque
            frames.append(struct.pack(">ii", 8 + len(header), len(header)) + header + b"tail")
    return frames


BAD_ENDINGS = [
    b"",  # a clean end
    struct.pack(">ii", 2, 0),  # length too small
    struct.pack(">ii", 20, 30) + b"x" * 20,  # header longer than the frame
    struct.pack(">ii", 10, (7 << 24) | 2) + b"{}" + b"x" * 4,  # unknown serialize type
    struct.pack(">ii", 8, 4) + b"nope" + b"bodY",  # not JSON
    struct.pack(">ii", 6, 2) + b"[]",  # JSON, not an object
    struct.pack(">ii", 30, 6) + b'{"a":',  # cut short by the end of the stream
    b"\x00\x00",  # a prefix cut short
    struct.pack(">ii", 200_000, 30) + b'{"code":0,"opaque":77,"flag":1}',  # over the frame limit
]


def decode_all(decoder_kind: str, stream: bytes, cuts: list[int], max_frame: int) -> tuple[list, str | None]:
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])] + [b""]
    out: list = []
    if decoder_kind == "codec":
        dec = CommandDecoder(max_frame)
        try:
            for piece in pieces:
                dec.receive_data(piece)
                while (cmd := dec.next_command()) not in (NEED_DATA, CLOSED):
                    out.append(cmd)
                if cmd is CLOSED:
                    return out, "closed"
        except RemoteProtocolError as e:
            return out, f"{e} opaque={e.opaque}"
        return out, None
    ours = ResponseDecoder(max_frame)
    for piece in pieces:
        out += ours.feed(piece)
        if ours.error is not None:
            return out, f"{ours.error} opaque={ours.error.opaque}"
        if ours.closed:
            return out, "closed"
    return out, None


@pytest.mark.parametrize("ending", range(len(BAD_ENDINGS)))
def test_responses_decode_as_the_codec_decodes_them(ending):
    rnd = random.Random(ending)
    frames = good_frames(rnd)
    stream = b"".join(frames) + BAD_ENDINGS[ending]
    for trial in range(25):
        if trial == 0:
            cuts = []
        elif trial == 1:
            cuts = list(range(1, len(stream)))[:: max(1, len(stream) // 3000)]  # small pieces
        else:
            cuts = sorted(rnd.sample(range(1, len(stream)), rnd.randrange(1, 40)))
        expected = decode_all("codec", stream, cuts, 100_000)
        got = decode_all("ours", stream, cuts, 100_000)
        assert got[1] == expected[1], (ending, trial)
        assert got[0] == expected[0], (ending, trial)
        assert len(got[0]) == len(frames)


def test_a_large_frame_arrives_in_many_pieces():
    body = bytes(range(256)) * 8192  # 2 MiB
    frame = encode_command(RemotingCommand(0, opaque=3, flag=1, body=body))
    dec = ResponseDecoder()
    out = []
    for at in range(0, len(frame), 65536):
        out += dec.feed(frame[at:at + 65536])
    assert [c.body for c in out] == [body] and dec.error is None
    assert dec.feed(b"") == [] and dec.closed


def test_the_decoded_send_response_is_what_the_producer_reads():
    frame = encode_response(_Req(9), 0, None, {"msgId": "ID", "queueId": "2", "queueOffset": "41"})
    (cmd,) = ResponseDecoder().feed(frame)
    assert (cmd.code, cmd.opaque, cmd.is_response, cmd.ext_fields["queueOffset"]) == (0, 9, True, "41")
    assert cmd.language is LanguageCode.JAVA and cmd.version == CURRENT_VERSION


def test_send_result_is_the_frozen_class_built_cheaply():
    from broker.client.model import SendResult, SendStatus, send_result
    q = MessageQueue("T", "b", 1)
    fast = send_result(SendStatus.SEND_OK, "U", "O", q, 5, None)
    assert fast == SendResult(status=SendStatus.SEND_OK, msg_id="U", offset_msg_id="O", queue=q,
                              queue_offset=5) and type(fast) is SendResult
    assert hash(fast) == hash(SendResult(status=SendStatus.SEND_OK, msg_id="U", offset_msg_id="O", queue=q,
                                         queue_offset=5, region_id=None))
    with pytest.raises(AttributeError):
        fast.queue_offset = 6
