# Tests of the sans-IO frame codec: exact bytes, incremental decoding, every
# error path, and hypothesis fuzzing (any input gives frames or FrameError).
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog.transport.errors import FrameError
from commitlog.transport.framing import (
    CLOSED,
    HEADER_SIZE,
    MAGIC,
    NEED_DATA,
    VERSION,
    Frame,
    FrameDecoder,
    FrameKind,
    Hello,
    decode_hello,
    decode_identity,
    decode_reject,
    encode_frame,
    encode_identity,
    identity_mismatch,
)


def drain(dec: FrameDecoder) -> list:
    out = []
    while (f := dec.next_frame()) is not NEED_DATA and f is not CLOSED:
        out.append(f)
    return out


def test_exact_bytes():
    assert encode_frame(b"abc") == bytes.fromhex("4c51 01 04 00000003") + b"abc"
    assert encode_frame(b"", FrameKind.HELLO) == bytes.fromhex("4c51010100000000")
    assert HEADER_SIZE == 8


def test_round_trip_many_frames_in_one_chunk():
    frames = [Frame(FrameKind.DATA, bytes([i]) * i) for i in range(50)]
    dec = FrameDecoder()
    dec.receive_data(b"".join(encode_frame(f.payload, f.kind) for f in frames))
    assert drain(dec) == frames
    assert dec.next_frame() is NEED_DATA
    assert dec.buffered == 0
    dec.receive_data(b"")
    assert dec.next_frame() is CLOSED


def test_byte_by_byte():
    data = encode_frame(b"hello") + encode_frame(b"", FrameKind.HELLO_OK)
    dec = FrameDecoder()
    got = []
    for b in data:
        assert dec.next_frame() is NEED_DATA or got
        dec.receive_data(bytes([b]))
        got += drain(dec)
    assert got == [Frame(FrameKind.DATA, b"hello"), Frame(FrameKind.HELLO_OK, b"")]


@pytest.mark.parametrize("data, message", [
    (struct.pack(">HBBI", 0x1234, VERSION, 4, 0), "bad magic"),
    (struct.pack(">HBBI", MAGIC, 2, 4, 0), "unsupported frame version 2"),
    (struct.pack(">HBBI", MAGIC, VERSION, 0, 0), "unknown frame kind 0"),
    (struct.pack(">HBBI", MAGIC, VERSION, 9, 0), "unknown frame kind 9"),
    (b"\x00" * 8, "bad magic"),
])
def test_bad_header(data, message):
    dec = FrameDecoder()
    dec.receive_data(data)
    with pytest.raises(FrameError, match=message):
        dec.next_frame()
    # Poisoned: the stream has no boundaries left.
    with pytest.raises(FrameError, match=message):
        dec.next_frame()
    with pytest.raises(FrameError):
        dec.receive_data(b"more")


def test_oversized_rejected_from_header_alone():
    dec = FrameDecoder(max_frame_size=1000)
    dec.receive_data(struct.pack(">HBBI", MAGIC, VERSION, 4, 1001))  # no payload sent
    with pytest.raises(FrameError, match="exceeds the maximum of 1000"):
        dec.next_frame()
    ok = FrameDecoder(max_frame_size=1000)
    ok.receive_data(encode_frame(b"x" * 1000))
    assert ok.next_frame() == Frame(FrameKind.DATA, b"x" * 1000)
    with pytest.raises(FrameError, match="exceeds"):
        encode_frame(b"x" * 1001, max_frame_size=1000)
    with pytest.raises(ValueError):
        FrameDecoder(max_frame_size=0)


@pytest.mark.parametrize("cut", [1, 7, 8, 12])
def test_eof_inside_frame(cut):
    dec = FrameDecoder()
    dec.receive_data(encode_frame(b"12345678")[:cut])
    assert dec.next_frame() is NEED_DATA
    dec.receive_data(b"")
    with pytest.raises(FrameError, match="stream ended inside"):
        dec.next_frame()


def test_data_after_eof():
    dec = FrameDecoder()
    dec.receive_data(b"")
    dec.receive_data(b"")  # repeated EOF is fine
    with pytest.raises(FrameError, match="after end of stream"):
        dec.receive_data(b"x")


def test_hello_round_trip_and_malformed():
    h = Hello("RaftNode00", "n0", "n1")
    assert decode_hello(h.encode()) == h
    assert decode_hello(Hello("grüppe", "", "n1").encode()) == Hello("grüppe", "", "n1")
    raw = h.encode()
    with pytest.raises(FrameError, match="truncated"):
        decode_hello(raw[:1])
    with pytest.raises(FrameError, match="runs past"):
        decode_hello(raw[:-1])
    with pytest.raises(FrameError, match="truncated before identity"):
        decode_hello(raw + b"x")
    with_id = Hello("RaftNode00", "n0", "n1", encode_identity({"origin": "196608", "dataSegmentSize": "65536"}))
    assert with_id.identity == "dataSegmentSize=65536;origin=196608"
    assert decode_hello(with_id.encode()) == with_id
    assert decode_identity(with_id.identity) == {"origin": "196608", "dataSegmentSize": "65536"}
    with pytest.raises(FrameError, match="truncated before nonce"):
        decode_hello(with_id.encode() + b"x")
    # Peer authentication's fields ride behind the identity; an empty
    # identity is still written when a nonce follows it.
    authed = Hello("RaftNode00", "n0", "n1", "", nonce="ab" * 16, proof="cd" * 32)
    assert decode_hello(authed.encode()) == authed
    with pytest.raises(FrameError, match="trailing"):
        decode_hello(authed.encode() + b"x")
    with pytest.raises(FrameError, match="not key=value"):
        decode_identity("origin")
    with pytest.raises(ValueError, match="must not"):
        encode_identity({"a;b": "1"})
    assert identity_mismatch("n0", {"origin": "0", "x": "1"}, "n1", {"origin": "0", "y": "2"}) is None
    assert identity_mismatch("n0", {"origin": "0", "dataSegmentSize": "1"}, "n1",
                             {"origin": "8", "dataSegmentSize": "2"}) == (
        "log identity differs: dataSegmentSize 1 at n0, 2 at n1; origin 0 at n0, 8 at n1")
    with pytest.raises(FrameError, match="not UTF-8"):
        decode_hello(b"\x00\x01\xff" + raw[2 + len("RaftNode00"):])
    assert decode_reject(b"bad \xff") == "bad \ufffd"


frames_st = st.lists(st.builds(Frame, st.sampled_from(list(FrameKind)), st.binary(max_size=300)),
                     max_size=20)


@settings(max_examples=300, deadline=None)
@given(frames=frames_st, data=st.data())
def test_fuzz_round_trip_any_split(frames, data):
    stream = b"".join(encode_frame(f.payload, f.kind) for f in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    dec = FrameDecoder()
    got, prev = [], 0
    for cut in cuts + [len(stream)]:
        if cut > prev:  # b"" would mean EOF
            dec.receive_data(stream[prev:cut])
        prev = cut
        if cut == len(stream):
            break
        got += drain(dec)
    got += drain(dec)
    dec.receive_data(b"")
    assert dec.next_frame() is CLOSED
    assert got == frames


def _feed_all(chunks, max_frame_size=4096):
    dec = FrameDecoder(max_frame_size=max_frame_size)
    out = []
    try:
        for chunk in filter(None, chunks):  # b"" would mean EOF
            dec.receive_data(chunk)
            out += drain(dec)
        dec.receive_data(b"")
        out += drain(dec)
    except FrameError:
        return out, True
    return out, False


@settings(max_examples=500, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_fuzz_random_bytes_only_frames_or_frame_error(chunks):
    out, failed = _feed_all(chunks)
    assert all(isinstance(f, Frame) for f in out)
    if not b"".join(chunks):
        assert not failed and out == []


@settings(max_examples=300, deadline=None)
@given(frames=frames_st.filter(bool), data=st.data())
def test_fuzz_mutated_stream(frames, data):
    stream = bytearray(b"".join(encode_frame(f.payload, f.kind) for f in frames))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(stream) - 1))
        stream[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        del stream[data.draw(st.integers(0, len(stream))):]
    split = data.draw(st.integers(0, len(stream)))
    out, failed = _feed_all([bytes(stream[:split]), bytes(stream[split:])])
    assert all(isinstance(f, Frame) for f in out)
    # Payload mutations may go unnoticed (no CRC: TCP checksums the bytes),
    # but what did decode is never more frames than the stream could hold.
    assert len(out) <= len(stream) // HEADER_SIZE
