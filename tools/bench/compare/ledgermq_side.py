# Owns the ledgermq side of the comparison: a name server and a 3-broker
# DLedger group as real processes (tools.brokercluster), ASYNC_FLUSH for
# every row but the fsync ones, which get a second group with SYNC_FLUSH;
# the workloads of common.ROWS against them with the raw remoting generators
# of tools.bench.broker (pipelined SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE /
# PULL_MESSAGE over one connection) and the Python client (broker.client).
# Runs under trio; run_round() starts and stops its clusters, so nothing of
# ledgermq is left running while NATS is measured.
import os
import time

import trio

import broker.client as client
from broker.remoting.codes import ResponseCode
from tools.bench.broker import TOPIC, Phases, batch_request, client_push, create_topic_request, send_request
from tools.bench.compare.common import (
    BATCH,
    BATCHES_IN_FLIGHT,
    BODY,
    FAILOVER_SENDERS,
    Meter,
    Workload,
    latency_result,
    rate,
)
from tools.brokercluster import LocalBrokerCluster, open_broker_cluster

PRODUCER_GROUP = "cmp_client_pg"
CONSUME_BATCH = 256  # messages asked per raw pull, as the NATS side fetches


async def _ready(cluster: LocalBrokerCluster) -> tuple[str, dict[str, int], dict[str, str]]:
    """The master, once the topic exists; role -> PID and role -> node."""
    master = await cluster.wait_master()
    resp = await cluster.remoting.invoke(cluster.addr(master), create_topic_request())
    if resp.code != ResponseCode.SUCCESS:
        raise RuntimeError(f"topic creation failed: {resp.code} {resp.remark}")
    slaves = [n for n in sorted(cluster.brokers) if n != master]
    names = {"master": master, **{f"slave{i + 1}": n for i, n in enumerate(slaves)}, "namesrv": "namesrv0"}
    pids = {role: (cluster.brokers[n].pid if n in cluster.brokers else cluster.namesrvs[0].pid)
            for role, n in names.items()}
    return master, pids, names


async def measured(meter: Meter, fn, *args) -> dict:
    meter.start()
    r = await fn(*args)
    return {**r, **meter.stop(r.get("count", 0))}


def _errors(phases: Phases) -> int:
    n = sum(phases.errors.values())
    phases.errors.clear()
    return n


async def raw(phases: Phases, fn, *args) -> dict:
    """A tools.bench.broker phase, with the errors it counted (its own
    master/client CPU figures dropped: the Meter measures every process)."""
    r = await fn(*args)
    r.pop("master_cpu_us", None)
    r.pop("client_cpu_us", None)
    r["errors"] = _errors(phases)
    return r


# --- the Python client ------------------------------------------------------------------

async def client_single(producer, count: int, cap: float) -> dict:
    msg = client.Message(TOPIC, BODY, tags="bench")
    lat, errors = [], 0
    with trio.move_on_after(cap):
        for _ in range(count):
            t0 = time.perf_counter()
            try:
                await producer.send(msg)
                lat.append(time.perf_counter() - t0)
            except client.ClientError:
                errors += 1
    return latency_result(lat, {"errors": errors})


async def client_window(producer, count: int, in_flight: int, cap: float, batch: int = 1) -> dict:
    """producer.send_async with `in_flight` pending, each answer's callback
    sending the next (batch=1: what nats-py's publish_async with a pending
    limit does on the other side), or `in_flight` tasks each sending
    SEND_BATCH_MESSAGEs of `batch`."""
    msg = client.Message(TOPIC, BODY, tags="bench")
    msgs = [msg] * batch
    tickets = iter(range(0, count, batch))
    ok, errors = [0], [0]
    if batch == 1:
        left, stop = [count], [False]

        def again(result, error) -> None:
            if error is None:
                ok[0] += 1
            else:
                errors[0] += 1
            if left[0] > 0 and not stop[0]:
                left[0] -= 1
                producer.send_async(msg, again)

        t0 = time.perf_counter()
        with trio.move_on_after(cap):
            for _ in range(min(in_flight, count)):
                left[0] -= 1
                producer.send_async(msg, again)
            await producer.drain()
        elapsed = time.perf_counter() - t0
        done = ok[0]
        stop[0] = True
        await producer.drain()  # (past the cap: the last answers, not counted)
        return {"count": done, "errors": errors[0], "seconds": round(elapsed, 3), "mps": rate(done, elapsed)}

    async def sender() -> None:
        for _ in tickets:
            try:
                if batch == 1:
                    await producer.send(msg)
                else:
                    await producer.send_batch(msgs)
                ok[0] += batch
            except client.ClientError:
                errors[0] += 1

    t0 = time.perf_counter()
    with trio.move_on_after(cap):
        async with trio.open_nursery() as nursery:
            for _ in range(in_flight):
                nursery.start_soon(sender)
    elapsed = time.perf_counter() - t0
    return {"count": ok[0], "errors": errors[0], "seconds": round(elapsed, 3), "mps": rate(ok[0], elapsed)}


async def failover(cluster: LocalBrokerCluster, master: str, w: Workload) -> dict:
    """FAILOVER_SENDERS concurrent producer.send calls; kill -9 the master
    after a warm-up; the figure is the time from the kill to the first
    SEND_OK of a send started after it (the client finds the new master
    through the name server by itself)."""
    msg = client.Message(TOPIC, BODY, tags="bench")
    killed_at: list[float] = []
    first_ack = trio.Event()
    result: dict = {"acked": 0, "errors": 0}

    async def sender(producer) -> None:
        while True:
            t0 = time.perf_counter()
            try:
                await producer.send(msg)
            except client.ClientError:
                result["errors"] += 1
                await trio.sleep(0.01)  # a refused send can answer at once: don't spin
                continue
            result["acked"] += 1
            if killed_at and t0 > killed_at[0] and not first_ack.is_set():
                result["seconds"] = round(time.perf_counter() - killed_at[0], 3)
                first_ack.set()

    async with client.open_producer("cmp_failover_pg", namesrv_addr=cluster.namesrv_addr) as producer:
        async with trio.open_nursery() as nursery:
            for _ in range(FAILOVER_SENDERS):
                nursery.start_soon(sender, producer)
            await trio.sleep(w.failover_warmup)
            result["acked_before_kill"] = result["acked"]
            killed_at.append(time.perf_counter())
            cluster.kill(master)
            with trio.move_on_after(w.failover_cap) as scope:
                await first_ack.wait()
            if scope.cancelled_caught:
                result["seconds"] = None
            nursery.cancel_scope.cancel()
    await cluster.wait_dead(master)
    with trio.move_on_after(10):
        result["new_master"] = await cluster.wait_master(exclude={master}, settled=False)
    result["killed"] = master
    return result


# --- one round ----------------------------------------------------------------------------

async def _async_cluster(root: str, w: Workload, out: dict) -> None:
    async with open_broker_cluster(os.path.join(root, "async")) as cluster:
        master, pids, names = await _ready(cluster)
        out["nodes"] = names
        meter = Meter(pids)
        phases = Phases(cluster, master, w.cap)
        await phases.windowed(2000, 64, send_request)  # warm-up
        _errors(phases)
        out["send_1_raw"] = await measured(meter, raw, phases, phases.sync_send, w.single)
        for n in (256, 1000):
            out[f"window_{n}_raw"] = await measured(meter, raw, phases, phases.windowed, w.window, n, send_request)
        out["batch_32_raw"] = await measured(meter, raw, phases, phases.windowed, w.batch, BATCHES_IN_FLIGHT,
                                             batch_request, BATCH)

        async with client.open_producer(PRODUCER_GROUP, namesrv_addr=cluster.namesrv_addr) as producer:
            await client_window(producer, 50, 1, w.cap)  # warm-up: route, connection, heartbeat
            out["send_1_client"] = await measured(meter, client_single, producer, w.single_client, w.cap)
            for n in (256, 1000):
                out[f"window_{n}_client"] = await measured(meter, client_window, producer, w.window_client, n,
                                                           w.cap)
            out["batch_32_client"] = await measured(meter, client_window, producer, w.window_client,
                                                    BATCHES_IN_FLIGHT, w.cap, BATCH)

        phases.seconds = w.cap * 2
        # Batches of 256, as the NATS side fetches (and as the table
        # measured): RocketMQ's own default of 32 is a client setting.
        out["consume_raw"] = await measured(meter, raw, phases, phases.pull_all, master, CONSUME_BATCH)
        expected = out["consume_raw"]["expected"]
        out["consume_client"] = await measured(meter, client_push, client, cluster.namesrv_addr, expected,
                                               w.cap * 2)

        out["failover"] = await failover(cluster, master, w)


async def _sync_cluster(root: str, w: Workload, out: dict) -> None:
    async with open_broker_cluster(os.path.join(root, "sync"), extra_conf={"flushDiskType": "SYNC_FLUSH"}) as cluster:
        master, pids, names = await _ready(cluster)
        out["nodes_fsync"] = names
        meter = Meter(pids)
        phases = Phases(cluster, master, w.cap)
        await phases.windowed(500, 64, send_request)  # warm-up
        _errors(phases)
        out["fsync_window_256_raw"] = await measured(meter, raw, phases, phases.windowed, w.fsync_window, 256,
                                                     send_request)
        out["fsync_send_1_raw"] = await measured(meter, raw, phases, phases.sync_send, w.fsync_single)


async def run_round(root: str, w: Workload) -> dict:
    """Every ledgermq figure of one round: the ASYNC_FLUSH group, then the
    SYNC_FLUSH one (never both running)."""
    out: dict = {}
    await _async_cluster(root, w, out)
    await _sync_cluster(root, w, out)
    return out
