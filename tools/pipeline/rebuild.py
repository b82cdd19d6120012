# Owns the `rebuild` job: consume queues and index files of a store rebuilt
# on Spark, byte-identical to what the broker's dispatcher writes for the
# same committed data (consumequeue/dispatcher.py, consumequeue/rebuild.py).
#
# Executors do the heavy part: one task per segment maps the file and runs
# the native dispatch scanner over its committed bytes, then ships back the
# scanner's records plus only the bytes they point at (segscan.compact:
# about 15% of the log for 1 KiB messages).  The driver replays those
# batches, in log order, through the dispatcher's own DispatchEngine: the
# same grouping, CQ staging and IndexFile insertion code as the broker, so
# the files cannot differ (IndexFile content depends on insertion order,
# which log order fixes).  The segments stream in waves (jobcommon.in_waves)
# so the driver's memory does not grow with the store.
#
# Output goes into the store root itself (the broker must be stopped: the
# store's lock is taken, as mqadmin rebuildConsumeQueue does) or into --out.
# Usage: spark-submit tools/pipeline/rebuild.py --store ROOT [--out DIR]
import fcntl
import functools
import os
import sys
import time

import attrs
import click

from commitlog.store import LOCK_FILE
from consumequeue.cq import DEFAULT_FILE_SIZE
from consumequeue.dispatcher import DispatchConfig, DispatchEngine
from consumequeue.errors import DispatchError
from consumequeue.indexfile import DEFAULT_INDEX_NUM, DEFAULT_SLOT_NUM
from consumequeue.source import CommitlogSource
from native.dispatch import MODE_PLAIN, STOP_BLANK, STOP_END, STOP_NAMES, default_backend
from tools.pipeline import jobcommon as J
from tools.pipeline import segscan
from tools.pipeline import splits as S


@attrs.frozen
class RebuildReport:
    root: str
    out: str
    kind: str
    segments: int
    begin_pos: int
    end_pos: int
    committed_index: int
    entries: int
    messages: int
    bad_messages: int
    queues: int
    index_files: int
    seconds: float
    apply_seconds: float  # the driver's own share: replaying the records into the files
    executor_backends: tuple

    def to_json(self) -> dict:
        return {"root": self.root, "out": self.out, "kind": self.kind, "segments": self.segments,
                "beginPos": self.begin_pos, "endPos": self.end_pos, "bytes": self.end_pos - self.begin_pos,
                "committedIndex": self.committed_index, "entries": self.entries, "messages": self.messages,
                "badMessages": self.bad_messages, "queues": self.queues, "indexFiles": self.index_files,
                "seconds": round(self.seconds, 3), "applySeconds": round(self.apply_seconds, 3),
                "executorBackends": list(self.executor_backends)}


class _StoreLock:
    """The DLedger store's lock file, held while rebuilding into its root
    (keeps a broker from starting meanwhile; fails if one runs)."""

    def __init__(self, plan: S.StorePlan):
        self.path = os.path.join(plan.dledger.store_dir, LOCK_FILE) if plan.dledger else None
        self.fd = -1

    def __enter__(self):
        if self.path:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(self.fd)
                raise S.PipelineInputError(f"{self.path}: the store is in use (stop the broker first)") from None
        return self

    def __exit__(self, *exc):
        if self.fd >= 0:
            os.close(self.fd)


def _check_split(split: S.Split, end: segscan.ScanEnd, last: bool) -> None:
    """A split's scan must cover exactly its bytes: a segment ends with its
    filler (or fills up exactly), the last one at the committed bound."""
    where = split.path
    if end.err_code or end.stop not in (STOP_END, STOP_BLANK):
        from native.dispatch import ERR_TEXT
        what = ERR_TEXT.get(end.err_code, STOP_NAMES[end.stop]) if end.err_code else \
            f"the log stops here ({STOP_NAMES[end.stop]})"
        raise segscan.SegmentReadError(where, end.err_at - split.start, what)
    if end.stop == STOP_END and end.end != split.end:
        raise segscan.SegmentReadError(where, end.end - split.start, "scan ended before the split's end")
    if end.stop == STOP_BLANK and last and split.mode != MODE_PLAIN:
        raise segscan.SegmentReadError(where, end.end - split.start,
                                       "blank filler before the committed position")


def rebuild_plan(spark, plan: S.StorePlan, out_root: str, *, config: DispatchConfig | None = None,
                 allow_fallback: bool = False, progress=None, wave: int | None = None) -> RebuildReport:
    config = config or DispatchConfig()
    t0 = time.perf_counter()
    if plan.dledger is not None:
        source = CommitlogSource(os.path.join(plan.dledger.store_dir, "data"), segment_size=plan.dledger.seg_size
                                 or None)
    else:
        source = CommitlogSource(os.path.dirname(plan.splits[0].path) if plan.splits else out_root,
                                 mode=MODE_PLAIN)
    os.makedirs(out_root, exist_ok=True)
    engine = DispatchEngine(out_root, source, config=config, backend=default_backend())
    backends = set()
    applying = 0.0
    try:
        engine.reset(plan.begin_pos)
        fn = functools.partial(segscan.compact_split, allow_fallback=allow_fallback,
                               batch_records=config.batch_records)
        label = f"rebuild {os.path.basename(os.path.abspath(plan.root))}"
        bar = progress.bar(label, len(plan.splits)) if progress else None
        n = len(plan.splits)
        for k, (split, (end, batches)) in enumerate(zip(plan.splits, J.in_waves(spark, list(plan.splits), fn,
                                                                                 wave=wave))):
            _check_split(split, end, k == n - 1)
            if split.mode != MODE_PLAIN and end.entries and engine.last_index >= 0 \
                    and end.first_index != engine.last_index + 1:
                raise segscan.SegmentReadError(split.path, 0, f"first entry {end.first_index} does not follow "
                                                              f"entry {engine.last_index}")
            backends.add(end.backend)
            t1 = time.perf_counter()
            engine.pos = split.start + split.skip
            for batch in batches:
                blob, res = segscan.replay_result(engine.backend, batch)
                # The dispatcher's own per-batch step (grouping, CQ staging,
                # index insertion); only the reading of the log is ours.
                engine.apply_scanned(memoryview(blob), res)
            engine.stats.entries += end.entries  # (NOOP-only batches bring no records)
            engine.stats.bytes += split.length
            if split.mode != MODE_PLAIN and end.last_index >= 0:
                engine.last_index = end.last_index
            engine.pos = split.end if end.stop == STOP_END else split.start + split.seg_size
            applying += time.perf_counter() - t1
            if bar:
                progress.advance(bar)
        engine.flush_scanned()
        engine.pos = plan.end_pos
        if plan.committed_index >= 0 and engine.last_index != plan.committed_index:
            raise DispatchError(engine.pos, f"rebuild stopped at entry {engine.last_index}, expected the "
                                            f"committed entry {plan.committed_index}")
        engine.checkpoint()
        return RebuildReport(plan.root, out_root, plan.kind, len(plan.splits), plan.begin_pos, plan.end_pos,
                             plan.committed_index, engine.stats.entries, engine.stats.messages,
                             engine.stats.bad_messages, len(engine.cqs.queues), len(engine.index.files),
                             time.perf_counter() - t0, applying, tuple(sorted(backends)))
    finally:
        engine.close()
        source.close()


def dispatch_config(extra: dict) -> DispatchConfig:
    return DispatchConfig(cq_file_size=extra.get("cq_file_size") or DEFAULT_FILE_SIZE,
                          index_slot_num=extra.get("index_slots") or DEFAULT_SLOT_NUM,
                          index_num=extra.get("index_items") or DEFAULT_INDEX_NUM)


def out_root_for(root: str, out: str | None, several: bool) -> str:
    if out is None:
        return root
    return os.path.join(out, os.path.basename(os.path.abspath(root))) if several else out


def run(spark, opts: J.JobOptions) -> tuple[dict, int]:
    from tools.pipeline.hadoopfs import local_path
    from tools.pipeline.sparkenv import Progress
    opts = attrs.evolve(opts, stores=tuple(local_path(r, "rebuild") for r in opts.stores))
    extra = dict(opts.extra)
    config = dispatch_config(extra)
    reports = []
    names = [os.path.basename(os.path.abspath(r)) for r in opts.stores]
    if opts.out and len(set(names)) < len(names):
        raise S.PipelineInputError(f"--out {opts.out}: several stores named alike ({', '.join(names)}) "
                                   f"would share one output root; rebuild them in separate runs")
    with Progress(spark, opts.progress) as progress:
        plans = J.plan_inputs(spark, opts.stores, self_id=opts.self_id, allow_fallback=opts.allow_fallback,
                              progress=progress)
        for plan in plans:
            out_root = out_root_for(plan.root, opts.out, len(plans) > 1)
            same = os.path.abspath(out_root) == os.path.abspath(plan.root)
            lock = _StoreLock(plan) if same else _StoreLock(attrs.evolve(plan, dledger=None))
            with lock:
                reports.append(rebuild_plan(spark, plan, out_root, config=config,
                                            allow_fallback=opts.allow_fallback, progress=progress,
                                            wave=extra.get("wave")))
    return {"job": "rebuild", "stores": [r.to_json() for r in reports],
            "notes": [n for p in plans for n in p.notes]}, J.EXIT_OK


def render(result: dict) -> None:
    for r in result["stores"]:
        mib = r["bytes"] / (1 << 20)
        print(f"{r['root']} ({r['kind']}): {r['messages']} messages in {r['segments']} segments "
              f"({mib:.1f} MiB) -> {r['queues']} consume queues, {r['indexFiles']} index file(s) in "
              f"{r['out']}; {r['seconds']:.2f} s ({mib / max(r['seconds'], 1e-9):.1f} MiB/s), "
              f"executors: {', '.join(r['executorBackends']) or '-'}")
    for note in result["notes"]:
        print(f"note: {note}")


OPTIONS = (  # reach run() as JobOptions.extra, by these names
    click.Option(["--cq-file-size"], type=int, help="mappedFileSizeConsumeQueue (bytes, default 6000000)"),
    click.Option(["--index-slots"], type=int, help="maxHashSlotNum (default 5000000)"),
    click.Option(["--index-items"], type=int, help="maxIndexNum (default 20000000)"),
    click.Option(["--wave"], type=int, help="segments scanned ahead of the driver (default 2x cores)"),
)


def main(argv=None) -> int:
    return J.job_main("rebuild", "Rebuild consume queues and index files of store roots on Spark.", run, render,
                      argv, OPTIONS)


if __name__ == "__main__":
    # Run as a script (spark-submit): call the module by its package name so
    # the functions shipped to executors are importable there.
    from tools.pipeline.rebuild import main as _main
    sys.exit(_main())
