# Owns the name server's metrics: a prometheus_client collector over the
# running NameServer (requests served by code and client language, brokers
# per cluster, topics, open connections, and what the remoting server
# counts against hostile input: failures contained, connections shed,
# unfinished frame bytes), served with the process's own
# metrics (RSS, CPU: process_*) when namesrv.conf says
# metricsExporterType=PROM (the broker's keys, read the same way).
import collections
from typing import Iterable, Protocol, Sized

import attrs
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from broker.namesrv.routes import RouteInfoManager
from broker.remoting.codes import RequestCode


def _code_name(code: int) -> str:
    try:
        return RequestCode(code).name
    except ValueError:
        return str(code)


class CountedServer(Protocol):
    """What the collector reads of the remoting server (broker.remoting.server.RemotingServer)."""

    connections: Sized

    def hostile_metrics(self) -> Iterable[tuple[str, str, str, dict, float]]: ...


class CountedNameServer(Protocol):
    """What the collector reads of the name server (broker.namesrv.service.NameServer)."""

    request_counts: collections.Counter[tuple[int, str]]  # (request code, client language) -> requests
    routes: RouteInfoManager
    server: CountedServer | None


@attrs.define(eq=False)
class NamesrvCollector:
    ns: CountedNameServer

    def describe(self):
        return []

    def collect(self):
        ns = self.ns
        requests = CounterMetricFamily("ledgermq_namesrv_requests", "Requests served, by request code and "
                                       "client language", labels=["code", "language"])
        for (code, language), n in sorted(ns.request_counts.items()):
            requests.add_metric([_code_name(code), language], n)
        yield requests
        routes = ns.routes
        brokers = GaugeMetricFamily("ledgermq_namesrv_brokers", "Live broker registrations (one per broker "
                                    "address), by cluster", labels=["cluster"])
        live_by_cluster: dict[str, int] = {}
        for cluster, names in routes.cluster_addr_table.items():
            live_by_cluster[cluster] = sum(len(routes.broker_addr_table[n].broker_addrs)
                                           for n in names if n in routes.broker_addr_table)
        for cluster, n in sorted(live_by_cluster.items()):
            brokers.add_metric([cluster], n)
        yield brokers
        topics = GaugeMetricFamily("ledgermq_namesrv_topics", "Topics with a route")
        topics.add_metric([], len(routes.topic_queue_table))
        yield topics
        conns = GaugeMetricFamily("ledgermq_remoting_connections", "Open remoting connections")
        conns.add_metric([], len(ns.server.connections) if ns.server is not None else 0)
        yield conns
        if ns.server is not None:  # containment and budgets against hostile input
            families: dict = {}
            for kind, name, doc, extra, value in ns.server.hostile_metrics():
                family = families.get(name)
                if family is None:
                    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                    family = families[name] = cls(name, doc, labels=list(extra))
                family.add_metric(list(extra.values()), float(value))
            yield from families.values()


def namesrv_registry(ns: CountedNameServer) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NamesrvCollector(ns))
    ProcessCollector(registry=registry)
    return registry
