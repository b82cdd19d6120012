# Flush policies, checkpoints and the trio flusher service.
import time

import pytest
import trio
import trio.testing

from commitlog import metafiles
from commitlog.config import FlushDiskType
from commitlog.flusher import serve_flusher
from commitlog.store import SegmentedStore
from tests.commitlog.store_helpers import cfg, fill
from tests.helpers.waiting import wait_until


def test_sync_flush_is_the_owners_flush_before_acknowledging(tmp_path):
    # SYNC_FLUSH: appends never flush by themselves (the replica shell
    # group-commits one flush per round); the owner flushes before it acks.
    with SegmentedStore.open(cfg(tmp_path, flush_disk_type=FlushDiskType.SYNC_FLUSH)) as s:
        assert s.sync_flush
        for n in range(1, 6):
            fill(s, 3)
            assert s.has_unflushed and s.flush_count == n - 1
            s.flush()
            assert not s.has_unflushed and s.flushed_index == s.end_index == 3 * n - 1
            assert s.flush_count == n
    with SegmentedStore.open(cfg(tmp_path)) as s:
        assert not s.sync_flush


def test_async_policy_leaves_flushing_to_the_caller(tmp_path):
    with SegmentedStore.open(cfg(tmp_path)) as s:
        fill(s, 30)
        assert s.has_unflushed and s.flushed_index == -1 and s.flush_count == 0
        s.flush()
        assert not s.has_unflushed and s.flushed_index == 29 and s.flush_count == 1
        s.flush()  # nothing new: no fdatasync round
        assert s.flush_count == 1


def test_checkpoint_records_flushed_end_and_committed(tmp_path):
    with SegmentedStore.open(cfg(tmp_path)) as s:
        fill(s, 10)
        s.set_committed(6)
        s.write_checkpoint()
        assert metafiles.read_checkpoint(s.store_dir) == (-1, 6)  # nothing flushed yet
        s.flush()
        assert s.checkpoint_stale
        s.write_checkpoint()
        assert metafiles.read_checkpoint(s.store_dir) == (9, 6) and not s.checkpoint_stale
    with SegmentedStore.open(cfg(tmp_path)) as s:
        assert s.committed_index == 6


@pytest.fixture
def lazy_clock():
    """Virtual time that jumps only after 0.3 s of real idleness, so the
    flusher's fdatasync threads (real time) never make timeouts fire."""
    return trio.testing.MockClock(autojump_threshold=0.3)


async def test_flusher_groups_writes_and_sleeps_when_idle(tmp_path, lazy_clock):
    # (200 ms, not 10: the three appends below must land inside one interval
    # even when a loaded machine deschedules the test between them)
    s = SegmentedStore.open(cfg(tmp_path, flush_interval_ms=200, checkpoint_interval_ms=3000))
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_flusher, s)
            t0 = time.monotonic()  # (the flush thread sleeps in real time)
            for _ in range(3):  # three appends inside one interval: one fdatasync round
                fill(s, 2)
            await s.flushed_watermark.wait_for(5, timeout=5)
            assert s.flush_count == 1 and time.monotonic() - t0 >= 0.2
            s.set_committed(5)
            # Idle: no flushes, and the checkpoint is written once its interval is up.
            t1 = trio.current_time()
            await trio.sleep(10)
            assert trio.current_time() - t1 >= 10 and s.flush_count == 1
            # (the checkpoint is written in a thread: virtual time may jump past
            # the test's sleep while a slow disk still writes it)
            await wait_until(lambda: metafiles.read_checkpoint(s.store_dir) == (5, 5), 5, "the idle checkpoint")
            assert s.flush_count == 1
            fill(s, 1)
            await s.flushed_watermark.wait_for(6, timeout=5)
            assert s.flush_count == 2
            nursery.cancel_scope.cancel()
    finally:
        s.close()
    assert metafiles.read_checkpoint(s.store_dir) == (6, 5)


async def test_flusher_survives_segment_deletion_during_flush(tmp_path):
    """Flushes work on dup()ed descriptors, so truncating (which deletes
    segments) while a flush runs in a thread is safe."""
    s = SegmentedStore.open(cfg(tmp_path))
    try:
        fill(s, 40)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(s.flush_async)
            await trio.sleep(0)
            s.truncate_from(3)
        assert s.end_index == 2 and s.flushed_index <= 2
        fill(s, 2)
        await s.flush_async()
        assert s.flushed_index == 4
    finally:
        s.close()


async def test_flusher_returns_when_the_store_closes(tmp_path, lazy_clock):
    s = SegmentedStore.open(cfg(tmp_path))
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_flusher, s)
        fill(s, 3)
        await s.flushed_watermark.wait_for(2)
        await trio.testing.wait_all_tasks_blocked()
        s.close()
    # the nursery exited on its own: the flusher noticed the close
    assert metafiles.read_checkpoint(s.store_dir) == (2, -1)


async def test_flush_from_a_worker_thread_wakes_trio_waiters(tmp_path):
    """The replica calls store.flush in trio.to_thread; the flushed
    watermark is then advanced from the trio thread, not the worker."""
    s = SegmentedStore.open(cfg(tmp_path))
    try:
        fill(s, 5)
        woke = []

        async def waiter():
            woke.append(await s.flushed_watermark.wait_for(4))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            await trio.to_thread.run_sync(s.flush)
        assert woke == [4]
    finally:
        s.close()


async def test_appends_during_thread_flushes_are_never_left_unflushed(tmp_path):
    s = SegmentedStore.open(cfg(tmp_path))
    try:
        async with trio.open_nursery() as nursery:
            done = trio.Event()

            async def flusher():
                while not done.is_set():
                    await trio.to_thread.run_sync(s.flush)

            nursery.start_soon(flusher)
            for _ in range(300):
                fill(s, 2)
                await trio.sleep(0)
            done.set()
        # If a concurrent flush had swallowed a write's unflushed mark, this
        # last flush would find nothing to do and the end would stay unsynced.
        s.flush()
        assert s.flushed_index == s.end_index == 599 and s.flushed_watermark.value == 599
        assert not any(seg.dirty for sl in (s.data, s.index) for seg in sl.segments)
    finally:
        s.close()


async def test_the_flush_thread_flushes_each_burst_without_trio_and_reports_failure(tmp_path, monkeypatch):
    """Every write wakes the flush thread (no trio task per flush): bursts
    apart by more than the interval get a flush each, and the watermark
    advances in trio; a failing fdatasync ends serve_flusher with it."""
    s = SegmentedStore.open(cfg(tmp_path, flush_interval_ms=5))
    try:
        with pytest.raises(BaseExceptionGroup) as failed:
            async with trio.open_nursery() as nursery:
                await nursery.start(serve_flusher, s)
                for burst in range(3):
                    fill(s, 2)
                    await s.flushed_watermark.wait_for(2 * burst + 1, timeout=5)
                assert s.flush_count == 3 and s.flush_wanted is not None

                def broken(job):
                    raise OSError(5, "injected")
                monkeypatch.setattr("commitlog.durability._run_flush", broken)
                fill(s, 1)
                await trio.sleep_forever()
        assert failed.group_contains(OSError, match="injected")
        assert s.flush_wanted is None  # the thread was told to stop
    finally:
        monkeypatch.undo()
        s.close()
