# The Prometheus endpoint (broker/telemetry/exporter.py) against hostile
# HTTP on real TCP (issue 27): garbage, an oversized head, a client that
# never finishes its head, a flood of connections and a collector that
# raises each cost that request at most -- answered 400/500 or closed,
# counted -- and the endpoint goes on serving scrapes.
import trio
import trio.testing
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from broker.telemetry import exporter
from broker.telemetry.exporter import serve_metrics


class Flaky:
    """A collector that raises while `broken` is set."""

    def __init__(self) -> None:
        self.broken = False

    def describe(self):
        return []

    def collect(self):
        if self.broken:
            raise RecursionError("a collector met something it did not expect")
        g = GaugeMetricFamily("x_up", "up")
        g.add_metric([], 1.0)
        yield g


async def exchange(port: int, data: bytes, eof: bool = True) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        try:
            await stream.send_all(data)
            if eof:
                await stream.send_eof()
        except trio.BrokenResourceError:
            pass  # the server answered and closed before taking all of it: read what it sent
        out = b""
        with trio.fail_after(15):
            while True:
                try:
                    chunk = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    return out
                if not chunk:
                    return out
                out += chunk
    finally:
        await trio.aclose_forcefully(stream)


async def scrape(port: int) -> bytes:
    return await exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")


async def test_garbage_and_failures_cost_one_request_only(nursery):
    flaky = Flaky()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(flaky)
    server = await nursery.start(serve_metrics, registry, "127.0.0.1", 0)
    port = server.port
    assert b"x_up 1.0" in await scrape(port)
    for garbage in (b"\x16\x03\x01\x02\x00" + bytes(range(256)) * 4,  # a TLS hello
                    b"GET\r\n\r\n", b"\r\n\r\n", b"G" * 100_000,  # no head end: read up to the limit
                    b"GET /metrics HTTP/1.1\r\n" + b"X-A: " + b"a" * 60_000 + b"\r\n\r\n",
                    b"POST /metrics HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n" + b"b" * 1000,
                    "GET /m\u00e9trics HTTP/1.1\r\n\r\n".encode("utf-8")):
        answer = await exchange(port, garbage)
        assert answer == b"" or answer.startswith(b"HTTP/1.1 "), answer[:80]  # answered or closed
        assert b"x_up 1.0" in await scrape(port)
    flaky.broken = True
    assert (await scrape(port)).startswith(b"HTTP/1.1 500")
    assert server.failures == 1
    flaky.broken = False
    assert b"x_up 1.0" in await scrape(port)


async def test_a_connection_flood_is_capped_and_scrapes_go_on(nursery, monkeypatch):
    monkeypatch.setattr(exporter, "MAX_CONNECTIONS", 8)
    monkeypatch.setattr(exporter, "READ_TIMEOUT_S", 1.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Flaky())
    server = await nursery.start(serve_metrics, registry, "127.0.0.1", 0)
    silent = [await trio.open_tcp_stream("127.0.0.1", server.port) for _ in range(20)]
    await trio.testing.wait_all_tasks_blocked()
    assert server.open == 8 and server.refused == 12
    # The silent ones time out (READ_TIMEOUT_S) and make room again.
    for s in silent:
        with trio.fail_after(5):
            while await s.receive_some(4096):
                pass
        await s.aclose()
    assert b"x_up 1.0" in await scrape(server.port)
