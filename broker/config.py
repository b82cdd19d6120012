# Owns BrokerConfig: the broker's side of broker.conf (RocketMQ's
# BrokerConfig + the MessageStoreConfig keys the broker itself uses), with
# the replication keys (dLeger*, storePathRootDir, flushDiskType,
# fileReservedTime, deleteWhen, ...) parsed by commitlog.config into the
# embedded ReplicationConfig.  One file, one parse: the broker keys are taken
# here, the replication keys go to ReplicationConfig.from_dict, the metrics
# keys (metricsExporterType, metricsPromExporterHost/Port) to MetricsConfig;
# a RocketMQ key ledgermq does not implement is a warning naming it
# (broker/common/conf_keys.py), any other key an "unknown key" warning with
# "did you mean" over every key known.  Unknown keys are never fatal; a value
# that cannot be used is a ConfigError naming key and value.
# logDir (ledgermq's own key): write broker.log there, rotated by size.
#
# Defaults are RocketMQ 5.x's (BrokerConfig / MessageStoreConfig):
# listenPort 10911, defaultTopicQueueNums 8, maxMessageSize 4 MiB,
# registerNameServerPeriod 30000 ms, autoCreateTopicEnable true.
#
# brokerId in DLedger mode (spec §6.1): the configured brokerId is ignored;
# the leader registers as 0 (master) once it accepts writes, a follower as
# int(selfId[1:]) + 1 (1 if that would be 0).  broker_id_for() computes it;
# follower ids must be distinct and never 0 across the group, so a group
# whose selfIds do not yield distinct ids falls back to "position in
# dLegerPeers + 1" for every member (with a warning), which is stable
# across restarts as long as dLegerPeers is.
import ipaddress
import os
import re
import socket

import attrs

from broker.common import conf_keys
from broker.remoting.streams import LIMIT_KEYS, ServerLimits, limits_from_props
from broker.remoting.tls import KNOWN_KEYS as TLS_KEYS
from broker.remoting.tls import ClientTls, ServerTls
from broker.telemetry.exporter import METRICS_KEYS, MetricsConfig, MetricsConfigError
from commitlog.config import ALIASES as REPLICATION_ALIASES
from commitlog.config import KEYS as REPLICATION_KEYS
from commitlog.config import ConfigError, FlushDiskType, ReplicationConfig, iter_properties, read_properties_text
from commitlog.config import parse_bool as _bool
from commitlog.config import parse_int as _int
from commitlog.config import parse_nonempty as _nonempty
from commitlog.config import parse_text as _text
from commitlog.raft.state import Role
from consumequeue.record import DEFAULT_DELAY_LEVELS_MS, HostAddr

MASTER_ID = 0
DEFAULT_LISTEN_PORT = 10911
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024
_JAVA_INT = 2**31 - 1


def _local_ip() -> str:
    """RemotingUtil.getLocalAddress, roughly: the host name's IPv4 address,
    else loopback."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


# --- value parsers: the shared ones of commitlog/config.py (text or already-
# typed values, as from_dict may get), plus the broker's own below -------------

def _ip(key: str, value: object) -> str:
    text = _nonempty(key, value)
    try:
        return str(ipaddress.ip_address(text.strip("[]")))
    except ValueError:
        raise ConfigError(key, value, "expected an IP address (it is stored as the messages' "
                                      "STOREHOST and in offset message ids)") from None


def parse_namesrv_addr(key: str, value: object) -> tuple[str, ...]:
    """namesrvAddr: host:port;host:port (the mqbroker -n option too)."""
    addrs = tuple(a.strip() for a in _text(key, value).split(";") if a.strip())
    for a in addrs:
        host, _, port = a.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(key, value, f"{a!r} is not host:port")
    return addrs


_DELAY_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(key: str, value: object) -> tuple[int, ...]:
    """messageDelayLevel ("1s 5s 10s 30s 1m ... 2h", units s/m/h/d as
    ScheduleMessageService.parseDelayLevel takes them) -> ms per level."""
    out = []
    for word in _text(key, value).split():
        m = re.fullmatch(r"(\d+)([smhd])", word)
        if m is None or int(m.group(1)) <= 0:
            raise ConfigError(key, value, f"{word!r} is not a positive <n>s/m/h/d delay")
        out.append(int(m.group(1)) * _DELAY_UNITS_MS[m.group(2)])
    if not out:
        raise ConfigError(key, value, "no delay levels")
    return tuple(out)


# broker.conf key -> (BrokerConfig field, parser)
KEYS = {
    "brokerClusterName": ("broker_cluster_name", _nonempty),
    "brokerName": ("broker_name", _nonempty),
    "brokerId": ("broker_id", _int(0, 2**63 - 1)),
    "listenPort": ("listen_port", _int(0, 65535)),
    "namesrvAddr": ("namesrv_addr", parse_namesrv_addr),
    "brokerIP1": ("broker_ip1", _ip),
    "autoCreateTopicEnable": ("auto_create_topic_enable", _bool),
    "autoCreateSubscriptionGroup": ("auto_create_subscription_group", _bool),
    "defaultTopicQueueNums": ("default_topic_queue_nums", _int(1, 1024)),
    "maxMessageSize": ("max_message_size", _int(1, _JAVA_INT)),
    "registerNameServerPeriod": ("register_name_server_period_ms", _int(10000, 60000)),
    "brokerPermission": ("broker_permission", _int(0, 15)),
    "messageDelayLevel": ("message_delay_levels_ms", parse_delay_levels),
    "enablePropertyFilter": ("enable_property_filter", _bool),
    "transactionTimeOut": ("transaction_timeout_ms", _int(1, _JAVA_INT)),
    "transactionCheckMax": ("transaction_check_max", _int(1, _JAVA_INT)),
    "transactionCheckInterval": ("transaction_check_interval_ms", _int(1, _JAVA_INT)),
    # RocketMQ reads it from -Drocketmq.broker.rebalance.lockMaxLiveTime; a key here.
    "rebalanceLockMaxLiveTime": ("rebalance_lock_max_live_ms", _int(1, _JAVA_INT)),
    "logDir": ("log_dir", _nonempty),
    # ACL (README "Security"): RocketMQ's aclEnable; where plain_acl.yml is
    # (RocketMQ reads $ROCKETMQ_HOME/conf/plain_acl.yml; rocketmqHome is its
    # BrokerConfig key for that home, aclFile ours for a file elsewhere);
    # and the credentials this broker signs its name server calls with.
    "aclEnable": ("acl_enable", _bool),
    "rocketmqHome": ("rocketmq_home", _nonempty),
    "aclFile": ("acl_file", _nonempty),
    "brokerAccessKey": ("broker_access_key", _nonempty),
    "brokerSecretKey": ("broker_secret_key", _nonempty),
    # Long polling against hostile clients (README "Limits against hostile
    # clients"): the longest a PULL_MESSAGE is held whatever it asks, and
    # how many may be held per connection, per client address and in all.
    "longPollingSuspendMaxMillis": ("long_polling_suspend_max_ms", _int(0, 24 * 3600 * 1000)),
    "longPollingMaxHeldPerConnection": ("long_polling_max_held_per_connection", _int(0, 1 << 24)),
    "longPollingMaxHeldPerAddress": ("long_polling_max_held_per_address", _int(0, 1 << 24)),
    "longPollingMaxHeld": ("long_polling_max_held", _int(0, 1 << 24)),
    # POP consumption (README "POP consumption"): held POP_MESSAGE long
    # polls per connection and in all, unacked messages per queue and
    # group before pops skip the queue, the longest invisible time, and the
    # percentage of pops that look at the retry topic first.
    "popPollingMaxHeldPerConnection": ("pop_polling_max_held_per_connection", _int(0, 1 << 24)),
    "popPollingMaxHeld": ("pop_polling_max_held", _int(0, 1 << 24)),
    "popInflightMessageThreshold": ("pop_inflight_message_threshold", _int(1, 1 << 24)),
    "popInvisibleTimeMaxMillis": ("pop_invisible_time_max_ms", _int(1, 7 * 24 * 3600 * 1000)),
    "popFromRetryProbability": ("pop_from_retry_probability", _int(0, 100)),
    # Planned operations (README "Leadership transfer and rolling restarts"):
    # how long after it stopped being master a broker still hands the writes
    # it receives on to the new master, how long one write may wait for a
    # master, and how many may be held or handed on at once
    # (broker/processors/forward.py).
    "sendForwardWindowMillis": ("send_forward_window_ms", _int(0, 3600 * 1000)),
    "sendForwardHoldMillis": ("send_forward_hold_ms", _int(0, 60 * 1000)),
    "sendForwardMaxInFlight": ("send_forward_max_in_flight", _int(0, 1 << 20)),
    # Timer messages (README "Timer messages", broker/store/timer.py): the
    # furthest delivery time accepted, the rounding of delivery times (up,
    # never early), and how many pending timers the master keeps in memory.
    "timerMaxDelaySec": ("timer_max_delay_sec", _int(1, 10 * 365 * 86400)),
    "timerPrecisionMs": ("timer_precision_ms", _int(1, 60000)),
    "timerMaxInMemory": ("timer_max_in_memory", _int(1, 1 << 26)),
}
# Every key some part of ledgermq parses (for "did you mean").
PARSED_KEYS = (frozenset(KEYS) | frozenset(REPLICATION_KEYS) | frozenset(METRICS_KEYS) | frozenset(LIMIT_KEYS)
               | TLS_KEYS)


@attrs.frozen
class BrokerConfig:
    replication: ReplicationConfig
    broker_cluster_name: str = "DefaultCluster"
    broker_name: str = attrs.field(factory=socket.gethostname)
    broker_id: int = MASTER_ID  # ignored in DLedger mode (see broker_id_for)
    listen_port: int = DEFAULT_LISTEN_PORT
    namesrv_addr: tuple[str, ...] = ()
    broker_ip1: str = attrs.field(factory=_local_ip)
    auto_create_topic_enable: bool = True
    auto_create_subscription_group: bool = True
    default_topic_queue_nums: int = 8
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    register_name_server_period_ms: int = 30000
    broker_permission: int = 6  # PERM_READ | PERM_WRITE
    message_delay_levels_ms: tuple[int, ...] = DEFAULT_DELAY_LEVELS_MS  # level n is entry n-1
    enable_property_filter: bool = False  # SQL92 subscriptions (MessageSelector.bySql)
    transaction_timeout_ms: int = 6000  # a half message is checked back once this old
    transaction_check_max: int = 15  # check-backs before a half message is discarded
    transaction_check_interval_ms: int = 60000  # between check-backs of one half message
    rebalance_lock_max_live_ms: int = 60000  # an orderly consumer's queue lock lives this long unrenewed
    metrics: MetricsConfig = attrs.Factory(MetricsConfig)
    log_dir: str | None = None  # logDir: also log to <logDir>/broker.log
    acl_enable: bool = False
    rocketmq_home: str | None = None
    acl_file: str | None = None
    broker_access_key: str | None = attrs.field(default=None, repr=False)
    broker_secret_key: str | None = attrs.field(default=None, repr=False)
    long_polling_suspend_max_ms: int = 30000  # clients may ask for up to 24 h
    long_polling_max_held_per_connection: int = 1024
    long_polling_max_held_per_address: int = 2048
    long_polling_max_held: int = 10000
    pop_polling_max_held_per_connection: int = 64
    pop_polling_max_held: int = 4096
    pop_inflight_message_threshold: int = 10000  # RocketMQ's popInflightMessageThreshold
    pop_invisible_time_max_ms: int = 12 * 3600 * 1000  # the proxy's longest invisible duration
    pop_from_retry_probability: int = 20  # RocketMQ's popFromRetryProbability
    send_forward_window_ms: int = 60000  # twice a Java client's 30 s route poll; 0: refuse as a slave at once
    send_forward_hold_ms: int = 1000  # well inside a producer's default 3 s send timeout, so it can retry
    send_forward_max_in_flight: int = 4096
    timer_max_delay_sec: int = 3 * 86400  # RocketMQ's default: 3 days
    timer_precision_ms: int = 10
    timer_max_in_memory: int = 100_000  # about 420 bytes each
    # The remoting port: TLS as a server (clients, mqadmin), TLS as a client
    # (to the name servers), and the limits against hostile clients.
    tls: ServerTls = ServerTls()
    client_tls: ClientTls = ClientTls()
    limits: ServerLimits = ServerLimits()

    # --- derived -------------------------------------------------------------

    @property
    def self_id(self) -> str:
        return self.replication.self_id

    @property
    def store_path_root_dir(self) -> str:
        return self.replication.store_path_root_dir

    @property
    def flush_disk_type(self) -> FlushDiskType:
        return self.replication.flush_disk_type

    @property
    def file_reserved_time_hours(self) -> int:
        return self.replication.file_reserved_time_hours

    @property
    def delete_when(self) -> tuple[int, ...]:
        return self.replication.delete_when

    # STOREHOST of every record this broker writes (brokerIP1:listenPort);
    # derived once per config (the send path reads it for every message).
    store_host: HostAddr = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "store_host", HostAddr(self.broker_ip1, self.listen_port))

    @property
    def broker_addr(self) -> str:
        """What the broker registers at the name server."""
        return str(self.store_host)

    @property
    def acl_path(self) -> str | None:
        """The plain_acl.yml this broker enforces: aclFile, else
        <rocketmqHome or $ROCKETMQ_HOME>/conf/plain_acl.yml (RocketMQ 4.x)."""
        if self.acl_file:
            return self.acl_file
        home = self.rocketmq_home or os.environ.get("ROCKETMQ_HOME")
        return os.path.join(home, "conf", "plain_acl.yml") if home else None

    def broker_id_for(self, role: Role | None) -> int:
        return broker_id_for(role, self.self_id, self.replication.peer_ids)

    # --- parsing ---------------------------------------------------------------

    @classmethod
    def from_dict(cls, props, warnings: list[str] | None = None) -> "tuple[BrokerConfig, list[str]]":
        """Build from broker.conf keys.  Returns (config, warnings); raises
        ConfigError for a missing required key or an unusable value."""
        warnings = list(warnings or ())
        values: dict[str, object] = {}
        rest: dict[str, object] = {}
        metrics: dict[str, object] = {}
        remoting: dict[str, object] = {}  # TLS and the limits
        for key, value in props.items():
            if key in KEYS:
                field, parse = KEYS[key]
                values[field] = parse(key, value)
            elif key in LIMIT_KEYS or key in TLS_KEYS:
                remoting[key] = value
            elif key in METRICS_KEYS:
                metrics[key] = value
            elif key in REPLICATION_KEYS or key in REPLICATION_ALIASES or key == "enableDLegerCommitLog":
                rest[key] = value
            elif key in conf_keys.NOT_IMPLEMENTED:
                warnings.append(conf_keys.not_implemented_warning(key))
            elif key not in conf_keys.NO_EFFECT:
                warnings.append(conf_keys.unknown_key_warning(key, PARSED_KEYS | conf_keys.ALL))
        try:
            values["metrics"], more = MetricsConfig.from_props(metrics)
        except MetricsConfigError as e:
            raise ConfigError(e.key, e.value, e.reason) from None
        warnings += more
        values["limits"] = limits_from_props(remoting)
        values["tls"] = ServerTls.from_props(remoting)
        values["client_tls"] = ClientTls.from_props(remoting)
        if ("broker_access_key" in values) != ("broker_secret_key" in values):
            raise ConfigError("brokerAccessKey/brokerSecretKey", None, "set both or neither")
        replication, more = ReplicationConfig.from_dict(rest)
        warnings += more
        if "broker_id" in values and values["broker_id"] != MASTER_ID:
            warnings.append(f"brokerId={values['broker_id']} ignored: in DLedger mode the leader registers "
                            f"as 0 and followers as int(dLegerSelfId[1:]) + 1")
        ids = follower_broker_ids(replication.peer_ids)
        if ids != _java_follower_ids(replication.peer_ids):
            warnings.append("the dLegerSelfIds do not give distinct non-zero follower brokerIds "
                            "(int(selfId[1:]) + 1); using position in dLegerPeers + 1 instead: "
                            + ", ".join(f"{p}={i}" for p, i in ids.items()))
        cfg = cls(replication=replication, **values)
        if cfg.acl_enable and cfg.acl_path is None:
            raise ConfigError("aclEnable", "true", "plain_acl.yml not found: set ROCKETMQ_HOME (RocketMQ reads "
                                                   "$ROCKETMQ_HOME/conf/plain_acl.yml), rocketmqHome or aclFile")
        if cfg.listen_port == 0:
            warnings.append("listenPort=0: the bound port must be put back into the config "
                            "(attrs.evolve) before messages are stored, it is their STOREHOST")
        return cfg, warnings

    @classmethod
    def from_properties(cls, text: str) -> "tuple[BrokerConfig, list[str]]":
        warnings: list[str] = []
        props: dict[str, str] = {}
        first_line: dict[str, int] = {}
        for lineno, key, value in iter_properties(text):
            if key in props:
                warnings.append(f"line {lineno}: {key} set again (line {first_line[key]}); the last value wins")
            first_line.setdefault(key, lineno)
            props[key] = value
        return cls.from_dict(props, warnings)


@attrs.define(eq=False)
class LiveConfig:
    """The broker's effective config, one object shared by every processor
    and service (built by the composition root).  UPDATE_BROKER_CONFIG
    replaces `current` with the hot-reloadable keys changed (brokerPermission,
    ...), so every reader sees a change at once; listeners (the name server
    registration) are called after each change."""

    current: BrokerConfig
    _listeners: list = attrs.Factory(list)

    def update(self, cfg: BrokerConfig) -> None:
        self.current = cfg
        for listener in list(self._listeners):
            listener(cfg)

    def on_change(self, listener) -> None:
        """`listener(new_config)` after every update()."""
        self._listeners.append(listener)


def load_broker_config(path: str | os.PathLike) -> tuple[BrokerConfig, list[str]]:
    """`mqbroker -c broker.conf`: (config, warnings) or ConfigError/OSError."""
    return BrokerConfig.from_properties(read_properties_text(path))


# --- brokerId in DLedger mode (spec §6.1) --------------------------------------

def _java_follower_id(self_id: str) -> int | None:
    digits = self_id[1:]
    if not re.fullmatch(r"[+-]?[0-9]+", digits):  # Integer.parseInt
        return None
    n = int(digits) + 1
    return n if n != 0 else 1


def _java_follower_ids(peer_ids) -> dict[str, int | None]:
    return {p: _java_follower_id(p) for p in peer_ids}


def follower_broker_ids(peer_ids) -> dict[str, int]:
    """Every member's slave brokerId: RocketMQ's int(selfId[1:]) + 1 when
    that gives distinct positive ids for the whole group, else position + 1."""
    java = _java_follower_ids(peer_ids)
    vals = list(java.values())
    if all(v is not None and v > 0 for v in vals) and len(set(vals)) == len(vals):
        return dict(java)
    return {p: i + 1 for i, p in enumerate(peer_ids)}


def broker_id_for(role: Role | None, self_id: str, peer_ids=None) -> int:
    """0 for the leader (call it only once the leader accepts writes), the
    member's slave id otherwise."""
    if role is Role.LEADER:
        return MASTER_ID
    if peer_ids is None:
        n = _java_follower_id(self_id)
        if n is None or n < 0:
            raise ConfigError("dLegerSelfId", self_id, "cannot derive a brokerId (expected n<digits>)")
        return n
    return follower_broker_ids(tuple(peer_ids))[self_id]
