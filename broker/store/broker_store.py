# Owns BrokerStore: the broker's storage composed under one nursery -- the
# DLedger-format SegmentedStore (opened and recovered), the ReplicaNode that
# replicates it, the ConsumeQueueService (dispatch into consume queues and
# index from the committed watermark; the leader's offset table and append
# hook), the MetadataService (topics, groups, offsets through the same log),
# the RoleGate, the background flusher and the retention timer.
#
#   async with trio.open_nursery() as n:
#       bs = await n.start(serve_broker_store, cfg)          # TCP peers
#       bs = await n.start(run_broker_store, cfg, transport)  # any transport (tests)
#
# Wiring: replica.on_role_change -> gate (which drives cq.become_leader/
# _follower), replica.on_log_reset -> cq.on_log_reset.  Retention has two
# floors: the metadata snapshot (entries after it are the tables' only copy)
# and the dispatch position (nothing is deleted before it reached the consume
# queues); consume queue and index files below the new log begin are dropped
# after it.  On the way out metadata writes its snapshot, dispatch
# checkpoints, the store is flushed, checkpointed and closed.  A store migrated
# from master-slave (consumequeue/migrated.py) opens with its old commitlog
# below the DLedger log; a root holding only an old commitlog is upgraded in
# place first (broker.store.upgrade, as RocketMQ's enableDLegerCommitLog
# does); its retention expires the old segments first, and its first leader
# imports the old config tables.
import logging
import math
import random

import attrs
import trio

from broker.config import BrokerConfig
from broker.metadata.service import MetadataConfig, MetadataService
from broker.store.diskguard import DEFAULT_RESERVE, DiskGuard
from broker.store.gate import RoleGate
from broker.store.migrated import MigrationImport, needs_upgrade
from broker.store.migrated import log_identity as migrated_identity
from broker.store.upgrade import apply as apply_upgrade
from commitlog.flusher import serve_flusher
from commitlog.node import raft_config_for, replica_on_store, store_config_for
from commitlog.raft.state import RaftConfig
from commitlog.replica import ReplicaNode
from commitlog.retention import RETENTION_CHECK_SECONDS, retention_pass, serve_retention
from commitlog.store import SegmentedStore, StoreConfig, data_segment_size_of
from commitlog.transport.tcp import PeerTransport, serve_peer_transport
from consumequeue.dispatcher import DispatchConfig
from consumequeue.migrated import DividedLog, legacy_floor, legacy_retention_pass, load_marker, open_migrated_engine
from consumequeue.service import ConsumeQueueService, begin_position, open_engine

log = logging.getLogger("ledgermq.broker.store")


@attrs.define(eq=False, kw_only=True)
class BrokerStore:
    """What serve_broker_store hands to its starter."""

    cfg: BrokerConfig
    store: SegmentedStore
    replica: ReplicaNode
    cq: ConsumeQueueService
    metadata: MetadataService
    gate: RoleGate
    transport: PeerTransport
    migrated: DividedLog | None = None  # the store continues an old master-slave commitlog

    @property
    def writable(self) -> bool:
        return self.gate.writable

    @property
    def broker_id(self) -> int:
        return self.gate.broker_id

    def retention_pass(self, now: float | None = None, used_ratio: float | None = None) -> list[str]:
        """One retention decision (commitlog.retention.retention_pass) honouring
        the floors, then consume queue / index cleanup behind it."""
        if self.migrated is not None and self.cq.engine.source.legacy_present():
            return self._legacy_retention_pass(now, used_ratio)
        deleted = retention_pass(self.store, self.cfg.delete_when, self.cfg.replication.disk_space_ratio,
                                 now=now, used_ratio=used_ratio)
        if deleted:
            cq_files, index_files = self.cq.on_retention()
            log.info("retention: %d commitlog files, %d consume queue files, %d index files deleted",
                     len(deleted), cq_files, index_files)
        return deleted

    def _legacy_retention_pass(self, now: float | None, used_ratio: float | None) -> list[str]:
        """While old segments exist only they expire (the DLedger store's
        floor keeps its own segments), so the boundary is never split."""
        source = self.cq.engine.source
        deleted = legacy_retention_pass(
            source, file_reserved_hours=self.cfg.file_reserved_time_hours, delete_when=self.cfg.delete_when,
            max_used_ratio=self.cfg.replication.disk_space_ratio, now=now, used_ratio=used_ratio)
        if deleted:
            begin = source.begin_pos if source.legacy_present() else begin_position(self.store)
            cq_files, index_files = self.cq.engine.delete_expired(begin)
            log.info("retention: %d old commitlog files, %d consume queue files, %d index files deleted",
                     len(deleted), cq_files, index_files)
        return deleted


def open_store(cfg: BrokerConfig, store_config: StoreConfig | None = None) -> SegmentedStore:
    return SegmentedStore.open(store_config or store_config_for(cfg.replication))


def upgrade_if_needed(cfg: BrokerConfig, store_config: StoreConfig | None = None):
    """The automatic upgrade: an old master-slave commitlog under the store
    root and no migrated DLedger store yet -> migrate in place (see
    broker/store/upgrade.py).  Returns the migration marker (None for a
    store that never was master-slave)."""
    sc = store_config or store_config_for(cfg.replication)
    if needs_upgrade(sc.root, sc.self_id):
        plan = apply_upgrade(sc.root, sc.self_id, data_segment_size=sc.data_segment_size,
                     index_segment_size=sc.index_segment_size)
        for w in plan.warnings:
            log.warning("%s: migration: %s", sc.self_id, w)
        log.info("%s: upgraded the master-slave store in place; DLedger log continues at %d",
                 sc.self_id, plan.divided)
    return load_marker(sc.store_dir)


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
    marker = upgrade_if_needed(cfg, store_config)
    dispatch_config = dispatch_config or DispatchConfig(delay_levels_ms=cfg.message_delay_levels_ms)
    store = open_store(cfg, store_config)
    configured = (store_config or store_config_for(rc)).data_segment_size
    if store.data_segment_size != configured:
        log.warning("%s: the store's data segments are %d bytes (mappedFileSizeCommitLog is %d): the files win; "
                    "every replica of the group must use %d", rc.self_id, store.data_segment_size, configured,
                    store.data_segment_size)
    cq = gate = None
    try:
        # Consume queues first: opening them may raise the store's committed
        # index to what was already dispatched before a crash.
        if marker is not None:
            engine, report = open_migrated_engine(store, marker, config=dispatch_config)
        else:
            engine, report = open_engine(store, config=dispatch_config)
        log.info("%s: consume queues %s at %d %s", rc.self_id, report.action, report.position, report.reason)
        replica = replica_on_store(
            store, transport, rc.self_id, rc.peer_ids, raft_config or raft_config_for(rc),
            rng=rng or random.Random(),
            peer_addresses=peer_addresses if peer_addresses is not None else {p.peer_id: p.address for p in rc.peers},
            max_pending=rc.max_pending_requests, max_wait_ack_ms=rc.max_wait_ack_time_ms, joining=rc.join)
        cq = ConsumeQueueService(store, engine, replica.committed)
        if checkpoint_interval is not None:
            cq.dispatcher.checkpoint_interval = checkpoint_interval
        meta_cfg = metadata_config or MetadataConfig(store_host=cfg.store_host)
        metadata = MetadataService.open(replica, store, rc.store_path_root_dir, meta_cfg)
        disk = DiskGuard(rc.store_path_root_dir, rc.disk_space_ratio,
                         reserve_bytes=max(DEFAULT_RESERVE, 2 * cfg.max_message_size))
        gate = RoleGate(replica, cq, metadata, peer_ids=rc.peer_ids, disk=disk,
                        before_open=None if marker is None else MigrationImport(metadata, store.store_dir, marker))
        replica.on_role_change = gate.on_role_change
        replica.space_check = disk.check_reserve
        replica.on_log_reset = cq.on_log_reset
        store.add_retention_floor(metadata.min_retained_index)
        store.add_retention_floor(lambda: cq.dispatcher.dispatched.value + 1)
        if marker is not None:
            store.add_retention_floor(legacy_floor(engine.source))
        bs = BrokerStore(cfg=cfg, store=store, replica=replica, cq=cq, metadata=metadata, gate=gate,
                         transport=transport, migrated=marker)
        async with trio.open_nursery() as nursery:
            await nursery.start(cq.run)
            await nursery.start(metadata.run)
            await nursery.start(gate.run)
            await nursery.start(replica.run)
            if run_flusher:  # off in MockClock tests: its worker threads let the clock jump
                nursery.start_soon(serve_flusher, store)
            if retention_interval is not None:
                nursery.start_soon(lambda: serve_retention(bs.retention_pass, interval=retention_interval))
            task_status.started(bs)
            await trio.sleep(math.inf)
    finally:
        if gate is not None:
            gate.close()
        if cq is not None:
            cq.close()
        store.close()


def log_identity(cfg: BrokerConfig, marker: DividedLog | None) -> dict[str, str]:
    """What the peer handshake compares: the log's origin (and a migrated
    store's old end) and the data segment size its files were written with
    (or will be: the configured one for a new store).  Replicas that differ
    in any of these cannot hold the same bytes at the same positions."""
    sc = store_config_for(cfg.replication)
    return {**migrated_identity(marker), "dataSegmentSize": str(data_segment_size_of(sc))}


async def serve_broker_store(cfg: BrokerConfig, *, listeners=None, seed: int | None = None,
                             task_status=trio.TASK_STATUS_IGNORED) -> None:
    """run_broker_store over the TCP peer transport of dLegerPeers."""
    rc = cfg.replication
    identity = log_identity(cfg, upgrade_if_needed(cfg))
    async with trio.open_nursery() as nursery:
        transport = await nursery.start(lambda task_status: serve_peer_transport(
            rc.transport_config(), rc.self_id, rc.peer_addrs, group=rc.group, listeners=listeners,
            rng=random.Random(seed), identity=identity, auth=rc.peer_auth(), task_status=task_status))
        bs = await nursery.start(lambda task_status: run_broker_store(
            cfg, transport, rng=random.Random(seed), task_status=task_status))
        task_status.started(bs)
        await trio.sleep(math.inf)
