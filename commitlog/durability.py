# Owns the durable side of SegmentedStore (mixed into it, as reads.py is):
# flushing what was written -- fdatasync of the dirty segments, callable
# from any thread, serialized by a lock and taken in an order that cannot
# lose a concurrent write -- the flushed watermark, the checkpoint file,
# and the activity signal the flusher service (flusher.py) waits on.
import os

import attrs
import trio

from commitlog import metafiles


@attrs.define
class _FlushJob:
    fds: list[int]  # data fds first, then index fds (dup()ed; the job closes them)
    end_index: int


def _run_flush(job: _FlushJob) -> None:
    try:
        for fd in job.fds:
            os.fdatasync(fd)
    finally:
        for fd in job.fds:
            os.close(fd)


class StoreDurability:
    """Flushing and checkpoints of a SegmentedStore; uses its data/index
    segment lists, _unflushed/_end/_flushed_end/_committed/_checkpointed,
    _flush_lock, flushed_watermark, flush_count, _activity, store_dir and
    _check_open()."""

    def _begin_flush(self) -> _FlushJob | None:
        """What to sync, taken so that no concurrent write is lost: the
        writer does pwrite, marks the segment dirty, sets end, sets
        unflushed; we clear unflushed, read end, then take dirty segments."""
        if not self._unflushed:
            return None
        self._unflushed = False
        end = self._end
        fds = []
        for sl in (self.data, self.index):  # data first, then index (DLedger's order)
            for seg in list(sl.segments):
                if seg.dirty:
                    # dup before clearing: a segment closed in between syncs itself
                    fd = seg.dup_fd()
                    seg.dirty = False
                    if fd is not None:
                        fds.append(fd)
        return _FlushJob(fds, end)

    def _flush_failed(self) -> None:
        self._unflushed = True
        for sl in (self.data, self.index):
            for seg in list(sl.segments):
                seg.dirty = True

    def flush(self) -> None:
        """fdatasync every data segment written since the last flush, then
        every such index segment.  Callable from a worker thread while the
        trio thread appends; concurrent flushes run one after the other."""
        flushed = self._sync_to_disk()
        if flushed is not None:
            self._publish_flushed(flushed)

    async def flush_async(self) -> None:
        """flush() in a worker thread, off the event loop.  The flushed
        watermark advances back in the trio thread when the worker returns:
        no second round trip from the worker into trio per flush."""
        flushed = await trio.to_thread.run_sync(self._sync_to_disk)
        if flushed is not None:
            self.flushed_watermark.advance(flushed)

    def _sync_to_disk(self) -> int | None:
        """The flush itself; returns the new flushed end (None: nothing to do)."""
        with self._flush_lock:
            job = self._begin_flush()
            if job is None:
                return None
            try:
                _run_flush(job)
            except BaseException:
                self._flush_failed()
                raise
            self.flush_count += 1
            self._flushed_end = flushed = min(job.end_index, self._end)
        return flushed

    def _publish_flushed(self, end: int) -> None:
        # Watermark waiters are trio tasks: wake them from the trio thread.
        if trio.lowlevel.in_trio_run():
            self.flushed_watermark.advance(end)
            return
        try:
            trio.from_thread.run_sync(self.flushed_watermark.advance, end)
        except RuntimeError:  # not a trio thread at all: nobody can be waiting
            self.flushed_watermark.advance(end)

    def checkpoint_written(self, state: tuple[int, int]) -> None:
        """(flushed end, committed) is on disk as the checkpoint (the
        flusher wrote it from a worker thread)."""
        self._checkpointed = state

    def write_checkpoint(self) -> None:
        """Persist (endIndex, committedIndex).  endIndex is the flushed end,
        so everything up to it is known to be on disk."""
        self._check_open()
        state = (self._flushed_end, self._committed)
        metafiles.write_checkpoint(self.store_dir, *state)
        self._checkpointed = state

    def _note_activity(self) -> None:
        if self._activity is not None:
            self._activity.set()

    async def wait_activity(self) -> None:
        """Return after the next append, truncation or commit change."""
        self._activity = trio.Event()
        await self._activity.wait()
