# Owns the waterfall of one send round (`python -m tools.bench.round`, also
# in `make bench`): where each microsecond of a sync send goes.  Two runs on
# loopback, each of real processes started with LEDGERMQ_ROUND_TRACE
# (commitlog/roundtrace.py: the processes timestamp their own hops and write
# them when they stop):
#
#   broker     a name server and a 3-broker DLedger group; one 1 KiB
#              SEND_MESSAGE_V2 in flight on one connection (the next is sent
#              when the answer is read), `--rounds` times after a warm-up;
#   bare log   3 commitlog.node processes; the leader appends one 1 KiB
#              entry at a time (admin op "load", window 1).
#
# A round is cut from the master's records between "read" and "answered"
# (the bare log's between "submitted" and "woken"); its index (from
# "appended") finds the followers' hops.  The critical path goes through the
# follower whose acknowledgement completed the quorum, so every row is at or
# after the one above it in every round; the other follower's hops are
# listed apart.  Per hop: p50/p99 of the step from the row above, and of the
# time since the round began (cumulative).  Also the client-observed latency
# and the trio task steps per round (master: read -> answered; each follower:
# push read -> acknowledgement sent).  Not a test; nothing is asserted.
#
#   python -m tools.bench.round [--rounds 2000] [--flush async|sync] [--json]
import contextlib
import json
import os
import re
import sys
import tempfile
import time
import types

import click
import trio

from broker.remoting.codes import RequestCode
from broker.remoting.command import RemotingCommand
from commitlog.roundtrace import TRACE_ENV
from tools.bench.broker import create_topic_request, send_request
from tools.bench.rawsend import FrameTemplate
from tools.brokercluster import open_broker_cluster
from tools.cli import CONTEXT, run_command
from tools.localcluster import LocalCluster

_CODE = re.compile(rb'"code":(-?\d+)')
FLUSH = {"async": "ASYNC_FLUSH", "sync": "SYNC_FLUSH"}

# (label, how to find its time in a round) on the critical path; "q" is the
# follower whose acknowledgement completed the quorum.
BROKER_HOPS = [
    ("header decoded", ("m", "decoded")),
    ("admitted", ("m", "admitted")),
    ("records handed to the log", ("m", "submitted")),
    ("appended on the leader", ("m", "appended")),
    ("pushed to the quorum follower", ("mp", "pushed")),
    ("push read by the follower", ("q", "rx")),
    ("push stepped by its driver", ("q", "stepped")),
    ("written on the follower", ("q", "written")),
    ("acknowledgement sent", ("q", "ack")),
    ("acknowledgement read on the leader", ("mp", "rx")),
    ("acknowledged by the quorum", ("mp", "stepped")),
    ("committed", ("m", "committed")),
    ("appender woken", ("m", "woken")),
    ("answer encoded", ("m", "encoded")),
    ("answer written", ("m", "answered")),
]
LOG_HOPS = [row for row in BROKER_HOPS[3:13]]
# The other followers' hops, apart (they are not on the critical path).
SIDE_HOPS = [
    ("pushed", ("mp", "pushed")),
    ("push read", ("o", "rx")),
    ("written", ("o", "written")),
    ("acknowledgement sent", ("o", "ack")),
    ("acknowledgement read on the leader", ("mp", "rx")),
]


# --- reading the records -----------------------------------------------------------

SLICES = ("task", "idle", "batch")


def load_records(trace_dir: str) -> dict[int, list]:
    """pid -> its records, in the order it took them (hops first, then its
    task steps and IO waits: see split_slices)."""
    out = {}
    for name in os.listdir(trace_dir):
        if not name.endswith(".jsonl"):
            continue
        with open(os.path.join(trace_dir, name)) as f:
            lines = f.read().splitlines()
        if lines:
            out[int(json.loads(lines[0])["pid"])] = [json.loads(line) for line in lines[1:]]
    return out


def split_slices(records: list) -> tuple[list, list]:
    """(the hop records, the task-step and IO-wait records) of a process."""
    return [r for r in records if r[0] not in SLICES], [r for r in records if r[0] in SLICES]


def time_split(rounds: list[dict], slices: list, start: str, end: str, top: int = 8) -> dict:
    """Where the trio thread's time went between `start` and `end` of each
    complete round (means per round): per task name, the CPU µs of its
    steps and its steps; the scheduler's own CPU (batches minus steps);
    the wall time waiting in epoll; and the rest of the wall time, when the
    thread had work but not the CPU (another thread holding the GIL, or
    another process on the core).  A slice counts in the round it ends in."""
    spans = sorted((r[start][0], r[end][0]) for r in rounds if start in r and end in r)
    if not spans:
        return {}
    tasks: dict[str, list[float]] = {}
    batch_us = idle_us = 0.0
    k = 0
    for kind, t, dur, name, _ in sorted(slices, key=lambda e: e[1] + (e[2] if e[0] == "idle" else 0)):
        end_t = t + dur if kind == "idle" else t
        while k < len(spans) and spans[k][1] < end_t:
            k += 1
        if k == len(spans):
            break
        if end_t < spans[k][0]:
            continue
        if kind == "idle":
            idle_us += min(dur, end_t - spans[k][0]) / 1000
        elif kind == "batch":
            batch_us += dur / 1000
        else:
            acc = tasks.setdefault(".".join(name.split(".")[-2:]), [0.0, 0])
            acc[0] += dur / 1000
            acc[1] += 1
    n = len(spans)
    wall = sum(b - a for a, b in spans) / 1000 / n
    rows = sorted(((label, us / n, cnt / n) for label, (us, cnt) in tasks.items()), key=lambda t: -t[1])
    steps_us = sum(us for _, us, _ in rows)
    return {"round_us": round(wall, 1), "idle_us": round(idle_us / n, 1),
            "scheduler_cpu_us": round(batch_us / n - steps_us, 1),
            "no_cpu_us": round(wall - idle_us / n - batch_us / n, 1),
            "parts": [{"what": label, "cpu_us": round(us, 1), "steps": round(cnt, 2)} for label, us, cnt in rows[:top]],
            "other_cpu_us": round(sum(us for _, us, _ in rows[top:]), 1)}


def first_by_index(records: list, by_peer: bool = True) -> dict:
    """(hop, index, peer) -> (t_ns, steps) of its first record (a
    follower's: peer "", it has one leader)."""
    out: dict = {}
    for hop, t, index, peer, steps in records:
        if index >= 0:
            out.setdefault((hop, index, peer if by_peer else ""), (t, steps))
    return out


def cut_rounds(records: list, start: str, end: str, since_ns: int) -> list[dict]:
    """The master's rounds: hop -> (t_ns, steps), first of each, from a
    `start` record to the next `end` record; rounds before since_ns are
    the warm-up.  A round's first "committed" at or past its index is
    looked up later (it may come in a round's last records)."""
    rounds, cur = [], None
    for hop, t, index, peer, steps in records:
        if hop == start:
            cur = {start: (t, steps)} if t >= since_ns else None
            continue
        if cur is None or peer:
            continue
        if hop == "appended":
            cur.setdefault("index", index)
        if hop == "committed":
            if "index" in cur and index >= cur["index"]:
                cur.setdefault(hop, (t, steps))
            continue
        cur.setdefault(hop, (t, steps))
        if hop == end:
            rounds.append(cur)
            cur = None
    return rounds


def waterfall(rounds: list[dict], start: str, hops: list, master: list, followers: dict[str, list]) -> dict:
    """The table for complete rounds: per row, p50/p99 of the step from the
    row above and of the time since `start`, in microseconds."""
    m_ix = first_by_index(master)
    f_ix = {nid: first_by_index(recs, by_peer=False) for nid, recs in followers.items()}
    quorum_acks = (len(followers) + 1) // 2  # acks a leader needs besides its own vote
    rows_t: list[list[float]] = [[] for _ in hops]
    side_t: dict = {}
    steps_master: list[int] = []
    steps_follower: dict[str, list[int]] = {nid: [] for nid in followers}
    complete = 0
    for r in rounds:
        index = r.get("index")
        if index is None:
            continue
        acks = sorted((m_ix[key][0], nid) for nid in followers if (key := ("stepped", index, nid)) in m_ix)
        if len(acks) < quorum_acks:
            continue
        q = acks[quorum_acks - 1][1]

        def at(where, hop, node):
            if where == "m":
                return r.get(hop)
            if where == "mp":
                return m_ix.get((hop, index, node))
            return f_ix[node].get((hop, index, ""))

        times = [at(w, hop, q) for _, (w, hop) in hops]
        if any(t is None for t in times):
            continue
        complete += 1
        t0, s0 = r[start]
        for k, (t, _) in enumerate(times):
            rows_t[k].append((t - t0) / 1000)
        steps_master.append(times[-1][1] - s0)
        for nid in followers:
            rx, ack = f_ix[nid].get(("rx", index, "")), f_ix[nid].get(("ack", index, ""))
            if rx and ack:
                steps_follower[nid].append(ack[1] - rx[1])
            if nid == q:
                continue
            for label, (w, hop) in SIDE_HOPS:
                got = at(w, hop, nid)
                if got is not None:
                    side_t.setdefault(label, []).append((got[0] - t0) / 1000)
    rows = []
    prev: list[float] | None = None
    for (label, (_, hop)), cum in zip(hops, rows_t):
        delta = [c - p for c, p in zip(cum, prev)] if prev is not None else list(cum)
        rows.append({"hop": label, "record": hop, "p50_us": pct(delta, 0.5), "p99_us": pct(delta, 0.99),
                     "cum_p50_us": pct(cum, 0.5), "cum_p99_us": pct(cum, 0.99)})
        prev = cum
    return {"rounds": len(rounds), "complete": complete, "rows": rows,
            "other_follower": [{"hop": label, "cum_p50_us": pct(v, 0.5), "cum_p99_us": pct(v, 0.99)}
                               for label, _ in SIDE_HOPS if (v := side_t.get(label))],
            "task_steps_p50": {"leader": pct(steps_master, 0.5),
                               **{f"follower {nid}": pct(v, 0.5) for nid, v in steps_follower.items()}}}


def pct(values: list, p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(p * len(s)))], 1)


# --- the runs --------------------------------------------------------------------

@contextlib.contextmanager
def traced(trace_dir: str):
    """Processes started inside record their hops into trace_dir."""
    old = os.environ.get(TRACE_ENV)
    os.environ[TRACE_ENV] = trace_dir
    try:
        yield
    finally:
        if old is None:
            del os.environ[TRACE_ENV]
        else:
            os.environ[TRACE_ENV] = old


async def one_in_flight(address: str, template: FrameTemplate, count: int) -> tuple[list[float], int]:
    """Send `count` requests one at a time (the next when the answer is
    read); returns the latencies (µs) and the number of non-SUCCESS answers."""
    host, _, port = address.rpartition(":")
    stream = await trio.open_tcp_stream(host.strip("[]"), int(port))
    latencies, errors = [], 0
    buf = bytearray()
    try:
        for k in range(count):
            frame = template.frame(1_000_000_000 + k)
            t0 = time.perf_counter_ns()
            await stream.send_all(frame)
            while True:
                if len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
                    break
                data = await stream.receive_some(65536)
                if not data:
                    raise ConnectionError("the broker closed the connection")
                buf += data
            latencies.append((time.perf_counter_ns() - t0) / 1000)
            length = 4 + int.from_bytes(buf[:4], "big")
            header_len = int.from_bytes(buf[5:8], "big")
            m = _CODE.search(bytes(buf[8:8 + header_len]))
            if m is None or int(m.group(1)) != 0:
                errors += 1
            del buf[:length]
    finally:
        await trio.aclose_forcefully(stream)
    return latencies, errors


async def followers_caught_up(cluster, addr: str, timeout: float = 30.0) -> None:
    """Until the master reports every follower at its end (a follower
    that was still connecting when the warm-up ran catches up first, so the
    measured rounds are ordinary ones on every node)."""
    with trio.fail_after(timeout):
        while True:
            reply = await cluster.remoting.invoke(
                addr, RemotingCommand.create_request(RequestCode.LEDGERMQ_DLEDGER_STATUS), timeout=5)
            peers = json.loads(reply.body or b"{}").get("peers") or {}
            if len(peers) == len(cluster.brokers) - 1 and all(p.get("lag") == 0 for p in peers.values()):
                return
            await trio.sleep(0.02)  # asking again: the status has no watch


async def broker_round(rounds: int, warmup: int, flush: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="lmq-round-") as root:
        trace_dir = os.path.join(root, "trace")
        with traced(trace_dir):
            async with open_broker_cluster(os.path.join(root, "cluster"),
                                           extra_conf={"flushDiskType": FLUSH[flush]}) as cluster:
                master = await cluster.wait_master()
                addr = cluster.addr(master)
                await cluster.remoting.invoke(addr, create_topic_request(), timeout=10)
                template = FrameTemplate(send_request(0))
                await one_in_flight(addr, template, warmup)
                await followers_caught_up(cluster, addr)
                since = time.perf_counter_ns()
                latencies, errors = await one_in_flight(addr, template, rounds)
                pids = {cluster.brokers[n].pid: n for n in cluster.brokers}
                await cluster.stop_all()  # the brokers write their records as they stop
        records = load_records(trace_dir)
        split = {pids[pid]: split_slices(recs) for pid, recs in records.items() if pid in pids}
        by_node = {n: hops for n, (hops, _) in split.items()}
        if master not in by_node:
            raise RuntimeError(f"the master {master} wrote no round records (see {TRACE_ENV})")
        cut = cut_rounds(by_node[master], "read", "answered", since)
        followers = {n: by_node.get(n, []) for n in sorted(cluster.brokers) if n != master}
        out = waterfall(cut, "read", BROKER_HOPS, by_node[master], followers)
        out["time_split"] = time_split(cut, split[master][1], "read", "answered")
        out.update(master=master, errors=errors, client_p50_us=pct(latencies, 0.5),
                   client_p99_us=pct(latencies, 0.99), sent=len(latencies))
        return out


async def log_round(rounds: int, warmup: int, flush: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="lmq-round-log-") as root:
        trace_dir = os.path.join(root, "trace")
        with traced(trace_dir):
            cluster = LocalCluster(os.path.join(root, "cluster"), extra_conf={"flushDiskType": FLUSH[flush]})
            try:
                await cluster.start()
                leader = await cluster.wait_leader()
                await cluster.call(leader, {"op": "load", "count": warmup, "size": 1024, "window": 1, "batch": 1},
                                   timeout=120)
                # a node that joined late catches up first: its rounds are the measured ones too
                end = (await cluster.call(leader, {"op": "status"}))["ledgerEndIndex"]
                await cluster.wait_all_committed(end)
                since = time.perf_counter_ns()
                load = await cluster.call(leader, {"op": "load", "count": rounds, "size": 1024, "window": 1,
                                                   "batch": 1}, timeout=600)
                pids = {node.process.pid: nid for nid, node in cluster.nodes.items()}
            finally:
                await cluster.stop_all()  # the nodes write their records as they stop
        records = load_records(trace_dir)
        split = {pids[pid]: split_slices(recs) for pid, recs in records.items() if pid in pids}
        by_node = {n: hops for n, (hops, _) in split.items()}
        if leader not in by_node:
            raise RuntimeError(f"the leader {leader} wrote no round records (see {TRACE_ENV})")
        cut = cut_rounds(by_node[leader], "submitted", "woken", since)
        followers = {n: by_node.get(n, []) for n in sorted(cluster.nodes) if n != leader}
        out = waterfall(cut, "submitted", LOG_HOPS, by_node[leader], followers)
        out["time_split"] = time_split(cut, split[leader][1], "submitted", "woken")
        out.update(leader=leader, errors=sum(load.get("errors", {}).values()),
                   client_p50_us=None if load.get("p50_ms") is None else round(load["p50_ms"] * 1000, 1),
                   client_p99_us=None if load.get("p99_ms") is None else round(load["p99_ms"] * 1000, 1),
                   sent=load.get("appended"))
        return out


async def run(args) -> dict:
    warmup = max(20, min(500, args.rounds // 4))
    broker = await broker_round(args.rounds, warmup, args.flush)
    bare = await log_round(args.rounds, warmup, args.flush)
    return {"flush": args.flush, "rounds": args.rounds, "size": 1024, "broker": broker, "log": bare}


def print_table(title: str, res: dict, start: str) -> None:
    print(f"{title}: {res['complete']} complete rounds of {res['rounds']}")
    print(f"  {'hop (time since ' + start + ')':52} {'step p50':>9} {'step p99':>9} {'cum p50':>9} {'cum p99':>9}")
    for row in res["rows"]:
        print(f"  {row['hop']:52} {fmt(row['p50_us'])} {fmt(row['p99_us'])} {fmt(row['cum_p50_us'])} "
              f"{fmt(row['cum_p99_us'])}")
    for row in res["other_follower"]:
        print(f"  {'(other follower) ' + row['hop']:52} {'':9} {'':9} {fmt(row['cum_p50_us'])} "
              f"{fmt(row['cum_p99_us'])}")
    ts = res.get("time_split") or {}
    if ts:
        print(f"  the {'master' if start == 'read' else 'leader'}'s trio thread in a round (means, µs of "
              f"{ts['round_us']}): idle in epoll {ts['idle_us']}; waiting for the CPU or the GIL {ts['no_cpu_us']}; "
              f"scheduler CPU {ts['scheduler_cpu_us']}; task CPU: "
              + ", ".join(f"{p['what']} {p['cpu_us']} ({p['steps']} steps)" for p in ts["parts"])
              + f", others {ts['other_cpu_us']}")
    steps = ", ".join(f"{k} {v}" for k, v in res["task_steps_p50"].items())
    print(f"  seen by the caller: p50 {fmt(res['client_p50_us']).strip()} µs, p99 {fmt(res['client_p99_us']).strip()}"
          f" µs ({res['sent']} rounds, {res['errors']} errors); task steps per round (p50): {steps}")


def fmt(v) -> str:
    return f"{v:9.1f}" if v is not None else f"{'-':>9}"


@click.command(context_settings=CONTEXT)
@click.option("--rounds", type=int, default=2000, show_default=True, help="measured rounds (one message in flight)")
@click.option("--flush", type=click.Choice(sorted(FLUSH)), default="async", show_default=True,
              help="flushDiskType of the group")
@click.option("--json", is_flag=True, help="print one JSON object")
def command(**kw) -> int:
    """The waterfall of one send round: where the time of one message in flight goes."""
    args = types.SimpleNamespace(**kw)
    res = trio.run(run, args)
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"one round, one 1 KiB message in flight, 3 nodes on 127.0.0.1, {FLUSH[args.flush]}; µs")
    print_table(f"broker (master {res['broker']['master']})", res["broker"], "read")
    print_table(f"bare log (leader {res['log']['leader']})", res["log"], "submitted")
    return 0


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.bench.round")


if __name__ == "__main__":
    sys.exit(main())
