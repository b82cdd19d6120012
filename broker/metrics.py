# Owns the broker's metrics: what is counted where, and the collector that
# turns the broker's state into Prometheus families at scrape time.
#
# Rule: no per-message work on the send path.
#   puts, message sizes  PutCounter reads the new consume-queue units at
#                        sample/scrape time (every node alike; sizes sorted
#                        once, one bisect per bucket bound)
#   send latency         MeteredSends: two clock reads and ONE observe per
#                        burst, weighted by its size
#   gets, pull latency,  MeteredPulls, per PULL_MESSAGE request (messages =
#   store-time lag       nextBeginOffset - queueOffset; the first record's
#                        store timestamp)
#   rpc latency          MeteredRequests (every other code, per request and
#                        response code) and the two above, read through
#                        RocketMQ 5's bucket bounds (BucketCounter.coarsened)
#   lag, lag age         replicated consumer offsets vs CQ max offsets; the
#                        age on the master at scrape time, at most
#                        MAX_AGE_READS reads per scrape
#   DLedger, errors,     ReplicaNode.status() (elections = terms started
#   dispatch lag         since start), the replica's counters, committed -
#                        dispatched position
#   connections, RSS,    the remoting server (containment, shed connections,
#   hostile input        unfinished bytes, deferred rounds), the held long
#                        polls, prometheus_client's ProcessCollector
#
# serve_broker_metrics samples the StatsBook every SAMPLE_S (a timer: it feeds
# VIEW_BROKER_STATS_DATA and the TPS gauges) and serves the endpoint with
# metricsExporterType=PROM.  Names, labels and nodes: broker/telemetry/
# catalog.py (a group's data only on the writable master, so the stock
# queries add up over a group's members).
import bisect
import os
import shutil
import socket
import struct
import sys
import time
from array import array
from typing import Any, Callable, Iterable, Protocol, Sized

import attrs
import trio
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from broker.common.values import ConsumeType, MessageModel
from broker.config import LiveConfig
from broker.metadata.records import is_internal_topic
from broker.metadata.tables import split_offset_key
from broker.processors.admin import SYSTEM_TOPICS, VERSION_DESC, disk_ratio
from broker.processors.client_manager import ClientManager
from broker.processors.retry import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX
from broker.remoting.answers import BurstAnswers, as_answers
from broker.remoting.codec import request_count
from broker.remoting.codes import RequestCode, ResponseCode
from broker.store.broker_store import BrokerStore
from broker.store.timer import TIMER_TOPIC
from broker.store.transaction import HALF_TOPIC
from broker.telemetry import catalog as C
from broker.telemetry import stats as S
from broker.telemetry.buckets import MESSAGE_SIZE_BUCKETS, RPC_LATENCY_BUCKETS_MS, STORE_LAG_BUCKETS_S, BucketCounter
from broker.telemetry.exporter import MetricsConfig, serve_metrics
from consumequeue.cq import ConsumeQueue
from consumequeue.record import POS_SYSFLAG, SCHEDULE_TOPIC, store_timestamp_pos
from consumequeue.service import positions

CQ_UNIT = struct.Struct(">qiq")  # phy offset, size, tags code (spec §2)
_I32, _I64 = struct.Struct(">i"), struct.Struct(">q")


def _sizes(raw: bytes, n: int) -> array:
    """The message sizes of n consume queue units, without a Python step
    per unit (this runs over every message put): a unit is five big-endian
    int32 words, the size its third."""
    words = array("i", raw[:n * CQ_UNIT.size])
    if sys.byteorder == "little":
        words.byteswap()
    return words[2::5]


def _size_sum(raw: bytes, n: int) -> int:
    sizes = _sizes(raw, n)
    total = sum(sizes)
    return total if min(sizes, default=0) >= 0 else sum(s for s in sizes if s > 0)
READ_UNITS = 8192  # CQ units read per queue per pass
# Commitlog reads per scrape for the age of the oldest unconsumed message
# (one per lagging queue); past it a (topic, group) keeps its last age.
MAX_AGE_READS = 4096


class QueueTable(Protocol):
    """What the put counter reads (consumequeue.cq.ConsumeQueueStore)."""

    queues: dict[tuple[str, int], ConsumeQueue]


class BurstSender(Protocol):
    """What MeteredSends wraps (broker.processors.send.SendProcessor)."""

    CODES: tuple[int, ...]

    def accept_burst(self, conn, cmds: list) -> Any: ...


class Dispatcher(Protocol):
    """What MeteredRequests wraps (broker.remoting.server.RequestDispatcher)."""

    def split_burst(self, conn, cmds: list) -> tuple[list, list]: ...

    def serves(self, code: int) -> bool: ...

    async def __call__(self, conn, request) -> Any: ...


class Puller(Protocol):
    """What MeteredPulls wraps (broker.processors.pull.PullProcessor): a held
    pull's late answer goes to the callback."""

    CODES: tuple[int, ...]

    async def __call__(self, conn, request, on_answer: Callable[[Any], None] | None = None) -> Any: ...


class ServedConnections(Protocol):
    """What the collector reads of the remoting server (broker.remoting.server.RemotingServer)."""

    connections: Sized

    def hostile_metrics(self) -> Iterable[tuple[str, str, str, dict, float]]: ...


@attrs.define(eq=False)
class PutCounter:
    """Messages and bytes put per topic since start, from the consume queues."""

    cqs: QueueTable
    cursor: dict = attrs.Factory(dict)  # (topic, qid) -> next unit to count
    messages: dict = attrs.Factory(dict)  # topic -> messages
    bytes: dict = attrs.Factory(dict)  # topic -> bytes
    sizes: dict = attrs.Factory(dict)  # topic -> BucketCounter of message sizes

    def __attrs_post_init__(self) -> None:
        # What is stored already was put before this process started.
        self.cursor = {key: cq.max_offset for key, cq in self.cqs.queues.items()}

    def update(self, budget: int = READ_UNITS) -> None:
        for key, cq in list(self.cqs.queues.items()):
            if is_internal_topic(key[0]):
                continue  # the replicated metadata's own records are no client's puts
            pos = max(self.cursor.get(key, 0), cq.min_offset)
            end = cq.max_offset
            if pos >= end:
                self.cursor[key] = max(pos, self.cursor.get(key, 0))
                continue
            topic = key[0]
            while pos < end:
                raw = cq.read_raw(pos, min(budget, end - pos))
                if not raw:
                    break
                n = len(raw) // CQ_UNIT.size
                sizes = sorted(_sizes(raw, n))
                if sizes and sizes[0] <= 0:  # (a unit being written reads as zeros)
                    sizes = sizes[bisect.bisect_right(sizes, 0):]
                self.bytes[topic] = self.bytes.get(topic, 0) + sum(sizes)
                bc = self.sizes.get(topic)
                if bc is None:
                    bc = self.sizes[topic] = BucketCounter(MESSAGE_SIZE_BUCKETS)
                bc.observe_sorted(sizes)
                self.messages[topic] = self.messages.get(topic, 0) + n
                pos += n
            self.cursor[key] = pos


@attrs.define(eq=False)
class MeteredSends:
    """The send processor's bursts, timed: registered for its codes in its
    place (broker/server.py), it hands every burst on unchanged."""

    inner: BurstSender
    latency: BucketCounter = attrs.Factory(BucketCounter)
    bursts: int = 0
    clock: Callable[[], float] = time.perf_counter

    def register(self, dispatcher) -> None:
        for code in self.inner.CODES:
            dispatcher.register_burst(code, self)

    def accept_burst(self, conn, cmds) -> BurstAnswers:
        t0 = self.clock()
        answers = as_answers(self.inner.accept_burst(conn, cmds))

        def timed() -> None:
            self.latency.observe(self.clock() - t0, request_count(cmds))
            self.bursts += 1

        answers.then(timed)
        return answers


@attrs.define(eq=False)
class MeteredRequests:
    """The requests served one by one, timed per (request code, response
    code) for rocketmq_rpc_latency: it stands between the admission guard
    and the dispatcher (broker/server.py), handing bursts on untouched.  The
    codes in `skip` are timed by their own wrappers (pulls: MeteredPulls,
    with their long-polling label; sends come as bursts).  Bounded: a code
    no processor serves is counted under -1, a response code outside
    ResponseCode under -1 (labels "other")."""

    inner: Dispatcher
    skip: frozenset = frozenset()
    rpc: dict = attrs.Factory(dict)  # (request code, response code, result) -> BucketCounter
    clock: Callable[[], float] = time.perf_counter

    def split_burst(self, conn, cmds):
        return self.inner.split_burst(conn, cmds)

    async def __call__(self, conn, request):
        code = request.code
        if code in self.skip:
            return await self.inner(conn, request)
        t0 = self.clock()
        response, result = None, "process_request_failed"
        try:
            response = await self.inner(conn, request)
            result = "oneway" if request.is_oneway else "success"
            return response
        finally:
            if not self.inner.serves(code):
                code = -1
            rcode = -1 if response is None else response.code
            if rcode not in _RESPONSE_CODES:
                rcode = -1
            bc = self.rpc.get((code, rcode, result))
            if bc is None:
                bc = self.rpc[code, rcode, result] = BucketCounter()
            bc.observe(self.clock() - t0)


_RESPONSE_CODES = frozenset(int(c) for c in ResponseCode)


@attrs.define(eq=False)
class MeteredPulls:
    """PULL_MESSAGE, timed and counted per topic@group (a held pull when it
    is answered: the processor calls back)."""

    inner: Puller
    latency: BucketCounter = attrs.Factory(BucketCounter)
    gets: dict = attrs.Factory(dict)  # (topic, group) -> [messages, bytes, pulls that found some]
    rpc: dict = attrs.Factory(dict)  # (response code, "true"/"false" held) -> BucketCounter
    store_lag: dict = attrs.Factory(dict)  # (topic, group) -> BucketCounter: store time -> answer
    clock: Callable[[], float] = time.perf_counter
    wall_ms: Callable[[], float] = lambda: time.time() * 1000

    def register(self, dispatcher) -> None:
        for code in self.inner.CODES:
            dispatcher.register(code, self)

    async def __call__(self, conn, request):
        t0 = self.clock()
        f = request.ext_fields
        # (the callback of a held pull keeps these, not the request)
        key, offset = (f.get("topic", ""), f.get("consumerGroup", "")), f.get("queueOffset")
        response = await self.inner(conn, request, lambda late: self._count(key, offset, late, t0, "true"))
        if response is not None:
            self._count(key, offset, response, t0, "false")
        return response

    def _count(self, key: tuple[str, str], offset, response, t0: float, held: str) -> None:
        elapsed = self.clock() - t0
        bc = self.rpc.get((response.code, held))
        if bc is None:
            bc = self.rpc[response.code, held] = BucketCounter()
        bc.observe(elapsed)
        if response.code != ResponseCode.SUCCESS:
            return
        self.latency.observe(elapsed)
        try:
            n = int(response.ext_fields.get("nextBeginOffset")) - int(offset)
        except (TypeError, ValueError):
            n = 0
        entry = self.gets.get(key)
        if entry is None:
            entry = self.gets[key] = [0, 0, 0]
        entry[0] += max(n, 0)
        entry[1] += len(response.body or b"")
        entry[2] += 1
        stored = _first_store_time(response.body)
        if stored is not None and n > 0:
            lag = self.store_lag.get(key)
            if lag is None:
                lag = self.store_lag[key] = BucketCounter(STORE_LAG_BUCKETS_S)
            lag.observe(max(0.0, (self.wall_ms() - stored) / 1000), n)


def _first_store_time(body) -> int | None:
    """The store timestamp (ms) of the first record of a pull's body."""
    if not body or len(body) < POS_SYSFLAG + 4:
        return None
    pos = store_timestamp_pos(_I32.unpack_from(body, POS_SYSFLAG)[0])
    if len(body) < pos + 8:
        return None
    return _I64.unpack_from(body, pos)[0]


@attrs.define(eq=False, kw_only=True)
class BrokerMetrics:
    """Everything the broker's collector and stats read (built by serve_broker)."""

    config: LiveConfig
    store: BrokerStore
    server: ServedConnections
    sends: MeteredSends
    pulls: MeteredPulls
    stats: S.StatsBook
    clients: ClientManager  # the one the pull processor reads subscriptions from
    queues: QueueTable  # the consume queues (puts counted from them)
    requests: MeteredRequests | None = None  # the one-by-one requests' rpc latency
    puts: PutCounter = attrs.field(init=False)
    start_term: int = attrs.field(init=False)
    started_ms: int = attrs.field(init=False, factory=lambda: int(time.time() * 1000))

    def __attrs_post_init__(self) -> None:
        self.puts = PutCounter(self.queues)
        self.start_term = self.store.gate.term
        self.stats.source = self.totals

    def totals(self) -> dict:
        """(stats name, key) -> (value, calls) for StatsBook.sample."""
        self.puts.update()
        cluster = self.config.current.broker_cluster_name
        out = {}
        all_puts = 0
        for topic, n in self.puts.messages.items():
            out[S.TOPIC_PUT_NUMS, topic] = (n, n)
            out[S.TOPIC_PUT_SIZE, topic] = (self.puts.bytes.get(topic, 0), n)
            all_puts += n
        all_gets = 0
        for (topic, group), (n, size, pulls) in self.pulls.gets.items():
            out[S.GROUP_GET_NUMS, f"{topic}@{group}"] = (n, pulls)
            out[S.GROUP_GET_SIZE, f"{topic}@{group}"] = (size, pulls)
            all_gets += n
        out[S.BROKER_PUT_NUMS, cluster] = (all_puts, all_puts)
        out[S.BROKER_GET_NUMS, cluster] = (all_gets, all_gets)
        return out

    def sample(self, now: float) -> None:
        self.stats.sample(now, self.totals())

    def refresh(self) -> None:
        self.stats.refresh()

    def collector(self) -> "BrokerCollector":
        return BrokerCollector(self)


def _topic_kind(topic: str) -> tuple[str, str]:
    """RocketMQ 5's (message_type, is_system) of a topic, from its name
    alone (the consume queues do not say what a message was sent as)."""
    if topic == HALF_TOPIC:
        return "transaction", "true"
    if topic in (SCHEDULE_TOPIC, TIMER_TOPIC):
        return "delay", "true"
    system = topic.startswith(("rmq_sys_", "RMQ_SYS_")) or topic in SYSTEM_TOPICS
    return "normal", "true" if system else "false"


def _is_retry(topic: str) -> str:
    return "true" if topic.startswith(RETRY_GROUP_TOPIC_PREFIX) else "false"


_CONSUME_MODE = {ConsumeType.CONSUME_PASSIVELY: "push", ConsumeType.CONSUME_ACTIVELY: "pull",
                 ConsumeType.CONSUME_POP: "pop"}


def _dir_bytes(path: str, limit: int = 100_000) -> int:
    """Bytes of the files under path (at most `limit` entries looked at)."""
    total, stack, seen = 0, [path], 0
    while stack and seen < limit:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue
        with it:
            for entry in it:
                seen += 1
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
    return total


@attrs.define(eq=False)
class FamilySet:
    """The families of one scrape, built from the catalogue's specs only
    (broker/telemetry/catalog.py): a name or label the catalogue does not
    have raises, and MASTER-scope samples are dropped on any node that is
    not the writable master (the family itself stays, empty)."""

    common: dict  # label -> value for the labels every spec may take from here
    master: bool
    families: dict = attrs.Factory(dict)

    def _family(self, spec: C.Spec):
        fam = self.families.get(spec.name)
        if fam is None:
            cls = {C.COUNTER: CounterMetricFamily, C.GAUGE: GaugeMetricFamily,
                   C.HISTOGRAM: HistogramMetricFamily}[spec.kind]
            fam = self.families[spec.name] = cls(spec.family_name, spec.doc, labels=list(spec.labels))
        return fam

    def _labels(self, spec: C.Spec, labels: dict) -> list[str] | None:
        """The label values of one sample, None when this node does not
        export it (the family is made either way)."""
        self._family(spec)
        extra = set(labels) - set(spec.labels)
        if extra:
            raise KeyError(f"{spec.name} has no label {sorted(extra)}")
        if spec.scope == C.MASTER and not self.master:
            return None
        return [str(labels[k]) if k in labels else str(self.common[k]) for k in spec.labels]

    def add(self, name: str, value, **labels) -> None:
        spec = C.BY_NAME[name]
        values = self._labels(spec, labels)
        if values is not None:
            self.families[name].add_metric(values, float(value))

    def histogram(self, name: str, buckets: list, total: float, **labels) -> None:
        spec = C.BY_NAME[name]
        values = self._labels(spec, labels)
        if values is not None:
            self.families[name].add_metric(values, buckets, total)

    def __iter__(self):
        for spec in C.SERVED:
            yield self._family(spec)


@attrs.define(eq=False)
class BrokerCollector:
    """A prometheus_client collector over BrokerMetrics (runs at scrape time,
    in the trio thread: see broker/telemetry/exporter.py)."""

    m: BrokerMetrics
    host: str = attrs.Factory(socket.gethostname)
    ages: dict = attrs.Factory(dict)  # (topic, group) -> the last age read (ms), for scrapes past MAX_AGE_READS
    storage: tuple = (float("-inf"), 0)  # (monotonic time, bytes): the store's size, walked at most every SAMPLE_S

    def describe(self):
        return []  # unchecked collector: the families depend on the topics

    def common(self) -> dict:
        cfg, m = self.m.config.current, self.m
        return {"cluster": cfg.broker_cluster_name, "broker": cfg.broker_name, "node_type": "broker",
                "node_id": cfg.broker_name, "brokerIP": f"{cfg.broker_ip1}:{cfg.listen_port}",
                "brokerHost": self.host, "des": cfg.broker_name, "boottime": str(m.started_ms),
                "broker_version": VERSION_DESC, "protocol_type": "remoting", "storage_type": "local"}

    def collect(self):
        m, cfg = self.m, self.m.config.current
        bs = m.store
        base = {"cluster": cfg.broker_cluster_name, "broker": cfg.broker_name}
        m.refresh()
        m.puts.update()
        out = FamilySet(self.common(), bs.gate.writable)
        self.puts(out)
        self.gets(out)
        self.consumers(out)
        self.clients(out)
        self.runtime(out)
        self.latency(out)
        self.dledger(out)
        yield from out
        # Families of other owners (names and labels theirs: catalog.FOREIGN_PREFIXES).
        yield from remoting_families(m.server, base)

    # --- the group's puts (MASTER)
    def puts(self, out: FamilySet) -> None:
        m, bs = self.m, self.m.store
        offsets: dict[str, int] = {}
        for (topic, _), cq in list(bs.cq.engine.cqs.queues.items()):
            if not is_internal_topic(topic):
                offsets[topic] = offsets.get(topic, 0) + cq.max_offset
        for topic, n in sorted(offsets.items()):
            if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                out.add("rocketmq_topic_retry_offset", n, topic=topic)
            elif topic.startswith(DLQ_GROUP_TOPIC_PREFIX):
                out.add("rocketmq_topic_dlq_offset", n, group=topic[len(DLQ_GROUP_TOPIC_PREFIX):])
            else:
                out.add("rocketmq_producer_offset", n, topic=topic)
        for topic in sorted(m.puts.messages):
            n = m.puts.messages[topic]
            message_type, is_system = _topic_kind(topic)
            out.add("rocketmq_messages_in_total", n, topic=topic, message_type=message_type, is_system=is_system)
            out.add("rocketmq_throughput_in_total", m.puts.bytes.get(topic, 0), topic=topic,
                    message_type=message_type, is_system=is_system)
            sizes = m.puts.sizes.get(topic)
            if sizes is not None:
                out.histogram("rocketmq_message_size", sizes.cumulative(), sizes.total, topic=topic,
                              message_type=message_type)
            item = m.stats.get(S.TOPIC_PUT_NUMS, topic)
            out.add("rocketmq_producer_tps", item.rate(60) if item else 0.0, topic=topic)
            item = m.stats.get(S.TOPIC_PUT_SIZE, topic)
            out.add("rocketmq_producer_message_size", item.rate(60) if item else 0.0, topic=topic)
            if topic.startswith(DLQ_GROUP_TOPIC_PREFIX):
                out.add("rocketmq_send_to_dlq_messages_total", n, topic=topic,
                        consumer_group=topic[len(DLQ_GROUP_TOPIC_PREFIX):], is_retry="false", is_system="false")
        put_all = m.stats.get(S.BROKER_PUT_NUMS, self.m.config.current.broker_cluster_name)
        out.add("rocketmq_broker_tps", put_all.rate(60) if put_all else 0.0)

    # --- what this node served to pulls (NODE)
    def gets(self, out: FamilySet) -> None:
        m = self.m
        for (topic, group), (n, nbytes, _) in sorted(m.pulls.gets.items()):
            labels = dict(topic=topic, consumer_group=group, is_retry=_is_retry(topic),
                          is_system=_topic_kind(topic)[1])
            out.add("rocketmq_messages_out_total", n, **labels)
            out.add("rocketmq_throughput_out_total", nbytes, **labels)
            item = m.stats.get(S.GROUP_GET_NUMS, f"{topic}@{group}")
            out.add("rocketmq_consumer_tps", item.rate(60) if item else 0.0, topic=topic, group=group)
            item = m.stats.get(S.GROUP_GET_SIZE, f"{topic}@{group}")
            out.add("rocketmq_consumer_message_size", item.rate(60) if item else 0.0, topic=topic, group=group)
        for (topic, group), bc in sorted(m.pulls.store_lag.items()):
            out.histogram("ledgermq_consume_latency_by_storetime_seconds", bc.cumulative(), bc.total,
                          topic=topic, consumer_group=group)
        get_all = m.stats.get(S.BROKER_GET_NUMS, self.m.config.current.broker_cluster_name)
        out.add("rocketmq_broker_qps", get_all.rate(60) if get_all else 0.0)

    # --- consumer offsets, lag and its age (MASTER)
    def consumers(self, out: FamilySet) -> None:
        bs = self.m.store
        if not out.master:
            return  # (every family here is MASTER: skip the reads)
        cqs, engine = bs.cq.engine.cqs, bs.cq.engine
        now_ms = int(time.time() * 1000)
        online = {g: len(self.m.clients.consumer_ids(g)) for g in list(self.m.clients.consumers)}
        reads = 0
        for key, table in sorted(bs.metadata.state.offsets.offsets.items()):
            topic, group = split_offset_key(key)
            total = lag_sum = 0
            oldest = None  # store time (ms) of the oldest unconsumed message
            complete = True
            for qid, committed in sorted(table.items()):
                cq = cqs.get(topic, qid)
                max_offset = cq.max_offset if cq is not None else 0
                committed = max(committed, 0)
                lag = max(0, max_offset - committed)
                out.add("rocketmq_message_accumulation", lag, topic=topic, group=group, queueid=qid)
                total += committed
                lag_sum += lag
                if lag and cq is not None:
                    if reads >= MAX_AGE_READS:
                        complete = False
                        continue
                    reads += 1
                    ts = _store_time_at(engine, cq, max(committed, cq.min_offset))
                    if ts is not None and (oldest is None or ts < oldest):
                        oldest = ts
            if complete:
                age = self.ages[topic, group] = max(0, now_ms - oldest) if oldest is not None else 0
            else:
                age = self.ages.get((topic, group), 0)
            is_retry, is_system = _is_retry(topic), _topic_kind(topic)[1]
            out.add("rocketmq_consumer_lag_messages", lag_sum, topic=topic, consumer_group=group,
                    is_retry=is_retry, is_system=is_system)
            out.add("rocketmq_consumer_lag_latency", age, topic=topic, consumer_group=group,
                    is_retry=is_retry, is_system=is_system)
            if topic.startswith(DLQ_GROUP_TOPIC_PREFIX):
                diff_name, owner = "rocketmq_group_dlqdiff", topic[len(DLQ_GROUP_TOPIC_PREFIX):]
            elif topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                diff_name, owner = "rocketmq_group_retrydiff", topic[len(RETRY_GROUP_TOPIC_PREFIX):]
            else:
                diff_name, owner = "rocketmq_group_diff", group
                out.add("rocketmq_consumer_offset", total, topic=topic, group=group)
                out.add("rocketmq_group_get_latency_by_storetime", age, topic=topic, group=group)
            info = self.m.clients.group(owner)
            if info is None or info.message_model == MessageModel.CLUSTERING:
                out.add(diff_name, lag_sum, group=owner, topic=topic,
                        countOfOnlineConsumers=online.get(owner, 0), msgModel=MessageModel.CLUSTERING.value)

    # --- online clients (MASTER: every client heartbeats every member)
    def clients(self, out: FamilySet) -> None:
        if not out.master:
            return
        clients, now = self.m.clients, self.m.clients.clock_ms()
        producers: dict[tuple, int] = {}
        for group, channels in sorted(clients.producers.items()):
            live = [ch for ch in list(channels.values()) if clients._alive(ch, now)]
            if live:
                out.add("rocketmq_producer_count", len({ch.client_id for ch in live}), group=group)
            for ch in live:
                key = (getattr(ch.language, "name", str(ch.language)), str(ch.version))
                producers[key] = producers.get(key, 0) + 1
        for (language, version), n in sorted(producers.items()):
            out.add("rocketmq_producer_connections", n, language=language, version=version)
        for group, info in sorted(clients.consumers.items()):
            live = [ch for ch in list(info.channels.values()) if clients._alive(ch, now)]
            addrs = ",".join(sorted(str(getattr(ch.conn, "remote_address", "")) for ch in live))
            out.add("rocketmq_group_count", len(live), group=group, caddr=addrs, localaddr=addrs)
            by_client: dict[tuple, int] = {}
            for ch in live:
                key = (getattr(ch.language, "name", str(ch.language)), str(ch.version))
                by_client[key] = by_client.get(key, 0) + 1
            for (language, version), n in sorted(by_client.items()):
                out.add("rocketmq_consumer_connections", n, consumer_group=group, language=language,
                        version=version, consume_mode=_CONSUME_MODE.get(info.consume_type, "push"))

    # --- GET_BROKER_RUNTIME_INFO's figures, the exporter's brokeruntime_* and RocketMQ 5's storage_*
    def runtime(self, out: FamilySet) -> None:
        m, cfg, bs = self.m, self.m.config.current, self.m.store
        pos = positions(bs.store)
        behind = max(0, pos.committed_pos - bs.cq.engine.pos)
        put_n = sum(m.puts.messages.values())
        put_b = sum(m.puts.bytes.values())
        put_all = m.stats.get(S.BROKER_PUT_NUMS, cfg.broker_cluster_name)
        get_all = m.stats.get(S.BROKER_GET_NUMS, cfg.broker_cluster_name)
        try:
            usage = shutil.disk_usage(cfg.store_path_root_dir)
        except OSError:
            usage = None
        ratio = disk_ratio(cfg.store_path_root_dir)
        lat = m.sends.latency
        rt = {
            "msg_put_total_today_now": put_n, "msg_gettotal_today_now": get_all.value if get_all else 0,
            "put_message_size_total": put_b, "put_message_average_size": put_b / put_n if put_n else 0.0,
            "dispatch_behind_bytes": behind, "commitlog_maxoffset": bs.store.end_pos,
            "commitlog_minoffset": pos.begin_pos, "commitlog_disk_ratio": ratio, "consumequeue_disk_ratio": ratio,
            "commitlogdir_capacity_total": usage.total if usage else 0,
            "commitlogdir_capacity_free": usage.free if usage else 0,
            "start_accept_sendrequest_time": m.started_ms,
            "put_latency_99": lat.quantile(0.99) * 1000, "put_latency_999": lat.quantile(0.999) * 1000,
        }
        for window in (10, 60, 600):
            rt[f"put_tps{window}"] = put_all.rate(window) if put_all else 0.0
            rt[f"gettotal_tps{window}"] = get_all.rate(window) if get_all else 0.0
        for name, value in rt.items():
            out.add(f"rocketmq_brokeruntime_{name}", value)
        for band, low, high in C.PMDT_BANDS:
            upto = lat.count if high is None else lat.le(high)
            out.add(f"rocketmq_brokeruntime_pmdt_{band}", upto - (lat.le(low) if low else 0))
        out.add("rocketmq_broker_permission", cfg.broker_permission)
        now = time.monotonic()
        if now - self.storage[0] >= S.SAMPLE_S:
            self.storage = (now, _dir_bytes(cfg.store_path_root_dir))
        out.add("rocketmq_storage_size", self.storage[1])
        out.add("rocketmq_storage_dispatch_behind_bytes", behind)
        out.add("ledgermq_dispatch_lag_bytes", behind)
        out.add("ledgermq_remoting_connections", len(m.server.connections))
        out.add("ledgermq_pull_held", m.pulls.inner.held)
        for budget, n in sorted(m.pulls.inner.holds.table.refused.items()):
            out.add("ledgermq_pull_hold_refused_total", n, budget=budget)
        fwd = m.sends.inner.forwarder
        if fwd is not None:  # sends this broker could not store (broker/processors/forward.py)
            out.add("ledgermq_send_forward_held", fwd.held)
            for outcome, n in sorted(fwd.stats.items()):
                out.add("ledgermq_send_forward_total", n, outcome=outcome)

    # --- latency histograms (NODE)
    def latency(self, out: FamilySet) -> None:
        m = self.m
        out.histogram("ledgermq_send_latency_seconds", m.sends.latency.cumulative(), m.sends.latency.total)
        out.histogram("ledgermq_pull_latency_seconds", m.pulls.latency.cumulative(), m.pulls.latency.total)
        ms = RPC_LATENCY_BUCKETS_MS
        out.histogram("rocketmq_rpc_latency", m.sends.latency.coarsened(ms, 1000), m.sends.latency.total * 1000,
                      request_code="send_message", response_code="all", is_long_polling="false", result="success")
        for (code, held), bc in sorted(m.pulls.rpc.items()):
            out.histogram("rocketmq_rpc_latency", bc.coarsened(ms, 1000), bc.total * 1000,
                          request_code="pull_message", response_code=_code_name(code), is_long_polling=held,
                          result="success")
        if m.requests is not None:
            for (code, rcode, result), bc in sorted(m.requests.rpc.items()):
                out.histogram("rocketmq_rpc_latency", bc.coarsened(ms, 1000), bc.total * 1000,
                              request_code=_request_code_name(code),
                              response_code="other" if rcode == -1 else _code_name(rcode),
                              is_long_polling="false", result=result)

    # --- DLedger (NODE)
    def dledger(self, out: FamilySet) -> None:
        m, bs = self.m, self.m.store
        st = bs.replica.status()
        for name in ("leader", "candidate", "follower"):
            out.add("ledgermq_dledger_role", 1.0 if str(st.get("role", "")).lower() == name else 0.0, role=name)
        out.add("ledgermq_dledger_writable", 1.0 if bs.gate.writable else 0.0)
        term = int(st.get("term", bs.gate.term))
        out.add("ledgermq_dledger_term", term)
        out.add("ledgermq_dledger_elections_total", max(0, term - m.start_term))
        out.add("ledgermq_dledger_committed_index", st.get("committedIndex", -1))
        out.add("ledgermq_dledger_end_index", st.get("ledgerEndIndex", -1))
        for peer, p in sorted((st.get("peers") or {}).items()):
            out.add("ledgermq_dledger_peer_match_lag_entries", p.get("lag", 0), peer=peer)
            if p.get("lastAckMsAgo") is not None:
                out.add("ledgermq_dledger_peer_last_ack_age_seconds", p["lastAckMsAgo"] / 1000, peer=peer)
        counts = st.get("stats") or {}
        for kind in ("pending_full", "quorum_timeout", "refused_appends"):
            out.add("ledgermq_dledger_append_errors_total", counts.get(kind, 0), type=kind)
        out.add("ledgermq_dledger_ticks_dropped_total", counts.get("ticks_dropped", 0))
        for reason, key in _PEER_DROPS:
            out.add("ledgermq_dledger_peer_messages_dropped_total", counts.get(key, 0), reason=reason)
        stats = getattr(bs.replica.transport, "stats", None)
        if stats is not None:  # (the in-memory transport keeps none)
            ts = stats()
            for reason, value in (("rejected", ts.rejected_connections), ("capped", ts.capped_connections),
                                  ("failed", ts.failed_connections)):
                out.add("ledgermq_dledger_peer_connections_refused_total", value, reason=reason)
            out.add("ledgermq_dledger_peer_unfinished_frame_bytes", ts.unfinished_bytes)


def _request_code_name(code: int) -> str:
    """RocketMQ 5's request_code label: the RequestCode's name, lower case."""
    try:
        return RequestCode(code).name.lower()
    except ValueError:
        return "other"


def _code_name(code: int) -> str:
    """RocketMQ 5's response_code label: the ResponseCode's name, lower case."""
    try:
        return ResponseCode(code).name.lower()
    except ValueError:
        return str(code)


def _store_time_at(engine, cq, offset: int) -> int | None:
    """Store time (ms) of the message at a queue offset, None when it cannot
    be read (deleted meanwhile, not dispatched yet)."""
    try:
        unit = cq.get_unit(offset)
        return engine.store_timestamp_of(unit.phy, unit.size)
    except (OSError, ValueError, IndexError, struct.error, LookupError):
        return None


def remoting_families(server: ServedConnections, base: dict):
    """RemotingServer.hostile_metrics() as families (one per name)."""
    families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
    for kind, name, doc, extra, value in server.hostile_metrics():
        family = families.get(name)
        if family is None:
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = families[name] = cls(name, doc, labels=[*base, *extra])
        family.add_metric([*base.values(), *extra.values()], float(value))
    yield from families.values()


_PEER_DROPS = (("undecodable", "peer_messages_undecodable"), ("refused", "peer_messages_refused"),
               ("failed", "peer_messages_failed"))


def registry_for(collector) -> CollectorRegistry:
    """A registry of `collector` and this process's own metrics (RSS, CPU,
    open files: process_*)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    ProcessCollector(registry=registry)
    return registry


async def serve_broker_metrics(metrics: BrokerMetrics, mcfg: MetricsConfig, default_host: str, *,
                               task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Sample the stats every SAMPLE_S; with metricsExporterType=PROM also
    serve /metrics.  started() gets the MetricsServer, or None when the
    endpoint is off."""
    async with trio.open_nursery() as nursery:
        server = None
        if mcfg.enabled:
            server = await nursery.start(serve_metrics, registry_for(metrics.collector()),
                                         mcfg.prom_host or default_host, mcfg.prom_port)
        task_status.started(server)
        while True:
            metrics.sample(metrics.stats.clock())
            await trio.sleep(S.SAMPLE_S)
