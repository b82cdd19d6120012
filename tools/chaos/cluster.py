# Owns the cluster the nemesis attacks: tools/brokercluster.py's name
# servers and DLedger broker group (real processes, 127.0.0.1), with a
# fault-injecting relay (relay.py) on every link between brokers and from
# each broker to each name server.  Each broker gets its own view of the
# group: in its broker.conf, its own dLegerPeers entry is its real peer port
# (what it binds) and every other peer's entry is the relay "self>peer"; its
# namesrvAddr names the relays "self>nsK".  Clients reach brokers and name
# servers directly.
#
# Clock jumps: with libfaketime available (PyPI `libfaketime`, which ships
# the preloadable library), every broker runs with LD_PRELOAD and reads its
# wall-clock offset from its own file (FAKETIME_TIMESTAMP_FILE, re-read every
# second); monotonic clocks are left alone, so timers and Raft are unaffected
# and only what reads wall time (record timestamps, delay levels, retention)
# sees the jump.
import glob
import os
import socket

import attrs

from tools.brokercluster import LocalBrokerCluster, ManagedProcess, console_command
from tools.chaos.relay import Link, RelayMesh
from tools.localcluster import free_ports


def faketime_library() -> str | None:
    """The preloadable libfaketime shipped by the PyPI package, if installed."""
    try:
        import libfaketime
    except ImportError:
        return None
    found = glob.glob(os.path.join(os.path.dirname(libfaketime.__file__), "vendor", "**", "libfaketime.so.1"),
                      recursive=True)
    return found[0] if found else None


def _bound_socket() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(128)
    return s


@attrs.define
class ChaosCluster(LocalBrokerCluster):
    """LocalBrokerCluster with relays; `mesh` must be running (RelayMesh.run)
    before start()."""

    mesh: RelayMesh | None = None
    clock_faults: bool = False
    real_peer_ports: dict[str, int] = attrs.Factory(dict)
    _faketime: str | None = None

    def node_ids(self) -> list[str]:
        return [f"n{i}" for i in range(self.size)]

    def _link(self, name: str, target: tuple[str, int]) -> Link:
        return self.mesh.add_bound(name, target, _bound_socket())

    def write_confs(self) -> None:
        if self.mesh is None:
            raise RuntimeError("ChaosCluster.mesh is not set")
        os.makedirs(self.root, exist_ok=True)
        ids = self.node_ids()
        ports = free_ports(self.size * 2)
        self.real_peer_ports = {n: ports[k] for k, n in enumerate(ids)}
        ns_targets = [(a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])) for a in self.namesrv_addrs]
        if self.clock_faults:
            self._faketime = faketime_library()
            if self._faketime is None:
                raise RuntimeError("clock faults need libfaketime (pip install libfaketime)")
        for k, node in enumerate(ids):
            view = []
            for other in ids:
                if other == node:
                    view.append(f"{other}-127.0.0.1:{self.real_peer_ports[other]}")
                else:
                    link = self._link(f"{node}>{other}", ("127.0.0.1", self.real_peer_ports[other]))
                    view.append(f"{other}-127.0.0.1:{link.port}")
            namesrvs = ";".join(f"127.0.0.1:{self._link(f'{node}>ns{j}', t).port}"
                                for j, t in enumerate(ns_targets))
            conf = {
                "brokerClusterName": self.cluster_name, "brokerName": self.broker_name,
                "brokerIP1": "127.0.0.1", "listenPort": ports[self.size + k],
                "enableDLegerCommitLog": "true", "dLegerGroup": self.broker_name,
                "dLegerPeers": ";".join(view), "dLegerSelfId": node,
                "storePathRootDir": self.store_root(node), "flushDiskType": "ASYNC_FLUSH",
                "namesrvAddr": namesrvs, "registerNameServerPeriod": 10000,
                **self.extra_conf,
            }
            with open(self.conf_path(node), "w") as f:
                f.writelines(f"{key}={value}\n" for key, value in conf.items())
            self.set_clock(node, 0)
            self.brokers[node] = ManagedProcess(
                node, [*console_command("mqbroker"), "-c", self.conf_path(node), "--log-level", self.log_level],
                os.path.join(self.root, f"{node}.log"))

    async def _spawn(self, proc: ManagedProcess, env: dict | None = None) -> None:
        env = dict(env or {})
        if self._faketime is not None and proc.name in self.brokers:
            env.update(LD_PRELOAD=self._faketime, FAKETIME_TIMESTAMP_FILE=self._clock_file(proc.name),
                       FAKETIME_CACHE_DURATION="1", FAKETIME_DONT_FAKE_MONOTONIC="1",
                       FAKETIME_DONT_RESET="1")
        await super()._spawn(proc, env)

    # --- clocks -----------------------------------------------------------------------

    def _clock_file(self, node: str) -> str:
        return os.path.join(self.root, f"{node}.faketime")

    def set_clock(self, node: str, offset_s: int) -> None:
        """Shift `node`'s wall clock by offset_s seconds from real time
        (takes effect within a second; no-op without clock faults)."""
        with open(self._clock_file(node), "w") as f:
            f.write(f"{offset_s:+d}\n")

    # --- roles --------------------------------------------------------------------------

    async def master(self) -> str | None:
        """The node the name servers list as brokerId 0, if alive."""
        node = self.node_of((await self.broker_ids()).get(0, ""))
        return node if node is not None and self.brokers[node].alive else None

    def live(self) -> list[str]:
        return [n for n, p in self.brokers.items() if p.alive]
