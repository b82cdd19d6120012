# Owns mqadmin's replication commands (ledgermq's own, DLedger had none):
# dledgerStatus (every node's Raft view and the leader's per-peer match
# index, lag and last acknowledgement), leadershipTransfer (hand the
# leadership of a group to a caught-up peer) and compareReplicas (chain CRC
# at the common committed index on every replica; on a mismatch a binary
# search for the first divergent index, see first_divergence).
#
# A node is reached through the broker address it registers at the name
# server; its DLedger selfId comes from its own status answer.
import click
import trio

from tools.mqadmin import EXIT_PROBLEMS
from tools.mqadmin.adminapi import AdminError, MQAdmin, NotFoundError
from tools.mqadmin.online import online
from tools.mqadmin.render import Output


async def first_divergence(lo: int, hi: int, differs) -> int | None:
    """Smallest i in [lo, hi] with `await differs(i)`, given that a chain CRC
    difference at i implies one at every later index (the chain covers the
    whole history); None when even hi agrees."""
    if hi < lo or not await differs(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if await differs(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


async def group_nodes(admin: MQAdmin, target: str | None, cluster: str | None) -> list[str]:
    """Broker addresses: one (-b host:port), a group's (-b NAME), a cluster's or all."""
    if target and ":" in target:
        return [target]
    if target:
        return [addr for _, addr in sorted((await admin.group_addrs(target)).items())]
    return [b.addr for b in await admin.brokers(cluster)]


async def dledger_statuses(admin: MQAdmin, addrs: list[str]) -> dict[str, dict | AdminError]:
    out: dict = {}

    async def one(addr):
        try:
            out[addr] = await admin.dledger_status(addr)
        except AdminError as e:
            out[addr] = e

    async with trio.open_nursery() as nursery:
        for addr in addrs:
            nursery.start_soon(one, addr)
    return {a: out[a] for a in addrs}


def _node_json(addr: str, st: dict) -> dict:
    return {"brokerAddr": addr, "brokerName": st.get("brokerName"), "brokerId": st.get("brokerId"),
            "group": st.get("group"), "selfId": st.get("selfId"), "role": st.get("role"), "term": st.get("term"),
            "leader": st.get("leader"), "ledgerBeginIndex": st.get("ledgerBeginIndex"),
            "ledgerEndIndex": st.get("ledgerEndIndex"), "committedIndex": st.get("committedIndex"),
            "uncommitted": st.get("uncommitted"), "writable": st.get("writable"),
            "transferringTo": st.get("transferringTo"), "peers": st.get("peers") or {},
            "identity": st.get("identity") or {}, "links": st.get("links") or {},
            "voters": st.get("voters") or [], "learners": st.get("learners") or [],
            "configIndex": st.get("configIndex", -1), "configCommitted": st.get("configCommitted", True),
            "refusedLeader": st.get("refusedLeader"), "problem": _problem(st)}


def _role(n: dict) -> str:
    """The Raft role, and whether the node's own configuration makes it a
    learner or no member at all (a removed node, a join not yet known)."""
    if n["selfId"] in n["learners"]:
        return f"{n['role']} (learner)"
    if n["voters"] and n["selfId"] not in n["voters"]:
        return f"{n['role']} (not a member)"
    return n["role"]


def _problem(st: dict) -> str | None:
    """Why this node is not replicating, if it says so: a leader whose
    entries it refused, or peers its handshake refused (identity)."""
    refused = st.get("refusedLeader")
    if refused:
        return f"refused entries of leader {refused['leader']} (term {refused['term']}): {refused['reason']}"
    errors = [v["lastError"] for v in (st.get("links") or {}).values()
              if not v.get("connected") and "identity differs" in (v.get("lastError") or "")]
    return "; ".join(errors) or None


def identity_mismatches(live: dict[str, dict]) -> list[str]:
    """Each identity key on which the answering replicas disagree, naming
    every replica's value (e.g. a migrated node with another divided offset)."""
    keys = sorted({k for s in live.values() for k in (s.get("identity") or {})})
    out = []
    for k in keys:
        values = {s["selfId"]: (s.get("identity") or {}).get(k) for s in live.values()}
        if len({v for v in values.values() if v is not None}) > 1:
            out.append(f"{k} differs: " + ", ".join(f"{v} at {n}" for n, v in sorted(values.items())))
    return out


@click.command("dledgerStatus", epilog="""\b
Voters and learners are each node's own view (the latest configuration in
its log); the leader's is the group's.
Examples:
  mqadmin dledgerStatus                      # every node of every cluster
  mqadmin dledgerStatus -b broker-a          # the nodes of one group
  mqadmin dledgerStatus -b 127.0.0.1:10911 --json""")
@click.option("-b", "--broker", "target", metavar="ADDR|GROUP", help="one node (host:port) or one group's nodes")
@click.option("-c", "--clusterName", "cluster", metavar="CLUSTER", help="every node of the cluster")
@online
async def dledger_status(admin: MQAdmin, out: Output, target, cluster):
    """Per node: role, term, leader, ledger begin/end, committed index,
    voters and learners, and log origin; per peer (from the leader): match index, lag and last
    heartbeat ack; and why a node does not replicate (refused entries, a
    peer whose log identity differs)."""
    if target and cluster:
        raise click.UsageError("give either -b or -c, not both")
    statuses = await dledger_statuses(admin, await group_nodes(admin, target, cluster))
    nodes = [_node_json(a, s) for a, s in statuses.items() if isinstance(s, dict)]
    failed = {a: str(s) for a, s in statuses.items() if not isinstance(s, dict)}
    if out.as_json:
        out.json({"nodes": nodes, "unreachable": failed})
    else:
        out.table(["#Group", "#SelfId", "#Addr", "#BID", "#Role", "#Term", "#Leader", "#Begin", "#End",
                   "#Committed", "#Uncommitted", "#Voters", "#Learners", "#Origin"],
                  [[n["group"], n["selfId"], n["brokerAddr"], n["brokerId"], _role(n), n["term"], n["leader"],
                    n["ledgerBeginIndex"], n["ledgerEndIndex"], n["committedIndex"], n["uncommitted"],
                    ",".join(n["voters"]), ",".join(n["learners"]) or "-", n["identity"].get("origin")]
                   for n in nodes])
        for n in nodes:
            if n["problem"]:
                out.line(f"{n['group']}/{n['selfId']}: NOT REPLICATING: {n['problem']}")
        peers = [[n["group"], n["selfId"], p, v.get("matchIndex"), v.get("lag"), v.get("lastAckMsAgo"),
                  v.get("state")] for n in nodes if n["role"] == "leader" for p, v in sorted(n["peers"].items())]
        if peers:
            out.line()
            out.table(["#Group", "#Leader", "#Peer", "#MatchIndex", "#Lag", "#LastAckMsAgo", "#State"], peers)
    for addr, err in failed.items():
        out.note(f"mqadmin: {addr}: {err}")
    return 3 if failed else 0


async def wait_for_master(admin: MQAdmin, group: str, addr: str, timeout: float) -> str:
    """Ask the name server until it lists `addr` as `group`'s master
    (brokerId 0), backing off from 50 ms to 1 s; AdminError after `timeout`
    seconds.  The name server has no push for routes, so this asks."""
    deadline = trio.current_time() + timeout
    delay, seen = 0.05, None
    while True:
        try:
            seen = (await admin.group_addrs(group)).get(0)
        except AdminError as e:
            seen = f"({e})"
        if seen == addr:
            return addr
        if trio.current_time() + delay > deadline:
            raise AdminError(f"the leadership of {group} moved, but after {timeout:g} s the name server still "
                             f"names {seen or 'no master'} instead of {addr}; clients may need longer to find it")
        await trio.sleep(delay)
        delay = min(delay * 2, 1.0)


@click.command("leadershipTransfer", epilog="""\b
Examples:
  mqadmin leadershipTransfer -b broker-a -t n1
  mqadmin leadershipTransfer -b broker-a -t 127.0.0.1:10912""")
@click.option("-b", "--brokerName", "group", required=True, metavar="GROUP", help="the broker group (brokerName)")
@click.option("-t", "--to", "target", required=True, metavar="PEER",
              help="the new leader: its dLegerSelfId or broker address")
@click.option("--wait-seconds", "wait", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="how long to wait for the name server to show the new master (0: do not wait)")
@online
async def leadership_transfer(admin: MQAdmin, out: Output, group, target, wait):
    """Hand a group's leadership to a caught-up peer (the master moves).
    Returns once the name server routes to the new master, so clients that
    ask it from then on find it (exit 1 if it does not within --wait-seconds;
    the old master hands on the writes it still receives meanwhile)."""
    statuses = await dledger_statuses(admin, await group_nodes(admin, group, None))
    live = {a: s for a, s in statuses.items() if isinstance(s, dict)}
    leader = next((a for a, s in live.items() if s.get("role") == "leader"), None)
    if leader is None:
        raise AdminError(f"group {group} has no leader right now; try again after the election")
    by_addr = {a: s["selfId"] for a, s in live.items()}
    peer_ids = set(live[leader].get("peers") or {}) | {live[leader]["selfId"]}
    target_id = by_addr.get(target, target)
    if target_id not in peer_ids:
        raise NotFoundError(f"{target} is not a member of group {group} (peers: {', '.join(sorted(peer_ids))})")
    old = live[leader]
    if target_id == old["selfId"]:
        result = {"group": group, "from": old["selfId"], "to": target_id, "term": old["term"], "changed": False}
    else:
        answer = await admin.transfer_leadership(leader, target_id)
        result = {"group": group, "from": old["selfId"], "to": target_id,
                  "term": int(answer.get("term", 0)) or None, "changed": True}
    target_addr = next((a for a, sid in by_addr.items() if sid == target_id), None)
    if wait > 0 and target_addr is not None:
        result["namesrvMaster"] = await wait_for_master(admin, group, target_addr, wait)
    if out.as_json:
        out.json(result)
    elif result["changed"]:
        out.line(f"leadership of {group} transferred from {result['from']} to {target_id} (term {result['term']})")
    else:
        out.line(f"{target_id} already leads {group} (term {result['term']})")


@click.command("compareReplicas", epilog="""\b
Exit status 1 when a replica diverges or the log identities differ.
Examples:
  mqadmin compareReplicas -c broker-a
  mqadmin compareReplicas -c broker-a --json""")
@click.option("-c", "--group", "group", required=True, metavar="GROUP", help="the broker group (brokerName)")
@online
async def compare_replicas(admin: MQAdmin, out: Output, group):
    """Compare the replicas' log identities (origin, segment size) and the
    chain CRC at the common committed index; on a CRC mismatch,
    binary-search the first divergent index."""
    statuses = await dledger_statuses(admin, await group_nodes(admin, group, None))
    live = {a: s for a, s in statuses.items() if isinstance(s, dict)}
    if len(live) < 2:
        raise AdminError(f"group {group}: {len(live)} replica(s) answered; need two to compare")
    common = min(s["committedIndex"] for s in live.values())
    begin = max(s["ledgerBeginIndex"] for s in live.values())
    reference = next((a for a, s in live.items() if s.get("role") == "leader"), next(iter(live)))
    crcs = {a: await admin.chain_crc(a, common) for a in live} if common >= begin else {}
    replicas = []
    with out.progress("comparing replicas", len(live) - 1) as advance:
        for addr, st in live.items():
            first = None
            if addr != reference and crcs and crcs[addr] != crcs[reference]:
                cache: dict[int, bool] = {}

                async def differs(i, addr=addr, cache=cache):
                    if i not in cache:
                        cache[i] = await admin.chain_crc(addr, i) != await admin.chain_crc(reference, i)
                    return cache[i]
                first = await first_divergence(begin, common, differs)
            if addr != reference:
                advance()
            replicas.append({"brokerAddr": addr, "selfId": st["selfId"], "role": st["role"],
                             "committedIndex": st["committedIndex"], "chainCrc": crcs.get(addr),
                             "firstDivergentIndex": first})
    diverged = [r for r in replicas if r["firstDivergentIndex"] is not None]
    mismatches = identity_mismatches(live)
    result = {"group": group, "comparedIndex": common, "commonBeginIndex": begin,
              "reference": live[reference]["selfId"], "consistent": not diverged and not mismatches,
              "identityMismatches": mismatches, "replicas": replicas,
              "unreachable": {a: str(s) for a, s in statuses.items() if not isinstance(s, dict)}}
    if out.as_json:
        out.json(result)
    else:
        out.table(["#SelfId", "#Addr", "#Role", "#Committed", "#ChainCrc@" + str(common), "#FirstDivergent"],
                  [[r["selfId"], r["brokerAddr"], r["role"], r["committedIndex"],
                    f"{r['chainCrc']:08x}" if r["chainCrc"] is not None else None, r["firstDivergentIndex"]]
                   for r in replicas])
        for m in mismatches:
            out.line(f"IDENTITY MISMATCH: {m}")
        out.line("replicas are consistent up to index %d" % common if not diverged else
                 "DIVERGENCE: " + ", ".join(f"{r['selfId']} from index {r['firstDivergentIndex']}" for r in diverged))
    for addr, err in result["unreachable"].items():
        out.note(f"mqadmin: {addr}: {err}")
    return EXIT_PROBLEMS if diverged or mismatches else 0


def register(group: click.Group) -> None:
    for cmd in (dledger_status, leadership_transfer, compare_replicas):
        group.add_command(cmd)
