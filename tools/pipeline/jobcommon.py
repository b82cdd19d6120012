# Owns what every pipeline job shares on the driver: planning the inputs
# (splits.plan_store per root, then one Spark job that scans the plain
# segments of old commitlogs to find where recovery would end them), running
# a per-split function over the splits in bounded waves while the driver
# consumes the results in log order, the command line of the spark-submit
# scripts (`spark-submit tools/pipeline/<job>.py --store ROOT ...`, on click:
# a runtime dependency, so the packed executor env has it too), and the
# one-line errors and exit codes (the same as mqadmin's).
import functools
import json
import queue
import sys
import threading

import attrs
import click

from tools.cli import CONTEXT, run_command
from tools.pipeline import segscan
from tools.pipeline import splits as S

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 3


@attrs.frozen
class JobOptions:
    stores: tuple
    out: str | None = None
    master: str | None = None
    self_id: str | None = None
    conf: tuple = ()  # ("key", "value") pairs for Spark
    progress: bool = True
    allow_fallback: bool = False  # executors may use the pure-Python scanner
    as_json: bool = False
    extra: tuple = ()  # job-specific ("name", value) pairs


def plan_inputs(spark, roots, *, self_id=None, allow_fallback=False, progress=None) -> list:
    """StorePlans for the roots, plain parts resolved (one task per plain
    segment; nothing runs when there is none)."""
    from tools.pipeline import hadoopfs
    plans = [hadoopfs.plan_uri_store(spark, r, self_id) if hadoopfs.is_uri(r) else S.plan_store(r, self_id)
             for r in roots]
    plain = [s for p in plans if p.plain_end is None for s in p.splits if s.mode == S.MODE_PLAIN]
    if not plain:
        return plans
    if progress is not None:
        progress.stage("find the end of old commitlogs", len(plain))
    sc = spark.sparkContext
    fn = functools.partial(segscan.plain_summary, allow_fallback=allow_fallback)
    sums = sc.parallelize(plain, len(plain)).map(fn).collect()
    by_split = dict(zip([(s.store, s.start) for s in plain], sums))
    out = []
    for p in plans:
        mine = [by_split[(s.store, s.start)] for s in p.splits if (s.store, s.start) in by_split]
        out.append(S.resolve_plain(p, mine) if p.plain_end is None else p)
    return out


def _collect(it):
    return list(it)


def in_waves(spark, items: list, fn, *, wave: int | None = None):
    """fn(item) for every item, one Spark task each, yielded in item order.
    Waves of `wave` tasks run ahead of the consumer (one wave in flight
    while the previous one is consumed), so the driver holds at most two
    waves of results whatever the store size."""
    if not items:
        return
    sc = spark.sparkContext
    wave = wave or max(2, sc.defaultParallelism * 2)
    rdd = sc.parallelize(items, len(items)).map(fn)
    results: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def produce():
        try:
            for first in range(0, len(items), wave):
                if stop.is_set():
                    return
                parts = list(range(first, min(len(items), first + wave)))
                results.put(("ok", sc.runJob(rdd, _collect, parts)))
            results.put(("end", None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            results.put(("error", exc))

    thread = threading.Thread(target=produce, name="pipeline-waves", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = results.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield from value
    finally:
        stop.set()
        while thread.is_alive():
            try:
                results.get(timeout=0.1)
            except queue.Empty:
                pass
        thread.join()


def spark_error_text(exc: BaseException) -> str:
    """One line for an exception that came back from an executor: the
    Python error's last line (our typed errors keep their message)."""
    text = str(exc)
    for marker in ("NativeMissingError: ", "SegmentReadError: ", "PipelineInputError: "):
        if marker in text:
            return marker[:-2] + ": " + text.split(marker, 1)[1].splitlines()[0]
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else type(exc).__name__


# --- the spark-submit scripts' command line ---------------------------------------

def _conf(ctx, param, value) -> tuple:
    try:
        return parse_conf(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc).removeprefix("--conf ")) from None


def job_command(job: str, description: str, run, render, options=()) -> click.Command:
    """The command of `spark-submit tools/pipeline/<job>.py`: the options
    every job shares, then the job's own `options` (click.Option), whose
    values reach the job as JobOptions.extra by parameter name; it runs
    run_job(run, ..., render) and returns its exit status."""
    shared = [
        click.Option(["--store", "stores"], multiple=True, required=True, metavar="ROOT",
                     help="a store root (repeat for several)"),
        click.Option(["--out"], metavar="DIR", help="output directory"),
        click.Option(["--master"], metavar="URL",
                     help="Spark master (default local[*]; ignored under spark-submit, which sets it)"),
        click.Option(["--self-id"], metavar="ID", help="which dledger-<ID> store under each ROOT"),
        click.Option(["--conf"], multiple=True, metavar="KEY=VALUE", callback=_conf, help="a Spark setting"),
        click.Option(["--no-progress"], is_flag=True, help="no progress display"),
        click.Option(["--allow-python-fallback"], is_flag=True,
                     help="executors without the native scanner use the pure-Python twin"),
        click.Option(["--json", "as_json"], is_flag=True, help="print one JSON object"),
    ]

    def callback(stores, out, master, self_id, conf, no_progress, allow_python_fallback, as_json, **extra) -> int:
        return run_job(run, JobOptions(tuple(stores), out, master, self_id, conf, not no_progress,
                                       allow_python_fallback, as_json, tuple(extra.items())), render)

    return click.Command(f"spark-submit tools/pipeline/{job}.py", params=[*shared, *options], callback=callback,
                         help=description, context_settings=CONTEXT)


def job_main(job: str, description: str, run, render, argv=None, options=()) -> int:
    """A job script's main(argv): its command run to an exit status."""
    return run_command(job_command(job, description, run, render, options), argv,
                       f"spark-submit tools/pipeline/{job}.py")


def parse_conf(pairs) -> tuple:
    out = []
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--conf {item!r}: expected KEY=VALUE")
        out.append((key.strip(), value))
    return tuple(out)


def run_job(job_fn, opts: JobOptions, render) -> int:
    """Build the session, run job_fn(spark, opts) -> (result dict, exit
    code), print it (JSON or render(result)), and map errors to one line
    and an exit code.  Shared by mqadmin and the spark-submit scripts."""
    from tools.pipeline.sparkenv import JavaMissingError, build_session, under_spark_submit
    if opts.as_json and under_spark_submit():
        # spark-submit merges the Python driver's stderr into its stdout:
        # a progress display there would corrupt the JSON.
        opts = attrs.evolve(opts, progress=False)
    try:
        spark = build_session(opts.master, dict(opts.conf))
    except JavaMissingError as exc:
        print(f"pipeline: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    try:
        result, code = job_fn(spark, opts)
    except (S.PipelineInputError, segscan.SegmentReadError, segscan.NativeMissingError, OSError,
            ValueError) as exc:
        print(f"pipeline: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # noqa: BLE001 - Py4J/Spark errors wrap the executor's
        if type(exc).__module__.startswith(("py4j", "pyspark")):
            print(f"pipeline: error: {spark_error_text(exc)}", file=sys.stderr)
            return EXIT_ERROR
        raise
    if opts.as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        render(result)
    return code
