# Owns profiling the Python client's send path (`python -m
# tools.bench.profile_client`): a name server and a 3-broker group as real
# processes, then this process's producer (broker.client, on trio or on
# asyncio) sending 1 KiB messages from `--window` concurrent senders for a
# fixed time, meanwhile py-spy sampling this process.  Prints messages/s,
# the client's and the brokers' CPU microseconds per message, and the top
# of the client's profile.  Not a test; nothing is asserted.
#
# --compare: the client-cost figures from one run, on a fresh
# ledgermq group and a fresh NATS JetStream R3 cluster (never both at once,
# the order alternating between rounds): the producer's CPU per send with
# 256 in flight (send_async, and send() from 256 tasks) against nats-py's
# publish_async with 256 pending, and the sync send() p50 against the raw
# one-in-flight p50 (tools.bench.rawsend, window 1), the two interleaved in
# blocks so a machine that gets busier weighs on both alike.
#
#   python -m tools.bench.profile_client [--window 256] [--seconds 10] [--backend trio|asyncio] [--mode tasks|async]
#   python -m tools.bench.profile_client --compare [--rounds 2] [--count 10000] [--json]
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types

import anyio
import click
import trio

from broker import client
from tools.bench.broker import TOPIC, cpu_split, create_topic_request, own_cpu_seconds
from tools.bench.profile_send import top_of_profile
from tools.brokercluster import open_broker_cluster
from tools.cli import CONTEXT, run_command

BODY = b"x" * 1024


async def send_for(namesrv: str, window: int, seconds: float, mode: str = "tasks") -> dict:
    msg = client.Message(TOPIC, BODY, tags="bench")
    done, errors = [0], [0]
    async with client.open_producer("profile_client_pg", namesrv_addr=namesrv) as producer:
        for _ in range(50):  # warm-up: route, connection
            await producer.send(msg)

        async def sender() -> None:
            while True:
                try:
                    await producer.send(msg)
                    done[0] += 1
                except client.ClientError:
                    errors[0] += 1

        running = [True]

        def again(result, error) -> None:  # --mode async: each answer sends the next
            if error is None:
                done[0] += 1
            else:
                errors[0] += 1
            if running[0]:
                producer.send_async(msg, again)

        cpu0, t0 = own_cpu_seconds(), time.perf_counter()
        if mode == "async":
            for _ in range(window):
                producer.send_async(msg, again)
            await anyio.sleep(seconds)
            running[0] = False
        else:
            with anyio.move_on_after(seconds):
                async with anyio.create_task_group() as tg:
                    for _ in range(window):
                        tg.start_soon(sender)
        cpu1, t1 = own_cpu_seconds(), time.perf_counter()
        await producer.drain()
    return {"count": done[0], "errors": errors[0], "seconds": t1 - t0, "client_cpu": cpu1 - cpu0}


async def cluster_run(args) -> None:
    root = tempfile.mkdtemp(prefix="ledgermq-profile-client-")
    try:
        async with open_broker_cluster(root) as cluster:
            master = await cluster.wait_master()
            await cluster.remoting.invoke(cluster.addr(master), create_topic_request())
            pids = {n: p.pid for n, p in cluster.brokers.items()}
            cpu0 = {n: cpu_split(p) for n, p in pids.items()}
            spy = None
            if args.out:
                spy = subprocess.Popen(
                    [shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy"), "record",
                     "--pid", str(os.getpid()), "--duration", str(int(args.seconds)), "--rate", "250",
                     "--format", "raw", "--output", os.path.join(args.out, "client.raw"), "--nonblocking"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            r = await trio.to_thread.run_sync(
                lambda: anyio.run(send_for, cluster.namesrv_addr, args.window, args.seconds, args.mode,
                                  backend=args.backend))
            cpu1 = {n: cpu_split(p) for n, p in pids.items()}
            if spy is not None:
                await trio.to_thread.run_sync(spy.wait)
            n = max(r["count"], 1)
            print(f"{args.backend}, {args.mode}, window {args.window}: {r['count'] / r['seconds']:.0f} msg/s, errors {r['errors']}; "
                  f"CPU us/msg: client {1e6 * r['client_cpu'] / n:.1f}, " + ", ".join(
                      f"{'master' if k == master else k} {1e6 * (sum(cpu1[k]) - sum(cpu0[k])) / n:.1f}" for k in pids))
            await cluster.stop_all()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.out and os.path.exists(os.path.join(args.out, "client.raw")):
        own, cum = top_of_profile(os.path.join(args.out, "client.raw"), 40)
        print("\nclient profile, own time:")
        for pct, frame in own:
            print(f"  {pct:5.1f}%  {frame}")
        print("client profile, cumulative:")
        for pct, frame in cum:
            print(f"  {pct:5.1f}%  {frame}")


# --- --compare ------------------------------------------------------------------------

async def _ledgermq_round(count: int, singles: int) -> dict:
    from tools.bench.broker import send_request
    from tools.bench.rawsend import FrameTemplate, run_window
    out: dict = {}
    root = tempfile.mkdtemp(prefix="ledgermq-profile-client-")
    try:
        async with open_broker_cluster(root) as cluster:
            master = await cluster.wait_master()
            await cluster.remoting.invoke(cluster.addr(master), create_topic_request())
            addr = cluster.addr(master)
            templates = [FrameTemplate(send_request(q)) for q in range(4)]
            await run_window(addr, templates, count=2000, window=64, seconds=30)  # warm-up
            msg = client.Message(TOPIC, BODY, tags="bench")
            async with client.open_producer("profile_client_pg", namesrv_addr=cluster.namesrv_addr) as producer:
                for _ in range(200):  # warm-up: route, connection, heartbeat
                    await producer.send(msg)
                raw_lat, sync_lat = [], []
                block = max(1, singles // 5)
                for _ in range(5):  # interleaved blocks: raw, then the client's sync send()
                    r = await run_window(addr, templates, count=block, window=1, seconds=30)
                    raw_lat += r["latencies"]
                    for _ in range(block):
                        t0 = time.perf_counter()
                        await producer.send(msg)
                        sync_lat.append(time.perf_counter() - t0)
                raw_lat.sort()
                sync_lat.sort()
                out["raw_p50_ms"] = 1e3 * raw_lat[len(raw_lat) // 2]
                out["sync_p50_ms"] = 1e3 * sync_lat[len(sync_lat) // 2]
                for mode in ("async", "tasks"):
                    done = [0]
                    left = [count]

                    def again(result, error) -> None:
                        done[0] += 1
                        if left[0] > 0:
                            left[0] -= 1
                            producer.send_async(msg, again)

                    async def sender() -> None:
                        while left[0] > 0:
                            left[0] -= 1
                            await producer.send(msg)
                            done[0] += 1

                    cpu0, t0 = own_cpu_seconds(), time.perf_counter()
                    if mode == "async":
                        for _ in range(256):
                            left[0] -= 1
                            producer.send_async(msg, again)
                        await producer.drain()
                    else:
                        async with trio.open_nursery() as nursery:
                            for _ in range(256):
                                nursery.start_soon(sender)
                    cpu1, t1 = own_cpu_seconds(), time.perf_counter()
                    out[f"{mode}_cpu_us"] = 1e6 * (cpu1 - cpu0) / done[0]
                    out[f"{mode}_mps"] = done[0] / (t1 - t0)
            await cluster.stop_all()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


async def _nats_round(count: int, singles: int) -> dict:
    from tools.bench.compare import nats_side
    from tools.bench.compare.common import Meter
    root = tempfile.mkdtemp(prefix="ledgermq-profile-client-nats-")
    cluster = nats_side.NatsCluster(root)
    try:
        cluster.start()
        await cluster.wait_ready()
        nc = await nats_side.connect([cluster.url(cluster.names[0])], "lmq-profile-admin")
        await nats_side.create_stream(nc)
        leader = await nats_side.stream_leader(nc)
        await nc.close()
        nc = await nats_side.connect([cluster.url(leader)], "lmq-profile-client")
        js = nc.jetstream(timeout=5)
        for _ in range(200):
            await js.publish("bench.c", BODY)
        single = await nats_side.client_single(js, singles, 60)
        meter = Meter({})
        meter.start()
        r = await nats_side.client_window(nc, count, 256, 60)
        cpu = meter.stop(r["count"])["cpu_us"]["client"]
        await nc.close()
        return {"nats_p50_ms": single["p50_ms"], "nats_cpu_us": cpu, "nats_mps": r["mps"]}
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def compare(args) -> None:
    import asyncio
    import json
    rounds = []
    for i in range(args.rounds):
        order = ["ledgermq", "nats"] if i % 2 == 0 else ["nats", "ledgermq"]
        rec: dict = {}
        for side in order:
            if side == "ledgermq":
                rec.update(trio.run(_ledgermq_round, args.count, args.singles))
            else:
                rec.update(asyncio.run(_nats_round(args.count, args.singles)))
        rec["async_vs_nats"] = rec["async_cpu_us"] / rec["nats_cpu_us"]
        rec["tasks_vs_nats"] = rec["tasks_cpu_us"] / rec["nats_cpu_us"]
        rec["sync_vs_raw"] = rec["sync_p50_ms"] / rec["raw_p50_ms"]
        rounds.append(rec)
        if args.json:
            print(json.dumps({k: round(v, 3) for k, v in rec.items()}), flush=True)
        else:
            print(f"round {i + 1}: CPU us/send: send_async {rec['async_cpu_us']:.1f}, send() x256 "
                  f"{rec['tasks_cpu_us']:.1f}, nats-py {rec['nats_cpu_us']:.1f} "
                  f"(ratios {rec['async_vs_nats']:.2f}, {rec['tasks_vs_nats']:.2f}); p50 ms: sync send() "
                  f"{rec['sync_p50_ms']:.3f}, raw {rec['raw_p50_ms']:.3f} (ratio {rec['sync_vs_raw']:.2f}), "
                  f"nats-py {rec['nats_p50_ms']:.3f}; msg/s: send_async {rec['async_mps']:.0f}, "
                  f"send() {rec['tasks_mps']:.0f}, nats-py {rec['nats_mps']:.0f}", flush=True)


@click.command(context_settings=CONTEXT)
@click.option("--window", type=int, default=256, show_default=True, help="sends in flight")
@click.option("--seconds", type=float, default=10, show_default=True, help="length of the profiled send phase")
@click.option("--backend", type=click.Choice(["trio", "asyncio"]), default="trio", show_default=True,
              help="the event loop the client runs on")
@click.option("--mode", type=click.Choice(["tasks", "async"]), default="tasks", show_default=True,
              help="`window` tasks each awaiting producer.send, or `window` send_async calls in flight "
                   "(each callback sends the next)")
@click.option("--out", help="sample this process with py-spy, keep the raw profile here")
@click.option("--compare", is_flag=True,
              help="the client's CPU per send against nats-py's and the sync send() p50 against the raw one-in-flight p50, alternating rounds (see the module comment)")
@click.option("--rounds", type=int, default=2, show_default=True, help="--compare: rounds")
@click.option("--count", type=int, default=10000, show_default=True, help="--compare: sends per windowed phase")
@click.option("--singles", type=int, default=1000, show_default=True, help="--compare: one-in-flight sends per kind")
@click.option("--json", is_flag=True, help="--compare: one JSON object per round")
def command(**kw) -> int:
    """Profile the client library's send path (or --compare it with nats-py)."""
    args = types.SimpleNamespace(**kw)
    if args.compare:
        compare(args)
        return 0
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    trio.run(cluster_run, args)
    return 0


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.bench.profile_client")


if __name__ == "__main__":
    sys.exit(main())
