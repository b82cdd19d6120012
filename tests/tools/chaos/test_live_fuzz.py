# Mutated and random frames against the live ports of a real broker group
# (issue 14): the RocketMQ remoting port of the master and the DLedger peer
# port of a follower.  Each input goes out on its own connection, followed
# by our end of stream; the server must answer and/or close that
# connection within CLOSE_TIMEOUT -- never hang on it -- and a frame that
# announces 2 GiB is refused from its prefix.  Afterwards the brokers are
# the same processes, open descriptors and RSS are back within bounds (no
# leaked connection tasks, no unbounded buffers), and the group still
# replicates, sends and pulls.  LEDGERMQ_FUZZ_LIVE sets the inputs per port.
import os
import random
import struct

import pytest
import trio

import broker.client as client
from tools.brokercluster import open_broker_cluster
from tools.chaos.fuzz import inputs, peer_corpus, remoting_corpus
from tools.chaos.soak import proc_stats
from tools.mqadmin.adminapi import MQAdmin

pytestmark = pytest.mark.slow

INPUTS = int(os.environ.get("LEDGERMQ_FUZZ_LIVE", "300"))
CLOSE_TIMEOUT = 10.0
PARALLEL = 8
RSS_GROWTH = 64 * 2 ** 20
FD_SLACK = 8


async def one(addr: tuple[str, int], data: bytes, slow_tail: bool = False) -> str:
    """Send `data`, end our side, read until the server closes; returns how
    it ended ("closed" or "answered+closed")."""
    stream = await trio.open_tcp_stream(*addr)
    got = 0
    try:
        with trio.fail_after(CLOSE_TIMEOUT):
            try:
                await stream.send_all(data)
                if not slow_tail:
                    await stream.send_eof()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return "closed"  # the server had already closed it
            while True:
                try:
                    chunk = await stream.receive_some(65536)
                except trio.BrokenResourceError:  # reset
                    break
                if not chunk:
                    break
                got += len(chunk)
    finally:
        await trio.aclose_forcefully(stream)
    return "answered+closed" if got else "closed"


async def hammer(addr: tuple[str, int], corpus: list[bytes], seed: int) -> dict:
    rng = random.Random(seed)
    gen = inputs(rng, corpus)
    todo = [next(gen) for _ in range(INPUTS)]
    outcomes: dict[str, int] = {}
    limiter = trio.CapacityLimiter(PARALLEL)

    async def run(data: bytes) -> None:
        async with limiter:
            how = await one(addr, data)
            outcomes[how] = outcomes.get(how, 0) + 1

    async with trio.open_nursery() as nursery:
        for data in todo:
            nursery.start_soon(run, data)
    return outcomes


def peer_port(cluster, node: str) -> int:
    with open(cluster.conf_path(node)) as f:
        conf = dict(line.strip().split("=", 1) for line in f if "=" in line)
    peers = dict(p.split("-", 1) for p in conf["dLegerPeers"].split(";"))
    return int(peers[node].rsplit(":", 1)[1])


async def test_fuzzed_frames_on_live_broker_and_peer_ports(tmp_path):
    async with open_broker_cluster(tmp_path) as cluster:
        master = await cluster.wait_master()
        follower = next(n for n in cluster.brokers if n != master)
        admin = MQAdmin(cluster.remoting, cluster.namesrv_addr)
        await admin.create_topic(cluster.addr(master), "FuzzTopic", 2, 2, 6, False)
        pids = {n: p.pid for n, p in cluster.brokers.items()}
        await trio.sleep(1.0)
        before = {n: proc_stats(pid) for n, pid in pids.items()}

        host, port = cluster.addr(master).rsplit(":", 1)
        broker_addr = (host, int(port))
        peer_addr = ("127.0.0.1", peer_port(cluster, follower))
        remoting = await hammer(broker_addr, remoting_corpus(), 1)
        peer = await hammer(peer_addr, peer_corpus(), 2)
        print(f"live fuzz: {INPUTS} inputs on the remoting port of {master}: {remoting}; "
              f"{INPUTS} on the peer port of {follower}: {peer}")
        assert sum(remoting.values()) == INPUTS and sum(peer.values()) == INPUTS

        # A frame that announces 2 GiB, then nothing: refused from its prefix.
        for addr, prefix in ((broker_addr, struct.pack(">ii", 0x7FFFFFF0, 0x00000010)),
                             (peer_addr, struct.pack(">HBBI", 0x4C51, 1, 1, 0x7FFFFFF0))):
            assert await one(addr, prefix + b"x" * 64, slow_tail=True) in ("closed", "answered+closed")

        # Same processes, descriptors and memory back within bounds.
        await trio.sleep(1.0)
        for n, pid in pids.items():
            assert cluster.brokers[n].alive and cluster.brokers[n].pid == pid, cluster.log_tail(n)
            rss, fds, _anon, _store = proc_stats(pid)
            assert fds <= before[n][1] + FD_SLACK, (n, before[n], fds)
            assert rss <= before[n][0] + RSS_GROWTH, (n, before[n], rss)

        # The group still works: a send is replicated and pulled back.
        async with client.open_producer("fuzz_pg", namesrv_addr=cluster.namesrv_addr) as producer:
            r = await producer.send(client.Message("FuzzTopic", b"after the fuzz"))
        assert r.status == client.SendStatus.SEND_OK
        for node in cluster.brokers:
            with trio.fail_after(10):
                while True:
                    _n, _lo, _hi, recs = await admin.pull(cluster.addr(node), "fuzz_cg", "FuzzTopic",
                                                          r.queue.queue_id, r.queue_offset)
                    if recs:
                        break
                    await trio.sleep(0.1)
            assert recs[0].body == b"after the fuzz", node
