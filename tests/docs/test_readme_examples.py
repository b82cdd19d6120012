# README.md's Python examples kept honest, the way doctest keeps docs:
#
# The convention: a ```python block of README.md is a program.  This test
# runs each one, as written, as a process of its own (the development
# venv's python, from the repository root) against one live group, in the
# README's order, and each must exit 0 within PROGRAM_TIMEOUT.  The only
# change made to a program's text is the addresses: 127.0.0.1:9876 (a name
# server) becomes the live group's, 127.0.0.1:8081 (mqproxy) the live
# proxy's.  A block that is not a program says so on the line right before
# it: `<!-- fragment: why -->` (why: what it leaves out, where it is run);
# a fragment is not run but must still compile (top-level await allowed),
# and a fragment marker without a reason fails.
#
# The group: a name server and a one-member DLedger broker (serve_broker,
# enablePropertyFilter on) on trio in this process, over TCP on 127.0.0.1;
# mqproxy (the RocketMQ 5 gRPC proxy) as a process of its own beside them
# when a program talks to it (a program that imports `rocketmq`).
# Slow: each program is an interpreter start plus its client's start-up;
# mqproxy and the official gRPC client add a few seconds.
import ast
import json
import os
import re
import subprocess
import sys

import pytest
import trio

from broker.common.values import TopicConfig
from broker.config import BrokerConfig
from broker.namesrv.service import NamesrvConfig, serve_namesrv
from broker.server import serve_broker
from tests.helpers import REPO_ROOT
from tools.localcluster import free_ports

README = REPO_ROOT / "README.md"
PROGRAM_TIMEOUT = 60
NAMESRV, PROXY = "127.0.0.1:9876", "127.0.0.1:8081"
FRAGMENT = re.compile(r"^<!-- fragment: (\S.*?) -->$")


def python_blocks() -> list[tuple[int, str | None, str]]:
    """(line of the opening fence, the fragment reason or None, code) for
    every ```python block of README.md."""
    lines = README.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start, before = i + 1, lines[i - 1].strip() if i else ""
            end = lines.index("```", start)
            marker = FRAGMENT.match(before)
            assert marker or not before.startswith("<!-- fragment"), f"README.md:{start}: a fragment says why"
            blocks.append((start, marker.group(1) if marker else None, "\n".join(lines[start:end]) + "\n"))
            i = end
        i += 1
    return blocks


def test_blocks_are_programs_or_marked_fragments_that_compile():
    blocks = python_blocks()
    programs = [b for b in blocks if b[1] is None]
    assert len(programs) >= 3, "the README's client examples are programs"
    for line, reason, code in blocks:
        flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if reason is not None else 0
        compile(code, f"README.md:{line}", "exec", flags=flags | ast.PyCF_ONLY_AST)
    # the API block is a program: the names the issue found undefined are defined in it now
    api = next(code for _, reason, code in blocks if reason is None and "open_pull_consumer(" in code)
    for name in ("NS", "callback", "handler"):
        assert re.search(rf"^\s*(def |async def )?{name}\b", api, re.M), name


async def start_proxy(ns_addr: str, tmp_path) -> tuple[trio.Process, str]:
    conf = tmp_path / "proxy.conf"
    conf.write_text(f"namesrvAddr={ns_addr}\ngrpcServerPort=0\nbindAddress=127.0.0.1\n")  # loopback only
    proc = await trio.lowlevel.open_process([sys.executable, "-m", "broker.proxy.server", "-c", str(conf)],
                                            cwd=str(REPO_ROOT), stdout=subprocess.PIPE)
    buf = b""
    with trio.fail_after(30):
        while b"\n" not in buf:
            data = await proc.stdout.receive_some(4096)
            assert data, f"mqproxy exited before serving: {buf!r}"
            buf += data
    return proc, json.loads(buf.split(b"\n", 1)[0])["grpcEndpoint"]


@pytest.mark.slow
async def test_readme_programs_run_against_a_live_group(tmp_path):
    """Slow: every README program as a process, against one group (and mqproxy)."""
    programs = [(line, code) for line, reason, code in python_blocks() if reason is None]
    ns_port, peer_port = free_ports(2)
    ns_addr = f"127.0.0.1:{ns_port}"
    home = tmp_path / "home"  # the official client logs under ~/logs
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}
    async with trio.open_nursery() as nursery:
        ns = await nursery.start(serve_namesrv, NamesrvConfig(listen_port=ns_port, bind_address="127.0.0.1"))
        cfg, _ = BrokerConfig.from_dict({
            "brokerName": "docs", "brokerIP1": "127.0.0.1", "listenPort": "0", "dLegerGroup": "docs",
            "dLegerPeers": f"n0-127.0.0.1:{peer_port}", "dLegerSelfId": "n0", "storePathRootDir": str(tmp_path / "n0"),
            "namesrvAddr": ns_addr, "enablePropertyFilter": "true"})
        broker = await nursery.start(lambda task_status: serve_broker(cfg, bind_host="127.0.0.1",
                                                                      task_status=task_status))
        await broker.gate.wait_writable(timeout=20)
        if any("rocketmq" in code for _, code in programs):
            # the gRPC example sends to TopicTest, which a proxy's QueryRoute must find (no auto-creation in 5.x)
            await broker.metadata.update_topic(TopicConfig("TopicTest", 4, 4, 6))
            with trio.fail_after(20):
                await ns.wait_until(lambda routes: (r := routes.topic_route("TopicTest")) is not None and
                                    any(b.master_addr == broker.broker_addr for b in r.broker_datas))
        proxy = None
        try:
            failures = []
            for line, code in programs:
                code = code.replace(NAMESRV, ns_addr)
                if PROXY in code:
                    if proxy is None:
                        proxy = await start_proxy(ns_addr, tmp_path)
                    code = code.replace(PROXY, proxy[1])
                with trio.move_on_after(PROGRAM_TIMEOUT) as timer:
                    r = await trio.run_process([sys.executable, "-c", code], cwd=str(REPO_ROOT), env=env,
                                               capture_stdout=True, capture_stderr=True, check=False)
                if timer.cancelled_caught:
                    failures.append(f"README.md:{line}: still running after {PROGRAM_TIMEOUT} s")
                elif r.returncode != 0:
                    failures.append(f"README.md:{line}: exit {r.returncode}\n{r.stdout.decode()[-1500:]}"
                                    f"{r.stderr.decode()[-3000:]}")
            assert not failures, "\n\n".join(failures)
        finally:
            if proxy is not None:
                proxy[0].kill()
                await proxy[0].wait()
            nursery.cancel_scope.cancel()
