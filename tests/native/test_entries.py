# The C entry helpers against their pure-Python twins (the oracle) and
# against commitlog.entry's codec; golden vectors from spec §7.6.
import os
import struct
import zlib
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog import entry as E
from native import entries as N
from tests.helpers.spec_vectors import ENTRY_HEADER, INDEX_UNIT, message_with_physical_offset

FLAGS_SEG = N.F_SEGMENT | N.F_CHECK_CRC


def test_native_entries_loaded():
    if os.environ.get("LEDGERMQ_NO_NATIVE") == "1":
        assert not N.NATIVE
    else:
        assert N.NATIVE, "native/src/entries.c not built; run `make native`"


def both(name):
    """(native, twin) implementations of a helper."""
    return getattr(N, name), getattr(N, "py_" + name)


def _layout(impl_plan, impl_fill, impl_seal, bodies, start, seg_size, first, term, prev, with_crc=True,
            hook=None):
    lens = array("q", map(len, bodies))
    positions = array("q", bytes(8 * len(bodies)))
    seg_end = start // seg_size * seg_size + seg_size
    end = impl_plan(lens, start, seg_end, seg_size, positions)
    if end < 0:
        return end, None, None, None, None
    out = bytearray(end - start)
    impl_fill(out, b"".join(bodies), lens, positions, start, first, term, E.MAGIC_NORMAL)
    if hook:
        hook(out, positions, start)
    units = bytearray(32 * len(bodies))
    chain = impl_seal(out, positions, start, prev, with_crc, units)
    return end, positions.tolist(), bytes(out), bytes(units), chain


def test_golden_vector_stock_layout():
    """Spec §7.6: the 146-byte message as entry 0, term 1, pos 0, with the
    PHYSICALOFFSET hook writing pos + 48, sealed without CRCs."""
    body = message_with_physical_offset(0)

    def hook(out, positions, start):
        struct.pack_into(">q", out, positions[0] - start + 48 + 28, positions[0] + 48)

    for plan, fill, seal in ((N.layout_plan, N.layout_fill, N.layout_seal),
                             (N.py_layout_plan, N.py_layout_fill, N.py_layout_seal)):
        end, positions, out, units, chain = _layout(plan, fill, seal, [body], 0, 1 << 20, 0, 1, 0,
                                                    with_crc=False, hook=hook)
        assert (end, positions, chain) == (194, [0], 0)
        assert out[:48] == ENTRY_HEADER
        assert out[48:] == message_with_physical_offset(48)
        assert units == INDEX_UNIT


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=30), st.integers(100, 1200),
       st.integers(0, 5000), st.integers(0, 10**6), st.integers(0, 99), st.integers(0, 0xFFFFFFFF))
def test_layout_native_equals_twin_and_codec(lens, seg_size, start, first, term, prev):
    start = start // seg_size * seg_size + min(start % seg_size, seg_size - 8)  # a reachable write position
    bodies = [bytes([i % 251]) * n for i, n in enumerate(lens)]
    native = _layout(N.layout_plan, N.layout_fill, N.layout_seal, bodies, start, seg_size, first, term, prev)
    twin = _layout(N.py_layout_plan, N.py_layout_fill, N.py_layout_seal, bodies, start, seg_size, first, term,
                   prev)
    assert native == twin
    end, positions, out, units, chain = native
    if end < 0:
        assert 48 + lens[-1 - end] + 8 > seg_size
        return
    # Oracle: commitlog.entry encodes every entry, blanks follow DLedger's rule.
    at, c = start, prev
    for i, (body, p) in enumerate(zip(bodies, positions)):
        if p != at:
            assert p % seg_size == 0 and 48 + len(body) + 8 > p - at
            assert out[at - start:at - start + 8] == E.encode_blank(p - at)
            assert out[at - start + 8:p - start] == bytes(p - at - 8)
        ent = E.make_entry(body, index=first + i, term=term, pos=p, prev_chain_crc=c)
        assert out[p - start:p - start + ent.size] == ent.encode()
        assert units[32 * i:32 * i + 32] == ent.index_unit()
        c, at = ent.chain_crc, p + ent.size
    assert at == end and chain == c


def _segment(entries_spec, seg_size, *, with_crc=True, first=0, start=0):
    """A data segment image holding entries ((body, term) list) from `start`,
    plus the entries placed."""
    buf = bytearray(seg_size)
    pos, prev, placed = start, 0, []
    for i, (body, term) in enumerate(entries_spec):
        ent = E.make_entry(body, index=first + i, term=term, pos=pos, prev_chain_crc=prev, with_crc=with_crc)
        if ent.size + 8 > seg_size - pos:
            buf[pos:pos + 8] = E.encode_blank(seg_size - pos)
            break
        buf[pos:pos + ent.size] = ent.encode()
        placed.append(ent)
        pos, prev = pos + ent.size, ent.chain_crc
    return buf, placed


def _scan(impl, buf, flags, max_count, **state):
    stt = N.new_state(**state)
    units = bytearray(32 * 200)
    r = impl(memoryview(buf), flags, max_count, stt, units)
    return r, stt.tolist(), bytes(units[:32 * stt[N.S_COUNT]])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=80), st.integers(1, 3)), min_size=1, max_size=25).map(
    lambda es: sorted(es, key=lambda e: e[1])), st.booleans(), st.data())
def test_scan_native_equals_twin_on_damaged_segments(spec, with_crc, data):
    seg_size = 1024
    buf, placed = _segment(spec, seg_size, with_crc=with_crc)
    mutation = data.draw(st.sampled_from(["none", "flip", "zero_tail", "truncate"]))
    if mutation == "flip":
        at = data.draw(st.integers(0, seg_size - 1))
        buf[at] ^= 1 << data.draw(st.integers(0, 7))
    elif mutation == "zero_tail":
        at = data.draw(st.integers(0, seg_size))
        buf[at:] = bytes(seg_size - at)
    elif mutation == "truncate":
        buf = buf[:data.draw(st.integers(0, seg_size))]
    max_count = data.draw(st.integers(1, 40))
    kw = dict(pos=0, seg_end=seg_size, seg_size=seg_size, chain_known=True, next_index=0)
    native = _scan(N.scan_entries, buf, FLAGS_SEG, max_count, **kw)
    twin = _scan(N.py_scan_entries, buf, FLAGS_SEG, max_count, **kw)
    assert native == twin
    if mutation == "none":
        r, stt, units = native
        n = min(len(placed), max_count)
        assert stt[N.S_COUNT] == n
        assert units == b"".join(e.index_unit() for e in placed[:n])
        assert r in (N.R_MAX, N.R_END, N.R_BLANK)


def test_scan_reasons():
    seg_size = 1024
    spec = [(b"a" * 10, 1), (b"b" * 20, 1), (b"c" * 30, 2)]
    good, placed = _segment(spec, seg_size)
    kw = dict(pos=0, seg_end=seg_size, seg_size=seg_size, next_index=0)

    def reason(mutate, impl=N.scan_entries, flags=FLAGS_SEG, **over):
        buf = bytearray(good)
        mutate(buf)
        r, stt, _ = _scan(impl, buf, flags, 100, **{**kw, **over})
        return r, stt[N.S_COUNT], stt[N.S_CONSUMED]

    p1, p2 = placed[1].pos, placed[2].pos
    for impl in (N.scan_entries, N.py_scan_entries):
        assert reason(lambda b: None, impl) == (N.R_END, 3, placed[2].pos + placed[2].size)
        assert reason(lambda b: struct.pack_into(">i", b, p1, 9), impl)[:2] == (N.R_BAD_MAGIC, 1)
        assert reason(lambda b: struct.pack_into(">i", b, p1 + 4, 40), impl)[:2] == (N.R_BAD_SIZE, 1)
        assert reason(lambda b: struct.pack_into(">i", b, p1 + 44, 3), impl)[:2] == (N.R_BAD_BODY_SIZE, 1)
        # size 47 passes DLedger's "size > 44"; its bodySize of -1 must not reach the CRC
        neg = lambda b: struct.pack_into(">iiqqqiIIi", b, p1, 1, 47, 1, 1, p1, 0, 1, 1, -1)  # noqa: E731
        assert reason(neg, impl)[:2] == (N.R_BAD_BODY_SIZE, 1)
        assert reason(lambda b: struct.pack_into(">i", b, p1 + 32, 1), impl)[:2] == (N.R_BAD_CHANNEL, 1)
        assert reason(lambda b: struct.pack_into(">q", b, p1 + 24, 5), impl)[:2] == (N.R_BAD_POS, 1)
        assert reason(lambda b: struct.pack_into(">q", b, p1 + 8, 7), impl)[:2] == (N.R_BAD_INDEX, 1)
        assert reason(lambda b: struct.pack_into(">q", b, p2 + 16, 0), impl)[:2] == (N.R_BAD_TERM, 2)
        assert reason(lambda b: b.__setitem__(p1 + 50, 0x7A), impl)[:2] == (N.R_BAD_BODY_CRC, 1)
        assert reason(lambda b: struct.pack_into(">I", b, p1 + 36, 1), impl)[:2] == (N.R_BAD_CHAIN_CRC, 1)
        assert reason(lambda b: struct.pack_into(">II", b, p1 + 36, 0, 0), impl)[:2] == (N.R_MISSING_CRC, 1)
        assert reason(lambda b: struct.pack_into(">ii", b, p2, -1, 5), impl)[:2] == (N.R_BAD_BLANK, 2)
        # Without CRC checking, CRC damage is invisible.
        assert reason(lambda b: b.__setitem__(p1 + 50, 0x7A), impl, flags=N.F_SEGMENT)[:2] == (N.R_END, 3)
        # A truncated buffer tears the entry it cuts.
        r, stt, _ = _scan(impl, good[:p2 + 50], FLAGS_SEG, 100, **kw)
        assert (r, stt[N.S_COUNT]) == (N.R_TORN, 2)
        # An entry that leaves fewer than 8 bytes in its segment breaks the blank rule.
        r, stt, _ = _scan(impl, good, FLAGS_SEG, 100, pos=0, seg_end=placed[0].size + 4, seg_size=seg_size)
        assert (r, stt[N.S_COUNT]) == (N.R_NO_ROOM, 0)
        # A valid blank closes the segment.
        closed = bytearray(good)
        end = p2 + placed[2].size
        closed[end:end + 8] = E.encode_blank(seg_size - end)
        r, stt, _ = _scan(impl, closed, FLAGS_SEG, 100, **kw)
        assert (r, stt[N.S_COUNT], stt[N.S_CONSUMED]) == (N.R_BLANK, 3, end)


def test_scan_batch_mode_rolls_to_next_segment():
    seg_size = 256
    ents, pos, prev = [], 0, 0
    for i in range(6):
        body = bytes([i]) * 70
        size = 48 + len(body)
        if size + 8 > seg_size - pos % seg_size:
            pos = (pos // seg_size + 1) * seg_size
        e = E.make_entry(body, index=i, term=1, pos=pos, prev_chain_crc=prev)
        ents.append(e)
        pos, prev = pos + e.size, e.chain_crc
    raw = b"".join(e.encode() for e in ents)
    for impl in (N.scan_entries, N.py_scan_entries):
        stt = N.new_state(next_index=0, pos=0, seg_end=seg_size, seg_size=seg_size)
        off, rolls = 0, []
        while True:
            r = impl(memoryview(raw)[off:], N.F_BATCH | N.F_CHECK_CRC, 100, stt, None)
            off += stt[N.S_CONSUMED]
            if r != N.R_ROLL:
                break
            rolls.append(stt[N.S_POS])
            stt[N.S_POS], stt[N.S_SEG_END] = stt[N.S_SEG_END], stt[N.S_SEG_END] + seg_size
        assert r == N.R_END and off == len(raw) and stt[N.S_NEXT_INDEX] == 6
        assert rolls == [236, 492]  # each segment holds two 118-byte entries, then a blank
        # A pos that neither continues nor starts the next segment is rejected.
        bad = bytearray(raw)
        struct.pack_into(">q", bad, ents[0].size + 24, 999)
        stt = N.new_state(next_index=0, pos=0, seg_end=seg_size, seg_size=seg_size)
        assert impl(memoryview(bad), N.F_BATCH | N.F_CHECK_CRC, 100, stt, None) == N.R_BAD_POS


@given(st.binary(max_size=200), st.integers(0, 199))
def test_first_nonzero_and_first_diff(data, at):
    for fn in both("first_nonzero"):
        assert fn(bytes(len(data))) == -1
        assert fn(data) == next((i for i, b in enumerate(data) if b), -1)
    other = bytearray(data)
    if at < len(other):
        other[at] ^= 0xFF
    for fn in both("first_diff"):
        assert fn(data, bytes(other)) == (at if at < len(data) else -1)
    with pytest.raises(ValueError):
        N.first_diff(b"ab", b"a")


@settings(max_examples=400, deadline=None)
@given(st.binary(min_size=0, max_size=3000), st.integers(0, 15), st.integers(0, 0xFFFFFFFF))
def test_body_crc32_equals_zlib_at_every_length_and_alignment(data, shift, seed):
    buf = bytearray(shift) + data  # misalign the start
    view = memoryview(buf)[shift:]
    assert N.body_crc32(view) == zlib.crc32(data)
    assert N.body_crc32(view, seed) == zlib.crc32(data, seed)


def test_body_crc32_long_buffers():
    data = os.urandom(1 << 20)
    for n in (64, 65, 127, 128, 1024, 4096 + 13, len(data)):
        assert N.body_crc32(data[:n]) == zlib.crc32(data[:n])
    assert N.body_crc32(bytes(1 << 16)) == zlib.crc32(bytes(1 << 16))
    assert N.body_crc32(b"\xff" * 1000) == zlib.crc32(b"\xff" * 1000)
