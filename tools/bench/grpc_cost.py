# Owns the gRPC cost benchmark (`python -m tools.bench.grpc_cost`): what a
# message costs in CPU when it goes through mqproxy (RocketMQ 5 gRPC) against
# remoting straight to the brokers, in the same run, on the same group: a
# name server, a 3-node DLedger group and one mqproxy, real processes on
# 127.0.0.1, ASYNC_FLUSH, 1 KiB bodies.  The load comes from this process
# (not counted); the CPU counted is utime+stime of the broker processes and
# of the proxy (from /proc) over each phase, divided by its messages:
#
#   remoting send      the client library's Producer.send, C concurrent
#   gRPC send          SendMessage through the proxy, C concurrent (what the
#                      official clients send: one message per request)
#   remoting send @gRPC  remoting again, paced to the rate gRPC send reached:
#                      the brokers' cost per message depends on how many
#                      sends one replication round carries, so the brokers'
#                      share is compared at the same rate
#   remoting pull      PULL_MESSAGE of 32, until every message of the phase is read
#   remoting pop+ack   POP_MESSAGE of 32 then one ACK_MESSAGE per message
#                      (the client library's PopClient), C concurrent
#   gRPC receive+ack   ReceiveMessage of 32 (POP_MESSAGE) then one AckMessage
#                      per message (ACK_MESSAGE), as the official clients do
#
# Each phase's CPU is counted above idle: the processes' CPU over 2 s of
# nothing (Raft ticks, heartbeats, timers) is measured first and taken off
# per second of each phase, so a slower phase is not charged for time
# passing.  A pull consumer commits offsets now and then, a POP consumer
# acks every message (one replicated ack record each): compare gRPC
# receive+ack with remoting pop+ack for the proxy's share, with remoting
# pull for what POP costs.  Not a test; nothing is asserted.
#
#   python -m tools.bench.grpc_cost [--count N] [--concurrency C] [--json]
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import types

import anyio
import anyio.from_thread
import click

from broker.client import Message, open_producer, open_pull_consumer
from broker.client.model import PullStatus
from tools.brokercluster import open_broker_cluster
from tools.cli import CONTEXT, run_command

BODY = b"m" * 1024
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


class Meter:
    def __init__(self, brokers: list[int], proxy: int) -> None:
        self.brokers, self.proxy = brokers, proxy
        self.idle = (0.0, 0.0)  # CPU seconds per second of the brokers, of the proxy, doing nothing

    def read(self) -> tuple[float, float]:
        return sum(cpu_seconds(p) for p in self.brokers), cpu_seconds(self.proxy)

    async def measure_idle(self, seconds: float = 2.0) -> None:
        b0, p0 = self.read()
        await asyncio.sleep(seconds)  # nothing happens: that is what is measured
        b1, p1 = self.read()
        self.idle = ((b1 - b0) / seconds, (p1 - p0) / seconds)

    async def measure(self, what: str, n: int, fn) -> dict:
        b0, p0 = self.read()
        t0 = time.monotonic()
        done = await fn()
        wall = time.monotonic() - t0
        b1, p1 = self.read()
        n = max(1, done if isinstance(done, int) else n)
        broker = max(0.0, (b1 - b0) - self.idle[0] * wall)
        proxy = max(0.0, (p1 - p0) - self.idle[1] * wall)
        return {"phase": what, "messages": n, "seconds": round(wall, 2), "msg_per_s": round(n / wall, 1),
                "broker_us": round(broker / n * 1e6, 1), "proxy_us": round(proxy / n * 1e6, 1),
                "total_us": round((broker + proxy) / n * 1e6, 1),
                "broker_us_measured": round((b1 - b0) / n * 1e6, 1), "proxy_us_measured": round((p1 - p0) / n * 1e6, 1)}


async def _prepare(cluster, topics) -> None:
    from broker.namesrv.client import NamesrvClient
    from tools.mqadmin.adminapi import MQAdmin
    import trio
    admin = MQAdmin(cluster.remoting, cluster.namesrv_addr)
    addr = cluster.addr(await cluster.wait_master())
    for t in topics:
        await admin.create_topic(addr, t, 8, 8, 6, False)
    ns = NamesrvClient(cluster.remoting, [cluster.namesrv_addr], 3.0)
    with trio.fail_after(30):
        for t in topics:
            while await ns.get_route(t) is None:
                await trio.sleep(0.05)


async def _load(endpoint: str, ns: str, meter: Meter, n: int, conc: int) -> list[dict]:
    import grpc

    from broker.proxy import pb
    S = pb.service
    rows = []

    async def remoting_send(rate: float | None = None):
        async with open_producer("bench_pg", namesrv_addr=ns) as p:
            await p.send(Message("RemotingT", BODY))  # route and connection warm
            left = iter(range(n))
            t0 = time.monotonic()

            async def worker():
                for i in left:
                    if rate is not None:  # paced: message i leaves at i / rate
                        await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
                    await p.send(Message("RemotingT", BODY))
            async with anyio.create_task_group() as tg:
                for _ in range(conc):
                    tg.start_soon(worker)
        return n

    channel = grpc.aio.insecure_channel(endpoint)
    stub = pb.service_grpc.MessagingServiceStub(channel)
    md = [("x-mq-client-id", "bench@grpc"), ("x-mq-date-time", "20260101T000000Z"), ("x-mq-language", "PYTHON")]
    seq = iter(range(10 ** 9))

    def send_req():
        req = S.SendMessageRequest()
        m = req.messages.add()
        m.topic.name = "GrpcT"
        m.body = BODY
        m.system_properties.message_id = f"01BENCH{next(seq):026d}"
        m.system_properties.message_type = pb.MessageType.NORMAL
        return req

    async def grpc_send():
        await stub.SendMessage(send_req(), metadata=md)
        left = iter(range(n))

        async def worker():
            for _ in left:
                r = await stub.SendMessage(send_req(), metadata=md)
                assert r.status.code == pb.Code.OK, r.status
        await asyncio.gather(*(worker() for _ in range(conc)))
        return n

    async def remoting_pull():
        got = 0
        async with open_pull_consumer("bench_pull", namesrv_addr=ns) as pc:
            for q in await pc.fetch_queues("RemotingT"):
                offset = 0
                while True:
                    res = await pc.pull(q, offset, max_nums=32)
                    if res.status is not PullStatus.FOUND:
                        break
                    got += len(res.messages)
                    offset = res.next_begin_offset
        return got

    async def remoting_pop_ack():
        from broker.client.pop import open_pop_client
        got, empty = 0, 0
        async with open_pop_client(ns) as pc:
            route = await pc.instance.route("RemotingT")
            addr = route.master(sorted(route.brokers)[0])

            async def worker():
                nonlocal got, empty
                while empty < conc and got < n + 1:
                    res = await pc.pop(addr, "bench_pop_remoting", "RemotingT", max_nums=32, invisible_ms=60000,
                                       poll_ms=1000, init_mode=0)
                    if not res.messages:
                        empty += 1
                        continue
                    for m in res.messages:
                        await pc.ack(addr, "bench_pop_remoting", "RemotingT", m.receipt)
                    got += len(res.messages)
            async with anyio.create_task_group() as tg:
                for _ in range(conc):
                    tg.start_soon(worker)
        return got

    async def grpc_receive_ack():
        got, empty = 0, 0
        lock = asyncio.Lock()

        async def worker():
            nonlocal got, empty
            while empty < conc and got < n + 1:
                req = S.ReceiveMessageRequest(batch_size=32)
                req.group.name, req.message_queue.topic.name = "bench_pop", "GrpcT"
                req.invisible_duration.seconds = 60
                req.long_polling_timeout.seconds = 1
                msgs = [r.message async for r in stub.ReceiveMessage(req, metadata=md) if r.HasField("message")]
                if not msgs:
                    async with lock:
                        empty += 1
                    continue
                for m in msgs:
                    ack = S.AckMessageRequest()
                    ack.group.name, ack.topic.name = "bench_pop", "GrpcT"
                    ack.entries.add(message_id=m.system_properties.message_id,
                                    receipt_handle=m.system_properties.receipt_handle)
                    r = await stub.AckMessage(ack, metadata=md)
                    assert r.status.code == pb.Code.OK, r.status
                got += len(msgs)
        await asyncio.gather(*(worker() for _ in range(conc)))
        return got

    await meter.measure_idle()
    rows.append(await meter.measure("remoting send", n, remoting_send))
    rows.append(await meter.measure("gRPC send", n, grpc_send))
    # The brokers' cost per message depends on how many sends a round
    # carries (group commit): remoting again, paced to the rate gRPC got.
    paced = rows[-1]["msg_per_s"]
    rows.append(await meter.measure("remoting send @gRPC", n, lambda: remoting_send(paced)))
    rows.append(await meter.measure("remoting pull", n, remoting_pull))
    rows.append(await meter.measure("remoting pop+ack", n, remoting_pop_ack))
    rows.append(await meter.measure("gRPC receive+ack", n, grpc_receive_ack))
    await channel.close()
    return rows


def run(count: int, conc: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="ledgermq-grpc-bench-") as root:
        with anyio.from_thread.start_blocking_portal("trio") as portal:
            with portal.wrap_async_context_manager(open_broker_cluster(root)) as cluster:
                portal.call(_prepare, cluster, ("RemotingT", "GrpcT"))
                conf = os.path.join(root, "proxy.conf")
                with open(conf, "w") as f:
                    f.write(f"namesrvAddr={cluster.namesrv_addr}\ngrpcServerPort=0\nbindAddress=127.0.0.1\n"
                            "longPollingTimeoutMillis=5000\n")
                log = open(os.path.join(root, "proxy.log"), "w")
                proxy = subprocess.Popen([sys.executable, "-m", "broker.proxy.server", "-c", conf],
                                         stdout=subprocess.PIPE, stderr=log, text=True)
                try:
                    endpoint = json.loads(proxy.stdout.readline())["grpcEndpoint"]
                    meter = Meter([p.pid for p in cluster.brokers.values()], proxy.pid)
                    rows = anyio.run(_load, endpoint, cluster.namesrv_addr, meter, count, conc, backend="asyncio")
                finally:
                    proxy.terminate()
                    proxy.wait(10)
                    log.close()
    return {"count": count, "concurrency": conc, "rows": rows, "idle": meter.idle}


@click.command(context_settings=CONTEXT)
@click.option("--count", type=int, default=5000, show_default=True, help="messages per phase")
@click.option("--concurrency", type=int, default=16, show_default=True, help="requests in flight")
@click.option("--json", is_flag=True, help="print one JSON object")
def command(**kw) -> int:
    """The gRPC cost benchmark: CPU per message through mqproxy against plain remoting."""
    args = types.SimpleNamespace(**kw)
    res = run(args.count, args.concurrency)
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"gRPC cost: name server + 3 mqbroker + 1 mqproxy processes on 127.0.0.1, ASYNC_FLUSH, 1 KiB bodies, "
          f"{res['count']:,} messages per phase, {res['concurrency']} in flight; CPU per message (utime+stime) "
          f"above idle")
    rows = {r["phase"]: r for r in res["rows"]}
    for r in res["rows"]:
        print(f"  {r['phase']:20} {r['msg_per_s']:>9,.0f} msg/s   brokers {r['broker_us']:>7.1f} µs   "
              f"proxy {r['proxy_us']:>7.1f} µs   total {r['total_us']:>7.1f} µs/msg")
    for grpc_row, remoting_row in (("gRPC send", "remoting send @gRPC"), ("gRPC receive+ack", "remoting pop+ack")):
        g, r = rows[grpc_row], rows[remoting_row]
        print(f"  {grpc_row} / {remoting_row}: {g['total_us'] / r['total_us']:.2f}x the CPU per message "
              f"(the proxy's share {g['proxy_us']:.0f} µs)")
    return 0


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.bench.grpc_cost")


if __name__ == "__main__":
    sys.exit(main())
