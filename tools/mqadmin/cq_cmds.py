# Owns mqadmin's consume-queue commands: rebuildConsumeQueue (offline full
# rebuild of consume queues and index files from the committed log), the
# consume-queue check behind `verifyStore --cq` (every unit, and the
# contiguity of queue offsets; verifyStore itself is store_cmds') and the
# CQ / index format options both commands take.
import contextlib
import json
import os
import sys

import click

from consumequeue.dispatcher import DispatchConfig

PROGRESS_MIN_BYTES = 64 << 20  # below this a rebuild takes well under a second


def _config(cq_file_size, index_slots, index_items) -> DispatchConfig:
    return DispatchConfig(cq_file_size=cq_file_size, index_slot_num=index_slots, index_num=index_items)


def _multiple_of_20(_ctx, _param, value: int) -> int:
    if value % 20:
        raise click.BadParameter("must be a multiple of 20")
    return value


def format_options(f):
    """--cq-file-size, --index-slots, --index-items.  They must match the
    broker's own settings (RocketMQ defaults)."""
    f = click.option("--index-items", type=click.IntRange(min=2), default=20_000_000, show_default=True,
                     help="maxIndexNum of index files")(f)
    f = click.option("--index-slots", type=click.IntRange(min=1), default=5_000_000, show_default=True,
                     help="maxHashSlotNum of index files")(f)
    f = click.option("--cq-file-size", type=click.IntRange(min=20), default=6_000_000, show_default=True,
                     callback=_multiple_of_20, help="mappedFileSizeConsumeQueue (a multiple of 20)")(f)
    return f


@click.command("rebuildConsumeQueue")
@click.option("--store", "root", required=True, metavar="ROOT", help="storePathRootDir of a stopped broker")
@click.option("--self-id", metavar="ID", help="which dledger-<ID> store under ROOT")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@format_options
def rebuild_cmd(root, self_id, as_json, cq_file_size, index_slots, index_items):
    """Delete and rebuild every consume queue and index file from the
    committed commitlog (offline: the broker must be stopped)."""
    from consumequeue.rebuild import open_store, rebuild_store
    from consumequeue.service import positions

    store = open_store(root, self_id)
    try:
        p = positions(store)
        total = p.committed_pos - p.begin_pos
        show = not as_json and sys.stderr.isatty() and total >= PROGRESS_MIN_BYTES
        with _progress(show, total) as progress:
            report = rebuild_store(root, config=_config(cq_file_size, index_slots, index_items),
                                   progress=progress, store=store)
    finally:
        store.close()
    if as_json:
        click.echo(json.dumps(report.to_json()))
        return
    mib = report.bytes / (1 << 20)
    rate = mib / report.seconds if report.seconds else 0.0
    click.echo(f"store        {root}")
    click.echo(f"commitlog    [{report.begin_pos}, {report.end_pos}) {mib:.1f} MiB, committed index "
               f"{report.committed_index}")
    click.echo(f"dispatched   {report.stats.entries} entries, {report.stats.messages} messages"
               + (f" ({report.stats.bad_messages} malformed, skipped)" if report.stats.bad_messages else ""))
    click.echo(f"wrote        {report.queues} consume queues, {report.index_files} index files")
    click.echo(f"took         {report.seconds:.2f} s ({rate:.0f} MiB/s)")


@contextlib.contextmanager
def _progress(show: bool, total: int, console=None):
    if not show:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    with Progress("rebuilding", BarColumn(), DownloadColumn(binary_units=True), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=console or Console(stderr=True), transient=True) as bar:
        task = bar.add_task("rebuild", total=total)
        yield lambda done, _total: bar.update(task, completed=done)


def verify_consume_queues(root: str, self_id: str | None, *, cq_file_size: int, index_slots: int,
                          index_items: int):
    """The --cq check of verifyStore, read-only."""
    from commitlog.scan import resolve_store_dir
    from consumequeue.migrated import load_marker, offline_layered_source
    from consumequeue.source import CommitlogSource
    from consumequeue.verify import offline_span, verify
    store_dir = resolve_store_dir(root, self_id)
    span = offline_span(store_dir)
    source = CommitlogSource(span.data_dir, segment_size=span.data_segment_size)
    cq_root = os.path.dirname(os.path.abspath(store_dir)) if os.path.basename(
        os.path.abspath(store_dir)).startswith("dledger-") else root
    begin, end = span.begin_pos, span.committed_pos
    marker = load_marker(store_dir)
    if marker is not None:  # migrated from master-slave: the old commitlog comes first
        source, begin, end = offline_layered_source(cq_root, source, marker, span)
    try:
        return span, verify(source, begin, end, root=cq_root, check_cq=True,
                            cq_file_size=cq_file_size, index_slot_num=index_slots, index_num=index_items)
    finally:
        source.close()


def register(group: click.Group) -> None:
    group.add_command(rebuild_cmd)
