# The web console (hypercorn + Starlette, tools/dashboard) against hostile
# HTTP on real TCP (issue 27): garbage, a TLS hello, an oversized head, an
# endless header, a body far bigger than announced and bad JSON to the API
# each cost that connection at most, and the console goes on serving its
# page and API.  In-process: a name server and the console in one trio run
# (no broker needed for what is checked here).
import trio

from broker.namesrv.service import NamesrvConfig, serve_namesrv
from tools.dashboard.serve import DashboardConfig, serve_dashboard

WRITE = b"Content-Type: application/json\r\nX-Ledgermq-Console: write\r\n"


async def exchange(port: int, data: bytes, read_limit: int = 1 << 20) -> bytes:
    """Send `data`, end our side, read what comes back until the close."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    out = b""
    try:
        with trio.fail_after(20):
            try:
                await stream.send_all(data)
                await stream.send_eof()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return out
            while len(out) < read_limit:
                try:
                    chunk = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    break
                if not chunk:
                    break
                out += chunk
    finally:
        await trio.aclose_forcefully(stream)
    return out


async def get(port: int, path: str) -> bytes:
    return await exchange(port, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())


async def test_console_survives_garbage_and_oversized_http(nursery):
    ns = await nursery.start(serve_namesrv, NamesrvConfig(listen_port=0, bind_address="127.0.0.1"))
    url = await nursery.start(serve_dashboard, DashboardConfig(ns.address, port=0, period_s=0.5))
    port = int(url.rsplit(":", 1)[1])
    assert (await get(port, "/")).startswith(b"HTTP/1.1 200")
    hostile = [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)) * 8,  # TLS on a plain port
        bytes(range(256)) * 64,
        b"GET / HTTP/1.1\r\n" + b"X-Long: " + b"a" * (1 << 20) + b"\r\n\r\n",  # a 1 MiB header
        b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(20000)) + b"\r\n",
        b"GET /" + b"p" * 200_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /api/topics HTTP/1.1\r\nHost: x\r\n" + WRITE + b"Content-Length: 5\r\n\r\n" + b"{" * 100_000,
        b"POST /api/topics HTTP/1.1\r\nHost: x\r\n" + WRITE + b"Content-Length: 40000\r\n\r\n"
        + b"[" * 20000 + b"]" * 20000,  # JSON nested 20,000 deep
        b"POST /api/credentials HTTP/1.1\r\nHost: x\r\n" + WRITE + b"Content-Length: 11\r\n\r\nnot json!!!",
        b"GET /api/messages?topic=" + b"%ff" * 3000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzzzz\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
    ]
    for data in hostile:
        answer = await exchange(port, data, read_limit=1 << 16)
        assert answer == b"" or answer.startswith(b"HTTP/1.1 "), answer[:100]
        page = await get(port, "/")
        assert page.startswith(b"HTTP/1.1 200"), page[:100]
    snapshot = await get(port, "/api/snapshot")
    assert snapshot.startswith(b"HTTP/1.1 200")
    nursery.cancel_scope.cancel()


async def test_a_rebinding_host_or_a_foreign_origin_is_refused(nursery):
    """DNS rebinding (issue 31): a page of evil.example that resolves its
    name to 127.0.0.1 sends Host: evil.example:PORT; another site's page
    sends its own Origin.  Both get 403 before the app sees them, writes
    with the console header and the confirm step included; the console's
    own page (an IP, localhost or an --allow-host name) goes on working."""
    ns = await nursery.start(serve_namesrv, NamesrvConfig(listen_port=0, bind_address="127.0.0.1"))
    url = await nursery.start(serve_dashboard, DashboardConfig(ns.address, port=0, period_s=0.5,
                                                               allowed_hosts=("console.example",)))
    port = int(url.rsplit(":", 1)[1])
    body = b'{"cluster": "C", "topic": "Rebound", "confirmed": true}'

    def post(host: str, origin: str | None = None) -> bytes:
        extra = f"Origin: {origin}\r\n".encode() if origin else b""
        return (f"POST /api/topics HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n".encode() + extra + WRITE
                + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)

    def get_as(host: str, origin: str | None = None) -> bytes:
        extra = f"Origin: {origin}\r\n" if origin else ""
        return f"GET /api/snapshot HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n".encode()

    for request in (post(f"evil.example:{port}"), post(f"evil.example:{port}", f"http://evil.example:{port}"),
                    post(f"127.0.0.1:{port}", "http://evil.example"), post(f"127.0.0.1:{port}", "null"),
                    get_as(f"evil.example:{port}"), get_as(f"127.0.0.1:{port}", f"http://evil.example:{port}"),
                    b"GET /api/snapshot HTTP/1.0\r\n\r\n"):
        reply = await exchange(port, request)
        assert reply.startswith(b"HTTP/1.1 403"), reply[:200]
        assert b"refused:" in reply
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"console.example:{port}"):
        assert (await exchange(port, get_as(host, f"http://{host}"))).startswith(b"HTTP/1.1 200")
    # the same-origin write is let through to the app (which then finds no such cluster: not a 403)
    reply = await exchange(port, post(f"127.0.0.1:{port}", f"http://127.0.0.1:{port}"))
    assert not reply.startswith(b"HTTP/1.1 403"), reply[:200]
