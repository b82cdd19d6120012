# The log node's JSON admin port (commitlog/admin.py) is an operator-only
# port with no authentication: serve_node binds it to loopback unless told
# otherwise.  Checked in the kernel's own table of listening sockets.  And
# bad input costs its sender, never the node: a request that fails is
# answered with its error, an overlong line closes that connection, the
# connections beyond the cap are refused at once.
import json
import os

import pytest
import trio

from commitlog import admin
from commitlog.config import ReplicationConfig
from commitlog.node import serve_node


def listening_addresses(port: int) -> set[str]:
    """Local IPv4 addresses with a listening TCP socket on `port` (/proc/net/tcp)."""
    out = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            local, state = line.split()[1], line.split()[3]
            ip_hex, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                out.add(".".join(str(b) for b in reversed(bytes.fromhex(ip_hex))))
    return out


async def test_admin_port_binds_loopback_by_default(tmp_path):
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    cfg, _ = ReplicationConfig.from_dict({"dLegerGroup": "g", "dLegerPeers": f"n0-127.0.0.1:{port}",
                                          "dLegerSelfId": "n0", "storePathRootDir": os.path.join(tmp_path, "n0")})
    async with trio.open_nursery() as nursery:
        running = await nursery.start(lambda task_status: serve_node(cfg, admin_port=0, listeners=listeners,
                                                                     task_status=task_status))
        assert listening_addresses(running.admin_port) == {"127.0.0.1"}
        nursery.cancel_scope.cancel()


# --- bad input costs its sender, never the node ------------------------------------------


class Conn:
    """One admin connection, line by line."""

    def __init__(self, stream):
        self.stream, self.buf = stream, b""

    @classmethod
    async def open(cls, port):
        return cls(await trio.open_tcp_stream("127.0.0.1", port))

    async def reply(self) -> dict | None:
        """The next reply line, or None once the node closed the connection."""
        with trio.fail_after(10):
            while b"\n" not in self.buf:
                data = await self.stream.receive_some(65536)
                if not data:
                    return None
                self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    async def ask(self, raw: bytes) -> dict | None:
        await self.stream.send_all(raw + b"\n")
        return await self.reply()


async def one_node(nursery, tmp_path):
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    cfg, _ = ReplicationConfig.from_dict({"dLegerGroup": "g", "dLegerPeers": f"n0-127.0.0.1:{port}",
                                          "dLegerSelfId": "n0", "storePathRootDir": os.path.join(tmp_path, "n0")})
    return await nursery.start(lambda task_status: serve_node(cfg, admin_port=0, listeners=listeners,
                                                              task_status=task_status))


@pytest.mark.parametrize("raw, error", [
    (b"[" * 100_000 + b"]" * 100_000, "RecursionError"),             # nesting past the parser's depth
    (b'{"op": "read", "from": 1e400}', "OverflowError"),
    (b'{"op": "transfer", "to": "n1", "timeout": NaN}', "timeout must be in"),
    (b'{"op": "wait_committed", "index": 5, "timeout": 1e9}', "timeout must be in"),
    (b'{"op": "load", "window": 1000000000}', "load window must be in 1..1024"),
    (b'{"op": "load", "size": -1}', "load size"),
    (b'{"op": "append", "bodies": ["!!"]}', "Error"),                   # not base64
    (b'{"op": "append", "bodies": 7}', "TypeError"),
    (b"\xff\xfe not utf-8", "JSONDecodeError"),
    (b'"a string"', "a request is a JSON object"),
    (b'{"op": "chain"}', "KeyError"),
])
async def test_a_bad_request_is_answered_and_the_connection_goes_on(tmp_path, raw, error):
    async with trio.open_nursery() as nursery:
        running = await one_node(nursery, tmp_path)
        conn = await Conn.open(running.admin_port)
        reply = await conn.ask(raw)
        assert reply["ok"] is False and (error in reply["error"] or error in reply["type"]), reply
        assert (await conn.ask(b'{"op": "status"}'))["ok"]                   # same connection, same node
        assert running.replica.stats["admin_bad_requests"] == 1
        nursery.cancel_scope.cancel()


async def test_an_overlong_line_closes_that_connection_only(tmp_path, monkeypatch):
    monkeypatch.setattr(admin, "MAX_LINE", 4096)
    async with trio.open_nursery() as nursery:
        running = await one_node(nursery, tmp_path)
        other = await Conn.open(running.admin_port)
        conn = await Conn.open(running.admin_port)
        await conn.stream.send_all(b'{"op": "append", "bodies": ["' + b"A" * 10_000)
        assert (await conn.reply())["error"] == "request line too long"
        assert await conn.reply() is None                                    # closed
        assert (await other.ask(b'{"op": "status"}'))["ok"]
        assert running.replica.stats["admin_failed_connections"] == 1
        nursery.cancel_scope.cancel()


async def test_connections_beyond_the_cap_are_refused_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(admin, "MAX_CONNECTIONS", 2)
    async with trio.open_nursery() as nursery:
        running = await one_node(nursery, tmp_path)
        held = [await Conn.open(running.admin_port), await Conn.open(running.admin_port)]
        for c in held:
            assert (await c.ask(b'{"op": "status"}'))["ok"]                 # both are being served
        extra = await Conn.open(running.admin_port)
        assert "2 admin connections open" in (await extra.reply())["error"]
        assert await extra.reply() is None
        assert running.replica.stats["admin_refused_connections"] == 1
        await held.pop().stream.aclose()
        with trio.fail_after(10):
            while True:   # (the slot frees when the node notices the close)
                reply = await (await Conn.open(running.admin_port)).ask(b'{"op": "status"}')
                if reply["ok"]:
                    break
        nursery.cancel_scope.cancel()
