# Owns the console's composition root: one remoting client (signing with
# the ACL credentials when given), one MQAdmin, the sampler and its Hub,
# the accounts and sessions (auth.Auth), and the Starlette app on
# hypercorn's trio worker behind the Host/Origin guard (hostguard.py), all
# in one nursery.
#
#   async with trio.open_nursery() as n:
#       url = await n.start(serve_dashboard, DashboardConfig("127.0.0.1:9876", port=0))
import functools
import ipaddress
import logging
import time

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from broker.acl.signing import Credentials
from broker.remoting.client import open_remoting_client
from broker.remoting.tls import ClientTls
from tools.dashboard.app import create_app
from tools.dashboard.auth import Auth
from tools.dashboard.hostguard import HostGuard
from tools.dashboard.sampler import Hub, Sampler
from tools.mqadmin.adminapi import MQAdmin

log = logging.getLogger("ledgermq.dashboard")


@attrs.frozen(repr=False)
class DashboardConfig:
    namesrv: str
    port: int = 8080
    bind: str = "127.0.0.1"
    credentials: Credentials | None = None
    tls: ClientTls | None = None
    period_s: float = 1.0
    timeout: float = 5.0
    allowed_hosts: tuple[str, ...] = ()  # names (beyond IP literals and localhost) the console answers to
    users: dict = attrs.Factory(dict)  # name -> auth.PasswordHash; empty: no login (the console is open)
    session_idle_s: float = 30 * 60
    session_absolute_s: float = 8 * 3600
    login_max_failures: int = 5
    clock: object = time.monotonic  # sessions' and login bounds' clock (tests hand in one they advance)

    def __repr__(self) -> str:  # never the secret key
        return f"DashboardConfig(namesrv={self.namesrv!r}, bind={self.bind!r}, port={self.port})"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def serve_dashboard(cfg: DashboardConfig, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve the console until cancelled; started with the URL it serves on."""
    if not is_loopback(cfg.bind):
        if cfg.users:
            log.warning("the console listens on %s, beyond loopback: its login cookie travels in clear over "
                        "plain HTTP; put it behind a TLS proxy", cfg.bind)
        else:
            log.warning("the console listens on %s, beyond loopback, without accounts: anyone who reaches it "
                        "can change topics and offsets with its credentials (give --users or --acl-file)", cfg.bind)
    async with open_remoting_client(rpc_hook=cfg.credentials, tls=cfg.tls) as rc:
        admin = MQAdmin(rc, cfg.namesrv, timeout=cfg.timeout)
        hub = Hub()
        hc = HypercornConfig()
        host = f"[{cfg.bind}]" if ":" in cfg.bind else cfg.bind
        hc.bind = [f"{host}:{cfg.port}"]
        hc.accesslog = None
        hc.graceful_timeout = 1.0
        async with trio.open_nursery() as nursery:
            await nursery.start(Sampler(admin, hub, period_s=cfg.period_s).run)
            names = cfg.allowed_hosts + ((cfg.bind,) if cfg.bind not in ("0.0.0.0", "::", "") else ())
            auth = Auth(dict(cfg.users), idle_s=cfg.session_idle_s, absolute_s=cfg.session_absolute_s,
                        max_failures=cfg.login_max_failures, clock=cfg.clock)
            app = HostGuard(create_app(admin, hub, rc, auth), names)
            binds = await nursery.start(functools.partial(hypercorn_serve, app, hc))
            task_status.started(binds[0])
