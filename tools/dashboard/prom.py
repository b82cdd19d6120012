# Owns reading a broker's Prometheus endpoint (metricsExporterType=PROM):
# where it is (from the broker's own config, GET_BROKER_CONFIG), one
# HTTP/1.0 GET of /metrics on trio, and the few figures the console shows
# from it -- resident memory, Raft append errors, and the send latency's
# p99 over the last interval, from two scrapes of the cumulative histogram
# (latency_quantile, pure).  A broker without the endpoint has none of them.
import math

import trio
from prometheus_client.parser import text_string_to_metric_families

SEND_LATENCY = "ledgermq_send_latency_seconds"


class ScrapeError(Exception):
    """The endpoint did not answer, or not with 200."""


def endpoint(config: dict[str, str], broker_addr: str) -> tuple[str, int] | None:
    """(host, port) of a broker's /metrics, or None when it exports none."""
    if config.get("metricsExporterType", "").upper() != "PROM":
        return None
    try:
        port = int(config.get("metricsPromExporterPort", ""))
    except ValueError:
        return None
    host = config.get("metricsPromExporterHost") or ""
    if host in ("", "0.0.0.0", "::"):  # every interface: the broker's own address reaches it
        host = broker_addr.rsplit(":", 1)[0]
    return (host, port) if port > 0 else None


async def scrape(host: str, port: int, timeout: float = 3.0) -> dict[str, list]:
    """{family name: [(sample name, labels, value)]} of one GET /metrics."""
    data = b""
    try:
        with trio.fail_after(timeout):
            stream = await trio.open_tcp_stream(host, port)
            async with stream:
                await stream.send_all(f"GET /metrics HTTP/1.0\r\nHost: {host}:{port}\r\n\r\n".encode())
                while chunk := await stream.receive_some(65536):
                    data += chunk
    except (OSError, trio.TooSlowError, trio.BrokenResourceError) as e:
        raise ScrapeError(f"{host}:{port}/metrics: {e or type(e).__name__}") from None
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode("latin-1")
    if " 200 " not in f"{status} ":
        raise ScrapeError(f"{host}:{port}/metrics answered {status or 'nothing'}")
    try:
        return {f.name: [(s.name, s.labels, s.value) for s in f.samples]
                for f in text_string_to_metric_families(body.decode("utf-8"))}
    except ValueError as e:
        raise ScrapeError(f"{host}:{port}/metrics: unreadable exposition: {e}") from None


def total(families: dict, family: str, sample: str | None = None) -> float | None:
    samples = [v for n, _, v in families.get(family, []) if sample is None or n == sample]
    return sum(samples) if samples else None


def buckets(families: dict, family: str) -> dict[float, float]:
    """{upper bound: cumulative count} of a histogram, summed over its labels."""
    out: dict[float, float] = {}
    for name, labels, value in families.get(family, []):
        if name == family + "_bucket":
            le = float(labels["le"])
            out[le] = out.get(le, 0.0) + value
    return out


def latency_quantile(prev: dict[float, float], cur: dict[float, float], q: float) -> float | None:
    """The upper bound of the bucket holding quantile q of what was observed
    between two scrapes of a cumulative histogram; None if nothing was (or
    the counters went back: a restarted broker)."""
    bounds = sorted(cur)
    diffs = [cur[b] - prev.get(b, 0.0) for b in bounds]
    if not diffs or diffs[-1] <= 0 or any(d < 0 for d in diffs):
        return None
    rank = q * diffs[-1]
    for bound, count in zip(bounds, diffs):
        if count >= rank:
            return None if math.isinf(bound) else bound
    return None
