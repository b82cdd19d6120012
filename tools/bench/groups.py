# Owns the scale-out benchmark (`python -m tools.bench.groups`): the same
# client load against one broker group and against two groups of the same
# cluster (MultiGroupCluster: 3 brokers per group, one name server, real
# processes on loopback, 1 KiB messages, ASYNC_FLUSH), the topic created on
# every master with `-c` semantics.  The Python producer spreads its sends
# over every group's queues; a push consumer drains them.
#
# Reported per layout: messages/s (sends, then consumption), and CPU
# microseconds per message -- of every broker process together, of the
# masters, of the slaves, and of the client process -- both as measured and
# above idle (each broker's CPU while the cluster sits idle, measured just
# before, times the phase's length, taken off: Raft ticks, heartbeats and
# timers cost the same whatever the load, and six idle brokers on two cores
# would otherwise be charged to the messages).  Each group gets the same
# number of sends in flight (--window per group), so a master sees bursts of
# the same size in both layouts (group commit makes a message's cost depend
# on its burst: one in flight costs ten times what 64 in flight cost per
# message, so every comparison here keeps the window per group fixed).
#
# On a machine with two cores two groups cannot send faster than one: six
# brokers and the client share the same cores.  What the figures show is
# how much dearer a message gets when groups share cores (scheduling among
# seven busy processes, each master woken less often); groups on machines
# of their own do not share, and add their throughput.  There is no paced
# phase at a fixed rate per group: at low rates the cost per message is
# decided by how the client's scheduling happens to coalesce sends into
# bursts, not by the layout.  Not a test; nothing is asserted.
#
#   python -m tools.bench.groups [--seconds S] [--window W] [--json]
import json
import sys
import tempfile
import time
import types

import click
import trio

from broker.client import ConsumeFromWhere, ConsumeStatus, Message, SendStatus, open_producer, open_push_consumer
from tools.bench.broker import cpu_seconds, cpu_us_per, own_cpu_seconds, rate, ratio
from tools.brokercluster import MultiGroupCluster, open_multi_group_cluster
from tools.cli import CONTEXT, run_command
from tools.mqadmin.adminapi import AdminError, MQAdmin

TOPIC = "ScaleTopic"
CLUSTER = "BenchCluster"
BODY = b"m" * 1024
QUEUES_PER_GROUP = 8


def broker_cpu(mc: MultiGroupCluster) -> dict[str, float | None]:
    """CPU seconds so far of every broker, by "group/node"."""
    return {f"{name}/{node}": cpu_seconds(p.pid) for name, g in mc.groups.items() for node, p in g.brokers.items()}


async def masters(mc: MultiGroupCluster) -> set[str]:
    return {f"{name}/{node}" for name, node in (await mc.wait_masters()).items()}


async def measure(groups: int, seconds: float, window: int) -> dict:
    names = tuple(f"broker-{chr(ord('a') + i)}" for i in range(groups))
    with tempfile.TemporaryDirectory(prefix=f"lmq-bench-groups{groups}-") as root:
        async with open_multi_group_cluster(root, groups=names, namesrv_count=1, cluster_name=CLUSTER) as mc:
            admin = MQAdmin(mc.first.remoting, mc.namesrv_addr)
            await create_topic_everywhere(mc, admin)
            with trio.fail_after(60):   # every group's topic registered before the producer asks for the route
                while True:
                    try:
                        if len((await admin.route(TOPIC)).queue_datas) == groups:
                            break
                    except Exception:
                        pass
                    await trio.sleep(0.2)
            async with open_producer("bench_groups_pg", namesrv_addr=mc.namesrv_addr) as producer:
                for _ in range(200):                                   # warm up routes and connections
                    await producer.send(Message(TOPIC, BODY))
                idle = await idle_rates(mc, 3.0)
                leading = await masters(mc)
                sent = await send_phase(mc, producer, leading, seconds, window * groups, idle)
                # A master that changed during the phase (an election on an overloaded machine)
                # makes its masters/slaves split and its rate meaningless: said, not hidden.
                sent["master_changed"] = await masters(mc) != leading
            consumed = await consume_phase(mc, sent["count"] + 200, seconds * 3, idle)
            return {"groups": groups, "send": sent, "consume": consumed}


async def create_topic_everywhere(mc: MultiGroupCluster, admin: MQAdmin) -> None:
    """The topic on every group's master (`updateTopic -c`), asked again
    while a freshly started group on a busy machine still changes leader."""
    with trio.fail_after(60):
        while True:
            await mc.wait_masters()
            try:
                for addr in (await admin.masters(CLUSTER)).values():
                    await admin.create_topic(addr, TOPIC, QUEUES_PER_GROUP, QUEUES_PER_GROUP, 6, False)
                return
            except AdminError as e:
                print(f"(creating {TOPIC}: {e}; asking again)", file=sys.stderr)
                await trio.sleep(0.5)


async def idle_rates(mc: MultiGroupCluster, seconds: float) -> dict[str, float | None]:
    """Each broker's CPU seconds per second while nothing is sent."""
    cpu0, t0 = broker_cpu(mc), time.perf_counter()
    await trio.sleep(seconds)
    cpu1, elapsed = broker_cpu(mc), time.perf_counter() - t0
    return {k: (cpu1[k] - cpu0[k]) / elapsed if cpu0[k] is not None and cpu1[k] is not None else None for k in cpu0}


async def send_phase(mc: MultiGroupCluster, producer, leading: set[str], seconds: float, window: int,
                     idle: dict) -> dict:
    """`window` concurrent senders for `seconds`."""
    per_broker: dict[str, int] = {}
    done = [0]

    async def sender():
        while True:
            r = await producer.send(Message(TOPIC, BODY))
            if r.status is SendStatus.SEND_OK:
                done[0] += 1
                per_broker[r.queue.broker_name] = per_broker.get(r.queue.broker_name, 0) + 1

    cpu0, own0, t0 = broker_cpu(mc), own_cpu_seconds(), time.perf_counter()
    with trio.move_on_after(seconds):
        async with trio.open_nursery() as nursery:
            for _ in range(window):
                nursery.start_soon(sender)
    elapsed, cpu1, own1 = time.perf_counter() - t0, broker_cpu(mc), own_cpu_seconds()
    return {"count": done[0], "mps": rate(done[0], elapsed), "window": window, "per_group": per_broker,
            **cpu_split(cpu0, cpu1, leading, done[0], idle, elapsed),
            "client_cpu_us": cpu_us_per(own0, own1, done[0])}


def cpu_split(cpu0: dict, cpu1: dict, leading: set[str], count: int, idle: dict, elapsed: float) -> dict:
    """CPU us per message of all brokers, masters, slaves: as measured and
    above idle."""
    def total(keys, above_idle):
        ks = [k for k in keys if cpu0.get(k) is not None and cpu1.get(k) is not None]
        if not ks:
            return None
        return sum(cpu1[k] - cpu0[k] - (idle.get(k) or 0.0) * elapsed * above_idle for k in ks)

    slaves = set(cpu0) - leading
    out = {}
    for label, keys in (("brokers", set(cpu0)), ("masters", leading), ("slaves", slaves)):
        for suffix, above in (("", False), ("_above_idle", True)):
            t = total(keys, above)
            out[f"{label}_cpu_us{suffix}"] = round(t / count * 1e6, 1) if t is not None and count else None
    out["idle_cores"] = round(sum(v for v in idle.values() if v is not None), 3)
    return out


async def consume_phase(mc: MultiGroupCluster, expected: int, seconds: float, idle: dict) -> dict:
    leading = await masters(mc)
    got = [0]
    all_in = trio.Event()

    async def handler(msgs):
        got[0] += len(msgs)
        if got[0] >= expected:
            all_in.set()
        return ConsumeStatus.CONSUME_SUCCESS

    cpu0, own0, t0 = broker_cpu(mc), own_cpu_seconds(), time.perf_counter()
    async with open_push_consumer("bench_groups_cg", namesrv_addr=mc.namesrv_addr, subscriptions={TOPIC: "*"},
                                  handler=handler, consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                                  consume_batch_size=32):
        with trio.move_on_after(seconds):
            await all_in.wait()
    elapsed, cpu1, own1 = time.perf_counter() - t0, broker_cpu(mc), own_cpu_seconds()
    return {"count": got[0], "mps": rate(got[0], elapsed), **cpu_split(cpu0, cpu1, leading, got[0], idle, elapsed),
            "client_cpu_us": cpu_us_per(own0, own1, got[0])}


def report(runs: list[dict]) -> None:
    one = runs[0]
    print("CPU us per message: measured / above idle (idle: the cores the brokers use when nothing is sent)")
    print(f"{'groups':>6} {'phase':>9} {'in flight':>9} {'msg/s':>7} {'brokers':>13} {'masters':>13} "
          f"{'slaves':>13} {'client':>7} {'idle':>6}  per group")

    def pair(d, k):
        return f"{d[k + '_cpu_us']}/{d[k + '_cpu_us_above_idle']}"
    for r in runs:
        for phase in ("send", "consume"):
            d = r[phase]
            print(f"{r['groups']:>6} {phase:>9} {d.get('window', '-')!s:>9} {d['mps']:>7,.0f} {pair(d, 'brokers'):>13} "
                  f"{pair(d, 'masters'):>13} {pair(d, 'slaves'):>13} {d['client_cpu_us']!s:>7} {d['idle_cores']:>6}  "
                  f"{d.get('per_group', '')}")
    for r in runs:
        if r["send"]["master_changed"]:
            print(f"NOTE: a master changed during the {r['groups']}-group send phase (an election under load): "
                  f"discard that run's figures")
    for r in runs[1:]:
        for phase in ("send", "consume"):
            s, o = r[phase], one[phase]
            print(f"{r['groups']} groups vs 1, {phase}: CPU per message, all brokers "
                  f"{ratio(s['brokers_cpu_us'], o['brokers_cpu_us'])} measured, "
                  f"{ratio(s['brokers_cpu_us_above_idle'], o['brokers_cpu_us_above_idle'])} above idle; masters "
                  f"{ratio(s['masters_cpu_us_above_idle'], o['masters_cpu_us_above_idle'])} above idle; client "
                  f"{ratio(s['client_cpu_us'], o['client_cpu_us'])}; msg/s {ratio(s['mps'], o['mps'])} "
                  f"on {_cores()} cores")
    print("(two groups share these cores with each other and the client: see the module comment)")


def _cores() -> int:
    import os
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@click.command(context_settings=CONTEXT)
@click.option("--seconds", type=float, default=10.0, show_default=True, help="length of the send phase")
@click.option("--window", type=int, default=64, show_default=True, help="concurrent sends per group")
@click.option("--groups", default="1,2", show_default=True, help="layouts to measure, e.g. 1,2")
@click.option("--json", is_flag=True, help="print one JSON object")
def command(**kw) -> int:
    """The scale-out benchmark: the same send load on one broker group and on several."""
    a = types.SimpleNamespace(**kw)

    async def run():
        return [await measure(int(n), a.seconds, a.window) for n in a.groups.split(",")]

    runs = trio.run(run)
    if a.json:
        json.dump(runs, sys.stdout, indent=2)
        print()
    else:
        report(runs)


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.bench.groups")


if __name__ == "__main__":
    sys.exit(main())
