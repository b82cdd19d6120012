# Owns `mqdashboard` (also `python -m tools.dashboard`): the web console's
# command line -- its flags, the ACL credentials and TLS taken as mqadmin's
# online commands take them -- and the one line it prints when it serves.
# A command of its own, not an mqadmin subcommand: the console builds on
# mqadmin's admin client, so mqadmin importing the console would be a cycle.
import sys

import click
import trio

from broker.acl.signing import credentials_or_none, load_tools_credentials
from broker.remoting.tls import ClientTls
from broker.telemetry.commands import CauseFirstCommand
from broker.telemetry.logs import cli_logging, log_options, version_text
from commitlog.config import ConfigError
from tools.mqadmin import EXIT_ERROR
from tools.mqadmin.online import single_leaf


@click.command("mqdashboard", cls=CauseFirstCommand, context_settings={"help_option_names": ["-h", "--help"]},
               epilog="""\b
Open the printed URL in a browser.  Admin writes (topics, groups, offset
resets, resends) ask for a confirm step; with ACL on, give
--accessKey/--secretKey (or enter them on the page): every request is
signed, the secret is never shown.
With --acl-file (the brokers' plain_acl.yml: its admin: true accounts) or
--users, every write and every read of message bodies needs a login;
sessions end after --session-idle minutes without a request or
--session-max hours.  A --users file has one NAME:scrypt$N$R$P$SALT$HASH
line per account; --hash-password NAME writes such a line.
Examples:
  mqdashboard -n 127.0.0.1:9876
  mqdashboard -n 127.0.0.1:9876 --acl-file /etc/ledgermq/plain_acl.yml
  mqdashboard --hash-password alice >> /etc/ledgermq/console-users
  mqdashboard -n 127.0.0.1:9876 --users /etc/ledgermq/console-users --accessKey admin --secretKey ...""")
@click.option("-n", "--namesrvAddr", "namesrv_addr", envvar="NAMESRV_ADDR", metavar="ADDR",
              help="name server(s), host:9876[;host2:9876] (default: $NAMESRV_ADDR)")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="0: any free port")
@click.option("--bind", default="127.0.0.1", show_default=True,
              help="address to listen on (loopback by default: the console can change topics and offsets)")
@click.option("--accessKey", "access_key", envvar="ROCKETMQ_ACCESS_KEY", metavar="AK", help="ACL access key")
@click.option("--secretKey", "secret_key", envvar="ROCKETMQ_SECRET_KEY", metavar="SK", help="ACL secret key")
@click.option("--tlsTrustCertPath", "tls_trust", envvar="ROCKETMQ_TLS_TRUST_CERT_PATH", metavar="PEM",
              type=click.Path(exists=True, dir_okay=False), help="CA bundle (implies TLS to the servers)")
@click.option("--period", type=click.FloatRange(min=0.2), default=1.0, show_default=True, metavar="SECONDS",
              help="how often the cluster is sampled")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="NAME",
              help="a host name the console is reached by (repeatable); IP addresses and localhost always "
                   "work, any other Host or foreign Origin is refused (DNS rebinding)")
@click.option("--users", "users_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="console accounts, NAME:scrypt$... lines (see --hash-password); a login is then required")
@click.option("--acl-file", "acl_file", type=click.Path(dir_okay=False), metavar="PLAIN_ACL_YML",
              help="log in with this plain_acl.yml's admin: true accounts (access key / secret key)")
@click.option("--session-idle", type=click.FloatRange(min=1), default=30, show_default=True, metavar="MINUTES",
              help="a session ends after this long without a request")
@click.option("--session-max", type=click.FloatRange(min=0.1), default=8, show_default=True, metavar="HOURS",
              help="a session ends this long after its login")
@click.option("--hash-password", "hash_for", metavar="NAME",
              help="print a --users line for NAME (the password is asked for twice) and exit")
@log_options(default_level="WARNING")
@click.version_option(version_text(), "--version", prog_name="mqdashboard", message="%(prog)s (ledgermq) %(version)s")
def dashboard(namesrv_addr, port, bind, access_key, secret_key, tls_trust, period, allow_hosts, users_file, acl_file,
              session_idle, session_max, hash_for, log_level, log_file, log_format):
    """Serve the web console (cluster, topics, consumers, producers, messages, DLQ, replication)."""
    from tools.dashboard.auth import MAX_NAME, UsersFileError, acl_admin_users, hash_password, load_users_file
    if hash_for is not None:
        if not hash_for or ":" in hash_for or len(hash_for) > MAX_NAME or hash_for != hash_for.strip():
            raise click.UsageError(f"--hash-password: {hash_for!r} is not a user name (no ':', 1-{MAX_NAME} chars)")
        password = click.prompt("password", hide_input=True, confirmation_prompt=True, err=True)
        click.echo(f"{hash_for}:{hash_password(password).text()}")
        return
    if not namesrv_addr:
        raise click.UsageError("no name server: give -n HOST:9876 or set NAMESRV_ADDR")
    cli_logging(log_level, log_file, log_format, file_name="dashboard.log")
    try:
        credentials = credentials_or_none(access_key, secret_key) or load_tools_credentials()
    except ValueError as e:
        raise click.UsageError(f"--accessKey/--secretKey: {e}") from None
    try:
        tls = ClientTls.create(tls_trust) if tls_trust else None
    except ConfigError as e:
        raise click.UsageError(f"--tlsTrustCertPath: {e}") from None
    try:
        from tools.dashboard.serve import DashboardConfig, serve_dashboard
    except ImportError as e:  # hypercorn / starlette: the dashboard extra
        click.echo(f"mqdashboard: error: the console needs the dashboard extra ({e.name} is missing): "
                   "pip install 'ledgermq[dashboard]'", err=True)
        sys.exit(EXIT_ERROR)
    users = {}
    try:
        users.update(acl_admin_users(acl_file) if acl_file else {})
    except UsersFileError as e:
        raise click.UsageError(f"--acl-file: {e}") from None
    try:
        extra = load_users_file(users_file) if users_file else {}
    except UsersFileError as e:
        raise click.UsageError(f"--users: {e}") from None
    clash = sorted(set(extra) & set(users))
    if clash:
        raise click.UsageError(f"--users: {', '.join(clash)} is also an ACL admin account (one of them must go)")
    users.update(extra)
    cfg = DashboardConfig(namesrv_addr, port=port, bind=bind, credentials=credentials, tls=tls, period_s=period,
                          allowed_hosts=tuple(allow_hosts), users=users, session_idle_s=session_idle * 60,
                          session_absolute_s=session_max * 3600)

    async def main():
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_dashboard, cfg)
            click.echo(f"console serving on {url}", err=True)
            print(url, flush=True)  # the one stdout line scripts wait for

    try:
        trio.run(main)
    except BaseException as exc:  # noqa: B902 -- unwrapped from trio's groups, re-raised unless ours
        leaf = single_leaf(exc)
        if isinstance(leaf, OSError):
            click.echo(f"mqdashboard: error: cannot listen on {bind}:{port}: {leaf.strerror or leaf}", err=True)
            sys.exit(EXIT_ERROR)
        if isinstance(leaf, KeyboardInterrupt):
            sys.exit(130)
        raise


def main() -> None:
    dashboard(prog_name="mqdashboard")
