# Owns the `mqadmin` click group and the one translation point from
# ledgermq errors to one-line messages and exit codes.  Commands live in
# tools/mqadmin/<area>_cmds.py modules, registered below; a module that
# registers commands exposes `register(group)`.
import importlib
import sys

import click

from broker.telemetry.commands import CauseFirstGroup
from broker.telemetry.logs import cli_logging, log_options, version_text
from commitlog.errors import CommitLogError

# Each area of the tree adds its commands in its own module, so parallel work
# never edits the same file.
COMMAND_MODULES = [
    "tools.mqadmin.store_cmds",
    "tools.mqadmin.cq_cmds",
    "tools.mqadmin.migrate_cmds",
    "tools.mqadmin.cluster_cmds",
    "tools.mqadmin.topic_cmds",
    "tools.mqadmin.consumer_cmds",
    "tools.mqadmin.message_cmds",
    "tools.mqadmin.dledger_cmds",
    "tools.mqadmin.member_cmds",
    "tools.mqadmin.restart_cmds",
    "tools.mqadmin.namesrv_cmds",
    "tools.mqadmin.pipeline_cmds",
]

EXIT_PROBLEMS = 1  # the command ran and found problems (verify, compare, ...)
EXIT_USAGE = 2  # click's own code for usage errors; kept for our own too
EXIT_ERROR = 3  # the command could not run (unreadable store, unreachable server)


class MQAdminGroup(CauseFirstGroup):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (CommitLogError, OSError, ValueError) as exc:
            # A user mistake or an environment problem: one line, no traceback.
            click.echo(f"mqadmin: error: {describe(exc)}", err=True)
            sys.exit(EXIT_ERROR)


def describe(exc: BaseException) -> str:
    """One line naming the path and the cause: an OSError reads
    "/data/x: No such file or directory", not "[Errno 2] ...: '/data/x'"."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        other = f" -> {exc.filename2}" if exc.filename2 is not None else ""
        return f"{exc.filename}{other}: {exc.strerror}"
    return str(exc)


@click.group(cls=MQAdminGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version_text(), "--version", prog_name="mqadmin", message="%(prog)s (ledgermq) %(version)s")
@log_options(default_level="ERROR")
def cli(log_level: str, log_file: str | None, log_format: str):
    """Administer ledgermq stores and clusters (RocketMQ's mqadmin commands).

    Online commands take -n/--namesrvAddr (default $NAMESRV_ADDR) and --json;
    `mqadmin COMMAND --help` shows each one's flags and examples.

    \b
    Examples:
      export NAMESRV_ADDR=127.0.0.1:9876
      mqadmin clusterList
      mqadmin updateTopic -c DefaultCluster -t Orders -r 8 -w 8
      mqadmin consumerProgress -g OrderConsumers --json
      mqadmin dledgerStatus -b broker-a
      mqadmin verifyStore --store /var/lib/ledgermq/n0

    \b
    Exit status: 0 ok, 1 problems found (verify/compare), 2 usage error,
    3 could not run (unreachable server, unknown topic/group, unreadable store).
    Shell completion (bash): eval "$(_MQADMIN_COMPLETE=bash_source mqadmin)"
    """
    cli_logging(log_level, log_file, log_format)


def _load_commands() -> None:
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue  # that area has no commands yet
        module.register(cli)


_load_commands()


def main() -> None:
    cli(prog_name="mqadmin")
