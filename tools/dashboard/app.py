# Owns the console's HTTP face: a Starlette (ASGI) app over the sampler's Hub and one MQAdmin.  Starlette
# runs on anyio, hence under hypercorn's trio worker in the sampler's trio run (no second event loop, no
# thread), and routing, static files and streaming responses are all the console needs.
#
#   GET  /                      the single page (static/index.html)
#   GET  /api/snapshot          the latest sample (cluster, topics, consumers, history)
#   GET  /api/events            the same, pushed on every new sample (server-sent events)
#   GET  /api/session           whether login is required, and who is logged in
#   POST /api/login, /api/logout  a session cookie for an admin account / its end
#   GET  /api/messages          search by key, unique key, offset msg id or queue offset   [body]
#   GET  /api/messages/range    a topic's messages stored in a time range                  [body]
#   POST /api/messages/resend   send messages again to their topic (or a DLQ's original)    [write]
#   GET  /api/dlq               a group's %DLQ% messages; /api/dlq/export as JSON lines     [body]
#   GET  /api/producers         a producer group's clients; /groups: every group of every master
#   GET  /api/routes            a topic's route
#   GET  /api/brokers/config    a registered broker's effective config, secrets masked
#   GET  /api/groups/config     a subscription group's config
#   GET  /api/replication       chain-CRC agreement of one group's replicas
#   GET/POST /api/credentials   the ACL access key in use (never the secret) / set both   [write]
#   POST /api/topics, /api/topics/delete   create/update a topic on every master; delete it   [write]
#   POST /api/groups, /api/groups/delete   create or change a subscription group; delete it    [write]
#   POST /api/consumers/reset   reset a group's offsets to a time                          [write]
#
# Rules.  Writes need "confirmed": true (the page's confirm step) and the X-Ledgermq-Console header (a
# page of another origin cannot send it without a CORS preflight, never granted).  With accounts
# (auth.Auth: --users or the ACL's admin accounts) [write] and [body] routes need a live session
# (HttpOnly, SameSite=Strict cookie; random token checked server-side), else 401; without accounts the
# console is open (the CLI warns beyond loopback).  error_response is the one translation point:
# AdminError 404/502/409, BadRequest/BadInput 400, LoginRequired 401, TooManyAttempts 429.  Request
# bodies are read up to MAX_BODY bytes.
import os

import orjson
import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from broker.acl.signing import credentials_or_none
from broker.remoting.client import RemotingClient
from consumequeue.record import MessageFormatError
from tools.dashboard import ops
from tools.dashboard.auth import Auth
from tools.dashboard.sampler import Hub
from tools.mqadmin.adminapi import AdminError, MQAdmin, NotFoundError, UnreachableError

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
WRITE_HEADER = "x-ledgermq-console"
TRACE_MAX = 16  # messages shown per retry/DLQ topic in a trace
COOKIE = "ledgermq_console_session"
MAX_BODY = 1 << 20


class BadRequest(Exception):
    """The request itself is wrong (a missing field, no confirm step)."""


class LoginRequired(Exception):
    """Accounts are configured and this request has no live session."""


class TooManyAttempts(Exception):
    def __init__(self, retry_after: float):
        super().__init__(f"too many failed logins from this address: try again in {int(retry_after) + 1} s")
        self.retry_after = retry_after


def json_response(data, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json",
                    headers={"Cache-Control": "no-store"})


def error_response(exc: Exception) -> Response:
    if isinstance(exc, BadRequest | MessageFormatError | ops.BadInput):
        return json_response({"error": str(exc)}, 400)
    if isinstance(exc, LoginRequired):
        return json_response({"error": str(exc), "loginRequired": True}, 401)
    if isinstance(exc, TooManyAttempts):
        r = json_response({"error": str(exc)}, 429)
        r.headers["Retry-After"] = str(int(exc.retry_after) + 1)
        return r
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


async def _json_body(request: Request) -> dict:
    if request.headers.get(WRITE_HEADER) != "write":
        raise BadRequest(f"admin writes need the {WRITE_HEADER} header (sent by the console's own page)")
    data = b""
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_BODY:
            raise BadRequest(f"the body is larger than {MAX_BODY} bytes")
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise BadRequest("the body is not JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the body is not a JSON object")
    return body


def _int_param(q, name: str, default: int | None = None) -> int | None:
    value = q.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise BadRequest(f"{name}: {value!r} is not a whole number") from None


def create_app(admin: MQAdmin, hub: Hub, remoting: RemotingClient, auth: Auth | None = None) -> Starlette:
    auth = auth or Auth()
    checks = trio.CapacityLimiter(2)  # scrypt runs at most twice at once (CPU and memory bound)

    def user_of(request: Request) -> str | None:
        s = auth.session(request.cookies.get(COOKIE))
        return s.user if s else None

    def need_login(request: Request, what: str) -> None:
        if auth.enabled and user_of(request) is None:
            raise LoginRequired(f"{what} needs a login: log in with a console account (an ACL admin account or "
                                f"one of the --users file); anonymous visitors only see the live views")

    async def _write_body(request: Request) -> dict:
        if request.headers.get(WRITE_HEADER) != "write":
            raise BadRequest(f"admin writes need the {WRITE_HEADER} header (sent by the console's own page)")
        need_login(request, "an admin write")
        body = await _json_body(request)
        if body.get("confirmed") is not True:
            raise BadRequest("not confirmed: an admin write needs \"confirmed\": true (the page's confirm step)")
        return body

    def client_of(request: Request) -> str:
        return request.client.host if request.client else "?"

    async def session(request: Request) -> Response:
        return json_response({"loginRequired": auth.enabled, "user": user_of(request)})

    async def login(request: Request) -> Response:
        body = await _json_body(request)
        user, password = body.get("user"), body.get("password")
        if not isinstance(user, str) or not isinstance(password, str) or not user:
            raise BadRequest("user and password are required")
        if not auth.enabled:
            raise BadRequest("this console has no accounts (start it with --users or --acl-file to require a login)")
        client = client_of(request)
        async with checks:
            wait = auth.retry_after(client)  # asked again once our turn comes: parallel guesses count too
            if wait is not None:
                raise TooManyAttempts(wait)
            ok = await trio.to_thread.run_sync(auth.check_password, user[:256], password)
            token = auth.login_result(client, user, ok)
        if token is None:
            raise LoginRequired("wrong user or password")
        r = json_response({"loginRequired": True, "user": user})
        r.set_cookie(COOKIE, token, max_age=int(auth.absolute_s), path="/", httponly=True, samesite="strict")
        return r

    async def logout(request: Request) -> Response:
        await _json_body(request)
        auth.logout(request.cookies.get(COOKIE))
        r = json_response({"loginRequired": auth.enabled, "user": None})
        r.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return r

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
        need_login(request, "reading message bodies")
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

    async def messages_range(request: Request) -> Response:
        need_login(request, "reading message bodies")
        q = request.query_params
        return json_response(await ops.browse(admin, _field(q, "topic"), _int_param(q, "begin"), _int_param(q, "end"),
                                              _int_param(q, "limit", 100)))

    async def resend(request: Request) -> Response:
        body = await _write_body(request)
        return json_response(await ops.resend(admin, body.get("messages"), bool(body.get("toOriginal", False))))

    async def dlq(request: Request) -> Response:
        need_login(request, "reading message bodies")
        q = request.query_params
        return json_response(await ops.dlq(admin, _field(q, "group"), _int_param(q, "limit", 100)))

    async def dlq_export(request: Request) -> Response:
        need_login(request, "reading message bodies")
        group = ops.check_name("group", _field(request.query_params, "group"))
        topic = ops.DLQ_PREFIX + group
        await admin.route(topic)  # a 404 before the stream starts
        return StreamingResponse(ops.export_lines(admin, topic), media_type="application/x-ndjson", headers={
            "Cache-Control": "no-store", "Content-Disposition": f'attachment; filename="dlq-{group}.jsonl"'})

    async def producers(request: Request) -> Response:
        return json_response(await ops.producers(admin, _field(request.query_params, "group")))

    async def producer_groups(request: Request) -> Response:
        return json_response(await ops.producer_groups(admin))

    async def routes_(request: Request) -> Response:
        return json_response(await ops.topic_route(admin, _field(request.query_params, "topic")))

    async def broker_config(request: Request) -> Response:
        return json_response(await ops.broker_config(admin, _field(request.query_params, "addr")))

    async def group_config(request: Request) -> Response:
        return json_response(await ops.group_config(admin, _field(request.query_params, "group")))

    async def save_group(request: Request) -> Response:
        body = await _write_body(request)
        return json_response(await ops.save_group(admin, _field(body, "cluster"), body))

    async def delete_group(request: Request) -> Response:
        body = await _write_body(request)
        return json_response(await ops.delete_group(admin, _field(body, "cluster"), _field(body, "group"),
                                                    body.get("removeOffset") is True))

    async def delete_topic(request: Request) -> Response:
        body = await _write_body(request)
        return json_response(await ops.delete_topic(admin, _field(body, "cluster"), _field(body, "topic")))

    async def handle_error(request: Request, exc: Exception) -> Response:
        return error_response(exc)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code)

    routes = [
        Route("/", index),
        Route("/api/snapshot", snapshot),
        Route("/api/events", events),
        Route("/api/session", session),
        Route("/api/login", login, methods=["POST"]),
        Route("/api/logout", logout, methods=["POST"]),
        Route("/api/messages", messages),
        Route("/api/messages/range", messages_range),
        Route("/api/messages/resend", resend, methods=["POST"]),
        Route("/api/dlq", dlq),
        Route("/api/dlq/export", dlq_export),
        Route("/api/producers", producers),
        Route("/api/producers/groups", producer_groups),
        Route("/api/routes", routes_),
        Route("/api/brokers/config", broker_config),
        Route("/api/groups/config", group_config),
        Route("/api/groups", save_group, methods=["POST"]),
        Route("/api/groups/delete", delete_group, methods=["POST"]),
        Route("/api/topics/delete", delete_topic, methods=["POST"]),
        Route("/api/replication", replication),
        Route("/api/credentials", credentials, methods=["GET", "POST"]),
        Route("/api/topics", create_topic, methods=["POST"]),
        Route("/api/consumers/reset", reset_offset, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(routes=routes, exception_handlers={
        AdminError: handle_error, BadRequest: handle_error, MessageFormatError: handle_error,
        ops.BadInput: handle_error, LoginRequired: handle_error, TooManyAttempts: handle_error,
        HTTPException: http_error})
