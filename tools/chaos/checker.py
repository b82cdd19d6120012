# Owns the verdict of a nemesis run.  After the faults are healed and the
# group is quiet, it reads every queue of the topic from offset 0 on the
# master and judges the workload's history (workload.py) against it:
#
#   lost        SEND_OK, but the body is not at the queue offset its result
#               named (must be 0)
#   phantoms    a body in the log that no send produced, or that a send which
#               was refused before anything was appended produced (must be 0)
#   duplicates  a body stored more than once (a client retry after an
#               unknown outcome; allowed, counted)
#   unknown     sends whose outcome was unknown, and how many of them landed
#   contiguity  every queue's offsets 0..max-1, each exactly once
#   consumers   the pull group's committed offsets are at least every commit
#               the broker acknowledged; the push group got every
#               acknowledged message; marked messages came back through
#               %RETRY%, delayed ones arrived
#   metadata    topics and subscription groups created during the run exist
#               on every node
#   replicas    every node holds the same chain CRC at the common committed
#               index, and, offline, the same bytes entry by entry; every
#               store passes verifyStore --cq
#   windows     per fault kind, the longest stretch without any SEND_OK from
#               the fault's start to the first SEND_OK after it healed
import bisect
import collections
import json
import math
import os

import attrs
import trio

from broker.remoting.codes import RequestCode
from commitlog.scan import resolve_store_dir, walk_store
from tools.chaos.cluster import ChaosCluster
from tools.chaos.nemesis import Fault
from tools.chaos.workload import DELAY_MARK, QUEUES, RETRY_MARK, TOPIC, History
from tools.mqadmin.adminapi import AdminError, MQAdmin
from tools.quickstart import verify_node, wait_caught_up

STALL_LIMIT = 15.0  # seconds without a SEND_OK after a fault healed that count as a stall


@attrs.define
class Verdict:
    cycles: int = 0
    sends: int = 0
    acknowledged: int = 0
    refused: int = 0
    unknown: int = 0
    unknown_present: int = 0
    lost: int = 0
    phantoms: int = 0
    duplicates: int = 0
    redeliveries: int = 0
    stored: int = 0
    windows: dict[str, float] = attrs.Factory(dict)      # fault kind -> max unavailability (s)
    fault_counts: dict[str, int] = attrs.Factory(dict)
    fault_windows: list[tuple[str, str, float, float]] = attrs.Factory(list)  # (kind, what, start s, window s)
    problems: list[str] = attrs.Factory(list)
    replicas: dict[str, dict] = attrs.Factory(dict)
    by_client: dict[str, dict[str, int]] = attrs.Factory(dict)   # client -> outcome -> sends
    errors: dict[str, int] = attrs.Factory(dict)                 # client error kinds seen

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        lines = [f"cycles {self.cycles}  sends {self.sends}  acknowledged {self.acknowledged}  "
                 f"refused {self.refused}  unknown {self.unknown} ({self.unknown_present} present)  "
                 f"lost {self.lost}  phantoms {self.phantoms}  duplicates {self.duplicates}  "
                 f"redeliveries {self.redeliveries}  stored {self.stored}",
                 "by client: " + "; ".join(f"{c} " + ", ".join(f"{k} {v}" for k, v in sorted(o.items()))
                                           for c, o in sorted(self.by_client.items())),
                 "errors seen by clients: " + (", ".join(f"{k} x{v}" for k, v in sorted(
                     self.errors.items(), key=lambda kv: -kv[1])[:8]) or "none"),
                 "max unavailability per fault kind: " + ", ".join(
                     f"{k} {v:.2f}s (x{self.fault_counts.get(k, 0)})" for k, v in sorted(self.windows.items()))]
        lines += [f"PROBLEM: {p}" for p in self.problems[:40]]
        if len(self.problems) > 40:
            lines.append(f"... and {len(self.problems) - 40} more problems")
        lines.append("verdict: " + ("OK" if self.ok else "FAILED"))
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return attrs.asdict(self) | {"ok": self.ok}


IN_FLIGHT_WINDOW = 3.0   # seconds: the push consumer commits every second; a pull and a commit may be in flight
PULL_BATCH = 32


def redelivery_bound(faults: list[Fault], history: History, duplicates: int) -> int:
    """What the push group may see again: around each fault (and the
    consumer's restart for the check) the messages it may have consumed
    but not yet committed -- those acknowledged in the IN_FLIGHT_WINDOW
    before -- plus one pull batch per queue, plus the duplicates in the
    log (each is delivered too)."""
    acks = sorted(history.ack_times)
    total = duplicates
    for t in [f.start for f in faults] + [max(acks, default=0.0)]:
        total += bisect.bisect_right(acks, t) - bisect.bisect_left(acks, t - IN_FLIGHT_WINDOW)
        total += QUEUES * PULL_BATCH * 2  # the topic's queues and %RETRY%'s
    return total


def unavailability(faults: list[Fault], ack_times: list[float]) -> list[tuple[Fault, float]]:
    """(fault, seconds): the longest gap between SEND_OKs from the fault's
    start to the first SEND_OK after it healed (inf if there was none)."""
    acks = sorted(ack_times)
    out = []
    for f in faults:
        end = f.healed if f.healed is not None else f.start
        prev, worst = f.start, 0.0
        for t in acks:
            if t <= f.start:
                continue
            worst = max(worst, t - prev)
            prev = t
            if t > end:
                break
        else:
            worst = math.inf
        out.append((f, worst))
    return out


async def read_topic(admin: MQAdmin, addr: str, topic: str, queues: int) -> dict[int, list]:
    """queue id -> every record from offset 0, in order (raw pulls)."""
    out: dict[int, list] = {}
    for qid in range(queues):
        records, offset = [], 0
        while True:
            nxt, _min, mx, recs = await admin.pull(addr, "chaos_checker", topic, qid, offset, 32)
            records.extend(recs)
            if nxt >= mx or (not recs and nxt == offset):
                break
            offset = nxt
        out[qid] = records
    return out


async def _retrying(fn, *args, attempts: int = 20):
    for i in range(attempts):
        try:
            return await fn(*args)
        except AdminError:
            if i == attempts - 1:
                raise
            await trio.sleep(0.5)


async def check_online(cluster: ChaosCluster, admin: MQAdmin, history: History, faults: list[Fault],
                       verdict: Verdict, settle: float = 60.0) -> None:
    """Everything that needs the running group."""
    master = await cluster.wait_master(timeout=settle)
    infos = await wait_caught_up(cluster, settle)
    addr = cluster.addr(master)
    data = await _retrying(read_topic, admin, addr, TOPIC, QUEUES)

    # --- per queue contiguity, and where every body is --------------------------------
    where: dict[bytes, list[tuple[int, int]]] = collections.defaultdict(list)
    for qid, records in data.items():
        offsets = [r.queue_offset for r in records]
        if offsets != list(range(len(offsets))):
            gaps = sorted(set(range(max(offsets, default=-1) + 1)) - set(offsets))
            verdict.problems.append(f"queue {qid}: offsets not contiguous from 0 (missing {gaps[:10]}, "
                                    f"{len(offsets)} records)")
        for r in records:
            where[bytes(r.body)].append((qid, r.queue_offset))
    verdict.stored = sum(len(v) for v in where.values())

    # --- sends against the log --------------------------------------------------------------
    sends = {s.body: s for s in history.sends}
    verdict.sends = len(history.sends)
    verdict.errors = dict(history.errors)
    for s in history.sends:
        per = verdict.by_client.setdefault(s.client, {})
        per[s.outcome] = per.get(s.outcome, 0) + 1
        at = where.get(s.body, [])
        if s.outcome == "ok":
            verdict.acknowledged += 1
            if s.body.endswith(DELAY_MARK):
                ok = bool(at)  # delivered later to another offset of the topic
            elif s.queue_id is None:  # the stock client names the offset, not the queue
                ok = any(off == s.queue_offset for _q, off in at)
            else:
                ok = (s.queue_id, s.queue_offset) in at
            if not ok:
                verdict.lost += 1
                verdict.problems.append(f"lost: {s.body!r} acknowledged at queue {s.queue_id} offset "
                                        f"{s.queue_offset} ({s.client}, t={history.rel(s.end)}), found at {at}")
        elif s.outcome == "refused":
            verdict.refused += 1
            if at:
                verdict.phantoms += 1
                verdict.problems.append(f"phantom: {s.body!r} was refused ({s.error}) but is stored at {at}")
        else:
            verdict.unknown += 1
            verdict.unknown_present += bool(at)
    for body, at in where.items():
        if body not in sends:
            verdict.phantoms += 1
            verdict.problems.append(f"phantom: {body[:60]!r} at {at} was never sent")
        if len(at) > 1:
            verdict.duplicates += len(at) - 1

    # --- consumers ---------------------------------------------------------------------------
    for (group, qid), committed in sorted(history.commits.items()):
        resp = await _retrying(admin.call, addr, RequestCode.QUERY_CONSUMER_OFFSET,
                               {"consumerGroup": group, "topic": TOPIC, "queueId": qid})
        stored = int(resp.ext_fields.get("offset", -1))
        if stored < committed:
            verdict.problems.append(f"offset commit lost: {group} queue {qid} acknowledged {committed}, "
                                    f"broker has {stored}")
    acked = [s.body for s in history.sends if s.outcome == "ok"]
    missing = [b for b in acked if history.push_deliveries[b] == 0]
    if missing:
        verdict.problems.append(f"push consumer never got {len(missing)} acknowledged messages, e.g. {missing[:3]}")
    not_retried = [b for b in acked if b.endswith(RETRY_MARK) and history.push_deliveries[b] < 2]
    if not_retried:
        verdict.problems.append(f"{len(not_retried)} messages failed once by the push consumer never came back "
                                f"through %RETRY%, e.g. {not_retried[:3]}")
    verdict.redeliveries = sum(max(0, n - 1) for b, n in history.push_deliveries.items()
                               if not b.endswith(RETRY_MARK)) + sum(
        max(0, n - 2) for b, n in history.push_deliveries.items() if b.endswith(RETRY_MARK))
    bound = redelivery_bound(faults, history, verdict.duplicates)
    if verdict.redeliveries > bound:
        verdict.problems.append(f"{verdict.redeliveries} redeliveries to the push group exceed what can have been "
                                f"in flight ({bound}: per fault, the messages acknowledged in the "
                                f"{IN_FLIGHT_WINDOW:.0f} s before it plus a pull batch per queue)")

    # --- metadata on every node -------------------------------------------------------------
    for node in cluster.node_ids():
        a = cluster.addr(node)
        topics = json.loads((await _retrying(admin.call, a, RequestCode.GET_ALL_TOPIC_CONFIG)).body)
        groups = json.loads((await _retrying(admin.call, a, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)).body)
        have_t = set((topics.get("topicConfigTable") or {}))
        have_g = set((groups.get("subscriptionGroupTable") or {}))
        for t in history.topics_created:
            if t not in have_t:
                verdict.problems.append(f"{node}: topic {t} created during the run is missing")
        for g in history.groups_created:
            if g not in have_g:
                verdict.problems.append(f"{node}: subscription group {g} created during the run is missing")

    # --- replicas agree at the common committed index --------------------------------------
    committed = min(int(i.get("dledgerCommittedIndex", -1)) for i in infos.values()) if infos else -1
    if committed >= 0:
        crcs = {n: await _retrying(admin.chain_crc, cluster.addr(n), committed) for n in cluster.node_ids()}
        if len(set(crcs.values())) != 1:
            verdict.problems.append(f"chain CRC at committed index {committed} differs: {crcs}")
        verdict.replicas = {n: {"committed": int(i.get("dledgerCommittedIndex", -1)), "chainCrc": crcs.get(n)}
                            for n, i in infos.items()}

    # --- availability -------------------------------------------------------------------------
    for f, window in unavailability(faults, history.ack_times):
        verdict.fault_windows.append((f.kind, f.what, history.rel(f.start), round(window, 2)))
        verdict.fault_counts[f.kind] = verdict.fault_counts.get(f.kind, 0) + 1
        verdict.windows[f.kind] = max(verdict.windows.get(f.kind, 0.0), window)
        if window > STALL_LIMIT:
            verdict.problems.append(f"stall: no SEND_OK for {window:.1f}s around {f.kind} ({f.what}) at "
                                    f"t={history.rel(f.start)}, healed at t={history.rel(f.healed or f.start)}")


def check_offline(cluster: ChaosCluster, verdict: Verdict) -> None:
    """With the group stopped: verifyStore --cq on every node, and the
    committed prefix compared byte for byte entry by entry."""
    committed = min((r["committed"] for r in verdict.replicas.values()), default=-1)
    digests: dict[str, list] = {}
    for node in cluster.node_ids():
        entries, messages, problems = verify_node(cluster.root, node)
        verdict.problems += [f"{node}: verifyStore --cq: {p}" for p in problems]
        walk_problems: list = []
        seq = []
        for h, body, _file, _off in walk_store(resolve_store_dir(os.path.join(cluster.root, node), node),
                                                walk_problems):
            if h.index > committed:
                break
            seq.append((h.index, h.term, h.magic, h.chain_crc, bytes(body)))
        digests[node] = seq
    nodes = list(digests)
    for other in nodes[1:]:
        a, b = digests[nodes[0]], digests[other]
        # Compare from the highest first index both hold (retention may differ).
        start = max(a[0][0] if a else 0, b[0][0] if b else 0)
        a2 = [e for e in a if e[0] >= start]
        b2 = [e for e in b if e[0] >= start]
        if a2 != b2:
            diff = next((x[0] for x, y in zip(a2, b2) if x != y), min(len(a2), len(b2)) + start)
            verdict.problems.append(f"committed prefix of {other} differs from {nodes[0]} at entry {diff}")
