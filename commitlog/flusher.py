# Owns the store's background flushing (serve_flusher): ASYNC_FLUSH's
# periodic fdatasync of what was written (DLedger's flushFileInterval) and
# the checkpoint file written while it is stale, asleep while the store is
# idle.  SYNC_FLUSH waiters use the store's own flush_async
# (commitlog/replica.py); both share SegmentedStore's flush.
#
# The periodic flush runs in a thread of its own that waits for writes
# (store.flush_wanted, set by every append), sleeps one interval so the
# writes of that interval share one fdatasync, flushes, and hands the new
# flushed end to trio without waiting (run_sync_soon): no thread hop from
# trio and back per flush, which cost a broker under load as much CPU as
# the flush itself.  The checkpoint, once per checkpoint interval, stays a
# trio task.
import errno
import logging
import threading
import time

import trio

from commitlog import metafiles
from commitlog.store import SegmentedStore

log = logging.getLogger("ledgermq.store")


class _FlushThread:
    """Flushes `store` flush_interval after each write, until stopped."""

    def __init__(self, store: SegmentedStore, interval: float, token) -> None:
        self.store, self.interval, self.token = store, interval, token
        self.wanted = threading.Event()
        self.stopping = False
        self.error: BaseException | None = None
        self.failed = trio.Event()
        self.thread = threading.Thread(target=self._run, name=f"flush {store.store_dir}", daemon=True)

    def start(self) -> None:
        self.store.flush_wanted = self.wanted
        if self.store.has_unflushed:
            self.wanted.set()
        self.thread.start()

    def stop(self) -> None:
        """Ends the thread after its current flush (not waited for)."""
        self.stopping = True
        if self.store.flush_wanted is self.wanted:
            self.store.flush_wanted = None
        self.wanted.set()

    def _run(self) -> None:
        store = self.store
        while True:
            self.wanted.wait()
            if self.stopping:
                return
            time.sleep(self.interval)  # the period that groups writes into one fdatasync
            self.wanted.clear()  # (a write from here on sets it again: flushed now or next time)
            if self.stopping or store.closed:
                return
            try:
                flushed = store._sync_to_disk()
            except Exception as exc:
                if not (self.stopping or store.closed):
                    self._to_trio(self._failed, exc)
                return
            if flushed is not None:
                self._to_trio(store.flushed_watermark.advance, flushed)

    def _to_trio(self, fn, arg) -> None:
        try:
            self.token.run_sync_soon(fn, arg)
        except trio.RunFinishedError:
            self.stopping = True

    def _failed(self, exc: BaseException) -> None:
        self.error = exc
        self.failed.set()
        self.store._note_activity()  # serve_flusher wakes and raises it


async def serve_flusher(store: SegmentedStore, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Flush flush_interval_ms after writes (in a thread of its own) and
    write the checkpoint every checkpoint_interval_ms while it is stale.
    No wakeups without writes.  Returns once the store is closed (close()
    flushes and checkpoints); raises what a flush raised."""
    cp_interval = store.cfg.checkpoint_interval_ms / 1000
    flusher = _FlushThread(store, store.cfg.flush_interval_ms / 1000, trio.lowlevel.current_trio_token())
    flusher.start()
    try:
        task_status.started()
        last_cp = trio.current_time()
        while not store.closed:
            if flusher.error is not None:
                raise flusher.error
            if not store.checkpoint_stale:
                await store.wait_activity()  # (once per checkpoint: it is stale again after a commit or flush)
                continue
            if trio.current_time() < last_cp + cp_interval:
                with trio.move_on_at(last_cp + cp_interval):
                    await flusher.failed.wait()
                continue
            await store.flush_async()
            state = (store.flushed_index, store.committed_index)
            last_cp = trio.current_time()
            try:
                await trio.to_thread.run_sync(metafiles.write_checkpoint, store.store_dir, *state)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                # A full disk: keep the previous checkpoint and retry after
                # the next interval instead of ending the node.
                log.error("%s: checkpoint deferred: %s", store.store_dir, exc)
                continue
            store.checkpoint_written(state)
    finally:
        flusher.stop()

