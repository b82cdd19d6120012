# Retention: whole head segments only, by age and by disk ratio, never the
# end segment or uncommitted entries; reads below the new begin fail clearly.
import os
import time

import pytest

from commitlog.errors import IndexBelowBeginError
from commitlog.retention import disk_used_ratio
from commitlog.scan import verify_store
from commitlog.store import SegmentedStore
from tests.commitlog.store_helpers import DATA_SEG, INDEX_SEG, body, cfg, fill, replicate

HOUR_MS = 3600 * 1000


def _age(store, count, hours):
    """Make the first `count` data segments `hours` old."""
    t = time.time() - hours * 3600
    for seg in store.data.segments[:count]:
        os.utime(seg.path, (t, t))


def _segment_first_indexes(store):
    return [next(i for i in range(store.begin_index, store.end_index + 1) if store.pos_of(i) >= seg.start)
            for seg in store.data.segments]


def test_age_based_retention_deletes_whole_old_segments(tmp_path):
    with SegmentedStore.open(cfg(tmp_path, file_reserved_hours=72)) as s:
        fill(s, 80)
        s.set_committed(s.end_index)
        firsts = _segment_first_indexes(s)
        assert len(firsts) >= 6
        now = int(time.time() * 1000)
        assert s.delete_expired(now, disk_used_ratio=0.1) == []  # nothing is old
        _age(s, 3, 100)
        deleted = s.delete_expired(now, disk_used_ratio=0.1)
        data_deleted = [p for p in deleted if "/data/" in p]
        assert [os.path.basename(p) for p in data_deleted] == [f"{k * DATA_SEG:020d}" for k in range(3)]
        assert s.begin_index == firsts[3]
        # index files wholly below the new begin went too, the one holding it stayed
        index_deleted = [int(os.path.basename(p)) for p in deleted if "/index/" in p]
        assert index_deleted == [k * INDEX_SEG for k in range(firsts[3] * 32 // INDEX_SEG)]
        with pytest.raises(IndexBelowBeginError, match=f"below ledgerBeginIndex {firsts[3]}"):
            s.get(firsts[3] - 1)
        assert bytes(s.get(firsts[3]).body) == body(firsts[3])
        with pytest.raises(IndexBelowBeginError):
            s.read_batch(0, 1000, 10)
    with SegmentedStore.open(cfg(tmp_path)) as s:
        assert s.begin_index == firsts[3] and s.end_index == 79
        assert s.committed_index == 79
    summary = verify_store(os.path.join(tmp_path, "dledger-n0"))
    assert summary.problems == [] and summary.first_index == firsts[3]


def test_retention_keeps_uncommitted_and_end_segments(tmp_path):
    with SegmentedStore.open(cfg(tmp_path)) as s:
        fill(s, 60)
        firsts = _segment_first_indexes(s)
        now = int(time.time() * 1000)
        _age(s, len(s.data.segments), 1000)
        s.set_committed(firsts[2])  # segment 1 fully committed, segment 2 only partly
        deleted = [p for p in s.delete_expired(now, disk_used_ratio=0.1) if "/data/" in p]
        assert len(deleted) == 2 and s.begin_index == firsts[2]
        s.set_committed(s.end_index)
        s.delete_expired(now, disk_used_ratio=0.1)
        assert len(s.data.segments) == 1 and s.data.segments[0].start == s.pos_of(s.end_index) // DATA_SEG * DATA_SEG
        assert s.begin_index == firsts[-1]
        fill(s, 5)  # the log goes on
        assert s.end_index == 64


def test_disk_ratio_deletes_oldest_first_regardless_of_age(tmp_path):
    with SegmentedStore.open(cfg(tmp_path, disk_max_used_ratio=0.75)) as s:
        fill(s, 60)
        s.set_committed(s.end_index)
        now = int(time.time() * 1000)
        n = len(s.data.segments)
        assert s.delete_expired(now, disk_used_ratio=0.5) == []
        # Tiny segments free almost nothing, so every eligible segment goes.
        deleted = [p for p in s.delete_expired(now, disk_used_ratio=0.9) if "/data/" in p]
        assert len(deleted) == n - 1
    assert 0.0 <= disk_used_ratio(str(tmp_path)) <= 1.0


def test_boundary_entry_stays_answerable_after_retention_and_reset(tmp_path):
    """Raft checks the `prev` of a push starting at begin_index against
    term_at/chain_crc_at(begin_index - 1), so the boundary survives
    retention, reset_to and restarts."""
    with SegmentedStore.open(cfg(tmp_path, "n0")) as leader, SegmentedStore.open(cfg(tmp_path, "n1")) as f:
        assert (f.term_at(-1), f.chain_crc_at(-1)) == (-1, 0)  # the virtual entry of a fresh log
        fill(leader, 30, term=2)
        fill(leader, 30, term=3)
        assert (leader.term_at(-1), leader.chain_crc_at(-1)) == (-1, 0)
        k = 13
        f.reset_to(k, leader.pos_of(k), leader.term_at(k - 1), leader.chain_crc_at(k - 1))
        replicate(leader, f)
        f.set_committed(f.end_index)
        _age(f, 3, 1000)
        f.delete_expired(int(time.time() * 1000), disk_used_ratio=0.1)
        begin = f.begin_index
        assert begin > k
        expected = (leader.term_at(begin - 1), leader.chain_crc_at(begin - 1))
        assert (f.term_at(begin - 1), f.chain_crc_at(begin - 1)) == expected
        with pytest.raises(IndexBelowBeginError):
            f.term_at(begin - 2)
        assert f.read_batch(begin, 10**6, 5).first_index == begin  # chain checked against the boundary
    with SegmentedStore.open(cfg(tmp_path, "n1")) as f:
        assert (f.begin_index, f.end_index) == (begin, 59)
        assert (f.term_at(begin - 1), f.chain_crc_at(begin - 1)) == expected
    summary = verify_store(os.path.join(tmp_path, "dledger-n1"))
    assert summary.problems == [] and summary.first_index == begin


def test_recovery_finishes_an_interrupted_retention(tmp_path):
    from commitlog.metafiles import StoreBase, write_base

    with SegmentedStore.open(cfg(tmp_path)) as s:
        fill(s, 60)
        s.set_committed(59)
        firsts = _segment_first_indexes(s)
        begin = firsts[3]
        boundary = StoreBase(index=begin, pos=s.pos_of(begin), prev_term=s.term_at(begin - 1),
                             prev_chain_crc=s.chain_crc_at(begin - 1))
    # Retention wrote the boundary, then the process died before deleting anything.
    write_base(os.path.join(tmp_path, "dledger-n0"), boundary)
    with SegmentedStore.open(cfg(tmp_path)) as s:
        assert s.begin_index == begin and len(s.recovery.deleted_files) >= 3
        assert s.data.first.start == boundary.pos
        assert (s.term_at(begin - 1), s.chain_crc_at(begin - 1)) == (boundary.prev_term, boundary.prev_chain_crc)
        assert bytes(s.get(begin).body) == body(begin)
