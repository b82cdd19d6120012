# Owns mqadmin's cluster commands: clusterList, brokerStatus,
# getBrokerConfig and updateBrokerConfig.  Brokers are found through the
# name server's cluster info; each one is then asked directly
# (GET_BROKER_RUNTIME_INFO, GET/UPDATE_BROKER_CONFIG).  A broker that does
# not answer is shown as such, not fatal: clusterList is what an operator
# runs when something is wrong.
import click

from tools.mqadmin.adminapi import AdminError, MQAdmin, gather
from tools.mqadmin.online import online
from tools.mqadmin.render import Output


async def _targets(admin: MQAdmin, broker_addr: str | None, cluster: str | None) -> list[str]:
    if broker_addr:
        return [broker_addr]
    return [b.addr for b in await admin.brokers(cluster)]


def _pick_targets(broker_addr, cluster):
    if broker_addr and cluster:
        raise click.UsageError("give either -b or -c, not both")


async def _missing_peers(admin: MQAdmin, rows: list[dict]) -> list[dict]:
    """DLedger peers a group's leader knows that are not registered (down or
    unreachable): the name server forgets a dead broker, its group does not."""
    missing = []
    for r in rows:
        if r["dledgerRole"] != "LEADER":
            continue
        try:
            peers = set((await admin.dledger_status(r["addr"])).get("peers") or {})
        except AdminError:
            continue
        seen = {x["dledgerSelfId"] for x in rows if x["brokerName"] == r["brokerName"]}
        missing += [{"cluster": r["cluster"], "brokerName": r["brokerName"], "dledgerSelfId": p,
                     "reason": "a DLedger peer not registered with the name server (down?)"}
                    for p in sorted(peers - seen)]
    return missing


@click.command("clusterList", epilog="""\b
Examples:
  mqadmin clusterList -n 127.0.0.1:9876
  mqadmin clusterList -c LedgerCluster --json | jq '.brokers[] | select(.role=="MASTER")'
  mqadmin clusterList -m    # messages in and out per broker""")
@click.option("-c", "--clusterName", "cluster", metavar="CLUSTER", help="only this cluster")
@click.option("-m", "--moreStats", "more_stats", is_flag=True,
              help="messages put and pulled per broker (#InTotalYest #OutTotalYest #InTotalToday "
                   "#OutTotalToday; ledgermq counts since each broker started, as 'today')")
@online
async def cluster_list(admin: MQAdmin, out: Output, cluster, more_stats: bool):
    """Every broker: cluster, name, id, address, role, DLedger term and
    leader, put TPS and disk usage; DLedger peers that are not registered
    (down) are listed as DOWN (--json: "missing")."""
    brokers = await admin.brokers(cluster)
    infos = await gather([b.addr for b in brokers], admin.runtime_info)
    if more_stats:
        return _more_stats(out, brokers, infos)
    rows = []
    for b in brokers:
        info = infos.get(b.addr)
        ok = isinstance(info, dict)
        info = info if ok else {}
        tps = (info.get("putTps") or "0").split()
        rows.append({
            "cluster": b.cluster, "brokerName": b.broker_name, "brokerId": b.broker_id, "addr": b.addr,
            "role": b.role, "dledgerSelfId": info.get("dledgerSelfId"), "dledgerRole": info.get("dledgerRole"),
            "term": int(info["dledgerTerm"]) if ok and info.get("dledgerTerm") else None,
            "leader": info.get("dledgerLeaderId") or None,
            "putTps": float(tps[0]) if tps else 0.0,
            "committedIndex": int(info["dledgerCommittedIndex"]) if ok and info.get("dledgerCommittedIndex") else None,
            "diskRatio": float(info["commitLogDiskRatio"]) if ok and info.get("commitLogDiskRatio") else None,
            "version": info.get("brokerVersionDesc"),
            "error": None if ok else str(infos.get(b.addr))})
    missing = await _missing_peers(admin, rows)
    if out.as_json:
        out.json({"brokers": rows, "missing": missing})
        return
    out.table(["#Cluster", "#Broker", "#BID", "#Addr", "#Role", "#SelfId", "#DLedger", "#Term", "#Leader",
               "#TPS", "#Committed", "#Disk", "#Version"],
              [[r["cluster"], r["brokerName"], r["brokerId"], r["addr"], r["role"], r["dledgerSelfId"],
                r["dledgerRole"] if not r["error"] else "UNREACHABLE", r["term"], r["leader"], r["putTps"],
                r["committedIndex"], f"{r['diskRatio'] * 100:.1f}%" if r["diskRatio"] is not None else None,
                r["version"]] for r in rows]
              + [[m["cluster"], m["brokerName"], None, None, "DOWN", m["dledgerSelfId"], None, None, None, None,
                  None, None, None] for m in missing])
    for r in rows:
        if r["error"]:
            out.note(f"mqadmin: {r['addr']}: {r['error']}")


def _more_stats(out: Output, brokers, infos: dict) -> None:
    """clusterList -m: RocketMQ's columns from each broker's runtime info."""
    def n(info: dict, key: str) -> int:
        try:
            return int(info.get(key) or 0)
        except ValueError:
            return 0

    rows = []
    for b in brokers:
        info = infos.get(b.addr)
        info = info if isinstance(info, dict) else {}
        rows.append({
            "cluster": b.cluster, "brokerName": b.broker_name, "brokerId": b.broker_id, "addr": b.addr,
            "inTotalYest": n(info, "msgPutTotalTodayMorning") - n(info, "msgPutTotalYesterdayMorning"),
            "outTotalYest": n(info, "msgGetTotalTodayMorning") - n(info, "msgGetTotalYesterdayMorning"),
            "inTotalToday": n(info, "msgPutTotalTodayNow") - n(info, "msgPutTotalTodayMorning"),
            "outTotalToday": n(info, "msgGetTotalTodayNow") - n(info, "msgGetTotalTodayMorning"),
            "error": None if info else str(infos.get(b.addr))})
    if out.as_json:
        out.json({"brokers": rows})
        return
    out.table(["#Cluster", "#Broker", "#BID", "#InTotalYest", "#OutTotalYest", "#InTotalToday", "#OutTotalToday"],
              [[r["cluster"], r["brokerName"], r["brokerId"], r["inTotalYest"], r["outTotalYest"],
                r["inTotalToday"], r["outTotalToday"]] for r in rows])
    for r in rows:
        if r["error"]:
            out.note(f"mqadmin: {r['addr']}: {r['error']}")


@click.command("brokerStatus", epilog="""\b
Examples:
  mqadmin brokerStatus -b 127.0.0.1:10911
  mqadmin brokerStatus -c LedgerCluster --json""")
@click.option("-b", "--brokerAddr", "broker_addr", metavar="ADDR", help="one broker")
@click.option("-c", "--clusterName", "cluster", metavar="CLUSTER", help="every broker of the cluster")
@online
async def broker_status(admin: MQAdmin, out: Output, broker_addr, cluster):
    """A broker's runtime statistics (GET_BROKER_RUNTIME_INFO)."""
    _pick_targets(broker_addr, cluster)
    targets = await _targets(admin, broker_addr, cluster)
    if broker_addr:
        results = {broker_addr: await admin.runtime_info(broker_addr)}
    else:
        results = await gather(targets, admin.runtime_info)
    failed = 0
    if out.as_json:
        out.json({addr: (r if isinstance(r, dict) else {"error": str(r)}) for addr, r in results.items()})
    for addr in targets:
        r = results[addr]
        if isinstance(r, AdminError):
            failed += 1
            out.note(f"mqadmin: {addr}: {r}")
        elif not out.as_json:
            out.kv(sorted(r.items()), title=addr if len(targets) > 1 else None)
    return 3 if failed else 0


@click.command("getBrokerConfig", epilog="""\b
Examples:
  mqadmin getBrokerConfig -b 127.0.0.1:10911
  mqadmin getBrokerConfig -c LedgerCluster --json""")
@click.option("-b", "--brokerAddr", "broker_addr", metavar="ADDR", help="one broker")
@click.option("-c", "--clusterName", "cluster", metavar="CLUSTER", help="every broker of the cluster")
@online
async def get_broker_config(admin: MQAdmin, out: Output, broker_addr, cluster):
    """A broker's effective configuration (broker.conf keys)."""
    _pick_targets(broker_addr, cluster)
    if not broker_addr and not cluster:
        raise click.UsageError("give -b ADDR or -c CLUSTER")
    targets = await _targets(admin, broker_addr, cluster)
    results = {broker_addr: await admin.broker_config(broker_addr)} if broker_addr else \
        await gather(targets, admin.broker_config)
    if out.as_json:
        out.json({addr: (r if isinstance(r, dict) else {"error": str(r)}) for addr, r in results.items()})
    failed = 0
    for addr in targets:
        r = results[addr]
        if isinstance(r, AdminError):
            failed += 1
            out.note(f"mqadmin: {addr}: {r}")
        elif not out.as_json:
            out.kv(sorted(r.items()), title=f"============{addr}============" if len(targets) > 1 else None)
    return 3 if failed else 0


@click.command("updateBrokerConfig", epilog="""\b
Hot-reloadable keys: brokerPermission, maxPendingRequestsNum, maxWaitAckTimeMs.
The change is in memory on the brokers asked (broker.conf is not rewritten).
Examples:
  mqadmin updateBrokerConfig -b 127.0.0.1:10911 -k maxWaitAckTimeMs -v 3000
  mqadmin updateBrokerConfig -c LedgerCluster -k brokerPermission -v 4""")
@click.option("-b", "--brokerAddr", "broker_addr", metavar="ADDR", help="one broker")
@click.option("-c", "--clusterName", "cluster", metavar="CLUSTER", help="every broker of the cluster")
@click.option("-k", "--key", required=True, help="broker.conf key")
@click.option("-v", "--value", required=True, help="new value")
@online
async def update_broker_config(admin: MQAdmin, out: Output, broker_addr, cluster, key, value):
    """Change a hot-reloadable broker setting at runtime."""
    _pick_targets(broker_addr, cluster)
    if not broker_addr and not cluster:
        raise click.UsageError("give -b ADDR or -c CLUSTER")
    targets = await _targets(admin, broker_addr, cluster)
    if broker_addr:
        await admin.update_broker_config(broker_addr, key, value)
        results = {broker_addr: None}
    else:
        results = await gather(targets, lambda addr: admin.update_broker_config(addr, key, value))
    failed = {a: str(r) for a, r in results.items() if isinstance(r, AdminError)}
    if out.as_json:
        out.json({"key": key, "value": value, "updated": [a for a in targets if a not in failed], "failed": failed})
    else:
        for addr in targets:
            out.line(f"update broker config {key}={value} on {addr}: {'FAILED' if addr in failed else 'OK'}")
    for addr, err in failed.items():
        out.note(f"mqadmin: {addr}: {err}")
    return 3 if failed else 0


def register(group: click.Group) -> None:
    for cmd in (cluster_list, broker_status, get_broker_config, update_broker_config):
        group.add_command(cmd)
