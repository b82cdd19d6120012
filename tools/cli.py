# Owns how a tool's click command runs as `main(argv=None) -> int`, the
# shape every `python -m tools.<x>` module keeps (`sys.exit(main())`) and
# tests call in-process.  Rules: the command's callback returns its exit
# status (an int; None is 0), which click's standalone mode would drop; a
# usage error shows its cause on the first line of stderr, then the usage
# and the --help hint (broker/telemetry/commands.py, as every console
# script), and gives 2; another ClickException prints its one line
# ("Error: ...") and gives 1; --help and --version give 0; Ctrl-C that
# reaches click gives 130 without a traceback.  Options keep the house's
# spelling: -h/--help (CONTEXT), --json for one JSON object, --dir/--out for
# where files go.
import click

from broker.telemetry.commands import CauseFirstUsageError

CONTEXT = {"help_option_names": ["-h", "--help"]}


def run_command(command: click.Command, argv: list[str] | None = None, prog_name: str | None = None) -> int:
    """Run `command` on argv (default sys.argv[1:]) and return its exit
    status instead of exiting."""
    try:
        rv = command.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except click.UsageError as exc:
        CauseFirstUsageError(exc.format_message(), exc.ctx).show()
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        click.echo("Aborted!", err=True)
        return 130
    return rv if isinstance(rv, int) else 0
