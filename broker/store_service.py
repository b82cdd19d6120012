# Owns BrokerStore: the broker's composition of its storage under one
# nursery --
#
#   SegmentedStore        the DLedger-format commitlog (opened and recovered)
#   ReplicaNode           the Raft shell that replicates it
#   ConsumeQueueService   dispatch into consume queues + index, fed by the
#                         replica's committed watermark; the leader's offset
#                         table and append hook
#   MetadataService       topic configs, groups, consumer offsets replicated
#                         through the same log
#   RoleGate              leader catch-up before writes; brokerId
#
# plus the store's background flusher and the retention timer.  Wiring:
# replica.on_role_change -> gate (which drives cq.become_leader/_follower),
# replica.on_log_reset -> cq.on_log_reset, and two retention floors: the
# metadata snapshot (entries after it are the tables' only copy) and the
# dispatch position (an entry is never deleted before it reached the consume
# queues).  After retention deleted segments, consume queue and index files
# that point below the new log begin are dropped.
#
#   async with trio.open_nursery() as n:
#       bs = await n.start(serve_broker_store, cfg)          # TCP peers
#       bs = await n.start(run_broker_store, cfg, transport)  # any transport (tests)
#
# On the way out (cancellation) metadata writes its snapshot, dispatch
# checkpoints, and the store is flushed, checkpointed and closed.
import logging
import math
import random

import attrs
import trio

from broker.config import BrokerConfig
from broker.metadata.service import MetadataConfig, MetadataService
from broker.roles import RoleGate
from commitlog.config import FlushDiskType
from commitlog.node import RETENTION_CHECK_SECONDS, raft_config_for, replica_on_store, retention_pass, store_config_for
from commitlog.raft.state import RaftConfig
from commitlog.replica import ReplicaNode
from commitlog.store import SegmentedStore, StoreConfig, serve_flusher
from commitlog.transport.tcp import serve_peer_transport
from consumequeue.dispatcher import DispatchConfig
from consumequeue.service import ConsumeQueueService, open_engine

log = logging.getLogger("ledgermq.broker.store")


@attrs.define(eq=False)
class BrokerStore:
    """What serve_broker_store hands to its starter."""

    cfg: BrokerConfig
    store: SegmentedStore
    replica: ReplicaNode
    cq: ConsumeQueueService
    metadata: MetadataService
    gate: RoleGate
    transport: object

    @property
    def writable(self) -> bool:
        return self.gate.writable

    @property
    def broker_id(self) -> int:
        return self.gate.broker_id

    def retention_pass(self, now: float | None = None, used_ratio: float | None = None) -> list[str]:
        """One retention decision (commitlog.node.retention_pass) honouring
        the floors, then consume queue / index cleanup behind it."""
        deleted = retention_pass(self.store, self.cfg.delete_when, self.cfg.replication.disk_space_ratio,
                                 now=now, used_ratio=used_ratio)
        if deleted:
            cq_files, index_files = self.cq.on_retention()
            log.info("retention: %d commitlog files, %d consume queue files, %d index files deleted",
                     len(deleted), cq_files, index_files)
        return deleted

    async def serve_retention(self, *, interval: float = RETENTION_CHECK_SECONDS) -> None:
        """A timer (DLedger's CleanSpaceService), not a poll of state."""
        while not self.store.closed:
            self.retention_pass()
            await trio.sleep(interval)


def open_store(cfg: BrokerConfig, store_config: StoreConfig | None = None) -> SegmentedStore:
    return SegmentedStore.open(store_config or store_config_for(cfg.replication))


async def run_broker_store(cfg: BrokerConfig, transport, *, store_config: StoreConfig | None = None,
                           raft_config: RaftConfig | None = None, rng: random.Random | None = None,
                           dispatch_config: DispatchConfig | None = None,
                           metadata_config: MetadataConfig | None = None,
                           peer_addresses: dict[str, str] | None = None,
                           checkpoint_interval: float | None = None,
                           retention_interval: float | None = RETENTION_CHECK_SECONDS,
                           run_flusher: bool = True,
                           task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Open the store and run everything over `transport` (a started peer
    transport) until cancelled.  started() gets the BrokerStore."""
    rc = cfg.replication
    store = open_store(cfg, store_config)
    cq = gate = None
    try:
        # Consume queues first: opening them may raise the store's committed
        # index to what was already dispatched before a crash.
        engine, report = open_engine(store, config=dispatch_config)
        log.info("%s: consume queues %s at %d %s", rc.self_id, report.action, report.position, report.reason)
        replica = replica_on_store(
            store, transport, rc.self_id, rc.peer_ids, raft_config or raft_config_for(rc),
            rng=rng or random.Random(), sync_flush=rc.flush_disk_type is FlushDiskType.SYNC_FLUSH,
            peer_addresses=peer_addresses if peer_addresses is not None else {p.peer_id: p.address for p in rc.peers},
            max_pending=rc.max_pending_requests, max_wait_ack_ms=rc.max_wait_ack_time_ms)
        cq = ConsumeQueueService(store, engine, replica.committed)
        if checkpoint_interval is not None:
            cq.dispatcher.checkpoint_interval = checkpoint_interval
        meta_cfg = metadata_config or MetadataConfig(store_host=cfg.store_host)
        metadata = MetadataService.open(replica, store, rc.store_path_root_dir, meta_cfg)
        gate = RoleGate(replica, cq, metadata, peer_ids=rc.peer_ids)
        replica.on_role_change = gate.on_role_change
        replica.on_log_reset = cq.on_log_reset
        store.add_retention_floor(metadata.min_retained_index)
        store.add_retention_floor(lambda: cq.dispatcher.dispatched.value + 1)
        bs = BrokerStore(cfg, store, replica, cq, metadata, gate, transport)
        async with trio.open_nursery() as nursery:
            await nursery.start(cq.run)
            await nursery.start(metadata.run)
            await nursery.start(gate.run)
            await nursery.start(replica.run)
            if run_flusher:  # off in MockClock tests: its worker threads let the clock jump
                nursery.start_soon(serve_flusher, store)
            if retention_interval is not None:
                nursery.start_soon(lambda: bs.serve_retention(interval=retention_interval))
            task_status.started(bs)
            await trio.sleep(math.inf)
    finally:
        if gate is not None:
            gate.close()
        if cq is not None:
            cq.close()
        store.close()


async def serve_broker_store(cfg: BrokerConfig, *, listeners=None, seed: int | None = None,
                             task_status=trio.TASK_STATUS_IGNORED) -> None:
    """run_broker_store over the TCP peer transport of dLegerPeers."""
    rc = cfg.replication
    async with trio.open_nursery() as nursery:
        transport = await nursery.start(lambda task_status: serve_peer_transport(
            rc.transport_config(), rc.self_id, rc.peer_addrs, group=rc.group, listeners=listeners,
            rng=random.Random(seed), task_status=task_status))
        bs = await nursery.start(lambda task_status: run_broker_store(
            cfg, transport, rng=random.Random(seed), task_status=task_status))
        task_status.started(bs)
        await trio.sleep(math.inf)
