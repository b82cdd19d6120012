# Owns `mqadmin pipeline <job>`: the Spark pipeline's jobs (tools/pipeline/)
# from mqadmin, with the same options and exit codes as the spark-submit
# scripts (jobcommon.run_job does the work for both).  PySpark is an
# optional extra (`pip install ledgermq[spark]`); without it these commands
# say so in one line.
import sys

import click

from tools.mqadmin import EXIT_ERROR


def _common(fn):
    options = [
        click.option("--store", "stores", multiple=True, required=True, metavar="ROOT",
                     help="a store root (repeat for several)"),
        click.option("--out", metavar="DIR", help="output directory"),
        click.option("--master", metavar="URL", help="Spark master URL (default local[*])"),
        click.option("--self-id", metavar="ID", help="which dledger-<ID> store under each ROOT"),
        click.option("--conf", "conf", multiple=True, metavar="KEY=VALUE", help="a Spark setting"),
        click.option("--no-progress", is_flag=True, help="no progress display"),
        click.option("--allow-python-fallback", is_flag=True,
                     help="executors without the native scanner use the pure-Python twin"),
        click.option("--json", "as_json", is_flag=True, help="print one JSON object"),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def _run(module: str, kw: dict, extra: dict) -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        click.echo("mqadmin: error: PySpark is not installed (pip install 'ledgermq[spark]')", err=True)
        sys.exit(EXIT_ERROR)
    import importlib

    from tools.pipeline import jobcommon as J
    job = importlib.import_module(f"tools.pipeline.{module}")
    opts = J.JobOptions(tuple(kw["stores"]), kw["out"], kw["master"], kw["self_id"], J.parse_conf(kw["conf"]),
                        not kw["no_progress"], kw["allow_python_fallback"], kw["as_json"], tuple(extra.items()))
    sys.exit(J.run_job(job.run, opts, job.render))


@click.group("pipeline")
def pipeline():
    """Batch jobs over stores on Spark: rebuild, export, stats, audit; and
    stage, which copies a live store's sealed segments for them."""


@pipeline.command("rebuild")
@_common
@click.option("--cq-file-size", type=int, help="mappedFileSizeConsumeQueue (bytes, default 6000000)")
@click.option("--index-slots", type=int, help="maxHashSlotNum (default 5000000)")
@click.option("--index-items", type=int, help="maxIndexNum (default 20000000)")
@click.option("--wave", type=int, help="segments scanned ahead of the driver (default 2x cores)")
def rebuild_cmd(cq_file_size, index_slots, index_items, wave, **kw):
    """Consume queues and index files, written into each ROOT (or --out).
    The broker must be stopped."""
    _run("rebuild", kw, {"cq_file_size": cq_file_size, "index_slots": index_slots,
                         "index_items": index_items, "wave": wave})


@pipeline.command("export")
@_common
@click.option("--mode", type=click.Choice(["errorifexists", "overwrite", "append"]), default="errorifexists",
              show_default=True, help="what to do when --out already holds data")
@click.option("--since-checkpoint", metavar="DIR",
              help="export only entries committed since the last run recorded in DIR (created if new)")
def export_cmd(mode, since_checkpoint, **kw):
    """Committed messages to Parquet in --out, partitioned by topic and date
    (with --since-checkpoint: only what was committed since the last run)."""
    _run("export", kw, {"mode": mode, "since_checkpoint": since_checkpoint})


@pipeline.command("stats")
@_common
def stats_cmd(**kw):
    """Per topic/queue counts, bytes, time ranges, size histograms, tag/key
    cardinalities (with --out also as stats.json and Parquet)."""
    _run("stats", kw, {})


@pipeline.command("audit")
@_common
def audit_cmd(**kw):
    """Compare the committed prefixes of a group's replicas (two or more
    --store).  Exit status 1 when they diverge."""
    _run("audit", kw, {})


@pipeline.command("stage")
@click.option("--store", "store", required=True, metavar="ROOT", help="the live broker's store root")
@click.option("--to", "dest", required=True, metavar="DIR",
              help="where executors read it: a shared filesystem path")
@click.option("--self-id", metavar="ID", help="which dledger-<ID> store under ROOT")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def stage_cmd(store, dest, self_id, as_json):
    """Copy the sealed, fully committed segments of a live store to DIR,
    with sha256 checksums and a manifest (no Spark needed).  Rerun to stage
    what was sealed since; jobs then read DIR (or a copy of it on HDFS/S3)."""
    import json

    from tools.pipeline import stage
    from tools.pipeline.splits import PipelineInputError
    try:
        report = stage.stage_store(store, dest, self_id, log=lambda m: click.echo(m, err=True))
    except (PipelineInputError, OSError) as exc:
        click.echo(f"mqadmin: error: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        stage.render(report.to_json())


def register(group: click.Group) -> None:
    group.add_command(pipeline)
