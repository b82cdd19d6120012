# Owns the segmented-store append benchmark: `python -m tools.bench.store`.
#
# Appends 1 KiB entries in leader batches, in both flush policies, and puts
# each figure next to a raw baseline measured in the same run, in alternating
# quarter-second rounds (so both see the same machine): plain os.write of the
# same bytes (entries and index units, pre-encoded) to two files with the
# same fdatasync pattern:
#   async  fdatasync data then index every flush interval (10 ms), in the
#          appending thread for both, so the comparison is like for like;
#   sync   fdatasync data then index after every batch (a leader batch).
# Targets: async >= 0.5x raw, sync within 1.2x of raw (ratio >= 0.83).
# Files go to --dir (default ./bench-data, on the real disk: /tmp may be
# tmpfs, which would make fsync free) and are deleted afterwards.
import json
import os
import shutil
import sys
import tempfile
import time
import types

import click

import native
from commitlog.config import FlushDiskType
from commitlog.store import SegmentedStore, StoreConfig
from tools.cli import CONTEXT, run_command

ENTRY_OVERHEAD = 48
UNIT = 32
TARGETS = {"async": 0.5, "sync": 1 / 1.2}


def _bodies(batch: int, size: int) -> list[bytes]:
    return [os.urandom(size) for _ in range(batch)]


class _StoreRun:
    """Appends through SegmentedStore (async: flush every flush_ms)."""

    def __init__(self, directory: str, policy: str, bodies: list[bytes], flush_ms: int):
        flush = FlushDiskType.SYNC_FLUSH if policy == "sync" else FlushDiskType.ASYNC_FLUSH
        self.store = SegmentedStore.open(StoreConfig(root=directory, flush_disk_type=flush, flush_interval_ms=flush_ms))
        self.policy, self.bodies, self.flush_s = policy, bodies, flush_ms / 1000
        self.entries, self.elapsed, self.next_flush = 0, 0.0, 0.0

    def run(self, seconds: float) -> None:
        store, bodies, flush_s = self.store, self.bodies, self.flush_s
        start = now = time.perf_counter()
        self.next_flush = max(self.next_flush, start)
        while now - start < seconds:
            store.append_leader(bodies, 1)
            if store.sync_flush:
                store.flush()  # SYNC_FLUSH: durable before the append counts
            self.entries += len(bodies)
            now = time.perf_counter()
            if self.policy == "async" and now >= self.next_flush:
                store.flush()
                self.next_flush = now + flush_s
        store.flush()
        self.elapsed += time.perf_counter() - start

    def close(self) -> None:
        self.store.close()


class _RawRun:
    """The baseline: os.write of the same bytes (entries, then index units)
    to two plain files, with the same fdatasync pattern."""

    def __init__(self, directory: str, policy: str, bodies: list[bytes], flush_ms: int):
        os.makedirs(directory, exist_ok=True)
        self.data = b"".join(len(b).to_bytes(4, "big") * 12 + b for b in bodies)
        self.units = bytes(UNIT * len(bodies))
        self.dfd = os.open(os.path.join(directory, "data"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.ifd = os.open(os.path.join(directory, "index"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.policy, self.count, self.flush_s = policy, len(bodies), flush_ms / 1000
        self.entries, self.elapsed, self.next_flush = 0, 0.0, 0.0

    def run(self, seconds: float) -> None:
        dfd, ifd, data, units, flush_s = self.dfd, self.ifd, self.data, self.units, self.flush_s
        start = now = time.perf_counter()
        self.next_flush = max(self.next_flush, start)
        while now - start < seconds:
            os.write(dfd, data)
            os.write(ifd, units)
            self.entries += self.count
            now = time.perf_counter()
            if self.policy == "sync" or now >= self.next_flush:
                os.fdatasync(dfd)
                os.fdatasync(ifd)
                self.next_flush = now + flush_s
        os.fdatasync(dfd)
        os.fdatasync(ifd)
        self.elapsed += time.perf_counter() - start

    def close(self) -> None:
        os.close(self.dfd)
        os.close(self.ifd)


def measure(work: str, mode: str, seconds: float, bodies: list[bytes], flush_ms: int,
            round_s: float = 0.25) -> tuple[dict, dict]:
    """Store and raw runs alternate in short rounds, so both see the same
    machine (other load, page cache state) for the same total time."""
    raw = _RawRun(os.path.join(work, "raw"), mode, bodies, flush_ms)
    store = _StoreRun(os.path.join(work, "store"), mode, bodies, flush_ms)
    try:
        rounds = max(1, round(seconds / round_s))
        for _ in range(rounds):
            raw.run(seconds / rounds)
            store.run(seconds / rounds)
    finally:
        raw.close()
        store.close()
    return _figures(store.entries, store.elapsed, bodies), _figures(raw.entries, raw.elapsed, bodies)


def _figures(entries: int, elapsed: float, bodies: list[bytes]) -> dict:
    per_entry = ENTRY_OVERHEAD + sum(map(len, bodies)) / len(bodies)
    return {"entries": entries, "seconds": round(elapsed, 3), "entries_per_s": round(entries / elapsed),
            "mb_per_s": round(entries * per_entry / elapsed / 1e6, 1)}


@click.command(context_settings=CONTEXT)
@click.option("--seconds", type=float, default=10.0, show_default=True,
              help="appending time per mode for the store (the raw baseline gets as much)")
@click.option("--batch", type=int, default=32, show_default=True,
              help="entries per leader append (and per fdatasync in sync mode)")
@click.option("--body-size", type=int, default=1024, show_default=True, help="entry bytes")
@click.option("--flush-ms", type=int, default=10, show_default=True, help="async flush interval")
@click.option("--dir", default="bench-data", show_default=True, help="where to put the files (deleted afterwards)")
@click.option("--mode", type=click.Choice(["async", "sync", "both"]), default="both", show_default=True,
              help="flush mode(s) to measure")
@click.option("--json", is_flag=True, help="print one JSON object")
def command(**kw) -> int:
    """The segmented-store append benchmark against a raw os.write baseline."""
    args = types.SimpleNamespace(**kw)
    if not native.NATIVE_LOADED:
        print(f"warning: {native.LOAD_ERROR}; measuring the pure-Python fallback", file=sys.stderr)
    os.makedirs(args.dir, exist_ok=True)
    bodies = _bodies(args.batch, args.body_size)
    modes = ["async", "sync"] if args.mode == "both" else [args.mode]
    results = {"batch": args.batch, "body_size": args.body_size, "native": native.NATIVE_LOADED}
    for mode in modes:
        work = tempfile.mkdtemp(prefix=f"store-{mode}-", dir=args.dir)
        try:
            store, raw = measure(work, mode, args.seconds, bodies, args.flush_ms)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        ratio = store["entries_per_s"] / raw["entries_per_s"]
        results[mode] = {"store": store, "raw": raw, "ratio": round(ratio, 3), "target": round(TARGETS[mode], 3),
                         "meets_target": ratio >= TARGETS[mode]}
    if args.json:
        print(json.dumps(results))
        return 0
    print(f"segmented store append benchmark: {args.batch} x {args.body_size} B entries per append, "
          f"{args.seconds:g} s per run, native={native.NATIVE_LOADED}")
    print(f"{'mode':6} {'store entries/s':>16} {'store MB/s':>11} {'raw entries/s':>14} {'raw MB/s':>9} "
          f"{'ratio':>6} {'target':>7}")
    for mode in modes:
        r = results[mode]
        s, w = r["store"], r["raw"]
        print(f"{mode:6} {s['entries_per_s']:>16,} {s['mb_per_s']:>11.1f} {w['entries_per_s']:>14,} "
              f"{w['mb_per_s']:>9.1f} {r['ratio']:>6.2f} {'>= ' + format(r['target'], '.2f'):>7}"
              f"{'' if r['meets_target'] else '  (below target)'}")
    return 0


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.bench.store")


if __name__ == "__main__":
    sys.exit(main())
