# Owns the catalogue of metric names: every family a broker serves (name,
# type, labels, where the name comes from, which nodes export it) and the
# names of rocketmq-exporter and RocketMQ 5 that are not served, with why.
# The broker's collector (broker/metrics.py) builds its families from these
# specs only, so the README's table (python -m tools.metrics_table) and a
# scrape cannot disagree: tests compare both with the catalogue.
#
# Scope, the rule that makes the stock queries add up:
#   MASTER  the group's data (puts, offsets, sizes, lag, clients): only the
#           writable master exports it.  Every member of a DLedger group
#           builds the same consume queues and holds the same replicated
#           offsets, so three members exporting them made
#           sum(rocketmq_producer_offset), sum(rocketmq_producer_tps) by
#           (cluster) and sum by (topic)(rate(rocketmq_messages_in_total))
#           three times the truth.  rocketmq-exporter's own rules and most
#           dashboards sum without a role selector, and the exporter itself
#           reads only masters (brokerAddrs[MASTER_ID]); a label would need
#           every query rewritten.  A follower's series go stale within a
#           scrape of it losing the role, the new master's appear at once.
#   NODE    what each process does or has (latency of the requests it
#           answered, pulls it served, its disk, its Raft state): every
#           node exports it, and a sum over nodes is the true total because
#           no request or byte is counted on two nodes.
import attrs

EXPORTER, ROCKETMQ5, LEDGERMQ, PROCESS = "rocketmq-exporter", "RocketMQ 5", "ledgermq", "prometheus_client"
MASTER, NODE = "master", "node"
COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

BASE = ("cluster", "broker")
# RocketMQ 5's common attributes (BrokerMetricsManager.newAttributesBuilder),
# plus `broker` so one dashboard variable selects both name sets.
RMQ5 = ("cluster", "node_type", "node_id", "broker")
# The exporter's BROKER_RUNTIME_METRIC_LABEL_NAMES, plus `broker`.
RUNTIME = ("cluster", "brokerIP", "brokerHost", "des", "boottime", "broker_version", "broker")


@attrs.frozen(kw_only=True)
class Spec:
    name: str  # as exposed (counters end in _total)
    kind: str
    labels: tuple[str, ...]
    origin: str
    scope: str
    doc: str

    @property
    def family_name(self) -> str:
        """The name given to prometheus_client (which adds _total to counters)."""
        return self.name.removesuffix("_total") if self.kind == COUNTER else self.name


def _s(name, kind, labels, origin, scope, doc) -> Spec:
    return Spec(name=name, kind=kind, labels=tuple(labels), origin=origin, scope=scope, doc=doc)


_RUNTIME_GAUGES = (
    ("msg_put_total_today_now", MASTER, "messages put since the broker started (no day boundary is kept)"),
    ("msg_gettotal_today_now", NODE, "messages this node served to pulls since it started"),
    ("put_message_size_total", MASTER, "bytes put since the broker started"),
    ("put_message_average_size", MASTER, "bytes put / messages put since the broker started"),
    ("put_tps10", MASTER, "messages put per second over the last 10 s"),
    ("put_tps60", MASTER, "... over the last minute"),
    ("put_tps600", MASTER, "... over the last 10 minutes"),
    ("gettotal_tps10", NODE, "messages this node served per second over the last 10 s"),
    ("gettotal_tps60", NODE, "... over the last minute"),
    ("gettotal_tps600", NODE, "... over the last 10 minutes"),
    ("dispatch_behind_bytes", NODE, "committed commitlog bytes not yet in the consume queues"),
    ("commitlog_maxoffset", NODE, "end of the local commitlog (bytes)"),
    ("commitlog_minoffset", NODE, "start of the local commitlog after retention (bytes)"),
    ("commitlog_disk_ratio", NODE, "used fraction of the disk holding the store"),
    ("consumequeue_disk_ratio", NODE, "used fraction of the disk holding the consume queues (the same disk)"),
    ("commitlogdir_capacity_total", NODE, "bytes of the disk holding the store"),
    ("commitlogdir_capacity_free", NODE, "free bytes of that disk"),
    ("start_accept_sendrequest_time", NODE, "when this process started accepting requests (ms)"),
    ("put_latency_99", NODE, "send latency p99 (ms) since start, a bucket's upper bound"),
    ("put_latency_999", NODE, "send latency p99.9 (ms) since start, a bucket's upper bound"),
)
# PutMessageDistributeTime bands, from the send latency buckets (seconds).
PMDT_BANDS = (("0ms", 0.0, 0.001), ("0to10ms", 0.001, 0.01), ("10to50ms", 0.01, 0.05),
              ("50to100ms", 0.05, 0.1), ("100to200ms", 0.1, 0.2), ("200to500ms", 0.2, 0.5),
              ("500to1s", 0.5, 1.0), ("1to2s", 1.0, 2.0), ("2to3s", 2.0, 3.0), ("3to4s", 3.0, 4.0),
              ("4to5s", 4.0, 5.0), ("5to10s", 5.0, 10.0), ("10stomore", 10.0, None))

GROUP_DIFF = ("group", "topic", "countOfOnlineConsumers", "msgModel")
LAG5 = RMQ5 + ("topic", "consumer_group", "is_retry", "is_system")

SERVED: tuple[Spec, ...] = (
    # --- rocketmq-exporter: the group's puts and offsets (master)
    _s("rocketmq_producer_offset", GAUGE, BASE + ("topic",), EXPORTER, MASTER,
       "TopicOffset: sum of the max offsets of the topic's consume queues"),
    _s("rocketmq_topic_retry_offset", GAUGE, BASE + ("topic",), EXPORTER, MASTER,
       "the same for %RETRY%<group> topics"),
    _s("rocketmq_topic_dlq_offset", GAUGE, BASE + ("group",), EXPORTER, MASTER,
       "the same for %DLQ%<group> topics, labelled with the group"),
    _s("rocketmq_producer_tps", GAUGE, BASE + ("topic",), EXPORTER, MASTER,
       "TopicPutNums: messages put per second over the last minute"),
    _s("rocketmq_producer_message_size", GAUGE, BASE + ("topic",), EXPORTER, MASTER,
       "TopicPutMessageSize: bytes put per second over the last minute"),
    _s("rocketmq_broker_tps", GAUGE, ("cluster", "brokerIP", "broker"), EXPORTER, MASTER,
       "BrokerPutNums: all puts per second over the last minute"),
    _s("rocketmq_consumer_offset", GAUGE, BASE + ("topic", "group"), EXPORTER, MASTER,
       "GroupBrokerTotalOffset: sum of the group's committed offsets on the topic"),
    _s("rocketmq_group_diff", GAUGE, GROUP_DIFF, EXPORTER, MASTER,
       "messages the group has not consumed on the topic (clustering groups: msgModel 1, the ordinal)"),
    _s("rocketmq_group_retrydiff", GAUGE, GROUP_DIFF, EXPORTER, MASTER,
       "the same on the group's %RETRY% topic"),
    _s("rocketmq_group_dlqdiff", GAUGE, GROUP_DIFF, EXPORTER, MASTER,
       "the same on the group's %DLQ% topic"),
    _s("rocketmq_group_get_latency_by_storetime", GAUGE, BASE + ("topic", "group"), EXPORTER, MASTER,
       "ms from the store time of the oldest message the group has not consumed to now (max over queues; "
       "0 when caught up)"),
    _s("rocketmq_message_accumulation", GAUGE, BASE + ("topic", "group", "queueid"), LEDGERMQ, MASTER,
       "consumer lag per queue: max offset - committed offset"),
    _s("rocketmq_group_count", GAUGE, ("caddr", "localaddr", "group"), EXPORTER, MASTER,
       "online consumers of the group (their addresses, comma separated)"),
    _s("rocketmq_producer_count", GAUGE, BASE + ("group",), EXPORTER, MASTER,
       "online producer instances of the group"),
    *(_s(f"rocketmq_brokeruntime_{n}", GAUGE, RUNTIME, EXPORTER, scope, doc) for n, scope, doc in _RUNTIME_GAUGES),
    *(_s(f"rocketmq_brokeruntime_pmdt_{band}", GAUGE, RUNTIME, EXPORTER, NODE,
         f"PutMessageDistributeTime: sends answered in {band} since start") for band, _, _ in PMDT_BANDS),
    # --- rocketmq-exporter: what each node served (node)
    _s("rocketmq_consumer_tps", GAUGE, BASE + ("topic", "group"), EXPORTER, NODE,
       "GroupGetNums: messages this node served to the group per second over the last minute"),
    _s("rocketmq_consumer_message_size", GAUGE, BASE + ("topic", "group"), EXPORTER, NODE,
       "GroupGetSize: bytes this node served to the group per second over the last minute"),
    _s("rocketmq_broker_qps", GAUGE, ("cluster", "brokerIP", "broker"), EXPORTER, NODE,
       "BrokerGetNums: messages this node served per second over the last minute"),
    # --- RocketMQ 5 (master: the group's data)
    _s("rocketmq_messages_in_total", COUNTER, RMQ5 + ("topic", "message_type", "is_system"), ROCKETMQ5, MASTER,
       "messages put since the broker started (message_type from the topic: transaction for the half topic, "
       "delay for the schedule and timer topics, else normal)"),
    _s("rocketmq_throughput_in_total", COUNTER, RMQ5 + ("topic", "message_type", "is_system"), ROCKETMQ5, MASTER,
       "bytes put (stored size) since the broker started"),
    _s("rocketmq_message_size", HISTOGRAM, RMQ5 + ("topic", "message_type"), ROCKETMQ5, MASTER,
       "stored size of the messages put, bytes (buckets 1 KiB, 4 KiB, 512 KiB, 1, 2, 4 MiB)"),
    _s("rocketmq_consumer_lag_messages", GAUGE, LAG5, ROCKETMQ5, MASTER,
       "messages the group has not consumed (max offset - committed offset, summed over queues)"),
    _s("rocketmq_consumer_lag_latency", GAUGE, LAG5, ROCKETMQ5, MASTER,
       "ms since the store time of the oldest unconsumed message (max over queues)"),
    _s("rocketmq_send_to_dlq_messages_total", COUNTER, RMQ5 + ("topic", "consumer_group", "is_retry", "is_system"),
       ROCKETMQ5, MASTER, "messages put to the group's %DLQ% topic since the broker started (topic: the DLQ topic)"),
    _s("rocketmq_producer_connections", GAUGE, RMQ5 + ("language", "version"), ROCKETMQ5, MASTER,
       "online producer connections"),
    _s("rocketmq_consumer_connections", GAUGE, RMQ5 + ("consumer_group", "language", "version", "consume_mode"),
       ROCKETMQ5, MASTER, "online consumer connections"),
    # --- RocketMQ 5 (node)
    _s("rocketmq_messages_out_total", COUNTER, RMQ5 + ("topic", "consumer_group", "is_retry", "is_system"),
       ROCKETMQ5, NODE, "messages this node served to pulls"),
    _s("rocketmq_throughput_out_total", COUNTER, RMQ5 + ("topic", "consumer_group", "is_retry", "is_system"),
       ROCKETMQ5, NODE, "bytes this node served to pulls"),
    _s("rocketmq_rpc_latency", HISTOGRAM, RMQ5 + ("protocol_type", "request_code", "response_code",
                                                   "is_long_polling", "result"), ROCKETMQ5, NODE,
       "ms from a request's arrival to its answer (buckets 1, 3, 5, 7, 10, 100, 1000, 2000, 3000): "
       "send_message (every send code, per burst, response_code all) and pull_message by response code"),
    _s("rocketmq_broker_permission", GAUGE, RMQ5, ROCKETMQ5, NODE, "brokerPermission (6 read-write)"),
    _s("rocketmq_storage_size", GAUGE, RMQ5 + ("storage_type",), ROCKETMQ5, NODE,
       "bytes of the store on disk (commitlog and consume queues)"),
    _s("rocketmq_storage_dispatch_behind_bytes", GAUGE, RMQ5 + ("storage_type",), ROCKETMQ5, NODE,
       "committed commitlog bytes not yet dispatched to the consume queues"),
    # --- ledgermq's own
    _s("ledgermq_send_latency_seconds", HISTOGRAM, BASE, LEDGERMQ, NODE,
       "a send burst's arrival to its answer, after the quorum commit, weighted by its messages"),
    _s("ledgermq_pull_latency_seconds", HISTOGRAM, BASE, LEDGERMQ, NODE,
       "pulls that found messages, arrival to answer, long-polling holds included"),
    _s("ledgermq_consume_latency_by_storetime_seconds", HISTOGRAM, BASE + ("topic", "consumer_group"), LEDGERMQ,
       NODE, "group consumption by store time: from a pulled message's store time to the pull's answer "
       "(the first message of each pull, weighted by the messages it returned)"),
    _s("ledgermq_dledger_role", GAUGE, BASE + ("role",), LEDGERMQ, NODE, "1 for this node's Raft role"),
    _s("ledgermq_dledger_writable", GAUGE, BASE, LEDGERMQ, NODE, "1 on the writable master"),
    _s("ledgermq_dledger_term", GAUGE, BASE, LEDGERMQ, NODE, "current Raft term"),
    _s("ledgermq_dledger_elections_total", COUNTER, BASE, LEDGERMQ, NODE, "terms begun since the process started"),
    _s("ledgermq_dledger_committed_index", GAUGE, BASE, LEDGERMQ, NODE, "Raft commit index"),
    _s("ledgermq_dledger_end_index", GAUGE, BASE, LEDGERMQ, NODE, "last index of the local log"),
    _s("ledgermq_dledger_peer_match_lag_entries", GAUGE, BASE + ("peer",), LEDGERMQ, NODE,
       "on the leader: entries a peer is behind the leader's log end"),
    _s("ledgermq_dledger_peer_last_ack_age_seconds", GAUGE, BASE + ("peer",), LEDGERMQ, NODE,
       "on the leader: since the peer last acknowledged"),
    _s("ledgermq_dledger_append_errors_total", COUNTER, BASE + ("type",), LEDGERMQ, NODE,
       "pending_full, quorum_timeout, refused_appends"),
    _s("ledgermq_dledger_ticks_dropped_total", COUNTER, BASE, LEDGERMQ, NODE,
       "Raft clock ticks (10 ms) missed while the process could not run (stopped, starved) and dropped rather "
       "than replayed: how long it stalled"),
    _s("ledgermq_dledger_peer_messages_dropped_total", COUNTER, BASE + ("reason",), LEDGERMQ, NODE,
       "peer messages dropped before the Raft core: undecodable, refused (admission: wrong sender or "
       "destination, a term or index out of range, a malformed push) or failed (the Raft core raised; the message "
       "dropped and the core rebuilt from disk). Non-zero means someone other than a healthy member speaks on the "
       "peer port"),
    _s("ledgermq_dledger_peer_connections_refused_total", COUNTER, BASE + ("reason",), LEDGERMQ, NODE,
       "peer-port connections closed: rejected at the handshake (garbage, wrong group or id, a failed proof, an "
       "oversized handshake frame), capped (too many handshakes at once) or failed (an unexpected error, logged "
       "with its traceback)"),
    _s("ledgermq_dledger_peer_unfinished_frame_bytes", GAUGE, BASE, LEDGERMQ, NODE,
       "bytes of peer frames begun and not yet complete (bounded by the peer transport's receive budget)"),
    _s("ledgermq_dispatch_lag_bytes", GAUGE, BASE, LEDGERMQ, NODE,
       "committed commitlog bytes not yet in the consume queues"),
    _s("ledgermq_remoting_connections", GAUGE, BASE, LEDGERMQ, NODE, "open remoting connections"),
    _s("ledgermq_pull_held", GAUGE, BASE, LEDGERMQ, NODE, "pulls held (long polling) right now"),
    _s("ledgermq_pull_hold_refused_total", COUNTER, BASE + ("budget",), LEDGERMQ, NODE,
       "pulls answered SYSTEM_BUSY instead of held, by the budget that was full"),
    _s("ledgermq_send_forward_held", GAUGE, BASE, LEDGERMQ, NODE,
       "sends held or being handed on to the master right now (at most sendForwardMaxInFlight)"),
    _s("ledgermq_send_forward_total", COUNTER, BASE + ("outcome",), LEDGERMQ, NODE,
       "sends this broker could not store itself (a master that stepped down, a leader catching up or "
       "transferring; see \"Planned operations\"): forwarded to the master, served_here once it was master again, "
       "forward_failed, refused_budget, refused_hold_timeout (logged, with the leader and whether its broker "
       "address is known), refused_no_master (a node removed from the group that does not know the master's "
       "address)"),
)

# Families whose names and labels come from another owner (the remoting
# server's hostile_metrics(), prometheus_client's ProcessCollector): served
# on every node, listed by prefix in the table.
FOREIGN_PREFIXES = (("ledgermq_remoting_", "the remoting server's containment and budgets (`RemotingServer."
                     "hostile_metrics`)"),
                    ("process_", "this process (prometheus_client's ProcessCollector): "
                     "`process_resident_memory_bytes`, `process_cpu_seconds_total`, `process_open_fds`, ..."))

BY_NAME = {s.name: s for s in SERVED}

# rocketmq-exporter names that are not served, and why.
_CLIENT = "the exporter asks each online consumer (GET_CONSUMER_RUNNING_INFO) for its own statistics; a " \
          "broker cannot see them"
_POOL = "ledgermq has no broker thread pools: one trio loop serves every request"
EXPORTER_NOT_SERVED: dict[str, str] = {
    "rocketmq_client_consume_fail_msg_count": _CLIENT,
    "rocketmq_client_consume_fail_msg_tps": _CLIENT,
    "rocketmq_client_consume_ok_msg_tps": _CLIENT,
    "rocketmq_client_consume_rt": _CLIENT,
    "rocketmq_client_consumer_pull_rt": _CLIENT,
    "rocketmq_client_consumer_pull_tps": _CLIENT,
    "rocketmq_group_consume_tps": "the exporter declares it and never fills it (its only add call is commented out)",
    "rocketmq_group_consume_total_offset": "the exporter declares it and never fills it",
    "rocketmq_send_back_nums": "CONSUMER_SEND_MSG_BACK is not counted per group yet (broker/processors owns it); "
                               "rocketmq_topic_retry_offset shows what came back",
    "rocketmq_broker_commitlog_diff": "master-slave replication lag in bytes; a DLedger group exports "
                                      "ledgermq_dledger_peer_match_lag_entries instead",
    "rocketmq_brokeruntime_send_threadpool_queue_size": _POOL,
    "rocketmq_brokeruntime_send_threadpoolqueue_capacity": _POOL,
    "rocketmq_brokeruntime_send_threadpoolqueue_headwait_timemills": _POOL,
    "rocketmq_brokeruntime_pull_threadpoolqueue_size": _POOL,
    "rocketmq_brokeruntime_pull_threadpoolqueue_capacity": _POOL,
    "rocketmq_brokeruntime_pull_threadpoolqueue_headwait_timemills": _POOL,
    "rocketmq_brokeruntime_query_threadpoolqueue_size": _POOL,
    "rocketmq_brokeruntime_query_threadpool_queue_capacity": _POOL,
    "rocketmq_brokeruntime_query_threadpoolqueue_headwait_timemills": _POOL,
    "rocketmq_brokeruntime_remain_transientstore_buffer_numbs": "no transient store pool (transientStorePoolEnable)",
    "rocketmq_brokeruntime_pagecache_lock_time_mills": "no page-cache put lock",
    "rocketmq_brokeruntime_dispatch_maxbuffer": "no reput buffer",
    "rocketmq_brokeruntime_remain_howmanydata_toflush": "the flush position is not kept apart from the "
                                                        "written one (SYNC_FLUSH: 0; ASYNC_FLUSH: at most 10 ms)",
    "rocketmq_brokeruntime_putmessage_entire_time_max": "not kept; see ledgermq_send_latency_seconds",
    "rocketmq_brokeruntime_getmessage_entire_time_max": "not kept; see ledgermq_pull_latency_seconds",
    "rocketmq_brokeruntime_putmessage_times_total": "the same as rocketmq_brokeruntime_msg_put_total_today_now "
                                                    "for a broker without batches; not kept apart",
    "rocketmq_brokeruntime_getfound_tps10": "found and missed gets are not counted apart; see gettotal_tps*",
    "rocketmq_brokeruntime_getfound_tps60": "found and missed gets are not counted apart",
    "rocketmq_brokeruntime_getfound_tps600": "found and missed gets are not counted apart",
    "rocketmq_brokeruntime_getmiss_tps10": "found and missed gets are not counted apart",
    "rocketmq_brokeruntime_getmiss_tps60": "found and missed gets are not counted apart",
    "rocketmq_brokeruntime_getmiss_tps600": "found and missed gets are not counted apart",
    "rocketmq_brokeruntime_gettransfered_tps10": "the same as gettotal_tps* here; not kept apart",
    "rocketmq_brokeruntime_gettransfered_tps60": "the same as gettotal_tps* here; not kept apart",
    "rocketmq_brokeruntime_gettransfered_tps600": "the same as gettotal_tps* here; not kept apart",
    "rocketmq_brokeruntime_earliest_message_timestamp": "not read at scrape time: it would read one message per "
                                                        "consume queue",
    "rocketmq_brokeruntime_msg_gettotal_yesterdaymorning": "no day boundaries are kept (counted since start)",
    "rocketmq_brokeruntime_msg_puttotal_yesterdaymorning": "no day boundaries are kept (counted since start)",
    "rocketmq_brokeruntime_msg_gettotal_todaymorning": "no day boundaries are kept (counted since start)",
    "rocketmq_brokeruntime_msg_puttotal_todaymorning": "no day boundaries are kept (counted since start)",
}

# RocketMQ 5's names (BrokerMetricsConstant, RemotingMetricsConstant,
# DefaultStoreMetricsConstant, the SDKs' ClientMetricsConstant; RocksDB's
# left out) that are not served.
ROCKETMQ5_NOT_SERVED: dict[str, str] = {
    "rocketmq_processor_watermark": _POOL,
    "rocketmq_consumer_inflight_messages": "the broker does not keep each group's pull offset apart from its "
                                           "committed one",
    "rocketmq_consumer_queueing_latency": "needs the pull offset too (see inflight)",
    "rocketmq_consumer_ready_messages": "needs the pull offset too (see inflight); lag_messages is ready + inflight",
    "rocketmq_commit_messages_total": "transaction ends are not counted yet (broker/processors owns them)",
    "rocketmq_rollback_messages_total": "transaction ends are not counted yet",
    "rocketmq_finish_message_latency": "transaction ends are not timed yet",
    "rocketmq_half_messages": "not counted yet",
    "rocketmq_storage_message_reserve_time": "not read at scrape time: it would read one message per consume "
                                             "queue",
    "rocketmq_storage_flush_behind_bytes": "the flush position is not kept apart from the written one",
    "rocketmq_timer_enqueue_lag": "the timer service (broker/store) exports nothing yet",
    "rocketmq_timer_enqueue_latency": "the timer service exports nothing yet",
    "rocketmq_timer_dequeue_lag": "the timer service exports nothing yet",
    "rocketmq_timer_dequeue_latency": "the timer service exports nothing yet",
    "rocketmq_timing_messages": "the timer service exports nothing yet",
    "rocketmq_timer_enqueue_total": "the timer service exports nothing yet",
    "rocketmq_timer_dequeue_total": "the timer service exports nothing yet",
    "rocketmq_timer_message_snapshot": "the timer service exports nothing yet",
    "rocketmq_delay_message_latency": "delay-level messages are not timed yet",
    # The RocketMQ 5 SDKs' own metrics (ClientMeterManager; labels topic, consumer_group, client_id,
    # invocation_status): a client measures and exports them, not a broker.
    "rocketmq_send_cost_time": "measured by the producer SDK (invocation_status success/failure), not a broker",
    "rocketmq_delivery_latency": "measured by the consumer SDK, not a broker",
    "rocketmq_await_time": "measured by the consumer SDK, not a broker",
    "rocketmq_process_time": "measured by the consumer SDK (invocation_status), not a broker",
}


def served_names(origin: str) -> list[str]:
    return [s.name for s in SERVED if s.origin == origin]
