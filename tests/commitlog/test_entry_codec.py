import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commitlog import entry as E
from native.hashing import crc32
from tests.helpers.spec_vectors import ENTRY_HEADER, INDEX_UNIT, MESSAGE_146, message_with_physical_offset


def test_stock_entry_golden_vector():
    body = message_with_physical_offset(48)  # spec §7.6: PHYSICALOFFSET = pos + 48
    ent = E.make_entry(body, index=0, term=1, pos=0, prev_chain_crc=0, with_crc=False)
    raw = ent.encode()
    assert raw[:48] == ENTRY_HEADER
    assert raw[48:] == body and len(body) == 146
    assert ent.index_unit() == INDEX_UNIT
    assert E.decode_entry(raw) == ent
    assert E.decode_index_unit(INDEX_UNIT) == E.IndexUnit(1, 0, 194, 0, 1)


def test_ledgermq_entry_differs_from_stock_only_in_crc_fields():
    body = message_with_physical_offset(48)
    ent = E.make_entry(body, index=0, term=1, pos=0, prev_chain_crc=0)
    raw = ent.encode()
    assert raw[:36] == ENTRY_HEADER[:36] and raw[44:48] == ENTRY_HEADER[44:48]
    chain, bcrc = struct.unpack_from(">II", raw, 36)
    assert bcrc == crc32(body)
    assert chain == crc32(struct.pack(">IIqq", 0, bcrc, 0, 1))


def test_chain_crc_links_entries():
    a = E.make_entry(b"a", index=0, term=1, pos=0, prev_chain_crc=0)
    b = E.make_entry(b"b", index=1, term=1, pos=49, prev_chain_crc=a.chain_crc)
    b_other_history = E.make_entry(b"b", index=1, term=1, pos=49, prev_chain_crc=a.chain_crc ^ 1)
    assert b.chain_crc != b_other_history.chain_crc
    assert E.verify_crc(b.header, b.body, a.chain_crc, True) == (None, True)
    reason, _ = E.verify_crc(b.header, b.body, a.chain_crc ^ 1, True)
    assert "chainCrc mismatch" in reason


def test_crc_rule_stock_entries_unchecked_until_crc_mode():
    stock = E.make_entry(b"x", index=3, term=2, pos=0, prev_chain_crc=0, with_crc=False)
    assert E.verify_crc(stock.header, stock.body, 0, False) == (None, False)
    reason, mode = E.verify_crc(stock.header, stock.body, 0, True)
    assert mode and "without CRCs" in reason
    flipped = E.make_entry(b"y", index=3, term=2, pos=0, prev_chain_crc=0)
    reason, _ = E.verify_crc(flipped.header, b"z", 0, False)
    assert "bodyCrc mismatch" in reason


def test_noop_entry_has_empty_body_and_chain():
    noop = E.make_entry(b"", index=7, term=3, pos=100, prev_chain_crc=5, magic=E.MAGIC_NOOP)
    assert noop.size == 48 and noop.body_crc == 0 and noop.chain_crc != 0
    assert E.decode_entry(noop.encode()) == noop


@pytest.mark.parametrize("mutate,reason", [
    (lambda b: struct.pack_into(">i", b, 0, 7), "bad magic"),
    (lambda b: struct.pack_into(">i", b, 4, 40), "bad size"),
    (lambda b: struct.pack_into(">i", b, 44, 3), "bodySize"),
])
def test_header_checks(mutate, reason):
    raw = bytearray(E.make_entry(b"abcd", index=0, term=1, pos=0, prev_chain_crc=0).encode())
    mutate(raw)
    with pytest.raises(E.EntryFormatError, match=reason):
        E.decode_entry(raw)


def test_short_buffers_are_format_errors():
    raw = E.make_entry(b"abcd", index=0, term=1, pos=0, prev_chain_crc=0).encode()
    with pytest.raises(E.EntryFormatError, match="runs past"):
        E.decode_entry(raw[:-1])
    with pytest.raises(E.EntryFormatError, match="short"):
        E.decode_header(raw[:47])


def test_blank_filler():
    assert E.encode_blank(100) == bytes.fromhex("ffffffff00000064")
    with pytest.raises(E.EntryFormatError):
        E.encode_blank(7)


@given(st.binary(max_size=512), st.integers(0, 2**62), st.integers(0, 2**62),
       st.integers(0, 2**62), st.integers(0, 0xFFFFFFFF), st.sampled_from([1, 2]), st.booleans())
def test_entry_round_trip(body, index, term, pos, prev, magic, with_crc):
    ent = E.make_entry(body, index=index, term=term, pos=pos, prev_chain_crc=prev,
                       magic=magic, with_crc=with_crc)
    raw = ent.encode()
    assert len(raw) == 48 + len(body)
    assert E.decode_entry(raw) == ent
    assert E.decode_index_unit(ent.index_unit()) == E.IndexUnit(magic, pos, len(raw), index, term)
    assert E.verify_crc(ent.header, body, prev, False)[0] is None


def test_message_vector_is_intact():
    assert len(MESSAGE_146) == 146 and MESSAGE_146[:4] == b"\x00\x00\x00\x92"


def test_entry_batch_terms_and_round_trip():
    ents, prev, pos = [], 0, 0
    for i, term in enumerate([1, 1, 2, 2, 2, 5]):
        e = E.make_entry(b"x" * i, index=10 + i, term=term, pos=pos, prev_chain_crc=prev)
        ents.append(e)
        prev, pos = e.chain_crc, pos + e.size
    batch = E.batch_from_entries(ents)
    assert batch.term_runs == ((10, 1), (12, 2), (15, 5))
    assert [batch.term_at(i) for i in range(10, 16)] == [1, 1, 2, 2, 2, 5]
    assert (batch.last_index, batch.last_term) == (15, 5)
    assert list(E.iter_batch(batch)) == ents
    with pytest.raises(IndexError):
        batch.term_at(16)
