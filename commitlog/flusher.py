# Owns the store's background flushing (serve_flusher): ASYNC_FLUSH's
# periodic fdatasync of what was written (DLedger's flushFileInterval) and
# the checkpoint file written while it is stale, off the event loop, asleep
# while the store is idle.  SYNC_FLUSH waiters use the store's own
# flush_async (commitlog/replica.py); both share SegmentedStore's flush.
import errno
import logging
import math

import trio

from commitlog import metafiles
from commitlog.store import SegmentedStore

log = logging.getLogger("ledgermq.store")


async def serve_flusher(store: SegmentedStore, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Flush every flush_interval_ms while there are unflushed writes and
    write the checkpoint every checkpoint_interval_ms while it is stale.
    Sleeps on the store's activity when idle (no wakeups without writes).
    Returns once the store is closed (close() flushes and checkpoints)."""
    interval = store.cfg.flush_interval_ms / 1000
    cp_interval = store.cfg.checkpoint_interval_ms / 1000
    last_cp = trio.current_time()
    task_status.started()
    while not store.closed:
        now = trio.current_time()
        if store.checkpoint_stale and now >= last_cp + cp_interval:
            await store.flush_async()
            state = (store.flushed_index, store.committed_index)
            last_cp = now
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
            continue
        if store.has_unflushed:
            await trio.sleep(interval)  # the period that groups writes into one fdatasync
            if not store.closed:
                await store.flush_async()
            continue
        deadline = last_cp + cp_interval if store.checkpoint_stale else math.inf
        with trio.move_on_at(deadline):
            await store.wait_activity()
