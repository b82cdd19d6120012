# Owns mqadmin's master-slave migration checks: md5Commitlog (md5 of each of
# the last N commitlog files: RocketMQ's recommended consistency check
# between a master and its slave before a migration, for plain commitlog/
# stores and DLedger dledger-<id>/data alike) and compareCommitlog (the
# first record where two plain stores differ).  Read-only.
#
# Also the `migrate` group: check (pre-flight), align, apply (upgrade in
# place) and export (the way back); the work is done in tools/migrate/.
import contextlib
import json
import os

import click

from consumequeue.legacy_store import commitlog_dir_of, compare_commitlogs, md5_files
from tools.mqadmin import EXIT_PROBLEMS


@click.command("md5Commitlog")
@click.option("--store", "root", required=True, metavar="ROOT",
              help="storePathRootDir (commitlog/ or dledger-<id>/data), or the segment directory")
@click.option("--self-id", metavar="ID", help="which dledger-<ID> store under ROOT")
@click.option("--last", type=click.IntRange(min=1), default=2, show_default=True, metavar="N",
              help="how many of the last commitlog files")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def md5_commitlog_cmd(root, self_id, last, as_json):
    """md5 of each of the last N commitlog files (compare master and slave)."""
    directory = commitlog_dir_of(root, self_id)
    digests = md5_files(directory, last)
    if as_json:
        click.echo(json.dumps({"dir": directory, "files": [{"name": d.name, "size": d.size, "md5": d.md5}
                                                           for d in digests]}))
        return
    for d in digests:
        click.echo(f"{d.md5}  {d.name}  {d.size}")


@click.command("compareCommitlog")
@click.option("--store", "root", required=True, metavar="ROOT", help="a plain store (commitlog/)")
@click.option("--other", required=True, metavar="ROOT", help="the store to compare it with")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.pass_context
def compare_commitlog_cmd(ctx, root, other, as_json):
    """First commitlog offset whose record differs between two plain stores
    (over the range both hold).  Exit status 1 when they differ."""
    at = compare_commitlogs(root, other)
    if as_json:
        click.echo(json.dumps({"firstDifference": at}))
    else:
        click.echo("same" if at is None else f"first difference at commitlog offset {at}")
    if at is not None:
        ctx.exit(EXIT_PROBLEMS)


def register(group: click.Group) -> None:
    group.add_command(md5_commitlog_cmd)
    group.add_command(compare_commitlog_cmd)
    group.add_command(migrate_group)


# --- mqadmin migrate: check, align, apply, export (tools/migrate/) -----------------

@contextlib.contextmanager
def _progress(label: str, enabled: bool = True, *, counts: bool = False):
    """A rich progress bar on stderr (bytes, or `counts` of items); yields
    progress(done, total)."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn() if counts else DownloadColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)
        yield update


def _emit(as_json: bool, obj: dict, lines: list[str]) -> None:
    if as_json:
        click.echo(json.dumps(obj))
    else:
        for line in lines:
            click.echo(line)


@click.group("migrate")
def migrate_group():
    """Move a master-slave store onto ledgermq (check, align, apply) or back (export)."""


_store_opt = click.option("--store", "root", required=True, metavar="ROOT", help="storePathRootDir")
_json_opt = click.option("--json", "as_json", is_flag=True, help="print one JSON object")
_dry_opt = click.option("--dry-run", is_flag=True, help="report what would be done, change nothing")


@migrate_group.command("check")
@_store_opt
@click.option("--replica", "replicas", multiple=True, metavar="ROOT", help="a slave's store (repeatable)")
@click.option("--winner", metavar="ROOT", help="the copy that wins when the stores disagree")
@click.option("--last", type=click.IntRange(min=1), default=2, show_default=True, metavar="N",
              help="md5 of the last N commitlog files")
@_json_opt
@click.pass_context
def migrate_check_cmd(ctx, root, replicas, winner, last, as_json):
    """Pre-flight: every store sound, the replicas agreeing, and the plan to
    align them.  Exit status 1 unless ready to apply."""
    from tools.migrate.check import check_stores, render_text
    _require_dirs(root, *replicas, *([winner] if winner else []))
    report = check_stores([root, *replicas], last=last, winner=winner)
    _emit(as_json, report.to_json(), render_text(report))
    if not report.ok:
        ctx.exit(EXIT_PROBLEMS)


def _require_dirs(*roots: str) -> None:
    """A store path that is not a directory cannot be checked at all: one
    line naming it (exit 3), not a report about a store that is not there."""
    for root in roots:
        if not os.path.exists(root):
            raise ValueError(f"{root}: no such directory")
        if not os.path.isdir(root):
            raise ValueError(f"{root}: not a directory")
        if not os.access(root, os.R_OK | os.X_OK):
            raise ValueError(f"{root}: permission denied")


@migrate_group.command("align")
@_store_opt
@click.option("--replica", "replicas", multiple=True, metavar="ROOT", help="a slave's store (repeatable)")
@click.option("--winner", metavar="ROOT", help="the copy that wins when the stores disagree")
@_dry_opt
@_json_opt
@click.pass_context
def migrate_align_cmd(ctx, root, replicas, winner, dry_run, as_json):
    """Copy commitlog files (staging name, fsync, rename) so every store
    equals the reference; refuses while the stores disagree without --winner."""
    from tools.migrate.align import align
    from tools.migrate.check import check_stores
    _require_dirs(root, *replicas, *([winner] if winner else []))
    report = check_stores([root, *replicas], winner=winner)
    if report.problems:
        _emit(as_json, {"done": [], "problems": report.problems},
              [f"PROBLEM: {p}" for p in report.problems] + ["not aligning"])
        ctx.exit(EXIT_PROBLEMS)
    with _progress("aligning", not as_json) as bar:
        copied = [0]

        def progress(n: int) -> None:
            copied[0] += n
            if bar:
                bar(copied[0], copied[0])
        done = align(report, dry_run=dry_run, progress=progress)
    _emit(as_json, {"done": done, "dryRun": dry_run, "plan": [a.to_json() for a in report.plan]},
          done or ["nothing to do: the stores agree"])


@migrate_group.command("apply", epilog="""\b
The divided offset (where the DLedger log continues) comes from the old
files alone: the end of the old segment holding the last record.  The
DLedger data segment size is mappedFileSizeCommitLog: from -c broker.conf,
--segment-size, or the broker's default (1 GiB), the same rule the broker's
upgrade on start uses, so every replica of the group agrees.
Examples:
  mqadmin migrate apply -c conf/dledger/broker-n0.conf
  mqadmin migrate apply --store /data/rocketmq --self-id n0 --segment-size 1073741824""")
@click.option("-c", "--config", "conf", type=click.Path(exists=True, dir_okay=False), metavar="BROKER_CONF",
              help="the broker.conf the node will run with (storePathRootDir, dLegerSelfId, "
                   "mappedFileSizeCommitLog)")
@click.option("--store", "root", metavar="ROOT", help="storePathRootDir (default: from -c)")
@click.option("--self-id", metavar="ID", help="this node's dLegerSelfId (default: from -c)")
@click.option("--segment-size", type=click.IntRange(min=64), metavar="BYTES",
              help="mappedFileSizeCommitLog of the new DLedger store (default: from -c, else 1 GiB)")
@_dry_opt
@_json_opt
def migrate_apply_cmd(conf, root, self_id, segment_size, dry_run, as_json):
    """Upgrade a stopped master-slave store in place: the DLedger log
    continues the old commitlog at the divided offset (old files unchanged)."""
    from broker.store.upgrade import apply
    index_size = None
    if conf is not None:
        from broker.config import load_broker_config
        try:
            rc = load_broker_config(conf)[0].replication
        except ValueError as e:  # ConfigError: name the file it is in
            raise ValueError(f"{conf}: {e}") from None
        root, self_id = root or rc.store_path_root_dir, self_id or rc.self_id
        segment_size = segment_size or rc.mapped_file_size_commitlog
        index_size = rc.mapped_file_size_entry_index
    if not root or not self_id:
        raise click.UsageError("give --store and --self-id, or -c with the node's broker.conf")
    with _progress("completing consume queues and index", not as_json and not dry_run) as bar:
        plan = apply(root, self_id, data_segment_size=segment_size, index_segment_size=index_size,
                     progress=bar, dry_run=dry_run)
    lines = [f"{'would: ' if dry_run else ''}{a}" for a in plan.actions] + [f"done: {d}" for d in plan.done]
    lines += [f"warning: {w}" for w in plan.warnings]
    if not dry_run and not plan.already:
        lines.append(f"migrated: dividedCommitlogOffset {plan.divided}, DLedger segments of "
                     f"{plan.data_segment_size} bytes; start the broker with enableDLegerCommitLog=true, "
                     f"dLegerSelfId={self_id} and mappedFileSizeCommitLog={plan.data_segment_size}")
    _emit(as_json, {**plan.to_json(), "dryRun": dry_run}, lines)


@migrate_group.command("export")
@_store_opt
@click.option("--to", "to", required=True, metavar="DIR", help="where the plain store is written")
@click.option("--self-id", metavar="ID", help="which dledger-<ID> store under ROOT")
@click.option("--segment-size", type=click.IntRange(min=64), metavar="BYTES",
              help="commitlog segment size of the plain store")
@_dry_opt
@_json_opt
@click.pass_context
def migrate_export_cmd(ctx, root, to, self_id, segment_size, dry_run, as_json):
    """Write a plain master-slave store (commitlog, consume queues, index,
    checkpoint, config) from a stopped broker's committed data."""
    from tools.migrate.export import export
    with _progress("exporting entries", not as_json and not dry_run, counts=True) as bar:
        rep = export(root, to, self_id=self_id, segment_size=segment_size, dry_run=dry_run, progress=bar)
    lines = [f"{'would export' if dry_run else 'exported'} {rep.records} records "
             f"({rep.legacy_records} from the old commitlog, {rep.dledger_records} from DLedger) to {rep.to}"]
    lines += [f"PROBLEM: {p}" for p in rep.problems]
    _emit(as_json, rep.to_json(), lines)
    if rep.problems:
        ctx.exit(EXIT_PROBLEMS)
