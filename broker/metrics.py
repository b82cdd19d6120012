# Owns the broker's metrics: what is counted where, and the collector that
# turns the broker's state into Prometheus families at scrape time.
#
# Counted without per-message work on the send path:
#   puts per topic      from the consume queues: messages = max offset moved
#                       since start, bytes = the sizes in the new CQ units
#                       (PutCounter reads them at sample/scrape time, off the
#                       send path, on every node alike)
#   send latency        MeteredSends wraps the send processor's bursts: one
#                       clock read at accept, one at the answer, ONE
#                       BucketCounter.observe per burst weighted by its size
#   gets per topic@group, pull latency
#                       MeteredPulls wraps PULL_MESSAGE: per pull request,
#                       messages = nextBeginOffset - queueOffset, bytes = body
#   lag per queue       the replicated consumer offsets vs the CQ max offsets
#   DLedger             ReplicaNode.status(); elections = terms started since
#                       this process started (each term is one election)
#   append errors       the replica's own counters by type
#   dispatch lag        committed position - dispatched position
#   connections, RSS    the remoting server; prometheus_client's
#                       ProcessCollector (process_resident_memory_bytes, ...)
#   hostile input       the remoting server's containment and budgets
#                       (connection failures, connections shed, unfinished
#                       frame bytes, rounds deferred: remoting_families) and
#                       the long polls held and refused
#
# serve_broker_metrics samples the StatsBook every SAMPLE_S (a timer: it
# feeds VIEW_BROKER_STATS_DATA and the TPS gauges) and, with
# metricsExporterType=PROM, serves the endpoint.  Names: rocketmq-exporter's
# where it has one (rocketmq_producer_tps, rocketmq_consumer_offset,
# rocketmq_message_accumulation, ...), RocketMQ 5's counters
# (rocketmq_messages_in_total, rocketmq_throughput_in_total, ...), and
# ledgermq_* for what RocketMQ has no name for (DLedger, dispatch).
import struct
import sys
import time
from array import array

import attrs
import trio
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from broker.config import LiveConfig
from broker.metadata.records import is_internal_topic
from broker.metadata.tables import split_offset_key
from broker.processors.admin import disk_ratio
from broker.remoting.answers import BurstAnswers, as_answers
from broker.remoting.codec import request_count
from broker.remoting.codes import ResponseCode
from broker.store.broker_store import BrokerStore
from broker.telemetry import stats as S
from broker.telemetry.buckets import BucketCounter
from broker.telemetry.exporter import MetricsConfig, serve_metrics
from consumequeue.service import positions

CQ_UNIT = struct.Struct(">qiq")  # phy offset, size, tags code (spec §2)


def _size_sum(raw: bytes, n: int) -> int:
    """The message bytes of n consume queue units, without a Python step
    per unit (this runs over every message put): a unit is five big-endian
    int32 words, the size its third."""
    words = array("i", raw[:n * CQ_UNIT.size])
    if sys.byteorder == "little":
        words.byteswap()
    sizes = words[2::5]
    total = sum(sizes)
    return total if min(sizes, default=0) >= 0 else sum(s for s in sizes if s > 0)
READ_UNITS = 8192  # CQ units read per queue per pass


@attrs.define(eq=False)
class PutCounter:
    """Messages and bytes put per topic since start, from the consume queues."""

    cqs: object  # ConsumeQueueStore
    cursor: dict = attrs.Factory(dict)  # (topic, qid) -> next unit to count
    messages: dict = attrs.Factory(dict)  # topic -> messages
    bytes: dict = attrs.Factory(dict)  # topic -> bytes

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
                self.bytes[topic] = self.bytes.get(topic, 0) + _size_sum(raw, n)
                self.messages[topic] = self.messages.get(topic, 0) + n
                pos += n
            self.cursor[key] = pos


@attrs.define(eq=False)
class MeteredSends:
    """The send processor's bursts, timed: registered for its codes in its
    place (broker/server.py), it hands every burst on unchanged."""

    inner: object  # SendProcessor
    latency: BucketCounter = attrs.Factory(BucketCounter)
    bursts: int = 0
    clock: object = time.perf_counter

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
class MeteredPulls:
    """PULL_MESSAGE, timed and counted per topic@group (a held pull when it
    is answered: the processor calls back)."""

    inner: object  # PullProcessor
    latency: BucketCounter = attrs.Factory(BucketCounter)
    gets: dict = attrs.Factory(dict)  # (topic, group) -> [messages, bytes, pulls that found some]
    clock: object = time.perf_counter

    def register(self, dispatcher) -> None:
        for code in self.inner.CODES:
            dispatcher.register(code, self)

    async def __call__(self, conn, request):
        t0 = self.clock()
        f = request.ext_fields
        # (the callback of a held pull keeps these, not the request)
        key, offset = (f.get("topic", ""), f.get("consumerGroup", "")), f.get("queueOffset")
        response = await self.inner(conn, request, lambda late: self._count(key, offset, late, t0))
        if response is not None:
            self._count(key, offset, response, t0)
        return response

    def _count(self, key: tuple[str, str], offset, response, t0: float) -> None:
        if response.code != ResponseCode.SUCCESS:
            return
        self.latency.observe(self.clock() - t0)
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


@attrs.define(eq=False)
class BrokerMetrics:
    """Everything the broker's collector and stats read (built by serve_broker)."""

    config: LiveConfig
    store: BrokerStore
    server: object  # RemotingServer: open connections
    sends: MeteredSends
    pulls: MeteredPulls
    stats: S.StatsBook
    puts: PutCounter = attrs.field(init=False)
    start_term: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.puts = PutCounter(self.store.cq.engine.cqs)
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


def _histogram(name: str, doc: str, labels: dict, bc: BucketCounter) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), bc.cumulative(), bc.total)
    return family


@attrs.define(eq=False)
class BrokerCollector:
    """A prometheus_client collector over BrokerMetrics (runs at scrape time,
    in the trio thread: see broker/telemetry/exporter.py)."""

    m: BrokerMetrics

    def describe(self):
        return []  # unchecked collector: the families depend on the topics

    def collect(self):
        m, cfg = self.m, self.m.config.current
        bs = m.store
        base = {"cluster": cfg.broker_cluster_name, "broker": cfg.broker_name}
        bl, bv = list(base), list(base.values())
        m.refresh()
        m.puts.update()

        # --- puts per topic
        offset = GaugeMetricFamily("rocketmq_producer_offset", "TopicOffset: sum of the max offsets of the "
                                   "topic's consume queues", labels=bl + ["topic"])
        by_topic: dict[str, int] = {}
        for (topic, _), cq in list(bs.cq.engine.cqs.queues.items()):
            if not is_internal_topic(topic):
                by_topic[topic] = by_topic.get(topic, 0) + cq.max_offset
        for topic, n in sorted(by_topic.items()):
            offset.add_metric(bv + [topic], n)
        yield offset
        msgs_in = CounterMetricFamily("rocketmq_messages_in", "Messages put, per topic, since the broker started",
                                      labels=bl + ["topic"])
        bytes_in = CounterMetricFamily("rocketmq_throughput_in", "Bytes put (stored size), per topic, since the "
                                       "broker started", labels=bl + ["topic"])
        tps = GaugeMetricFamily("rocketmq_producer_tps", "TopicPutNums per second over the last minute",
                                labels=bl + ["topic"])
        size = GaugeMetricFamily("rocketmq_producer_message_size", "TopicPutMessageSize: bytes put per second "
                                 "over the last minute", labels=bl + ["topic"])
        for topic in sorted(m.puts.messages):
            msgs_in.add_metric(bv + [topic], m.puts.messages[topic])
            bytes_in.add_metric(bv + [topic], m.puts.bytes.get(topic, 0))
            item = m.stats.get(S.TOPIC_PUT_NUMS, topic)
            tps.add_metric(bv + [topic], item.rate(60) if item else 0.0)
            item = m.stats.get(S.TOPIC_PUT_SIZE, topic)
            size.add_metric(bv + [topic], item.rate(60) if item else 0.0)
        yield from (msgs_in, bytes_in, tps, size)

        # --- gets per topic@group
        gl = bl + ["topic", "group"]
        msgs_out = CounterMetricFamily("rocketmq_messages_out", "Messages pulled, per topic and group",
                                       labels=gl)
        bytes_out = CounterMetricFamily("rocketmq_throughput_out", "Bytes pulled, per topic and group",
                                        labels=gl)
        ctps = GaugeMetricFamily("rocketmq_consumer_tps", "GroupGetNums per second over the last minute", labels=gl)
        for (topic, group), (n, nbytes, _) in sorted(m.pulls.gets.items()):
            msgs_out.add_metric(bv + [topic, group], n)
            bytes_out.add_metric(bv + [topic, group], nbytes)
            item = m.stats.get(S.GROUP_GET_NUMS, f"{topic}@{group}")
            ctps.add_metric(bv + [topic, group], item.rate(60) if item else 0.0)
        yield from (msgs_out, bytes_out, ctps)
        put_all = m.stats.get(S.BROKER_PUT_NUMS, cfg.broker_cluster_name)
        get_all = m.stats.get(S.BROKER_GET_NUMS, cfg.broker_cluster_name)
        yield _gauge("rocketmq_broker_tps", "BrokerPutNums per second over the last minute", base,
                     put_all.rate(60) if put_all else 0.0)
        yield _gauge("rocketmq_broker_qps", "BrokerGetNums per second over the last minute", base,
                     get_all.rate(60) if get_all else 0.0)

        # --- consumer offsets and lag per queue
        consumer_offset = GaugeMetricFamily("rocketmq_consumer_offset", "GroupOffset: sum of the group's "
                                            "committed offsets on the topic", labels=gl)
        lag = GaugeMetricFamily("rocketmq_message_accumulation", "Messages the group has not consumed yet "
                                "(max offset - committed offset), per queue", labels=gl + ["queueid"])
        cqs = bs.cq.engine.cqs
        for key, table in sorted(bs.metadata.state.offsets.offsets.items()):
            topic, group = split_offset_key(key)
            total = 0
            for qid, committed in sorted(table.items()):
                cq = cqs.get(topic, qid)
                max_offset = cq.max_offset if cq is not None else 0
                lag.add_metric(bv + [topic, group, str(qid)], max(0, max_offset - max(committed, 0)))
                total += max(committed, 0)
            consumer_offset.add_metric(bv + [topic, group], total)
        yield from (consumer_offset, lag)

        # --- latency
        yield _histogram("ledgermq_send_latency_seconds", "From a send burst's arrival to its answer (after "
                         "the quorum commit), weighted by the burst's messages", base, m.sends.latency)
        yield _histogram("ledgermq_pull_latency_seconds", "PULL_MESSAGE requests that found messages, from "
                         "arrival to answer (long-polling holds included)", base, m.pulls.latency)

        # --- DLedger
        st = bs.replica.status()
        role = GaugeMetricFamily("ledgermq_dledger_role", "1 for this node's current Raft role",
                                 labels=bl + ["role"])
        for name in ("leader", "candidate", "follower"):
            role.add_metric(bv + [name], 1.0 if str(st.get("role", "")).lower() == name else 0.0)
        yield role
        yield _gauge("ledgermq_dledger_writable", "1 while this node is the writable master", base,
                     1.0 if bs.gate.writable else 0.0)
        term = int(st.get("term", bs.gate.term))
        yield _gauge("ledgermq_dledger_term", "Current Raft term", base, term)
        yield _counter("ledgermq_dledger_elections", "Elections (terms begun) since this process started", base,
                       max(0, term - m.start_term))
        yield _gauge("ledgermq_dledger_committed_index", "Raft commit index", base, st.get("committedIndex", -1))
        yield _gauge("ledgermq_dledger_end_index", "Last index of the local log", base, st.get("ledgerEndIndex", -1))
        match_lag = GaugeMetricFamily("ledgermq_dledger_peer_match_lag_entries", "Leader only: entries a peer "
                                      "is behind the leader's log end", labels=bl + ["peer"])
        ack_age = GaugeMetricFamily("ledgermq_dledger_peer_last_ack_age_seconds", "Leader only: time since the "
                                    "peer last acknowledged", labels=bl + ["peer"])
        for peer, p in sorted((st.get("peers") or {}).items()):
            match_lag.add_metric(bv + [peer], p.get("lag", 0))
            if p.get("lastAckMsAgo") is not None:
                ack_age.add_metric(bv + [peer], p["lastAckMsAgo"] / 1000)
        yield from (match_lag, ack_age)
        errors = CounterMetricFamily("ledgermq_dledger_append_errors", "Appends refused or failed, by type",
                                     labels=bl + ["type"])
        counts = st.get("stats") or {}
        for kind in ("pending_full", "quorum_timeout", "refused_appends"):
            errors.add_metric(bv + [kind], counts.get(kind, 0))
        yield errors
        stalled = CounterMetricFamily("ledgermq_dledger_ticks_dropped", "Raft clock ticks (10 ms) the process "
                                      "missed while it could not run (stopped, starved) and dropped", labels=bl)
        stalled.add_metric(bv, counts.get("ticks_dropped", 0))
        yield stalled
        yield from peer_port_families(counts, bs.replica.transport, bl, bv)

        # --- storage, dispatch, connections
        yield _gauge("rocketmq_brokeruntime_commitlog_disk_ratio", "Used fraction of the disk holding the store",
                     base, disk_ratio(cfg.store_path_root_dir))
        pos = positions(bs.store)
        yield _gauge("ledgermq_dispatch_lag_bytes", "Committed commitlog bytes not yet dispatched to the "
                     "consume queues", base, max(0, pos.committed_pos - bs.cq.engine.pos))
        yield _gauge("ledgermq_remoting_connections", "Open remoting connections (clients, tools, peers' "
                     "brokers)", base, len(m.server.connections))
        yield from remoting_families(m.server, base)

        # --- long polling
        holds = m.pulls.inner.holds.table
        yield _gauge("ledgermq_pull_held", "PULL_MESSAGE requests held (long polling) right now", base,
                     m.pulls.inner.held)
        refused = CounterMetricFamily("ledgermq_pull_hold_refused", "Pulls answered SYSTEM_BUSY instead of "
                                      "held: the budget (longPollingMaxHeld*) that was full", labels=bl + ["budget"])
        for budget, n in sorted(holds.refused.items()):
            refused.add_metric(bv + [budget], n)
        yield refused

        # --- sends this broker could not store (broker/processors/forward.py)
        fwd = m.sends.inner.forwarder
        if fwd is not None:
            yield _gauge("ledgermq_send_forward_held", "Sends held or being handed on to the master right now",
                         base, fwd.held)
            outcomes = CounterMetricFamily(
                "ledgermq_send_forward", "Sends this broker could not store itself (a master that stepped down, "
                "a leader catching up or transferring), by outcome", labels=bl + ["outcome"])
            for outcome, n in sorted(fwd.stats.items()):
                outcomes.add_metric(bv + [outcome], n)
            yield outcomes


def remoting_families(server, base: dict):
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


def peer_port_families(counts: dict, transport, labels: list[str], values: list[str]):
    """What the DLedger peer port turned away: peer messages dropped before
    the Raft core (commitlog/admission.py), by reason, and connections the
    peer transport closed, by reason (a transport without stats, such as the
    in-memory one, reports none)."""
    dropped = CounterMetricFamily("ledgermq_dledger_peer_messages_dropped", "Peer messages dropped before the "
                                  "Raft core: undecodable, refused by admission, or failed in the core",
                                  labels=labels + ["reason"])
    for reason, key in _PEER_DROPS:
        dropped.add_metric(values + [reason], counts.get(key, 0))
    yield dropped
    stats = getattr(transport, "stats", None)
    if stats is None:
        return
    ts = stats()
    closed = CounterMetricFamily("ledgermq_dledger_peer_connections_refused", "Peer-port connections closed: "
                                 "rejected at the handshake, capped (too many handshakes), or failed",
                                 labels=labels + ["reason"])
    for reason, value in (("rejected", ts.rejected_connections), ("capped", ts.capped_connections),
                          ("failed", ts.failed_connections)):
        closed.add_metric(values + [reason], value)
    yield closed
    yield _gauge("ledgermq_dledger_peer_unfinished_frame_bytes", "Bytes of peer frames begun and not yet complete",
                 dict(zip(labels, values)), ts.unfinished_bytes)


def _gauge(name: str, doc: str, labels: dict, value) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=list(labels))
    g.add_metric(list(labels.values()), float(value))
    return g


def _counter(name: str, doc: str, labels: dict, value) -> CounterMetricFamily:
    c = CounterMetricFamily(name, doc, labels=list(labels))
    c.add_metric(list(labels.values()), float(value))
    return c


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
