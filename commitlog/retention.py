# Owns retention of the segmented store (DLedger's CleanSpaceService, spec
# §5.3/§6.2): whole data segments at the head of the log are deleted when
# they are older than fileReservedHours (file mtime) or, oldest first, while
# the disk is fuller than diskMaxUsedSpaceRatio.  A segment goes only when
# every entry in it is committed, it does not hold the log's end, and no
# registered retention floor (metadata snapshot, ...) still needs it; index
# segments wholly below the new ledgerBeginIndex follow.
#
# Crash order: first the new boundary (begin index, its position, and the
# term and chainCrc of the entry just below it, which Raft still needs) is
# written to ledgermq-base, then the data files are deleted, then the index
# files.  Recovery finishes an interrupted deletion from the boundary record.
#
# When: retention_pass applies RocketMQ's timing rule (expired segments go
# only during the deleteWhen hours, so deletion I/O stays off peak; a disk
# fuller than diskMaxUsedSpaceRatio is relieved at any hour), and
# serve_retention is the one timer that runs a pass every few seconds, for
# a log node and for a broker alike.
import logging
import os
import time
from collections.abc import Callable

import trio

from commitlog.atomicfile import fsync_dir
from commitlog.entry import HEADER
from commitlog.entry import INDEX_UNIT_SIZE as UNIT
from commitlog.metafiles import StoreBase

log = logging.getLogger("ledgermq.retention")

RETENTION_CHECK_SECONDS = 10.0


def retention_due(now: float, delete_when: tuple[int, ...], used_ratio: float, max_used_ratio: float) -> bool:
    """RocketMQ's rule: during the deleteWhen hours (local time, "04" by
    default), or at any hour while the disk is fuller than the ratio."""
    return time.localtime(now).tm_hour in delete_when or used_ratio >= max_used_ratio


def retention_pass(store, delete_when: tuple[int, ...], max_used_ratio: float,
                   now: float | None = None, used_ratio: float | None = None) -> list[str]:
    """One retention decision for a segmented store: segments older than
    fileReservedHours, or the oldest committed ones while the disk is too
    full, when retention_due says so.  Returns the deleted paths."""
    now = time.time() if now is None else now
    ratio = disk_used_ratio(store.store_dir) if used_ratio is None else used_ratio
    if not retention_due(now, delete_when, ratio, max_used_ratio):
        return []
    deleted = store.delete_expired(int(now * 1000), ratio)
    if deleted:
        log.info("retention deleted %d files; ledgerBeginIndex is now %d", len(deleted), store.begin_index)
    return deleted


async def serve_retention(run_pass: Callable[[], object], *, interval: float = RETENTION_CHECK_SECONDS,
                          task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A timer (DLedger's CleanSpaceService), not a poll of state: one
    run_pass() every `interval` seconds until cancelled."""
    task_status.started()
    while True:
        run_pass()
        await trio.sleep(interval)


def disk_used_ratio(path: str) -> float:
    """Used fraction of the file system holding `path` (as RocketMQ's
    getDiskPartitionSpaceUsedPercent computes it)."""
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    return 0.0 if total == 0 else (total - st.f_bfree * st.f_frsize) / total


def _first_index(seg) -> int:
    return HEADER.unpack_from(seg.view(), 0)[2]


def delete_expired(store, now_ms: int, disk_used_ratio_now: float | None = None) -> list[str]:
    """Delete expired head segments of `store`; returns the deleted paths
    (data, then index).  `disk_used_ratio_now` overrides the measurement
    (tests, or a caller that measured already)."""
    cfg = store.cfg
    data = store.data
    ratio = disk_used_ratio(data.directory) if disk_used_ratio_now is None else disk_used_ratio_now
    fs = os.statvfs(data.directory)
    fs_bytes = max(1, fs.f_blocks * fs.f_frsize)
    expire_before_ms = now_ms - cfg.file_reserved_hours * 3600 * 1000
    segs = data.segments
    floor = store.retention_floor()
    doomed = []
    while len(doomed) + 1 < len(segs):
        head, after = segs[len(doomed)], segs[len(doomed) + 1]
        if store.end_pos <= after.start or _first_index(after) - 1 > store.committed_index:
            break  # head holds the end, or an uncommitted entry
        if floor is not None and _first_index(after) > floor:
            break  # head holds an entry someone still needs (retention floor)
        st = os.stat(head.path)
        old = st.st_mtime * 1000 < expire_before_ms
        full = ratio > cfg.disk_max_used_ratio
        if not (old or full):
            break
        doomed.append(head)
        ratio -= st.st_blocks * 512 / fs_bytes
    if not doomed:
        return []
    new_head = segs[len(doomed)]
    begin = _first_index(new_head)
    store._set_boundary(StoreBase(index=begin, pos=new_head.start, prev_term=store.term_at(begin - 1),
                                  prev_chain_crc=store.chain_crc_at(begin - 1)))
    deleted = [data.remove(seg, sync=False) for seg in doomed]
    fsync_dir(data.directory)
    for seg in list(store.index.segments):
        if seg.end <= begin * UNIT:
            deleted.append(store.index.remove(seg))
    store._retention_done(begin)
    return deleted
