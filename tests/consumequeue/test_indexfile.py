import os
import struct

import pytest

from consumequeue.errors import InconsistentStateError
from consumequeue.indexfile import (
    DEFAULT_INDEX_NUM,
    DEFAULT_SLOT_NUM,
    IndexFile,
    IndexService,
    index_file_size,
    key_hash,
    time_name,
)

T0 = 1_700_000_000_123


def small(tmp_path, index_num=6, slot_num=7, clock=None):
    ticks = iter(range(10**9))
    return IndexService(str(tmp_path), slot_num=slot_num, index_num=index_num,
                        clock_ms=clock or (lambda: T0 + next(ticks) * 1000)).load()


def test_golden_slot_item_and_header(tmp_path):
    svc = IndexService(str(tmp_path), clock_ms=lambda: T0).load()
    svc.put_key("T", "key1", 1000, T0)
    (f,) = svc.files
    assert os.path.getsize(f.path) == 420_000_040 == index_file_size(DEFAULT_SLOT_NUM, DEFAULT_INDEX_NUM)
    assert f.name == time_name(T0) and len(f.name) == 17
    assert key_hash("T#key1") == 1854506879 and 1854506879 % 5_000_000 == 4506879  # spec §3
    raw = f.mm
    assert struct.unpack_from(">i", raw, 40 + 4506879 * 4)[0] == 1
    item = 40 + 5_000_000 * 4 + 1 * 20
    assert raw[item:item + 20].hex() == "6e89877f" "00000000000003e8" "00000000" "00000000"
    assert raw[0:40].hex() == ("0000018bcfe5687b" "0000018bcfe5687b" "00000000000003e8"
                               "00000000000003e8" "00000001" "00000002")
    assert svc.query("T", "key1", 10, 0, T0 + 1).phy_offsets == [1000]


def test_chain_and_time_diff(tmp_path):
    svc = small(tmp_path, index_num=100, slot_num=1)  # one slot: every key chains
    svc.put_key("T", "a", 100, T0)
    svc.put_key("T", "b", 200, T0 + 2500)
    svc.put_key("T", "a", 300, T0 + 61_000)
    f = svc.files[0]
    assert [f.item(i).prev_index for i in (1, 2, 3)] == [0, 1, 2]
    assert [f.item(i).time_diff for i in (1, 2, 3)] == [0, 2, 61]
    assert f.slot(0) == 3 and f.header.hash_slot_count == 1 and f.header.index_count == 4
    assert svc.query("T", "a", 10, 0, T0 + 10**6).phy_offsets == [300, 100]
    assert svc.query("T", "a", 10, T0 + 1000, T0 + 10**6).phy_offsets == [300]
    assert svc.query("T", "a", 1, 0, T0 + 10**6).phy_offsets == [300]
    assert svc.query("T", "zzz", 10, 0, T0 + 10**6).phy_offsets == []


def test_rotation_when_full_and_newest_first(tmp_path):
    svc = small(tmp_path, index_num=4)  # items 1..3 per file
    for i in range(7):
        svc.put_key("T", "k", 1000 + i, T0 + i * 5000)
    assert [f.header.index_count for f in svc.files] == [4, 4, 2]
    names = [f.name for f in svc.files]
    assert names == sorted(names) and len(set(names)) == 3
    second = svc.files[1]
    # A new file starts at the previous file's end; its first item's timeDiff
    # is taken against that inherited begin (RocketMQ's quirk).
    assert second.item(1).time_diff == 5 and second.header.begin_phy_offset == 1003
    assert svc.query("T", "k", 100, 0, T0 + 10**6).phy_offsets == [1006, 1005, 1004, 1003, 1002, 1001, 1000]
    assert svc.query("T", "k", 2, 0, T0 + 10**6).phy_offsets == [1006, 1005]
    # From T0+20s: file 1 begins earlier, so the walk stops after it.  1003
    # was stored at T0+15s but reads back as T0+20s through the quirk above.
    res = svc.query("T", "k", 100, T0 + 20_000, T0 + 10**6)
    assert res.phy_offsets == [1006, 1005, 1004, 1003]
    assert (res.index_last_update_timestamp, res.index_last_update_phy_offset) == (T0 + 30_000, 1006)
    svc.close()
    again = small(tmp_path, index_num=4)
    assert [f.header.index_count for f in again.files] == [4, 4, 2]


def test_query_is_capped_at_64(tmp_path):
    svc = small(tmp_path, index_num=200, slot_num=11)
    for i in range(100):
        svc.put_key("T", "same", 100 + i, T0)
    assert len(svc.query("T", "same", 1000, 0, T0 + 1).phy_offsets) == 64


def build(svc, n, keys_per=2):
    for i in range(n):
        for k in range(keys_per):
            svc.put_key("T", f"k{(i * 7 + k) % 5}", 100 * (i + 1), T0 + i * 1500)


def file_bytes(svc):
    return [bytes(f.mm) for f in svc.files]


def test_truncate_equals_clean_build(tmp_path):
    full = small(tmp_path / "full", index_num=9)
    build(full, 20)
    clean = small(tmp_path / "clean", index_num=9)
    build(clean, 11)  # 4 messages per file: the cut falls inside the third file
    ts_of = {100 * (i + 1): T0 + i * 1500 for i in range(20)}.__getitem__
    removed = full.truncate_phy(100 * 12, ts_of)
    assert removed == 18
    assert file_bytes(full) == file_bytes(clean)
    assert len(os.listdir(tmp_path / "full" / "index")) == len(clean.files) == 3
    # ... and re-indexing continues exactly like the clean build.
    build_tail = lambda svc: [svc.put_key("T", f"k{(i * 7 + k) % 5}", 100 * (i + 1), T0 + i * 1500)  # noqa: E731
                              for i in range(11, 20) for k in range(2)]
    build_tail(full)
    build_tail(clean)
    assert file_bytes(full) == file_bytes(clean)


def test_repair_undoes_items_beyond_the_header(tmp_path):
    svc = small(tmp_path, index_num=50)
    build(svc, 5)
    expected = file_bytes(svc)
    f = svc.files[0]
    saved_header = bytes(f.mm[:40])
    build(svc, 3)  # simulate a crash: items and slots written, header not
    svc.files[0].mm[:40] = saved_header
    svc.close()
    again = small(tmp_path, index_num=50)
    assert file_bytes(again) == expected


def test_wrong_file_size_is_refused(tmp_path):
    svc = small(tmp_path)
    svc.put_key("T", "a", 1, T0)
    svc.close()
    with pytest.raises(InconsistentStateError, match="bytes"):  # typed: the dispatcher rebuilds the index
        IndexService(str(tmp_path), slot_num=8, index_num=6).load()


def test_delete_expired(tmp_path):
    svc = small(tmp_path, index_num=3)
    for i in range(6):
        svc.put_key("T", "k", 100 + i, T0)
    assert len(svc.files) == 3
    assert svc.delete_expired(102) == 1  # file 0 ends at 101
    assert svc.delete_expired(10**9) == 1  # never the last file
    assert len(svc.files) == 1 and isinstance(svc.files[0], IndexFile)


def test_rolling_defers_directory_fsync_to_flush(tmp_path, monkeypatch):
    # The dispatcher rolls index files on the event loop: creating one must
    # note its directory for the next flush/checkpoint, not fsync it there.
    import consumequeue.files as files_mod
    import consumequeue.indexfile as indexfile_mod

    synced = []
    monkeypatch.setattr(indexfile_mod, "fsync_dir", synced.append)
    monkeypatch.setattr(files_mod, "fsync_dir", synced.append)
    svc = small(tmp_path, index_num=4)
    for i in range(7):  # three files
        svc.put_key("T", "k", 1000 + i, T0 + i * 5000)
    assert len(svc.files) == 3 and synced == []
    assert svc.dirty_dirs == {svc.dir, str(tmp_path)}
    svc.flush()
    assert synced == [svc.dir, str(tmp_path)] and svc.dirty_dirs == set()
    svc.close()
    assert [f.header.index_count for f in small(tmp_path, index_num=4).files] == [4, 4, 2]
