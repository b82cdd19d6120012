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
import base64
import json
import logging
import math
import time

import trio

from commitlog.errors import CommitLogError, NotLeaderError

log = logging.getLogger("ledgermq.admin")

MAX_LINE = 16 * 1024 * 1024


class AdminError(Exception):
    """A malformed admin request (answered, never fatal to the node)."""


async def handle_request(node, req: dict) -> dict:
    op = req.get("op")
    if op == "status":
        return {"ok": True, **node.status()}
    if op == "transfer":
        target = req.get("to")
        if not isinstance(target, str):
            raise AdminError("transfer needs 'to': a peer id")
        await node.transfer_leadership(target, timeout=float(req.get("timeout", 3.0)))
        return {"ok": True, **node.status()}
    if op == "append":
        bodies = [base64.b64decode(b) for b in req.get("bodies", [])]
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
            await node.committed.wait_for(int(req["index"]), timeout=float(req.get("timeout", 10.0)))
        except trio.TooSlowError:
            raise AdminError(f"committed index did not reach {req['index']} in time") from None
        return {"ok": True, **node.status()}
    if op == "load":
        return {"ok": True, **await run_load(node, int(req.get("count", 10000)), int(req.get("size", 1024)),
                                             int(req.get("window", 1)), int(req.get("batch", 1)))}
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


async def _serve_connection(node, stream: trio.SocketStream) -> None:
    buf = b""
    try:
        async with stream:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buf += data
                if len(buf) > MAX_LINE:
                    await stream.send_all(json.dumps({"ok": False, "error": "request line too long"}).encode() + b"\n")
                    return
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if not line.strip():
                        continue
                    try:
                        req = json.loads(line)
                        if not isinstance(req, dict):
                            raise AdminError("a request is a JSON object")
                        reply = await handle_request(node, req)
                    except (AdminError, CommitLogError, ValueError, KeyError, TypeError) as exc:
                        reply = _error_reply(exc)
                    await stream.send_all(json.dumps(reply).encode() + b"\n")
    except trio.BrokenResourceError:
        return


async def serve_admin(node, host: str, port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    log.info("admin port listening on %s:%d", host, bound)

    async def handler(stream):
        await _serve_connection(node, stream)

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
