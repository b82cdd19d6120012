# Owns profiling the send path (`python -m tools.bench.profile_send`): a name
# server and a 3-broker group as real processes, raw pipelined
# SEND_MESSAGE_V2 (1 KiB) with a window in flight for a fixed time (the
# cheap generator of tools/bench/rawsend.py), and
# meanwhile py-spy sampling the master (and optionally a slave) while they
# hold the GIL, so the profile is of CPU spent in Python rather than of
# threads parked in epoll or fdatasync.  Prints
# messages/s and the CPU microseconds per message of every broker process
# and of the load generator, and the top of each profile (by own time and
# by cumulative time).  Not a test; nothing is asserted.  Needs py-spy
# (the `bench` extra) and permission to ptrace the brokers (root here).
#
#   python -m tools.bench.profile_send [--window 256] [--seconds 20] [--out DIR] [--slave] [--sync]
#                                      [--batch 32]
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types

import click
import trio

from tools.bench.broker import QUEUES, batch_request, cpu_split, create_topic_request, own_cpu_seconds, send_request
from tools.bench.rawsend import FrameTemplate, run_window
from tools.brokercluster import open_broker_cluster
from tools.cli import CONTEXT, run_command


def top_of_profile(raw_path: str, n: int = 25) -> tuple[list, list]:
    """py-spy's raw (collapsed) output -> the top frames by own samples and
    by cumulative samples, as (percent, frame)."""
    own, cum, total = collections.Counter(), collections.Counter(), 0
    with open(raw_path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            k = int(count)
            total += k
            frames = stack.split(";")
            own[frames[-1]] += k
            for frame in set(frames):
                cum[frame] += k
    pct = lambda c: [(round(100 * v / total, 1), f) for f, v in c.most_common(n)]  # noqa: E731
    return pct(own), pct(cum)


def syscall_counts(path: str, messages: int) -> list:
    """`perf trace -s` summary -> [(syscall, calls per 1,000 messages,
    total ms)], every thread of the process added up, busiest first."""
    calls, msec = collections.Counter(), collections.Counter()
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 4 and parts[1].isdigit() and not parts[0].startswith("-"):
                calls[parts[0]] += int(parts[1])
                msec[parts[0]] += float(parts[3])
    return [(name, round(1000 * n / max(messages, 1), 1), round(msec[name], 1)) for name, n in calls.most_common(12)]


async def run(args) -> dict:
    root = tempfile.mkdtemp(prefix="ledgermq-profile-")
    out_dir = args.out or root
    os.makedirs(out_dir, exist_ok=True)
    conf = {"flushDiskType": "SYNC_FLUSH"} if args.sync else {}
    try:
        async with open_broker_cluster(root, extra_conf=conf) as cluster:
            master = await cluster.wait_master()
            await cluster.remoting.invoke(cluster.addr(master), create_topic_request())
            addr = cluster.addr(master)
            if args.batch:  # SEND_BATCH_MESSAGEs of args.batch messages, `window` batches in flight
                templates = [FrameTemplate(batch_request(q, args.batch)) for q in range(QUEUES)]
            else:
                templates = [FrameTemplate(send_request(q)) for q in range(QUEUES)]
            per = args.batch or 1
            await run_window(addr, templates, count=2000, window=args.window, seconds=30, per_request=per)  # warm-up
            slave = next(n for n in sorted(cluster.brokers) if n != master)
            targets = {"master": cluster.brokers[master].pid}
            if args.slave:
                targets["slave"] = cluster.brokers[slave].pid
            pids = {n: p.pid for n, p in cluster.brokers.items()}
            spies = {}
            for role, pid in targets.items():
                raw = os.path.join(out_dir, f"{role}.raw")
                if args.syscalls:  # perf's syscall summary: counts per message, at little cost to the broker
                    raw = os.path.join(out_dir, f"{role}.syscalls")
                    cmd = ["perf", "trace", "-s", "-p", str(pid), "-o", raw, "--", "sleep", str(int(args.seconds))]
                else:
                    cmd = [shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy"), "record",
                           "--pid", str(pid), "--duration", str(int(args.seconds)), "--rate", str(args.rate), "--format", "raw",
                           "--output", raw, "--nonblocking", "--gil"]
                spies[role] = (raw, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            cpu0 = {n: cpu_split(p) for n, p in pids.items()}
            own0 = own_cpu_seconds()
            r = await run_window(addr, templates, count=10_000_000, window=args.window, seconds=args.seconds,
                                 per_request=per)
            r["mps"] = r["count"] / r["seconds"]
            cpu1 = {n: cpu_split(p) for n, p in pids.items()}
            own1 = own_cpu_seconds()
            for raw, proc in spies.values():
                await trio.to_thread.run_sync(proc.wait)
            count = r["count"]
            lat = sorted(r["latencies"])
            result = {"window": args.window, "sync": args.sync, "mps": r["mps"], "count": count,
                      "p50_ms": round(1e3 * lat[len(lat) // 2], 3) if lat else None,
                      "p99_ms": round(1e3 * lat[int(len(lat) * 0.99)], 3) if lat else None,
                      "errors": r["errors"],
                      "cpu_us_per_msg": {("master" if n == master else n):
                                         round(1e6 * (sum(cpu1[n]) - sum(cpu0[n])) / count, 1)
                                         for n in pids if count},
                      "sys_us_per_msg": {("master" if n == master else n): round(1e6 * (cpu1[n][1] - cpu0[n][1]) / count, 1)
                                         for n in pids if count},
                      "client_cpu_us_per_msg": round(1e6 * (own1 - own0) / count, 1) if count else None,
                      "profiles": {}}
            for role, (raw, _) in spies.items():
                if args.syscalls and os.path.exists(raw):
                    result["profiles"][role] = {"syscalls": syscall_counts(raw, count)}
                elif os.path.exists(raw):
                    own, cum = top_of_profile(raw)
                    result["profiles"][role] = {"raw": raw, "own": own, "cumulative": cum}
            await cluster.stop_all()
            return result
    finally:
        if not args.out:
            shutil.rmtree(root, ignore_errors=True)


@click.command(context_settings=CONTEXT)
@click.option("--window", type=int, default=256, show_default=True, help="sends in flight")
@click.option("--seconds", type=float, default=20, show_default=True, help="length of the profiled send phase")
@click.option("--out", help="keep the raw profiles (and the cluster's files) here")
@click.option("--slave", is_flag=True, help="profile a slave too")
@click.option("--sync", is_flag=True, help="flushDiskType=SYNC_FLUSH")
@click.option("--batch", type=int, default=0, show_default=True,
              help="send SEND_BATCH_MESSAGEs of this many messages (--window batches in flight)")
@click.option("--rate", type=int, default=200, show_default=True, help="py-spy samples per second")
@click.option("--syscalls", is_flag=True, help="count system calls (perf trace -s) instead of py-spy sampling")
@click.option("--json", is_flag=True, help="print one JSON object")
def command(**kw) -> int:
    """Profile the master's send path with py-spy (or count its system calls)."""
    args = types.SimpleNamespace(**kw)
    r = trio.run(run, args)
    if args.json:
        print(json.dumps(r, indent=1))
        return 0
    print(f"window {r['window']}{' SYNC_FLUSH' if r['sync'] else ''}: {r['mps']:.0f} msg/s, {r['count']} messages, "
          f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, errors {r['errors'] or 'none'}")
    print("CPU us/msg: " + ", ".join(f"{k} {v}" for k, v in r["cpu_us_per_msg"].items())
          + f", load generator {r['client_cpu_us_per_msg']}")
    print("  of which system: " + ", ".join(f"{k} {v}" for k, v in r["sys_us_per_msg"].items()))
    for role, prof in r["profiles"].items():
        if "syscalls" in prof:
            print(f"\n{role} system calls per 1,000 messages (all threads; total ms in calls):")
            for name, per_k, ms in prof["syscalls"]:
                print(f"  {per_k:8.1f}  {name} ({ms} ms)")
            continue
        print(f"\n{role} profile, own time:")
        for pct, frame in prof["own"]:
            print(f"  {pct:5.1f}%  {frame}")
        print(f"{role} profile, cumulative:")
        for pct, frame in prof["cumulative"]:
            print(f"  {pct:5.1f}%  {frame}")
    return 0


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.bench.profile_send")


if __name__ == "__main__":
    sys.exit(main())
