# The peer port's pre-authentication budget against real node processes
# (python -m commitlog.node, a group with a peer secret): 40 connections
# at once, each announcing a 60 MiB HELLO -- or a small HELLO and then a
# 60 MiB AUTH -- and sending as much of it as the node will take.  Before
# the budget a node buffered every one of them until the handshake timeout
# (36 such HELLOs took a leader to 633 MiB).  Now each is refused from its
# header: the leader's peak RSS (VmHWM) stays under 256 MiB, and the group
# replicates on.  The handshake caps are raised for the test so that every
# connection is in its handshake at once: the frame limit alone bounds it.
# Slow: three real node processes, 40 connections of 60 MiB announcements,
#   memory measured.
import os

import pytest
import trio

from commitlog.transport.framing import HEADER, MAGIC, VERSION, FrameKind, Hello, encode_frame
from tools.localcluster import LocalCluster

pytestmark = pytest.mark.slow

SECRET = "peer-port-memory-test-secret"
CONNECTIONS = 40
FRAME = 60 * 2 ** 20
PEAK_LIMIT_KIB = 256 * 1024


def proc_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def peer_port(cluster: LocalCluster, node: str) -> int:
    with open(cluster.nodes[node].conf_path) as f:
        conf = dict(line.strip().split("=", 1) for line in f if "=" in line)
    peers = dict(p.split("-", 1) for p in conf["dLegerPeers"].split(";"))
    return int(peers[node].rsplit(":", 1)[1])


async def oversized(port: int, target: str, group: str, kind: FrameKind) -> int:
    """Announce a FRAME-byte HELLO (or send a small HELLO, then announce a
    FRAME-byte AUTH) and push its payload until the node closes the
    connection.  Returns the payload bytes the node let us send."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    sent = 0
    chunk = b"\0" * 2 ** 20
    try:
        prefix = b""
        if kind == FrameKind.AUTH:
            prefix = encode_frame(Hello(group, "n0", target, nonce=os.urandom(16).hex()).encode(), FrameKind.HELLO)
        await stream.send_all(prefix + HEADER.pack(MAGIC, VERSION, kind, FRAME))
        while sent < FRAME:
            await stream.send_all(chunk)
            sent += len(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await trio.aclose_forcefully(stream)
    return sent


async def attack(port: int, target: str, group: str) -> list[int]:
    sent: list[int] = []

    async def one(k: int) -> None:
        sent.append(await oversized(port, target, group, FrameKind.HELLO if k % 2 else FrameKind.AUTH))

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            for k in range(CONNECTIONS):
                nursery.start_soon(one, k)
    return sent


async def test_oversized_pre_auth_frames_keep_the_leader_small(tmp_path):
    cluster = LocalCluster(str(tmp_path), extra_conf={
        "dLegerPeerSecret": SECRET, "peerMaxHandshakes": 100, "peerMaxHandshakesPerAddress": 100})
    await cluster.start()
    try:
        leader = await cluster.wait_leader()
        pid = cluster.nodes[leader].process.pid
        reply = await cluster.call(leader, {"op": "append", "bodies": ["YmVmb3Jl"]})
        await cluster.wait_all_committed(reply["entries"][-1][0])
        rss_before = proc_kib(pid, "VmRSS")

        sent = await attack(peer_port(cluster, leader), leader, cluster.group)

        peak, rss_after = proc_kib(pid, "VmHWM"), proc_kib(pid, "VmRSS")
        print(f"leader {leader}: RSS {rss_before // 1024} MiB before, peak {peak // 1024} MiB, "
              f"{rss_after // 1024} MiB after {CONNECTIONS} oversized pre-auth frames "
              f"({sum(sent) // 2 ** 20} MiB of them sent before the node closed the connections)")
        assert len(sent) == CONNECTIONS and cluster.nodes[leader].alive
        assert peak <= PEAK_LIMIT_KIB, (peak, rss_before)
        assert sum(sent) < CONNECTIONS * FRAME      # refused from the header, not read to the end

        status = await cluster.call(leader, {"op": "status"})
        assert status["peerPort"]["rejectedConnections"] == CONNECTIONS, status["peerPort"]
        assert status["peerPort"]["cappedConnections"] == 0 and status["peerPort"]["failedConnections"] == 0

        # The group replicates on, same leader, nothing elected meanwhile.
        term = status["term"]
        reply = await cluster.call(leader, {"op": "append", "bodies": ["YWZ0ZXI="] * 10})
        assert reply["ok"], reply
        statuses = await cluster.wait_all_committed(reply["entries"][-1][0])
        assert {s["term"] for s in statuses.values()} == {term} and len(statuses) == 3
        assert {s["leader"] for s in statuses.values()} == {leader}
    finally:
        await cluster.stop_all()
