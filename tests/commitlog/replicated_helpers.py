# Shared rig of the replicated-store integration tests (no tests here): three
# ReplicaNodes, each on its own SegmentedStore in tmp_path (64 KiB data /
# 4 KiB index segments, so a few hundred 1 KiB entries span many files), over
# a MemoryNetwork.  Nodes are built with commitlog.node.replica_on_store --
# the wiring serve_node uses: term and vote from `currterm`, the committed
# index from the checkpoint, the log from recovery -- so stopping a member
# (clean close of its store) and starting it again is a real restart from
# disk.  Helpers compare replicas byte for byte.
import os
import random

import trio

from commitlog import metafiles
from commitlog.config import FlushDiskType
from commitlog.node import replica_on_store
from commitlog.raft.state import RaftConfig
from commitlog.store import SegmentedStore, StoreConfig
from commitlog.transport.memory import MemoryNetwork
from tests.helpers.waiting import wait_until

IDS = ("n0", "n1", "n2")
DATA_SEG = 64 * 1024
INDEX_SEG = 4 * 1024
WIRE_PUSH_REQUEST = 5  # commitlog.raft.wire: byte 1 of a message is its type


def body(tag: str, i: int, size: int = 1000) -> bytes:
    return f"{tag}-{i}:".encode().ljust(size, b".")


class Member:
    """One node's directory, and the node while it runs."""

    def __init__(self, cluster: "Cluster", node_id: str, seed: int, join: bool = False) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.seed = seed
        self.join = join          # a node joining the group (dLegerJoin): dLegerPeers = IDS + itself
        self.root = os.path.join(cluster.root, node_id)
        self.store: SegmentedStore | None = None
        self.node = None
        self.transport = None
        self.scope: trio.CancelScope | None = None
        self.stopped = trio.Event()
        self.starts = 0
        # What the store held right after recovery, before the node ran:
        # (begin, end, committed, (term, vote)).
        self.recovered: tuple | None = None

    @property
    def running(self) -> bool:
        return self.scope is not None and not self.stopped.is_set()

    @property
    def store_dir(self) -> str:
        return os.path.join(self.root, f"dledger-{self.node_id}")

    def store_config(self) -> StoreConfig:
        c = self.cluster
        return StoreConfig(root=self.root, self_id=self.node_id, data_segment_size=DATA_SEG,
                           index_segment_size=INDEX_SEG, flush_disk_type=c.flush_disk_type, **c.store_kw)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        c = self.cluster
        self.stopped = trio.Event()
        self.starts += 1
        with trio.CancelScope() as scope:
            self.scope = scope
            store = self.store = SegmentedStore.open(self.store_config())
            try:
                self.recovered = (store.begin_index, store.end_index, store.committed_index,
                                  metafiles.read_currterm(store.store_dir))
                ids = IDS if self.node_id in IDS else IDS + (self.node_id,)
                async with c.net.open_transport(self.node_id, ids) as transport:
                    if c.wrap_transport is not None:
                        transport = c.wrap_transport(self, transport)
                    self.transport = transport
                    self.node = replica_on_store(
                        store, transport, self.node_id, ids, c.raft_config,
                        rng=random.Random(f"{self.seed}/{self.starts}"),
                        peer_addresses={i: f"addr-{i}" for i in ids}, max_wait_ack_ms=c.max_wait_ack_ms,
                        joining=self.join)
                    async with trio.open_nursery() as nursery:
                        await nursery.start(self.node.run)
                        task_status.started(self)
            finally:
                store.close()
                self.stopped.set()

    async def stop(self) -> None:
        """Stop the node and close its store (flush + checkpoint)."""
        self.scope.cancel()
        await self.stopped.wait()

    def currterm(self) -> tuple[int, str | None]:
        return metafiles.read_currterm(self.store_dir)


class Cluster:
    def __init__(self, root, nursery: trio.Nursery, *, seed: int = 1, sync_flush: bool = False,
                 raft_config: RaftConfig = RaftConfig(), max_wait_ack_ms: int = 2500,
                 wrap_transport=None, store_kw: dict | None = None) -> None:
        self.root = str(root)
        self.nursery = nursery
        self.net = MemoryNetwork(seed=seed)
        self.flush_disk_type = FlushDiskType.SYNC_FLUSH if sync_flush else FlushDiskType.ASYNC_FLUSH
        self.raft_config = raft_config
        self.max_wait_ack_ms = max_wait_ack_ms
        self.wrap_transport = wrap_transport
        self.store_kw = store_kw or {}
        self.members = {nid: Member(self, nid, seed * 10 + k) for k, nid in enumerate(IDS)}

    def __getitem__(self, node_id: str) -> Member:
        return self.members[node_id]

    def add_member(self, node_id: str) -> Member:
        """A fresh node that joins the group (not started)."""
        m = self.members[node_id] = Member(self, node_id, 97 + len(self.members), join=True)
        return m

    async def start(self, *node_ids: str) -> None:
        for nid in node_ids or self.members:
            await self.nursery.start(self.members[nid].run)

    def running(self) -> list[Member]:
        return [m for m in self.members.values() if m.running]

    async def wait_leader(self, exclude=(), timeout: float = 10.0) -> Member:
        """The running member that leads (checked every tick of the test's
        clock; tests may poll, the product may not)."""
        with trio.fail_after(timeout):
            while True:
                for m in self.running():
                    if m.node_id not in exclude and m.node.is_leader:
                        return m
                await trio.sleep(0.01)

    async def wait_until(self, predicate, timeout: float = 10.0) -> None:
        """predicate() checked every tick of the test's clock."""
        await wait_until(predicate, timeout, getattr(predicate, "__name__", "a condition on the group"),
                         interval=0.01)

    async def wait_committed(self, index: int, members=None, timeout: float = 10.0) -> None:
        for m in members or self.running():
            await m.node.committed.wait_for(index, timeout=timeout)

    async def append_many(self, leader: Member, tag: str, count: int, batch: int = 10) -> list[int]:
        """Append `count` bodies in calls of `batch`; returns their indexes."""
        out = []
        for start in range(0, count, batch):
            placed = await leader.node.append([body(tag, i) for i in range(start, min(count, start + batch))])
            out += [i for i, _ in placed]
        return out


# --- byte-level comparison ----------------------------------------------------

def data_files(store: SegmentedStore) -> dict[str, bytes]:
    d = store.data.directory
    out = {}
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            out[name] = f.read()
    return out


def index_units(store: SegmentedStore, lo: int, hi: int) -> bytes:
    """The stored index units lo..hi, as bytes."""
    out = bytearray()
    for i in range(lo, hi + 1):
        seg = store.index.find(i * 32)
        at = i * 32 - seg.start
        out += seg.view()[at:at + 32]
    return bytes(out)


def assert_identical(a: SegmentedStore, b: SegmentedStore) -> None:
    """Both logs end at the same index with the same chain CRC, every data
    segment both hold is byte-identical (entries, blank fillers and the zero
    tail), those segments cover the range both hold, and so do equal index
    units."""
    assert (a.end_index, a.end_term, a.end_pos) == (b.end_index, b.end_term, b.end_pos)
    assert a.chain_crc_at(a.end_index) == b.chain_crc_at(b.end_index)
    lo = max(a.begin_index, b.begin_index, 0)
    fa, fb = data_files(a), data_files(b)
    common = sorted(set(fa) & set(fb))
    assert common, (sorted(fa), sorted(fb))
    for name in common:
        assert fa[name] == fb[name], f"data segment {name} differs"
    first_pos = a.pos_of(lo)
    assert int(common[0]) <= first_pos and int(common[-1]) + DATA_SEG >= a.end_pos
    assert index_units(a, lo, a.end_index) == index_units(b, lo, b.end_index)
