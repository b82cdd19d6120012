# Owns the shell of mqadmin's online commands: the shared options
# (-n/--namesrvAddr from NAMESRV_ADDR, --json, --timeout, and for secured
# clusters --accessKey/--secretKey and --tls/--tlsTrustCertPath), running the
# command's coroutine under trio with one MQAdmin, and the command-side
# translation of AdminError into one line on stderr and exit status 3.
#
#   @click.command("topicList")
#   @online
#   async def topic_list(admin: MQAdmin, out: Output): ...
#
# A command that talks to the broker it is given only (RocketMQ's
# `producer -b ADDR`) is @online(namesrv=False): -n is then optional.
import functools
import sys
import time
from datetime import datetime

import click
import trio

from broker.acl.signing import credentials_or_none, load_tools_credentials
from broker.remoting.client import open_remoting_client
from broker.remoting.tls import ClientTls
from commitlog.config import ConfigError
from tools.mqadmin import EXIT_ERROR
from tools.mqadmin.adminapi import AdminError, MQAdmin, from_client_error
from tools.mqadmin.render import Output


def single_leaf(exc: BaseException) -> BaseException:
    """The one real error inside trio's exception groups (nurseries wrap)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, BaseExceptionGroup):
        admin = [e for e in exc.exceptions
                 if isinstance(single_leaf(e), AdminError) or from_client_error(single_leaf(e))]
        if admin:
            return single_leaf(admin[0])
    return exc


def online(fn=None, *, namesrv: bool = True):
    """Turn `async def fn(admin, out, **params) -> int | None` into a click
    callback with -n/--namesrvAddr, --json and --timeout (-n required
    unless namesrv=False)."""
    if fn is None:
        return functools.partial(online, namesrv=namesrv)

    @functools.wraps(fn)
    def run(namesrv_addr, as_json, timeout, access_key, secret_key, tls, tls_trust, **params):
        if not namesrv_addr and namesrv:
            raise click.UsageError("no name server: give -n HOST:9876 or set NAMESRV_ADDR")
        out = Output(as_json)
        try:
            # RocketMQ's mqadmin reads $ROCKETMQ_HOME/conf/tools.yml; flags
            # and the environment come first here.
            credentials = credentials_or_none(access_key, secret_key) or load_tools_credentials()
        except ValueError as e:
            raise click.UsageError(f"--accessKey/--secretKey: {e}") from None
        try:
            client_tls = ClientTls.create(tls_trust) if (tls or tls_trust) else None
        except ConfigError as e:
            raise click.UsageError(f"--tlsTrustCertPath: {e}") from None

        async def main():
            async with open_remoting_client(rpc_hook=credentials, tls=client_tls) as rc:
                return await fn(MQAdmin(rc, namesrv_addr or "", timeout=timeout), out, **params)

        try:
            code = trio.run(main)
        except BaseException as exc:  # noqa: B902 -- unwrapped and re-raised below unless ours
            leaf = single_leaf(exc)
            leaf = from_client_error(leaf) or leaf
            if isinstance(leaf, AdminError):
                click.echo(f"mqadmin: error: {leaf}", err=True)
                sys.exit(EXIT_ERROR)
            if isinstance(leaf, click.ClickException):
                raise leaf from None
            if isinstance(leaf, KeyboardInterrupt):
                sys.exit(130)
            raise
        if code:
            sys.exit(code)

    run = click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
                       metavar="SECONDS", help="per request")(run)
    run = click.option("--tlsTrustCertPath", "tls_trust", envvar="ROCKETMQ_TLS_TRUST_CERT_PATH", metavar="PEM",
                       type=click.Path(exists=True, dir_okay=False),
                       help="CA bundle the servers' certificates must chain to (implies --tls)")(run)
    run = click.option("--tls", "tls", is_flag=True, envvar="ROCKETMQ_TLS_ENABLE",
                       help="connect with TLS, verifying the server certificate ($ROCKETMQ_TLS_ENABLE)")(run)
    run = click.option("--secretKey", "secret_key", envvar="ROCKETMQ_SECRET_KEY", metavar="SK",
                       help="ACL secret key ($ROCKETMQ_SECRET_KEY)")(run)
    run = click.option("--accessKey", "access_key", envvar="ROCKETMQ_ACCESS_KEY", metavar="AK",
                       help="ACL access key: sign every request ($ROCKETMQ_ACCESS_KEY; else "
                            "$ROCKETMQ_HOME/conf/tools.yml)")(run)
    run = click.option("--json", "as_json", is_flag=True, help="print one JSON document (for scripts)")(run)
    run = click.option("-n", "--namesrvAddr", "namesrv_addr", envvar="NAMESRV_ADDR", metavar="ADDR",
                       help="name server(s), host:9876[;host2:9876] (default: $NAMESRV_ADDR)")(run)
    return run


# --- values operators type -------------------------------------------------------------


def parse_timestamp(text: str) -> int:
    """RocketMQ's -s: ms since the epoch, `yyyy-MM-dd#HH:mm:ss:SSS`, or `now`
    (local time, as Java's SimpleDateFormat)."""
    text = text.strip()
    if text.lower() == "now":
        return int(time.time() * 1000)
    if text.lstrip("-").isdigit():
        return int(text)
    for fmt in ("%Y-%m-%d#%H:%M:%S:%f", "%Y-%m-%d#%H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d"):
        try:
            return int(datetime.strptime(text, fmt).timestamp() * 1000)
        except ValueError:
            continue
    raise click.BadParameter(f"{text!r} is not ms since the epoch, yyyy-MM-dd#HH:mm:ss:SSS or 'now'")


class TimestampType(click.ParamType):
    name = "TIMESTAMP"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_timestamp(value)
        except click.BadParameter as e:
            self.fail(e.message, param, ctx)


TIMESTAMP = TimestampType()


def fmt_ms(ms: int | None) -> str:
    if not ms or ms <= 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
