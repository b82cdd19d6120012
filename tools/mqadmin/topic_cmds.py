# Owns mqadmin's topic commands: topicList, updateTopic, deleteTopic,
# topicRoute and topicStatus.  Topic configs live in each broker group's
# replicated metadata, so writes go to the group's master (brokerId 0, the
# DLedger leader); routes and the topic list come from the name server.
import click

from broker.common.permissions import perm_text
from tools.mqadmin.adminapi import AdminError, MQAdmin, NotFoundError
from tools.mqadmin.online import fmt_ms, online
from tools.mqadmin.render import Output


def _bool_text(ctx, param, value):
    if value is None or isinstance(value, bool):
        return value
    text = value.strip().lower()
    if text not in ("true", "false"):
        raise click.BadParameter(f"{value!r} is not true or false")
    return text == "true"


@click.command("topicList", epilog="""\b
Examples:
  mqadmin topicList -n 127.0.0.1:9876
  mqadmin topicList -c      # with each topic's cluster and consumer groups
  mqadmin topicList --json | jq -r '.topicList[]'""")
@click.option("-c", "--clusterModel", "cluster_model", is_flag=True,
              help="also print each topic's cluster and the consumer groups that consume it")
@online
async def topic_list(admin: MQAdmin, out: Output, cluster_model: bool):
    """Every topic the name server knows."""
    if cluster_model:
        return await _topics_by_cluster(admin, out)
    topics = sorted(await admin.topic_list())
    if out.as_json:
        out.json({"topicList": topics})
    else:
        for t in topics:
            out.line(t)


async def _topics_by_cluster(admin: MQAdmin, out: Output) -> None:
    """topicList -c: per cluster (GET_TOPICS_BY_CLUSTER), each topic and the
    groups its masters say consume it (QUERY_TOPIC_CONSUME_BY_WHO)."""
    _, clusters = await admin.cluster_info()
    rows = []
    for cluster in sorted(clusters):
        for topic in sorted(await admin.topics_by_cluster(cluster)):
            groups: set[str] = set()
            if not topic.startswith(("%RETRY%", "%DLQ%")):
                try:
                    for addr in (await admin.topic_masters(topic)).values():
                        groups |= set(await admin.consume_by_who(addr, topic))
                except AdminError:
                    pass  # gone meanwhile: listed without groups
            rows.append({"cluster": cluster, "topic": topic, "groups": sorted(groups)})
    if out.as_json:
        out.json({"topics": rows})
        return
    out.table(["#Cluster Name", "#Topic", "#Consumer Group"],
              [[r["cluster"], r["topic"], g] for r in rows for g in (r["groups"] or [""])])


@click.command("updateTopic", epilog="""\b
Examples:
  mqadmin updateTopic -c LedgerCluster -t Orders -r 8 -w 8
  mqadmin updateTopic -b 127.0.0.1:10911 -t Orders -p 4   # read only""")
@click.option("-b", "--brokerAddr", "broker_addr", metavar="ADDR", help="create on this broker (a master)")
@click.option("-c", "--clusterName", "cluster", metavar="CLUSTER", help="create on every master of the cluster")
@click.option("-t", "--topic", required=True)
@click.option("-r", "--readQueueNums", "read", type=click.IntRange(1, 1024), default=8, show_default=True)
@click.option("-w", "--writeQueueNums", "write", type=click.IntRange(1, 1024), default=8, show_default=True)
@click.option("-p", "--perm", type=click.Choice(["2", "4", "6", "7"]), default="6", show_default=True,
              help="2 write, 4 read, 6 read+write")
@click.option("-o", "--order", callback=_bool_text, metavar="true|false", default="false", show_default=True,
              help="ordered topic")
@click.option("-a", "--attributes", metavar="+k=v,-k", help="5.x topic attributes")
@online
async def update_topic(admin: MQAdmin, out: Output, broker_addr, cluster, topic, read, write, perm, order,
                       attributes):
    """Create a topic or change its queue numbers and permission."""
    if bool(broker_addr) == bool(cluster):
        raise click.UsageError("give exactly one of -b ADDR or -c CLUSTER")
    targets = [broker_addr] if broker_addr else list((await admin.masters(cluster)).values())
    if not targets:
        raise NotFoundError(f"cluster {cluster} has no master broker right now")
    for addr in targets:
        await admin.create_topic(addr, topic, read, write, int(perm), order, attributes)
    result = {"topic": topic, "readQueueNums": read, "writeQueueNums": write, "perm": int(perm), "order": order,
              "brokers": targets}
    if out.as_json:
        out.json(result)
    else:
        for addr in targets:
            out.line(f"create topic to {addr} success.")
        out.line(f"TopicConfig [topicName={topic}, readQueueNums={read}, writeQueueNums={write}, perm="
                 f"{perm_text(int(perm))}, order={str(order).lower()}]")


@click.command("deleteTopic", epilog="""\b
Examples:
  mqadmin deleteTopic -c LedgerCluster -t Orders""")
@click.option("-t", "--topic", required=True)
@click.option("-c", "--clusterName", "cluster", required=True, metavar="CLUSTER")
@online
async def delete_topic(admin: MQAdmin, out: Output, topic, cluster):
    """Delete a topic from every master of the cluster and from the name
    servers (its consumer offsets go with it)."""
    await admin.route(topic)  # NotFoundError for an unknown topic
    masters = await admin.masters(cluster)
    for addr in masters.values():
        await admin.delete_topic_in_broker(addr, topic)
    await admin.delete_topic_in_namesrv(topic, cluster)
    if out.as_json:
        out.json({"topic": topic, "cluster": cluster, "brokers": sorted(masters.values())})
    else:
        out.line(f"delete topic [{topic}] from cluster [{cluster}] success.")
        out.line(f"delete topic [{topic}] from NameServer success.")


@click.command("topicRoute", epilog="""\b
Examples:
  mqadmin topicRoute -t Orders
  mqadmin topicRoute -t Orders --json""")
@click.option("-t", "--topic", required=True)
@online
async def topic_route(admin: MQAdmin, out: Output, topic):
    """The topic's route: broker groups with their addresses, and queues."""
    route = await admin.route(topic)
    if out.as_json:
        out.json(route.to_json())
        return
    rows = []
    for bd in route.broker_datas:
        for bid, addr in sorted(bd.broker_addrs.items()):
            rows.append([bd.cluster, bd.broker_name, bid, addr])
    out.table(["#ClusterName", "#BrokerName", "#BrokerId", "#Addr"], rows)
    out.line()
    out.table(["#BrokerName", "#ReadQueueNums", "#WriteQueueNums", "#Perm"],
              [[q.broker_name, q.read_queue_nums, q.write_queue_nums, perm_text(q.perm)]
               for q in route.queue_datas])


@click.command("topicStatus", epilog="""\b
Examples:
  mqadmin topicStatus -t Orders""")
@click.option("-t", "--topic", required=True)
@online
async def topic_status(admin: MQAdmin, out: Output, topic):
    """Per queue: min and max offset and the last update time."""
    rows = []
    for name, addr in sorted((await admin.topic_masters(topic)).items()):
        stats = await admin.topic_stats(addr, topic)
        for (_t, broker_name, qid), s in sorted(stats.items(), key=lambda kv: kv[0][2]):
            rows.append({"brokerName": broker_name, "queueId": qid, "minOffset": s["minOffset"],
                         "maxOffset": s["maxOffset"], "lastUpdateTimestamp": s["lastUpdateTimestamp"]})
    if out.as_json:
        out.json({"topic": topic, "queues": rows})
        return
    out.table(["#BrokerName", "#QID", "#MinOffset", "#MaxOffset", "#LastUpdated"],
              [[r["brokerName"], r["queueId"], r["minOffset"], r["maxOffset"], fmt_ms(r["lastUpdateTimestamp"])]
               for r in rows])


def register(group: click.Group) -> None:
    for cmd in (topic_list, update_topic, delete_topic, topic_route, topic_status):
        group.add_command(cmd)
