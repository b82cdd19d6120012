# Owns the broker's disk-space rule for writes (RocketMQ's DISK_FULL running
# flag): a write is refused with DiskFullError while the file system holding
# the store is used at or above diskMaxUsedSpaceRatio, or has less than
# `reserve_bytes` free.  The reserve is what already accepted work still
# needs after the last accepted write -- consume queue and index units, the
# dispatch checkpoint, metadata snapshots, the next term/vote -- so that a
# disk that fills up stops new writes before anything acknowledged is put at
# risk; reads and replication of what the store holds go on.
#
# Replication asks only for the reserve (check_reserve, wired into the
# replica as its space_check): a follower or leader below it writes and
# acknowledges nothing, instead of filling the last bytes and then failing
# a consume queue or index write; the ratio alone never stops replication.
#
# The file system is measured on demand (statvfs, a few microseconds), at
# most every `interval` seconds while it has room (for check_reserve: while
# it has more than REMEASURE_ROOM above the reserve), and at every check
# while it is refusing or near the reserve, so freed space reopens writes
# with the next request.  The
# role gate asks it before every write (gate.check_writable), so sends,
# send-backs, delay-level deliveries, metadata and offset commits are all
# refused the same way: SERVICE_NOT_AVAILABLE with a remark that names the
# disk.
import logging
import os
import time
from collections.abc import Callable

import attrs

from commitlog.errors import DiskFullError

log = logging.getLogger("ledgermq.disk")

DEFAULT_RESERVE = 8 * 1024 * 1024
DEFAULT_INTERVAL = 0.1
REMEASURE_ROOM = 1 << 30  # free bytes above the reserve that check_reserve trusts for `interval`


@attrs.define(eq=False)
class DiskGuard:
    path: str
    max_used_ratio: float                  # diskMaxUsedSpaceRatio / 100
    reserve_bytes: int = DEFAULT_RESERVE
    interval: float = DEFAULT_INTERVAL
    clock: Callable[[], float] = time.monotonic
    statvfs: Callable[[str], os.statvfs_result] = os.statvfs   # injectable: tests script the file system
    _checked_at: float | None = None
    _full: DiskFullError | None = None
    _roomy_until: float | None = None  # check_reserve: room measured until then
    refusals: int = 0

    def usage(self) -> tuple[float, int]:
        """(used ratio, free bytes for this process) of the store's file system."""
        st = self.statvfs(self.path)
        total = st.f_blocks * st.f_frsize
        free = st.f_bavail * st.f_frsize
        used = total - st.f_bfree * st.f_frsize
        return (used / total if total else 1.0), free

    def check_reserve(self) -> None:
        """Raise DiskFullError when less than the reserve is free (the rule
        for replication, which the ratio never stops).  It runs once per
        replication round that writes -- once per message with one send in
        flight -- so a measurement that found more than REMEASURE_ROOM
        above the reserve is trusted for `interval` seconds (nothing this
        process writes in a round comes near that much); nearer the
        reserve, every call measures."""
        now = self.clock()
        if self._roomy_until is not None and now < self._roomy_until:
            return
        try:
            ratio, free = self.usage()
        except OSError:
            return
        self._roomy_until = now + self.interval if free >= self.reserve_bytes + REMEASURE_ROOM else None
        if free < self.reserve_bytes:
            raise DiskFullError(self.path, ratio)

    def check(self) -> None:
        """Raise DiskFullError while writes must be refused."""
        now = self.clock()
        if self._full is None and self._checked_at is not None and now - self._checked_at < self.interval:
            return
        self._checked_at = now
        try:
            ratio, free = self.usage()
        except OSError as exc:  # the store directory is gone or unreadable: let the write fail on its own
            log.warning("cannot measure the disk holding %s: %s", self.path, exc)
            return
        full = None
        if ratio >= self.max_used_ratio or free < self.reserve_bytes:
            full = DiskFullError(self.path, ratio)
        if (full is None) != (self._full is None):
            if full is not None:
                log.error("disk holding %s is %.1f%% used (%d bytes free; limit %.0f%%, reserve %d): refusing "
                          "writes until space is freed", self.path, ratio * 100, free, self.max_used_ratio * 100,
                          self.reserve_bytes)
            else:
                log.warning("disk holding %s has room again (%.1f%% used, %d bytes free): accepting writes",
                            self.path, ratio * 100, free)
        self._full = full
        if full is not None:
            self.refusals += 1
            raise full
