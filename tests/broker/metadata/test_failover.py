# Metadata that survives failover (issue 5; apache/rocketmq#7790): three
# ReplicaNodes on real SegmentedStores in tmp_path over a MemoryNetwork
# (trio MockClock), each with a MetadataService.  A consumer commits
# offsets on leader A; A is killed; the new leader B, after its leader
# barrier, answers the consumer with exactly its last committed offsets and
# the topic and group configs.  A restarts and converges to B's tables.
import os
import random

import pytest
import trio
import trio.testing

from broker.common.values import TopicConfig
from broker.metadata.service import MetadataConfig, MetadataService
from broker.metadata.snapshot import load_snapshot
from broker.metadata.tables import SubscriptionGroupConfig
from commitlog.errors import NotLeaderError
from commitlog.node import replica_on_store
from commitlog.raft.state import RaftConfig
from commitlog.store import SegmentedStore, StoreConfig
from commitlog.transport.memory import MemoryNetwork
from tests.broker.metadata.helpers import DATA_SEG, INDEX_SEG

IDS = ("n0", "n1", "n2")
CONFIG = MetadataConfig(offset_flush_interval_ms=100, snapshot_interval_s=5)


class Member:
    def __init__(self, tmp_path, node_id: str, net: MemoryNetwork):
        self.node_id = node_id
        self.root = os.path.join(str(tmp_path), node_id)
        self.net = net
        self.starts = 0
        self.node = self.meta = self.scope = None
        self.stopped = trio.Event()

    @property
    def alive(self) -> bool:
        return self.scope is not None and not self.scope.cancel_called

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
        self.starts += 1
        self.stopped = trio.Event()
        with trio.CancelScope() as scope:
            self.scope = scope
            store = SegmentedStore.open(StoreConfig(root=self.root, self_id=self.node_id, data_segment_size=DATA_SEG,
                                                    index_segment_size=INDEX_SEG))
            try:
                async with self.net.open_transport(self.node_id, IDS) as transport:
                    self.node = replica_on_store(store, transport, self.node_id, IDS, RaftConfig(),
                                                 rng=random.Random(f"{self.node_id}/{self.starts}"),
                                                 peer_addresses={i: f"addr-{i}" for i in IDS})
                    self.meta = MetadataService.open(self.node, store, self.root, CONFIG)
                    async with trio.open_nursery() as nursery:
                        await nursery.start(self.node.run)
                        await nursery.start(self.meta.run)
                        task_status.started(self)
            finally:
                store.close()
                self.stopped.set()


async def wait_leader(members) -> Member:
    while True:  # test-only: the mock clock makes this loop cheap
        for m in members:
            if m.alive and m.node is not None and m.node.is_leader:
                await m.meta.leader_barrier()
                return m
        await trio.sleep(0.01)


async def test_consumer_resumes_from_committed_offset_after_leader_is_killed(tmp_path, autojump_clock):
    net = MemoryNetwork(seed=5)
    members = [Member(tmp_path, i, net) for i in IDS]
    async with trio.open_nursery() as nursery:
        for m in members:
            await nursery.start(m.run)
        a = await wait_leader(members)
        await a.meta.update_topic(TopicConfig("TopicA", 4, 4))
        await a.meta.update_group(SubscriptionGroupConfig("cg", consume_message_orderly=True))
        # A consumer of 4 queues commits every few (mock) seconds.
        committed = {}
        for rnd in range(1, 6):
            batch = [("TopicA", "cg", q, rnd * 100 + q) for q in range(4)]
            last = await a.meta.commit_offsets(batch)
            committed.update({q: off for _, _, q, off in batch})
            await trio.sleep(2)
        for m in members:
            await m.meta.wait_applied(last, timeout=5)
            assert m.meta.offset_table("TopicA", "cg") == committed
        # A stale commit (queue 0 going back) does not move the offset.
        await a.meta.commit_offset("TopicA", "cg", 0, 1)

        a.scope.cancel()  # the leader dies
        b = await wait_leader([m for m in members if m is not a])
        assert b is not a
        for q in range(4):
            assert b.meta.query_offset("TopicA", "cg", q) == committed[q]
        assert b.meta.topic_config("TopicA").read_queue_nums == 4
        assert b.meta.group_config("cg").consume_message_orderly
        with pytest.raises(NotLeaderError):
            other = next(m for m in members if m not in (a, b))
            await other.meta.commit_offset("TopicA", "cg", 0, 999)

        # The consumer carries on against B; an operator resets queue 3.
        last = await b.meta.commit_offsets([("TopicA", "cg", q, 900 + q) for q in range(3)])
        last = max(last, await b.meta.reset_offsets("TopicA", "cg", {3: 50}))
        expected = {0: 900, 1: 901, 2: 902, 3: 50}
        assert b.meta.offset_table("TopicA", "cg") == expected

        # A comes back from its own files and converges to B's tables.
        await a.stopped.wait()
        await nursery.start(a.run)
        await a.meta.wait_applied(last, timeout=10)
        assert a.meta.offset_table("TopicA", "cg") == expected
        for m in members:
            await m.meta.wait_applied(last, timeout=10)
        assert a.meta.state == b.meta.state
        nursery.cancel_scope.cancel()
    # Clean shutdown left snapshots that reproduce the same tables.
    states = [load_snapshot(m.root).state for m in members]
    assert all(s.offsets.offsets == states[0].offsets.offsets for s in states)
    assert states[0].offsets.table_of("TopicA", "cg") == expected
