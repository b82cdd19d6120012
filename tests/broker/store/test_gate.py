# The broker's role gate over a 3-node in-memory group on real stores
# (tmp_path, small segments, MemoryNetwork, trio MockClock): each node is a
# full BrokerStore (store + replica + consume queues + metadata + gate) as
# run_broker_store composes it.  Checked: no writes before the gate opens
# (a leader still catching up refuses them), brokerId 0 only on the writable
# leader and distinct non-zero ids elsewhere, writes refused at once after
# leadership is lost, and queue offsets continuing correctly after failover
# (stamped by the new leader's rebuilt table, identical on every replica).
import os
import random

import pytest
import trio

from broker.config import BrokerConfig
from broker.metadata.service import MetadataConfig
from broker.store.broker_store import run_broker_store
from broker.store.gate import NotWritableError
from commitlog.store import StoreConfig
from commitlog.transport.memory import MemoryNetwork
from consumequeue import record as M

IDS = ("n0", "n1", "n2")
SEG = 64 * 1024


def broker_config(root: str, nid: str, **extra) -> BrokerConfig:
    props = {"brokerClusterName": "TestCluster", "brokerName": "broker-a", "listenPort": "10911",
             "brokerIP1": f"10.0.0.{IDS.index(nid) + 1}", "storePathRootDir": os.path.join(root, nid),
             "dLegerGroup": "broker-a", "dLegerSelfId": nid,
             "dLegerPeers": ";".join(f"{i}-127.0.0.1:{40911 + k}" for k, i in enumerate(IDS)),
             "maxWaitAckTimeMs": "1000"}
    props.update(extra)
    cfg, _ = BrokerConfig.from_dict(props)
    return cfg


class Member:
    def __init__(self, group: "Group", nid: str):
        self.group, self.nid = group, nid
        self.cfg = broker_config(group.root, nid, **group.extra)
        self.bs = self.scope = None
        self.starts = 0
        self.stopped = trio.Event()

    @property
    def alive(self) -> bool:
        return self.scope is not None and not self.scope.cancel_called

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
        self.starts += 1
        self.stopped = trio.Event()
        rc = self.cfg.replication
        try:
            with trio.CancelScope() as scope:
                self.scope = scope
                async with self.group.net.open_transport(self.nid, IDS) as transport:
                    async with trio.open_nursery() as nursery:
                        self.bs = await nursery.start(lambda task_status: run_broker_store(
                            self.cfg, transport, task_status=task_status,
                            store_config=StoreConfig(root=rc.store_path_root_dir, self_id=self.nid,
                                                     data_segment_size=SEG, index_segment_size=4096),
                            rng=random.Random(f"{self.nid}/{self.starts}"), checkpoint_interval=3600,
                            metadata_config=MetadataConfig(snapshot_interval_s=3600, store_host=self.cfg.store_host),
                            peer_addresses={i: f"addr-{i}" for i in IDS}, retention_interval=None,
                            run_flusher=False))
                        task_status.started(self)
        finally:
            self.stopped.set()

    async def stop(self):
        self.scope.cancel()
        await self.stopped.wait()


class Group:
    def __init__(self, root, nursery, *, seed: int = 3, **extra):
        self.root, self.nursery, self.extra = str(root), nursery, extra
        self.net = MemoryNetwork(seed=seed)
        self.members = {nid: Member(self, nid) for nid in IDS}

    def __getitem__(self, nid) -> Member:
        return self.members[nid]

    async def start(self, *nids):
        for nid in nids or IDS:
            await self.nursery.start(self.members[nid].run)

    def alive(self):
        return [m for m in self.members.values() if m.alive]

    async def wait_leader(self, exclude=()) -> Member:
        """The writable leader (tests may poll on the mock clock)."""
        with trio.fail_after(30):
            while True:
                for m in self.alive():
                    if m.nid not in exclude and m.bs.replica.is_leader:
                        await m.bs.gate.wait_writable()
                        return m
                await trio.sleep(0.01)

    async def settle(self, members=None) -> None:
        """Every alive member committed and dispatched the leader's end."""
        leader = await self.wait_leader()
        end = leader.bs.store.end_index
        for m in members or self.alive():
            await m.bs.replica.committed.wait_for(end, timeout=10)
            await m.bs.cq.dispatcher.dispatched.wait_for(end, timeout=10)


def record(topic: str, i: int, queue_id: int = 0) -> bytes:
    return M.MessageRecord(topic=topic, body=f"m{i}".encode(), queue_id=queue_id,
                           properties={"UNIQ_KEY": f"K{i}"}).encode()


def queue_offsets(m: Member, topic: str, queue_id: int) -> list[tuple[int, str]]:
    """(queue offset, body) of every unit of a consume queue, checked
    against the record it points to."""
    cq = m.bs.cq.engine.cqs.get(topic, queue_id)
    out = []
    for u in cq.read(cq.min_offset, 10**6):
        rec = M.decode(m.bs.cq.engine.source.read(u.phy, u.size), check_crc=True)
        assert (rec.queue_offset, rec.physical_offset) == (u.offset, u.phy)
        out.append((u.offset, rec.body.decode()))
    return out


async def test_gate_opens_after_catch_up_and_ids_follow_the_role(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery)
        await g.start()
        leader = await g.wait_leader()
        assert leader.bs.writable and leader.bs.broker_id == 0
        followers = [m for m in g.alive() if m is not leader]
        for f in followers:
            assert not f.bs.writable
            with pytest.raises(NotWritableError) as info:
                f.bs.gate.check_writable()
            assert info.value.leader_id == leader.nid
        assert sorted(f.bs.broker_id for f in followers) == sorted(
            int(f.nid[1:]) + 1 for f in followers)
        nursery.cancel_scope.cancel()


async def test_a_new_leader_refuses_writes_until_dispatch_caught_up(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery)
        await g.start()
        a = await g.wait_leader()
        await a.bs.replica.append([record("T", i) for i in range(20)])
        await g.settle()
        # Hold one follower's dispatcher back: make its engine refuse to move
        # by blocking the dispatch task (the committed watermark still moves).
        b = next(m for m in g.alive() if m is not a)
        real = b.bs.cq.dispatcher.dispatch_through
        release = trio.Event()
        blocked = trio.Event()

        async def slow(index):
            blocked.set()
            await release.wait()
            await real(index)

        b.bs.cq.dispatcher.dispatch_through = slow
        await a.bs.replica.append([record("T", i) for i in range(20, 30)])
        await blocked.wait()
        await a.bs.replica.transfer_leadership(b.nid)
        with trio.fail_after(5):
            while not b.bs.replica.is_leader:
                await trio.sleep(0.01)
        # b leads but has not dispatched: the gate stays closed, brokerId not 0.
        await trio.sleep(1)
        assert b.bs.replica.is_leader and b.bs.gate.catching_up
        assert not b.bs.writable and b.bs.broker_id != 0
        with pytest.raises(NotWritableError) as info:
            b.bs.gate.check_writable()
        assert info.value.catching_up
        assert not a.bs.writable  # the old leader closed at once
        release.set()
        await b.bs.gate.wait_writable(timeout=5)
        assert b.bs.broker_id == 0
        nursery.cancel_scope.cancel()


async def test_queue_offsets_continue_after_failover(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery)
        await g.start()
        a = await g.wait_leader()
        for i in range(0, 30, 5):
            await a.bs.replica.append([record("T", k, k % 2) for k in range(i, i + 5)])
        await g.settle()
        gen = a.bs.gate.generation.value
        await a.stop()  # the leader dies
        assert not a.bs.writable
        b = await g.wait_leader(exclude=(a.nid,))
        assert b.bs.gate.generation.value > 0 and gen > 0
        for i in range(30, 40):
            await b.bs.replica.append([record("T", i, i % 2)])
        await g.nursery.start(a.run)  # a comes back as a follower
        await g.settle()
        assert not a.bs.writable and a.bs.broker_id != 0
        for m in g.alive():
            for q in (0, 1):
                got = queue_offsets(m, "T", q)
                assert [o for o, _ in got] == list(range(20))
                assert [body for _, body in got] == [f"m{k}" for k in range(q, 40, 2)]
        nursery.cancel_scope.cancel()


async def test_writes_refused_at_once_when_leadership_is_lost(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery)
        await g.start()
        a = await g.wait_leader()
        seen = []
        orig = a.bs.gate.on_role_change

        def spy(ss):
            orig(ss)
            seen.append((ss.role, a.bs.writable, a.bs.cq._hooked))

        a.bs.replica.on_role_change = spy
        b = next(m for m in g.alive() if m is not a)
        await a.bs.replica.transfer_leadership(b.nid)
        # In the very callback that reports the step-down, writes are closed
        # and the offset hook is gone.
        assert seen and all(not w and not hooked for _, w, hooked in seen)
        with pytest.raises(NotWritableError):
            a.bs.gate.check_writable()
        nb = await g.wait_leader()
        assert nb is b
        nursery.cancel_scope.cancel()
