# Recovery at open after damage done to real files: torn and corrupt tails
# are cut (files end up byte-identical to a fresh write of the surviving
# prefix), middle corruption stops the open with the file and offset unless
# repair is set, index files are rebuilt from the data.
import os
import struct

import pytest

from commitlog import metafiles
from commitlog.errors import CorruptStoreError
from commitlog.scan import verify_store
from commitlog.store import SegmentedStore
from tests.commitlog.store_helpers import DATA_SEG, INDEX_SEG, body, cfg, fill, snapshot

N = 60


@pytest.fixture
def built(tmp_path):
    """A cleanly closed store of N entries; returns (positions, sizes)."""
    with SegmentedStore.open(cfg(tmp_path)) as s:
        fill(s, N)
        s.set_committed(N - 1)
        positions = [s.pos_of(i) for i in range(N)]
        sizes = [s.get(i).size for i in range(N)]
    return positions, sizes


def reference(tmp_path, count):
    """Files of a fresh store holding entries 0..count-1."""
    with SegmentedStore.open(cfg(tmp_path, "ref")) as ref:
        fill(ref, count)
    return snapshot(ref.store_dir)


def file_of(pos):
    return os.path.join("data", f"{pos // DATA_SEG * DATA_SEG:020d}")


def patch(tmp_path, pos, data):
    with open(os.path.join(tmp_path, "dledger-n0", file_of(pos)), "r+b") as f:
        f.seek(pos % DATA_SEG)
        f.write(data)


def reopen(tmp_path, **kw):
    return SegmentedStore.open(cfg(tmp_path, **kw))


def check_cut(tmp_path, expected_end):
    """Reopen, expect the log to end at expected_end with files identical to
    a fresh write, and the store to keep working."""
    with reopen(tmp_path) as s:
        assert s.end_index == expected_end
        assert s.committed_index == expected_end  # the checkpoint said N-1; clamped
        assert [bytes(s.get(i).body) for i in range(expected_end + 1)] == [body(i) for i in range(expected_end + 1)]
        report = s.recovery
    assert snapshot(os.path.join(tmp_path, "dledger-n0")) == reference(tmp_path, expected_end + 1)
    with reopen(tmp_path) as s:
        assert s.recovery.cut_at is None and s.recovery.index_units_rewritten == 0
        fill(s, 3)
        assert s.end_index == expected_end + 3
    assert verify_store(os.path.join(tmp_path, "dledger-n0")).problems == []
    return report


def test_clean_shutdown_changes_nothing(tmp_path, built):
    before = snapshot(os.path.join(tmp_path, "dledger-n0"))
    mtimes = {p: os.stat(os.path.join(tmp_path, "dledger-n0", p)).st_mtime_ns for p in before}
    with reopen(tmp_path) as s:
        assert (s.begin_index, s.end_index, s.committed_index) == (0, N - 1, N - 1)
        assert s.recovery.cut_at is None and s.recovery.deleted_files == []
        assert s.recovery.entries_scanned > 0 and s.recovery.index_units_rewritten == 0
    assert snapshot(os.path.join(tmp_path, "dledger-n0")) == before
    assert mtimes == {p: os.stat(os.path.join(tmp_path, "dledger-n0", p)).st_mtime_ns for p in before}


def test_truncated_last_file_mid_entry(tmp_path, built):
    positions, sizes = built
    victim = N - 4  # cut the last file inside this entry
    path = os.path.join(tmp_path, "dledger-n0", file_of(positions[victim]))
    os.truncate(path, positions[victim] % DATA_SEG + 30)
    report = check_cut(tmp_path, victim - 1)
    assert report.extended_files == [path] and "torn" in report.cut_at[2]


def test_truncated_last_file_at_an_entry_boundary(tmp_path, built):
    positions, _ = built
    path = os.path.join(tmp_path, "dledger-n0", file_of(positions[N - 2]))
    os.truncate(path, positions[N - 2] % DATA_SEG)
    report = check_cut(tmp_path, N - 3)
    assert report.extended_files == [path]


@pytest.mark.parametrize("where", ["entry_start", "mid_body"])
def test_zeroed_tail(tmp_path, built, where):
    positions, _ = built
    victim = N - 3
    at = positions[victim] + (0 if where == "entry_start" else 60)
    patch(tmp_path, at, bytes(DATA_SEG - at % DATA_SEG))
    check_cut(tmp_path, victim - 1)


def test_flipped_byte_in_the_last_entry(tmp_path, built):
    positions, sizes = built
    patch(tmp_path, positions[N - 1] + 48 + sizes[N - 1] // 3 - 16, b"\xee")
    report = check_cut(tmp_path, N - 2)
    assert "mismatch" in report.cut_at[2] and not report.repaired


@pytest.mark.parametrize("field,offset,value", [("body", 50, b"\xee"), ("size", 4, struct.pack(">i", 99)),
                                                ("magic", 0, struct.pack(">i", 7))])
def test_corrupt_entry_in_the_middle_stops_the_open(tmp_path, built, field, offset, value):
    positions, _ = built
    victim = N - 6
    patch(tmp_path, positions[victim] + offset, value)
    before = snapshot(os.path.join(tmp_path, "dledger-n0"))
    with pytest.raises(CorruptStoreError) as info:
        reopen(tmp_path)
    err = info.value
    assert err.path == os.path.join(tmp_path, "dledger-n0", file_of(positions[victim]))
    assert err.offset == positions[victim] % DATA_SEG
    assert "intact entries follow" in err.reason and str(err).startswith(err.path)
    assert snapshot(os.path.join(tmp_path, "dledger-n0")) == before  # nothing was cut
    with reopen(tmp_path, repair=True) as s:
        assert s.end_index == victim - 1 and s.recovery.repaired
    assert snapshot(os.path.join(tmp_path, "dledger-n0")) == reference(tmp_path, victim)


def test_deleted_last_data_files_lower_the_end(tmp_path, built):
    positions, _ = built
    starts = sorted({p // DATA_SEG for p in positions})
    assert len(starts) >= 5
    for k in starts[-2:]:
        os.unlink(os.path.join(tmp_path, "dledger-n0", "data", f"{k * DATA_SEG:020d}"))
    survivors = [i for i, p in enumerate(positions) if p // DATA_SEG < starts[-2]]
    with reopen(tmp_path) as s:
        assert s.end_index == survivors[-1]
        # The last file ended in a blank filler for a lost entry: it is cut too.
        assert s.end_pos == positions[survivors[-1]] + s.get(survivors[-1]).size < starts[-2] * DATA_SEG
        assert s.recovery.deleted_files  # index files above the end went away
    check_cut(tmp_path, survivors[-1])


@pytest.mark.parametrize("which", ["all", "middle"])
def test_deleted_index_files_are_rebuilt_from_data(tmp_path, built, which):
    before = snapshot(os.path.join(tmp_path, "dledger-n0"))
    index_dir = os.path.join(tmp_path, "dledger-n0", "index")
    names = sorted(os.listdir(index_dir))
    assert len(names) >= 5
    doomed = names if which == "all" else names[1:2]
    for name in doomed:
        os.unlink(os.path.join(index_dir, name))
    with reopen(tmp_path) as s:
        assert s.end_index == N - 1
        assert s.recovery.index_units_rewritten == (N if which == "all" else INDEX_SEG // 32)
        assert bytes(s.get(15).body) == body(15)
    assert snapshot(os.path.join(tmp_path, "dledger-n0")) == before


def test_wrong_index_unit_and_stale_units_after_the_end_are_repaired(tmp_path, built):
    before = snapshot(os.path.join(tmp_path, "dledger-n0"))
    with open(index_path_for(tmp_path, N - 2), "r+b") as f:
        f.seek((N - 2) * 32 % INDEX_SEG + 4)
        f.write(struct.pack(">q", 12345))  # a wrong pos
    with open(index_path_for(tmp_path, N + 3), "wb") as f:  # units after the end
        f.write(b"\x01" * INDEX_SEG)
    with reopen(tmp_path) as s:
        # rebuilt from the first disagreeing unit on, as DLedger does
        assert s.end_index == N - 1 and s.recovery.index_units_rewritten == 2
        assert bytes(s.get(N - 2).body) == body(N - 2)
    assert snapshot(os.path.join(tmp_path, "dledger-n0")) == before


def index_path_for(tmp_path, i):
    return os.path.join(tmp_path, "dledger-n0", "index", f"{i * 32 // INDEX_SEG * INDEX_SEG:020d}")


def test_missing_middle_data_file_is_corruption(tmp_path, built):
    data_dir = os.path.join(tmp_path, "dledger-n0", "data")
    names = sorted(os.listdir(data_dir))
    os.unlink(os.path.join(data_dir, names[2]))
    with pytest.raises(CorruptStoreError, match="missing") as info:
        reopen(tmp_path)
    assert info.value.path == os.path.join(data_dir, names[3])


def test_empty_trailing_file_from_a_crash_is_removed(tmp_path, built):
    positions, _ = built
    nxt = (positions[-1] // DATA_SEG + 1) * DATA_SEG
    with open(os.path.join(tmp_path, "dledger-n0", "data", f"{nxt:020d}"), "wb") as f:
        f.truncate(DATA_SEG)
    check_cut(tmp_path, N - 1)


def test_old_corruption_outside_the_scan_window_is_never_served(tmp_path, built):
    positions, _ = built
    patch(tmp_path, positions[1] + 49, b"\xee")  # first segment; recovery scans only the last three
    with reopen(tmp_path) as s:
        assert s.end_index == N - 1
        with pytest.raises(CorruptStoreError, match="bodyCrc"):
            s.get(1)
        with pytest.raises(CorruptStoreError, match="entry 1: bodyCrc"):
            s.read_batch(0, 10**6, 10)
        assert bytes(s.get(2).body) == body(2)
    problems = verify_store(os.path.join(tmp_path, "dledger-n0")).problems
    assert [(p.file, p.offset) for p in problems][:1] == [(data_path_for(tmp_path, positions[1]), positions[1] % DATA_SEG)]


def data_path_for(tmp_path, pos):
    return os.path.join(tmp_path, "dledger-n0", file_of(pos))


def test_first_entry_lost_with_nothing_after_starts_afresh(tmp_path):
    with SegmentedStore.open(cfg(tmp_path)) as s:
        fill(s, 2)
    patch(tmp_path, 60, b"\xee")  # entry 0's body
    with open(data_path_for(tmp_path, 0), "r+b") as f:  # and entry 1 torn away
        f.truncate(100)
    with reopen(tmp_path) as s:
        assert (s.begin_index, s.end_index, s.end_pos) == (-1, -1, 0)
        fill(s, 1)
        assert s.get(0).pos == 0


def test_committed_is_clamped_and_checkpoint_files_tolerated(tmp_path, built):
    metafiles.write_checkpoint(os.path.join(tmp_path, "dledger-n0"), 500, 400)
    with reopen(tmp_path) as s:
        assert s.committed_index == N - 1


def test_stock_store_with_torn_tail(tmp_path):
    from tests.helpers.stock_dledger import write_stock_store

    placed = write_stock_store(str(tmp_path), [(body(i), 1) for i in range(30)], data_size=DATA_SEG,
                               index_size=INDEX_SEG)
    last_pos = placed[-1][1]
    with open(data_path_for(tmp_path, last_pos), "r+b") as f:
        f.truncate(last_pos % DATA_SEG + 60)  # the last stock entry loses its body's end
    with reopen(tmp_path) as s:
        assert s.end_index == 28 and "torn" in s.recovery.cut_at[2]


def test_short_file_outside_the_scan_window_gives_a_typed_error(tmp_path, built):
    positions, _ = built
    os.truncate(data_path_for(tmp_path, positions[2]), positions[2] % DATA_SEG + 10)
    with reopen(tmp_path) as s:
        assert bytes(s.get(1).body) == body(1)
        with pytest.raises(CorruptStoreError, match="runs past the end of the file"):
            s.get(2)


def test_damaged_first_entry_of_an_old_segment(tmp_path, built):
    positions, _ = built
    patch(tmp_path, 60, b"\xee")  # entry 0, in the first file, outside the scan window
    with pytest.raises(CorruptStoreError, match="first entry of the store is damaged") as info:
        reopen(tmp_path)
    assert info.value.path == data_path_for(tmp_path, 0)
    with reopen(tmp_path, repair=True) as s:  # repair drops the unreadable head file
        second = next(i for i, p in enumerate(positions) if p >= DATA_SEG)
        assert (s.begin_index, s.end_index) == (second, N - 1) and s.recovery.repaired
        assert bytes(s.get(second).body) == body(second)
