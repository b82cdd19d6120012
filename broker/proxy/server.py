# Owns the mqproxy process: serve_proxy (the grpc.aio server and the
# remoting client instance it relays through, on one asyncio loop) and the
# `mqproxy` command.  grpc.aio needs asyncio, which is why the proxy is a
# process of its own and not a task of the trio broker; the client library
# (anyio) runs on the same loop.
#
#   async with anyio.create_task_group() as tg:          # on asyncio
#       proxy = await tg.start(serve_proxy, cfg)          # bound, serving
#       proxy.port
#
# Hostile by default: one request's size is bounded by
# grpc.max_receive_message_length (grpcMaxInboundMessageSize), each HTTP/2
# connection's streams by grpcMaxConcurrentStreams, held receives, clients
# and transactions by their budgets (config.py); SO_REUSEPORT is off, so a
# port in use fails the start instead of being shared silently.
import logging
import sys

import anyio
import attrs

from broker.acl.plain import load_plain_acl
from broker.client.instance import open_client_instance
from broker.proxy.auth import AclFile
from broker.proxy.config import ProxyConfig
from broker.proxy.service import MessagingService

log = logging.getLogger("ledgermq.proxy")


@attrs.define(eq=False)
class Proxy:
    """What serve_proxy hands to its starter."""

    cfg: ProxyConfig
    port: int
    service: MessagingService

    @property
    def endpoint(self) -> str:
        host = "127.0.0.1" if self.cfg.bind_address in ("0.0.0.0", "::") else self.cfg.bind_address
        return f"{host}:{self.port}"


def server_options(cfg: ProxyConfig) -> list[tuple[str, int]]:
    return [("grpc.max_receive_message_length", cfg.max_inbound_message_size),
            ("grpc.max_send_message_length", cfg.max_inbound_message_size),
            ("grpc.max_concurrent_streams", cfg.max_concurrent_streams),
            ("grpc.so_reuseport", 0),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000)]


async def serve_proxy(cfg: ProxyConfig, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """Run the proxy until cancelled (asyncio only: grpc.aio).  started()
    gets the Proxy once the gRPC port is bound and serving."""
    import grpc

    from broker.proxy import pb

    rules = AclFile(cfg.acl_file) if cfg.acl_enable else None
    async with open_client_instance(";".join(cfg.namesrv_addr), credentials=cfg.inner_credentials,
                                    tls=cfg.client_tls if cfg.client_tls.enabled else None,
                                    timeout=cfg.send_timeout_ms / 1000) as (instance, tasks):
        service = MessagingService(cfg, instance, tasks, rules)
        tasks.start_soon(service.renewals.run)
        server = grpc.aio.server(options=server_options(cfg))
        pb.service_grpc.add_MessagingServiceServicer_to_server(service, server)
        where = f"{cfg.bind_address}:{cfg.grpc_port}"
        port = (server.add_secure_port(where, cfg.tls.credentials()) if cfg.tls is not None
                else server.add_insecure_port(where))
        if not port:
            raise OSError(f"cannot bind the gRPC port {where}")
        await server.start()
        try:
            proxy = Proxy(attrs.evolve(cfg, grpc_port=port), port, service)
            service.cfg = proxy.cfg
            log.info("mqproxy serving gRPC on %s (%s)", where.replace(f":{cfg.grpc_port}", f":{port}"),
                     "TLS" if cfg.tls is not None else "plaintext")
            task_status.started(proxy)
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await server.stop(grace=1.0)


def main(argv=None) -> None:
    import json
    import signal

    import click

    from broker.acl.plain import AclConfigError
    from broker.proxy.config import load_proxy_config
    from broker.telemetry.commands import CauseFirstCommand
    from broker.telemetry.logs import cli_logging, log_options, version_text
    from commitlog.config import ConfigError

    @click.command(name="mqproxy", cls=CauseFirstCommand, context_settings={"help_option_names": ["-h", "--help"]})
    @click.option("-c", "--config-file", required=True, type=click.Path(exists=True, dir_okay=False),
                  help="proxy.conf (Java properties: namesrvAddr, grpcServerPort, aclEnable, ...)")
    @click.option("-n", "--namesrv-addr", default=None, help="name servers, a:9876;b:9876 (overrides namesrvAddr)")
    @log_options()
    @click.version_option(version_text(), "--version", prog_name="mqproxy", message="%(prog)s (ledgermq) %(version)s")
    def command(config_file: str, namesrv_addr: str | None, log_level: str, log_file: str | None,
                log_format: str) -> None:
        """Run the RocketMQ 5 gRPC proxy in front of a ledgermq cluster."""
        try:
            with open(config_file, encoding="utf-8") as f:
                text = f.read()
            if namesrv_addr is not None:
                text += f"\nnamesrvAddr={namesrv_addr}\n"
            cfg = load_proxy_config(config_file) if namesrv_addr is None else ProxyConfig.from_properties(text)
            if cfg.acl_enable:
                load_plain_acl(cfg.acl_file)
        except (ConfigError, AclConfigError, OSError) as e:
            raise click.ClickException(f"{config_file}: {e}") from None
        cli_logging(log_level, log_file, log_format, file_name="proxy.log")

        async def run() -> None:
            async with anyio.create_task_group() as tg:
                proxy = await tg.start(serve_proxy, cfg)
                click.echo(json.dumps({"grpcEndpoint": proxy.endpoint, "port": proxy.port,
                                       "tls": cfg.tls is not None, "acl": cfg.acl_enable}))
                sys.stdout.flush()
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for signum in signals:
                        log.info("mqproxy: signal %d, shutting down", signum)
                        tg.cancel_scope.cancel()
                        break

        try:
            anyio.run(run, backend="asyncio")
        except OSError as e:
            raise click.ClickException(f"cannot start: {e}") from None
        except KeyboardInterrupt:
            pass

    command.main(args=argv, prog_name="mqproxy")


if __name__ == "__main__":
    main()
