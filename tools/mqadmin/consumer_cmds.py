# Owns mqadmin's consumer and producer commands: consumerProgress,
# consumerConnection, producerConnection, producer, resetOffsetByTime,
# updateSubGroup and deleteSubGroup.  Consumer offsets and subscription groups are part of
# each broker group's replicated metadata: they are read from and written to
# the group's master; client connections are whatever clients heartbeat to.
import click

from tools.mqadmin.adminapi import AdminError, MQAdmin, NotFoundError
from tools.mqadmin.online import TIMESTAMP, fmt_ms, online
from tools.mqadmin.render import Output


async def _masters(admin: MQAdmin, cluster: str | None) -> dict[str, str]:
    masters = await admin.masters(cluster)
    if not masters:
        raise NotFoundError("no master broker is registered with the name server")
    return masters


def _targets_option(fn):
    fn = click.option("-c", "--clusterName", "cluster", metavar="CLUSTER", help="every master of the cluster")(fn)
    return click.option("-b", "--brokerAddr", "broker_addr", metavar="ADDR", help="one broker (a master)")(fn)


async def _write_targets(admin: MQAdmin, broker_addr, cluster) -> list[str]:
    if bool(broker_addr) == bool(cluster):
        raise click.UsageError("give exactly one of -b ADDR or -c CLUSTER")
    return [broker_addr] if broker_addr else sorted((await _masters(admin, cluster)).values())


@click.command("consumerProgress", epilog="""\b
Diff is the broker offset minus the consumer offset: messages not consumed yet.
Without -g: one line per consumer group (clients online, type, model, TPS,
total diff), as RocketMQ's consumerProgress prints it.
Examples:
  mqadmin consumerProgress
  mqadmin consumerProgress -g OrderConsumers
  mqadmin consumerProgress -g OrderConsumers -t Orders --json""")
@click.option("-g", "--groupName", "group", metavar="GROUP", help="consumer group (default: every group)")
@click.option("-t", "--topicName", "topic", metavar="TOPIC", help="only this topic")
@click.option("-c", "--clusterName", "cluster", metavar="CLUSTER", help="only this cluster's brokers")
@online
async def consumer_progress(admin: MQAdmin, out: Output, group, topic, cluster):
    """Per queue: broker offset, consumer offset and lag; with totals."""
    if not group:
        return await _every_group(admin, out, cluster)
    if topic:
        names = await admin.topic_masters(topic)
        masters = {n: a for n, a in (await _masters(admin, cluster)).items() if n in names} if cluster else names
    else:
        masters = await _masters(admin, cluster)
    rows = []
    for name, addr in sorted(masters.items()):
        for (t, broker_name, qid), w in (await admin.consume_stats(addr, group, topic)).items():
            consumer = w["consumerOffset"]
            rows.append({"topic": t, "brokerName": broker_name, "queueId": qid, "brokerOffset": w["brokerOffset"],
                         "consumerOffset": consumer, "diff": max(0, w["brokerOffset"] - max(consumer, 0)),
                         "lastTimestamp": w.get("lastTimestamp", 0)})
    if not rows:
        raise NotFoundError(f"consumer group {group} has no consume progress "
                            f"(unknown group, or it never committed an offset)")
    rows.sort(key=lambda r: (r["topic"], r["brokerName"], r["queueId"]))
    total = sum(r["diff"] for r in rows)
    # Per broker group: a drained group (wipeWritePerm) reads 0 here.
    by_broker: dict[str, int] = {}
    for r in rows:
        by_broker[r["brokerName"]] = by_broker.get(r["brokerName"], 0) + r["diff"]
    if out.as_json:
        out.json({"group": group, "queues": rows, "diffTotal": total, "diffByBroker": by_broker})
        return
    out.table(["#Topic", "#BrokerName", "#QID", "#BrokerOffset", "#ConsumerOffset", "#Diff", "#LastTime"],
              [[r["topic"], r["brokerName"], r["queueId"], r["brokerOffset"], r["consumerOffset"], r["diff"],
                fmt_ms(r["lastTimestamp"])] for r in rows])
    out.line()
    if len(by_broker) > 1:
        out.line("Diff by broker: " + ", ".join(f"{b} {d}" for b, d in sorted(by_broker.items())))
    out.line(f"Diff Total: {total}")


async def _every_group(admin: MQAdmin, out: Output, cluster) -> None:
    """consumerProgress without -g: the groups the masters know (their
    subscription group configs, and whoever consumes their topics)."""
    masters = await _masters(admin, cluster)
    groups: set[str] = set()
    for addr in masters.values():
        groups |= set(await admin.all_group_configs(addr))
    for topic in await admin.topic_list():
        if topic.startswith(("%RETRY%", "%DLQ%")):
            continue
        try:
            for addr in (await admin.topic_masters(topic)).values():
                groups |= set(await admin.consume_by_who(addr, topic))
        except AdminError:
            continue  # the topic or its broker went away meanwhile
    rows = []
    for group in sorted(groups):
        diff, tps, conns, info = 0, 0.0, {}, {}
        for addr in masters.values():
            try:
                stats = await admin.consume_stats(addr, group)
            except NotFoundError:
                stats = {}
            diff += sum(max(0, w["brokerOffset"] - max(w["consumerOffset"], 0)) for w in stats.values())
            tps += await admin.consume_tps(addr, group)
            try:
                answer = await admin.consumer_connection(addr, group)
            except NotFoundError:
                continue
            info = info or answer
            conns.update({c["clientId"]: c for c in answer.get("connectionSet") or []})
        versions = sorted({str(c.get("version")) for c in conns.values()})
        rows.append({"group": group, "count": len(conns), "version": versions[0] if len(versions) == 1 else None,
                     "type": info.get("consumeType"), "model": info.get("messageModel"), "tps": round(tps, 2),
                     "diffTotal": diff})
    if out.as_json:
        out.json({"groups": rows})
        return
    out.table(["#Group", "#Count", "#Version", "#Type", "#Model", "#TPS", "#Diff_Total"],
              [[r["group"], r["count"], r["version"], r["type"], r["model"], r["tps"], r["diffTotal"]]
               for r in rows])


async def _merge_connections(admin: MQAdmin, addrs, fetch) -> tuple[dict, dict]:
    """(clientId -> connection, first full answer) over several brokers."""
    conns, first, missing = {}, None, []
    for addr in addrs:
        try:
            body = await fetch(addr)
        except NotFoundError as e:
            missing.append(e)
            continue
        first = first or body
        for c in body.get("connectionSet") or []:
            conns.setdefault(c["clientId"], c)
    if first is None:
        raise missing[0] if missing else NotFoundError("nothing found")
    return conns, first


@click.command("consumerConnection", epilog="""\b
Examples:
  mqadmin consumerConnection -g OrderConsumers""")
@click.option("-g", "--consumerGroup", "group", required=True, metavar="GROUP")
@click.option("-b", "--brokerAddr", "broker_addr", metavar="ADDR", help="ask this broker only")
@online
async def consumer_connection(admin: MQAdmin, out: Output, group, broker_addr):
    """The clients of a consumer group and what they subscribe to."""
    addrs = [broker_addr] if broker_addr else [b.addr for b in await admin.brokers()]
    conns, first = await _merge_connections(admin, addrs, lambda a: admin.consumer_connection(a, group))
    result = {"group": group, "connectionSet": sorted(conns.values(), key=lambda c: c["clientId"]),
              "subscriptionTable": first.get("subscriptionTable") or {},
              "consumeType": first.get("consumeType"), "messageModel": first.get("messageModel"),
              "consumeFromWhere": first.get("consumeFromWhere")}
    if out.as_json:
        out.json(result)
        return
    out.table(["#", "#ClientId", "#ClientAddr", "#Language", "#Version"],
              [[i + 1, c["clientId"], c["clientAddr"], c["language"], c["version"]]
               for i, c in enumerate(result["connectionSet"])])
    out.line()
    out.table(["#Topic", "#SubExpression"],
              [[t, s.get("subString")] for t, s in sorted(result["subscriptionTable"].items())])
    out.line()
    out.line(f"ConsumeType: {result['consumeType']}")
    out.line(f"MessageModel: {result['messageModel']}")
    out.line(f"ConsumeFromWhere: {result['consumeFromWhere']}")


@click.command("producerConnection", epilog="""\b
Examples:
  mqadmin producerConnection -g OrderProducers -t Orders""")
@click.option("-g", "--producerGroup", "group", required=True, metavar="GROUP")
@click.option("-t", "--topic", required=True)
@online
async def producer_connection(admin: MQAdmin, out: Output, group, topic):
    """The clients of a producer group, on the brokers serving a topic."""
    addrs = sorted((await admin.topic_masters(topic)).values())
    conns, _ = await _merge_connections(admin, addrs, lambda a: admin.producer_connection(a, group))
    rows = sorted(conns.values(), key=lambda c: c["clientId"])
    if out.as_json:
        out.json({"group": group, "topic": topic, "connectionSet": rows})
        return
    out.table(["#", "#ClientId", "#ClientAddr", "#Language", "#Version"],
              [[i + 1, c["clientId"], c["clientAddr"], c["language"], c["version"]] for i, c in enumerate(rows)])


@click.command("producer", epilog="""\b
One line per producer client, as RocketMQ's `mqadmin producer` prints it:
  producer group (GROUP) instance : clientId=...,remoteIP=/IP:PORT, language=JAVA, version=..., lastUpdateTimestamp=...
Groups and clients in name order; a broker lists at most 5,000 clients (a
note on stderr says when some were left out).  -n is not needed.
Examples:
  mqadmin producer -b 127.0.0.1:10911
  mqadmin producer -b 127.0.0.1:10911 --json""")
@click.option("-b", "--broker", "broker_addr", required=True, metavar="ADDR", help="broker address")
@online(namesrv=False)
async def producer(admin: MQAdmin, out: Output, broker_addr):
    """Every producer group connected to a broker, with its clients'
    addresses, languages and versions (GET_ALL_PRODUCER_INFO)."""
    t = await admin.all_producer_info(broker_addr.strip())
    if out.as_json:
        out.json({"broker": t.addr, "data": t.groups, "groupTotal": t.group_total, "producerTotal": t.producer_total,
                  "remark": t.remark})
        return
    for group, producers in t.groups.items():
        if not producers:
            out.line(f"producer group ({group}) instances are empty")
        for p in producers:
            out.line(f"producer group ({group}) instance : clientId={p.get('clientId')},remoteIP={p.get('remoteIP')}, "
                     f"language={p.get('language')}, version={p.get('version')}, "
                     f"lastUpdateTimestamp={p.get('lastUpdateTimestamp')}")
    if t.remark:
        out.note(f"mqadmin: {t.remark}")


@click.command("resetOffsetByTime", epilog="""\b
TIMESTAMP: ms since the epoch, yyyy-MM-dd#HH:mm:ss:SSS (local time), or now;
-1 resets to the end of each queue.
Examples:
  mqadmin resetOffsetByTime -g OrderConsumers -t Orders -s 2026-11-22#08:00:00:000
  mqadmin resetOffsetByTime -g OrderConsumers -t Orders -s now -f false""")
@click.option("-g", "--group", required=True, metavar="GROUP")
@click.option("-t", "--topic", required=True)
@click.option("-s", "--timestamp", required=True, type=TIMESTAMP)
@click.option("-f", "--force", type=click.BOOL, default=True, show_default=True, metavar="true|false",
              help="false: only move offsets back, never forward")
@online
async def reset_offset_by_time(admin: MQAdmin, out: Output, group, topic, timestamp, force):
    """Move a group's offsets on a topic to the first message stored at or
    after a time (committed through the replicated offsets; online clients
    are told to follow)."""
    rows = []
    for name, addr in sorted((await admin.topic_masters(topic)).items()):
        for (_t, broker_name, qid), offset in sorted((await admin.reset_offset(addr, topic, group, timestamp,
                                                                               force)).items()):
            rows.append({"brokerName": broker_name, "queueId": qid, "offset": offset})
    if out.as_json:
        out.json({"group": group, "topic": topic, "timestamp": timestamp, "offsets": rows})
        return
    out.table(["#BrokerName", "#QueueId", "#Offset"], [[r["brokerName"], r["queueId"], r["offset"]] for r in rows])


@click.command("updateSubGroup", epilog="""\b
Examples:
  mqadmin updateSubGroup -c LedgerCluster -g OrderConsumers
  mqadmin updateSubGroup -b 127.0.0.1:10911 -g OrderConsumers -r 3 -q 1""")
@_targets_option
@click.option("-g", "--groupName", "group", required=True, metavar="GROUP")
@click.option("-s", "--consumeEnable", type=click.BOOL, default=True, show_default=True)
@click.option("-m", "--consumeFromMinEnable", type=click.BOOL, default=False, show_default=True)
@click.option("-d", "--consumeBroadcastEnable", type=click.BOOL, default=False, show_default=True)
@click.option("-o", "--consumeMessageOrderly", type=click.BOOL, default=False, show_default=True)
@click.option("-q", "--retryQueueNums", type=click.IntRange(0, 1024), default=1, show_default=True)
@click.option("-r", "--retryMaxTimes", type=click.IntRange(-1, 10000), default=16, show_default=True)
@click.option("-i", "--brokerId", type=click.IntRange(0), default=0, show_default=True)
@click.option("-w", "--whichBrokerWhenConsumeSlowly", type=click.IntRange(0), default=1, show_default=True)
@click.option("-a", "--notifyConsumerIdsChanged", type=click.BOOL, default=True, show_default=True)
@online
async def update_sub_group(admin: MQAdmin, out: Output, broker_addr, cluster, group, **opts):
    """Create or change a subscription (consumer) group."""
    names = {"consumeenable": "consumeEnable", "consumefromminenable": "consumeFromMinEnable",
             "consumebroadcastenable": "consumeBroadcastEnable", "consumemessageorderly": "consumeMessageOrderly",
             "retryqueuenums": "retryQueueNums", "retrymaxtimes": "retryMaxTimes", "brokerid": "brokerId",
             "whichbrokerwhenconsumeslowly": "whichBrokerWhenConsumeSlowly",
             "notifyconsumeridschanged": "notifyConsumerIdsChangedEnable"}
    config = {"groupName": group, **{names[k.lower()]: v for k, v in opts.items()}}
    targets = await _write_targets(admin, broker_addr, cluster)
    for addr in targets:
        await admin.update_sub_group(addr, config)
    if out.as_json:
        out.json({"config": config, "brokers": targets})
    else:
        for addr in targets:
            out.line(f"create subscription group to {addr} success.")


@click.command("deleteSubGroup", epilog="""\b
Examples:
  mqadmin deleteSubGroup -c LedgerCluster -g OrderConsumers -r true""")
@_targets_option
@click.option("-g", "--groupName", "group", required=True, metavar="GROUP")
@click.option("-r", "--removeOffset", "remove_offset", type=click.BOOL, default=False, show_default=True,
              help="also delete the group's consumer offsets and its %RETRY%/%DLQ% topics")
@online
async def delete_sub_group(admin: MQAdmin, out: Output, broker_addr, cluster, group, remove_offset):
    """Delete a subscription group (and, with -r true, its offsets and its
    retry and dead-letter topics, from the brokers and the name servers)."""
    targets = await _write_targets(admin, broker_addr, cluster)
    for addr in targets:
        await admin.delete_sub_group(addr, group, remove_offset)
    removed = []
    if remove_offset:
        for topic in (f"%RETRY%{group}", f"%DLQ%{group}"):
            for addr in targets:
                await admin.delete_topic_in_broker(addr, topic)
            await admin.delete_topic_in_namesrv(topic, cluster)
            removed.append(topic)
    if out.as_json:
        out.json({"group": group, "removeOffset": remove_offset, "brokers": targets, "removedTopics": removed})
    else:
        for addr in targets:
            out.line(f"delete subscription group [{group}] from broker [{addr}] success.")
        for topic in removed:
            out.line(f"delete topic [{topic}] from cluster [{cluster or 'all'}] success.")


def register(group: click.Group) -> None:
    for cmd in (consumer_progress, consumer_connection, producer_connection, producer, reset_offset_by_time,
                update_sub_group, delete_sub_group):
        group.add_command(cmd)

