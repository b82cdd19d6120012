# Owns the broker's admin requests (RocketMQ's AdminBrokerProcessor subset
# and QueryMessageProcessor), what mqadmin and the dashboards send:
#
#   UPDATE_AND_CREATE_TOPIC 17          through the replicated metadata; TopicValidator checks (name, system
#                                       topics, cluster name), queue nums, perm, filter type, 5.x attributes "+k=v,-k"
#   DELETE_TOPIC_IN_BROKER 215          topic config + its consumer offsets (consume queue files stay until
#                                       retention removes them)
#   GET_ALL_TOPIC_CONFIG 21             TopicConfigSerializeWrapper JSON, internal (metadata) topics excluded
#   VIEW_MESSAGE_BY_ID 33               one committed raw record at header `offset`; SYSTEM_ERROR when not found
#   QUERY_MESSAGE 12                    by key through the index (exact key / topic match), _UNIQUE_KEY_QUERY
#                                       caps maxNum at defaultQueryMaxNum (32); header indexLastUpdateTimestamp /
#                                       indexLastUpdatePhyoffset; QUERY_NOT_FOUND
#   GET_BROKER_RUNTIME_INFO 28          KVTable {"table":{...}}, string values; putTps "10s 60s 600s" (RocketMQ's
#                                       format) from TpsMeter, sampled once a second by run(); commitLogDiskRatio
#   GET_TOPIC_STATS_INFO 202            TopicStatsTable per write queue
#   GET_CONSUME_STATS 208               ConsumeStats per queue
#   UPDATE_AND_CREATE_SUBSCRIPTIONGROUP 200 / DELETE_SUBSCRIPTIONGROUP 207
#   GET_ALL_SUBSCRIPTIONGROUP_CONFIG 201 SubscriptionGroupWrapper JSON (the dashboard's and exporter's group list)
#   VIEW_BROKER_STATS_DATA 315          BrokerStatsData (minute/hour/day sum, tps, avgpt) of one item of the
#                                       StatsBook the metrics sampler fills; SYSTEM_ERROR "The stats <n> <k> not
#                                       exist" as RocketMQ answers
#
# Rules.  Writes answer SERVICE_NOT_AVAILABLE on a broker that is not the
# writable leader.  TopicStatsTable and ConsumeStats are maps keyed by
# MessageQueue objects, written as fastjson writes them (object keys:
# {{"brokerName":..}:{..}}, not standard JSON but what Java's
# RemotingSerializable.decode reads; encode_mq_map).
import collections
import json
import logging
import shutil
import time

import attrs
import trio

from broker.common.values import FILTER_TYPES, InvalidMetadataError, TopicConfig, check_group_name, check_topic_name
from broker.config import BrokerConfig, LiveConfig
from broker.metadata.records import is_internal_topic
from broker.metadata.service import MetadataService
from broker.metadata.tables import SubscriptionGroupConfig
from broker.processors.base import RequestProcessor
from broker.remoting.codes import CURRENT_VERSION, RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RequestError
from broker.remoting.header import HeaderReader, decode_json, encode_json
from broker.store.gate import RoleGate
from broker.telemetry import stats as S
from commitlog.replica import ReplicaNode
from commitlog.store import SegmentedStore
from consumequeue.dispatcher import DispatchEngine
from consumequeue.errors import MessageNotFoundError
from consumequeue.reader import MAX_QUERY_NUM, message_at, query_by_key
from consumequeue.record import MessageFormatError
from consumequeue.service import ConsumeQueueService, positions

log = logging.getLogger("ledgermq.admin")

VERSION_DESC = "V5_3_3"  # the name of CURRENT_VERSION's MQVersion ordinal
DEFAULT_QUERY_MAX_NUM = 32  # defaultQueryMaxNum, for _UNIQUE_KEY_QUERY
AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
# TopicValidator.SYSTEM_TOPIC_SET (4.9 / 5.x) plus the rmq_sys_ prefix.
SYSTEM_TOPICS = frozenset({
    AUTO_CREATE_TOPIC_KEY_TOPIC, "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRACE_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC",
    "OFFSET_MOVED_EVENT", "rmq_sys_REVIVE_LOG", "rmq_sys_SYNC_BROKER_MEMBER"})
SYSTEM_TOPIC_PREFIX = "rmq_sys_"


def is_system_topic(topic: str) -> bool:
    return topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX) or is_internal_topic(topic)


def _dump(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def encode_mq_map(table: dict, extra: dict | None = None, field: str = "offsetTable") -> bytes:
    """{"<field>": {MessageQueue: value}} as fastjson writes it: each key a
    JSON object {"brokerName","queueId","topic"} (keys sorted), values and
    the `extra` top-level fields as standard sorted JSON."""
    entries = []
    for (topic, broker_name, queue_id), value in sorted(table.items(), key=lambda kv: (kv[0][0], kv[0][2])):
        key = _dump({"brokerName": broker_name, "queueId": queue_id, "topic": topic})
        entries.append(f"{key}:{_dump(value)}")
    top = {k: _dump(v) for k, v in (extra or {}).items()}
    top[field] = "{" + ",".join(entries) + "}"
    return ("{" + ",".join(f"{_dump(k)}:{top[k]}" for k in sorted(top)) + "}").encode("utf-8")


def parse_attributes(text: str | None, current: dict | None = None) -> dict:
    """5.x AttributeParser: "+k=v,+k2=v2,-k3" (a bare "k=v" adds too)."""
    out = dict(current or {})
    if not text or not text.strip():
        return out
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if part.startswith("-"):
            key = part[1:]
            if not key or "=" in key:
                raise RequestError(ResponseCode.INVALID_PARAMETER, f"bad attribute to delete: {part!r}")
            out.pop(key, None)
            continue
        key, sep, value = part.lstrip("+").partition("=")
        if not key or not sep:
            raise RequestError(ResponseCode.INVALID_PARAMETER, f"attribute {part!r} is not +key=value")
        out[key] = value
    return out


@attrs.define(eq=False)
class TpsMeter:
    """Samples of a growing counter, one per tick; rates over windows."""

    samples: collections.deque = attrs.Factory(lambda: collections.deque(maxlen=601))

    def sample(self, now: float, count: int) -> None:
        self.samples.append((now, count))

    def tps(self, window: float) -> float:
        if len(self.samples) < 2:
            return 0.0
        t1, c1 = self.samples[-1]
        t0, c0 = next(((t, c) for t, c in self.samples if t >= t1 - window), self.samples[0])
        return (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0


def disk_ratio(path: str) -> float:
    """Used fraction of the file system holding `path` (0.0 if unreadable)."""
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return 0.0
    return usage.used / usage.total if usage.total else 0.0


@attrs.define(eq=False, kw_only=True)
class AdminProcessor(RequestProcessor):
    config: LiveConfig
    gate: RoleGate  # metadata is written on the writable leader only; role and term for runtime info
    metadata: MetadataService  # topics, groups, offsets
    replica: ReplicaNode  # DLedger status for runtime info
    log: SegmentedStore  # the commitlog's positions for runtime info
    cq: ConsumeQueueService  # messages by id and by key
    queues: DispatchEngine  # the consume queues and the dispatch counters
    started_ms: int = attrs.Factory(lambda: int(time.time() * 1000))
    put_tps: TpsMeter = attrs.Factory(TpsMeter)
    stats: S.StatsBook = attrs.Factory(S.StatsBook)  # sampled by broker/metrics.py

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Sample the dispatched-message counter once a second (a timer)."""
        task_status.started(self)
        while True:
            self.put_tps.sample(time.monotonic(), self.queues.stats.messages)
            await trio.sleep(1.0)

    CODES = (RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.DELETE_TOPIC_IN_BROKER, RequestCode.GET_ALL_TOPIC_CONFIG,
             RequestCode.VIEW_MESSAGE_BY_ID, RequestCode.QUERY_MESSAGE, RequestCode.GET_BROKER_RUNTIME_INFO,
             RequestCode.GET_TOPIC_STATS_INFO, RequestCode.GET_CONSUME_STATS,
             RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, RequestCode.DELETE_SUBSCRIPTIONGROUP,
             RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, RequestCode.VIEW_BROKER_STATS_DATA)
    not_leader_remark = "metadata is written on the DLedger leader (master)"

    @property
    def cfg(self) -> BrokerConfig:
        return self.config.current

    def handlers(self) -> dict:
        return {
            RequestCode.UPDATE_AND_CREATE_TOPIC: self.update_and_create_topic,
            RequestCode.DELETE_TOPIC_IN_BROKER: self.delete_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self.get_all_topic_config,
            RequestCode.VIEW_MESSAGE_BY_ID: self.view_message_by_id,
            RequestCode.QUERY_MESSAGE: self.query_message,
            RequestCode.GET_BROKER_RUNTIME_INFO: self.get_broker_runtime_info,
            RequestCode.GET_TOPIC_STATS_INFO: self.get_topic_stats_info,
            RequestCode.GET_CONSUME_STATS: self.get_consume_stats,
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: self.update_and_create_group,
            RequestCode.DELETE_SUBSCRIPTIONGROUP: self.delete_group,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self.get_all_groups,
            RequestCode.VIEW_BROKER_STATS_DATA: self.view_broker_stats_data,
        }

    # --- helpers -------------------------------------------------------------------

    def _check_writable(self) -> None:
        self.gate.check_writable()  # NotWritableError is a NotLeaderError

    def _cq(self, topic: str, queue_id: int):
        return self.queues.cqs.get(topic, queue_id)

    def _min_max(self, topic: str, queue_id: int) -> tuple[int, int]:
        cq = self._cq(topic, queue_id)
        return (0, 0) if cq is None else (cq.min_offset, cq.max_offset)

    def _store_time_at(self, topic: str, queue_id: int, offset: int) -> int:
        """getMessageStoreTimeStamp: store time of the message at a queue
        offset, 0 when there is none (or it was deleted)."""
        cq = self._cq(topic, queue_id)
        if cq is None or not cq.min_offset <= offset < cq.max_offset:
            return 0
        unit = cq.get_unit(offset)
        if unit.is_blank:
            return 0
        ts = self.queues.store_timestamp_of(unit.phy, unit.size)
        return 0 if ts is None else ts

    # --- topics --------------------------------------------------------------------

    async def update_and_create_topic(self, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        topic = h.str("topic")
        h.str("defaultTopic", None)  # the template topic; ignored as by 4.x+
        read_n, write_n = h.int("readQueueNums"), h.int("writeQueueNums")
        perm = h.int("perm")
        filter_type = h.str("topicFilterType", "SINGLE_TAG")
        sys_flag = h.int("topicSysFlag", 0)
        order = h.bool("order", False)
        try:
            check_topic_name(topic)
        except InvalidMetadataError as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"The specified topic is invalid: {e}")
        if is_system_topic(topic):
            return request.make_response(ResponseCode.SYSTEM_ERROR,
                                         f"The topic[{topic}] is conflict with system topic.")
        if topic == self.cfg.broker_cluster_name:
            return request.make_response(ResponseCode.SYSTEM_ERROR,
                                         f"The topic[{topic}] is conflict with system reserved words.")
        if read_n <= 0 or write_n <= 0:
            return request.make_response(ResponseCode.INVALID_PARAMETER,
                                         f"readQueueNums {read_n} / writeQueueNums {write_n} must be positive")
        if filter_type not in FILTER_TYPES:
            return request.make_response(ResponseCode.INVALID_PARAMETER,
                                         f"topicFilterType must be one of {FILTER_TYPES}, got {filter_type!r}")
        current = self.metadata.topic_config(topic)
        attributes = parse_attributes(h.str("attributes", None), current.attributes if current else None)
        try:
            cfg = TopicConfig(topic, read_n, write_n, perm, filter_type, sys_flag, order, attributes,
                              extra=current.extra if current else None)
        except InvalidMetadataError as e:
            return request.make_response(ResponseCode.INVALID_PARAMETER, str(e))
        self._check_writable()
        if current == cfg:
            return request.make_response(ResponseCode.SUCCESS)  # nothing changes
        await self.metadata.update_topic(cfg)
        log.info("topic %s created/updated: %s", topic, cfg)
        return request.make_response(ResponseCode.SUCCESS)

    async def delete_topic(self, request: RemotingCommand) -> RemotingCommand:
        topic = HeaderReader(request.ext_fields).str("topic")
        if not topic or not topic.strip():
            return request.make_response(ResponseCode.SYSTEM_ERROR, "The specified topic is blank.")
        if is_system_topic(topic):
            return request.make_response(ResponseCode.SYSTEM_ERROR,
                                         f"The topic[{topic}] is conflict with system topic.")
        self._check_writable()
        metadata = self.metadata
        if metadata.topic_config(topic) is not None or metadata.state.offsets.groups_of_topic(topic):
            await metadata.delete_topic(topic, clean_offsets=True)
            log.info("topic %s deleted", topic)
        return request.make_response(ResponseCode.SUCCESS)

    async def get_all_topic_config(self, request: RemotingCommand) -> RemotingCommand:
        table = self.metadata.state.topics
        body = {"topicConfigTable": {n: c.to_json() for n, c in
                                     self.metadata.topic_configs(include_internal=False).items()},
                "dataVersion": {**table.data_version.to_json(), "stateVersion": self.gate.term}}
        return request.make_response(ResponseCode.SUCCESS, None, None, encode_json(body))

    # --- messages ------------------------------------------------------------------

    async def view_message_by_id(self, request: RemotingCommand) -> RemotingCommand:
        phy = HeaderReader(request.ext_fields).long("offset")
        try:
            record = message_at(self.cq, phy)
        except (MessageNotFoundError, MessageFormatError) as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR,
                                         f"can not find message by the offset, {phy}: {e}")
        return request.make_response(ResponseCode.SUCCESS, None, None, record)

    async def query_message(self, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        topic, key = h.str("topic"), h.str("key")
        max_num = h.int("maxNum", MAX_QUERY_NUM)
        begin, end = h.long("beginTimestamp", 0), h.long("endTimestamp", (1 << 63) - 1)
        if h.bool("_UNIQUE_KEY_QUERY", False):
            max_num = DEFAULT_QUERY_MAX_NUM
        max_num = min(max(max_num, 0), MAX_QUERY_NUM)
        res = query_by_key(self.cq, topic, key, max_num, begin, end)
        fields = {"indexLastUpdateTimestamp": res.index_last_update_timestamp,
                  "indexLastUpdatePhyoffset": res.index_last_update_phy_offset}
        if not res.phy_offsets:
            return request.make_response(ResponseCode.QUERY_NOT_FOUND,
                                         "can not find message, maybe time range not correct", fields)
        return request.make_response(ResponseCode.SUCCESS, None, fields, res.records)

    # --- stats ---------------------------------------------------------------------

    def runtime_info(self) -> dict[str, str]:
        cfg, gate, log, engine = self.cfg, self.gate, self.log, self.queues
        pos = positions(log)
        stats = engine.stats
        st = self.replica.status()
        topics = self.metadata.topic_configs(include_internal=False)
        table = {
            "brokerVersionDesc": VERSION_DESC,  # MQVersion.getVersionDesc, what tools compare
            "brokerVersion": str(CURRENT_VERSION),
            "brokerImpl": "ledgermq",
            "bootTimestamp": str(self.started_ms),
            "runtime": f"{(int(time.time() * 1000) - self.started_ms) // 1000}s",
            "brokerName": cfg.broker_name,
            "clusterName": cfg.broker_cluster_name,
            "brokerId": str(gate.broker_id),
            "brokerRole": "ASYNC_MASTER" if gate.writable else "SLAVE",
            "brokerPermission": str(cfg.broker_permission),
            # Counted by this node's dispatcher since it started: every committed message it indexed.
            "msgPutTotalTodayNow": str(stats.messages),
            "dispatchMessagesTotal": str(stats.messages),
            "dispatchEntriesTotal": str(stats.entries),
            "dispatchBytesTotal": str(stats.bytes),
            "dispatchBehindBytes": str(max(0, pos.committed_pos - engine.pos)),
            "commitLogMinOffset": str(pos.begin_pos),
            "commitLogMaxOffset": str(log.end_pos),
            "commitLogCommittedOffset": str(pos.committed_pos),
            "topicCount": str(len(topics)),
            "subscriptionGroupCount": str(len(self.metadata.state.groups.groups)),
            "consumeQueueCount": str(len(engine.cqs.queues)),
            "metadataAppliedIndex": str(self.metadata.applied_index),
            "dledgerRole": str(st.get("role", "")).upper(),
            "dledgerTerm": str(st.get("term", gate.term)),
            "dledgerLeaderId": str(st.get("leader") or ""),
            "dledgerSelfId": str(st.get("node", "")),
            "dledgerCommittedIndex": str(st.get("committedIndex", pos.committed_index)),
            "dledgerBeginIndex": str(st.get("ledgerBeginIndex", log.begin_index)),
            "dledgerEndIndex": str(st.get("ledgerEndIndex", log.end_index)),
            "dledgerUncommitted": str(st.get("uncommitted", 0)),
            "putTps": " ".join(f"{self.put_tps.tps(w):.2f}" for w in (10, 60, 600)),
            "commitLogDiskRatio": f"{disk_ratio(cfg.store_path_root_dir):.4f}",
            # Counted since this broker started (no day boundaries are kept):
            # clusterList -m shows them as "today".
            "msgPutTotalYesterdayMorning": "0", "msgPutTotalTodayMorning": "0",
            "msgGetTotalYesterdayMorning": "0", "msgGetTotalTodayMorning": "0",
            "msgGetTotalTodayNow": str(self._stats_value(S.BROKER_GET_NUMS, cfg.broker_cluster_name)),
        }
        return table

    def _stats_value(self, name: str, key: str) -> int:
        self.stats.refresh()
        item = self.stats.get(name, key)
        return item.value if item is not None else 0

    async def get_broker_runtime_info(self, request: RemotingCommand) -> RemotingCommand:
        return request.make_response(ResponseCode.SUCCESS, None, None, encode_json({"table": self.runtime_info()}))

    def topic_stats(self, topic: str) -> dict:
        tc = self.metadata.topic_config(topic)
        out = {}
        for qid in range(tc.write_queue_nums):
            lo, hi = self._min_max(topic, qid)
            last = self._store_time_at(topic, qid, hi - 1) if hi > 0 else 0
            out[(topic, self.cfg.broker_name, qid)] = {"lastUpdateTimestamp": last, "maxOffset": hi,
                                                       "minOffset": lo}
        return out

    async def get_topic_stats_info(self, request: RemotingCommand) -> RemotingCommand:
        topic = HeaderReader(request.ext_fields).str("topic")
        if self.metadata.topic_config(topic) is None:
            return request.make_response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        return request.make_response(ResponseCode.SUCCESS, None, None, encode_mq_map(self.topic_stats(topic)))

    def consume_stats(self, group: str, topic: str | None = None) -> dict:
        """{(topic, brokerName, queueId): OffsetWrapper}; each wrapper also
        carries the lag (brokerOffset - consumerOffset) under "lag" for
        Python callers (not sent: Java computes it)."""
        metadata = self.metadata
        topics = [topic] if topic else metadata.state.offsets.topics_of_group(group)
        out = {}
        for t in topics:
            tc = metadata.topic_config(t)
            if tc is None:
                continue
            for qid in range(tc.write_queue_nums):
                broker_offset = max(self._min_max(t, qid)[1], 0)
                consumer = metadata.query_offset(t, group, qid)
                consumer = -1 if consumer is None else consumer
                last = self._store_time_at(t, qid, consumer - 1) if consumer > 0 else 0
                out[(t, self.cfg.broker_name, qid)] = {
                    "brokerOffset": broker_offset, "consumerOffset": consumer, "pullOffset": consumer,
                    "lastTimestamp": last, "lag": max(0, broker_offset - max(consumer, 0))}
        return out

    async def get_consume_stats(self, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        group, topic = h.str("consumerGroup"), h.str("topic", None)
        if topic is not None and not topic.strip():
            topic = None
        if topic is not None and self.metadata.topic_config(topic) is None:
            return request.make_response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        stats = self.consume_stats(group, topic)
        wire = {k: {f: v for f, v in w.items() if f != "lag"} for k, w in stats.items()}
        topics = {t for t, _, _ in stats}
        self.stats.refresh()
        items = [self.stats.get(S.GROUP_GET_NUMS, f"{t}@{group}") for t in topics]
        tps = sum((item.rate(60) for item in items if item is not None), 0.0)
        return request.make_response(ResponseCode.SUCCESS, None, None,
                                     encode_mq_map(wire, {"consumeTps": tps}))

    async def view_broker_stats_data(self, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        name, key = h.str("statsName"), h.str("statsKey")
        data = self.stats.broker_stats_data(name, key)
        if data is None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
        return request.make_response(ResponseCode.SUCCESS, None, None, encode_json(data))

    # --- subscription groups ---------------------------------------------------------

    async def update_and_create_group(self, request: RemotingCommand) -> RemotingCommand:
        data = decode_json(request.body, "SubscriptionGroupConfig")
        if not isinstance(data, dict):
            return request.make_response(ResponseCode.SYSTEM_ERROR, "SubscriptionGroupConfig must be a JSON object")
        try:
            cfg = SubscriptionGroupConfig.from_json(data)
        except InvalidMetadataError as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"invalid subscription group config: {e}")
        self._check_writable()
        if self.metadata.group_config(cfg.group_name) != cfg:
            await self.metadata.update_group(cfg)
            log.info("subscription group %s created/updated", cfg.group_name)
        return request.make_response(ResponseCode.SUCCESS)

    async def get_all_groups(self, request: RemotingCommand) -> RemotingCommand:
        table = self.metadata.state.groups
        body = {"subscriptionGroupTable": {name: g.to_json() for name, g in sorted(table.groups.items())},
                "dataVersion": {**table.data_version.to_json(), "stateVersion": self.gate.term}}
        return request.make_response(ResponseCode.SUCCESS, None, None, encode_json(body))

    async def delete_group(self, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        group = h.str("groupName")
        clean = h.bool("cleanOffset", False) or h.bool("removeOffset", False)
        try:
            check_group_name(group)
        except InvalidMetadataError as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, str(e))
        self._check_writable()
        metadata = self.metadata
        if metadata.group_config(group) is not None or (clean and metadata.state.offsets.topics_of_group(group)):
            await metadata.delete_group(group, clean_offsets=clean)
            log.info("subscription group %s deleted (offsets %s)", group, "removed" if clean else "kept")
        return request.make_response(ResponseCode.SUCCESS)
