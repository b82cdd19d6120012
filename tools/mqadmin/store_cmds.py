# Owns mqadmin's offline store commands, verifyStore and dumpStore.  They
# read a store directory (ours or stock DLedger/RocketMQ, any segment sizes)
# through commitlog.scan and never write to it; errors are translated to
# one-line messages by the mqadmin group.
import importlib
import json

import click

from commitlog.scan import StoreReader, resolve_store_dir, verify_store
from tools.mqadmin import EXIT_PROBLEMS

# "module:function" of the checker run on every NORMAL entry body by
# verifyStore when --body-check is not given (the RocketMQ message check,
# once the broker codec provides one); None runs no body check.
DEFAULT_BODY_CHECK: str | None = None


def _store_dir(root: str, self_id: str | None) -> str:
    try:
        return resolve_store_dir(root, self_id)
    except ValueError as exc:  # several stores, no --self-id: the user must choose
        raise click.UsageError(str(exc)) from None


def _load_checker(spec: str | None):
    if not spec:
        return None
    module_name, _, func_name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise click.UsageError(f"--body-check {spec}: cannot load it ({exc})") from None


_store_option = click.option("--store", "root", required=True, metavar="ROOT",
                             help="storePathRootDir holding dledger-<id>/ (or a dledger-<id> directory)")
_self_id_option = click.option("--self-id", metavar="ID", help="which dledger-<ID> store under ROOT")


@click.command("verifyStore")
@_store_option
@_self_id_option
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("--body-check", metavar="MODULE:FUNCTION", default=lambda: DEFAULT_BODY_CHECK,
              help="checker(header, body) -> reason or None, run on every NORMAL entry")
@click.pass_context
def verify_store_cmd(ctx, root, self_id, as_json, body_check):
    """Walk every entry of a store and check it as recovery would.

    Exit status: 0 clean, 1 problems found, 2 usage error, 3 unreadable."""
    summary = verify_store(_store_dir(root, self_id), _load_checker(body_check))
    if as_json:
        click.echo(json.dumps(summary.as_dict()))
    else:
        click.echo(f"store      {summary.store_dir}")
        click.echo(f"segments   {summary.segments} data of {summary.data_segment_size} bytes, "
                   f"{summary.index_segments} index of {summary.index_segment_size} bytes")
        span = f" (index {summary.first_index} .. {summary.last_index})" if summary.entries else ""
        click.echo(f"entries    {summary.entries}{span}")
        click.echo(f"committed  {summary.committed_index} (checkpoint endIndex {summary.checkpoint_end_index})")
        click.echo(f"problems   {len(summary.problems) or 'none'}")
        for p in summary.problems:
            click.echo(f"  {p.file} at offset {p.offset}: {p.reason}")
    if summary.problems:
        ctx.exit(EXIT_PROBLEMS)


@click.command("dumpStore")
@_store_option
@_self_id_option
@click.option("--from", "from_index", type=click.IntRange(min=0), default=None, metavar="I",
              help="first index to print (default: the first entry)")
@click.option("--count", type=click.IntRange(min=0), default=100, show_default=True, metavar="N",
              help="how many entries to print")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per line")
@click.pass_context
def dump_store_cmd(ctx, root, self_id, from_index, count, as_json):
    """Print entries: index, term, pos, size, magic and body length."""
    reader = StoreReader.open(_store_dir(root, self_id))
    try:
        if not as_json:
            click.echo(f"{'index':>10} {'term':>6} {'pos':>14} {'size':>8} {'magic':>5} {'bodyLen':>8}  file+offset")
        printed = 0
        entries = reader.entries(from_index)
        for h, body, path, offset in entries:
            if printed >= count:
                break
            if as_json:
                click.echo(json.dumps({"index": h.index, "term": h.term, "pos": h.pos, "size": h.size,
                                       "magic": h.magic, "bodyLength": h.body_size, "chainCrc": h.chain_crc,
                                       "bodyCrc": h.body_crc, "file": path, "offset": offset}))
            else:
                click.echo(f"{h.index:>10} {h.term:>6} {h.pos:>14} {h.size:>8} {h.magic:>5} {h.body_size:>8}"
                           f"  {path.rsplit('/', 1)[-1]}+{offset}")
            printed += 1
        entries.close()
    finally:
        reader.close()
    for p in reader.problems:
        click.echo(f"mqadmin: problem: {p.file} at offset {p.offset}: {p.reason}", err=True)
    if reader.problems:
        ctx.exit(EXIT_PROBLEMS)


def register(group: click.Group) -> None:
    group.add_command(verify_store_cmd)
    group.add_command(dump_store_cmd)
