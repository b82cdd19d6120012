# Owns the running broker (`mqbroker -c broker.conf`) and is the composition
# root: one process that composes serve_broker_store (the replicated
# commitlog, consume queues, metadata and role gate: broker/store/), the
# remoting server on listenPort with a RequestDispatcher holding every
# processor (broker/processors/, each built by wire_processors with its
# collaborators handed to it directly), the services (client registry,
# delay-level schedule, transaction check, admin TPS meter, pull hold service,
# timer messages), the metrics (broker/metrics.py: metered send and pull
# processors, the stats sampler, the Prometheus endpoint with
# metricsExporterType=PROM) and the registration with the name servers.
#
#   async with trio.open_nursery() as n:
#       broker = await n.start(serve_broker, cfg)
#       broker.broker_addr, broker.gate.writable
#
# Rules.  Wiring is explicit: nothing is discovered, a processor that fails to
# import fails the start.  REGISTER_BROKER (registerBrokerAll) goes to every
# name server every registerNameServerPeriod, and at once when the gate's
# generation or the topic table changes; brokerId comes from the gate (0 only
# while writable), dataVersion from the topic table (counter = log index of
# its last change) with stateVersion = the Raft term, so a deposed master's
# late registration cannot take id 0 back; the topic table is the replicated
# one without internal topics, plus TBW102 (perm 7) with autoCreateTopicEnable.
# A clean shutdown (SIGTERM, Ctrl-C) unregisters from every name server.
# listenPort=0 binds a free port, written into the config before the store
# opens (brokerIP1:listenPort is every message's STOREHOST); the remoting port
# is bound first and answers SYSTEM_BUSY until the processors are in place.
import functools
import ipaddress
import json
import logging
import math
import signal
import sys

import attrs
import trio

from broker.acl.service import AclService, message_lookup
from broker.acl.signing import Credentials
from broker.acl.validator import BROKER_POLICY, broker_policy
from broker.common.permissions import PERM_INHERIT, PERM_READ, PERM_WRITE
from broker.common.values import TopicConfig
from broker.config import BrokerConfig, LiveConfig, load_broker_config
from broker.metadata.service import MetadataService
from broker.metrics import BrokerMetrics, MeteredPulls, MeteredRequests, MeteredSends, serve_broker_metrics
from broker.namesrv.client import NamesrvClient
from broker.namesrv.routes import BrokerRegistration, DataVersion
from broker.processors.admin import AdminProcessor
from broker.processors.admin_clients import ClientsAdminProcessor
from broker.processors.admin_dledger import DLedgerAdminProcessor
from broker.processors.client_manager import ClientManager
from broker.processors.clients import ClientProcessor
from broker.processors.end_transaction import EndTransactionProcessor, TransactionCheckBack
from broker.processors.forward import WriteForwarder
from broker.processors.locks import QueueLockProcessor
from broker.processors.offsets import ConsumerOffsetProcessor
from broker.processors.pop import PopProcessor
from broker.processors.pop_revive import PopReviveService
from broker.processors.pull import PullProcessor
from broker.processors.recall import RecallProcessor
from broker.processors.retry import RetryTopics, SendBackProcessor
from broker.processors.send import AUTO_CREATE_TOPIC_KEY_TOPIC, SendProcessor
from broker.remoting.client import RemotingClient, open_remoting_client
from broker.remoting.codes import ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import not_supported
from broker.remoting.errors import RemotingError
from broker.remoting.guard import GuardedDispatcher, InFlightLimiter
from broker.remoting.server import RemotingServer, RequestDispatcher, serve_remoting
from broker.store.broker_store import BrokerStore, serve_broker_store
from broker.store.gate import RoleGate
from broker.store.schedule import ScheduleService
from broker.store.timer import TimerService
from broker.store.transaction import TransactionService
from broker.telemetry.exporter import MetricsServer
from broker.telemetry.stats import StatsBook
from commitlog.replica import ReplicaNode
from commitlog.watermark import Watermark

log = logging.getLogger("ledgermq.broker")

UNREGISTER_TIMEOUT = 3.0
TOPIC_ANNOUNCE_TIMEOUT = 2.0  # a send that auto-created its topic waits at most this for the name servers
REGISTER_RETRY_FIRST = 0.5  # seconds before retrying a failed registration round, doubling ...
REGISTER_RETRY_MAX = 4.0    # ... up to this (or the period, if shorter)


@attrs.define(eq=False)
class Processors:
    """Every request processor and service of one broker, built with its
    collaborators (wire_processors)."""

    send: SendProcessor
    send_back: SendBackProcessor
    pull: PullProcessor
    clients: ClientProcessor
    offsets: ConsumerOffsetProcessor
    admin: AdminProcessor
    admin_clients: ClientsAdminProcessor
    admin_dledger: DLedgerAdminProcessor
    schedule: ScheduleService
    end_transaction: EndTransactionProcessor
    transactions: TransactionService
    locks: QueueLockProcessor
    forwarder: WriteForwarder
    timer: TimerService  # timer messages (broker/store/timer.py) and RECALL_MESSAGE
    recall: RecallProcessor
    pop: PopProcessor  # POP consumption (broker/processors/pop.py)
    pop_revive: PopReviveService


    def register(self, dispatcher: RequestDispatcher) -> None:
        for p in (self.send, self.send_back, self.pull, self.clients, self.offsets, self.admin,
                  self.admin_clients, self.admin_dledger, self.end_transaction, self.locks, self.recall,
                  self.pop):
            p.register(dispatcher)

    def services(self) -> tuple:
        """The background services, each started with `nursery.start(s.run)`."""
        return self.schedule, self.transactions, self.admin, self.pull, self.timer, self.pop_revive


def wire_processors(config: LiveConfig, bs: BrokerStore, clients: ClientManager,
                    stats: StatsBook | None = None, acl: AclService | None = None) -> Processors:
    # Writes this broker cannot store (a master that just stepped down, a
    # leader catching up or transferring) are held or handed on to the
    # master; its client is set by serve_broker, which owns its connections.
    forwarder = WriteForwarder(config, bs.gate, bs.replica)
    send = SendProcessor(config, bs.replica, bs.gate, bs.metadata, bs.store, forwarder=forwarder)
    # The check service asks producers through the check-back, which knows
    # the client registry; END_TRANSACTION asks the service which halves are
    # resolved.  With ACL, a check-back goes only to a producer whose account
    # may see the half (any account can name any producer group in a heartbeat).
    check_back = TransactionCheckBack(clients=clients, may_check_back=acl.may_check_back if acl is not None else None)
    transactions = TransactionService(cfg=config.current, gate=bs.gate, metadata=bs.metadata, replica=bs.replica,
                                      store=bs.store, cq=bs.cq, queues=bs.cq.engine,
                                      arrivals=bs.cq.dispatcher.arrivals, check_back=check_back)
    end_transaction = EndTransactionProcessor(send=send, service=transactions, cq=bs.cq)
    timer = TimerService(cfg=config.current, gate=bs.gate, metadata=bs.metadata, replica=bs.replica, store=bs.store,
                         cq=bs.cq, queues=bs.cq.engine, arrivals=bs.cq.dispatcher.arrivals,
                         dispatched=bs.cq.dispatcher.dispatched)
    # POP: the revive service hooks itself to the processor (new checkpoints wake it).
    pop = PopProcessor(config=config, gate=bs.gate, metadata=bs.metadata, replica=bs.replica, cq=bs.cq,
                       queues=bs.cq.engine, dispatcher=bs.cq.dispatcher)
    return Processors(
        pop=pop,
        pop_revive=PopReviveService(config=config, gate=bs.gate, metadata=bs.metadata, replica=bs.replica,
                                    cq=bs.cq, pop=pop),
        timer=timer,
        recall=RecallProcessor(config, bs.gate, bs.metadata, timer),
        end_transaction=end_transaction,
        transactions=transactions,
        locks=QueueLockProcessor(config, bs.metadata),
        send=send,
        send_back=SendBackProcessor(send, bs.cq),
        pull=PullProcessor(config=config, gate=bs.gate, metadata=bs.metadata, replica=bs.replica, cq=bs.cq,
                           queues=bs.cq.engine, dispatcher=bs.cq.dispatcher, clients=clients),
        clients=ClientProcessor(clients, RetryTopics(config, bs.metadata, bs.gate),
                                property_filter=lambda: config.current.enable_property_filter),
        offsets=ConsumerOffsetProcessor(gate=bs.gate, metadata=bs.metadata, queues=bs.cq.engine),
        admin=AdminProcessor(config=config, gate=bs.gate, metadata=bs.metadata, replica=bs.replica, log=bs.store,
                             cq=bs.cq, queues=bs.cq.engine, stats=stats if stats is not None else StatsBook()),
        admin_clients=ClientsAdminProcessor(config=config, gate=bs.gate, metadata=bs.metadata, queues=bs.cq.engine,
                                            replica=bs.replica, clients=clients),
        admin_dledger=DLedgerAdminProcessor(config, bs),
        schedule=ScheduleService(cfg=config.current, gate=bs.gate, metadata=bs.metadata, replica=bs.replica,
                                 cq=bs.cq, queues=bs.cq.engine, arrivals=bs.cq.dispatcher.arrivals),
        forwarder=forwarder,
    )


@attrs.define(eq=False, kw_only=True)
class Broker:
    """What serve_broker hands to its starter."""

    config: LiveConfig
    store: BrokerStore
    dispatcher: RequestDispatcher
    server: RemotingServer
    remoting: RemotingClient
    clients: ClientManager
    processors: Processors
    namesrv: NamesrvClient | None = None
    guard: GuardedDispatcher | None = None  # admission in front of `dispatcher`
    acl: AclService | None = None  # when aclEnable
    registrations: int = 0  # completed registration rounds
    last_registered_id: int | None = None
    last_results: dict = attrs.Factory(dict)
    _kick: trio.Event = attrs.Factory(trio.Event)
    _accepted_rounds: Watermark = attrs.Factory(Watermark)  # rounds every name server accepted
    _registered_topics: Watermark = attrs.Factory(Watermark)  # topics data version of the last round sent
    registered: "trio.Event" = attrs.Factory(trio.Event)  # set after the first round
    metrics: BrokerMetrics | None = None
    metrics_server: MetricsServer | None = None  # while metricsExporterType=PROM

    # --- what callers read ---------------------------------------------------------

    @property
    def gate(self) -> RoleGate:
        return self.store.gate

    @property
    def metadata(self) -> MetadataService:
        return self.store.metadata

    @property
    def replica(self) -> ReplicaNode:
        return self.store.replica

    @property
    def cfg(self) -> BrokerConfig:
        """The effective config (listenPort as bound, hot keys as updated)."""
        return self.config.current

    @property
    def broker_addr(self) -> str:
        return self.cfg.broker_addr

    @property
    def broker_id(self) -> int:
        return self.gate.broker_id

    @property
    def role(self) -> str:
        """MASTER (writable leader) or SLAVE, as RocketMQ names it."""
        return "MASTER" if self.gate.writable else "SLAVE"

    def status(self) -> dict:
        return {"brokerAddr": self.broker_addr, "brokerName": self.cfg.broker_name,
                "clusterName": self.cfg.broker_cluster_name, "brokerId": self.broker_id, "role": self.role,
                "raftRole": self.gate.role.name.lower(), "term": self.gate.term, "selfId": self.cfg.self_id,
                "listenPort": self.cfg.listen_port}

    # --- registration ----------------------------------------------------------------

    def topic_configs(self) -> dict[str, TopicConfig]:
        cfg = self.cfg
        restrict = not (cfg.broker_permission & PERM_WRITE and cfg.broker_permission & PERM_READ)
        out: dict[str, TopicConfig] = {}
        if cfg.auto_create_topic_enable:
            out[AUTO_CREATE_TOPIC_KEY_TOPIC] = TopicConfig(
                AUTO_CREATE_TOPIC_KEY_TOPIC, cfg.default_topic_queue_nums, cfg.default_topic_queue_nums,
                PERM_INHERIT | PERM_READ | PERM_WRITE)
        for name, tc in self.metadata.topic_configs(include_internal=False).items():
            perm = tc.perm & cfg.broker_permission if restrict else tc.perm
            out[name] = attrs.evolve(tc, perm=perm, attributes={}, extra={})  # what a route carries
        return out

    def registration(self) -> BrokerRegistration:
        dv = self.metadata.state.topics.data_version
        return BrokerRegistration(
            cluster_name=self.cfg.broker_cluster_name, broker_name=self.cfg.broker_name,
            broker_addr=self.broker_addr, broker_id=self.gate.broker_id,
            topic_configs=self.topic_configs(),
            data_version=DataVersion(dv.counter, self.gate.term, dv.timestamp))

    def kick(self) -> None:
        """Re-register now (role or topics changed)."""
        self._kick.set()

    async def topics_announced(self, timeout: float = TOPIC_ANNOUNCE_TIMEOUT) -> None:
        """Until a registration round carrying the topics as they are now
        went to every name server (at most `timeout`).  A send that
        auto-created its topic answers after this, as RocketMQ's
        createTopicInSendMessageMethod registers before it answers: a
        client routing to the topic right after SEND_OK finds it."""
        if self.namesrv is None:
            return
        want = self.metadata.state.topics.data_version.counter
        if self._registered_topics.value >= want:
            return
        self.kick()
        with trio.move_on_after(timeout):
            await self._registered_topics.wait_for(want)

    async def register_once(self) -> dict:
        reg = self.registration()
        results = await self.namesrv.register_broker(reg)
        self._registered_topics.advance(reg.data_version.counter)
        self.last_results, self.last_registered_id = results, reg.broker_id
        self.registrations += 1
        for addr, result in results.items():
            if isinstance(result, RemotingError):
                log.warning("register %s (id %d) with %s failed: %s", reg.broker_addr, reg.broker_id, addr, result)
            elif not result.accepted:
                log.warning("name server %s ignored %s (id %d): %s", addr, reg.broker_addr, reg.broker_id,
                            result.reason)
            else:
                log.debug("registered %s as id %d (term %d) with %s", reg.broker_addr, reg.broker_id,
                          reg.data_version.state_version, addr)
        self.registered.set()
        return results

    async def serve_registration(self, period: float) -> None:
        """Register every `period`, at once on a kick, and -- while a round
        failed at some name server or was ignored there -- again after
        REGISTER_RETRY_FIRST seconds, doubling up to REGISTER_RETRY_MAX: a
        whole period would leave a master unknown to the name server (so to
        clients) for up to registerNameServerPeriod (30 s by default) after a
        registration that timed out or met a dropped connection (a master
        cut from the name server).
        A round that succeeded is renewed at once when a connection it went
        over closes (_watch_namesrv_connections)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_generation)
            nursery.start_soon(self._watch_topics)
            nursery.start_soon(self._watch_namesrv_connections)
            retry = REGISTER_RETRY_FIRST
            while True:
                self._kick = trio.Event()
                results = await self.register_once()
                if all(not isinstance(r, RemotingError) and r.accepted for r in results.values()):
                    wait, retry = period, REGISTER_RETRY_FIRST
                    self._accepted_rounds.advance(self._accepted_rounds.value + 1)
                else:
                    wait, retry = min(retry, period), min(retry * 2, REGISTER_RETRY_MAX)
                with trio.move_on_after(wait):
                    await self._kick.wait()

    async def _watch_namesrv_connections(self) -> None:
        """After a round every name server accepted, wait for a connection
        it went over to close, then re-register.  The name server forgets a
        broker whose registration connection closes (upstream's
        onChannelDestroy), so after a cut that healed between two rounds the
        broker was unknown to clients until the next period (the nemesis
        measured 9.5-13.6 s with a 10 s period; 30 s by default).  Only
        accepted rounds arm this, so a link that keeps dropping goes through
        the failed-round backoff instead of spinning."""
        seen = self._accepted_rounds.value
        while True:
            seen = await self._accepted_rounds.wait_changed(seen)
            conns = [c for a in self.namesrv.addrs if (c := self.remoting.cached(a)) is not None]
            if not conns:
                continue
            async with trio.open_nursery() as watch:
                for conn in conns:
                    watch.start_soon(self._closed_then_cancel, conn, watch.cancel_scope)
            log.info("%s: a name server connection closed (%s); re-registering", self.broker_addr,
                     next((c.close_reason for c in conns if c.closed), "?"))
            self.kick()

    @staticmethod
    async def _closed_then_cancel(conn, scope: trio.CancelScope) -> None:
        await conn.wait_closed()
        scope.cancel()

    async def _watch_generation(self) -> None:
        gen = self.gate.generation
        seen, last_id = gen.value, self.gate.broker_id
        while True:
            seen = await gen.wait_changed(seen)
            if self.gate.broker_id != last_id:
                last_id = self.gate.broker_id
                log.info("%s: now %s, brokerId %d (term %d); re-registering", self.broker_addr, self.role,
                         last_id, self.gate.term)
            self.kick()

    async def _watch_topics(self) -> None:
        version = self.metadata.applier.topics_version
        seen = version.value
        while True:
            seen = await version.wait_changed(seen)
            self.kick()

    async def unregister(self, timeout: float = UNREGISTER_TIMEOUT) -> None:
        """Unregister from every name server (own short-lived client, so it
        also works while everything else is being cancelled)."""
        if not self.cfg.namesrv_addr:
            return
        broker_id = self.last_registered_id if self.last_registered_id is not None else self.gate.broker_id
        with trio.CancelScope(shield=True), trio.move_on_after(timeout):
            async with open_remoting_client(rpc_hook=broker_credentials(self.cfg),
                                            tls=self.cfg.client_tls) as rc:
                results = await NamesrvClient(rc, self.cfg.namesrv_addr, timeout=timeout).unregister_broker(
                    self.cfg.broker_cluster_name, self.broker_addr, self.cfg.broker_name, broker_id)
            for addr, result in results.items():
                if isinstance(result, RemotingError):
                    log.warning("unregister %s from %s failed: %s", self.broker_addr, addr, result)
                else:
                    log.info("unregistered %s from %s", self.broker_addr, addr)


def broker_credentials(cfg: BrokerConfig) -> Credentials | None:
    """What the broker signs its name server calls with (brokerAccessKey)."""
    if cfg.broker_access_key is None:
        return None
    return Credentials(cfg.broker_access_key, cfg.broker_secret_key)


def _bind_host(cfg: BrokerConfig) -> str:
    return "::" if ipaddress.ip_address(cfg.broker_ip1).version == 6 else "0.0.0.0"


async def serve_broker(cfg: BrokerConfig, *, bind_host: str | None = None, seed: int | None = None,
                       task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run the broker until cancelled.  started() gets the Broker once the
    remoting port is bound, the store runs and every processor is
    registered (registration with the name servers runs on in the
    background)."""
    ready = False

    async def default(conn, cmd: RemotingCommand):
        if not ready:
            return cmd.make_response(ResponseCode.SYSTEM_BUSY, "broker is starting, try again later")
        return await not_supported(conn, cmd)

    dispatcher = RequestDispatcher(default)
    # Admission, in front of every processor (both the one-by-one and the
    # burst path): the ACL when aclEnable (a missing or bad plain_acl.yml
    # fails the start: a broker told to enforce ACL must not start open),
    # then the in-flight cap (SYSTEM_BUSY past serverMaxInFlightRequests).
    acl = AclService.load(cfg.acl_path, broker_policy(cfg.broker_name)) if cfg.acl_enable else None
    # Every request served one by one is timed (rocketmq_rpc_latency); pulls by their own wrapper.
    requests = MeteredRequests(dispatcher, skip=frozenset(int(c) for c in PullProcessor.CODES))
    guard = GuardedDispatcher(requests, checks=[acl.check] if acl is not None else [],
                              limiter=InFlightLimiter(cfg.limits.max_in_flight),
                              item_checks=acl.check_item if acl is not None else None)
    # One registry of connected clients: heartbeats fill it, pulls read
    # their subscriptions from it, and a closed connection's clients leave
    # their groups at once (the rest of the group is notified).
    clients = ClientManager()
    # What a closed connection leaves: its admitted requests, its clients,
    # and (once the processors are built) its parked long polls.
    forget = [guard.forget, clients.on_connection_closed]

    def closed(conn) -> None:
        for hook in forget:
            hook(conn)

    async with trio.open_nursery() as nursery:
        if acl is not None:
            await nursery.start(acl.run)  # reloads plain_acl.yml when it changes
        # raw_sends: plain SEND_MESSAGE_V2 runs take the C fast path; with
        # ACL the guard checks each send of a run (its header decoded for
        # the signature and topic) and passes the admitted ones on as runs.
        server = await nursery.start(functools.partial(
            serve_remoting, guard, bind_host or _bind_host(cfg), cfg.listen_port, on_close=closed,
            bursts=guard, raw_sends=True, tls=cfg.tls, limits=cfg.limits,
            max_frame_size=cfg.limits.max_frame_size, max_in_flight=cfg.limits.max_in_flight_per_connection))
        if cfg.listen_port == 0:
            cfg = attrs.evolve(cfg, listen_port=server.port)
        config = LiveConfig(cfg)
        bs = await nursery.start(lambda task_status: serve_broker_store(cfg, seed=seed, task_status=task_status))
        remoting = RemotingClient(nursery, rpc_hook=broker_credentials(cfg), tls=cfg.client_tls)
        stats = StatsBook()
        if acl is not None:  # requests naming a commitlog offset are judged by the message stored there
            acl.lookup = message_lookup(bs.cq)
        processors = wire_processors(config, bs, clients, stats, acl)
        # Handed-on writes keep the producer's own signature: a client without the broker's rpc hook.
        processors.forwarder.client = RemotingClient(nursery, tls=cfg.client_tls)
        broker = Broker(config=config, store=bs, dispatcher=dispatcher, server=server, remoting=remoting,
                        clients=clients, processors=processors,
                        namesrv=NamesrvClient(remoting, cfg.namesrv_addr) if cfg.namesrv_addr else None, guard=guard,
                        acl=acl)
        processors.send.topics_announced = broker.topics_announced
        processors.register(dispatcher)
        forget.append(processors.pull.forget)
        processors.pull.holds.pacer = server.pacer  # held pulls' answers share the requests' rounds
        # Sends and pulls are timed and counted: their wrappers take the
        # processors' codes over (each hands every request on unchanged).
        sends, pulls = MeteredSends(processors.send), MeteredPulls(processors.pull)
        sends.register(dispatcher)
        pulls.register(dispatcher)
        broker.metrics = BrokerMetrics(config=config, store=bs, server=server, sends=sends, pulls=pulls, stats=stats,
                                       clients=clients, queues=bs.cq.engine.cqs, requests=requests)
        broker.metrics_server = await nursery.start(serve_broker_metrics, broker.metrics, cfg.metrics, cfg.broker_ip1)
        for service in (clients, *processors.services()):
            await nursery.start(service.run)
        # brokerPermission changes the topic permissions the name servers must see.
        config.on_change(lambda _new: broker.kick())
        ready = True
        if broker.namesrv is not None:
            nursery.start_soon(broker.serve_registration, cfg.register_name_server_period_ms / 1000)
        else:
            log.warning("namesrvAddr is not set: the broker registers with no name server")
        log.info("broker %s (%s, %s) serving on %s", cfg.broker_name, cfg.self_id, cfg.broker_addr,
                 server.sockname)
        task_status.started(broker)
        try:
            await trio.sleep(math.inf)
        finally:  # unregister first, while the store shuts down
            if broker.namesrv is not None:
                await broker.unregister()


# --- mqbroker ------------------------------------------------------------------------


def _leaves(exc: BaseException):
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def check_and_print(config_file: str, cfg: BrokerConfig, warnings: list[str], strict: bool = False) -> None:
    """`mqbroker --check-config`: the warnings, then every effective key as
    broker.conf text; a store folder that cannot be created or written is
    an error (exit 1), since the broker would fail on it at once.  strict:
    an unknown key (a misspelt brokerClusterName would start the node in
    another cluster) is an error too, reported alone on the first line."""
    import os

    import click

    from broker.processors.admin_clients import broker_config_properties, properties_text

    unknown = [w for w in warnings if w.startswith("unknown key ")]
    if strict and unknown:
        raise click.ClickException(f"{config_file}: --strict: "
                                   + "; ".join(w.replace("' ignored", "'", 1) for w in unknown))
    for warning in warnings:
        if not warning.startswith("listenPort=0:"):  # a note for embedders, not for operators
            click.echo(f"mqbroker: warning: {config_file}: {warning}", err=True)
    root = cfg.store_path_root_dir
    probe = root
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe.rstrip("/")) or "/"
    if not os.path.isdir(probe):
        raise click.ClickException(f"{config_file}: storePathRootDir={root}: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise click.ClickException(f"{config_file}: storePathRootDir={root}: {probe} is not writable")
    if cfg.acl_enable:  # the broker would refuse to start on a bad plain_acl.yml
        from broker.acl.plain import AclConfigError
        try:
            AclService.load(cfg.acl_path, BROKER_POLICY)
        except AclConfigError as e:
            raise click.ClickException(f"{config_file}: aclEnable=true: {e}") from None
    click.echo(f"# {config_file}: OK ({len(warnings)} warning(s)); the effective settings:")
    click.echo(properties_text(broker_config_properties(cfg)), nl=False)


def main(argv=None) -> None:
    import click

    from broker.acl.plain import AclConfigError
    from broker.telemetry.commands import CauseFirstCommand
    from broker.telemetry.logs import cli_logging, log_options, version_text
    from commitlog.config import ConfigError
    from commitlog.errors import CommitLogError
    from commitlog.profiling import profiled
    from commitlog.stallwatch import instruments_from_env

    @click.command(name="mqbroker", cls=CauseFirstCommand, context_settings={"help_option_names": ["-h", "--help"]})
    @click.option("-c", "--config-file", required=True, type=click.Path(dir_okay=False),
                  help="broker.conf (Java properties: brokerName, listenPort, namesrvAddr, dLeger*, ...)")
    @click.option("-n", "--namesrv-addr", default=None, help="name servers, a:9876;b:9876 (overrides namesrvAddr)")
    @click.option("--check-config", is_flag=True,
                  help="validate the config, print the effective settings and exit (0 when usable)")
    @click.option("--strict", is_flag=True,
                  help="with --check-config: an unknown key is an error (exit 1), not a warning")
    @log_options()
    @click.version_option(version_text(), "--version", prog_name="mqbroker", message="%(prog)s (ledgermq) %(version)s")
    def command(config_file: str, namesrv_addr: str | None, check_config: bool, strict: bool, log_level: str,
                log_file: str | None, log_format: str) -> None:
        """Run a ledgermq broker."""
        try:
            cfg, warnings = load_broker_config(config_file)
            if namesrv_addr is not None:
                from broker.config import parse_namesrv_addr
                cfg = attrs.evolve(cfg, namesrv_addr=parse_namesrv_addr("namesrvAddr", namesrv_addr))
        except (ConfigError, OSError) as e:
            raise click.ClickException(f"{config_file}: {getattr(e, 'strerror', None) or e}") from None
        if check_config:
            check_and_print(config_file, cfg, warnings, strict=strict)
            return
        used = cli_logging(log_level, log_file, log_format, log_dir=cfg.log_dir, file_name="broker.log")
        if used:
            log.info("logging to %s", used)
        for warning in warnings:
            # serve_broker puts a bound listenPort=0 back into the config itself
            level = logging.DEBUG if warning.startswith("listenPort=0:") else logging.WARNING
            log.log(level, "%s: %s", config_file, warning)

        serving = False  # an OSError before this is a start-up failure (ports), after it a runtime one

        async def run() -> None:
            nonlocal serving
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async with trio.open_nursery() as nursery:
                    broker = await nursery.start(lambda task_status: serve_broker(cfg, task_status=task_status))
                    click.echo(json.dumps({"brokerAddr": broker.broker_addr, "role": broker.role,
                                           "brokerName": cfg.broker_name, "brokerId": broker.broker_id,
                                           "selfId": cfg.self_id, "listenPort": broker.cfg.listen_port,
                                           "metrics": broker.metrics_server.url if broker.metrics_server else None}))
                    sys.stdout.flush()
                    serving = True
                    async for signum in signals:
                        log.info("%s: signal %d, shutting down", cfg.self_id, signum)
                        nursery.cancel_scope.cancel()
                        break

        try:
            with profiled(cfg.self_id):  # LEDGERMQ_PROFILE=<dir>: cProfile the whole run
                trio.run(run, instruments=instruments_from_env())
        except BaseException as e:
            leaves = list(_leaves(e))
            if all(isinstance(x, KeyboardInterrupt) for x in leaves):
                pass
            elif (err := next((x for x in leaves if isinstance(x, (CommitLogError, ConfigError, AclConfigError))),
                               None)):
                raise click.ClickException(str(err)) from None
            elif (oserr := next((x for x in leaves if isinstance(x, OSError)), None)) is not None and serving:
                log.error("%s stopped by an I/O error", cfg.self_id, exc_info=oserr)
                raise click.ClickException(f"stopped by an I/O error: {oserr}") from None
            elif oserr is not None:
                metrics = f", metrics port {cfg.metrics.prom_port}" if cfg.metrics.enabled else ""
                where = f" {oserr.filename}" if getattr(oserr, "filename", None) else ""
                raise click.ClickException(
                    f"cannot start (listenPort {cfg.listen_port}, dLeger peer port "
                    f"{cfg.replication.self_peer.port}{metrics}, store {cfg.store_path_root_dir}):"
                    f"{where} {oserr.strerror or oserr}") from None
            else:
                raise
        log.info("broker %s stopped", cfg.self_id)

    command.main(args=argv, prog_name="mqbroker")


if __name__ == "__main__":
    main()
