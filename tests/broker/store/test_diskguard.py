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


def test_reserve_check_trusts_a_roomy_measurement_for_the_interval_only():
    disk, now = FakeDisk(free=5 << 30), [0.0]
    g = guard(disk, now)
    g.check_reserve()
    g.check_reserve()                        # > 1 GiB above the reserve: trusted for the interval
    assert disk.calls == 1
    disk.free = 10
    now[0] += g.interval                     # measured again once it is over
    with pytest.raises(DiskFullError):
        g.check_reserve()
    with pytest.raises(DiskFullError):       # near (or below) the reserve: every call measures
        g.check_reserve()
    assert disk.calls == 3
    disk.free = 2000                         # freed: the next round writes again
    g.check_reserve()
    g.check_reserve()
    assert disk.calls == 5
