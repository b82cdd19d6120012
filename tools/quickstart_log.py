# Owns the replicated-log demo (python -m tools.quickstart_log), the
# quickstart of the commitlog alone, without the broker: a 3-node replicated
# commitlog as real processes on loopback.  It elects a leader, replicates
# 10,000 entries, kills -9 the leader while a client keeps appending, shows
# the failover, checks that every acknowledged append is on every replica
# (chain CRCs equal), restarts the killed node, and finally verifies each
# node's files offline.  `make quickstart` (tools/quickstart.py) runs the
# same story with the broker, RocketMQ producers and consumers.
#
#   python -m tools.quickstart_log [--dir DIR] [--entries N] [--keep]
import base64
import os
import sys
import tempfile
import time
import types

import click
import trio

from commitlog.scan import verify_store
from commitlog.watermark import Watermark
from tools.cli import CONTEXT, run_command
from tools.localcluster import LocalCluster

SEGMENTS = {"mappedFileSizeCommitLog": 4 * 1024 * 1024, "mappedFileSizeForEntryIndex": 320 * 1024}


def say(msg: str) -> None:
    print(msg, flush=True)


async def append_numbered(cluster: LocalCluster, acked: dict, acked_count: Watermark, stop: trio.Event,
                          leader_box: list) -> None:
    """A client: appends batches of numbered 1 KiB bodies to the leader,
    follows NotLeader hints and failed connections to the new leader, and
    publishes how many appends were acknowledged so far."""
    seq = 0
    while not stop.is_set():
        bodies = [f"quickstart-{seq}-{k}".encode().ljust(1024, b".") for k in range(8)]
        target = leader_box[0]
        try:
            reply = await cluster.call(target, {"op": "append",
                                                "bodies": [base64.b64encode(b).decode() for b in bodies]}, timeout=5)
        except (OSError, trio.BrokenResourceError, trio.TooSlowError, ValueError):
            leader_box[0] = await cluster.wait_leader(exclude={target})
            continue
        if reply.get("ok"):
            for (index, _), body in zip(reply["entries"], bodies):
                acked[index] = body
            acked_count.advance(len(acked))
            seq += 1
        else:
            leader_box[0] = await cluster.wait_leader(exclude={target} if reply.get("leader") != target else set())


async def read_committed(cluster: LocalCluster, node_id: str, upto: int) -> dict[int, bytes]:
    out, nxt = {}, 0
    while nxt <= upto:
        reply = await cluster.call(node_id, {"op": "read", "from": nxt, "count": 4000})
        if not reply.get("entries"):
            break
        for index, _term, body in reply["entries"]:
            out[index] = base64.b64decode(body)
        nxt = reply["entries"][-1][0] + 1
    return out


def print_status(sts: dict) -> None:
    say(f"  {'node':5} {'role':10} {'term':>4} {'leader':6} {'ledgerEnd':>9} {'committed':>9}")
    for nid in sorted(sts):
        st = sts[nid]
        say(f"  {nid:5} {st['role']:10} {st['term']:>4} {str(st['leader']):6} "
            f"{st['ledgerEndIndex']:>9} {st['committedIndex']:>9}")


async def run(args) -> int:
    cluster = LocalCluster(args.dir, extra_conf=SEGMENTS)
    say(f"ledgermq replicated-log demo: 3-node replicated commitlog under {args.dir}")
    await cluster.start()
    keep = False
    try:
        t0 = time.perf_counter()
        leader = await cluster.wait_leader()
        say(f"1. elected {leader} in {time.perf_counter() - t0:.2f} s")
        load = await cluster.call(leader, {"op": "load", "count": args.entries, "size": 1024,
                                           "window": 64, "batch": 16}, timeout=120)
        say(f"2. replicated {load['appended']:,} x 1 KiB entries in {load['seconds']:.2f} s "
            f"({load['eps']:,.0f} entries/s, committed on a quorum)")
        print_status(await cluster.statuses())

        acked: dict[int, bytes] = {}
        acked_count = Watermark(0)
        stop = trio.Event()
        leader_box = [leader]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(append_numbered, cluster, acked, acked_count, stop, leader_box)
            await acked_count.wait_for(800)
            say(f"3. kill -9 {leader} (pid {cluster.nodes[leader].process.pid}) while a client appends "
                f"({len(acked)} acknowledged so far)")
            cluster.kill(leader)
            killed_at = time.perf_counter()
            before = len(acked)
            await acked_count.wait_for(before + 1)
            failover = time.perf_counter() - killed_at
            new_leader = leader_box[0]
            await acked_count.wait_for(before + 800)
            stop.set()
        say(f"   {new_leader} took over: first acknowledged append {failover:.2f} s after the kill")

        await cluster.start(leader)
        last = max(acked)
        sts = await cluster.wait_all_committed(last)
        say(f"4. restarted {leader}; it rejoined as {sts[leader]['role']} and caught up")
        print_status(sts)
        lost = 0
        for nid in sorted(cluster.nodes):
            log = await read_committed(cluster, nid, last)
            lost += sum(1 for i, body in acked.items() if log.get(i) != body)
        common = min(st["committedIndex"] for st in sts.values())
        chains = {nid: (await cluster.call(nid, {"op": "chain", "index": common}))["chainCrc"]
                  for nid in sorted(cluster.nodes)}
        same = len(set(chains.values())) == 1
        say(f"5. {len(acked):,} acknowledged appends checked on 3 replicas: {lost} missing; "
            f"chain CRC at index {common}: {'identical' if same else 'DIFFERENT'} "
            f"({', '.join(f'{n}={c:#010x}' for n, c in chains.items())})")
        if args.keep:
            keep = True
            say("\nThe group keeps running (--keep). Admin ports, one JSON request per line:")
            for nid, node in sorted(cluster.nodes.items()):
                say(f"  {nid}: pid {node.process.pid}, admin 127.0.0.1:{node.admin_port}")
            say("  e.g.  python -c \"import socket,sys; s=socket.create_connection(('127.0.0.1', PORT)); "
                "s.sendall(b'{\\\"op\\\": \\\"status\\\"}\\n'); print(s.recv(65536).decode())\"")
            say("  stop them with: kill " + " ".join(str(n.process.pid) for n in cluster.nodes.values()))
            return 0 if lost == 0 and same else 1
    finally:
        if not keep:
            await cluster.stop_all()
    problems = 0
    for nid in sorted(cluster.nodes):
        summary = verify_store(os.path.join(args.dir, nid, f"dledger-{nid}"))
        problems += len(summary.problems)
        say(f"6. verifyStore {nid}: {summary.entries:,} entries, index {summary.first_index}..{summary.last_index}, "
            f"{len(summary.problems)} problems")
    ok = lost == 0 and same and problems == 0
    say(f"\nsummary: leader {leader} -> {new_leader}, failover {failover:.2f} s, {len(acked):,} acknowledged, "
        f"{lost} lost, replicas {'identical' if same else 'DIVERGED'}: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


@click.command(context_settings=CONTEXT)
@click.option("--dir", "store_dir", help="where the nodes keep their stores (default: a new temporary directory)")
@click.option("--entries", type=click.IntRange(1), default=10_000, show_default=True,
              help="1 KiB entries the leader replicates in step 2")
@click.option("--keep", is_flag=True, help="leave the group running and print how to connect")
def command(store_dir: str | None, entries: int, keep: bool) -> int:
    """ledgermq replicated-log demo (no broker)."""
    args = types.SimpleNamespace(dir=store_dir or tempfile.mkdtemp(prefix="ledgermq-logdemo-"), entries=entries,
                                 keep=keep)
    return trio.run(run, args)


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.quickstart_log")


if __name__ == "__main__":
    sys.exit(main())
