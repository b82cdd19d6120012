# Owns running a whole ledgermq cluster as real processes on 127.0.0.1: one
# or more `mqnamesrv` and one DLedger group of `mqbroker`s (default 3), each
# broker with its own broker.conf and store root -- or several groups
# (brokerName a, b, ...) behind the same name servers (MultiGroupCluster).
# It learns each process's address from the line it prints when it serves,
# can kill -9 / SIGSTOP / restart the processes it started (by PID, and only
# those), add a node that joins a running group (dLegerJoin), and finds the
# current master from the name server's cluster info.  Used by the client
# library's and mqadmin's tests, the broker benchmarks and the quickstart.
#
#   async with open_broker_cluster(tmp_path) as cluster:
#       master = await cluster.wait_master()          # node id, e.g. "n1"
#       cluster.kill(master)
#       await cluster.wait_master(exclude={master})
#
#   async with open_multi_group_cluster(tmp_path, groups=("broker-a", "broker-b")) as mc:
#       await mc.wait_masters()
#       mc["broker-a"].kill(await mc["broker-a"].wait_master())
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import trio

from broker.namesrv.client import NamesrvClient
from broker.remoting.client import RemotingClient, open_remoting_client
from broker.remoting.errors import RemotingError
from tools.localcluster import free_ports, read_line, repo_root

_NAMESRV_LINE = re.compile(rb"listening on (\S+):(\d+)")


@attrs.define
class ManagedProcess:
    name: str
    argv: list[str]
    log_path: str
    process: trio.Process | None = None
    addr: str | None = None  # host:port it serves remoting on
    info: dict = attrs.Factory(dict)  # the broker's start-up JSON line

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


def console_command(name: str) -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.exists(exe):
        return [exe]
    return [sys.executable, "-c", f"from broker.cli import {name}; {name}()"]


@attrs.define
class LocalBrokerCluster:
    """Call start() (or use open_broker_cluster); `remoting` must be set for
    the methods that ask the name server."""
    root: str
    size: int = 3
    cluster_name: str = "LedgerCluster"
    broker_name: str = "broker-a"
    namesrv_count: int = 1
    extra_conf: dict = attrs.Factory(dict)  # more broker.conf keys for every broker
    namesrv_conf: dict = attrs.Factory(dict)  # more namesrv.conf keys for every name server
    client_options: dict = attrs.Factory(dict)  # open_remoting_client keywords (rpc_hook, tls) for `remoting`
    log_level: str = "WARNING"
    remoting: RemotingClient | None = None
    namesrvs: list[ManagedProcess] = attrs.Factory(list)
    brokers: dict[str, ManagedProcess] = attrs.Factory(dict)
    peers: dict[str, str] = attrs.Factory(dict)  # dLegerSelfId -> DLedger host:port, as configured

    # --- addresses -----------------------------------------------------------------

    @property
    def namesrv_addr(self) -> str:
        """"a:9876;b:9876", as clients and NAMESRV_ADDR spell it."""
        return ";".join(p.addr for p in self.namesrvs if p.addr)

    @property
    def namesrv_addrs(self) -> list[str]:
        return [p.addr for p in self.namesrvs if p.addr]

    def addr(self, node: str) -> str:
        return self.brokers[node].addr

    def node_of(self, addr: str) -> str | None:
        return next((n for n, p in self.brokers.items() if p.addr == addr), None)

    def store_root(self, node: str) -> str:
        return os.path.join(self.root, node)

    def conf_path(self, node: str) -> str:
        return os.path.join(self.root, f"{node}.conf")

    def namesrv_client(self) -> NamesrvClient:
        return NamesrvClient(self._remoting(), self.namesrv_addrs)

    def _remoting(self) -> RemotingClient:
        if self.remoting is None:
            raise RuntimeError("LocalBrokerCluster.remoting is not set (use open_broker_cluster)")
        return self.remoting

    # --- processes ---------------------------------------------------------------------

    def write_confs(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        ids = [f"n{i}" for i in range(self.size)]
        ports = free_ports(self.size * 2)
        self.peers = {n: f"127.0.0.1:{ports[k]}" for k, n in enumerate(ids)}
        for k, node in enumerate(ids):
            self._write_conf(node, ports[self.size + k], self.peers)

    def _write_conf(self, node: str, listen_port: int, peers: dict[str, str], **more) -> None:
        conf = {
            "brokerClusterName": self.cluster_name, "brokerName": self.broker_name,
            "brokerIP1": "127.0.0.1", "listenPort": listen_port,
            "enableDLegerCommitLog": "true", "dLegerGroup": self.broker_name,
            "dLegerPeers": ";".join(f"{n}-{a}" for n, a in peers.items()), "dLegerSelfId": node,
            "storePathRootDir": self.store_root(node), "flushDiskType": "ASYNC_FLUSH",
            "namesrvAddr": self.namesrv_addr, "registerNameServerPeriod": 10000,
            **self.extra_conf, **more,
        }
        with open(self.conf_path(node), "w") as f:
            f.writelines(f"{key}={value}\n" for key, value in conf.items())
        self.brokers[node] = ManagedProcess(
            node, [*console_command("mqbroker"), "-c", self.conf_path(node), "--log-level", self.log_level],
            os.path.join(self.root, f"{node}.log"))

    def add_node(self, node: str) -> str:
        """Write the broker.conf of a fresh node that joins this running
        group (dLegerJoin=true; its dLegerPeers lists the group and itself);
        returns its DLedger peer address for `mqadmin addDLedgerPeer`.  Start
        it with start_broker()."""
        peer_port, listen_port = free_ports(2)
        self.peers[node] = f"127.0.0.1:{peer_port}"
        self._write_conf(node, listen_port, self.peers, dLegerJoin="true")
        return self.peers[node]

    async def start(self) -> None:
        """Start every name server and broker that is not running; returns
        once each serves (brokers: recovered, bound, registering)."""
        os.makedirs(self.root, exist_ok=True)
        if not self.namesrvs:
            ports = free_ports(self.namesrv_count)
            for i, port in enumerate(ports):
                conf = os.path.join(self.root, f"namesrv{i}.conf")
                with open(conf, "w") as f:  # loopback only: nothing listens beyond this machine
                    f.write(f"listenPort={port}\nbindAddress=127.0.0.1\n")
                    f.writelines(f"{key}={value}\n" for key, value in self.namesrv_conf.items())
                self.namesrvs.append(ManagedProcess(f"namesrv{i}", [*console_command("mqnamesrv"), "-c", conf],
                                                    os.path.join(self.root, f"namesrv{i}.log")))
        for ns in self.namesrvs:
            if not ns.alive:
                await self._spawn(ns)
                line = await read_line(ns.process.stdout, timeout=30)
                m = _NAMESRV_LINE.search(line)
                if m is None:
                    raise RuntimeError(f"{ns.name}: unexpected start-up line {line!r}")
                ns.addr = f"{m.group(1).decode()}:{m.group(2).decode()}"
                metrics = re.search(rb"Prometheus metrics on (\S+)", line)
                if metrics is not None:
                    ns.info["metrics"] = metrics.group(1).decode()
        if not self.brokers:
            self.write_confs()
        pending = [n for n, p in self.brokers.items() if not p.alive]
        for node in pending:  # spawn all first: a group elects only with a quorum up
            await self._spawn(self.brokers[node])
        for node in pending:
            await self._await_broker(node)

    async def start_broker(self, node: str) -> None:
        """(Re)start one broker that is not running."""
        proc = self.brokers[node]
        if not proc.alive:
            await self._spawn(proc)
            await self._await_broker(node)

    async def _await_broker(self, node: str) -> None:
        proc = self.brokers[node]
        try:
            line = await read_line(proc.process.stdout, timeout=60)
        except RuntimeError as e:
            raise RuntimeError(f"broker {node}: {e}\n{self.log_tail(node)}") from None
        proc.info = json.loads(line)
        proc.addr = proc.info["brokerAddr"]

    async def _spawn(self, proc: ManagedProcess, env: dict | None = None) -> None:
        root = repo_root()
        full_env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
                    **(env or {})}
        with open(proc.log_path, "ab") as log:
            proc.process = await trio.lowlevel.open_process(
                proc.argv, stdout=subprocess.PIPE, stderr=log, cwd=root, env=full_env)

    def _proc(self, name: str) -> ManagedProcess:
        if name in self.brokers:
            return self.brokers[name]
        return next(p for p in self.namesrvs if p.name == name)

    def kill(self, name: str) -> None:
        """kill -9 a broker ("n0") or name server ("namesrv0") we started."""
        proc = self._proc(name)
        if proc.alive:
            os.kill(proc.pid, signal.SIGKILL)

    def pause(self, name: str) -> None:
        proc = self._proc(name)
        if proc.alive:
            os.kill(proc.pid, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        proc = self._proc(name)
        if proc.alive:
            os.kill(proc.pid, signal.SIGCONT)

    async def wait_dead(self, name: str) -> None:
        proc = self._proc(name)
        if proc.process is not None:
            await proc.process.wait()
        if self.remoting is not None and proc.addr:
            self.remoting.close_connection(proc.addr)

    async def stop(self, name: str, timeout: float = 20.0) -> int | None:
        """SIGTERM one process and wait for it (kill -9 after timeout);
        returns its exit status."""
        proc = self._proc(name)
        if proc.alive:
            os.kill(proc.pid, signal.SIGCONT)
            proc.process.terminate()
            with trio.move_on_after(timeout):
                await proc.process.wait()
            if proc.alive:
                os.kill(proc.pid, signal.SIGKILL)
                await proc.process.wait()
        return proc.process.returncode if proc.process is not None else None

    async def stop_all(self) -> None:
        """Brokers first (they unregister from the name servers), then the
        name servers."""
        async with trio.open_nursery() as nursery:
            for node in self.brokers:
                nursery.start_soon(self.stop, node)
        async with trio.open_nursery() as nursery:
            for ns in self.namesrvs:
                nursery.start_soon(self.stop, ns.name)

    def log_tail(self, name: str, chars: int = 4000) -> str:
        path = self._proc(name).log_path
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return ""
        return f"--- {name} ({path}) ---\n" + data[-chars:].decode("utf-8", "replace")

    # --- roles, from the name server --------------------------------------------------

    async def broker_ids(self) -> dict[int, str]:
        """brokerId -> address of this group, as the name servers see it
        (empty while none answers)."""
        try:
            brokers, _clusters = await self.namesrv_client().get_cluster_info()
        except RemotingError:
            return {}
        data = brokers.get(self.broker_name)
        return dict(data.broker_addrs) if data is not None else {}

    async def wait_master(self, timeout: float = 30.0, exclude: set[str] = frozenset(),
                          settled: bool = True) -> str:
        """The node registered as brokerId 0, not in `exclude`.  With
        settled, also wait until every live broker is registered under a
        distinct id and none that is dead is (the route clients will see)."""
        with trio.fail_after(timeout):
            while True:
                ids = await self.broker_ids()
                master = self.node_of(ids.get(0, ""))
                if master is not None and master not in exclude and self.brokers[master].alive:
                    live = {p.addr for p in self.brokers.values() if p.alive}
                    if not settled or (set(ids.values()) == live and len(ids) == len(live)):
                        return master
                await trio.sleep(0.05)


@attrs.define
class MultiGroupCluster:
    """Several DLedger groups (one LocalBrokerCluster each, under
    root/<brokerName>) behind the same name servers, in one cluster."""

    root: str
    groups: dict[str, LocalBrokerCluster]

    def __getitem__(self, broker_name: str) -> LocalBrokerCluster:
        return self.groups[broker_name]

    @property
    def first(self) -> LocalBrokerCluster:
        return next(iter(self.groups.values()))

    @property
    def namesrv_addr(self) -> str:
        return self.first.namesrv_addr

    @property
    def namesrvs(self) -> list[ManagedProcess]:
        return self.first.namesrvs

    async def start(self) -> None:
        first = self.first
        await first.start()                      # the name servers, then its brokers
        for g in list(self.groups.values())[1:]:
            g.namesrvs = first.namesrvs
            await g.start()

    async def wait_masters(self, timeout: float = 60.0) -> dict[str, str]:
        """brokerName -> master node id, once every group has one."""
        return {name: await g.wait_master(timeout=timeout) for name, g in self.groups.items()}

    async def stop_all(self) -> None:
        async with trio.open_nursery() as nursery:
            for g in self.groups.values():
                for node in g.brokers:
                    nursery.start_soon(g.stop, node)
        async with trio.open_nursery() as nursery:
            for ns in self.namesrvs:
                nursery.start_soon(self.first.stop, ns.name)

    def processes(self) -> list[tuple[str, ManagedProcess, LocalBrokerCluster]]:
        out = [(ns.name, ns, self.first) for ns in self.namesrvs]
        out += [(f"{name}/{node}", p, g) for name, g in self.groups.items() for node, p in g.brokers.items()]
        return out


@asynccontextmanager
async def open_multi_group_cluster(root, groups=("broker-a", "broker-b"), namesrv_count: int = 2,
                                   **kw) -> AsyncIterator[MultiGroupCluster]:
    """Start one DLedger group per brokerName behind `namesrv_count` name
    servers (one cluster), yield it, stop it on exit; on failure the
    processes' log tails are printed to stderr."""
    mc = MultiGroupCluster(str(root), {})
    try:
        async with open_remoting_client() as rc:
            for name in groups:
                mc.groups[name] = LocalBrokerCluster(os.path.join(str(root), name), broker_name=name,
                                                     namesrv_count=namesrv_count, remoting=rc, **kw)
            await mc.start()
            yield mc
            await mc.stop_all()
    except BaseException:
        for label, proc, g in mc.processes():
            print(g.log_tail(label.split("/")[-1]), file=sys.stderr)
        raise
    finally:
        for _, proc, _ in mc.processes():
            if proc.alive:
                os.kill(proc.pid, signal.SIGKILL)
                await proc.process.wait()


@asynccontextmanager
async def open_broker_cluster(root, **kw) -> AsyncIterator[LocalBrokerCluster]:
    """Start the cluster, yield it (with `remoting` set), stop it on exit;
    on failure the processes' log tails are printed to stderr."""
    cluster = LocalBrokerCluster(str(root), **kw)
    try:
        async with open_remoting_client(**cluster.client_options) as rc:
            cluster.remoting = rc
            await cluster.start()
            yield cluster
            await cluster.stop_all()
    except BaseException:
        for name in [*cluster.brokers, *(p.name for p in cluster.namesrvs)]:
            print(cluster.log_tail(name), file=sys.stderr)
        raise
    finally:
        for proc in [*cluster.brokers.values(), *cluster.namesrvs]:
            if proc.alive:
                os.kill(proc.pid, signal.SIGKILL)
                await proc.process.wait()
