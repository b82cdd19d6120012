# DiskGuard (broker/store/diskguard.py) on its rule alone, with statvfs
# replaced by a scripted file system: the ratio and the reserve, the
# measurement cadence while there is room, and every check while full.
import types

import attrs
import pytest

from broker.store.diskguard import DiskGuard
from commitlog.errors import DiskFullError


@attrs.define
class FakeDisk:
    ratio: float = 0.1
    free: int = 10 ** 9
    calls: int = 0


TOTAL = 10 ** 10


def guard(disk: FakeDisk, now: list[float]) -> DiskGuard:
    def statvfs(path):
        assert path == "/store"
        disk.calls += 1
        used = int(disk.ratio * TOTAL)
        return types.SimpleNamespace(f_blocks=TOTAL, f_frsize=1, f_bfree=TOTAL - used, f_bavail=disk.free)
    return DiskGuard("/store", 0.75, reserve_bytes=1000, clock=lambda: now[0], statvfs=statvfs)


def test_ratio_and_reserve_refuse_and_room_reopens():
    disk, now = FakeDisk(), [0.0]
    g = guard(disk, now)
    g.check()
    disk.ratio = 0.75                       # at the ratio, with plenty free
    now[0] += 0.2
    with pytest.raises(DiskFullError) as e:
        g.check()
    assert "/store" in str(e.value) and "full; writes refused" in str(e.value)
    disk.ratio, disk.free = 0.2, 999        # below the reserve, ratio fine
    with pytest.raises(DiskFullError):
        g.check()                            # while full: measured every time
    disk.free = 10 ** 6
    g.check()                                # room again at once
    assert g.refusals == 2


def test_measured_at_most_every_interval_while_there_is_room():
    disk, now = FakeDisk(), [0.0]
    g = guard(disk, now)
    for _ in range(100):
        g.check()
    assert disk.calls == 1
    now[0] += 0.1
    g.check()
    assert disk.calls == 2


def test_reserve_check_ignores_the_ratio():
    disk, now = FakeDisk(ratio=0.99), [0.0]
    g = guard(disk, now)
    g.check_reserve()                        # replication goes on above the ratio
    disk.free = 10
    with pytest.raises(DiskFullError):
        g.check_reserve()
