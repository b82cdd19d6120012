# Owns the name server's route tables (RocketMQ's RouteInfoManager) and the route values with their
# JSON forms: QueueData, BrokerData, TopicRouteData (TopicConfig and DataVersion are
# broker.common.values, shared with the brokers).  Sans-IO: the caller passes the time.
#
#   clusterAddrTable  cluster -> broker names
#   brokerAddrTable   broker name -> BrokerData (cluster, {brokerId: addr})
#   topicQueueTable   topic -> broker name -> QueueData
#   brokerLiveTable   (cluster, addr) -> BrokerLiveInfo (last registration, timeout, dataVersion, the
#                     connection it came over)
#
# DLedger rules (RocketMQ 5.x): id 0 is the master (the Raft leader), followers register with their
# own ids.  One address holds one id: re-registering an address under another id drops its old entry.
# An id held by another live address is taken over only if the newcomer's dataVersion.stateVersion
# (ledgermq brokers put the Raft term there) is not older, so a deposed leader's stale registration
# cannot overwrite the new master's id 0.  Removal (unregister, expiry, connection close) is by
# address, never by id, so removing a deposed master never removes its successor.  Only the master's
# registration carries topic queue data.
#
# Draining (WIPE_WRITE_PERM_OF_BROKER / ADD_WRITE_PERM_OF_BROKER): unlike upstream, where a master's
# next registration quietly undoes a wipe, the wipe is sticky: the broker name stays in `write_wiped`
# and every registration's queue data is masked until addWritePerm, so a group being drained stays
# drained across failovers.  The mark lives in this name server's memory: send both requests to every
# name server (mqadmin does), and again after restarting one.
import logging
from collections.abc import Mapping

import attrs

from broker.common.permissions import PERM_READ, PERM_WRITE
from broker.common.values import DataVersion, TopicConfig

log = logging.getLogger(__name__)

MASTER_ID = 0
DEFAULT_BROKER_TIMEOUT = 120.0  # seconds; BROKER_CHANNEL_EXPIRED_TIME


class RouteDataError(ValueError):
    """JSON route data (a registration body, a route) of the wrong shape."""


def _get(obj: Mapping, key: str, kind: type | tuple, default: object, what: str):
    value = obj.get(key, default)
    if value is None:
        return default
    if kind is int and isinstance(value, str) and value.lstrip("-").isdigit():
        value = int(value)  # fastjson writes AtomicLong counters as numbers, but be lenient
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RouteDataError(f"{what}.{key} is {value!r}, not {getattr(kind, '__name__', kind)}")
    return value


def _obj(value: object, what: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise RouteDataError(f"{what} is not a JSON object")
    return value


@attrs.frozen(kw_only=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    def to_json(self) -> dict:
        return {"brokerName": self.broker_name, "perm": self.perm, "readQueueNums": self.read_queue_nums,
                "topicSysFlag": self.topic_sys_flag, "writeQueueNums": self.write_queue_nums}

    @classmethod
    def from_json(cls, obj: object) -> "QueueData":
        obj = _obj(obj, "queueData")
        # 4.x names the flag topicSynFlag (sic).
        flag = _get(obj, "topicSysFlag", int, None, "queueData")
        if flag is None:
            flag = _get(obj, "topicSynFlag", int, 0, "queueData")
        return cls(broker_name=_get(obj, "brokerName", str, "", "queueData"),
                   read_queue_nums=_get(obj, "readQueueNums", int, 0, "queueData"),
                   write_queue_nums=_get(obj, "writeQueueNums", int, 0, "queueData"),
                   perm=_get(obj, "perm", int, 0, "queueData"), topic_sys_flag=flag)


@attrs.define(kw_only=True)
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = attrs.field(factory=dict)
    enable_acting_master: bool = False

    def copy(self) -> "BrokerData":
        return BrokerData(cluster=self.cluster, broker_name=self.broker_name, broker_addrs=dict(self.broker_addrs),
                          enable_acting_master=self.enable_acting_master)

    @property
    def master_addr(self) -> str | None:
        return self.broker_addrs.get(MASTER_ID)

    def to_json(self) -> dict:
        # Standard JSON: the Long keys quoted (client-compat #3).
        return {"brokerAddrs": {str(k): v for k, v in sorted(self.broker_addrs.items())},
                "brokerName": self.broker_name, "cluster": self.cluster,
                "enableActingMaster": self.enable_acting_master}

    @classmethod
    def from_json(cls, obj: object) -> "BrokerData":
        obj = _obj(obj, "brokerData")
        addrs = _obj(obj.get("brokerAddrs") or {}, "brokerAddrs")
        try:
            parsed = {int(k): str(v) for k, v in addrs.items()}
        except ValueError:
            raise RouteDataError(f"brokerAddrs has a key that is not a broker id: {list(addrs)}") from None
        return cls(cluster=_get(obj, "cluster", str, "", "brokerData"),
                   broker_name=_get(obj, "brokerName", str, "", "brokerData"), broker_addrs=parsed,
                   enable_acting_master=_get(obj, "enableActingMaster", bool, False, "brokerData"))


@attrs.frozen
class TopicRouteData:
    queue_datas: tuple[QueueData, ...]
    broker_datas: tuple[BrokerData, ...]
    filter_server_table: dict[str, list[str]] = attrs.field(factory=dict)

    def to_json(self) -> dict:
        return {"brokerDatas": [b.to_json() for b in self.broker_datas],
                "filterServerTable": self.filter_server_table,
                "queueDatas": [q.to_json() for q in self.queue_datas]}

    @classmethod
    def from_json(cls, obj: object) -> "TopicRouteData":
        obj = _obj(obj, "topicRouteData")
        return cls(tuple(QueueData.from_json(q) for q in obj.get("queueDatas") or ()),
                   tuple(BrokerData.from_json(b) for b in obj.get("brokerDatas") or ()),
                   dict(obj.get("filterServerTable") or {}))


@attrs.frozen
class BrokerRegistration:
    """One REGISTER_BROKER request, decoded (see protocol.py for the wire)."""

    cluster_name: str
    broker_name: str
    broker_addr: str
    broker_id: int
    ha_server_addr: str = ""
    topic_configs: Mapping[str, TopicConfig] = attrs.field(factory=dict)
    data_version: DataVersion = DataVersion()
    filter_server_list: tuple[str, ...] = ()
    heartbeat_timeout: float | None = None  # seconds; None = the name server's default
    enable_acting_master: bool = False


@attrs.frozen(kw_only=True)
class RegisterResult:
    accepted: bool
    master_addr: str | None = None
    ha_server_addr: str | None = None
    reason: str | None = None  # why a registration was ignored


@attrs.define(eq=False, kw_only=True)
class BrokerLiveInfo:
    cluster_name: str
    broker_name: str
    broker_addr: str
    broker_id: int
    last_update: float
    timeout: float
    data_version: DataVersion
    ha_server_addr: str
    conn: object | None = None  # the connection it registered over

    @property
    def deadline(self) -> float:
        return self.last_update + self.timeout


class RouteInfoManager:
    def __init__(self, default_timeout: float = DEFAULT_BROKER_TIMEOUT,
                 delete_topic_with_broker_registration: bool = False) -> None:
        self.default_timeout = default_timeout
        # Upstream's deleteTopicWithBrokerRegistration: a master's topics
        # that its registration no longer lists are dropped.
        self.delete_topic_with_broker_registration = delete_topic_with_broker_registration
        self.cluster_addr_table: dict[str, set[str]] = {}
        self.broker_addr_table: dict[str, BrokerData] = {}
        self.topic_queue_table: dict[str, dict[str, QueueData]] = {}
        self.broker_live_table: dict[tuple[str, str], BrokerLiveInfo] = {}
        self.filter_server_table: dict[tuple[str, str], list[str]] = {}
        self.write_wiped: set[str] = set()  # broker names drained by wipeWritePerm
        self.version = 0  # bumped by every change; lets waiters re-check

    # --- registration -----------------------------------------------------------

    def register_broker(self, reg: BrokerRegistration, now: float, conn: object | None = None) -> RegisterResult:
        bd = self.broker_addr_table.get(reg.broker_name)
        if bd is not None:
            holder = bd.broker_addrs.get(reg.broker_id)
            if holder is not None and holder != reg.broker_addr:
                live = self.broker_live_table.get((bd.cluster, holder))
                if live is not None and live.data_version.state_version > reg.data_version.state_version:
                    reason = (f"brokerId {reg.broker_id} of {reg.broker_name} is held by {holder} with "
                              f"stateVersion {live.data_version.state_version} > "
                              f"{reg.data_version.state_version}; registration of {reg.broker_addr} ignored")
                    log.warning("%s", reason)
                    return RegisterResult(accepted=False, reason=reason)
        self.cluster_addr_table.setdefault(reg.cluster_name, set()).add(reg.broker_name)
        if bd is None:
            bd = self.broker_addr_table[reg.broker_name] = BrokerData(cluster=reg.cluster_name,
                                                                      broker_name=reg.broker_name)
        bd.enable_acting_master = reg.enable_acting_master
        for bid, addr in list(bd.broker_addrs.items()):
            if addr == reg.broker_addr and bid != reg.broker_id:
                del bd.broker_addrs[bid]
                log.info("%s of %s moved from id %d to id %d", addr, reg.broker_name, bid, reg.broker_id)
        old = bd.broker_addrs.get(reg.broker_id)
        bd.broker_addrs[reg.broker_id] = reg.broker_addr
        if old is not None and old != reg.broker_addr:
            log.info("id %d of %s moved from %s to %s", reg.broker_id, reg.broker_name, old, reg.broker_addr)
        if reg.broker_id == MASTER_ID:
            self._apply_topics(reg.broker_name, reg.topic_configs)
        key = (reg.cluster_name, reg.broker_addr)
        if key not in self.broker_live_table:
            log.info("new broker registered: %s %s id %d", reg.broker_name, reg.broker_addr, reg.broker_id)
        self.broker_live_table[key] = BrokerLiveInfo(
            cluster_name=reg.cluster_name, broker_name=reg.broker_name, broker_addr=reg.broker_addr,
            broker_id=reg.broker_id, last_update=now,
            timeout=self.default_timeout if reg.heartbeat_timeout is None else reg.heartbeat_timeout,
            data_version=reg.data_version, ha_server_addr=reg.ha_server_addr, conn=conn)
        if reg.filter_server_list:
            self.filter_server_table[key] = list(reg.filter_server_list)
        else:
            self.filter_server_table.pop(key, None)
        self.version += 1
        if reg.broker_id != MASTER_ID and (master := bd.master_addr) is not None:
            master_live = self.broker_live_table.get((bd.cluster, master))
            if master_live is not None:
                return RegisterResult(accepted=True, master_addr=master, ha_server_addr=master_live.ha_server_addr)
        return RegisterResult(accepted=True)

    def _apply_topics(self, broker_name: str, configs: Mapping[str, TopicConfig]) -> None:
        mask = ~PERM_WRITE if broker_name in self.write_wiped else -1
        for topic, tc in configs.items():
            qd = QueueData(broker_name=broker_name, read_queue_nums=tc.read_queue_nums,
                           write_queue_nums=tc.write_queue_nums, perm=tc.perm & mask, topic_sys_flag=tc.topic_sys_flag)
            per_broker = self.topic_queue_table.setdefault(topic, {})
            if per_broker.get(broker_name) != qd:
                if broker_name in per_broker:
                    log.info("topic %s changed on %s: %s", topic, broker_name, qd)
                per_broker[broker_name] = qd
        if self.delete_topic_with_broker_registration:
            for topic in [t for t, pb in self.topic_queue_table.items() if broker_name in pb and t not in configs]:
                self._drop_queue_data(topic, {broker_name})

    def set_write_perm(self, broker_name: str, writable: bool) -> int:
        """wipeWritePerm (False) / addWritePerm (True) of a broker group;
        the number of topics whose queue data changed hands (upstream's
        wipeTopicCount / addTopicCount: every topic the broker serves)."""
        if writable:
            self.write_wiped.discard(broker_name)
        else:
            self.write_wiped.add(broker_name)
        count = 0
        for per_broker in self.topic_queue_table.values():
            qd = per_broker.get(broker_name)
            if qd is None:
                continue
            perm = PERM_READ | PERM_WRITE if writable else qd.perm & ~PERM_WRITE
            per_broker[broker_name] = attrs.evolve(qd, perm=perm)
            count += 1
        self.version += 1
        return count

    # --- removal -------------------------------------------------------------------

    def unregister_broker(self, cluster_name: str, broker_addr: str, broker_name: str) -> bool:
        """Forget broker_addr (whatever id it holds).  True if anything changed."""
        live = self.broker_live_table.pop((cluster_name, broker_addr), None)
        self.filter_server_table.pop((cluster_name, broker_addr), None)
        changed = live is not None
        bd = self.broker_addr_table.get(broker_name)
        if bd is not None:
            for bid in [b for b, a in bd.broker_addrs.items() if a == broker_addr]:
                del bd.broker_addrs[bid]
                changed = True
            if not bd.broker_addrs:
                del self.broker_addr_table[broker_name]
                names = self.cluster_addr_table.get(bd.cluster)
                if names is not None:
                    names.discard(broker_name)
                    if not names:
                        del self.cluster_addr_table[bd.cluster]
                for topic in [t for t, pb in self.topic_queue_table.items() if broker_name in pb]:
                    self._drop_queue_data(topic, {broker_name})
                log.info("broker %s has no addresses left; its routes are removed", broker_name)
        if changed:
            self.version += 1
        return changed

    def _remove_live(self, infos: list[BrokerLiveInfo], why: str) -> list[BrokerLiveInfo]:
        for info in infos:
            log.warning("removing broker %s (%s id %d): %s", info.broker_addr, info.broker_name,
                        info.broker_id, why)
            self.unregister_broker(info.cluster_name, info.broker_addr, info.broker_name)
        return infos

    def next_deadline(self) -> float | None:
        """When the next broker expires if it does not register again."""
        return min((i.deadline for i in self.broker_live_table.values()), default=None)

    def expire(self, now: float) -> list[BrokerLiveInfo]:
        """Remove brokers that have not registered within their timeout."""
        return self._remove_live([i for i in self.broker_live_table.values() if now >= i.deadline],
                                 "no registration within its heartbeat timeout")

    def connection_closed(self, conn: object) -> list[BrokerLiveInfo]:
        """Remove brokers whose registration connection closed (upstream's
        onChannelDestroy: a crashed broker leaves the routes at once)."""
        return self._remove_live([i for i in self.broker_live_table.values() if i.conn is conn],
                                 "its connection closed")

    def _drop_queue_data(self, topic: str, broker_names: set[str]) -> None:
        per_broker = self.topic_queue_table.get(topic, {})
        for name in broker_names:
            per_broker.pop(name, None)
        if not per_broker:
            self.topic_queue_table.pop(topic, None)

    def delete_topic(self, topic: str, cluster_name: str | None = None) -> bool:
        """Drop a topic's routes (only its queues on `cluster_name`'s brokers
        if given).  True if anything was removed."""
        per_broker = self.topic_queue_table.get(topic)
        if per_broker is None:
            return False
        if cluster_name is None:
            del self.topic_queue_table[topic]
        else:
            names = self.cluster_addr_table.get(cluster_name, set()) & set(per_broker)
            if not names:
                return False
            self._drop_queue_data(topic, names)
        self.version += 1
        return True

    # --- queries -------------------------------------------------------------------

    def topic_route(self, topic: str) -> TopicRouteData | None:
        per_broker = self.topic_queue_table.get(topic)
        if not per_broker:
            return None
        brokers = tuple(self.broker_addr_table[n].copy() for n in sorted(per_broker)
                        if n in self.broker_addr_table)
        if not brokers:
            return None
        filters = {}
        for bd in brokers:
            for addr in bd.broker_addrs.values():
                if servers := self.filter_server_table.get((bd.cluster, addr)):
                    filters[addr] = list(servers)
        return TopicRouteData(tuple(per_broker[n] for n in sorted(per_broker)), brokers, filters)

    def cluster_info(self) -> dict:
        """ClusterInfo JSON."""
        return {"brokerAddrTable": {n: bd.to_json() for n, bd in sorted(self.broker_addr_table.items())},
                "clusterAddrTable": {c: sorted(names) for c, names in sorted(self.cluster_addr_table.items())}}

    def topic_list(self) -> list[str]:
        return sorted(self.topic_queue_table)
