# Dispatch on a replicated log: three ReplicaNodes, each with its own
# SegmentedStore (small segments) and ConsumeQueueService fed by that
# replica's committed watermark, over the in-memory network on trio's
# MockClock.  The leader's offset table follows the role
# (ReplicaNode.on_role_change -> become_leader / become_follower).
#
# Checked: an append that reaches no quorum reaches no consume queue or
# index anywhere; once healed it appears exactly once at the offsets the
# leader stamped, and the three nodes' consume queue and index files are
# byte-identical (and equal to a clean rebuild); a deposed leader's
# truncated tail was never dispatched and its files converge; queue offsets
# stay contiguous across leader changes.
import os
import random

import pytest
import trio
import trio.testing

from commitlog.errors import QuorumTimeoutError, TermChangedError
from commitlog.node import replica_on_store
from commitlog.raft.state import RaftConfig, Role
from commitlog.store import SegmentedStore, StoreConfig
from commitlog.transport.memory import MemoryNetwork
from consumequeue import record as M
from consumequeue import service
from consumequeue.reader import GetMessageStatus, read_messages
from consumequeue.service import ConsumeQueueService
from tests.consumequeue.test_dispatch import SMALL, bodies, clean_build, tree

IDS = ("n0", "n1", "n2")
SEG = 16 << 10  # ~70 messages per data segment
WAIT_ACK_MS = 100  # well inside check-quorum's 300 ms: an isolated leader times out first


class Node:
    def __init__(self, root, node_id: str):
        self.root = str(root)
        self.node_id = node_id
        self.store = self.replica = self.svc = self.scope = None
        self.roles: list[Role] = []

    def on_role_change(self, ss) -> None:
        self.roles.append(ss.role)
        if ss.role is Role.LEADER:
            self.svc.become_leader()
        else:
            self.svc.become_follower()

    @property
    def engine(self):
        return self.svc.engine

    def files(self):
        """Consume queue and index file contents (write-behind buffers and
        index headers written out first)."""
        self.engine.cqs.write_pending()
        for f in self.engine.index.files:
            f.write_header()
        return tree(self.root)


async def run_node(node: Node, net: MemoryNetwork, seed: int, *, task_status=trio.TASK_STATUS_IGNORED):
    with trio.CancelScope() as scope:
        node.scope = scope
        node.store = SegmentedStore.open(StoreConfig(node.root, self_id=node.node_id, data_segment_size=SEG,
                                                     index_segment_size=32 * 1024))
        try:
            async with net.open_transport(node.node_id, IDS) as transport:
                engine, _ = service.open_engine(node.store, config=SMALL)
                node.replica = replica_on_store(node.store, transport, node.node_id, IDS, RaftConfig(),
                                                rng=random.Random(seed), max_wait_ack_ms=WAIT_ACK_MS)
                node.svc = ConsumeQueueService(node.store, engine, node.replica.committed)
                node.svc.dispatcher.checkpoint_interval = 3600  # no fsync threads racing the mock clock
                node.replica.on_role_change = node.on_role_change
                async with trio.open_nursery() as nursery:
                    await nursery.start(node.svc.run)
                    await nursery.start(node.replica.run)
                    task_status.started(node)
        finally:
            if node.svc is not None:
                node.svc.close()
            node.store.close()


async def wait_leader(nodes, exclude=()) -> Node:
    while True:
        for n in nodes:
            if n.node_id not in exclude and n.replica is not None and n.replica.is_leader:
                return n
        await trio.sleep(0.01)


async def settle(nodes, index: int) -> None:
    """Every node has committed and dispatched through `index`."""
    for n in nodes:
        await n.replica.committed.wait_for(index, timeout=10)
        await n.svc.dispatcher.dispatched.wait_for(index, timeout=10)


def queues(node: Node) -> dict:
    """(topic, qid) -> [phy...] in queue-offset order, after checking every
    unit: offsets contiguous from the queue's first, and the record it
    points at carries that topic, queue, queue offset and phy."""
    out = {}
    for (topic, qid), cq in node.engine.cqs.queues.items():
        units = cq.read(cq.min_offset, 10**6)
        assert [u.offset for u in units] == list(range(cq.min_offset, cq.max_offset))
        for u in units:
            rec = M.decode(node.engine.source.read(u.phy, u.size), check_crc=True)
            assert (rec.topic, rec.queue_id, rec.queue_offset, rec.physical_offset) == (topic, qid, u.offset, u.phy)
        out[(topic, qid)] = [u.phy for u in units]
    return out


def same_everywhere(nodes, tmp_path, tag: str) -> dict:
    """The three nodes' consume queue + index files are byte-identical and
    equal what a clean rebuild of the committed log writes; returns the
    queues."""
    files = [n.files() for n in nodes]
    assert files[0][0] and files[0][1]
    for other in files[1:]:
        assert other == files[0]
    assert clean_build(nodes[0].store, tmp_path / f"clean-{tag}", config=SMALL) == files[0]
    qs = [queues(n) for n in nodes]
    assert qs[0] == qs[1] == qs[2]
    return qs[0]


def stamped(node: Node, placed) -> list[tuple[str, int, int, int]]:
    """(topic, qid, queue offset, phy) the leader's hook wrote into records."""
    out = []
    for _, pos in placed:
        phy = pos + 48
        head = node.engine.source.read(phy, 4)
        rec = M.decode(node.engine.source.read(phy, int.from_bytes(head, "big")))
        out.append((rec.topic, rec.queue_id, rec.queue_offset, rec.physical_offset))
    return out


def invisible(node: Node, keys) -> bool:
    idx = node.engine.index
    return all(idx.query(t, k, 10, 0, 1 << 62).phy_offsets == [] for t in ("T", "U") for k in keys)


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


async def test_no_quorum_no_dispatch_then_exactly_once_everywhere(tmp_path, autojump_clock):
    net = MemoryNetwork(seed=7)
    nodes = [Node(tmp_path / i, i) for i in IDS]
    async with trio.open_nursery() as nursery:
        for k, n in enumerate(nodes):
            await nursery.start(run_node, n, net, k)
        leader = await wait_leader(nodes)
        followers = [n for n in nodes if n is not leader]
        placed = await leader.replica.append(bodies(120))
        await settle(nodes, placed[-1][0])
        before = [(n.files(), n.engine.cqs.max_offset_table()) for n in nodes]
        assert sum(before[0][1].values()) == 120

        # (a) Followers cut off: appended and stamped on the leader, not committed.
        for f in followers:
            net.isolate(f.node_id)
        lost_bodies = bodies(6, 10_000)
        with pytest.raises(QuorumTimeoutError):
            await leader.replica.append(lost_bodies)
        assert leader.replica.is_leader and leader.store.end_index == placed[-1][0] + 6
        assert leader.replica.committed.value == placed[-1][0]
        await trio.testing.wait_all_tasks_blocked()
        lost_keys = [f"order{i}" for i in range(10_000, 10_006)]
        for n, (files, offsets) in zip(nodes, before):
            assert n.files() == files and n.engine.cqs.max_offset_table() == offsets
            assert invisible(n, lost_keys)
            assert n.svc.dispatcher.dispatched.value == placed[-1][0]
        lost = [(i, leader.store.pos_of(i)) for i in range(placed[-1][0] + 1, placed[-1][0] + 7)]
        marks = stamped(leader, lost)
        # The hook gave them the next offsets of their queues.
        for topic, qid, qoff, _ in marks:
            assert qoff >= before[0][1][(topic, qid)]

        # (b) Healed: they commit (no new leader was needed) and show up once.
        net.heal()
        await settle(nodes, lost[-1][0])
        assert leader.replica.is_leader and leader.roles[-1] is Role.LEADER and leader.roles.count(Role.LEADER) == 1
        qs = same_everywhere(nodes, tmp_path, "b")
        assert sum(len(v) for v in qs.values()) == 126
        for topic, qid, qoff, phy in marks:
            cq_phys = qs[(topic, qid)]
            assert cq_phys.count(phy) == 1 and cq_phys.index(phy) == qoff
        for n in nodes:
            assert not invisible(n, lost_keys[:1])
            r = read_messages(n.svc, marks[0][0], marks[0][1], marks[0][2], max_msgs=1)
            assert r.status is GetMessageStatus.FOUND and r.phy_offsets == [marks[0][3]]
        nursery.cancel_scope.cancel()


async def test_truncated_tail_never_dispatched_and_offsets_survive_leader_changes(tmp_path, autojump_clock):
    net = MemoryNetwork(seed=11)
    nodes = [Node(tmp_path / i, i) for i in IDS]
    async with trio.open_nursery() as nursery:
        for k, n in enumerate(nodes):
            await nursery.start(run_node, n, net, k)
        old = await wait_leader(nodes)
        placed = await old.replica.append(bodies(100))
        await settle(nodes, placed[-1][0])
        committed_before = placed[-1][0]
        cq_before = old.files()
        offsets_before = old.engine.cqs.max_offset_table()

        # (c) The leader alone appends a tail that reaches nobody; it spans a
        # segment boundary, so truncating it later deletes a data segment.
        net.isolate(old.node_id)
        tail_bodies = bodies(90, 20_000)
        with pytest.raises((QuorumTimeoutError, TermChangedError)):
            await old.replica.append(tail_bodies)
        tail_end = old.store.end_index
        assert old.store.pos_of(tail_end) // SEG > old.store.pos_of(committed_before + 1) // SEG
        new = await wait_leader(nodes, exclude={old.node_id})
        # Check-quorum deposed the old leader: it stopped stamping offsets.
        while old.replica.is_leader:
            await trio.sleep(0.01)
        assert old.roles[-1] is not Role.LEADER and not old.svc._hooked
        assert new.svc._hooked
        others = [n for n in nodes if n is not old]
        placed2 = await new.replica.append(bodies(150, 100))
        await settle(others, placed2[-1][0])
        # The old leader never dispatched its tail: nothing beyond what was
        # committed before it was cut off.
        assert old.svc.dispatcher.dispatched.value == committed_before
        assert old.files() == cq_before
        tail_keys = [f"order{i}" for i in range(20_000, 20_090)]
        assert all(invisible(n, tail_keys) for n in nodes)

        # Healed: the old leader truncates its tail, takes the new entries and
        # ends up with exactly the others' files.
        net.heal()
        await settle(nodes, placed2[-1][0])
        assert old.store.end_index >= placed2[-1][0] and old.replica.committed.value >= placed2[-1][0]
        qs = same_everywhere(nodes, tmp_path, "c")
        assert sum(len(v) for v in qs.values()) == 250
        assert all(invisible(n, tail_keys) for n in nodes)

        # (d) Queue offsets continued from the committed ones on the new
        # leader (not from the old leader's discarded stamps), and continue
        # again across a leadership transfer to the third node.
        marks = stamped(new, placed2)
        for key, first in offsets_before.items():
            mine = [qoff for t, q, qoff, _ in marks if (t, q) == key]
            assert mine == list(range(first, first + len(mine))) and mine
            assert qs[key][first:] == [phy for t, q, _, phy in marks if (t, q) == key]
        third = next(n for n in nodes if n is not old and n is not new)
        await new.replica.transfer_leadership(third.node_id)
        assert await wait_leader(nodes) is third and third.svc._hooked and not new.svc._hooked
        placed3 = await third.replica.append(bodies(40, 250))
        await settle(nodes, placed3[-1][0])
        qs = same_everywhere(nodes, tmp_path, "d")  # contiguity of every queue is checked in there
        assert sum(len(v) for v in qs.values()) == 290
        for topic, qid, qoff, phy in stamped(third, placed3):
            assert qs[(topic, qid)][qoff] == phy
        # A pull from 0 walks a queue's whole history on every node alike.
        pulls = [read_messages(n.svc, "U", 1, 0, max_msgs=1000, max_bytes=1 << 30).records for n in nodes]
        assert pulls[0] == pulls[1] == pulls[2] and len(pulls[0]) > 0
        nursery.cancel_scope.cancel()


def test_stale_map_of_a_truncated_segment_is_never_dispatched(tmp_path):
    """A leader's become_leader() scans its uncommitted tail through the
    dispatch source, mapping a segment the tail spilled into.  Truncation
    deletes that segment and the follower append recreates it: dispatch
    must read the new file, not the mapped old one."""
    from commitlog.watermark import Watermark
    store = SegmentedStore.open(StoreConfig(str(tmp_path), data_segment_size=SEG, index_segment_size=32 * 1024))
    svc = ConsumeQueueService.open(store, Watermark(store.committed_index), config=SMALL)
    try:
        svc.become_leader()
        store.append_leader(bodies(50), term=1)
        store.set_committed(store.end_index)
        service.dispatch_committed(store, svc.engine)
        keep = store.end_index
        store.append_leader(bodies(60, 5000), term=1)  # uncommitted, into the next segment
        assert store.pos_of(store.end_index) >= SEG
        svc.become_leader()  # re-elected: the offset rebuild maps the tail's segments
        store.truncate_from(keep + 1)  # deposed, then truncated by the next leader's log
        assert not os.path.exists(os.path.join(store.store_dir, "data", f"{SEG:020d}"))
        svc.become_leader()
        store.append_leader(bodies(60, 50), term=2)  # recreates the segment
        store.set_committed(store.end_index)
        service.dispatch_committed(store, svc.engine)
        svc.engine.checkpoint()
        assert tree(str(tmp_path)) == clean_build(store, tmp_path / "clean", config=SMALL)
        assert svc.engine.cqs.max_offset_table() == {("T", 0): 28, ("U", 1): 28, ("T", 2): 27, ("U", 3): 27}
    finally:
        svc.close()
        store.close()
