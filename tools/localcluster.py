# Owns running a replicated-log group as real processes on loopback: it
# writes one broker.conf-style file per node, starts `python -m
# commitlog.node` for each, learns its admin port from the JSON line the node
# prints, and can kill -9 / restart nodes by the PIDs it started (and only
# those).  Used by the multi-process tests, the replication benchmark and the
# quickstart demo.
import json
import os
import random
import signal
import socket
import subprocess
import sys

import attrs
import trio

from commitlog.admin import admin_call


_EPHEMERAL = "/proc/sys/net/ipv4/ip_local_port_range"
_LOWEST_PORT = 20000  # above the well-known ports (RocketMQ: 9876, 10909-10912)


def _ephemeral_low() -> int:
    """Where the kernel's range for outgoing connections begins (32768 by
    default on Linux)."""
    try:
        with open(_EPHEMERAL) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(n: int) -> list[int]:
    """n distinct ports free on 127.0.0.1 right now, taken below the
    kernel's ephemeral range: a port the kernel hands out for binding to 0
    is also one it hands to the next outgoing connection of any process,
    which then holds it when the server comes to bind it ("Address already
    in use", seen with two pytest processes side by side).  Ports outside
    that range are never taken by outgoing connections; a race with another
    test picking the same random port remains possible but rare.  Falls
    back to the kernel's choice where no such range is left."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    ports: list[int] = []
    socks = []
    try:
        for _ in range(n * 50):
            if len(ports) == n or low - 1 <= _LOWEST_PORT:
                break
            port = rng.randint(_LOWEST_PORT, low - 1)
            if port in ports:
                continue
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
            ports.append(port)
        while len(ports) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


@attrs.define
class NodeProcess:
    node_id: str
    conf_path: str
    process: trio.Process | None = None
    admin_port: int | None = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None


@attrs.define
class LocalCluster:
    root: str
    size: int = 3
    group: str = "lmq"
    extra_conf: dict = attrs.Factory(dict)
    log_level: str = "WARNING"
    nodes: dict[str, NodeProcess] = attrs.Factory(dict)

    def write_confs(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        ids = [f"n{i}" for i in range(self.size)]
        ports = free_ports(self.size * 2)
        peers = ";".join(f"{i}-127.0.0.1:{ports[k]}" for k, i in enumerate(ids))
        for k, node_id in enumerate(ids):
            conf = {
                "dLegerGroup": self.group, "dLegerPeers": peers, "dLegerSelfId": node_id,
                "storePathRootDir": os.path.join(self.root, node_id),
                "adminPort": str(ports[self.size + k]),
                **{key: str(v) for key, v in self.extra_conf.items()},
            }
            path = os.path.join(self.root, f"{node_id}.conf")
            with open(path, "w") as f:
                f.writelines(f"{key}={value}\n" for key, value in conf.items())
            self.nodes[node_id] = NodeProcess(node_id, path, admin_port=ports[self.size + k])

    async def start(self, node_id: str | None = None) -> None:
        """Start one node (or every stopped node) and wait until it serves."""
        if not self.nodes:
            self.write_confs()
        targets = [node_id] if node_id else [n for n, p in self.nodes.items() if not p.alive]
        for nid in targets:
            node = self.nodes[nid]
            log_path = os.path.join(self.root, f"{nid}.log")
            node.process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "commitlog.node", "--conf", node.conf_path, "--log-level", self.log_level],
                stdout=subprocess.PIPE, stderr=open(log_path, "ab"), cwd=repo_root())
            line = await read_line(node.process.stdout, timeout=30)
            node.admin_port = json.loads(line)["adminPort"]

    def kill(self, node_id: str) -> None:
        """kill -9 one node we started."""
        node = self.nodes[node_id]
        if node.alive:
            os.kill(node.process.pid, signal.SIGKILL)

    def pause(self, node_id: str) -> None:
        """SIGSTOP one node we started: it keeps its sockets and state but
        answers nothing (a GC pause, a stalled VM) until resume()."""
        node = self.nodes[node_id]
        if node.alive:
            os.kill(node.process.pid, signal.SIGSTOP)

    def resume(self, node_id: str) -> None:
        """SIGCONT a node paused with pause() (harmless if it is running)."""
        node = self.nodes[node_id]
        if node.alive:
            os.kill(node.process.pid, signal.SIGCONT)

    async def wait_dead(self, node_id: str) -> None:
        node = self.nodes[node_id]
        if node.process is not None:
            await node.process.wait()

    async def stop_all(self) -> None:
        for node in self.nodes.values():
            if node.alive:
                node.process.terminate()
        with trio.move_on_after(10):
            for node in self.nodes.values():
                if node.process is not None:
                    await node.process.wait()
        for node in self.nodes.values():
            if node.alive:
                os.kill(node.process.pid, signal.SIGKILL)
                await node.process.wait()

    async def call(self, node_id: str, req: dict, timeout: float = 10.0) -> dict:
        return await admin_call("127.0.0.1", self.nodes[node_id].admin_port, req, timeout=timeout)

    async def statuses(self) -> dict[str, dict]:
        out = {}
        for nid, node in self.nodes.items():
            if node.alive:
                try:
                    out[nid] = await self.call(nid, {"op": "status"}, timeout=2)
                except (OSError, trio.TooSlowError, trio.BrokenResourceError, ValueError):
                    pass
        return out

    async def wait_all_committed(self, index: int, timeout: float = 30.0) -> dict[str, dict]:
        """Statuses of every live node once each has committed `index`; each
        node parks on its own commit watermark (no polling)."""
        out: dict[str, dict] = {}

        async def one(nid: str) -> None:
            reply = await self.call(nid, {"op": "wait_committed", "index": index, "timeout": timeout},
                                    timeout=timeout + 5)
            if not reply.get("ok"):
                raise RuntimeError(f"{nid}: {reply.get('error')}")
            out[nid] = reply

        async with trio.open_nursery() as nursery:
            for nid, node in self.nodes.items():
                if node.alive:
                    nursery.start_soon(one, nid)
        return out

    async def wait_leader(self, timeout: float = 15.0, exclude: set[str] = frozenset()) -> str:
        """The node every live member agrees leads (polling the admin ports
        from outside is the client's job here, not the product's)."""
        with trio.fail_after(timeout):
            while True:
                sts = await self.statuses()
                leaders = {nid for nid, st in sts.items() if st.get("role") == "leader" and nid not in exclude}
                if len(leaders) == 1:
                    return leaders.pop()
                await trio.sleep(0.02)


def repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


async def read_line(stream, timeout: float) -> bytes:
    buf = b""
    with trio.fail_after(timeout):
        while b"\n" not in buf:
            data = await stream.receive_some(4096)
            if not data:
                raise RuntimeError(f"node exited before it was serving (output so far: {buf!r})")
            buf += data
    return buf.split(b"\n", 1)[0]
