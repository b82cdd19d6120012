# Leader/follower appends, reads, truncation and reset of the segmented
# store, on real files with small segments.
import os
import struct
import tempfile
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commitlog import entry as E
from commitlog.errors import (
    AppendRejectedError,
    CommittedTruncateError,
    EntryTooLargeError,
    IndexBelowBeginError,
    IndexBeyondEndError,
    StoreClosedError,
    StoreLockedError,
)
from commitlog.scan import verify_store
from commitlog.store import SegmentedStore, StoreConfig
from tests.commitlog.store_helpers import DATA_SEG, body, cfg, data_path, fill, replicate, snapshot
from tests.helpers.spec_vectors import ENTRY_HEADER, INDEX_UNIT, message_with_physical_offset


def per_entry(fn):
    """An append hook calling fn(header, writable body view) for each entry."""
    def hook(batch):
        for header, view in batch.entries():
            fn(header, view)
    return hook


@per_entry
def physical_offset_hook(header, view):
    """What the broker does: PHYSICALOFFSET (message offset 28) = pos + 48."""
    struct.pack_into(">q", view, 28, header.pos + 48)


def test_config_layout_and_defaults(tmp_path):
    c = StoreConfig(root=str(tmp_path))
    assert (c.data_segment_size, c.index_segment_size) == (1 << 30, 167_772_160)
    assert c.store_dir == os.path.join(str(tmp_path), "dledger-n0")
    with pytest.raises(ValueError):
        StoreConfig(root=str(tmp_path), index_segment_size=100)
    with pytest.raises(TypeError):
        StoreConfig(root=str(tmp_path), flush_disk_type="sometimes")
    with SegmentedStore.open(cfg(tmp_path)) as s:
        assert (s.begin_index, s.end_index, s.end_term, s.end_pos, s.committed_index) == (-1, -1, -1, 0, -1)
        s.append_leader([b"x"], term=1)
    assert sorted(os.listdir(tmp_path / "dledger-n0")) == ["checkpoint", "data", "index", "ledgermq.lock"]
    assert os.listdir(tmp_path / "dledger-n0" / "data") == ["00000000000000000000"]
    assert os.path.getsize(tmp_path / "dledger-n0" / "data" / "00000000000000000000") == DATA_SEG


def test_golden_entry_with_physical_offset_hook(tmp_path):
    with SegmentedStore.open(cfg(tmp_path)) as s:
        s.add_append_hook(physical_offset_hook)
        assert s.append_leader([message_with_physical_offset(0)], term=1) == [(0, 0)]
        e = s.get(0)
        assert bytes(e.body) == message_with_physical_offset(48)
    raw = open(tmp_path / "dledger-n0" / "data" / "00000000000000000000", "rb").read()
    body48 = message_with_physical_offset(48)
    assert raw[:36] == ENTRY_HEADER[:36] and raw[44:48] == ENTRY_HEADER[44:48]
    chain, bcrc = struct.unpack_from(">II", raw, 36)
    assert bcrc == zlib.crc32(body48)  # the CRC covers the body after the hook
    assert chain == zlib.crc32(struct.pack(">IIqq", 0, bcrc, 0, 1))
    assert raw[48:194] == body48 and raw[194:] == bytes(DATA_SEG - 194)
    assert open(tmp_path / "dledger-n0" / "index" / "00000000000000000000", "rb").read(32) == INDEX_UNIT


def test_hooks_see_assigned_fields_and_a_failing_hook_writes_nothing(tmp_path):
    with SegmentedStore.open(cfg(tmp_path)) as s:
        s.append_leader([b"a" * 10], term=1)
        seen = []
        s.add_append_hook(per_entry(lambda h, v: seen.append((h.index, h.term, h.pos, h.size, len(v), v.readonly))))
        s.append_leader([b"b" * 20, b"c" * 30], term=2)
        assert seen == [(1, 2, 58, 68, 20, False), (2, 2, 126, 78, 30, False)]
        before = snapshot(s.store_dir)

        def boom(batch):
            raise RuntimeError("hook failed")

        s.add_append_hook(boom)
        with pytest.raises(RuntimeError):
            s.append_leader([b"d"], term=2)
        assert (s.end_index, s.end_pos) == (2, 204) and snapshot(s.store_dir) == before
        s.remove_append_hook(boom)
        assert s.append_leader([b"d"], term=2) == [(3, 204)]


def test_blank_filler_rule_at_exact_boundaries(tmp_path):
    with SegmentedStore.open(cfg(tmp_path)) as s:
        # 500 + 516 leaves exactly 8 bytes: the second entry still fits (len + 8 == remaining).
        assert s.append_leader([b"a" * 452, b"b" * 468], term=1) == [(0, 0), (1, 500)]
        assert s.end_pos == 1016
        # Anything else now needs a blank of 8 bytes and goes to the next segment.
        assert s.append_leader([b""], term=1) == [(2, 1024)]
        # A 1016-byte entry needs a whole segment: blank of 976 after entry 2.
        assert s.append_leader([b"c" * 968], term=1) == [(3, 2048)]
        assert s.append_leader([b"d" * 920], term=1) == [(4, 3072)]  # blank of 8
        # 56 bytes remain: a 48-byte entry fits exactly (48 + 8 == 56) ...
        assert s.append_leader([b""], term=1) == [(5, 4040)]
        assert s.append_leader([b"e" * 920], term=1) == [(6, 4096)]
        # ... but a 49-byte one (49 + 8 == remaining + 1) does not.
        assert s.append_leader([b"f"], term=1) == [(7, 5120)]
        with pytest.raises(EntryTooLargeError):
            s.append_leader([b"g" * 969], term=1)
        assert s.end_index == 7
        assert [bytes(s.get(i).body[:1]) for i in (3, 4, 6, 7)] == [b"c", b"d", b"e", b"f"]
    raw = [open(data_path(s, k * DATA_SEG), "rb").read() for k in range(6)]
    assert raw[0][1016:1024] == E.encode_blank(8)
    assert raw[1][48:56] == E.encode_blank(976) and raw[1][56:] == bytes(968)
    assert raw[2][1016:] == E.encode_blank(8)
    assert raw[3][1016:] == E.encode_blank(8)
    assert raw[4][968:976] == E.encode_blank(56) and raw[4][976:] == bytes(48)
    assert raw[5][49:] == bytes(DATA_SEG - 49)
    assert verify_store(s.store_dir).problems == []


def test_get_read_batch_and_terms_across_segments(tmp_path):
    with SegmentedStore.open(cfg(tmp_path)) as s:
        terms = [1] * 7 + [2] * 9 + [5] * 20
        for i, t in enumerate(terms):
            s.append_leader([body(i)], term=t)
        assert s.end_index == 35 and s.end_term == 5
        entries = [s.get(i) for i in range(36)]
        for i, e in enumerate(entries):
            assert (e.index, e.term, bytes(e.body)) == (i, terms[i], body(i))
            assert s.pos_of(i) == e.pos and s.term_at(i) == terms[i] and s.chain_crc_at(i) == e.chain_crc
        assert s.chain_crc_at(35) == s.end_chain_crc
        assert len({e.pos // DATA_SEG for e in entries}) > 3
        assert [s.first_index_of_term(t) for t in (0, 1, 2, 3, 5, 6)] == [-1, 0, 7, -1, 16, -1]
        for first in range(36):
            for max_bytes, max_count in ((1, 10), (300, 3), (700, 100), (10**6, 100)):
                b = s.read_batch(first, max_bytes, max_count)
                views, n = s.read_views(first, max_bytes, max_count)  # the same entries, uncopied
                assert n == b.count and b"".join(bytes(v) for v in views) == bytes(b.raw)
                got = list(E.iter_batch(b))
                assert 1 <= b.count <= max_count and b.last_index <= 35
                assert b.count == 1 or len(b.raw) <= max_bytes
                assert [(g.index, g.term, g.pos, g.body) for g in got] == \
                    [(e.index, e.term, e.pos, bytes(e.body)) for e in entries[first:first + b.count]]
                assert b.term_runs == tuple((i, t) for i, t in enumerate(terms)
                                            if first <= i <= b.last_index and (i == first or terms[i - 1] != t))
                if max_bytes >= 10**6:
                    assert b.last_index == min(35, first + max_count - 1)
        with pytest.raises(IndexBeyondEndError):
            s.get(36)
        with pytest.raises(IndexBelowBeginError):
            s.get(-1)
        with pytest.raises(AppendRejectedError):
            s.append_leader([b"x"], term=4)
        assert s.append_leader([b""], term=5, magic=E.MAGIC_NOOP) == [(36, s.pos_of(36))]
        assert s.get(36).magic == E.MAGIC_NOOP


def test_follower_files_are_byte_identical_to_the_leader(tmp_path):
    with SegmentedStore.open(cfg(tmp_path, "n0")) as leader, SegmentedStore.open(cfg(tmp_path, "n1")) as follower:
        leader.add_append_hook(per_entry(lambda h, v: v.__setitem__(slice(0, min(8, len(v))), bytes(min(8, len(v))))))
        fill(leader, 40, batch=3)
        fill(leader, 25, term=3, batch=7)
        replicate(leader, follower, max_bytes=450, max_count=6)
        assert (follower.end_index, follower.end_term, follower.end_pos, follower.end_chain_crc) == \
               (leader.end_index, leader.end_term, leader.end_pos, leader.end_chain_crc)
        leader.flush()
        follower.flush()
        assert snapshot(leader.store_dir) == snapshot(follower.store_dir)


def _rejects(follower, batch, match):
    before = (snapshot(follower.store_dir), follower.end_index, follower.end_pos)
    with pytest.raises(AppendRejectedError, match=match):
        follower.append_follower(batch)
    assert (snapshot(follower.store_dir), follower.end_index, follower.end_pos) == before


def test_follower_rejections_write_nothing(tmp_path):
    with SegmentedStore.open(cfg(tmp_path, "a")) as a, SegmentedStore.open(cfg(tmp_path, "b")) as b, \
            SegmentedStore.open(cfg(tmp_path, "f")) as f:
        fill(a, 12, term=2)
        fill(b, 12, term=2, seed=1)  # other history (other bodies, other sizes)
        f.append_follower(a.read_batch(0, 10**6, 5))
        _rejects(f, a.read_batch(6, 10**6, 3), "starts at index 6")
        _rejects(f, b.read_batch(5, 10**6, 3), "pos field|chainCrc")
        # Same sizes, other content: only the chain tells them apart.
        c_store = SegmentedStore.open(cfg(tmp_path, "c"))
        c_store.append_leader([bytes(len(a.get(i).body)) for i in range(6)], 2)
        _rejects(f, c_store.read_batch(5, 10**6, 3), "chainCrc mismatch")
        c_store.close()
        good = a.read_batch(5, 10**6, 3)
        flipped = bytearray(good.raw)
        flipped[60] ^= 1
        _rejects(f, E.EntryBatch(5, 3, good.term_runs, bytes(flipped)), "bodyCrc mismatch")
        stock = [E.make_entry(e.body, index=e.index, term=e.term, pos=e.pos, prev_chain_crc=0, with_crc=False)
                 for e in E.iter_batch(good)]
        _rejects(f, E.batch_from_entries(stock), "without CRCs")
        _rejects(f, E.EntryBatch(5, 4, good.term_runs, good.raw), "claims 4 entries")
        _rejects(f, E.EntryBatch(5, 3, ((5, 9),), good.raw), "term runs")
        low = [E.make_entry(b"x", index=5, term=1, pos=f.end_pos, prev_chain_crc=f.end_chain_crc)]
        _rejects(f, E.batch_from_entries(low), "term 1 below previous term 2")
        f.append_follower(good)
        assert f.end_index == 7


def _prefix_store(tmp_path, name, source, upto):
    """A fresh store holding copies of source's entries 0..upto (same terms)."""
    s = SegmentedStore.open(cfg(tmp_path, name))
    for i in range(upto + 1):
        e = source.get(i)
        s.append_leader([bytes(e.body)], e.term)
    s.flush()
    return s


@pytest.mark.parametrize("cut", ["middle", "segment_start", "after_blank_of_8", "begin"])
def test_truncate_leaves_files_identical_to_a_fresh_write(tmp_path, cut):
    with SegmentedStore.open(cfg(tmp_path)) as s:
        s.append_leader([b"a" * 452, b"b" * 468], term=1)  # ends 8 bytes before the segment end
        fill(s, 30, term=2)
        positions = [s.pos_of(i) for i in range(s.end_index + 1)]
        index = {"middle": 17,
                 "segment_start": next(i for i, p in enumerate(positions) if i > 2 and p % DATA_SEG == 0),
                 "after_blank_of_8": 2,
                 "begin": 0}[cut]
        s.truncate_from(index)
        assert s.end_index == index - 1 and s.end_pos == (positions[index - 1] + s_size(s, index - 1) if index else 0)
        if index == 0:
            assert (s.begin_index, s.end_term) == (0, -1)
            with pytest.raises(IndexBeyondEndError):
                s.get(0)
        else:
            ref = _prefix_store(tmp_path, "ref", s, index - 1)
            assert snapshot(s.store_dir) == snapshot(ref.store_dir)
            assert s.end_chain_crc == ref.end_chain_crc and s.end_term == ref.end_term
            ref.close()
        s.truncate_from(s.end_index + 5)  # beyond the end: nothing to do
        fill(s, 3, term=3)
        assert verify_store(s.store_dir).problems == []
    with SegmentedStore.open(cfg(tmp_path)) as s:
        assert s.end_index == index + 2 and s.term_at(index) == 3


def s_size(store, i):
    return store.get(i).size if i >= 0 else 0


def test_truncate_guards(tmp_path):
    with SegmentedStore.open(cfg(tmp_path)) as s:
        fill(s, 10)
        s.set_committed(4)
        with pytest.raises(CommittedTruncateError):
            s.truncate_from(4)
        s.truncate_from(5)
        assert s.end_index == 4
        s.set_committed(100)  # clamped to the end, never lowered
        assert s.committed_index == 4
        s.set_committed(2)
        assert s.committed_index == 4


def test_reset_to_continues_at_the_leaders_index_and_position(tmp_path):
    with SegmentedStore.open(cfg(tmp_path, "n0")) as leader, SegmentedStore.open(cfg(tmp_path, "n1")) as f:
        fill(leader, 50, batch=4)
        fill(f, 3, term=1, seed=9)  # some stale local history
        k = 23
        pos = leader.pos_of(k)
        f.reset_to(k, pos, leader.term_at(k - 1), leader.chain_crc_at(k - 1))
        assert (f.begin_index, f.end_index, f.end_pos, f.committed_index) == (k, k - 1, pos, k - 1)
        assert f.term_at(k - 1) == leader.term_at(k - 1)
        with pytest.raises(IndexBelowBeginError):
            f.get(k - 1)
        replicate(leader, f)
        assert f.end_chain_crc == leader.end_chain_crc
        f.flush()
        leader.flush()
        first = pos // DATA_SEG * DATA_SEG
        fsnap, lsnap = snapshot(f.store_dir), snapshot(leader.store_dir)
        assert min(n for n in fsnap if n.startswith("data/")) == f"data/{first:020d}"
        head = fsnap.pop(f"data/{first:020d}")
        assert head[:pos - first] == bytes(pos - first)  # nothing before the first entry
        assert head[pos - first:] == lsnap[f"data/{first:020d}"][pos - first:]
        assert all(fsnap[n] == lsnap[n] for n in fsnap if n.startswith("data/"))
    with SegmentedStore.open(cfg(tmp_path, "n1")) as f:
        assert (f.begin_index, f.end_index) == (k, 49)
        assert [bytes(f.get(i).body) for i in range(k, 50)] == [body(i) for i in range(k, 50)]
        assert f.term_at(k - 1) == 1
    assert verify_store(os.path.join(tmp_path, "dledger-n1")).problems == []


def test_empty_after_reset_survives_reopen(tmp_path):
    with SegmentedStore.open(cfg(tmp_path)) as s:
        s.reset_to(100, 5000, 7, 0xDEADBEEF)
    with SegmentedStore.open(cfg(tmp_path)) as s:
        assert (s.begin_index, s.end_index, s.end_term, s.end_pos, s.end_chain_crc) == (100, 99, 7, 5000, 0xDEADBEEF)
        batch = E.batch_from_entries([E.make_entry(b"x", index=100, term=7, pos=5000, prev_chain_crc=0xDEADBEEF)])
        s.append_follower(batch)
        assert bytes(s.get(100).body) == b"x"
    with pytest.raises(ValueError):
        with SegmentedStore.open(cfg(tmp_path)) as s:
            s.reset_to(5, DATA_SEG - 4, 1, 0)


def test_lock_and_closed_store(tmp_path):
    s = SegmentedStore.open(cfg(tmp_path))
    with pytest.raises(StoreLockedError):
        SegmentedStore.open(cfg(tmp_path))
    s.close()
    s.close()  # idempotent
    with pytest.raises(StoreClosedError):
        s.append_leader([b"x"], 1)
    SegmentedStore.open(cfg(tmp_path)).close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.lists(st.integers(0, 400), min_size=1, max_size=6), st.integers(0, 2)),
                min_size=1, max_size=12),
       st.integers(300, 2000), st.data())
def test_replicas_with_truncations_stay_identical(ops, seg_size, data):
    with tempfile.TemporaryDirectory() as root:
        mk = lambda name: SegmentedStore.open(StoreConfig(root=root, self_id=name, data_segment_size=seg_size,  # noqa: E731
                                                          index_segment_size=32 * 7))
        leader, follower = mk("L"), mk("F")
        term = 1
        for sizes, bump in ops:
            term += bump
            sizes = [min(n, seg_size - 56) for n in sizes]
            leader.append_leader([bytes([term]) * n for n in sizes], term)
            replicate(leader, follower, max_bytes=data.draw(st.integers(1, 3000)),
                      max_count=data.draw(st.integers(1, 10)))
            if follower.end_index > 0 and data.draw(st.booleans()):
                cut = data.draw(st.integers(0, follower.end_index))
                follower.truncate_from(cut)
                replicate(leader, follower)
        for s in (leader, follower):
            s.close()
        assert snapshot(leader.store_dir) == snapshot(follower.store_dir)
        leader, follower = mk("L"), mk("F")
        assert (leader.end_index, leader.end_chain_crc) == (follower.end_index, follower.end_chain_crc)
        assert leader.recovery.cut_at is None and follower.recovery.index_units_rewritten == 0
        leader.close()
        follower.close()
        assert verify_store(os.path.join(root, "dledger-F")).problems == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.integers(0, 12), sizes=st.lists(st.integers(0, 300), min_size=1, max_size=25),
       limits=st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 30)), min_size=1, max_size=4))
def test_read_batch_ships_the_last_append_from_its_own_bytes(tmp_path, before, sizes, limits):
    """The leader's last append is shipped from the bytes it sealed (a view,
    no read back): the same bytes the disk path reads, as many entries as
    the limits allow within the first entry's segment; after a truncate the
    disk path serves again."""
    with tempfile.TemporaryDirectory(dir=tmp_path) as d, SegmentedStore.open(cfg(d)) as s:
        fill(s, before)
        first = s.end_index + 1
        s.append_leader([bytes([i % 251]) * n for i, n in enumerate(sizes)], term=2)
        for index in range(first, s.end_index + 1):
            for max_bytes, max_count in limits:
                s._last_batch = None
                fresh = s.read_batch(index, max_bytes, max_count)
                kept, s._fresh, s._last_batch = s._fresh, None, None
                disk = s.read_batch(index, max_bytes, max_count)
                s._fresh = kept
                assert isinstance(fresh.raw, memoryview) and isinstance(disk.raw, bytes)
                assert 1 <= fresh.count <= disk.count and fresh.term_runs == disk.term_runs[:1] == ((index, 2),)
                assert bytes(fresh.raw) == disk.raw[:len(fresh.raw)]
                assert len(list(E.iter_batch(fresh))) == fresh.count
                if fresh.count < disk.count:  # stopped where the segment ends
                    assert s.pos_of(fresh.last_index + 1) // DATA_SEG != s.pos_of(index) // DATA_SEG
        if s.end_index > first:
            s.truncate_from(s.end_index)
            assert s._fresh is None and isinstance(s.read_batch(first, 10**6, 100).raw, bytes)
