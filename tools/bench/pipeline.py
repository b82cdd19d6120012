# Owns the Spark pipeline benchmark: `python -m tools.bench.pipeline`.
#
# Builds (once; reused by later runs) a ledgermq store of >= --size-mb of
# 1 KiB message records over 64 queues in --segment-mb data segments, all
# committed, with the dispatch benchmark's record template.  Then, from
# page cache, the pipeline's jobs on the same store, one contender after
# another (each with its own fresh JVM):
#   native      -- the single-process native rebuild (the broker's own
#                  DispatchEngine, tools.bench.dispatch.timed_rebuild);
#   local[1]    -- the jobs in Spark local mode with one executor core;
#   local[2]    -- the same with two;
#   standalone  -- a 2-worker standalone cluster on this machine (a master
#                  and two workers of 1 core each, tools/pipeline/standalone.py),
#                  ledgermq shipped to the executors as the packed venv
#                  (packenv.py), the driver in this process.
# Jobs: rebuild (consume queues + index into an emptied directory, final
# checkpoint fsync included), export (Parquet, overwritten each round) and
# stats (no output).  Times exclude starting Spark (reported apart) and are
# medians of --rounds after one warm-up round.  Printed: MB/s of the
# committed log per job and contender, local[2]/local[1], standalone/local[1]
# and standalone/local[2], and the rebuild against the native one.
# The job runs one task per segment: on a cluster, executors scan segments
# in parallel and only the compact records (about 15% of the log) reach the
# driver, which writes the files in log order.
import json
import os
import shutil
import statistics
import sys
import time
import types

import click

from commitlog.store import SegmentedStore, StoreConfig
from consumequeue import service
from native import dispatch as D
from tools.bench.dispatch import QUEUES, RECORD_SIZE, fill_store, raw_read_rate, timed_rebuild
from tools.cli import CONTEXT, run_command

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


JOBS = ("rebuild", "export", "stats")


def _run_job(spark, job: str, path: str, output: str, wave):
    from tools.pipeline import export, stats
    from tools.pipeline import jobcommon as J
    from tools.pipeline.rebuild import rebuild_plan
    if job == "rebuild":
        shutil.rmtree(output, ignore_errors=True)
        (plan,) = J.plan_inputs(spark, [path])
        return rebuild_plan(spark, plan, output, wave=wave).to_json()
    opts = J.JobOptions((path,), out=output if job == "export" else None, progress=False,
                        extra=(("mode", "overwrite"),))
    return (export if job == "export" else stats).run(spark, opts)[0]


def spark_seconds(path: str, output: str, master: str, rounds: int, log, wave=None, conf=None) -> dict:
    """{job: (median seconds, per-round seconds, last report)} plus the
    session's start time, for one contender on a fresh session."""
    from tools.pipeline.sparkenv import build_session, stop_session
    t0 = time.perf_counter()
    spark = build_session(master, {"spark.ui.enabled": "false", "spark.driver.memory": "4g", **(conf or {})})
    try:
        spark.sparkContext.parallelize(range(4), 2).map(lambda x: x).collect()  # start the Python workers
        out = {"startup": time.perf_counter() - t0}
        for job in JOBS:
            times, report = [], None
            for k in range(rounds + 1):  # round 0 warms the JVM and the workers up
                t1 = time.perf_counter()
                report = _run_job(spark, job, path, output, wave)
                if k:
                    times.append(time.perf_counter() - t1)
                log(f"  {master} {job} round {k}/{rounds}: {time.perf_counter() - t1:.2f} s", end="\r")
            out[job] = (statistics.median(times), times, report)
        return out
    finally:
        stop_session(spark)  # a fresh JVM for the next contender
        shutil.rmtree(output, ignore_errors=True)


def standalone_seconds(path: str, output: str, rounds: int, log, wave=None, workdir: str = "") -> dict:
    """The same on a 2-worker standalone cluster started (and stopped, by
    PID) here, executors running the packed environment of this tree."""
    from tools.pipeline import packenv
    from tools.pipeline.standalone import StandaloneCluster
    archive = packenv.packed_env(log=log)
    cluster = StandaloneCluster(os.path.join(workdir, "standalone"), workers=2, cores=1, memory="3g")
    cluster.start()
    saved = os.environ.get("PYSPARK_PYTHON")
    # A driver PySpark starts itself tells executors PYSPARK_PYTHON (it does
    # not read spark.pyspark.python then): the packed env's interpreter.
    os.environ["PYSPARK_PYTHON"] = packenv.submit_conf(archive)["spark.pyspark.python"]
    try:
        return spark_seconds(path, output, cluster.url, rounds, log, wave,
                             {**packenv.submit_conf(archive), "spark.executor.memory": "2g",
                              "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    finally:
        if saved is None:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = saved
        cluster.stop()


@click.command(context_settings=CONTEXT)
@click.option("--size-mb", type=int, default=2048, show_default=True, help="commitlog size to build (MiB)")
@click.option("--segment-mb", type=int, default=256, show_default=True,
              help="data segment size (MiB): one Spark task each")
@click.option("--dir", default="/tmp/ledgermq-bench-pipeline", show_default=True, help="where the store lives (reused)")
@click.option("--rounds", type=int, default=3, show_default=True,
              help="timed rounds per job and contender (medians reported)")
@click.option("--wave", type=int, help="segments scanned ahead of the driver (default 2x cores)")
@click.option("--no-standalone", is_flag=True, help="skip the standalone cluster contender")
@click.option("--json", is_flag=True, help="print one JSON object")
def command(**kw) -> int:
    """The Spark pipeline benchmark: each job on local[1], local[2] and a standalone cluster vs the native rebuild."""
    args = types.SimpleNamespace(**kw)
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
    runs = {"local[1]": spark_seconds(path, output, "local[1]", args.rounds, log, args.wave),
            "local[2]": spark_seconds(path, output, "local[2]", args.rounds, log, args.wave)}
    if not args.no_standalone:
        runs["standalone"] = standalone_seconds(path, output, args.rounds, log, args.wave, args.dir)
    log("")
    rep = runs["local[2]"]["rebuild"][2]
    total = rep["bytes"]  # the committed log every job reads
    n_s = statistics.median(native)
    rate = lambda s: total / s / MB  # noqa: E731
    result = {"commitlogBytes": total, "messages": rep["messages"], "segments": rep["segments"],
              "segmentBytes": args.segment_mb * MB, "recordSize": RECORD_SIZE, "queues": QUEUES,
              "cores": os.cpu_count(), "rounds": args.rounds, "rawReadMBps": raw_bytes / raw_s / MB,
              "nativeRebuildSeconds": n_s, "nativeRebuildMBps": rate(n_s), "nativeSecondsPerRound": native,
              "contenders": {}}
    for name, run in runs.items():
        result["contenders"][name] = {"startupSeconds": run["startup"], **{
            job: {"seconds": run[job][0], "MBps": rate(run[job][0]), "secondsPerRound": run[job][1]}
            for job in JOBS}}
        result["contenders"][name]["rebuild"]["driverApplySeconds"] = run["rebuild"][2]["applySeconds"]
    ratios = {}
    for job in JOBS:
        sec = {name: run[job][0] for name, run in runs.items()}
        ratios[job] = {"local2VsLocal1": sec["local[1]"] / sec["local[2]"]}
        if "standalone" in sec:
            ratios[job].update(standaloneVsLocal1=sec["local[1]"] / sec["standalone"],
                               standaloneVsLocal2=sec["local[2]"] / sec["standalone"])
    ratios["rebuild"].update({f"{name}VsNative": n_s / run["rebuild"][0] for name, run in runs.items()})
    result["ratios"] = ratios
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"commitlog           {total / MB:9.0f} MiB, {result['messages']} messages of {RECORD_SIZE} B over "
          f"{QUEUES} queues, {result['segments']} segments of {args.segment_mb} MiB (page cache), "
          f"{os.cpu_count()} cores; medians of {args.rounds} rounds")
    print(f"raw sequential read {raw_bytes / raw_s / MB:9.0f} MB/s")
    print(f"native rebuild      {rate(n_s):9.0f} MB/s  ({n_s:.2f} s; one process)")
    names = list(runs)
    print(f"{'job':<12}" + "".join(f"{n:>14}" for n in names) + "   (MB/s of the committed log; Spark start "
          + ", ".join(f"{n} {runs[n]['startup']:.1f} s" for n in names) + " not included)")
    for job in JOBS:
        print(f"{job:<12}" + "".join(f"{rate(runs[n][job][0]):>14.0f}" for n in names))
    for job in JOBS:
        r = ratios[job]
        line = f"{job:<12} local[2]/local[1] {r['local2VsLocal1']:.2f}x"
        if "standaloneVsLocal1" in r:
            line += f", standalone/local[1] {r['standaloneVsLocal1']:.2f}x, " \
                    f"standalone/local[2] {r['standaloneVsLocal2']:.2f}x"
        print(line)
    print("rebuild vs native   " + ", ".join(f"{n} {ratios['rebuild'][f'{n}VsNative']:.2f}x" for n in names)
          + " (>1: faster than one process); the driver replayed "
          + ", ".join(f"{n} {runs[n]['rebuild'][2]['applySeconds']:.2f} s" for n in names))
    return 0


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.bench.pipeline")


if __name__ == "__main__":
    sys.exit(main())
