# Owns mqadmin's message commands: queryMsgById, queryMsgByKey,
# queryMsgByUniqueKey, queryMsgByOffset, printMsg, sendMessage and
# consumeMessage.  Reads go to any member of a broker group (every replica
# holds the same committed commitlog at the same positions, so an offset
# message id resolves on any of them); sends and offset commits go to the
# master.  sendMessage and consumeMessage are clients like any other
# (broker.client's producer and pull consumer: routes, retries, offsets on
# the master); the read-only commands use plain PULL_MESSAGE / QUERY_MESSAGE
# / VIEW_MESSAGE_BY_ID requests (tools/mqadmin/adminapi.py).
import click

from broker.client import Message, MessageQueue, open_producer, open_pull_consumer
from consumequeue.record import MessageFormatError
from tools.mqadmin.adminapi import TOOLS_GROUP, TOOLS_PRODUCER, MQAdmin, NotFoundError, message_json
from tools.mqadmin.online import TIMESTAMP, fmt_ms, online
from tools.mqadmin.render import Output

PULL_BATCH = 32


def _show(out: Output, messages: list[dict]) -> None:
    if out.as_json:
        out.json({"messages": messages})
        return
    for i, m in enumerate(messages):
        if i:
            out.line()
        out.kv([("Topic", m["topic"]), ("Tags", m["tags"]), ("Keys", " ".join(m["keys"])),
                ("Queue ID", m["queueId"]), ("Queue Offset", m["queueOffset"]),
                ("CommitLog Offset", m["commitLogOffset"]), ("Reconsume Times", m["reconsumeTimes"]),
                ("Born Timestamp", fmt_ms(m["bornTimestamp"])), ("Store Timestamp", fmt_ms(m["storeTimestamp"])),
                ("Born Host", m["bornHost"]), ("Store Host", m["storeHost"]), ("System Flag", m["sysFlag"]),
                ("Properties", ";".join(f"{k}={v}" for k, v in sorted(m["properties"].items()))),
                ("Message ID", m["msgId"]), ("OffsetID", m["offsetMsgId"]), ("Body Length", m["bodyLength"]),
                ("Message Body", m["body"] if m["body"] is not None else "hex:" + m["bodyHex"])])


@click.command("queryMsgById", epilog="""\b
Examples:
  mqadmin queryMsgById -i 7F00000100002A9F0000000000000A1C
  mqadmin queryMsgById -i ID1,ID2 --json""")
@click.option("-i", "--msgId", "msg_ids", required=True, metavar="OFFSET_MSG_ID[,..]",
              help="offset message id(s), as the send result's offsetMsgId")
@online
async def query_msg_by_id(admin: MQAdmin, out: Output, msg_ids):
    """Look messages up by their offset message id (store host + commitlog offset)."""
    found = []
    for msg_id in [m.strip() for m in msg_ids.split(",") if m.strip()]:
        try:
            found.append(await admin.find_by_offset_msg_id(msg_id))
        except MessageFormatError as e:
            raise click.BadParameter(f"{msg_id}: {e} (for a client UNIQ_KEY use queryMsgByUniqueKey)",
                                     param_hint="-i") from None
    _show(out, found)


@click.command("queryMsgByKey", epilog="""\b
Examples:
  mqadmin queryMsgByKey -t Orders -k order-1001""")
@click.option("-t", "--topic", required=True)
@click.option("-k", "--msgKey", "key", required=True, metavar="KEY")
@click.option("-b", "--beginTimestamp", "begin", type=TIMESTAMP, default=0, help="stored at or after")
@click.option("-e", "--endTimestamp", "end", type=TIMESTAMP, default=(1 << 63) - 1, help="stored at or before")
@click.option("-c", "--maxNum", "max_num", type=click.IntRange(1, 64), default=64, show_default=True)
@online
async def query_msg_by_key(admin: MQAdmin, out: Output, topic, key, begin, end, max_num):
    """Messages of a topic carrying a key (through the index)."""
    found = await admin.find_by_key(topic, key, False, max_num, begin, end)
    if out.as_json:
        out.json({"messages": found})
        return
    out.table(["#MessageId", "#OffsetMsgId", "#QID", "#Offset", "#Tags", "#StoreTime"],
              [[m["msgId"], m["offsetMsgId"], m["queueId"], m["queueOffset"], m["tags"], fmt_ms(m["storeTimestamp"])]
               for m in found])


@click.command("queryMsgByUniqueKey", epilog="""\b
Examples:
  mqadmin queryMsgByUniqueKey -t Orders -i 7F000001B2F418B4AAC2A8E5A1D20000""")
@click.option("-t", "--topic", required=True)
@click.option("-i", "--msgId", "uniq", required=True, metavar="UNIQ_KEY", help="the client message id")
@click.option("-a", "--showAll", is_flag=True, help="every copy found (retries), not just the first")
@online
async def query_msg_by_unique_key(admin: MQAdmin, out: Output, topic, uniq, showall):
    """A message by its client id (UNIQ_KEY, the send result's msgId)."""
    found = await admin.find_by_key(topic, uniq, True)
    if not found:
        raise NotFoundError(f"no message with unique key {uniq} in topic {topic}")
    _show(out, found if showall else found[:1])


@click.command("queryMsgByOffset", epilog="""\b
Examples:
  mqadmin queryMsgByOffset -t Orders -b broker-a -i 0 -o 42""")
@click.option("-t", "--topic", required=True)
@click.option("-b", "--brokerName", "broker_name", required=True, metavar="NAME")
@click.option("-i", "--queueId", "queue_id", type=click.IntRange(0), required=True)
@click.option("-o", "--offset", type=click.IntRange(0), required=True, help="queue offset")
@online
async def query_msg_by_offset(admin: MQAdmin, out: Output, topic, broker_name, queue_id, offset):
    """The message at a queue offset."""
    _show(out, [await admin.find_at_queue_offset(topic, broker_name, queue_id, offset)])


async def _queues(admin: MQAdmin, topic: str) -> list[tuple[str, str, int]]:
    """(brokerName, reader address, queueId) of every read queue."""
    route = await admin.route(topic)
    readers = await admin.topic_masters(topic)
    return [(q.broker_name, readers[q.broker_name], qid) for q in sorted(route.queue_datas, key=lambda q: q.broker_name)
            if q.broker_name in readers for qid in range(q.read_queue_nums)]


@click.command("printMsg", epilog="""\b
Examples:
  mqadmin printMsg -t Orders
  mqadmin printMsg -t Orders -b 2026-11-22#08:00:00:000 -e now --json""")
@click.option("-t", "--topic", required=True)
@click.option("-b", "--beginTimestamp", "begin", type=TIMESTAMP, help="from the first message stored at or after")
@click.option("-e", "--endTimestamp", "end", type=TIMESTAMP, help="up to the messages stored before")
@click.option("-d", "--printBody", "print_body", type=click.BOOL, default=True, show_default=True)
@online
async def print_msg(admin: MQAdmin, out: Output, topic, begin, end, print_body):
    """Every message of a topic (optionally a time range), queue by queue."""
    queues = await _queues(admin, topic)
    spans = []
    for name, addr, qid in queues:
        lo = await admin.offset_by_time(addr, topic, qid, begin) if begin is not None else None
        hi = await admin.offset_by_time(addr, topic, qid, end) if end is not None else None
        spans.append((name, addr, qid, lo, hi))
    messages = []
    with out.progress(f"reading {topic}", len(spans)) as advance:
        for name, addr, qid, lo, hi in spans:
            offset = lo if lo is not None else 0
            while True:
                nxt, qmin, qmax, records = await admin.pull(addr, TOOLS_GROUP, topic, qid, max(offset, 0), PULL_BATCH)
                stop = qmax if hi is None else min(hi, qmax)
                for r in records:
                    if r.queue_offset < stop:
                        m = message_json(r)
                        m["brokerName"] = name
                        messages.append(m)
                if not records or nxt >= stop or nxt <= offset:
                    break
                offset = nxt
            advance()
    if not print_body:
        for m in messages:
            m["body"] = m["bodyHex"] = None
    if out.as_json:
        out.json({"topic": topic, "messages": messages})
        return
    for m in messages:
        body = f" BODY: {m['body'] if m['body'] is not None else m['bodyHex']}" if print_body else ""
        out.line(f"MSGID: {m['msgId']} BROKER: {m['brokerName']} QID: {m['queueId']} OFFSET: {m['queueOffset']} "
                 f"TAGS: {m['tags'] or '-'} KEYS: {' '.join(m['keys']) or '-'} "
                 f"STORETIME: {fmt_ms(m['storeTimestamp'])}{body}")


def _queue_filter(broker_name: str | None, queue_id: int | None):
    return lambda mq: (broker_name is None or mq.broker_name == broker_name) and (queue_id is None or
                                                                                mq.queue_id == queue_id)


@click.command("sendMessage", epilog="""\b
Examples:
  mqadmin sendMessage -t Orders -p 'hello' -k order-1001 -c TagA
  mqadmin sendMessage -t Orders -p 'hello' -b broker-a -i 0 --json""")
@click.option("-t", "--topic", required=True)
@click.option("-p", "--body", required=True, help="message body (UTF-8)")
@click.option("-k", "--keys", help="message key(s), space separated")
@click.option("-c", "--tags", help="message tag")
@click.option("-b", "--broker", "broker_name", metavar="NAME", help="send to this broker group")
@click.option("-i", "--qid", "queue_id", type=click.IntRange(0), help="send to this queue")
@online
async def send_message(admin: MQAdmin, out: Output, topic, body, keys, tags, broker_name, queue_id):
    """Send one message (a producer of group TOOLS_PRODUCER)."""
    selector = None
    if broker_name is not None or queue_id is not None:
        wanted = _queue_filter(broker_name, queue_id)

        def selector(queues, _msg):
            chosen = [q for q in queues if wanted(q)]
            if not chosen:  # checked against the route before sending; a route change could still land here
                raise NotFoundError(f"topic {topic} has no queue {broker_name or '*'}/"
                                    f"{'*' if queue_id is None else queue_id}")
            return chosen[0]
        route = await admin.route(topic)
        writable = [MessageQueue(topic, q.broker_name, i) for q in route.queue_datas for i in range(q.write_queue_nums)]
        if not any(wanted(q) for q in writable):
            raise NotFoundError(f"topic {topic} has no write queue {broker_name or '*'}/"
                                f"{'*' if queue_id is None else queue_id}")
    async with open_producer(TOOLS_PRODUCER, namesrv_addr=admin.namesrv_addr, timeout=admin.timeout,
                             credentials=admin.remoting.rpc_hook, tls=admin.remoting.tls) as producer:
        r = await producer.send(Message(topic, body.encode("utf-8"), tags=tags, keys=tuple((keys or "").split())),
                                selector=selector)
    result = {"brokerName": r.queue.broker_name, "queueId": r.queue.queue_id, "queueOffset": r.queue_offset,
              "sendStatus": r.status.value if hasattr(r.status, "value") else str(r.status), "msgId": r.msg_id,
              "offsetMsgId": r.offset_msg_id}
    if out.as_json:
        out.json(result)
        return
    out.table(["#BrokerName", "#QID", "#QueueOffset", "#SendResult", "#MsgId", "#OffsetMsgId"],
              [[result["brokerName"], result["queueId"], result["queueOffset"], result["sendStatus"],
                result["msgId"], result["offsetMsgId"]]])


@click.command("consumeMessage", epilog="""\b
Starts at the group's committed offsets (the queue's first message when it
has none) and commits the new offsets afterwards (--no-commit to browse).
Examples:
  mqadmin consumeMessage -t Orders -g OrderConsumers -c 10
  mqadmin consumeMessage -t Orders -g OrderConsumers -b broker-a -i 0 -o 5 --no-commit""")
@click.option("-t", "--topic", required=True)
@click.option("-g", "--consumerGroup", "group", required=True, metavar="GROUP")
@click.option("-c", "--count", type=click.IntRange(1), default=128, show_default=True, help="at most this many")
@click.option("-b", "--brokerName", "broker_name", metavar="NAME", help="only this broker group")
@click.option("-i", "--queueId", "queue_id", type=click.IntRange(0), help="only this queue")
@click.option("-o", "--offset", type=click.IntRange(0), help="start here instead of the committed offset")
@click.option("--commit/--no-commit", default=True, show_default=True, help="commit the new offsets")
@online
async def consume_message(admin: MQAdmin, out: Output, topic, group, count, broker_name, queue_id, offset, commit):
    """Consume messages of a topic as a consumer group (a pull consumer)."""
    await admin.route(topic)  # NotFoundError for an unknown topic, before any client starts
    messages, commits = [], []
    async with open_pull_consumer(group, namesrv_addr=admin.namesrv_addr, timeout=admin.timeout,
                                  credentials=admin.remoting.rpc_hook, tls=admin.remoting.tls) as consumer:
        queues = [q for q in await consumer.fetch_queues(topic) if _queue_filter(broker_name, queue_id)(q)]
        if not queues:
            raise NotFoundError(f"topic {topic} has no such queue")
        with out.progress(f"consuming {topic}", count) as advance:
            for mq in queues:
                if len(messages) >= count:
                    break
                start = offset if offset is not None else await consumer.fetch_offset(mq)
                if start < 0:
                    start = await consumer.min_offset(mq)
                pos = start
                while len(messages) < count:
                    res = await consumer.pull(mq, pos, min(PULL_BATCH, count - len(messages)))
                    for ext in res.messages[:count - len(messages)]:
                        m = message_json(ext.record, ext.body)
                        m["brokerName"] = mq.broker_name
                        messages.append(m)
                        pos = ext.record.queue_offset + 1
                        advance()
                    if not res.messages:
                        break
                if commit and pos != start:
                    await consumer.update_offset(mq, pos)
                    commits.append({"brokerName": mq.broker_name, "queueId": mq.queue_id, "offset": pos})
    if out.as_json:
        out.json({"topic": topic, "group": group, "consumed": len(messages), "messages": messages,
                  "committed": commits})
        return
    for m in messages:
        out.line(f"MSGID: {m['msgId']} BROKER: {m['brokerName']} QID: {m['queueId']} OFFSET: {m['queueOffset']} "
                 f"TAGS: {m['tags'] or '-'} BODY: {m['body'] if m['body'] is not None else m['bodyHex']}")
    out.note(f"consumed {len(messages)} message(s)" + (f", offsets committed on {len(commits)} queue(s)"
                                                        if commit else ""))


def register(group) -> None:
    for cmd in (query_msg_by_id, query_msg_by_key, query_msg_by_unique_key, query_msg_by_offset, print_msg,
                send_message, consume_message):
        group.add_command(cmd)

