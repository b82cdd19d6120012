# Owns the offline full rebuild of consume queues and index files from a
# stopped broker's store (mqadmin rebuildConsumeQueue, the benchmark): open
# the DLedger store (its lock keeps a running broker out; its recovery cuts
# a torn tail), delete every consume queue, index file and dispatch
# checkpoint, dispatch the committed log from its first entry, checkpoint.
# A store migrated from master-slave (consumequeue.migrated) is rebuilt in
# two parts: the old commitlog in plain mode first, then the DLedger log.
#
# Also the index-only rebuild of a plain commitlog (rebuild_plain_index:
# `migrate apply` on an old store whose index is missing or incomplete).
# It is deterministic, so every replica of one old commitlog gets the same
# index files, names included: a file is named by the store timestamp of
# the first message of the batch that opened it (local time, as RocketMQ's
# names are), where RocketMQ names it by the clock when it creates it.
import os
import time

import attrs

from commitlog.store import SegmentedStore, StoreConfig
from consumequeue import service
from consumequeue.dispatcher import DispatchConfig, DispatchEngine, DispatchStats
from consumequeue.errors import ConsumeQueueError
from consumequeue.indexfile import IndexService
from consumequeue.legacy_store import LegacyStore
from consumequeue.migrated import DividedLog, layered_source, load_marker, redispatch_legacy


@attrs.frozen(kw_only=True)
class RebuildReport:
    root: str
    begin_pos: int
    end_pos: int
    committed_index: int
    seconds: float
    stats: DispatchStats
    queues: int
    index_files: int

    @property
    def bytes(self) -> int:
        return self.end_pos - self.begin_pos

    def to_json(self) -> dict:
        return {"root": self.root, "beginPos": self.begin_pos, "endPos": self.end_pos,
                "committedIndex": self.committed_index, "seconds": round(self.seconds, 6),
                "bytes": self.bytes, "entries": self.stats.entries, "messages": self.stats.messages,
                "badMessages": self.stats.bad_messages, "queues": self.queues,
                "indexFiles": self.index_files}


def find_self_id(root: str) -> str:
    """The selfId of the single dledger-<id> directory under `root`."""
    ids = sorted(n[len("dledger-"):] for n in os.listdir(root)
                 if n.startswith("dledger-") and os.path.isdir(os.path.join(root, n)))
    if not ids:
        raise ConsumeQueueError(f"{root}: no dledger-<selfId> directory (not a ledgermq store root)")
    if len(ids) > 1:
        raise ConsumeQueueError(f"{root}: several stores ({', '.join(ids)}); pick one with --self-id")
    return ids[0]


def open_store(root: str, self_id: str | None = None) -> SegmentedStore:
    return SegmentedStore.open(StoreConfig(root, self_id=self_id or find_self_id(root)))


def rebuild_engine(engine: DispatchEngine, begin_pos: int, end_pos: int, committed_index: int,
                   *, progress=None) -> float:
    """Reset and dispatch [begin_pos, end_pos); returns the seconds taken."""
    t0 = time.perf_counter()
    engine.reset(begin_pos)
    engine.dispatch_to(end_pos, progress=progress)
    if engine.pos != end_pos or (committed_index >= 0 and engine.last_index != committed_index):
        raise ConsumeQueueError(f"rebuild stopped at position {engine.pos} / entry {engine.last_index}, "
                                f"expected {end_pos} / {committed_index}")
    engine.checkpoint()
    return time.perf_counter() - t0


def rebuild_store(root: str, *, self_id: str | None = None, config: DispatchConfig | None = None,
                  backend=None, progress=None, store: SegmentedStore | None = None) -> RebuildReport:
    """Full rebuild of ${root}'s consume queues and index.  `progress(done,
    total)` is called as bytes are dispatched."""
    own = store is None
    store = store or open_store(root, self_id)
    try:
        marker = load_marker(store.store_dir)
        if marker is not None:  # migrated from master-slave: the old commitlog's queues too
            return rebuild_migrated(root, store, marker, config=config, backend=backend, progress=progress)
        p = service.positions(store)
        engine = DispatchEngine(root, service.source_for(store, populate=True), config=config,
                                backend=backend)
        try:
            total = p.committed_pos - p.begin_pos
            cb = (lambda pos: progress(pos - p.begin_pos, total)) if progress else None
            secs = rebuild_engine(engine, p.begin_pos, p.committed_pos, p.committed_index, progress=cb)
            return RebuildReport(root=root, begin_pos=p.begin_pos, end_pos=p.committed_pos,
                                 committed_index=p.committed_index, seconds=secs,
                                 stats=engine.stats, queues=len(engine.cqs.queues), index_files=len(engine.index.files))
        finally:
            engine.close()
            engine.source.close()
    finally:
        if own:
            store.close()


def rebuild_migrated(root: str, store, marker: DividedLog, *, config=None, backend=None, progress=None):
    """consumequeue.rebuild.rebuild_store for a migrated store: reset, the
    old commitlog in plain mode, then the committed DLedger log."""
    t0 = time.perf_counter()
    p = service.positions(store)
    source = layered_source(store, marker)
    engine = DispatchEngine(root, source, config=config, backend=backend)
    begin = source.begin_pos if source.legacy_present() else p.begin_pos
    try:
        engine.reset(begin)
        if source.legacy_present():
            redispatch_legacy(engine, marker)
        total = p.committed_pos - begin
        cb = (lambda pos: progress(pos - begin, total)) if progress else None
        engine.dispatch_to(p.committed_pos, progress=cb)
        engine.checkpoint()
        return RebuildReport(root=root, begin_pos=begin, end_pos=p.committed_pos, committed_index=p.committed_index,
                             seconds=time.perf_counter() - t0,
                             stats=engine.stats, queues=len(engine.cqs.queues), index_files=len(engine.index.files))
    finally:
        engine.close()
        source.close()


@attrs.frozen
class IndexRebuild:
    files: int  # index files written
    keys: int  # items put
    messages: int  # records read

    def to_json(self) -> dict:
        return {"files": self.files, "keys": self.keys, "messages": self.messages}


def rebuild_plain_index(root: str, begin: int, end: int, *, segment_size: int | None = None,
                        config: DispatchConfig | None = None, backend=None, progress=None) -> IndexRebuild:
    """Delete ${root}/index and index the plain commitlog ${root}/commitlog
    [begin, end) (`begin` a record start) again, deterministically (see the
    module comment).  `progress(done, total)` follows the bytes read."""
    config = config or DispatchConfig()
    stamp = [0]  # the "clock" new index files are named by
    index = IndexService(root, slot_num=config.index_slot_num, index_num=config.index_num, backend=backend,
                         clock_ms=lambda: stamp[0])
    index.destroy()
    messages = 0
    try:
        with LegacyStore(root, segment_size=segment_size, backend=backend) as old:
            for view, res in old.batches(begin, end):
                stamp[0] = res.record(0).store_timestamp
                index.put_batch(view, res)
                messages += res.n
                if progress is not None:
                    last = res.record(res.n - 1)
                    progress(last.phy_offset + last.size - begin, end - begin)
        index.flush()
        return IndexRebuild(len(index.files), sum(f.header.index_count - 1 for f in index.files), messages)
    finally:
        index.close()
