# The node's retention timer: age-based deletion only in the deleteWhen
# hours, disk-pressure deletion at any hour, never beyond the committed index.
import os
import time

from commitlog.retention import retention_pass
from commitlog.store import SegmentedStore, StoreConfig


def filled_store(tmp_path, committed_fraction=1.0):
    store = SegmentedStore.open(StoreConfig(str(tmp_path), data_segment_size=64 * 1024,
                                            index_segment_size=4096, file_reserved_hours=1))
    for _ in range(20):
        store.append_leader([b"x" * 1000] * 10, term=1)
    store.set_committed(int(store.end_index * committed_fraction))
    old = min(at_hour(4), at_hour(13)) - 3 * 3600  # older than 1 h at both simulated times
    data_dir = os.path.join(store.store_dir, "data")
    for name in os.listdir(data_dir):
        os.utime(os.path.join(data_dir, name), (old, old))
    return store


def at_hour(hour: int) -> float:
    t = time.localtime()
    return time.mktime((t.tm_year, t.tm_mon, t.tm_mday, hour, 30, 0, 0, 0, -1))


def test_age_based_deletion_waits_for_delete_when_hours(tmp_path):
    store = filled_store(tmp_path)
    assert retention_pass(store, (4,), 0.75, now=at_hour(13), used_ratio=0.1) == []
    assert store.begin_index == 0
    deleted = retention_pass(store, (4,), 0.75, now=at_hour(4), used_ratio=0.1)
    assert deleted and store.begin_index > 0
    store.close()


def test_disk_pressure_deletes_at_any_hour_but_never_uncommitted(tmp_path):
    store = filled_store(tmp_path, committed_fraction=0.5)
    committed = store.committed_index
    deleted = retention_pass(store, (4,), 0.75, now=at_hour(13), used_ratio=0.9)
    assert deleted and 0 < store.begin_index <= committed + 1
    assert store.get(store.end_index).body == b"x" * 1000
    store.close()


def test_retention_floor_keeps_what_an_owner_still_needs(tmp_path):
    store = filled_store(tmp_path)
    floor = 150  # e.g. the metadata snapshot's applied index (about the third segment)
    store.add_retention_floor(lambda: floor)
    retention_pass(store, (4,), 0.75, now=at_hour(13), used_ratio=0.99)
    assert 0 < store.begin_index <= floor < store.committed_index  # without the floor it would go further
    assert store.get(floor).index == floor
    store.close()
