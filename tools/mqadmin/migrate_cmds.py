# Owns mqadmin's master-slave migration checks: md5Commitlog (md5 of each of
# the last N commitlog files: RocketMQ's recommended consistency check
# between a master and its slave before a migration, for plain commitlog/
# stores and DLedger dledger-<id>/data alike) and compareCommitlog (the
# first record where two plain stores differ).  Read-only.
import json

import click

from broker.legacy_store import commitlog_dir_of, compare_commitlogs, md5_files
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
