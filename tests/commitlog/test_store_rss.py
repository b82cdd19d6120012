# The store's read maps do not keep the whole log resident: pages more
# than RELEASE_KEEP behind the end are unmapped every RELEASE_STEP bytes
# written, and reads of old entries still return their bytes (faulted back
# in from the page cache).  Resident sizes come from /proc/self/smaps.
import os

import pytest

from commitlog import store as store_mod
from commitlog.store import SegmentedStore, StoreConfig
from tests.helpers.resident import resident_kib, resident_maps

SEG = 1 << 20
BODY = 60_000


def body(i: int) -> bytes:
    return (i.to_bytes(4, "big") * (BODY // 4))[:BODY]


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="resident sizes are read from /proc/self/smaps")
def test_read_maps_release_what_is_far_behind_the_end(tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "RELEASE_STEP", 4 * SEG)
    monkeypatch.setattr(store_mod, "RELEASE_KEEP", 2 * SEG)
    cfg = StoreConfig(root=str(tmp_path), self_id="n0", data_segment_size=SEG, index_segment_size=32 * 1024)
    data_dir = os.path.join(cfg.store_dir, "data")
    with SegmentedStore.open(cfg) as s:
        n = 0
        while s.end_pos < 3 * SEG:  # below the first step: nothing released yet
            s.append_leader([body(n)], term=1)
            n += 1
        for i in range(n):
            assert bytes(s.get(i).body) == body(i)  # maps every data segment so far
        before = resident_kib(data_dir)
        assert before >= 2 * SEG // 1024  # the reads made the pages resident
        while s.end_pos < 4 * SEG + BODY:
            s.append_leader([body(n)], term=1)
            n += 1
        after = resident_kib(data_dir)
        # Everything more than 2 segments behind the end was unmapped.
        assert after <= 3 * SEG // 1024 < before, resident_maps(data_dir)
        for i in range(n):
            assert bytes(s.get(i).body) == body(i)  # and still reads back
