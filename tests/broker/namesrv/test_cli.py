# Tests of `mqnamesrv` as a separate process (broker.cli.mqnamesrv, what the
# console script runs): listenPort from namesrv.conf, -p overriding it, a
# route request answered over TCP, a clean exit on Ctrl-C and SIGTERM, and
# a clear error when the port is taken.
# Slow: starts mqnamesrv as a separate process in each test.
import re
import signal
import socket
import subprocess
import sys

import pytest
import trio

from broker.common.values import TopicConfig
from broker.namesrv.client import NamesrvClient
from broker.namesrv.routes import BrokerRegistration
from broker.remoting.client import open_remoting_client
from tools.localcluster import free_ports

pytestmark = pytest.mark.slow

RUN = [sys.executable, "-c", "from broker.cli import mqnamesrv; mqnamesrv()"]


def free_port() -> int:
    return free_ports(1)[0]  # (below the ephemeral range: see free_ports)


async def read_line(stream, timeout: float = 20.0) -> bytes:
    buf = b""
    with trio.fail_after(timeout):
        while b"\n" not in buf:
            chunk = await stream.receive_some(4096)
            if not chunk:
                break
            buf += chunk
    return buf


async def run_namesrv(args, sig):
    proc = await trio.lowlevel.open_process(RUN + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = (await read_line(proc.stdout)).decode()
        m = re.search(r"listening on ([0-9.]+):(\d+)", line)
        assert m, line
        port = int(m.group(2))
        async with open_remoting_client() as remoting:
            api = NamesrvClient(remoting, f"127.0.0.1:{port}")
            reg = BrokerRegistration("c", "b", "127.0.0.1:10911", 0, topic_configs={"T": TopicConfig("T", 4, 4, 6)})
            assert (await api.register_broker(reg))[f"127.0.0.1:{port}"].accepted
            route = await api.get_route("T")
            assert route.broker_datas[0].broker_addrs == {0: "127.0.0.1:10911"}
        proc.send_signal(sig)
        with trio.fail_after(10):
            rc = await proc.wait()
        rest = await proc.stdout.receive_some(4096)
        err = await proc.stderr.receive_some(65536)
        return port, rc, rest.decode(), err.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_port_from_conf_and_ctrl_c(tmp_path):
    port = free_port()
    conf = tmp_path / "namesrv.conf"
    conf.write_text(f"# a stock-looking file\nlistenPort={port}\nrocketmqHome=/opt/rocketmq\nnoSuchKey=1\n")
    got, rc, out, err = await run_namesrv(["-c", str(conf)], signal.SIGINT)
    assert got == port and rc == 0
    assert "stopped" in out and "Traceback" not in err
    assert "unknown key 'noSuchKey'" in err and "rocketmqHome" not in err


async def test_p_overrides_conf_and_sigterm(tmp_path):
    conf = tmp_path / "namesrv.conf"
    conf.write_text(f"listenPort={free_port()}\n")
    port = free_port()
    got, rc, out, err = await run_namesrv(["-c", str(conf), "-p", str(port)], signal.SIGTERM)
    assert got == port and rc == 0 and "Traceback" not in err


def test_port_taken_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        r = subprocess.run(RUN + ["-p", str(s.getsockname()[1])], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert "Address already in use" in r.stderr and "Traceback" not in r.stderr


async def test_log_dir_from_conf_in_json_lines_and_log_file_option(tmp_path):
    # logDir in namesrv.conf: namesrv.log there, one JSON object a line with
    # --log-format json; --log-file wins over logDir (issue 17).
    import json
    conf = tmp_path / "namesrv.conf"
    conf.write_text(f"listenPort={free_port()}\nlogDir={tmp_path / 'logs'}\n")
    _, rc, _, err = await run_namesrv(["-c", str(conf), "--log-format", "json"], signal.SIGTERM)
    assert rc == 0 and "Traceback" not in err
    lines = [json.loads(line) for line in (tmp_path / "logs" / "namesrv.log").read_text().splitlines()]
    assert any(x["message"].startswith("name server listening on") and x["level"] == "INFO" for x in lines)
    assert all(x["logger"] and x["ts"].endswith("Z") for x in lines)
    _, rc, _, _ = await run_namesrv(["-c", str(conf), "--log-file", str(tmp_path / "ns.log")], signal.SIGTERM)
    assert rc == 0 and "name server listening on" in (tmp_path / "ns.log").read_text()
