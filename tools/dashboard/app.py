# Owns the console's HTTP face: a Starlette (ASGI) app over the sampler's
# Hub and one MQAdmin.  Starlette because it runs on anyio, hence under
# hypercorn's trio worker in the same trio run as the sampler (no second
# event loop, no thread), and it is small: routing, static files and
# streaming responses are all the console needs.
#
#   GET  /                      the single page (static/index.html)
#   GET  /api/snapshot          the latest sample (cluster, topics, consumers, history)
#   GET  /api/events            the same, pushed on every new sample (server-sent events)
#   GET  /api/messages          search by key, unique key, offset msg id or queue offset
#   GET  /api/replication       chain-CRC agreement of one group's replicas
#   GET/POST /api/credentials   the ACL access key in use (never the secret) / set both
#   POST /api/topics            create or update a topic on every master of a cluster
#   POST /api/consumers/reset   reset a group's offsets to a time
#
# Writes need "confirmed": true in the body (the page's confirm step) and
# the X-Ledgermq-Console header: a page of another origin cannot send a
# custom header without a CORS preflight, which this app never grants.
# AdminError -> JSON {"error"} with 404/502/409 is this boundary's one
# translation point (error_response).
import os

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from broker.acl.signing import credentials_or_none
from broker.remoting.client import RemotingClient
from consumequeue.record import MessageFormatError
from tools.dashboard.sampler import Hub
from tools.mqadmin.adminapi import AdminError, MQAdmin, NotFoundError, UnreachableError

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
WRITE_HEADER = "x-ledgermq-console"
TRACE_MAX = 16  # messages shown per retry/DLQ topic in a trace


class BadRequest(Exception):
    """The request itself is wrong (a missing field, no confirm step)."""


def json_response(data, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json",
                    headers={"Cache-Control": "no-store"})


def error_response(exc: Exception) -> Response:
    if isinstance(exc, BadRequest | MessageFormatError):
        return json_response({"error": str(exc)}, 400)
    if isinstance(exc, NotFoundError):
        return json_response({"error": str(exc)}, 404)
    if isinstance(exc, UnreachableError):
        return json_response({"error": str(exc)}, 502)
    return json_response({"error": str(exc)}, 409)


def _field(body: dict, name: str, kind=str, default=None):
    value = body.get(name, default)
    if value is None or value == "":
        if default is not None:
            return default
        raise BadRequest(f"{name} is required")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise BadRequest(f"{name}: {value!r} is not a valid {kind.__name__}") from None


async def _write_body(request: Request) -> dict:
    if request.headers.get(WRITE_HEADER) != "write":
        raise BadRequest(f"admin writes need the {WRITE_HEADER} header (sent by the console's own page)")
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        raise BadRequest("the body is not JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the body is not a JSON object")
    if body.get("confirmed") is not True:
        raise BadRequest("not confirmed: an admin write needs \"confirmed\": true (the page's confirm step)")
    return body


def create_app(admin: MQAdmin, hub: Hub, remoting: RemotingClient) -> Starlette:
    async def index(request: Request) -> Response:
        return FileResponse(os.path.join(STATIC, "index.html"), headers={"Cache-Control": "no-store"})

    async def snapshot(request: Request) -> Response:
        return json_response(hub.snapshot)

    async def events(request: Request) -> Response:
        async def stream():
            version = -1
            while True:
                snap = await hub.wait_newer(version)
                version = snap["version"]
                yield b"data: " + orjson.dumps(snap) + b"\n\n"
        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def messages(request: Request) -> Response:
        q = request.query_params
        mode = q.get("by", "key")
        if mode == "msgId":
            found = [await admin.find_by_offset_msg_id(_field(q, "msgId"))]
        elif mode == "queueOffset":
            found = [await admin.find_at_queue_offset(_field(q, "topic"), _field(q, "brokerName"),
                                                      _field(q, "queueId", int), _field(q, "offset", int))]
        elif mode in ("key", "uniqueKey"):
            found = await admin.find_by_key(_field(q, "topic"), _field(q, "key"), mode == "uniqueKey")
        else:
            raise BadRequest(f"by={mode!r}: one of key, uniqueKey, msgId, queueOffset")
        if not found:
            raise NotFoundError("no message matches")
        return json_response({"messages": found, "trace": await trace(found[0])})

    async def trace(message: dict) -> list[dict]:
        """Where the message went after its topic: the copies of its unique
        key in each consumer group's retry and dead-letter topics."""
        uniq = message.get("msgId")
        if not uniq:
            return []
        out = [{"topic": message["topic"], "kind": "original", "queueId": message["queueId"],
                "queueOffset": message["queueOffset"], "storeTimestamp": message["storeTimestamp"],
                "reconsumeTimes": message["reconsumeTimes"]}]
        groups = [c["group"] for c in hub.snapshot.get("consumers") or []]
        for group in groups:
            for kind, topic in (("retry", f"%RETRY%{group}"), ("dlq", f"%DLQ%{group}")):
                try:
                    copies = await admin.find_by_key(topic, uniq, True, TRACE_MAX)
                except NotFoundError:
                    continue
                out += [{"topic": topic, "kind": kind, "group": group, "queueId": m["queueId"],
                         "queueOffset": m["queueOffset"], "storeTimestamp": m["storeTimestamp"],
                         "reconsumeTimes": m["reconsumeTimes"]} for m in copies]
        return out

    async def replication(request: Request) -> Response:
        group = _field(request.query_params, "group")
        addrs = await admin.group_addrs(group)
        statuses = {}
        for _, addr in sorted(addrs.items()):
            try:
                statuses[addr] = await admin.dledger_status(addr)
            except UnreachableError as e:
                statuses[addr] = {"error": str(e)}
        live = {a: s for a, s in statuses.items() if "error" not in s}
        if not live:
            raise UnreachableError(f"no replica of {group} answers")
        common = min(s["committedIndex"] for s in live.values())
        begin = max(s["ledgerBeginIndex"] for s in live.values())
        rows = []
        for addr, st in statuses.items():
            crc = await admin.chain_crc(addr, common) if addr in live and common >= begin else None
            rows.append({"addr": addr, "selfId": st.get("selfId"), "role": st.get("role"),
                         "committedIndex": st.get("committedIndex"), "chainCrc": crc, "error": st.get("error")})
        crcs = {r["chainCrc"] for r in rows if r["chainCrc"] is not None}
        return json_response({"group": group, "comparedIndex": common, "replicas": rows,
                              "agree": len(crcs) <= 1 and len(live) >= 2})

    async def credentials(request: Request) -> Response:
        if request.method == "POST":
            body = await _write_body(request)
            try:
                creds = credentials_or_none(body.get("accessKey"), body.get("secretKey"))
            except ValueError as e:
                raise BadRequest(str(e)) from None
            remoting.rpc_hook = creds
        hook = remoting.rpc_hook
        # The access key only: the secret stays in this process's memory.
        return json_response({"signing": hook is not None, "accessKey": getattr(hook, "access_key", None)})

    async def create_topic(request: Request) -> Response:
        body = await _write_body(request)
        topic, cluster = _field(body, "topic"), _field(body, "cluster")
        read, write = _field(body, "readQueueNums", int, 8), _field(body, "writeQueueNums", int, 8)
        perm = _field(body, "perm", int, 6)
        if not (0 < read <= 1024 and 0 < write <= 1024) or perm not in (2, 4, 6):
            raise BadRequest("queue numbers must be 1..1024 and perm one of 2, 4, 6")
        masters = await admin.masters(cluster)
        if not masters:
            raise UnreachableError(f"cluster {cluster} has no master right now")
        for addr in masters.values():
            await admin.create_topic(addr, topic, read, write, perm, bool(body.get("order", False)))
        return json_response({"topic": topic, "updated": sorted(masters)})

    async def reset_offset(request: Request) -> Response:
        body = await _write_body(request)
        group, topic, ts = _field(body, "group"), _field(body, "topic"), _field(body, "timestamp", int)
        results = {}
        for name, addr in sorted((await admin.topic_masters(topic)).items()):
            table = await admin.reset_offset(addr, topic, group, ts, True)
            results[name] = [{"queueId": qid, "offset": off} for (_, _, qid), off in sorted(table.items())]
        return json_response({"group": group, "topic": topic, "timestamp": ts, "reset": results})

    async def handle_error(request: Request, exc: Exception) -> Response:
        return error_response(exc)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code)

    routes = [
        Route("/", index),
        Route("/api/snapshot", snapshot),
        Route("/api/events", events),
        Route("/api/messages", messages),
        Route("/api/replication", replication),
        Route("/api/credentials", credentials, methods=["GET", "POST"]),
        Route("/api/topics", create_topic, methods=["POST"]),
        Route("/api/consumers/reset", reset_offset, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(routes=routes, exception_handlers={
        AdminError: handle_error, BadRequest: handle_error, MessageFormatError: handle_error,
        HTTPException: http_error})
