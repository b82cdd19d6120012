# Owns the replicated-log node's admin port: one JSON object per line in,
# one JSON object per line out, over TCP on loopback.  Operators and tests
# read status (role, term, leader, ledger begin/end, committed index, per-peer
# match index and lag), trigger leadership transfer, read committed entries,
# and run an in-process append load (the replication benchmark measures the
# leader's append path without a client hop in between).
#
# Requests:  {"op": "status"}
#            {"op": "transfer", "to": "n1"}
#            {"op": "append", "bodies": ["<base64>", ...]}
#            {"op": "read", "from": 0, "count": 100}        committed only
#            {"op": "chain", "index": 42}                  chain CRC (replica compare)
#            {"op": "wait_committed", "index": 42, "timeout": 10}
#                                                          parks on the commit watermark
#            {"op": "load", "count": N, "size": S, "window": W, "batch": B}
# Replies:   {"ok": true, ...} or {"ok": false, "error": "...", "type": "NotLeaderError", ...}
#
# Bad input costs its sender, never the node: a request that fails for any
# reason is answered with its error (and the connection goes on); a line
# longer than MAX_LINE, or anything else going wrong on a connection, closes
# that connection only, logged with the address at a bounded rate.  At most
# MAX_CONNECTIONS are served at once (MAX_CONNECTIONS x MAX_LINE bytes of
# request lines at most); timeouts and the load's parameters are bounded.
# The counts land in the node's stats (admin_bad_requests,
# admin_failed_connections, admin_refused_connections).
import base64
import json
import logging
import math
import time

import trio

from commitlog.errors import CommitLogError, NotLeaderError
from commitlog.ratelog import LogBudget
from commitlog.transport.handshake import peername

log = logging.getLogger("ledgermq.admin")

MAX_LINE = 16 * 1024 * 1024
MAX_CONNECTIONS = 8
MAX_TIMEOUT = 600.0
_LOAD_LIMITS = {"count": 10_000_000, "size": 16 * 1024 * 1024, "window": 1024, "batch": 10_000}


class AdminError(Exception):
    """A malformed admin request (answered, never fatal to the node)."""


def _timeout(req: dict, default: float) -> float:
    value = float(req.get("timeout", default))
    if not 0 < value <= MAX_TIMEOUT:   # (also refuses NaN)
        raise AdminError(f"timeout must be in (0, {MAX_TIMEOUT:g}] seconds, got {value}")
    return value


def _load_arg(req: dict, name: str, default: int) -> int:
    value = int(req.get(name, default))
    if not 1 <= value <= _LOAD_LIMITS[name]:
        raise AdminError(f"load {name} must be in 1..{_LOAD_LIMITS[name]}, got {value}")
    return value


async def handle_request(node, req: dict) -> dict:
    op = req.get("op")
    if op == "status":
        return {"ok": True, **node.status()}
    if op == "transfer":
        target = req.get("to")
        if not isinstance(target, str):
            raise AdminError("transfer needs 'to': a peer id")
        await node.transfer_leadership(target, timeout=_timeout(req, 3.0))
        return {"ok": True, **node.status()}
    if op == "append":
        bodies = [base64.b64decode(b, validate=True) for b in req.get("bodies", [])]
        placed = await node.append(bodies)
        return {"ok": True, "entries": [[i, p] for i, p in placed]}
    if op == "read":
        entries = node.read_committed(int(req.get("from", 0)), int(req.get("count", 100)))
        return {"ok": True, "entries": [[e.index, e.term, base64.b64encode(e.body).decode()] for e in entries]}
    if op == "chain":
        index = int(req["index"])
        return {"ok": True, "index": index, "chainCrc": node.chain_crc_at(index)}
    if op == "wait_committed":
        # Waits on the node's commit watermark, so callers need not poll.
        try:
            await node.committed.wait_for(int(req["index"]), timeout=_timeout(req, 10.0))
        except trio.TooSlowError:
            raise AdminError(f"committed index did not reach {req['index']} in time") from None
        return {"ok": True, **node.status()}
    if op == "load":
        return {"ok": True, **await run_load(node, _load_arg(req, "count", 10000), _load_arg(req, "size", 1024),
                                             _load_arg(req, "window", 1), _load_arg(req, "batch", 1))}
    raise AdminError(f"unknown op {op!r}")


async def run_load(node, count: int, size: int, window: int, batch: int) -> dict:
    """Append `count` bodies of `size` bytes with `window` concurrent callers,
    each appending `batch` bodies per call; report throughput and latency."""
    body = b"x" * size
    bodies = [body] * batch
    latencies: list[float] = []
    errors: dict[str, int] = {}
    remaining = [count]
    appended = [0]
    append = getattr(node, "replica", node).append  # skip the admin view's __getattr__ per call
    clock = time.perf_counter
    record = latencies.append

    async def worker():
        while remaining[0] > 0:
            n = min(batch, remaining[0])
            remaining[0] -= n
            t0 = clock()
            try:
                await append(bodies if n == batch else bodies[:n])
            except CommitLogError as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                if isinstance(exc, NotLeaderError):
                    return
                continue
            record(clock() - t0)
            appended[0] += n

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(window):
            nursery.start_soon(worker)
    elapsed = time.perf_counter() - t0
    latencies.sort()

    def pct(p):
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 3) if latencies else None

    done = appended[0]
    return {"appended": done, "seconds": round(elapsed, 4), "eps": round(done / elapsed, 1) if elapsed else None,
            "p50_ms": pct(0.50), "p99_ms": pct(0.99), "max_ms": pct(1.0), "errors": errors}


def _error_reply(exc: BaseException) -> dict:
    reply = {"ok": False, "error": str(exc), "type": type(exc).__name__}
    if isinstance(exc, NotLeaderError):
        reply.update(leader=exc.leader_id, leaderAddr=exc.leader_addr)
    return reply


async def _answer(node, line: bytes, remote: str) -> dict:
    """The reply to one request line: its result, or its error (any)."""
    try:
        req = json.loads(line)
        if not isinstance(req, dict):
            raise AdminError("a request is a JSON object")
        return await handle_request(node, req)
    except CommitLogError as exc:  # the node's own answers: not the leader, not committed in time, ...
        return _error_reply(exc)
    except (AdminError, ValueError, KeyError, TypeError) as exc:
        _count(node, "admin_bad_requests")
        return _error_reply(exc)
    except Exception as exc:  # whatever else a request provokes (RecursionError, OverflowError, a timeout...)
        _count(node, "admin_bad_requests")
        _LOG.log(log, logging.WARNING, trio.current_time(), "admin request from %s failed: %s: %s", remote,
                 type(exc).__name__, exc)
        return _error_reply(exc)


async def _serve_connection(node, stream: trio.SocketStream, remote: str) -> None:
    buf = bytearray()
    scanned = 0  # bytes of buf known to hold no newline
    while True:
        nl = buf.find(b"\n", scanned)
        if nl < 0:
            scanned = len(buf)
            if len(buf) > MAX_LINE:
                _count(node, "admin_failed_connections")
                _LOG.log(log, logging.WARNING, trio.current_time(),
                         "admin connection from %s closed: request line over %d bytes", remote, MAX_LINE)
                await stream.send_all(_line({"ok": False, "error": "request line too long"}))
                return
            data = await stream.receive_some(65536)
            if not data:
                return
            buf += data
            continue
        line = bytes(buf[:nl])
        del buf[:nl + 1]
        scanned = 0
        if line.strip():
            await stream.send_all(_line(await _answer(node, line, remote)))


def _line(reply: dict) -> bytes:
    return json.dumps(reply).encode() + b"\n"


def _count(node, key: str) -> None:
    stats = getattr(node, "stats", None)
    if stats is not None:
        stats[key] += 1


_LOG = LogBudget()  # lines a local caller can cause at will


async def serve_admin(node, host: str, port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    log.info("admin port listening on %s:%d", host, bound)
    open_connections = 0

    async def handler(stream):
        nonlocal open_connections
        remote = peername(stream)
        async with stream:
            if open_connections >= MAX_CONNECTIONS:
                _count(node, "admin_refused_connections")
                _LOG.log(log, logging.WARNING, trio.current_time(),
                         "admin connection from %s refused: %d open", remote, open_connections)
                with trio.move_on_after(1):
                    await stream.send_all(_line({"ok": False, "error": f"{MAX_CONNECTIONS} admin connections "
                                                                      f"open; try again"}))
                return
            open_connections += 1
            try:
                await _serve_connection(node, stream, remote)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            except Exception as exc:
                _count(node, "admin_failed_connections")
                _LOG.log(log, logging.WARNING, trio.current_time(), "admin connection from %s failed: %s: %s",
                         remote, type(exc).__name__, exc, exc_info=exc)
            finally:
                open_connections -= 1

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handler, listeners)
        task_status.started(bound)
        await trio.sleep(math.inf)


async def admin_call(host: str, port: int, req: dict, timeout: float = 10.0) -> dict:
    """One request/response to a node's admin port (for tools and tests)."""
    with trio.fail_after(timeout):
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            await stream.send_all(json.dumps(req).encode() + b"\n")
            buf = b""
            while b"\n" not in buf:
                data = await stream.receive_some(65536)
                if not data:
                    raise ConnectionError(f"admin port {host}:{port} closed the connection")
                buf += data
            return json.loads(buf.split(b"\n", 1)[0])
