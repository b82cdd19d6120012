# Owns what the console's daily pages do with the cluster, over MQAdmin
# (and the client library's producer for resends): every producer group of
# every master and a named group's clients, with versions and languages, the dead-letter queue (browse, resend
# to the original topic, export as JSON lines), messages by time range and
# their resend, deleting topics and groups, creating a group and editing its
# config, topic routes, and a broker's effective config with secrets masked.
# Each returns JSON-ready values and raises AdminError (or BadInput for a
# request that cannot be right); app.py translates both at its boundary.
#
# Bounds: the producer list shows at most MAX_PRODUCER_ROWS clients (each
# broker lists at most its own bound, and says when it cut), a resend takes at
# most MAX_RESEND, an export at most MAX_EXPORT; a decompressed body is cut
# at MAX_BODY; a broker config is only read from a registered broker (the
# console never connects where a request tells it to).
import re
import zlib

from broker.client import Message, open_producer
from broker.client.errors import ClientError
from tools.mqadmin.adminapi import (
    TOOLS_PRODUCER,
    AdminError,
    MQAdmin,
    NotFoundError,
    from_client_error,
    gather,
    message_json,
)

MAX_BROWSE = 500
MAX_PRODUCER_ROWS = 5_000
MAX_EXPORT = 2_000
MAX_RESEND = 100
MAX_BODY = 4 << 20
RETRY_TOPIC = "RETRY_TOPIC"
DLQ_PREFIX = "%DLQ%"
# RocketMQ's own message properties (MessageConst); a resend carries the
# user's properties only, tags and keys as fields, and gets a new unique key.
SYSTEM_PROPERTIES = frozenset({
    "TAGS", "KEYS", "UNIQ_KEY", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC", "REAL_QID", "TRAN_MSG",
    "TRAN_PREPARED_QUEUE_OFFSET", "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", "ORIGIN_MESSAGE_ID",
    "TRANSFER_FLAG", "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME", "MSG_REGION", "TRACE_ON",
    "UNIQ_KEY", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "POP_CK", "POP_CK_OFFSET", "1ST_POP_TIME",
    "SHARDING_KEY", "CLUSTER", "INNER_BASE", "INNER_NUM", "INNER_MULTI_DISPATCH", "INNER_MULTI_QUEUE_OFFSET",
    "__STARTDELIVERTIME", "CHECK_IMMUNITY_TIME_IN_SECONDS", "TRANSACTION_CHECK_TIMES", "MSG_TYPE",
    "REPLY_TO_CLIENT", "CORRELATION_ID", "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME", "REPLY_MESSAGE_ARRIVE_TIME",
})
SYSTEM_PREFIXES = ("TIMER_", "__", "INNER_")
SECRET_NAME = re.compile(r"secret|password|passwd|token|accesskey|credential|(key|keys)$", re.IGNORECASE)
MASK = "******"
# The subscription group config fields the console edits (updateSubGroup's): name -> (type, lo, hi).
GROUP_FIELDS = {
    "consumeEnable": (bool, None, None), "consumeFromMinEnable": (bool, None, None),
    "consumeBroadcastEnable": (bool, None, None), "consumeMessageOrderly": (bool, None, None),
    "notifyConsumerIdsChangedEnable": (bool, None, None),
    "retryQueueNums": (int, 0, 1024), "retryMaxTimes": (int, -1, 10000), "brokerId": (int, 0, 1 << 20),
    "whichBrokerWhenConsumeSlowly": (int, 0, 1 << 20),
}
GROUP_DEFAULTS = {"consumeEnable": True, "consumeFromMinEnable": False, "consumeBroadcastEnable": False,
                  "consumeMessageOrderly": False, "notifyConsumerIdsChangedEnable": True, "retryQueueNums": 1,
                  "retryMaxTimes": 16, "brokerId": 0, "whichBrokerWhenConsumeSlowly": 1}
NAME = re.compile(r"^[%|a-zA-Z0-9_-]{1,255}$")  # topic and group names (RocketMQ's check, plus %RETRY%/%DLQ%)


class BadInput(Exception):
    """A request that cannot be right (a bad name, field or count)."""


def check_name(kind: str, name: object) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise BadInput(f"{kind}: {name!r} is not a valid name (1-255 of letters, digits, %, |, _ and -)")
    return name


def version_desc(ordinal: object) -> str:
    """MQVersion's name of a client's version ordinal ("V4_9_4"); from
    V4_9_4 (401) on the ordinals run two per release (SNAPSHOT, release),
    ten patch releases per minor: older ones are shown as their number."""
    try:
        n = int(ordinal)
    except (TypeError, ValueError):
        return str(ordinal)
    if n < 400 or n > 2000:
        return f"#{n}"
    release, snapshot = divmod(n - 401, 2) if n >= 401 else (-1, 1)
    idx = 494 + release + (1 if snapshot else 0)
    major, rest = divmod(idx, 100)
    minor, patch = divmod(rest, 10)
    return f"V{major}_{minor}_{patch}" + ("_SNAPSHOT" if snapshot else "")


def connection_row(c: dict) -> dict:
    return {"clientId": str(c.get("clientId", "?")), "clientAddr": str(c.get("clientAddr", "")),
            "language": str(c.get("language", "")), "version": c.get("version"),
            "versionDesc": version_desc(c.get("version"))}


# --- producers -------------------------------------------------------------------------------

async def producers(admin: MQAdmin, group: str) -> dict:
    """The clients of a producer group on every master (a producer sends its
    heartbeat to every broker it knows, so each master lists it)."""
    check_name("producer group", group)
    masters = await admin.masters()
    answers = await gather(sorted(masters.values()), lambda a: admin.producer_connection(a, group))
    by_id: dict[str, dict] = {}
    errors = {}
    for addr, ans in sorted(answers.items()):
        if isinstance(ans, NotFoundError):
            continue
        if isinstance(ans, AdminError):
            errors[addr] = str(ans)
            continue
        for c in ans.get("connectionSet") or []:
            row = by_id.setdefault(str(c.get("clientId", "?")), {**connection_row(c), "brokers": []})
            row["brokers"].append(addr)
    if not by_id and not errors:
        raise NotFoundError(f"producer group {group} has no producer connected to any master")
    return {"group": group, "connections": sorted(by_id.values(), key=lambda r: r["clientId"]), "errors": errors}


async def producer_groups(admin: MQAdmin) -> dict:
    """Every producer group connected to any master (GET_ALL_PRODUCER_INFO
    of each), a client listed once per group with the masters it is
    connected to; groups and clients in name order."""
    masters = await admin.masters()
    answers = await gather(sorted(masters.values()), admin.all_producer_info)
    groups: dict[str, dict[str, dict]] = {}
    errors, notes, rows = {}, {}, 0
    for addr, ans in sorted(answers.items()):
        if isinstance(ans, AdminError):
            errors[addr] = str(ans)
            continue
        if ans.remark:
            notes[addr] = ans.remark
        for group, producers in ans.groups.items():
            for p in producers:
                cid = str(p.get("clientId", "?"))
                row = groups.setdefault(str(group), {}).get(cid)
                if row is None:
                    if rows >= MAX_PRODUCER_ROWS:
                        notes["console"] = f"the console shows at most {MAX_PRODUCER_ROWS} producer clients"
                        continue
                    rows += 1
                    addr_text = str(p.get("remoteIP") or "")
                    row = groups[str(group)][cid] = {
                        **connection_row({**p, "clientAddr": addr_text[1:] if addr_text.startswith("/") else addr_text}),
                        "lastUpdateTimestamp": p.get("lastUpdateTimestamp"), "brokers": []}
                row["brokers"].append(addr)
    return {"groups": [{"group": g, "connections": [clients[c] for c in sorted(clients)]}
                       for g, clients in sorted(groups.items()) if clients],
            "errors": errors, "notes": notes}


# --- topics, routes, groups -------------------------------------------------------------------

async def topic_route(admin: MQAdmin, topic: str) -> dict:
    check_name("topic", topic)
    route = await admin.route(topic)
    return {"topic": topic,
            "brokers": [{"cluster": bd.cluster, "brokerName": bd.broker_name,
                         "addrs": [{"brokerId": bid, "addr": a} for bid, a in sorted(bd.broker_addrs.items())]}
                        for bd in sorted(route.broker_datas, key=lambda b: b.broker_name)],
            "queues": [{"brokerName": q.broker_name, "readQueueNums": q.read_queue_nums,
                        "writeQueueNums": q.write_queue_nums, "perm": q.perm}
                       for q in sorted(route.queue_datas, key=lambda q: q.broker_name)]}


async def _cluster_masters(admin: MQAdmin, cluster: str) -> dict[str, str]:
    masters = await admin.masters(cluster)
    if not masters:
        raise AdminError(f"cluster {cluster} has no master right now")
    return masters


async def delete_topic(admin: MQAdmin, cluster: str, topic: str) -> dict:
    """mqadmin deleteTopic: from every master of the cluster, then the name servers."""
    check_name("topic", topic)
    await admin.route(topic)  # NotFoundError for an unknown topic
    masters = await _cluster_masters(admin, cluster)
    for addr in masters.values():
        await admin.delete_topic_in_broker(addr, topic)
    await admin.delete_topic_in_namesrv(topic, cluster)
    return {"topic": topic, "cluster": cluster, "deletedFrom": sorted(masters)}


async def group_config(admin: MQAdmin, group: str) -> dict:
    check_name("group", group)
    masters = await admin.masters()
    for _name, addr in sorted(masters.items()):
        configs = await admin.all_group_configs(addr)
        if group in configs:
            cfg = configs[group]
            return {"group": group, "config": {k: cfg.get(k, GROUP_DEFAULTS[k]) for k in GROUP_FIELDS}}
    raise NotFoundError(f"subscription group {group} does not exist on any master")


def group_config_from(body: dict) -> dict:
    """The config updateSubGroup sends, from a request's fields (typed and bounded)."""
    config = {"groupName": check_name("group", body.get("group"))}
    for name, (kind, lo, hi) in GROUP_FIELDS.items():
        value = body.get(name, GROUP_DEFAULTS[name])
        if kind is bool:
            if isinstance(value, str) and value.lower() in ("true", "false"):
                value = value.lower() == "true"
            if not isinstance(value, bool):
                raise BadInput(f"{name}: {value!r} is not true or false")
        else:
            if isinstance(value, bool):
                raise BadInput(f"{name}: {value!r} is not a number")
            try:
                value = int(value)
            except (TypeError, ValueError):
                raise BadInput(f"{name}: {value!r} is not a number") from None
            if not lo <= value <= hi:
                raise BadInput(f"{name}: {value} is not in {lo}..{hi}")
        config[name] = value
    return config


async def save_group(admin: MQAdmin, cluster: str, body: dict) -> dict:
    """Create a subscription group or change its config on every master."""
    config = group_config_from(body)
    masters = await _cluster_masters(admin, cluster)
    for addr in masters.values():
        await admin.update_sub_group(addr, config)
    return {"group": config["groupName"], "config": config, "updated": sorted(masters)}


async def delete_group(admin: MQAdmin, cluster: str, group: str, remove_offset: bool) -> dict:
    """mqadmin deleteSubGroup on every master; with remove_offset also its
    %RETRY% and %DLQ% topics."""
    check_name("group", group)
    masters = await _cluster_masters(admin, cluster)
    for addr in masters.values():
        await admin.delete_sub_group(addr, group, remove_offset)
    removed = []
    if remove_offset:
        for topic in (f"%RETRY%{group}", f"{DLQ_PREFIX}{group}"):
            for addr in masters.values():
                await admin.delete_topic_in_broker(addr, topic)
            await admin.delete_topic_in_namesrv(topic, cluster)
            removed.append(topic)
    return {"group": group, "deletedFrom": sorted(masters), "removedTopics": removed}


# --- broker config ------------------------------------------------------------------------------

def mask_config(config: dict[str, str]) -> dict[str, str]:
    """Values of keys that name secrets (accessKey, secretKey, passwords,
    tokens, keys) replaced by MASK; empty values stay empty."""
    return {k: (MASK if v and SECRET_NAME.search(k) else v) for k, v in sorted(config.items())}


async def broker_config(admin: MQAdmin, addr: str) -> dict:
    registered = {b.addr: b for b in await admin.brokers()}
    if addr not in registered:
        raise NotFoundError(f"{addr} is not a broker registered with the name server")
    b = registered[addr]
    return {"addr": addr, "brokerName": b.broker_name, "brokerId": b.broker_id,
            "config": mask_config(await admin.broker_config(addr))}


# --- messages: browse, DLQ, resend, export -------------------------------------------------------

def _limit(value: int, top: int) -> int:
    if not 1 <= value <= top:
        raise BadInput(f"limit: {value} is not in 1..{top}")
    return value


def _bounded_body(m: dict) -> dict:
    """message_json with a compressed body inflated (at most MAX_BODY)."""
    if m["sysFlag"] & 0x1 and m["bodyHex"] is not None:
        try:
            d = zlib.decompressobj()
            raw = d.decompress(bytes.fromhex(m["bodyHex"]), MAX_BODY)
        except zlib.error:
            return m
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        m = {**m, "body": text, "bodyHex": None if text is not None else raw.hex(), "bodyLength": len(raw),
             "compressed": True}
    return m


async def browse(admin: MQAdmin, topic: str, begin: int | None, end: int | None, limit: int) -> dict:
    check_name("topic", topic)
    if begin is not None and end is not None and end < begin:
        raise BadInput("the end of the range is before its begin")
    messages, more = await admin.messages_in_range(topic, begin, end, _limit(limit, MAX_BROWSE))
    return {"topic": topic, "begin": begin, "end": end, "messages": [_bounded_body(m) for m in messages],
            "truncated": more}


async def dlq(admin: MQAdmin, group: str, limit: int) -> dict:
    check_name("group", group)
    topic = DLQ_PREFIX + group
    try:
        out = await browse(admin, topic, None, None, limit)
    except NotFoundError:
        return {"group": group, "topic": topic, "messages": [], "truncated": False}
    for m in out["messages"]:
        m["originalTopic"] = m["properties"].get(RETRY_TOPIC)
    return {"group": group, **out}


async def export_lines(admin: MQAdmin, topic: str):
    """JSON lines (bytes) of every message of `topic`, at most MAX_EXPORT."""
    import orjson
    messages, more = await admin.messages_in_range(check_name("topic", topic), None, None, MAX_EXPORT)
    for m in messages:
        yield orjson.dumps(_bounded_body(m)) + b"\n"
    if more:
        yield orjson.dumps({"truncated": True, "limit": MAX_EXPORT}) + b"\n"


def _resend_message(record, target: str) -> Message:
    m = _bounded_body(message_json(record))
    body = bytes.fromhex(m["bodyHex"]) if m["body"] is None else m["body"].encode("utf-8")
    props = {k: v for k, v in record.properties.items()
             if k not in SYSTEM_PROPERTIES and not k.startswith(SYSTEM_PREFIXES)}
    return Message(target, body, tags=record.tags or None, keys=tuple(record.keys), properties=props)


async def resend(admin: MQAdmin, items: list, to_original: bool) -> dict:
    """Send again each message named by {topic, brokerName, queueId,
    queueOffset}: to its own topic, or (to_original: a DLQ or retry copy)
    to the topic it was first sent to (its RETRY_TOPIC property)."""
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_RESEND:
        raise BadInput(f"messages: a list of 1..{MAX_RESEND} {{topic, brokerName, queueId, queueOffset}}")
    plan = []
    for it in items:
        if not isinstance(it, dict):
            raise BadInput("messages: each item is {topic, brokerName, queueId, queueOffset}")
        try:
            where = (check_name("topic", it.get("topic")), check_name("brokerName", it.get("brokerName")),
                     int(it["queueId"]), int(it["queueOffset"]))
        except (KeyError, TypeError, ValueError):
            raise BadInput("messages: each item needs topic, brokerName, queueId and queueOffset") from None
        record = await admin.record_at(*where)
        target = record.properties.get(RETRY_TOPIC) if to_original else record.topic
        if not target:
            raise BadInput(f"{where[0]}/{where[1]}/{where[2]}@{where[3]} has no original topic (RETRY_TOPIC)")
        plan.append((where, _resend_message(record, target)))
    results = []
    try:
        async with open_producer(TOOLS_PRODUCER, namesrv_addr=admin.namesrv_addr, timeout=admin.timeout,
                                 credentials=admin.remoting.rpc_hook, tls=admin.remoting.tls) as producer:
            for (topic, broker_name, qid, off), msg in plan:
                r = await producer.send(msg)
                results.append({"from": {"topic": topic, "brokerName": broker_name, "queueId": qid,
                                         "queueOffset": off},
                                "topic": msg.topic, "msgId": r.msg_id, "brokerName": r.queue.broker_name,
                                "queueId": r.queue.queue_id, "queueOffset": r.queue_offset})
    except ClientError as e:
        raise from_client_error(e) from None
    return {"resent": results}
