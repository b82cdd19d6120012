# Owns the timer-message benchmark (`python -m tools.bench.timer`): a name
# server and a 3-broker DLedger group as real processes on loopback.  While
# `--load` tasks keep sending 1 KiB plain messages (the load), 16 tasks send
# `--count` timer messages (TIMER_DELIVER_MS) due evenly over `--spread`
# seconds starting 2 s later, and one long-polling puller per queue of the
# timer messages' topic notes when each became visible.  Printed: the
# lateness of each timer message (the master's store time of the delivered
# record, and the consumer's visibility, minus the time asked) as p50/p99/
# max, how many came early (must be 0), duplicates and missing ones, and
# the load's send rate during the run, and how many timer sends were
# answered only after their time (those measure the send, not the timer:
# raise the lead or lower the count if there are many).  Not a test;
# nothing is asserted.
#
#   python -m tools.bench.timer [--count N] [--spread S] [--load L] [--json]
import json
import sys
import tempfile
import time
import types

import click
import trio

from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from consumequeue import record as M
from tools.bench.broker import create_topic_request, percentile
from tools.brokercluster import open_broker_cluster
from tools.cli import CONTEXT, run_command

TOPIC, LOAD_TOPIC, QUEUES = "TimerBench", "TimerBenchLoad", 4
FLAG_SUSPEND, FLAG_SUBSCRIPTION = 0x2, 0x4


def now_ms() -> int:
    return int(time.time() * 1000)


def send_request(topic: str, queue_id: int, body: bytes, props: dict) -> RemotingCommand:
    return RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, {
        "a": "timer_bench_pg", "b": topic, "c": "TBW102", "d": QUEUES, "e": queue_id, "f": 0, "g": now_ms(),
        "h": 0, "i": M.properties_to_string(props), "j": 0, "k": False, "m": False}, body=body)


def pull_request(queue_id: int, offset: int) -> RemotingCommand:
    return RemotingCommand.create_request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": "timer_bench_cg", "topic": TOPIC, "queueId": queue_id, "queueOffset": offset,
        "maxMsgNums": 32, "sysFlag": FLAG_SUSPEND | FLAG_SUBSCRIPTION, "commitOffset": 0,
        "suspendTimeoutMillis": 2000, "subscription": "*", "subVersion": 0})


def records(body: bytes) -> list[M.MessageRecord]:
    out, off = [], 0
    while off < len(body):
        out.append(M.decode(body, off))
        off += int.from_bytes(body[off:off + 4], "big")
    return out


def summary(values: list[int]) -> dict:
    v = sorted(values)
    return {"p50": percentile(v, 0.5), "p99": percentile(v, 0.99), "max": v[-1] if v else None}


async def run(count: int, spread: float, load: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="ledgermq-timer-bench-") as root:
        async with open_broker_cluster(root, size=3, extra_conf={"flushDiskType": "ASYNC_FLUSH"}) as cluster:
            rc = cluster.remoting
            master = cluster.addr(await cluster.wait_master())
            for topic in (TOPIC, LOAD_TOPIC):
                resp = await rc.invoke(master, create_topic_request(topic, QUEUES), 10)
                assert resp.code == ResponseCode.SUCCESS, resp.remark
            asked: dict[bytes, int] = {}
            seen: list[tuple[M.MessageRecord, int]] = []
            loaded = [0]
            acked_late = [0]  # timer sends answered only after their time (stored at once: not timers)
            start = now_ms() + 2000
            done = trio.Event()

            async def send_timers(k: int) -> None:
                for i in range(k, count, 16):
                    at = start + int(i * spread * 1000 / count)
                    body = f"t{i}".encode()
                    asked[body] = at
                    resp = await rc.invoke(master, send_request(TOPIC, i % QUEUES, body, {
                        "UNIQ_KEY": f"TB{i:08d}", "TIMER_DELIVER_MS": str(at)}), 10)
                    assert resp.code == ResponseCode.SUCCESS, resp.remark
                    if now_ms() >= at:
                        acked_late[0] += 1

            async def send_load(k: int) -> None:
                body = b"l" * 1024
                while not done.is_set():
                    resp = await rc.invoke(master, send_request(LOAD_TOPIC, k % QUEUES, body, {"TAGS": "load"}), 10)
                    if resp.code == ResponseCode.SUCCESS:
                        loaded[0] += 1

            async def pull(queue_id: int) -> None:
                offset = 0
                while not done.is_set():
                    resp = await rc.invoke(master, pull_request(queue_id, offset), 10)
                    at = now_ms()
                    if resp.code == ResponseCode.SUCCESS:
                        seen.extend((r, at) for r in records(resp.body))
                    offset = int(resp.ext_fields.get("nextBeginOffset", offset))
                    if len(seen) >= count:
                        done.set()

            t0 = time.monotonic()
            async with trio.open_nursery() as nursery:
                for q in range(QUEUES):
                    nursery.start_soon(pull, q)
                for k in range(load):
                    nursery.start_soon(send_load, k)
                async with trio.open_nursery() as senders:
                    for k in range(16):
                        senders.start_soon(send_timers, k)
                with trio.move_on_after(spread + 60):
                    await done.wait()
                done.set()
            elapsed = time.monotonic() - t0
    bodies = [r.body for r, _ in seen]
    stored = [r.store_timestamp - asked[r.body] for r, _ in seen]
    visible = [at - asked[r.body] for r, at in seen]
    return {"timers": count, "spread_s": spread, "load_tasks": load, "delivered": len(seen),
            "missing": len(set(asked) - set(bodies)), "duplicates": len(bodies) - len(set(bodies)),
            "early": sum(1 for s in stored if s < 0), "acked_after_due": acked_late[0],
            "stored_late_ms": summary(stored),
            "visible_late_ms": summary(visible), "load_sends_per_s": round(loaded[0] / elapsed, 1)}


@click.command(context_settings=CONTEXT)
@click.option("--count", type=int, default=5000, show_default=True, help="timer messages sent")
@click.option("--spread", type=float, default=5.0, show_default=True, help="seconds over which the timers are due")
@click.option("--load", type=int, default=32, show_default=True, help="plain send tasks running meanwhile")
@click.option("--json", is_flag=True, help="print one JSON object")
def command(**kw) -> int:
    """The timer-message benchmark: how late timers due over --spread seconds are stored and seen, under send load."""
    args = types.SimpleNamespace(**kw)
    res = trio.run(run, args.count, args.spread, args.load)
    if args.json:
        json.dump(res, sys.stdout, indent=2)
        print()
    else:
        print(f"{res['delivered']}/{res['timers']} timer messages due over {res['spread_s']} s, "
              f"{res['load_tasks']} load senders at {res['load_sends_per_s']} sends/s")
        for key in ("stored_late_ms", "visible_late_ms"):
            s = res[key]
            print(f"  {key:16} p50 {s['p50']} ms  p99 {s['p99']} ms  max {s['max']} ms")
        print(f"  early {res['early']}  duplicates {res['duplicates']}  missing {res['missing']}  "
              f"(sends answered after their time: {res['acked_after_due']})")
    return 0


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.bench.timer")


if __name__ == "__main__":
    sys.exit(main())
