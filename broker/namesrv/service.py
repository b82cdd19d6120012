# Owns the running name server: its configuration (namesrv.conf keys), the
# request processors over the route tables, and the expiry timer.
#
#   async with trio.open_nursery() as n:
#       ns = await n.start(serve_namesrv, NamesrvConfig(listen_port=0))
#       ns.address  # "127.0.0.1:<port>"
#
# Expiry is a timer, not a poll: the task sleeps until the earliest broker
# deadline (last registration + heartbeat timeout) and is woken early by
# every registration, which may move that deadline.  A broker whose
# registration connection closes is removed at once (upstream's
# onChannelDestroy), so a crashed leader leaves the routes immediately.
#
# Besides routes it answers GET_TOPICS_BY_CLUSTER (224, `mqadmin topicList
# -c`) and GET_SYSTEM_TOPIC_LIST_FROM_NS (304, the dashboard), and with
# metricsExporterType=PROM serves Prometheus metrics (broker/namesrv/metrics.py).
# namesrv.conf: unknown keys are warnings with "did you mean"; logDir writes
# namesrv.log there.
#
# Security (README "Security"): with aclEnable=true every write to the route
# tables (REGISTER_BROKER, UNREGISTER_BROKER, DELETE_TOPIC_IN_NAMESRV, ...)
# must be signed by the cluster's broker credentials (brokerAccessKey /
# brokerSecretKey, the same pair the brokers sign with) or by an admin
# account of plain_acl.yml (aclFile, or $ROCKETMQ_HOME/conf/plain_acl.yml
# when present); reads stay open.  TLS (tls.server.*) and the limits against
# hostile clients (streams.py keys) apply as on the broker.
import collections
import functools
import logging
import math
import os
from collections.abc import Callable, Mapping

import attrs
import trio

from broker.acl.plain import Account
from broker.acl.service import AclService, default_acl_path
from broker.acl.validator import NAMESRV_POLICY
from broker.common.conf_keys import unknown_key_warning
from broker.namesrv.metrics import namesrv_registry
from broker.namesrv.protocol import parse_registration
from broker.namesrv.routes import DEFAULT_BROKER_TIMEOUT, RouteInfoManager
from broker.remoting.codec import DEFAULT_MAX_FRAME_SIZE
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Connection
from broker.remoting.guard import GuardedDispatcher, InFlightLimiter
from broker.remoting.header import HeaderReader, encode_json
from broker.remoting.server import RemotingServer, RequestDispatcher, serve_remoting
from broker.remoting.streams import LIMIT_KEYS, ServerLimits, limits_from_props
from broker.remoting.tls import KNOWN_KEYS as TLS_KEYS
from broker.remoting.tls import ServerTls
from broker.telemetry.exporter import METRICS_KEYS, MetricsConfig, MetricsConfigError, serve_metrics
from commitlog.config import ConfigError, load_properties

log = logging.getLogger(__name__)

DEFAULT_PORT = 9876


@attrs.frozen
class NamesrvConfig:
    listen_port: int = DEFAULT_PORT
    bind_address: str | None = "0.0.0.0"
    broker_timeout: float = DEFAULT_BROKER_TIMEOUT  # seconds, unless a broker sends its own
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    delete_topic_with_broker_registration: bool = False
    enable_all_topic_list: bool = True
    metrics: MetricsConfig = attrs.Factory(MetricsConfig)
    log_dir: str | None = None
    acl_enable: bool = False
    rocketmq_home: str | None = None
    acl_file: str | None = None
    broker_access_key: str | None = attrs.field(default=None, repr=False)
    broker_secret_key: str | None = attrs.field(default=None, repr=False)
    tls: ServerTls = ServerTls()
    limits: ServerLimits = ServerLimits()

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> "tuple[NamesrvConfig, list[str]]":
        """From namesrv.conf keys; unknown keys come back as warnings."""
        values: dict[str, object] = {}
        warnings: list[str] = []
        metrics: dict[str, str] = {}
        remoting: dict[str, object] = {}
        for key, raw in props.items():
            if key in _KEYS:
                field, parse = _KEYS[key]
                values[field] = parse(key, raw.strip())
            elif key in LIMIT_KEYS or key in TLS_KEYS:
                remoting[key] = raw
            elif key in METRICS_KEYS:
                metrics[key] = raw
            elif key not in _UPSTREAM_IGNORED:
                warnings.append(unknown_key_warning(key, set(_KEYS) | set(METRICS_KEYS) | set(LIMIT_KEYS) | TLS_KEYS
                                                    | _UPSTREAM_IGNORED))
        try:
            values["metrics"], more = MetricsConfig.from_props(metrics)
        except MetricsConfigError as e:
            raise ConfigError(e.key, e.value, e.reason) from None
        values["limits"] = limits_from_props(remoting)
        values["tls"] = ServerTls.from_props(remoting)
        cfg = cls(**values)
        if (cfg.broker_access_key is None) != (cfg.broker_secret_key is None):
            raise ConfigError("brokerAccessKey/brokerSecretKey", None, "set both or neither")
        if cfg.acl_enable and cfg.broker_access_key is None and cfg.acl_path is None:
            raise ConfigError("aclEnable", "true", "the name server needs brokerAccessKey/brokerSecretKey "
                                                   "or a plain_acl.yml with an admin account (aclFile)")
        return cfg, warnings + more

    @property
    def acl_path(self) -> str | None:
        """aclFile, else $ROCKETMQ_HOME/conf/plain_acl.yml if it exists (the
        name server needs no file when brokerAccessKey is set)."""
        if self.acl_file:
            return self.acl_file
        path = default_acl_path(self.rocketmq_home)
        return path if path is not None and os.path.exists(path) else None

    def acl_service(self) -> AclService | None:
        """The route-write check, or None when ACL is off (AclConfigError
        for a bad file)."""
        if not self.acl_enable:
            return None
        extra = ()
        if self.broker_access_key is not None:
            extra = (Account(access_key=self.broker_access_key, secret_key=self.broker_secret_key, admin=True),)
        return AclService.load(self.acl_path, NAMESRV_POLICY, extra=extra)


def _int(lo: int, hi: int) -> Callable[[str, str], int]:
    def parse(key: str, text: str) -> int:
        if not text.lstrip("+-").isdigit() or not lo <= int(text) <= hi:
            raise ConfigError(key, text, f"expected an integer in {lo}..{hi}")
        return int(text)
    return parse


def _bool(key: str, text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise ConfigError(key, text, "expected true or false")
    return text.lower() == "true"


def _millis(key: str, text: str) -> float:
    return _int(1, 2**62)(key, text) / 1000


_KEYS = {
    "listenPort": ("listen_port", _int(0, 65535)),
    "bindAddress": ("bind_address", lambda key, text: text or None),
    "brokerChannelExpiredTimeMillis": ("broker_timeout", _millis),
    "frameMaxLength": ("max_frame_size", _int(1024, 2**31 - 1)),
    "deleteTopicWithBrokerRegistration": ("delete_topic_with_broker_registration", _bool),
    "enableAllTopicList": ("enable_all_topic_list", _bool),
    "logDir": ("log_dir", lambda key, text: text or None),
    "aclEnable": ("acl_enable", _bool),
    "rocketmqHome": ("rocketmq_home", lambda key, text: text or None),
    "aclFile": ("acl_file", lambda key, text: text or None),
    "brokerAccessKey": ("broker_access_key", lambda key, text: text or None),
    "brokerSecretKey": ("broker_secret_key", lambda key, text: text or None),
}
# NamesrvConfig / NettyServerConfig keys of a stock namesrv.conf that do not
# apply here: accepted silently so a stock file loads without noise.
_UPSTREAM_IGNORED = frozenset({
    "kvConfigPath", "configStorePath", "productEnvName", "clusterTest",
    "orderMessageEnable", "returnOrderTopicConfigToBroker", "clientRequestThreadPoolNums",
    "defaultThreadPoolNums", "clientRequestThreadPoolQueueCapacity", "defaultThreadPoolQueueCapacity",
    "scanNotActiveBrokerInterval", "unRegisterBrokerQueueCapa", "supportActingMaster",
    "enableTopicList", "notifyMinBrokerIdChanged", "enableControllerInNamesrv", "needWaitForService",
    "waitSecondsForService", "serverWorkerThreads", "serverCallbackExecutorThreads",
    "serverSelectorThreads", "serverOnewaySemaphoreValue", "serverAsyncSemaphoreValue",
    "serverSocketSndBufSize", "serverSocketRcvBufSize",
    "serverSocketBacklog", "serverPooledByteBufAllocatorEnable", "useEpollNativeSelector",
})


def load_namesrv_config(path: str | None, listen_port: int | None = None) -> tuple[NamesrvConfig, list[str]]:
    """namesrv.conf (if any) with an optional port override (-p)."""
    cfg, warnings = NamesrvConfig.from_properties(load_properties(path) if path else {})
    if listen_port is not None:
        cfg = attrs.evolve(cfg, listen_port=listen_port)
    return cfg, warnings


class NameServer:
    """The running name server (what serve_namesrv() starts)."""

    def __init__(self, cfg: NamesrvConfig) -> None:
        self.cfg = cfg
        self.acl = cfg.acl_service()
        self.routes = RouteInfoManager(cfg.broker_timeout, cfg.delete_topic_with_broker_registration)
        self.server: RemotingServer | None = None
        self._changed = trio.Event()
        self._rescan = trio.Event()
        # Observability: requests served, by (request code, client language
        # name), e.g. (105, "CPP") for a C++ client's GET_ROUTEINFO_BY_TOPIC.
        self.request_counts: collections.Counter[tuple[int, str]] = collections.Counter()
        d = self.dispatcher = RequestDispatcher()
        d.register(RequestCode.REGISTER_BROKER, self._register_broker)
        d.register(RequestCode.UNREGISTER_BROKER, self._unregister_broker)
        d.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, self._get_route)
        d.register(RequestCode.GET_BROKER_CLUSTER_INFO, self._get_cluster_info)
        d.register(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, self._get_topic_list)
        d.register(RequestCode.DELETE_TOPIC_IN_NAMESRV, self._delete_topic)
        d.register(RequestCode.WIPE_WRITE_PERM_OF_BROKER, self._wipe_write_perm)
        d.register(RequestCode.ADD_WRITE_PERM_OF_BROKER, self._add_write_perm)
        d.register(RequestCode.GET_TOPICS_BY_CLUSTER, self._get_topics_by_cluster)
        d.register(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS, self._get_system_topics)
        self.metrics_server = None  # MetricsServer with metricsExporterType=PROM
        # Admission in front of dispatch: the route-write ACL, the in-flight cap.
        self.guard = GuardedDispatcher(d, checks=[self.acl.check] if self.acl is not None else [],
                                       limiter=InFlightLimiter(cfg.limits.max_in_flight))

    @property
    def address(self) -> str:
        assert self.server is not None
        return self.server.address

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    async def wait_until(self, predicate: Callable[[RouteInfoManager], bool]) -> None:
        """Wait until predicate(routes) holds; re-checked after every
        change of the tables (registration, removal, expiry)."""
        while not predicate(self.routes):
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
        self._rescan.set()

    async def handle(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        """The server's request handler: counts, then dispatches."""
        self.request_counts[cmd.code, cmd.language.name] += 1
        return await self.guard(conn, cmd)

    # --- background ------------------------------------------------------------

    async def expire_brokers(self) -> None:
        while True:
            self._rescan = trio.Event()
            deadline = self.routes.next_deadline()
            with trio.move_on_at(math.inf if deadline is None else deadline):
                await self._rescan.wait()
            if self.routes.expire(trio.current_time()):
                self._notify()

    def connection_closed(self, conn: Connection) -> None:
        self.guard.forget(conn)
        if self.routes.connection_closed(conn):
            self._notify()

    # --- processors ----------------------------------------------------------------

    async def _register_broker(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        reg = parse_registration(cmd)
        result = self.routes.register_broker(reg, trio.current_time(), conn)
        self._notify()
        return cmd.make_response(ResponseCode.SUCCESS, result.reason, ext_fields={
            "masterAddr": result.master_addr, "haServerAddr": result.ha_server_addr})

    async def _unregister_broker(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(cmd.ext_fields)
        # Removal is by address; brokerId is read only for Java's validation.
        h.long("brokerId")
        if self.routes.unregister_broker(h.str("clusterName"), h.str("brokerAddr"), h.str("brokerName")):
            self._notify()
        return cmd.make_response()

    async def _get_route(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic = HeaderReader(cmd.ext_fields).str("topic")
        route = self.routes.topic_route(topic)
        if route is None:
            return cmd.make_response(ResponseCode.TOPIC_NOT_EXIST,
                                     f"No topic route info in name server for the topic: {topic}")
        # Standard JSON for every caller (client-compat #3), whatever its
        # version or acceptStandardJsonOnly says.
        return cmd.make_response(body=encode_json(route.to_json()))

    async def _get_cluster_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(body=encode_json(self.routes.cluster_info()))

    async def _get_topic_list(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        if not self.cfg.enable_all_topic_list:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, "disable")
        return cmd.make_response(body=encode_json({"topicList": self.routes.topic_list()}))

    async def _wipe_write_perm(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return self._set_write_perm(cmd, False, "wipeTopicCount")

    async def _add_write_perm(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return self._set_write_perm(cmd, True, "addTopicCount")

    def _set_write_perm(self, cmd: RemotingCommand, writable: bool, count_field: str) -> RemotingCommand:
        # RocketMQ 4.x's Wipe/AddWritePermOfBrokerRequest/ResponseHeader.
        name = HeaderReader(cmd.ext_fields).str("brokerName")
        count = self.routes.set_write_perm(name, writable)
        log.info("write permission of broker %s %s (%d topics)", name, "restored" if writable else "wiped", count)
        self._notify()
        return cmd.make_response(ext_fields={count_field: count})

    async def _get_topics_by_cluster(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        cluster = HeaderReader(cmd.ext_fields).str("cluster")
        names = self.routes.cluster_addr_table.get(cluster, set())
        topics = sorted(t for t, queues in self.routes.topic_queue_table.items() if names & set(queues))
        return cmd.make_response(body=encode_json({"topicList": topics}))

    async def _get_system_topics(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        # RocketMQ lists every cluster name and broker name (the topics a
        # broker of old versions created for itself), with one broker
        # address to ask; ledgermq brokers create no such topics.
        routes = self.routes
        topics = sorted(set(routes.cluster_addr_table) | set(routes.broker_addr_table))
        body: dict = {"topicList": topics}
        for bd in routes.broker_addr_table.values():
            addr = bd.master_addr or next(iter(bd.broker_addrs.values()), None)
            if addr:
                body["brokerAddr"] = addr
                break
        return cmd.make_response(body=encode_json(body))

    async def _delete_topic(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(cmd.ext_fields)
        if self.routes.delete_topic(h.str("topic"), h.str("clusterName", None) or None):
            self._notify()
        return cmd.make_response()


async def serve_namesrv(cfg: NamesrvConfig, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    ns = NameServer(cfg)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ns.expire_brokers)
        if ns.acl is not None:
            await nursery.start(ns.acl.run)  # reloads plain_acl.yml when it changes
        ns.server = await nursery.start(functools.partial(
            serve_remoting, ns.handle, cfg.bind_address, cfg.listen_port,
            max_frame_size=cfg.max_frame_size, on_close=ns.connection_closed, tls=cfg.tls, limits=cfg.limits,
            max_in_flight=cfg.limits.max_in_flight_per_connection))
        log.info("name server listening on %s", ns.address)
        if cfg.metrics.enabled:
            ns.metrics_server = await nursery.start(serve_metrics, namesrv_registry(ns),
                                                    cfg.metrics.prom_host or cfg.bind_address, cfg.metrics.prom_port)
        task_status.started(ns)
