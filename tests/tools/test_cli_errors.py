# Every command's bad input as an operator meets it, each command run as a
# real process: nonexistent and wrong-kind paths, bad config values and
# keys, dead hosts, closed ports, a service on the port that does not speak
# RocketMQ remoting, unknown log levels.  Each must end in one line that
# names the path or host and the cause, with no traceback; --version and
# --check-config answer.  (No cluster is started: every target is dead or
# fake, so the module stays quick.  The table of mqadmin's store paths runs
# in-process through click's runner -- the same command code and exit
# status, without a Python start-up per case; the rest are processes.)
# Slow: runs every command as a real process, dozens of interpreter starts.
import functools
import socket
import sys

import pytest
import trio

from tests.helpers import REPO_ROOT

pytestmark = pytest.mark.slow

ROOT = str(REPO_ROOT)
MQADMIN = [sys.executable, "-m", "tools.mqadmin"]
MQBROKER = [sys.executable, "-c", "from broker.cli import mqbroker; mqbroker()"]
MQNAMESRV = [sys.executable, "-c", "from broker.cli import mqnamesrv; mqnamesrv()"]
MQDASHBOARD = [sys.executable, "-m", "tools.dashboard"]

CONF = """brokerClusterName=C
brokerName=broker-a
listenPort=0
namesrvAddr=127.0.0.1:9876
storePathRootDir={root}
dLegerGroup=broker-a
dLegerPeers=n0-127.0.0.1:40911
dLegerSelfId=n0
"""


async def run(argv, expect: int) -> tuple[str, str]:
    r = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False, cwd=ROOT)
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == expect, (argv, r.returncode, out, err)
    assert "Traceback" not in err and "Traceback" not in out, err
    return out, err


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once it is closed


async def test_mqadmin_paths_name_the_path_and_the_cause(tmp_path):
    missing = str(tmp_path / "missing")
    a_file = tmp_path / "file"
    a_file.write_text("not a store")
    cases = [
        (["verifyStore", "--store", missing], f"{missing}: no such directory"),
        (["dumpStore", "--store", missing], f"{missing}: no such directory"),
        (["md5Commitlog", "--store", missing], f"{missing}: no such directory"),
        (["compareCommitlog", "--store", missing, "--other", missing], f"{missing}: no such directory"),
        (["rebuildConsumeQueue", "--store", missing], f"{missing}: No such file or directory"),
        (["migrate", "check", "--store", missing], f"{missing}: no such directory"),
        (["migrate", "check", "--store", str(a_file)], f"{a_file}: not a directory"),
        (["migrate", "align", "--store", missing], f"{missing}: no such directory"),
        (["migrate", "export", "--store", missing, "--to", str(tmp_path / "out")],
         f"{missing}: No such file or directory"),
        (["migrate", "apply", "-c", str(a_file)], f"{a_file}: dLegerGroup: required but not set"),
    ]
    from click.testing import CliRunner

    from tools.mqadmin import cli
    runner = CliRunner()
    for args, expected in cases:
        result = runner.invoke(cli, args, prog_name="mqadmin")
        assert result.exit_code == 3, (args, result.output, result.exception)
        assert one_line(result.stderr) == f"mqadmin: error: {expected}", args
    _, err = await run([*MQADMIN, "verifyStore", "--store", missing], expect=3)  # and once as a process
    assert one_line(err) == f"mqadmin: error: {missing}: no such directory"


async def test_mqadmin_hosts_name_the_host_and_the_cause():
    port = closed_port()
    _, err = await run([*MQADMIN, "clusterList", "-n", f"127.0.0.1:{port}"], expect=3)
    assert one_line(err) == (f"mqadmin: error: name server 127.0.0.1:{port}: connect to 127.0.0.1:{port} failed: "
                             f"Error connecting to ('127.0.0.1', {port}): Connection refused")
    _, err = await run([*MQADMIN, "topicList", "-c", "-n", f"127.0.0.1:{port}"], expect=3)
    assert "Connection refused" in one_line(err) and f"127.0.0.1:{port}" in err
    _, err = await run([*MQADMIN, "clusterList", "-n", "no-such-host.invalid:9876", "--timeout", "3"], expect=3)
    assert one_line(err).startswith("mqadmin: error: name server no-such-host.invalid:9876: connect to ")
    _, err = await run([*MQADMIN, "clusterList", "-n", "127.0.0.1"], expect=3)
    assert "127.0.0.1" in one_line(err)

    # A service on the port that is not RocketMQ: it greets with a banner.
    async def banner(stream):
        async with stream:
            await stream.send_all(b"SSH-2.0-OpenSSH_9.6\r\n" * 3)
            with trio.move_on_after(5):
                await stream.receive_some(100)

    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(functools.partial(trio.serve_tcp, banner, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        _, err = await run([*MQADMIN, "clusterList", "-n", f"127.0.0.1:{port}"], expect=3)
        assert one_line(err).endswith("(the peer does not speak RocketMQ remoting)") and str(port) in err
        _, err = await run([*MQADMIN, "brokerStatus", "-b", f"127.0.0.1:{port}", "-n", f"127.0.0.1:{port}"],
                           expect=3)
        assert one_line(err).startswith(f"mqadmin: error: broker 127.0.0.1:{port} unreachable: connection to")
        nursery.cancel_scope.cancel()

    # A port that accepts and never answers (a metrics port waiting for its HTTP request line).
    async def silent(stream):
        async with stream:
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(functools.partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        _, err = await run([*MQADMIN, "clusterList", "-n", f"127.0.0.1:{port}", "--timeout", "1"], expect=3)
        assert one_line(err).endswith("has sent nothing back: it may not speak RocketMQ remoting, e.g. a metrics "
                                      "or other service's port)") and f"127.0.0.1:{port}" in err
        nursery.cancel_scope.cancel()


async def test_log_levels_are_validated_on_every_command(tmp_path):
    for cmd in (MQADMIN, MQBROKER, MQNAMESRV, MQDASHBOARD):
        _, err = await run([*cmd, "--log-level", "verbose"], expect=2)
        assert "Invalid value for '--log-level': 'verbose' is not one of" in err
    _, err = await run([*MQADMIN, "--log-format", "xml", "clusterList"], expect=2)
    assert "'--log-format'" in err


async def test_version_on_every_command():
    for cmd, name in ((MQADMIN, "mqadmin"), (MQBROKER, "mqbroker"), (MQNAMESRV, "mqnamesrv"),
                      (MQDASHBOARD, "mqdashboard")):
        out, _ = await run([*cmd, "--version"], expect=0)
        assert out.startswith(name) and "0." in out, out


async def test_mqbroker_check_config_and_config_errors(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text(CONF.format(root=tmp_path / "store") + "brokerNmae=x\ntraceTopicEnable=true\nsendMessageThreadPoolNums=4\n"
                    "metricsExporterType=PROM\nmetricsPromExporterPort=9100\n")
    out, err = await run([*MQBROKER, "--check-config", "-c", str(conf)], expect=0)
    assert err.splitlines() == [
        f"mqbroker: warning: {conf}: unknown key 'brokerNmae' ignored (did you mean 'brokerName'?)",
        f"mqbroker: warning: {conf}: traceTopicEnable is a RocketMQ key ledgermq does not implement; ignored"]
    assert out.splitlines()[0] == f"# {conf}: OK (3 warning(s)); the effective settings:"
    settings = dict(line.split("=", 1) for line in out.splitlines()[1:])
    assert settings["brokerName"] == "broker-a" and settings["metricsExporterType"] == "PROM"
    assert settings["metricsPromExporterPort"] == "9100" and settings["dLegerSelfId"] == "n0"
    assert not (tmp_path / "store").exists()  # checking creates nothing

    bad = tmp_path / "bad.conf"
    bad.write_text(CONF.format(root=tmp_path / "s") + "metricsPromExporterPort=abc\n")
    _, err = await run([*MQBROKER, "--check-config", "-c", str(bad)], expect=1)
    assert one_line(err) == f"Error: {bad}: metricsPromExporterPort='abc': expected a port number 0..65535"
    a_file = tmp_path / "file"
    a_file.write_text("")
    under_file = tmp_path / "under.conf"
    under_file.write_text(CONF.format(root=a_file / "store"))
    _, err = await run([*MQBROKER, "--check-config", "-c", str(under_file)], expect=1)
    assert one_line(err) == f"Error: {under_file}: storePathRootDir={a_file}/store: {a_file} is not a directory"
    _, err = await run([*MQBROKER, "-c", str(conf), "--log-file", str(a_file / "broker.log")], expect=1)
    assert one_line(err) == f"Error: cannot write the log file {a_file}/broker.log: File exists"
    for cmd in (MQBROKER, MQNAMESRV):  # the cause on the first line, not under the usage text
        _, err = await run([*cmd, "-c", str(tmp_path / "missing.conf")], expect=1)
        assert one_line(err) == f"Error: {tmp_path / 'missing.conf'}: No such file or directory"
    # --strict: an unknown key (a misspelt cluster name) fails the check, alone on the first line
    _, err = await run([*MQBROKER, "--check-config", "--strict", "-c", str(conf)], expect=1)
    assert one_line(err) == (f"Error: {conf}: --strict: unknown key 'brokerNmae' (did you mean 'brokerName'?)")
    strict_ok = tmp_path / "strict.conf"
    strict_ok.write_text(CONF.format(root=tmp_path / "store"))
    out, _ = await run([*MQBROKER, "--check-config", "--strict", "-c", str(strict_ok)], expect=0)
    assert out.startswith(f"# {strict_ok}: OK")


async def test_mqnamesrv_config_errors_and_port_in_use(tmp_path):
    conf = tmp_path / "namesrv.conf"
    conf.write_text("listenPort=0\nmetricsExporterType=NOPE\n")
    _, err = await run([*MQNAMESRV, "-c", str(conf)], expect=1)
    assert one_line(err) == (f"Error: {conf}: metricsExporterType='NOPE': expected one of DISABLE, PROM, "
                             f"OTLP_GRPC, LOG")
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        conf.write_text(f"listenPort={port}\nlistenPrt=1\n")
        _, err = await run([*MQNAMESRV, "-c", str(conf)], expect=1)
        lines = err.splitlines()
        assert lines[0] == f"mqnamesrv: warning: {conf}: unknown key 'listenPrt' ignored (did you mean 'listenPort'?)"
        assert lines[-1] == f"Error: cannot listen on port {port}: Address already in use"
