# Owns the dispatch benchmark: `python -m tools.bench.dispatch`.
#
# Builds (once; reused by later runs) a ledgermq store holding >= --size-mb
# of 1 KiB message records over 64 queues, appended through the real store
# with the leader's append hook, all committed.  Then, from page cache:
#   raw     -- sequential 1 MiB read()s of every data segment (a `cat`);
#   native  -- a full rebuild of consume queues and index (C scanner/helpers);
#   python  -- the same rebuild on the pure-Python twins, on a prefix
#              (--python-mb) and extrapolated, because the full run would
#              take minutes; the native path is also timed on that prefix so
#              the native/Python ratio compares like with like.
# After a warm-up rebuild, raw reads and native rebuilds alternate over
# --rounds rounds and the medians are reported, nativeVsRaw being the ratio of the medians (other
# jobs on a shared machine then slow both sides alike, not one).
# Each rebuild writes into an emptied output directory (the deletion is not
# timed) and its time excludes the final fsync of the written files (disk
# speed, not dispatch), which is reported separately.  Consume queues and
# index go to ${dir}/output, not into the store root, so a rebuild there by
# mqadmin is left alone.
import json
import os
import resource
import shutil
import statistics
import sys
import time
import types

import attrs
import click

from commitlog.store import SegmentedStore, StoreConfig
from consumequeue import record as M
from consumequeue import service
from consumequeue.dispatcher import DispatchEngine
from consumequeue.queue_offsets import QueueOffsetTable
from consumequeue.rebuild import rebuild_engine
from native import dispatch as D
from tools.cli import CONTEXT, run_command

RECORD_SIZE = 1024
QUEUES = 64
TOPIC = "BenchTopic"
APPEND_BATCH = 4096
READ_CHUNK = 1 << 20


def _template() -> tuple[bytearray, int, int]:
    """A 1024-byte record; returns it and the offsets of the 8-char key
    number and the 16-char uniq number inside it (patched per message)."""
    props = {"TAGS": "TagA", "KEYS": "order-00000000", "UNIQ_KEY": "7F00000100002A9F" + "0" * 16}
    base = M.MessageRecord(topic=TOPIC, body=b"", properties=props, born_timestamp=1_700_000_000_000,
                           born_host=M.HostAddr("10.0.0.2", 50000), store_timestamp=1_700_000_000_000,
                           store_host=M.HostAddr("10.0.0.1", 10911))
    body_len = RECORD_SIZE - len(M.encode(base))
    raw = bytearray(M.encode(M.MessageRecord(**{**{a: getattr(base, a) for a in (
        "topic", "properties", "born_timestamp", "born_host", "store_timestamp", "store_host")},
        "body": b"b" * body_len})))
    assert len(raw) == RECORD_SIZE
    key_at = raw.index(b"order-") + 6
    uniq_at = raw.index(b"7F00000100002A9F") + 16
    return raw, key_at, uniq_at



def fill_store(store: SegmentedStore, size_mb: int, log=print) -> int:
    """Append about size_mb MiB of 1-record entries (QUEUES queues, distinct
    keys and unique keys) to an open store, commit them and close it;
    returns the number of messages.  Shared with the pipeline benchmark."""
    table = QueueOffsetTable()
    store.add_append_hook(table.append_hook)
    raw, key_at, uniq_at = _template()
    total = size_mb << 20
    n = -(-total // (RECORD_SIZE + 48))
    ts_at = M.store_timestamp_pos(0)
    for first in range(0, n, APPEND_BATCH):
        batch = []
        for i in range(first, min(n, first + APPEND_BATCH)):
            raw[12:16] = (i % QUEUES).to_bytes(4, "big")
            raw[key_at:key_at + 8] = b"%08d" % i
            raw[uniq_at:uniq_at + 16] = b"%016X" % i
            raw[ts_at:ts_at + 8] = (1_700_000_000_000 + i).to_bytes(8, "big")
            batch.append(bytes(raw))
        store.append_leader(batch, term=1)
        if first % (APPEND_BATCH * 64) == 0:
            log(f"  building: {store.end_pos / total:6.1%}", end="\r")
    store.set_committed(store.end_index)
    store.close()
    return n

def build_store(path: str, size_mb: int, log=print) -> None:
    marker = os.path.join(path, "bench-complete")
    if os.path.exists(marker):
        with open(marker) as f:
            if int(f.read().strip() or 0) >= size_mb:
                return
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)
    t0 = time.perf_counter()
    store = SegmentedStore.open(StoreConfig(path))
    n = fill_store(store, size_mb, log)
    with open(marker, "w") as f:
        f.write(str(size_mb))
    log(f"  built {n} messages ({store.end_pos / (1 << 20):.0f} MiB) in {time.perf_counter() - t0:.1f}s")


def raw_read_rate(data_dir: str, limit: int) -> tuple[float, int]:
    """Sequential read() of the data segments up to `limit` bytes: (s, bytes)."""
    buf = bytearray(READ_CHUNK)
    done = 0
    t0 = time.perf_counter()
    for name in sorted(os.listdir(data_dir)):
        fd = os.open(os.path.join(data_dir, name), os.O_RDONLY)
        try:
            while done < limit:
                n = os.readv(fd, [buf])
                if n <= 0:
                    break
                done += n
        finally:
            os.close(fd)
        if done >= limit:
            break
    return time.perf_counter() - t0, done


@attrs.frozen
class Run:
    seconds: float  # wall time of the rebuild, final fsync excluded
    fsync_seconds: float
    user_seconds: float  # CPU time of this process during the rebuild
    system_seconds: float
    stats: object


def timed_rebuild(store, root: str, backend, end_pos: int, end_index: int) -> Run:
    """A rebuild of [begin, end_pos) into `root`, emptied first (not timed:
    deleting the previous run's files is file-system work, not dispatch; it
    also hands their page cache pages back for this run to reuse)."""
    p = service.positions(store)
    shutil.rmtree(root, ignore_errors=True)
    engine = DispatchEngine(root, service.source_for(store, populate=True), backend=backend)
    try:
        engine.checkpoint = lambda: None  # timed separately below
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        secs = rebuild_engine(engine, p.begin_pos, end_pos, end_index)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        del engine.checkpoint
        t0 = time.perf_counter()
        engine.checkpoint()
        return Run(secs, time.perf_counter() - t0, r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime,
                   engine.stats)
    finally:
        engine.close()
        engine.source.close()


def prefix_end(store, limit_bytes: int) -> tuple[int, int]:
    """The end position and index of the last entry ending within the first
    limit_bytes of the log."""
    lo, hi = max(store.begin_index, 0), store.committed_index
    begin = service.begin_position(store)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if service.entry_end(store, mid) - begin <= limit_bytes:
            lo = mid
        else:
            hi = mid - 1
    return service.entry_end(store, lo), lo


@click.command(context_settings=CONTEXT)
@click.option("--size-mb", type=int, default=1024, show_default=True, help="commitlog size to build (MiB)")
@click.option("--dir", default="/tmp/ledgermq-bench-dispatch", show_default=True, help="where the store lives (reused)")
@click.option("--python-mb", type=int, default=128, show_default=True, help="prefix timed on the Python path (MiB)")
@click.option("--rounds", type=int, default=7, show_default=True,
              help="alternating raw-read / native-rebuild rounds; medians are reported")
@click.option("--runs", type=int, default=3, show_default=True, help="native rebuilds of the Python prefix (median)")
@click.option("--json", is_flag=True, help="print one JSON object")
def command(**kw) -> int:
    """The dispatch benchmark: consume queues and the index rebuilt from a commitlog, native vs raw read and Python."""
    args = types.SimpleNamespace(**kw)
    if D.NATIVE is None:
        print("native dispatch helpers unavailable; run `make native`", file=sys.stderr)
        return 2
    quiet = args.json
    log = (lambda *a, **k: print(*a, file=sys.stderr, **k)) if not quiet else (lambda *a, **k: None)
    path = os.path.join(args.dir, f"store-{args.size_mb}mb")
    build_store(path, args.size_mb, log)
    store = SegmentedStore.open(StoreConfig(path))
    try:
        p = service.positions(store)
        total = p.committed_pos - p.begin_pos
        data_dir = os.path.join(store.store_dir, "data")
        raw_read_rate(data_dir, total)  # warm the page cache
        output = os.path.join(args.dir, "output")
        # Alternating rounds (raw read, then native rebuild), so that load
        # from other jobs on the machine hits both sides alike; the figures
        # are medians and the ratio is the ratio of the medians.
        raws, native = [], []
        timed_rebuild(store, output, D.NATIVE, p.committed_pos, p.committed_index)  # warm-up, not counted
        for i in range(args.rounds):
            log(f"  round {i + 1}/{args.rounds}", end="\r")
            raws.append(raw_read_rate(data_dir, total))
            native.append(timed_rebuild(store, output, D.NATIVE, p.committed_pos, p.committed_index))
        raw_s = statistics.median(s for s, _ in raws)
        raw_bytes = raws[0][1]
        raw_rate = raw_bytes / raw_s
        n_s = statistics.median(r.seconds for r in native)
        mid = sorted(native, key=lambda r: r.seconds)[(len(native) - 1) // 2]
        n_sync, n_stats = statistics.median(r.fsync_seconds for r in native), mid.stats
        n_rate = total / n_s
        best = mid
        py_end, py_index = prefix_end(store, args.python_mb << 20)
        py_bytes = py_end - p.begin_pos
        log("  python rebuild of the prefix ...", end="\r")
        py_s = timed_rebuild(store, output, D.PYTHON, py_end, py_index).seconds
        np_s = statistics.median(timed_rebuild(store, output, D.NATIVE, py_end, py_index).seconds
                                 for _ in range(args.runs))
        py_rate, np_rate = py_bytes / py_s, py_bytes / np_s
        shutil.rmtree(output, ignore_errors=True)
    finally:
        store.close()
    gib = float(1 << 30)
    result = {
        "commitlogBytes": total, "messages": n_stats.messages, "recordSize": RECORD_SIZE, "queues": QUEUES,
        "rawReadGiBps": raw_rate / gib,
        "nativeRebuildSeconds": n_s, "nativeRebuildGiBps": n_rate / gib,
        "nativeFsyncSeconds": n_sync,
        "nativeUserCpuSeconds": best.user_seconds, "nativeSystemCpuSeconds": best.system_seconds,
        "nativeVsRaw": n_rate / raw_rate, "rounds": args.rounds,
        "rawReadSecondsPerRound": [s for s, _ in raws],
        "nativeRebuildSecondsPerRound": [r.seconds for r in native],
        "pythonPrefixBytes": py_bytes, "pythonPrefixSeconds": py_s, "pythonGiBps": py_rate / gib,
        "pythonExtrapolatedSeconds": total / py_rate,
        "nativePrefixGiBps": np_rate / gib, "nativeVsPython": np_rate / py_rate,
        "targets": {"nativeGiBpsPerCore": 1.0, "nativeVsRaw": 0.3},
        "met": n_rate / gib >= 1.0 and n_rate / raw_rate >= 0.3,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"commitlog          {total / gib:8.2f} GiB, {n_stats.messages} messages of {RECORD_SIZE} B "
              f"over {QUEUES} queues (page cache)")
        print(f"raw sequential read{raw_rate / gib:8.2f} GiB/s  (median of {args.rounds} rounds, "
              f"{min(s for s, _ in raws) * 1e3:.1f}-{max(s for s, _ in raws) * 1e3:.1f} ms)")
        print(f"native rebuild     {n_rate / gib:8.2f} GiB/s  ({n_s:.3f} s, median of {args.rounds} rounds "
              f"alternating with the raw reads, {min(r.seconds for r in native):.3f}-"
              f"{max(r.seconds for r in native):.3f} s; final fsync {n_sync:.3f} s not included)")
        print(f"native / raw       {n_rate / raw_rate:8.2f}x  (ratio of the medians; per round "
              + " ".join(f"{(rs / r.seconds):.2f}" for (rs, _), r in zip(raws, native)) + ")")
        print(f"                   CPU: {best.user_seconds:.3f} s user, {best.system_seconds:.3f} s kernel "
              "(page-cache pages for the new files, page tables, inode allocation)")
        print(f"python rebuild     {py_rate / gib:8.3f} GiB/s  (measured on a {py_bytes / (1 << 20):.0f} MiB "
              f"prefix in {py_s:.2f} s, extrapolated: {total / py_rate:.0f} s for the whole log)")
        print(f"native / python    {np_rate / py_rate:8.1f}x  (same prefix)")
        print(f"targets            native >= 1 GiB/s per core and >= 0.3x raw: "
              f"{'met' if result['met'] else 'NOT met'}")
    return 0


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.bench.dispatch")


if __name__ == "__main__":
    sys.exit(main())
