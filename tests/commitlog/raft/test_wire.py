# The sans-IO codec: every message round-trips byte-exactly (EntryBatch.raw
# as-is), and malformed input -- truncated, unknown version/type/enum,
# lengths that lie, trailing bytes -- is a WireError, never another exception.
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog.entry import EntryBatch
from commitlog.errors import WireError
from commitlog.raft import wire
from commitlog.raft.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    PushRequest,
    PushResponse,
    PushType,
    ResponseCode,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from tests.commitlog.raft.helpers import log_with_terms

ids = st.text(min_size=1, max_size=12)
i64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
terms = st.integers(min_value=-1, max_value=1 << 40)


@st.composite
def batches(draw):
    first = draw(st.integers(min_value=0, max_value=1 << 40))
    count = draw(st.integers(min_value=1, max_value=20))
    nruns = draw(st.integers(min_value=1, max_value=count))
    starts = sorted(draw(st.sets(st.integers(min_value=first + 1, max_value=first + count - 1),
                                 min_size=nruns - 1, max_size=nruns - 1))) if count > 1 else []
    run_terms = sorted(draw(st.sets(st.integers(min_value=0, max_value=1 << 40),
                                    min_size=len(starts) + 1, max_size=len(starts) + 1)))
    runs = tuple(zip([first] + starts, run_terms))
    return EntryBatch(first, count, runs, draw(st.binary(max_size=300)))


messages = st.one_of(
    st.builds(VoteRequest, ids, ids, terms, i64, terms, st.booleans(), st.booleans()),
    st.builds(VoteResponse, ids, ids, terms, st.sampled_from(VoteResult), st.booleans()),
    st.builds(HeartbeatRequest, ids, ids, terms, i64),
    st.builds(HeartbeatResponse, ids, ids, terms, st.sampled_from(ResponseCode)),
    st.builds(PushRequest, ids, ids, terms, st.sampled_from(PushType), i64, i64, i64, terms,
              st.integers(min_value=0, max_value=0xFFFFFFFF), st.none() | batches()),
    # a reset carries the configuration in force below the new log start
    st.builds(PushRequest, ids, ids, terms, st.just(PushType.TRUNCATE), i64, i64, i64, terms,
              st.integers(min_value=0, max_value=0xFFFFFFFF), batches(), i64, terms,
              st.binary(min_size=1, max_size=200)),
    st.builds(PushResponse, ids, ids, terms, st.sampled_from(PushType), i64, st.sampled_from(ResponseCode),
              i64, i64, i64, terms, i64),
    st.builds(TimeoutNow, ids, ids, terms),
)


@settings(deadline=None)
@given(messages)
def test_every_message_round_trips(msg):
    data = wire.encode(msg)
    assert data[0] == wire.VERSION
    back = wire.decode(data)
    assert back == msg
    assert wire.encode(back) == data


@settings(deadline=None)
@given(messages, st.data())
def test_any_truncation_is_a_wire_error(msg, data):
    raw = wire.encode(msg)
    cut = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    with pytest.raises(WireError):
        wire.decode(raw[:cut])


@settings(deadline=None)
@given(messages, st.binary(min_size=1, max_size=8))
def test_trailing_bytes_are_a_wire_error(msg, extra):
    with pytest.raises(WireError, match="trailing"):
        wire.decode(wire.encode(msg) + extra)


@settings(deadline=None)
@given(st.integers(min_value=0, max_value=8), st.binary(max_size=160))
def test_garbage_never_raises_anything_but_wire_error(type_byte, tail):
    try:
        wire.decode(bytes([wire.VERSION, type_byte]) + tail)
    except WireError:
        pass


@settings(deadline=None)
@given(messages, st.data())
def test_corrupted_bytes_decode_or_raise_wire_error(msg, data):
    raw = bytearray(wire.encode(msg))
    at = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    raw[at] ^= data.draw(st.integers(min_value=1, max_value=255))
    try:
        wire.decode(bytes(raw))
    except WireError:
        pass


def real_push():
    log = log_with_terms([1, 1, 2, 2, 2])
    batch = log.read_batch(1, 1 << 20, 10)
    return PushRequest("a", "b", 2, PushType.APPEND, 7, 3, 0, 1, log.chain_crc_at(0), batch)


def test_real_batch_raw_travels_unchanged():
    msg = real_push()
    back = wire.decode(wire.encode(msg))
    assert back.batch.raw == msg.batch.raw and back.batch.term_runs == ((1, 1), (2, 2))
    # the raw bytes are appended as-is at the end of the message: no base64, no JSON
    assert wire.encode(msg).endswith(msg.batch.raw)


def test_unknown_version_type_and_enums():
    good = wire.encode(TimeoutNow("a", "b", 1))
    with pytest.raises(WireError, match="version"):
        wire.decode(bytes([9]) + good[1:])
    with pytest.raises(WireError, match="message type"):
        wire.decode(good[:1] + bytes([42]) + good[2:])
    resp = bytearray(wire.encode(VoteResponse("a", "b", 1, VoteResult.ACCEPT)))
    resp[-2] = 99
    with pytest.raises(WireError, match="vote result"):
        wire.decode(bytes(resp))
    resp = bytearray(wire.encode(VoteResponse("a", "b", 1, VoteResult.ACCEPT)))
    resp[-1] = 4
    with pytest.raises(WireError, match="flags"):
        wire.decode(bytes(resp))
    hb = bytearray(wire.encode(HeartbeatResponse("a", "b", 1, ResponseCode.SUCCESS)))
    hb[-2:] = struct.pack(">H", 201)
    with pytest.raises(WireError, match="response code"):
        wire.decode(bytes(hb))
    with pytest.raises(WireError, match="not a raft message"):
        wire.encode("hello")


def test_lengths_that_lie():
    raw = wire.encode(real_push())
    msg = real_push()
    raw_len_at = len(raw) - len(msg.batch.raw) - 4
    lie = bytearray(raw)
    lie[raw_len_at:raw_len_at + 4] = struct.pack(">I", len(msg.batch.raw) + 1)
    with pytest.raises(WireError, match="claims"):
        wire.decode(bytes(lie))
    lie[raw_len_at:raw_len_at + 4] = struct.pack(">I", len(msg.batch.raw) - 1)
    with pytest.raises(WireError, match="trailing"):
        wire.decode(bytes(lie))
    # a run count far beyond the message
    hdr = raw.index(struct.pack(">qII", 1, 4, 2))
    lie = bytearray(raw)
    lie[hdr + 12:hdr + 16] = struct.pack(">I", 3)
    with pytest.raises(WireError, match="term runs"):
        wire.decode(bytes(lie))
    lie[hdr + 8:hdr + 16] = struct.pack(">II", 4, 1 << 30)
    with pytest.raises(WireError, match="term runs"):
        wire.decode(bytes(lie))
    # a peer id length beyond the buffer
    short = bytearray(wire.encode(TimeoutNow("a", "b", 1)))
    short[2:4] = struct.pack(">H", 200)
    with pytest.raises(WireError):
        wire.decode(bytes(short))


def test_inconsistent_batch_shapes_are_refused():
    def with_batch(batch):
        return wire.encode(PushRequest("a", "b", 1, PushType.APPEND, 1, 0, -1, -1, 0, batch))
    with pytest.raises(WireError, match="first term run"):
        wire.decode(with_batch(EntryBatch(5, 2, ((4, 1),), b"")))
    with pytest.raises(WireError, match="ascending"):
        wire.decode(with_batch(EntryBatch(5, 3, ((5, 2), (6, 1)), b"")))
    with pytest.raises(WireError, match="ascending"):
        wire.decode(with_batch(EntryBatch(5, 2, ((5, 1), (7, 2)), b"")))
    with pytest.raises(WireError, match="no entries"):
        wire.decode(with_batch(EntryBatch(5, 0, ((5, 1),), b"")))


def test_unencodable_fields_are_a_wire_error():
    with pytest.raises(WireError, match="cannot encode"):
        wire.encode(PushRequest("a", "b", 1, PushType.COMPARE, 1, 0, 5, 1, None))
    with pytest.raises(WireError, match="longer than"):
        wire.encode(TimeoutNow("a" * 300, "b", 1))


@settings(deadline=None)
@given(messages)
def test_a_scattered_push_joins_to_the_encoded_bytes_and_shares_the_entries(msg):
    """encode_scatter: a push with entries comes as pieces whose
    concatenation is encode()'s bytes, the entries' piece being the very
    object the batch holds (never copied); every other message as bytes."""
    got = wire.encode_scatter(msg)
    if isinstance(msg, PushRequest) and msg.batch is not None:
        assert isinstance(got, tuple) and len(got) == 3 and got[1] is msg.batch.raw
        assert b"".join(got) == wire.encode(msg)
    else:
        assert got == wire.encode(msg)
