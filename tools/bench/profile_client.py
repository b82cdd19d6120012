# Owns profiling the Python client's send path (`python -m
# tools.bench.profile_client`): a name server and a 3-broker group as real
# processes, then this process's producer (broker.client, on trio or on
# asyncio) sending 1 KiB messages from `--window` concurrent senders for a
# fixed time, meanwhile py-spy sampling this process.  Prints messages/s,
# the client's and the brokers' CPU microseconds per message, and the top
# of the client's profile.  Not a test; nothing is asserted.
#
#   python -m tools.bench.profile_client [--window 256] [--seconds 10] [--backend trio|asyncio] [--mode tasks|async]
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import anyio
import trio

from broker import client
from tools.bench.broker import TOPIC, cpu_split, create_topic_request, own_cpu_seconds
from tools.bench.profile_send import top_of_profile
from tools.brokercluster import open_broker_cluster

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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench.profile_client", description=__doc__)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--backend", choices=("trio", "asyncio"), default="trio")
    p.add_argument("--mode", choices=("tasks", "async"), default="tasks",
                   help="`window` tasks each awaiting producer.send, or `window` send_async calls in flight "
                        "(each callback sends the next)")
    p.add_argument("--out", help="sample this process with py-spy, keep the raw profile here")
    args = p.parse_args(argv)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    trio.run(cluster_run, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
