# Owns mqadmin's offline store commands, verifyStore and dumpStore.  They
# read a store directory (ours or stock DLedger/RocketMQ, any segment sizes)
# through commitlog.scan and never write to it; errors are translated to
# one-line messages by the mqadmin group.
#
# verifyStore checks three layers: every DLedger entry (as recovery would),
# the RocketMQ message record inside every NORMAL entry (DEFAULT_BODY_CHECK,
# replaceable with --body-check, off with --body-check ''), and with --cq
# every consume queue unit and the contiguity of queue offsets (the check
# itself lives with the other consume-queue commands in cq_cmds).
import importlib
import json

import click

from commitlog.scan import StoreReader, resolve_store_dir, verify_store
from tools.mqadmin import EXIT_PROBLEMS
from tools.mqadmin.cq_cmds import format_options, verify_consume_queues

# "module:function" of the checker verifyStore runs on every NORMAL entry
# body when --body-check is not given: a body carrying a message magic must
# be exactly one good RocketMQ record at entry pos + 48.
DEFAULT_BODY_CHECK = "consumequeue.record:check_entry_body"


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
              show_default=DEFAULT_BODY_CHECK,
              help="checker(header, body) -> reason or None, run on every NORMAL entry ('' for none)")
@click.option("--cq", is_flag=True, help="also check every consume queue unit and queue offset contiguity")
@format_options
@click.pass_context
def verify_store_cmd(ctx, root, self_id, as_json, body_check, cq, cq_file_size, index_slots, index_items):
    """Walk every entry of a store and check it as recovery would.

    Exit status: 0 clean, 1 problems found, 2 usage error, 3 unreadable."""
    store_dir = _store_dir(root, self_id)
    summary = verify_store(store_dir, _load_checker(body_check))
    out = summary.as_dict()
    span = rep = None
    if cq:
        span, rep = verify_consume_queues(root, self_id, cq_file_size=cq_file_size, index_slots=index_slots,
                                          index_items=index_items)
        out["consumeQueues"] = {"committedIndex": span.committed_index, "committedPos": span.committed_pos,
                                **rep.to_json()}
    if as_json:
        click.echo(json.dumps(out))
    else:
        click.echo(f"store      {summary.store_dir}")
        click.echo(f"segments   {summary.segments} data of {summary.data_segment_size} bytes, "
                   f"{summary.index_segments} index of {summary.index_segment_size} bytes")
        entries = f" (index {summary.first_index} .. {summary.last_index})" if summary.entries else ""
        click.echo(f"entries    {summary.entries}{entries}")
        click.echo(f"committed  {summary.committed_index} (checkpoint endIndex {summary.checkpoint_end_index})")
        click.echo(f"problems   {len(summary.problems) or 'none'}")
        for p in summary.problems:
            click.echo(f"  {p.file} at offset {p.offset}: {p.reason}")
        if rep is not None:
            click.echo(f"messages   {rep.messages} in [{span.begin_pos}, {span.committed_pos}) "
                       f"(committed index {span.committed_index})")
            click.echo(f"queues     {rep.queues}, {rep.units_checked} units checked, "
                       f"problems {len(rep.problems) or 'none'}")
            for p in rep.problems:
                click.echo(f"  {p}")
            if rep.truncated:
                click.echo("  (more problems not shown)")
    if summary.problems or (rep is not None and not rep.ok):
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
