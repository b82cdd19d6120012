# Owns the console's answer to DNS rebinding and cross-origin requests: an
# ASGI middleware in front of every route (HTTP and server-sent events) that
# refuses with 403, before the app sees the request,
#
#   * a Host header naming a host the console was not told it is reached
#     by: only IP literals (a rebinding attack needs a DNS name under the
#     attacker's control), "localhost" and the names given with
#     --allow-host (and the bind address when it is a name) pass;
#   * an Origin header (browsers send one on every POST and on cross-origin
#     reads) whose host is not allowed by the same rule, or whose host:port
#     is not the Host the request came to: another site's page may not
#     drive the console even through a name the console accepts.
#
# A request without a Host (HTTP/1.0) is refused as well: nothing says
# whom it was meant for.  Ports are not compared with the listening port
# (the Host of a request through a proxy names the proxy's port).
import ipaddress
from urllib.parse import urlsplit

import orjson


def _host_name(host: str) -> str:
    """The name or address of a Host header value ("[::1]:8080" -> "::1")."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostGuard:
    """ASGI middleware: see the module comment.  `allowed`: host names
    (beyond IP literals and localhost) the console answers to."""

    def __init__(self, app, allowed=()) -> None:
        self.app = app
        self.allowed = frozenset(name.strip().lower().rstrip(".") for name in allowed if name.strip())

    def host_allowed(self, host: str) -> bool:
        name = _host_name(host).rstrip(".")
        return bool(name) and (_is_ip(name) or name == "localhost" or name in self.allowed)

    def refusal(self, headers: dict[bytes, bytes]) -> str | None:
        host = headers.get(b"host", b"").decode("latin-1")
        if not host:
            return "a request without a Host header"
        if not self.host_allowed(host):
            return (f"Host {host!r} is not one this console answers to (an IP address, localhost, "
                    f"or a name given with --allow-host)")
        origin = headers.get(b"origin")
        if origin is not None:
            text = origin.decode("latin-1")
            netloc = urlsplit(text).netloc.lower() if text != "null" else ""
            if not netloc or not self.host_allowed(netloc) or netloc != host.strip().lower():
                return f"Origin {text!r} is not this console's ({host})"
        return None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for key, value in scope.get("headers", ()):
            headers.setdefault(key.lower(), value)
        why = self.refusal(headers)
        if why is None:
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = orjson.dumps({"error": f"refused: {why}"})
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
