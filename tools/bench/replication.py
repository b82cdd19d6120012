# Owns the replication benchmark: a 3-node group of real processes on
# loopback, 1 KiB entries, measured in both flush policies:
#   (a) one append in flight: p50/p99 latency of the leader's append path,
#   (b) a window of appends in flight (group-committed): entries/s,
#   (c) failover: kill -9 of the leader -> first successful append on the new
#       leader, over N kills (p50 and max).
# The load runs inside the leader process (admin op "load") so the figures
# are those of replication, not of a client hop.  Not a test: targets are
# reported next to the figures, never asserted.
#
#   python -m tools.bench.replication [--kills 10] [--json]
#   python -m tools.bench.replication --profile DIR   (cProfile of the windowed
#       async load: every node writes DIR/<id>.prof, the top functions of the
#       leader and of a follower are printed)
import base64
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
import types

import click
import trio

from tools.cli import CONTEXT, run_command
from tools.localcluster import LocalCluster

TARGETS = {"window_eps_async": 50_000, "single_p50_ms": 0.5, "failover_p50_s": 1.0}


async def measure_policy(policy: str, count_single: int, count_window: int, window: int) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"lmq-bench-{policy}-") as root:
        cluster = LocalCluster(root, extra_conf={"flushDiskType": policy})
        await cluster.start()
        try:
            leader = await cluster.wait_leader()
            await cluster.call(leader, {"op": "load", "count": 2000, "size": 1024, "window": 64, "batch": 1},
                               timeout=120)  # warm-up
            single = await cluster.call(leader, {"op": "load", "count": count_single, "size": 1024,
                                                 "window": 1, "batch": 1}, timeout=300)
            cpu0 = node_cpu_seconds(cluster)
            windowed = await cluster.call(leader, {"op": "load", "count": count_window, "size": 1024,
                                                   "window": window, "batch": 1}, timeout=300)
            cpu1 = node_cpu_seconds(cluster)
            # The same 1024 entries in flight, as 64 callers appending batches
            # of 16 (how the broker's SEND_BATCH and group commit arrive).
            batched = await cluster.call(leader, {"op": "load", "count": count_window, "size": 1024,
                                                  "window": max(1, window // 16), "batch": 16}, timeout=300)
            cpu2 = node_cpu_seconds(cluster)
            windowed["cpu_us"] = cpu_per_entry(cpu0, cpu1, leader, windowed["appended"])
            batched["cpu_us"] = cpu_per_entry(cpu1, cpu2, leader, batched["appended"])
            return {"single": single, "window": windowed, "batched": batched}
        finally:
            await cluster.stop_all()


def node_cpu_seconds(cluster: LocalCluster) -> dict[str, float]:
    """user+system CPU seconds of each node process so far (Linux /proc;
    empty elsewhere).  CPU per entry is the figure that stays comparable on
    a machine that other jobs share, where entries/s swing by 2x."""
    out = {}
    for nid, node in cluster.nodes.items():
        try:
            with open(f"/proc/{node.process.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, AttributeError):
            continue
        out[nid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def cpu_per_entry(before: dict, after: dict, leader: str, entries: int) -> dict:
    """Microseconds of CPU per entry: the leader's and the busier follower's."""
    if not entries or leader not in before or leader not in after:
        return {}
    spent = {nid: after[nid] - before[nid] for nid in after if nid in before}
    followers = [v for nid, v in spent.items() if nid != leader]
    return {"leader": round(spent[leader] / entries * 1e6, 1),
            "follower": round(max(followers, default=0) / entries * 1e6, 1)}


async def measure_failover(kills: int) -> list[float]:
    times = []
    with tempfile.TemporaryDirectory(prefix="lmq-bench-failover-") as root:
        cluster = LocalCluster(root)
        await cluster.start()
        try:
            body = base64.b64encode(b"f" * 1024).decode()
            for _ in range(kills):
                leader = await cluster.wait_leader()
                await cluster.call(leader, {"op": "append", "bodies": [body]})
                cluster.kill(leader)
                t0 = time.perf_counter()
                await cluster.wait_dead(leader)
                survivors = [n for n in cluster.nodes if n != leader]
                done = False
                with trio.fail_after(30):
                    while not done:
                        for nid in survivors:
                            try:
                                reply = await cluster.call(nid, {"op": "append", "bodies": [body]}, timeout=3)
                            except (OSError, trio.BrokenResourceError, trio.TooSlowError):
                                continue
                            if reply.get("ok"):
                                done = True
                                break
                        if not done:
                            await trio.sleep(0.005)  # client retry pacing
                times.append(time.perf_counter() - t0)
                await cluster.start(leader)
        finally:
            await cluster.stop_all()
    return times


async def profile_window(args) -> dict:
    """The windowed async load only, in node processes running under
    cProfile (commitlog.node's LEDGERMQ_PROFILE); stats are written when the
    nodes stop (SIGTERM)."""
    out_dir = os.path.abspath(args.profile)
    os.environ["LEDGERMQ_PROFILE"] = out_dir
    try:
        with tempfile.TemporaryDirectory(prefix="lmq-bench-profile-") as root:
            cluster = LocalCluster(root, extra_conf={"flushDiskType": "ASYNC_FLUSH"})
            await cluster.start()
            try:
                leader = await cluster.wait_leader()
                await cluster.call(leader, {"op": "load", "count": 2000, "size": 1024, "window": 64, "batch": 1},
                                   timeout=120)
                window = await cluster.call(leader, {"op": "load", "count": args.window_count, "size": 1024,
                                                     "window": args.window, "batch": args.batch}, timeout=300)
            finally:
                await cluster.stop_all()
    finally:
        del os.environ["LEDGERMQ_PROFILE"]
    return {"leader": leader, "window": window, "dir": out_dir}


def print_profile(path: str, top: int) -> None:
    st = pstats.Stats(path)
    st.sort_stats("tottime").print_stats(top)


async def run(args) -> dict:
    out: dict = {}
    for policy, key in (("ASYNC_FLUSH", "async"), ("SYNC_FLUSH", "sync")):
        r = await measure_policy(policy, args.single_count, args.window_count, args.window)
        out[f"single_p50_ms_{key}"] = r["single"]["p50_ms"]
        out[f"single_p99_ms_{key}"] = r["single"]["p99_ms"]
        out[f"window_eps_{key}"] = r["window"]["eps"]
        out[f"window_p99_ms_{key}"] = r["window"]["p99_ms"]
        out[f"window_batched_eps_{key}"] = r["batched"]["eps"]
        out[f"window_cpu_us_{key}"] = r["window"]["cpu_us"]
        out[f"window_batched_cpu_us_{key}"] = r["batched"]["cpu_us"]
        out[f"errors_{key}"] = {**r["single"]["errors"], **r["window"]["errors"]}
    out["single_p50_ms"] = out["single_p50_ms_async"]
    out["single_p99_ms"] = out["single_p99_ms_async"]
    times = await measure_failover(args.kills)
    out["failover_p50_s"] = round(statistics.median(times), 3)
    out["failover_max_s"] = round(max(times), 3)
    out["failover_all_s"] = [round(t, 3) for t in times]
    out["window"] = args.window
    out["targets"] = TARGETS
    return out


@click.command(context_settings=CONTEXT)
@click.option("--single-count", type=int, default=3000, show_default=True, help="appends one at a time (latency)")
@click.option("--window-count", type=int, default=100_000, show_default=True,
              help="appends of the windowed phase (throughput)")
@click.option("--window", type=int, default=1024, show_default=True, help="appends in flight")
@click.option("--kills", type=int, default=10, show_default=True, help="kill -9s of the leader (failover)")
@click.option("--json", is_flag=True, help="print one JSON object")
@click.option("--profile", metavar="DIR", help="profile the windowed async load only (see the module comment)")
@click.option("--batch", type=int, default=1, show_default=True, help="entries per append call (--profile only)")
@click.option("--top", type=int, default=30, show_default=True, help="functions to print per profile")
def command(**kw) -> int:
    """The replication benchmark: 3 node processes, append latency, windowed throughput and failover."""
    args = types.SimpleNamespace(**kw)
    if args.profile:
        res = trio.run(profile_window, args)
        print(json.dumps(res["window"]))
        follower = next(n for n in ("n0", "n1", "n2") if n != res["leader"])
        for role, nid in (("leader", res["leader"]), ("follower", follower)):
            print(f"=== {role} {nid} ===")
            print_profile(os.path.join(res["dir"], f"{nid}.prof"), args.top)
        return
    res = trio.run(run, args)
    if args.json:
        print(json.dumps(res))
        return
    print("replication benchmark: 3 node processes on 127.0.0.1, 1 KiB entries")
    for key in ("async", "sync"):
        print(f"  {key:5} flush: single append p50 {res[f'single_p50_ms_{key}']} ms, "
              f"p99 {res[f'single_p99_ms_{key}']} ms;  window {args.window}: {res[f'window_eps_{key}']:,} entries/s, "
              f"as {args.window // 16}x16 batches: {res[f'window_batched_eps_{key}']:,} entries/s")
        print(f"        CPU per entry (us): window {res[f'window_cpu_us_{key}']}, "
              f"batches {res[f'window_batched_cpu_us_{key}']}")
    print(f"  failover over {args.kills} kill -9 of the leader: p50 {res['failover_p50_s']} s, "
          f"max {res['failover_max_s']} s")
    print(f"  targets: window async >= {TARGETS['window_eps_async']:,}/s "
          f"({res['window_eps_async'] / TARGETS['window_eps_async']:.2f}x), single p50 <= 0.5 ms "
          f"({res['single_p50_ms']} ms), failover p50 <= 1 s ({res['failover_p50_s']} s)")


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.bench.replication")


if __name__ == "__main__":
    sys.exit(main())
