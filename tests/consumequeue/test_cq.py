import os

import pytest

from consumequeue.cq import CQ_UNIT_SIZE, DEFAULT_FILE_SIZE, PRE_BLANK_UNIT, ConsumeQueueStore, unit_bytes
from consumequeue.errors import BadTopicError
from native import dispatch as D
from native.hashing import java_hash_str


def units(first_phy: int, n: int, size: int = 100, tags: int = 7) -> bytes:
    return b"".join(unit_bytes(first_phy + i * size, size, tags) for i in range(n))


@pytest.fixture(params=["native", "python"])
def backend(request):
    if request.param == "native" and D.NATIVE is None:
        pytest.skip("native helpers not built")
    return D.backend_named(request.param)


def open_store(root, backend, file_size=10 * CQ_UNIT_SIZE):
    return ConsumeQueueStore(str(root), file_size=file_size, backend=backend).load()


def test_unit_golden_bytes():
    # "TagA" -> 2598919 (spec §2); a negative hashCode is sign-extended to i64.
    assert unit_bytes(1000, 146, java_hash_str("TagA")).hex() == "00000000000003e8" "00000092" "000000000027a807"
    assert unit_bytes(48, 146, java_hash_str("polygenelubricants")).hex().endswith("ffffffff80000000")
    assert PRE_BLANK_UNIT.hex() == "0000000000000000" "7fffffff" "0000000000000000"
    assert DEFAULT_FILE_SIZE == 6_000_000


def test_default_file_layout_and_boundary(tmp_path, backend):
    cqs = open_store(tmp_path, backend, DEFAULT_FILE_SIZE)
    cq = cqs.get_or_create("T", 3)
    cq.put_units(299_998, units(48, 4))  # first message not at 0: pre-blank fill
    qdir = tmp_path / "consumequeue" / "T" / "3"
    assert sorted(os.listdir(qdir)) == ["00000000000000000000", "00000000000006000000"]
    assert os.path.getsize(qdir / "00000000000006000000") == 6_000_000
    assert (cq.min_offset, cq.max_offset) == (299_998, 300_002)
    with open(qdir / "00000000000000000000", "rb") as f:
        assert f.read(20) == PRE_BLANK_UNIT
        f.seek(299_998 * 20)
        assert f.read(40) == units(48, 2)
    got = cq.read(299_990, 10)  # clamped to min_offset, crosses the file boundary
    assert [u.offset for u in got] == [299_998, 299_999, 300_000, 300_001]
    assert [u.phy for u in got] == [48, 148, 248, 348]
    cqs.close()
    again = open_store(tmp_path, backend, DEFAULT_FILE_SIZE).get("T", 3)
    assert (again.min_offset, again.max_offset, again.max_phy_end) == (299_998, 300_002, 448)


def test_append_read_and_idempotent_redispatch(tmp_path, backend):
    cqs = open_store(tmp_path, backend)
    cq = cqs.get_or_create("T", 0)
    assert cq.put_units(0, units(48, 25)) == 25
    assert len(cq.starts) == 3 and cq.max_offset == 25
    assert cq.put_units(0, units(48, 25)) == 0  # a re-dispatch writes nothing
    assert cq.put_units(20, units(48 + 2000, 8)) == 3  # overlap: only the new tail
    assert cq.max_offset == 28
    assert cq.read_raw(0, 100) == units(48, 28)
    assert cq.read(26, 1)[0].phy == 48 + 2600


def test_queue_offset_hole_is_filled_with_blanks(tmp_path, backend):
    cq = open_store(tmp_path, backend).get_or_create("T", 0)
    cq.put_units(0, units(48, 2))
    cq.put(5, 1000, 10, 0)
    assert cq.gaps == 3 and cq.max_offset == 6
    assert [u.is_blank for u in cq.read(0, 6)] == [False, False, True, True, True, False]


def test_recover_stops_at_first_invalid_unit_and_cleans_the_tail(tmp_path, backend):
    cqs = open_store(tmp_path, backend)
    cq = cqs.get_or_create("T", 1)
    cq.put_units(0, units(48, 15))
    cqs.close()
    path = tmp_path / "consumequeue" / "T" / "1" / f"{200:020d}"
    with open(path, "r+b") as f:  # a torn unit: size 0, then garbage after it
        f.seek(2 * 20 + 8)
        f.write(b"\0\0\0\0")
    cq = open_store(tmp_path, backend).get("T", 1)
    assert cq.max_offset == 12 and cq.max_phy_end == 48 + 12 * 100
    with open(path, "rb") as f:
        assert f.read()[40:] == bytes(160)  # everything after the valid end is zero


def test_truncate_phy_removes_units_and_files(tmp_path, backend):
    cqs = open_store(tmp_path, backend)
    a = cqs.get_or_create("A", 0)
    b = cqs.get_or_create("B", 0)
    a.put_units(0, units(0 + 48, 25))  # phys 48, 148, ...
    b.put_units(7, units(5000, 3))  # phys 5000.. (pre-blank 0..6)
    removed = cqs.truncate_phy(48 + 12 * 100)  # keeps units with phy < 1248
    assert removed == 13 + 10  # B: 7 pre-blank units and 3 real ones
    assert a.max_offset == 12 and len(a.starts) == 2 and a.max_phy_end == 1248
    assert cqs.get("B", 0) is None  # only pre-blanks were left: gone, like a rebuild
    assert not (tmp_path / "consumequeue" / "B").exists()
    raw = open(tmp_path / "consumequeue" / "A" / "0" / f"{200:020d}", "rb").read()
    assert raw[40:] == bytes(160)
    # A re-dispatch lands exactly where a clean build would.
    a.put_units(12, units(1248, 13))
    assert a.read_raw(0, 100) == units(48, 25)


def test_lookup_by_store_time(tmp_path, backend):
    cq = open_store(tmp_path, backend).get_or_create("T", 0)
    cq.put_units(0, units(100, 9))
    times = {100 + i * 100: 1000 + (i // 3) * 10 for i in range(9)}  # 1000,1000,1000,1010x3,1020x3
    ts_of = lambda phy, size: times[phy]  # noqa: E731
    assert cq.offset_by_time(1010, ts_of) == 3
    assert cq.offset_by_time(1010, ts_of, boundary="upper") == 5
    assert cq.offset_by_time(1005, ts_of) == 3
    assert cq.offset_by_time(1005, ts_of, boundary="upper") == 2
    assert cq.offset_by_time(0, ts_of) == 0
    assert cq.offset_by_time(99999, ts_of) == 9
    assert cq.offset_by_time(0, ts_of, boundary="upper") == 0


def test_delete_expired_and_min_offset(tmp_path, backend):
    cqs = open_store(tmp_path, backend)
    cq = cqs.get_or_create("T", 0)
    cq.put_units(0, units(48, 25))
    assert cq.delete_expired(48 + 10 * 100) == 1  # file 0 ends below: gone
    assert cq.min_offset == 10
    assert cq.delete_expired(48 + 13 * 100) == 0  # file 1 still has live units
    assert cq.min_offset == 13
    assert cq.read(0, 2)[0].offset == 13
    cqs.close()
    assert open_store(tmp_path, backend).get("T", 0).min_offset == 10


def test_bad_topic_names_rejected(tmp_path, backend):
    cqs = open_store(tmp_path, backend)
    for topic in ("", "..", "a/b"):
        with pytest.raises(BadTopicError):
            cqs.get_or_create(topic, 0)


def test_missing_middle_file_is_reported(tmp_path, backend):
    cqs = open_store(tmp_path, backend)
    cqs.get_or_create("T", 0).put_units(0, units(48, 25))
    cqs.close()
    os.unlink(tmp_path / "consumequeue" / "T" / "0" / f"{200:020d}")
    assert "missing file" in " ".join(open_store(tmp_path, backend).problems())
