# Owns what the console knows of the cluster: one sampler task that asks the
# name server and every broker (the same admin requests as mqadmin, through
# MQAdmin) once per period, derives rates and term changes (history.py),
# and publishes one JSON-ready snapshot to a Hub.  Pages never ask brokers
# themselves for the live views: they wait on the Hub (one trio.Event per
# publication), so ten open tabs cost the cluster one sampler.
#
# A broker that does not answer is a row with its error, not a failure of
# the sample: the console is what an operator opens when something is wrong.
# A member the name server no longer lists (its registration expired) is
# still shown, with the broker address it last had (or, when this console
# never saw it registered, its DLedger address from the leader's dLegerPeers).
import json
import time

import attrs
import trio

from broker.remoting.codes import RequestCode
from tools.dashboard import prom
from tools.dashboard.history import RateTracker, TermLog, Window
from tools.dashboard.ops import connection_row
from tools.mqadmin.adminapi import AdminError, MQAdmin, gather

# Topics the console lists apart from the operators' own (RocketMQ's system topics).
SYSTEM_TOPIC_PREFIXES = ("rmq_sys_", "RMQ_", "%RETRY%", "%DLQ%", "SCHEDULE_TOPIC", "TBW102", "BenchmarkTest",
                         "OFFSET_MOVED_EVENT", "SELF_TEST_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC")
SYSTEM_GROUPS = {"TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "SELF_TEST_C_GROUP", "CID_ONS-HTTP-PROXY",
                 "CID_ONSAPI_PERMISSION", "CID_ONSAPI_OWNER", "CID_ONSAPI_PULL", "CID_RMQ_SYS_TRANS",
                 "CID_SYS_RMQ_TRANS"}


def is_system_topic(topic: str) -> bool:
    return topic.startswith(SYSTEM_TOPIC_PREFIXES)


def _int(info: dict, key: str) -> int | None:
    try:
        return int(info[key])
    except (KeyError, TypeError, ValueError):
        return None


@attrs.define
class Hub:
    """The latest snapshot and the event the waiting pages park on."""

    snapshot: dict = attrs.Factory(dict)
    version: int = 0
    _changed: trio.Event = attrs.Factory(trio.Event)

    def publish(self, snapshot: dict) -> None:
        self.version += 1
        self.snapshot = {**snapshot, "version": self.version}
        self._changed.set()
        self._changed = trio.Event()

    async def wait_newer(self, version: int) -> dict:
        while self.version <= version:
            await self._changed.wait()
        return self.snapshot


@attrs.define
class Sampler:
    admin: MQAdmin
    hub: Hub
    period_s: float = 1.0
    rates: RateTracker = attrs.Factory(RateTracker)
    window: Window = attrs.Factory(Window)
    terms: TermLog = attrs.Factory(TermLog)
    lag_window: Window = attrs.Factory(Window)
    endpoints: dict = attrs.Factory(dict)  # broker addr -> its /metrics (host, port), or None: exports none
    latency: dict = attrs.Factory(dict)  # broker addr -> the send latency buckets of its last scrape
    last_addr: dict = attrs.Factory(dict)  # (brokerName, selfId) -> the broker address it last registered
    raft_addrs: dict = attrs.Factory(dict)  # brokerName -> {selfId: DLedger address} (the leader's dLegerPeers)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        started = False
        while True:
            deadline = trio.current_time() + self.period_s
            self.hub.publish(await self.sample())
            if not started:
                task_status.started()
                started = True
            await trio.sleep_until(deadline)  # the sampling period, not a poll for a condition

    async def sample(self) -> dict:
        now_ms = int(time.time() * 1000)
        try:
            cluster = await self.sample_cluster(now_ms)
        except AdminError as e:
            return {"t": now_ms, "error": str(e), "groups": [], "history": self.window.to_list(),
                    "termChanges": list(self.terms.changes), "topics": [], "consumers": [],
                    "lagHistory": self.lag_window.to_list()}
        topics, consumers = await self.sample_topics(now_ms, cluster)
        return {"t": now_ms, "error": None, **cluster, "topics": topics, "consumers": consumers,
                "history": self.window.to_list(), "termChanges": list(self.terms.changes),
                "lagHistory": self.lag_window.to_list()}

    # --- cluster: roles, terms, replication ------------------------------------------

    async def sample_cluster(self, now_ms: int) -> dict:
        brokers = await self.admin.brokers()
        addrs = [b.addr for b in brokers]
        infos = await gather(addrs, self.admin.runtime_info)
        statuses = await gather(addrs, self.admin.dledger_status)
        metrics = await gather(addrs, self._metrics)
        t_s = now_ms / 1000
        groups: dict[str, dict] = {}
        for b in brokers:
            info, st = infos[b.addr], statuses[b.addr]
            ok = isinstance(info, dict)
            info = info if ok else {}
            st = st if isinstance(st, dict) else {}
            put, get = _int(info, "msgPutTotalTodayNow"), _int(info, "msgGetTotalTodayNow")
            node = {"addr": b.addr, "brokerId": b.broker_id, "registeredAs": b.role,
                    "selfId": info.get("dledgerSelfId") or st.get("selfId"),
                    "raftRole": (info.get("dledgerRole") or "").upper() if ok else "UNREACHABLE",
                    "term": _int(info, "dledgerTerm"), "leader": info.get("dledgerLeaderId") or None,
                    "committedIndex": _int(info, "dledgerCommittedIndex"),
                    "endIndex": _int(info, "dledgerEndIndex"),
                    "diskRatio": float(info["commitLogDiskRatio"]) if info.get("commitLogDiskRatio") else None,
                    "putRate": self.rates.rate((b.addr, "put"), t_s, put) if put is not None else None,
                    "getRate": self.rates.rate((b.addr, "get"), t_s, get) if get is not None else None,
                    "error": None if ok else str(infos[b.addr]),
                    "metrics": metrics[b.addr] if isinstance(metrics[b.addr], dict) else None}
            g = groups.setdefault(b.broker_name, {"brokerName": b.broker_name, "cluster": b.cluster,
                                                  "nodes": [], "peers": [], "missing": []})
            g["nodes"].append(node)
            if node["selfId"]:
                self.last_addr[(b.broker_name, node["selfId"])] = b.addr
            if st.get("role") == "leader":
                g["peers"] = [{"leader": st.get("selfId"), "peer": p, "matchIndex": v.get("matchIndex"),
                               "lag": v.get("lag"), "lastAckMsAgo": v.get("lastAckMsAgo"), "state": v.get("state")}
                              for p, v in sorted((st.get("peers") or {}).items())]
                g["members"] = set(st.get("peers") or {}) | {st.get("selfId")}
        self.rates.forget_except({(a, k) for a in addrs for k in ("put", "get")} | set(self._topic_keys))
        point = {"t": now_ms, "groups": {}}
        for name, g in groups.items():
            # DLedger peers the leader knows that the name server does not list (down, or expired there).
            missing = sorted(g.pop("members", set()) - {n["selfId"] for n in g["nodes"]})
            if missing and name not in self.raft_addrs:
                await self._learn_raft_addrs(name, g)
            g["missing"] = [{"selfId": m, "addr": self.last_addr.get((name, m)),
                             "raftAddr": self.raft_addrs.get(name, {}).get(m)} for m in missing]
            live = [n for n in g["nodes"] if n["error"] is None]
            leaders = [n for n in live if n["raftRole"] == "LEADER"]
            g["master"] = leaders[0]["selfId"] if len(leaders) == 1 else None
            g["term"] = max((n["term"] for n in live if n["term"] is not None), default=None)
            # Every node dispatches every committed message: the group's put rate is its leader's.
            put = leaders[0]["putRate"] if leaders else None
            get = sum(n["getRate"] or 0.0 for n in live)
            self.terms.observe(now_ms, name, g["term"], g["master"])
            point["groups"][name] = {"put": put, "get": get, "term": g["term"]}
        self.window.add(point)
        return {"groups": sorted(groups.values(), key=lambda g: g["brokerName"])}

    async def _learn_raft_addrs(self, name: str, g: dict) -> None:
        """The DLedger addresses of a group's peers, from a live member's dLegerPeers."""
        for n in g["nodes"]:
            if n["error"] is None:
                try:
                    peers = (await self.admin.broker_config(n["addr"])).get("dLegerPeers", "")
                except AdminError:
                    continue
                table = {}
                for part in peers.split(";"):
                    pid, sep, where = part.strip().partition("-")
                    if sep:
                        table[pid] = where
                self.raft_addrs[name] = table
                return

    async def _metrics(self, addr: str) -> dict | None:
        """What the console shows from a broker's Prometheus endpoint (None
        without one); the endpoint is looked up in the broker's config once."""
        if addr not in self.endpoints:
            self.endpoints[addr] = prom.endpoint(await self.admin.broker_config(addr), addr)
        where = self.endpoints[addr]
        if where is None:
            return None
        try:
            families = await prom.scrape(*where, timeout=min(2.0, self.admin.timeout))
        except prom.ScrapeError as e:
            return {"url": f"http://{where[0]}:{where[1]}/metrics", "error": str(e)}
        cur = prom.buckets(families, prom.SEND_LATENCY)
        p99 = prom.latency_quantile(self.latency.get(addr, {}), cur, 0.99) if addr in self.latency else None
        self.latency[addr] = cur
        rss = prom.total(families, "process_resident_memory_bytes")
        return {"url": f"http://{where[0]}:{where[1]}/metrics", "error": None,
                "rssBytes": rss, "appendErrors": prom.total(families, "ledgermq_dledger_append_errors"),
                "sendP99Ms": None if p99 is None else p99 * 1000}

    # --- topics and consumer groups ---------------------------------------------------

    _topic_keys: list = attrs.Factory(list)

    async def sample_topics(self, now_ms: int, cluster: dict) -> tuple[list[dict], list[dict]]:
        masters = {g["brokerName"]: next((n["addr"] for n in g["nodes"] if n["raftRole"] == "LEADER"), None)
                   for g in cluster["groups"]}
        masters = {name: addr for name, addr in masters.items() if addr}
        stats = await gather(list(masters.values()), self._broker_topic_stats)
        t_s = now_ms / 1000
        topics: dict[str, dict] = {}
        for name, addr in sorted(masters.items()):
            per = stats[addr]
            if isinstance(per, AdminError):
                continue
            for topic, queues in per.items():
                row = topics.setdefault(topic, {"topic": topic, "queues": [], "putRate": 0.0})
                for (t, broker_name, qid), v in sorted(queues.items()):
                    row["queues"].append({"brokerName": broker_name, "queueId": qid, "minOffset": v["minOffset"],
                                          "maxOffset": v["maxOffset"],
                                          "lastUpdateTimestamp": v.get("lastUpdateTimestamp", 0)})
        self._topic_keys = []
        for topic, row in topics.items():
            total = sum(q["maxOffset"] for q in row["queues"])
            self._topic_keys.append(("topic", topic))
            row["putRate"] = self.rates.rate(("topic", topic), t_s, total)
            row["system"] = is_system_topic(topic)
        consumers = await self._consumers(masters)
        self.lag_window.add({"t": now_ms, "lag": {c["group"]: c["lag"] for c in consumers},
                             "queues": {c["group"]: {f'{q["topic"]} {q["brokerName"]}/{q["queueId"]}': q["lag"]
                                                     for q in c["queues"]} for c in consumers}})
        return sorted(topics.values(), key=lambda r: r["topic"]), consumers

    async def _broker_topic_stats(self, addr: str) -> dict[str, dict]:
        """{topic: {(topic, broker, qid): stats}} of every topic this master holds."""
        configs = await self.admin.call(addr, RequestCode.GET_ALL_TOPIC_CONFIG)
        names = sorted(json.loads(configs.body).get("topicConfigTable") or {})
        results = await gather([n for n in names if not is_system_topic(n) or n.startswith(("%RETRY%", "%DLQ%"))],
                               lambda t: self.admin.topic_stats(addr, t))
        return {t: v for t, v in results.items() if isinstance(v, dict)}

    async def _consumers(self, masters: dict[str, str]) -> list[dict]:
        groups: set[str] = set()
        for addr in masters.values():
            try:
                groups |= set(await self.admin.all_group_configs(addr))
            except AdminError:
                continue
        groups -= SYSTEM_GROUPS
        out = []
        for group in sorted(groups):
            queues = []
            for name, addr in sorted(masters.items()):
                try:
                    stats = await self.admin.consume_stats(addr, group)
                except AdminError:
                    continue
                for (t, broker_name, qid), w in sorted(stats.items()):
                    c = w["consumerOffset"]
                    queues.append({"topic": t, "brokerName": broker_name, "queueId": qid,
                                   "brokerOffset": w["brokerOffset"], "consumerOffset": c,
                                   "lag": max(0, w["brokerOffset"] - max(c, 0)),
                                   "lastTimestamp": w.get("lastTimestamp", 0)})
            clients = await self._members(masters, group)  # every group is listed, as the stock console does
            out.append({"group": group, "queues": queues, "lag": sum(q["lag"] for q in queues),
                        "members": [c["clientId"] for c in clients], "clients": clients})
        return out

    async def _members(self, masters: dict[str, str], group: str) -> list[dict]:
        """The group's online clients (id, address, language, version)."""
        for addr in masters.values():
            try:
                conn = await self.admin.consumer_connection(addr, group)
            except AdminError:
                continue
            return sorted((connection_row(c) for c in conn.get("connectionSet") or []), key=lambda c: c["clientId"])
        return []
