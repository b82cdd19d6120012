# Owns the `mqnamesrv` command: `mqnamesrv [-c namesrv.conf] [-p 9876]`
# runs the name server in the foreground (listenPort from the file, -p
# overrides it), prints where it listens, and exits cleanly (status 0, no
# traceback) on Ctrl-C or SIGTERM.  broker/cli.py's mqnamesrv() calls main().
# --version, --log-level (validated), --log-file / logDir (rotated),
# --log-format text|json (broker/telemetry/logs.py).
import signal
import sys

import click
import trio

from broker.acl.plain import AclConfigError
from broker.namesrv.service import NamesrvConfig, load_namesrv_config, serve_namesrv
from broker.telemetry.commands import CauseFirstCommand
from broker.telemetry.logs import cli_logging, log_options, version_text
from commitlog.config import ConfigError


def _leaves(exc: BaseException):
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


async def _run(cfg: NamesrvConfig) -> None:
    # Ctrl-C and SIGTERM both cancel the server; no KeyboardInterrupt
    # unwinds through the nurseries.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            ns = await nursery.start(serve_namesrv, cfg)
            host, port = ns.server.sockname
            metrics = f", Prometheus metrics on {ns.metrics_server.url}" if ns.metrics_server is not None else ""
            click.echo(f"The Name Server boot success. serializeType=JSON, listening on {host}:{port}{metrics}")
            sys.stdout.flush()
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


@click.command(name="mqnamesrv", cls=CauseFirstCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-c", "--config-file", type=click.Path(dir_okay=False),
              help="namesrv.conf (Java properties: listenPort, bindAddress, ...)")
@click.option("-p", "--listen-port", type=click.IntRange(0, 65535),
              help="port to listen on (overrides listenPort; default 9876, 0 picks a free one)")
@log_options()
@click.version_option(version_text(), "--version", prog_name="mqnamesrv", message="%(prog)s (ledgermq) %(version)s")
def main(config_file: str | None, listen_port: int | None, log_level: str, log_file: str | None,
         log_format: str) -> None:
    """Run the ledgermq name server."""
    try:
        cfg, warnings = load_namesrv_config(config_file, listen_port)
    except (ConfigError, OSError) as e:
        why = (e.strerror or str(e)) if isinstance(e, OSError) else str(e)
        raise click.ClickException(f"{config_file}: {why}" if config_file and config_file not in why
                                   else why) from None
    for warning in warnings:
        click.echo(f"mqnamesrv: warning: {config_file}: {warning}", err=True)
    cli_logging(log_level, log_file, log_format, log_dir=cfg.log_dir, file_name="namesrv.log")
    try:
        trio.run(_run, cfg)
    except BaseException as e:  # trio wraps what escapes nurseries in groups
        leaves = list(_leaves(e))
        if all(isinstance(x, KeyboardInterrupt) for x in leaves):
            pass  # Ctrl-C before the signal receiver was installed
        elif (aclerr := next((x for x in leaves if isinstance(x, AclConfigError)), None)) is not None:
            raise click.ClickException(f"aclEnable=true but {aclerr}") from None
        elif (oserr := next((x for x in leaves if isinstance(x, OSError)), None)) is not None:
            raise click.ClickException(  # e.g. the port is taken
                f"cannot listen on port {cfg.listen_port} (or metrics port {cfg.metrics.prom_port}): "
                f"{oserr.strerror or oserr}" if cfg.metrics.enabled else
                f"cannot listen on port {cfg.listen_port}: {oserr.strerror or oserr}") from None
        else:
            raise
    click.echo("The Name Server stopped.")
