# Owns the Prometheus endpoint: MetricsConfig (RocketMQ 5's broker.conf keys
# metricsExporterType / metricsPromExporterHost / metricsPromExporterPort,
# read the same way from namesrv.conf) and serve_metrics, a small HTTP/1.1
# server on trio that answers `GET /metrics` with the text exposition of a
# prometheus_client CollectorRegistry.
#
#   registry = CollectorRegistry()
#   registry.register(SomeCollector(...))
#   await nursery.start(serve_metrics, registry, "127.0.0.1", 5557)
#
# Why not prometheus_client.start_http_server: it runs a thread that calls
# the collectors concurrently with the trio loop, and our collectors read
# the broker's live state (consume queues, the replica), which only the
# loop's own thread may touch.  Here the collectors run in the loop, between
# two of its steps, with that state consistent.
#
# Off by default, as in RocketMQ (metricsExporterType=DISABLE); PROM turns it
# on.  OTLP_GRPC and LOG are RocketMQ types we do not implement: a warning,
# and no endpoint.
#
# Hostile input: a request head is read up to MAX_REQUEST_HEAD bytes within
# READ_TIMEOUT_S, at most MAX_CONNECTIONS are served at once (more are
# closed at once), and anything that goes wrong with one request -- a head
# that is not HTTP, a collector that raises -- is answered (400, 500) or
# closes that connection, logged and counted (MetricsServer.failures);
# the serving nursery never sees it.
import logging

import attrs
import trio
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger("ledgermq.metrics")

DEFAULT_PROM_PORT = 5557  # RocketMQ's metricsPromExporterPort
EXPORTER_TYPES = ("DISABLE", "PROM", "OTLP_GRPC", "LOG")
MAX_REQUEST_HEAD = 8192
READ_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 64

# broker.conf / namesrv.conf key -> MetricsConfig field
METRICS_KEYS = ("metricsExporterType", "metricsPromExporterHost", "metricsPromExporterPort")


class MetricsConfigError(ValueError):
    def __init__(self, key: str, value: object, reason: str) -> None:
        super().__init__(f"{key}={value!r}: {reason}")
        self.key, self.value, self.reason = key, value, reason


@attrs.frozen
class MetricsConfig:
    exporter_type: str = "DISABLE"
    prom_host: str = ""  # blank: the broker's brokerIP1 (the name server's bind address)
    prom_port: int = DEFAULT_PROM_PORT

    @property
    def enabled(self) -> bool:
        return self.exporter_type == "PROM"

    @classmethod
    def from_props(cls, props: dict) -> "tuple[MetricsConfig, list[str]]":
        """From the METRICS_KEYS of a parsed .conf (other keys are ignored).
        Raises MetricsConfigError for a value that cannot be used."""
        values, warnings = {}, []
        if "metricsExporterType" in props:
            kind = str(props["metricsExporterType"]).strip().upper()
            if kind not in EXPORTER_TYPES:
                raise MetricsConfigError("metricsExporterType", props["metricsExporterType"],
                                         f"expected one of {', '.join(EXPORTER_TYPES)}")
            if kind in ("OTLP_GRPC", "LOG"):
                warnings.append(f"metricsExporterType={kind} is not implemented by ledgermq (only PROM); "
                                f"no metrics are exported")
            values["exporter_type"] = kind
        if "metricsPromExporterHost" in props:
            values["prom_host"] = str(props["metricsPromExporterHost"]).strip()
        if "metricsPromExporterPort" in props:
            raw = str(props["metricsPromExporterPort"]).strip()
            if not raw.isdigit() or not 0 <= int(raw) <= 65535:
                raise MetricsConfigError("metricsPromExporterPort", raw, "expected a port number 0..65535")
            values["prom_port"] = int(raw)
        return cls(**values), warnings


@attrs.define(eq=False)
class MetricsServer:
    """What serve_metrics hands to task_status.started()."""

    listeners: list
    scrapes: int = 0
    open: int = 0  # connections being served
    refused: int = 0  # closed at once: MAX_CONNECTIONS were open
    failures: int = 0  # requests that raised (answered 500 or closed)

    @property
    def port(self) -> int:
        return self.listeners[0].socket.getsockname()[1]

    @property
    def url(self) -> str:
        host = self.listeners[0].socket.getsockname()[0]
        host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}/metrics"


def _peer(stream) -> str:
    try:
        return "%s:%s" % stream.socket.getpeername()[:2]
    except (OSError, AttributeError):
        return "?"


def _response(status: str, body: bytes, content_type: str = "text/plain; charset=utf-8") -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n")
    return head.encode("ascii") + body


async def _read_head(stream: trio.SocketStream) -> bytes | None:
    data = b""
    with trio.move_on_after(READ_TIMEOUT_S):
        while b"\r\n\r\n" not in data and len(data) < MAX_REQUEST_HEAD:
            chunk = await stream.receive_some(4096)
            if not chunk:
                break
            data += chunk
        return data
    return None


def answer(registry: CollectorRegistry, head: bytes) -> bytes:
    """The HTTP response to one request head (pure; what the server sends)."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return _response("400 Bad Request", b"bad request line\n")
    method, target = parts[0], parts[1].split("?", 1)[0]
    if method not in ("GET", "HEAD"):
        return _response("405 Method Not Allowed", b"only GET\n")
    if target not in ("/metrics", "/"):
        return _response("404 Not Found", b"the metrics are at /metrics\n")
    body = generate_latest(registry)
    response = _response("200 OK", body, CONTENT_TYPE_LATEST)
    return response[:len(response) - len(body)] if method == "HEAD" else response


async def serve_metrics(registry: CollectorRegistry, host: str | None, port: int, *,
                        task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve `registry` on http://host:port/metrics until cancelled (port 0
    picks a free one)."""
    listeners = await trio.open_tcp_listeners(port, host=host or None)
    server = MetricsServer(listeners)

    async def handle(stream: trio.SocketStream) -> None:
        if server.open >= MAX_CONNECTIONS:
            server.refused += 1
            await trio.aclose_forcefully(stream)
            return
        server.open += 1
        try:
            async with stream:
                await serve_one(stream)
        except Exception as exc:  # never the serving nursery's: this request only
            server.failures += 1
            log.warning("metrics request from %s failed: %r", _peer(stream), exc)
        finally:
            server.open -= 1

    async def serve_one(stream: trio.SocketStream) -> None:
        try:
            head = await _read_head(stream)
            if head is None:
                return
            try:
                response = answer(registry, head)
            except Exception as exc:  # a collector that raised: say so, keep serving
                server.failures += 1
                log.error("metrics collection failed", exc_info=exc)
                response = _response("500 Internal Server Error", b"metrics collection failed\n")
            server.scrapes += 1
            await stream.send_all(response)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.debug("metrics client went away: %s", exc)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handle, listeners)
        log.info("Prometheus metrics on %s", server.url)
        task_status.started(server)
