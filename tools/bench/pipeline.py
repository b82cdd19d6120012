# Owns the Spark pipeline benchmark: `python -m tools.bench.pipeline`.
#
# Builds (once; reused by later runs) a ledgermq store of >= --size-mb of
# 1 KiB message records over 64 queues in --segment-mb data segments, all
# committed, with the dispatch benchmark's record template.  Then, from
# page cache, the same full rebuild of consume queues and index three ways:
#   native    -- the single-process native rebuild (the broker's own
#                DispatchEngine, tools.bench.dispatch.timed_rebuild);
#   local[1]  -- the pipeline's rebuild job on Spark with one executor core;
#   local[2]  -- the same with two.
# Each rebuild writes into an emptied output directory; every time includes
# the final checkpoint (fsync) so the three are alike, and the Spark times
# exclude starting Spark (reported apart).  Printed: MB/s of each, the
# scaling ratio local[2] / local[1] and each against the native rebuild.
# The job runs one task per segment: on a cluster, executors scan segments
# in parallel and only the compact records (about 15% of the log) reach the
# driver, which writes the files in log order.
import argparse
import json
import os
import shutil
import statistics
import sys
import time

from commitlog.store import SegmentedStore, StoreConfig
from consumequeue import service
from native import dispatch as D
from tools.bench.dispatch import QUEUES, RECORD_SIZE, fill_store, raw_read_rate, timed_rebuild

MB = 1 << 20


def build_store(path: str, size_mb: int, segment_mb: int, log) -> None:
    """The dispatch benchmark's store (its record template, 64 queues,
    keys and uniq keys per message), with --segment-mb segments."""
    marker = os.path.join(path, "bench-complete")
    want = f"{size_mb} {segment_mb}"
    if os.path.exists(marker):
        with open(marker) as f:
            if f.read().strip() == want:
                return
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    t0 = time.perf_counter()
    store = SegmentedStore.open(StoreConfig(path, data_segment_size=segment_mb * MB))
    n = fill_store(store, size_mb, log)
    with open(marker, "w") as f:
        f.write(want)
    log(f"  built {n} messages ({store.end_pos / MB:.0f} MiB) in {time.perf_counter() - t0:.1f}s")


def native_seconds(path: str, output: str) -> float:
    store = SegmentedStore.open(StoreConfig(path))
    try:
        p = service.positions(store)
        run = timed_rebuild(store, output, D.NATIVE, p.committed_pos, p.committed_index)
        return run.seconds + run.fsync_seconds
    finally:
        store.close()


def spark_seconds(path: str, output: str, master: str, rounds: int, log, wave=None):
    from tools.pipeline import jobcommon as J
    from tools.pipeline.rebuild import rebuild_plan
    from tools.pipeline.sparkenv import build_session, stop_session
    t0 = time.perf_counter()
    spark = build_session(master, {"spark.ui.enabled": "false", "spark.driver.memory": "4g"})
    try:
        spark.sparkContext.parallelize(range(4), 2).map(lambda x: x).collect()  # start the Python workers
        startup = time.perf_counter() - t0
        times, applies, report = [], [], None
        for k in range(rounds + 1):  # round 0 warms the JVM and the workers up
            shutil.rmtree(output, ignore_errors=True)
            t1 = time.perf_counter()
            (plan,) = J.plan_inputs(spark, [path])
            report = rebuild_plan(spark, plan, output, wave=wave)
            if k:
                times.append(time.perf_counter() - t1)
                applies.append(report.apply_seconds)
            log(f"  {master} round {k}/{rounds}: {time.perf_counter() - t1:.2f} s", end="\r")
        return times, startup, {**report.to_json(), "applySeconds": statistics.median(applies)}
    finally:
        stop_session(spark)  # a fresh JVM for the next contender


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.pipeline", description=__doc__)
    ap.add_argument("--size-mb", type=int, default=2048, help="commitlog size to build (MiB)")
    ap.add_argument("--segment-mb", type=int, default=256, help="data segment size (MiB): one Spark task each")
    ap.add_argument("--dir", default="/tmp/ledgermq-bench-pipeline", help="where the store lives (reused)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rebuilds per contender (medians reported)")
    ap.add_argument("--wave", type=int, help="segments scanned ahead of the driver (default 2x cores)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if D.NATIVE is None:
        print("native dispatch helpers unavailable; run `make native`", file=sys.stderr)
        return 2
    log = (lambda *a, **k: print(*a, file=sys.stderr, **k)) if not args.json else (lambda *a, **k: None)
    path = os.path.join(args.dir, f"store-{args.size_mb}mb-{args.segment_mb}mb")
    build_store(path, args.size_mb, args.segment_mb, log)
    output = os.path.join(args.dir, "output")
    data_dir = os.path.join(path, "dledger-n0", "data")
    raw_s, raw_bytes = raw_read_rate(data_dir, 1 << 62)  # warms the page cache too
    native = []
    native_seconds(path, output)  # warm-up
    for k in range(args.rounds):
        log(f"  native round {k + 1}/{args.rounds}", end="\r")
        native.append(native_seconds(path, output))
    l1, start1, rep1 = spark_seconds(path, output, "local[1]", args.rounds, log, args.wave)
    l2, start2, rep2 = spark_seconds(path, output, "local[2]", args.rounds, log, args.wave)
    shutil.rmtree(output, ignore_errors=True)
    log("")
    total = rep2["bytes"]  # the committed log the rebuilds read
    n_s, s1, s2 = statistics.median(native), statistics.median(l1), statistics.median(l2)
    rate = lambda s: total / s / MB  # noqa: E731
    result = {
        "commitlogBytes": total, "messages": rep2["messages"], "segments": rep2["segments"],
        "segmentBytes": args.segment_mb * MB, "recordSize": RECORD_SIZE, "queues": QUEUES,
        "cores": os.cpu_count(), "rawReadMBps": raw_bytes / raw_s / MB,
        "nativeSeconds": n_s, "nativeMBps": rate(n_s),
        "local1Seconds": s1, "local1MBps": rate(s1), "local1StartupSeconds": start1,
        "local2Seconds": s2, "local2MBps": rate(s2), "local2StartupSeconds": start2,
        "local1DriverApplySeconds": rep1["applySeconds"], "local2DriverApplySeconds": rep2["applySeconds"],
        "scalingLocal2VsLocal1": s1 / s2, "local1VsNative": n_s / s1, "local2VsNative": n_s / s2,
        "rounds": args.rounds, "nativeSecondsPerRound": native, "local1SecondsPerRound": l1,
        "local2SecondsPerRound": l2,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"commitlog           {total / MB:9.0f} MiB, {result['messages']} messages of {RECORD_SIZE} B over "
          f"{QUEUES} queues, {result['segments']} segments of {args.segment_mb} MiB (page cache), "
          f"{os.cpu_count()} cores")
    print(f"raw sequential read {raw_bytes / raw_s / MB:9.0f} MB/s")
    print(f"native rebuild      {rate(n_s):9.0f} MB/s  ({n_s:.2f} s, median of {args.rounds}; one process)")
    print(f"spark local[1]      {rate(s1):9.0f} MB/s  ({s1:.2f} s, median of {args.rounds}, of which the driver "
          f"replayed {rep1['applySeconds']:.2f} s; Spark start {start1:.1f} s not included)")
    print(f"spark local[2]      {rate(s2):9.0f} MB/s  ({s2:.2f} s, median of {args.rounds}, of which the driver "
          f"replayed {rep2['applySeconds']:.2f} s; Spark start {start2:.1f} s not included)")
    print(f"scaling             {s1 / s2:9.2f}x local[2] vs local[1]")
    print(f"vs native           {n_s / s1:9.2f}x local[1], {n_s / s2:.2f}x local[2] (>1: faster than one process)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
