# serve_node over real TCP on 127.0.0.1: three nodes in one process (real
# clock) -- election, appends through the admin port, a follower and then the
# leader stopped and restarted from their files, replicas compared byte for
# byte.  And the node as a process (python -m commitlog.node): SIGTERM stops
# it cleanly (exit 0, store flushed and checkpointed), and LEDGERMQ_PROFILE
# leaves one cProfile file per node.
import base64
import os

import pytest
import trio

from commitlog import metafiles
from commitlog.admin import admin_call
from commitlog.config import ReplicationConfig
from commitlog.node import serve_node
from commitlog.profiling import PROFILE_ENV
from tests.commitlog.replicated_helpers import DATA_SEG, INDEX_SEG, assert_identical, body
from tools.localcluster import LocalCluster

IDS = ("n0", "n1", "n2")


class NodeRunner:
    """One serve_node in this process, restartable on the same peer port."""

    def __init__(self, node_id: str, root: str, ports: dict[str, int]) -> None:
        peers = ";".join(f"{i}-127.0.0.1:{ports[i]}" for i in IDS)
        self.cfg, warnings = ReplicationConfig.from_dict({
            "dLegerGroup": "tcp", "dLegerPeers": peers, "dLegerSelfId": node_id,
            "storePathRootDir": os.path.join(root, node_id),
            "mappedFileSizeCommitLog": str(DATA_SEG), "mappedFileSizeForEntryIndex": str(INDEX_SEG)})
        assert not warnings
        self.node_id = node_id
        self.port = ports[node_id]
        self.listeners = None
        self.running = None
        self.scope = None
        self.stopped = trio.Event()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.stopped = trio.Event()
        if self.listeners is None:
            self.listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
        try:
            with trio.CancelScope() as self.scope:
                await serve_node(self.cfg, admin_port=0, listeners=self.listeners, seed=IDS.index(self.node_id),
                                 task_status=task_status)
        finally:
            for listener in self.listeners:
                await trio.aclose_forcefully(listener)
            self.listeners = None
            self.stopped.set()

    @property
    def replica(self):
        return self.running.replica

    async def stop(self) -> None:
        self.scope.cancel()
        await self.stopped.wait()

    async def admin(self, req: dict) -> dict:
        reply = await admin_call("127.0.0.1", self.running.admin_port, req, timeout=10)
        assert reply["ok"], reply
        return reply


async def start(nursery, runner: NodeRunner) -> None:
    runner.running = await nursery.start(runner.run)


async def wait_leader(runners, exclude=()) -> NodeRunner:
    with trio.fail_after(10):
        while True:
            for r in runners:
                if r.node_id not in exclude and not r.stopped.is_set() and r.replica.is_leader:
                    return r
            await trio.sleep(0.01)


async def test_serve_node_restarts_over_tcp_end_identical(tmp_path):
    bound = {i: await trio.open_tcp_listeners(0, host="127.0.0.1") for i in IDS}
    ports = {i: ls[0].socket.getsockname()[1] for i, ls in bound.items()}
    runners = [NodeRunner(i, str(tmp_path), ports) for i in IDS]
    for r in runners:
        r.listeners = bound[r.node_id]
    async with trio.open_nursery() as nursery:
        for r in runners:
            await start(nursery, r)
        leader = await wait_leader(runners)
        acked = []
        for k in range(6):
            bodies = [body("adm", 10 * k + j) for j in range(10)]
            reply = await leader.admin({"op": "append", "bodies": [base64.b64encode(b).decode() for b in bodies]})
            acked += [i for i, _ in reply["entries"]]
        assert len(acked) == 60 and acked == sorted(acked)

        # A follower goes down and comes back from its files.
        follower = next(r for r in runners if r is not leader)
        await follower.stop()
        for k in range(6):
            acked += [i for i, _ in await leader.replica.append([body("direct", 10 * k + j) for j in range(10)])]
        await start(nursery, follower)
        assert (await follower.admin({"op": "status"}))["term"] == leader.replica.core.term
        await follower.replica.committed.wait_for(acked[-1], timeout=10)
        assert follower.replica.core.leader_id == leader.node_id

        # The leader goes down: the others elect a new one; it comes back as
        # a follower and catches up.
        await leader.stop()
        new = await wait_leader(runners, exclude={leader.node_id})
        acked += [i for i, _ in await new.replica.append([body("new", j) for j in range(30)])]
        await start(nursery, leader)
        for r in runners:
            await r.replica.committed.wait_for(acked[-1], timeout=10)
        statuses = [await r.admin({"op": "status"}) for r in runners]
        assert [s["role"] for s in statuses].count("leader") == 1
        chains = {(await r.admin({"op": "chain", "index": acked[-1]}))["chainCrc"] for r in runners}
        assert len(chains) == 1
        read = await leader.admin({"op": "read", "from": acked[0], "count": 1})
        assert base64.b64decode(read["entries"][0][2]) == body("adm", 0)
        for r in runners:
            if r is not new:
                assert_identical(new.running.store, r.running.store)
        nursery.cancel_scope.cancel()


@pytest.mark.slow
async def test_node_process_stops_cleanly_on_sigterm_and_profiles(tmp_path, monkeypatch):
    """Slow: three real node processes, each profiled."""
    monkeypatch.setenv(PROFILE_ENV, str(tmp_path / "prof"))
    cluster = LocalCluster(str(tmp_path / "cluster"))
    await cluster.start()
    try:
        leader = await cluster.wait_leader()
        reply = await cluster.call(leader, {"op": "load", "count": 200, "size": 100, "window": 8, "batch": 1})
        assert reply["appended"] == 200 and not reply["errors"], reply
        last = (await cluster.call(leader, {"op": "status"}))["committedIndex"]
        with trio.fail_after(10):
            while min(s["committedIndex"] for s in (await cluster.statuses()).values()) < last:
                await trio.sleep(0.02)
    finally:
        await cluster.stop_all()            # SIGTERM first
    for node_id, proc in cluster.nodes.items():
        assert proc.process.returncode == 0, (node_id, proc.process.returncode)
        store_dir = os.path.join(cluster.root, node_id, f"dledger-{node_id}")
        end, committed = metafiles.read_checkpoint(store_dir)
        assert end >= last and committed >= last        # written by close(), not left to the 3 s timer
        assert os.path.getsize(tmp_path / "prof" / f"{node_id}.prof") > 0
