# Owns one replicated-log node process: it opens (and recovers) the on-disk
# store, restores term/vote, and runs the peer transport, the Raft shell, the
# background flusher and the admin port under one nursery.
#
#   python -m commitlog.node --conf n0.conf [--admin-port 0] [--log-level INFO]
#
# SIGTERM stops the node cleanly (the store is flushed and checkpointed);
# SIGKILL is a crash, which recovery handles.  With LEDGERMQ_PROFILE=<dir> in
# the environment the whole run is profiled with cProfile and the stats are
# written to <dir>/<selfId>.prof when the node stops (tools/bench/replication.py
# --profile uses this).
#
# The conf file uses RocketMQ broker.conf keys (dLegerGroup, dLegerPeers,
# dLegerSelfId, storePathRootDir, flushDiskType, ...; see commitlog/config.py).
# Once the node is serving it prints one JSON line to stdout with its id and
# admin port, so scripts and tests know where to connect.
import json
import logging
import math
import random
import signal
import sys

import attrs
import click
import trio

from commitlog import metafiles
from commitlog.admin import serve_admin
from commitlog.config import ConfigError, ReplicationConfig, load_replication_config
from commitlog.errors import CommitLogError
from commitlog.flusher import serve_flusher
from commitlog.members import load_membership, write_members
from commitlog.profiling import profiled
from commitlog.raft.core import RaftCore
from commitlog.raft.state import HardState, RaftConfig
from commitlog.replica import ReplicaNode
from commitlog.retention import retention_pass, serve_retention
from commitlog.stallwatch import instruments_from_env
from commitlog.store import SegmentedStore, StoreConfig
from commitlog.transport.tcp import PeerTransport, serve_peer_transport

log = logging.getLogger("ledgermq.node")

TICK_MS = 10


def raft_config_for(cfg: ReplicationConfig) -> RaftConfig:
    """Map the millisecond settings of broker.conf onto the core's ticks."""

    def ticks(ms: int) -> int:
        return max(1, round(ms / TICK_MS))

    return RaftConfig(
        heartbeat_ticks=ticks(cfg.heartbeat_interval_ms),
        election_timeout_min=ticks(cfg.election_timeout_min_ms),
        election_timeout_max=ticks(cfg.election_timeout_max_ms),
        push_timeout_ticks=ticks(cfg.max_push_timeout_ms),
        preferred_leader=cfg.preferred_leader_id,
    )


def store_config_for(cfg: ReplicationConfig, *, repair: bool = False) -> StoreConfig:
    return StoreConfig(
        root=cfg.store_path_root_dir,
        self_id=cfg.self_id,
        data_segment_size=cfg.mapped_file_size_commitlog,
        index_segment_size=cfg.mapped_file_size_entry_index,
        # Under SYNC_FLUSH the replica shell fdatasyncs once per driver round
        # (off the event loop) before acks leave: group commit.
        flush_disk_type=cfg.flush_disk_type,
        flush_interval_ms=cfg.flush_interval_ms,
        file_reserved_hours=cfg.file_reserved_hours,
        disk_max_used_ratio=cfg.disk_space_ratio,
        repair=repair,
    )


def replica_on_store(store: SegmentedStore, transport, self_id: str, peer_ids, raft_config: RaftConfig, *,
                     rng: random.Random, tick_seconds: float = TICK_MS / 1000,
                     peer_addresses: dict[str, str] | None = None, max_pending: int = 10000,
                     max_wait_ack_ms: int = 2500, joining: bool = False) -> ReplicaNode:
    """A ReplicaNode over an opened (recovered) store: term and vote come from
    its `currterm` file, the committed index from its checkpoint, the group's
    configuration from `ledgermq-members` checked against the log (or
    dLegerPeers for a store without one; nothing for a `joining` node), and
    every hard-state or configuration change is written back (atomically,
    fsync'ed) before the Ready's messages leave.  serve_node and the
    integration tests build nodes with this."""
    term, vote = metafiles.read_currterm(store.store_dir)
    addresses = dict(peer_addresses or {})
    membership = load_membership(store.store_dir, store, voters=tuple(peer_ids),
                                 addresses={p: a for p, a in addresses.items() if p in peer_ids}, joining=joining)
    core = RaftCore(self_id, tuple(peer_ids), store, rng, raft_config,
                    hard_state=HardState(term, vote or None), committed_index=store.committed_index,
                    membership=membership)

    def persist_hard_state(hs: HardState) -> None:
        metafiles.write_currterm(store.store_dir, hs.term, hs.voted_for)

    def persist_membership(history) -> None:
        write_members(store.store_dir, history)

    node = ReplicaNode(core=core, log=store, transport=transport, persist_hard_state=persist_hard_state,
                       peer_addresses=addresses,
                       tick_seconds=tick_seconds, max_pending=max_pending,
                       max_wait_ack_ms=max_wait_ack_ms, persist_membership=persist_membership)
    if membership.latest_index >= 0:
        node.sync_peers()      # the configuration changed since dLegerPeers was written
    return node


@attrs.define(kw_only=True)
class RunningNode:
    """What serve_node hands to its starter."""

    replica: ReplicaNode
    store: SegmentedStore
    transport: PeerTransport
    admin_port: int | None


async def serve_node(cfg: ReplicationConfig, *, admin_host: str = "127.0.0.1", admin_port: int | None = None,
                     listeners=None, repair: bool = False, seed: int | None = None,
                     task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run one node until cancelled.  started() is called after recovery and
    after the peer and admin ports are bound, with a RunningNode.  On the way
    out the store is flushed, checkpointed and closed."""
    store = SegmentedStore.open(store_config_for(cfg, repair=repair))
    try:
        async with trio.open_nursery() as nursery:
            transport = await nursery.start(lambda task_status: serve_peer_transport(
                cfg.transport_config(), cfg.self_id, cfg.peer_addrs, group=cfg.group,
                listeners=listeners, rng=random.Random(seed),
                identity={"dataSegmentSize": str(store.data_segment_size)}, auth=cfg.peer_auth(),
                task_status=task_status))
            replica = replica_on_store(store, transport, cfg.self_id, cfg.peer_ids, raft_config_for(cfg),
                                       rng=random.Random(seed),
                                       peer_addresses={p.peer_id: p.address for p in cfg.peers},
                                       max_pending=cfg.max_pending_requests,
                                       max_wait_ack_ms=cfg.max_wait_ack_time_ms, joining=cfg.join)
            await nursery.start(replica.run)
            nursery.start_soon(serve_flusher, store)
            nursery.start_soon(lambda: serve_retention(
                lambda: retention_pass(store, cfg.delete_when, cfg.disk_space_ratio)))
            port = admin_port if admin_port is not None else cfg.admin_port
            bound = None
            if port is not None:
                bound = await nursery.start(serve_admin, _AdminView(replica, store, transport), admin_host, port)
            task_status.started(RunningNode(replica=replica, store=store, transport=transport, admin_port=bound))
            await trio.sleep(math.inf)
    finally:
        store.close()


@attrs.define
class _AdminView:
    """The replica's admin surface plus store and transport facts."""

    replica: ReplicaNode
    store: SegmentedStore
    transport: PeerTransport

    def status(self) -> dict:
        st = self.replica.status()
        st["ledgerEndTerm"] = self.store.end_term
        st["ledgerEndPos"] = self.store.end_pos
        st["connectedPeers"] = sorted(self.transport.connected_peers())
        ts = self.transport.stats()
        st["peerPort"] = {"rejectedConnections": ts.rejected_connections, "cappedConnections": ts.capped_connections,
                          "failedConnections": ts.failed_connections, "handshakes": ts.handshakes,
                          "unfinishedBytes": ts.unfinished_bytes}
        return st

    def __getattr__(self, name):
        return getattr(self.replica, name)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@click.command(name="python -m commitlog.node", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--conf", required=True, type=click.Path(dir_okay=False),
              help="broker.conf-style file with the dLeger* keys")
@click.option("--admin-port", type=click.IntRange(0, 65535), default=None, help="admin port (0 = any free port)")
@click.option("--repair", is_flag=True,
              help="truncate at a corrupt entry in the middle of the log instead of refusing to start")
@click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), default="WARNING",
              show_default=True, help="log level (stderr)")
def command(conf: str, admin_port: int | None, repair: bool, log_level: str) -> None:
    """Run one replicated-log node (its JSON line on stdout once serving;
    SIGTERM stops it cleanly)."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    try:
        cfg, warnings = load_replication_config(conf)
    except (ConfigError, OSError) as exc:
        why = (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)
        raise click.ClickException(why if conf in why else f"{conf}: {why}") from None
    for w in warnings:
        log.warning("%s", w)

    async def run():
        async with trio.open_nursery() as nursery:
            running = await nursery.start(lambda task_status: serve_node(
                cfg, admin_port=admin_port, repair=repair, task_status=task_status))
            print(json.dumps({"node": cfg.self_id, "adminPort": running.admin_port,
                              "peerPort": cfg.self_peer.port}), flush=True)
            with trio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    log.info("%s: SIGTERM, stopping", cfg.self_id)
                    nursery.cancel_scope.cancel()
                    break

    try:
        with profiled(cfg.self_id):
            trio.run(run, instruments=instruments_from_env())
    except KeyboardInterrupt:
        pass
    except CommitLogError as exc:
        raise click.ClickException(str(exc)) from None


def main(argv=None) -> None:
    """Run the command; a usage error shows its cause on the first line of
    stderr, then the usage (the console scripts' rule, which
    broker/telemetry/commands.py keeps a layer above this one)."""
    try:
        command.main(args=argv, prog_name="python -m commitlog.node", standalone_mode=False)
    except click.UsageError as exc:
        click.echo(f"Error: {exc.format_message()}", err=True)
        if exc.ctx is not None:
            click.echo(exc.ctx.get_usage(), err=True)
            click.echo(f"Try '{exc.ctx.command_path} --help' for help.", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.Abort:
        sys.exit(130)


if __name__ == "__main__":
    main()
