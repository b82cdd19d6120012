# Owns the broker benchmark (`python -m tools.bench.broker`): a name server
# and a 3-broker DLedger group as real processes on loopback, 1 KiB messages,
# ASYNC_FLUSH.  Measured, each phase bounded by a count and a time cap:
#
#   sync send      one SEND_MESSAGE_V2 in flight: p50/p99 latency
#   window send    many SEND_MESSAGE_V2 in flight on one connection (raw
#                  remoting, what the broker can take): messages/s
#   batch send     SEND_BATCH_MESSAGE of 32 messages, several in flight
#   client send    the same through the Python client library (producer.send,
#                  many concurrent; one in flight for its latency)
#   pull consume   raw PULL_MESSAGE, one puller per queue, until drained
#   push consume   the client library's push consumer, until drained
#
# Every figure is printed next to a peer measured in the same run, never
# against a fixed target: the replicated log's own append rate with the same
# window and record size (commitlog node processes, load generated inside
# the leader: the physical limit the broker sits on), raw remoting vs the
# client library, and send vs consume.  Not a test; nothing is asserted.
#
#   python -m tools.bench.broker [--count N] [--window W] [--seconds S] [--json] [--no-client]
import json
import os
import resource
import struct
import sys
import tempfile
import time
import types

import click
import trio

from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from consumequeue import batch as batches
from consumequeue import record as M
from tools.bench.rawsend import FrameTemplate, run_window
from tools.brokercluster import LocalBrokerCluster, open_broker_cluster
from tools.cli import CONTEXT, run_command
from tools.localcluster import LocalCluster

TOPIC = "BenchTopic"
QUEUES = 8
BODY = b"m" * 1024
PGROUP, CGROUP = "bench_pg", "bench_cg"
BATCH = 32
FLAG_SUBSCRIPTION = 0x4


def percentile(sorted_values: list[float], p: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(p * len(sorted_values)))]


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else 0.0


def ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else "n/a"


# --- raw requests ----------------------------------------------------------------------

def create_topic_request(topic: str = TOPIC, queues: int = QUEUES) -> RemotingCommand:
    return RemotingCommand.create_request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": queues, "writeQueueNums": queues,
        "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False})


def send_request(queue_id: int, body: bytes = BODY) -> RemotingCommand:
    fields = {"a": PGROUP, "b": TOPIC, "c": "TBW102", "d": QUEUES, "e": queue_id, "f": 0,
              "g": int(time.time() * 1000), "h": 0, "i": "TAGS\x01bench\x02", "j": 0, "k": False, "m": False}
    return RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, fields, body=body)


def batch_request(queue_id: int, n: int = BATCH) -> RemotingCommand:
    items = [batches.BatchItem(BODY, {"TAGS": "bench"})] * n
    fields = {"a": PGROUP, "b": TOPIC, "c": "TBW102", "d": QUEUES, "e": queue_id, "f": 0,
              "g": int(time.time() * 1000), "h": 0, "i": "", "j": 0, "k": False, "m": True}
    return RemotingCommand.create_request(RequestCode.SEND_BATCH_MESSAGE, fields, body=batches.encode_batch(items))


def pull_request(queue_id: int, offset: int, max_nums: int = 32) -> RemotingCommand:
    return RemotingCommand.create_request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": CGROUP, "topic": TOPIC, "queueId": queue_id, "queueOffset": offset,
        "maxMsgNums": max_nums, "sysFlag": FLAG_SUBSCRIPTION, "commitOffset": 0, "suspendTimeoutMillis": 0,
        "subscription": "*", "subVersion": 0, "expressionType": "TAG"})


def cpu_seconds(pid: int | None) -> float | None:
    """user+system CPU seconds of a process so far (Linux /proc; None
    elsewhere).  CPU per message stays comparable on a shared machine,
    where messages/s swing by 2x."""
    split = cpu_split(pid)
    return None if split is None else split[0] + split[1]


def cpu_split(pid: int | None) -> tuple[float, float] | None:
    """(user, system) CPU seconds of a process so far (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, TypeError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def own_cpu_seconds() -> float:
    """This process's user+system CPU seconds (the client side of a phase)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cpu_us_per(before: float | None, after: float | None, count: int) -> float | None:
    return round((after - before) / count * 1e6, 1) if before is not None and after is not None and count else None


_SIZE_MAGIC = struct.Struct(">ii")


def count_records(body: bytes) -> int:
    """The records in a pull's body, walked by their TOTALSIZE and MAGICCODE
    only (0.16 µs a record; parsing each layout cost 4, most of the raw
    consumer's CPU, and the consume rows measured the load generator);
    ValueError when they do not tile the body."""
    n = pos = 0
    end = len(body)
    unpack = _SIZE_MAGIC.unpack_from
    while pos < end:
        size, magic = unpack(body, pos) if pos + 8 <= end else (0, 0)
        if size < M.POS_MAGIC + 4 or magic not in (M.MAGIC_V1, M.MAGIC_V2):
            raise ValueError(f"no record at byte {pos} of a pull's body (size {size}, magic {magic:#x})")
        pos += size
        n += 1
    if pos != end:
        raise ValueError(f"the last record runs {pos - end} bytes past the pull's body")
    return n


# --- the peer: the replicated log itself ------------------------------------------------------

async def measure_log(record_size: int, count: int, window: int) -> dict:
    """The commitlog group's in-process append load with the broker's record
    size: one in flight (latency) and `window` in flight (throughput)."""
    with tempfile.TemporaryDirectory(prefix="lmq-bench-broker-log-") as root:
        cluster = LocalCluster(root, extra_conf={"flushDiskType": "ASYNC_FLUSH"})
        await cluster.start()
        try:
            leader = await cluster.wait_leader()
            call = cluster.call
            await call(leader, {"op": "load", "count": 1000, "size": record_size, "window": 64}, timeout=120)
            single = await call(leader, {"op": "load", "count": min(count, 2000), "size": record_size,
                                         "window": 1}, timeout=300)
            cpu0 = cpu_seconds(cluster.nodes[leader].process.pid)
            windowed = await call(leader, {"op": "load", "count": count, "size": record_size,
                                           "window": window}, timeout=300)
            windowed["leader_cpu_us"] = cpu_us_per(cpu0, cpu_seconds(cluster.nodes[leader].process.pid),
                                                   windowed["appended"])
            return {"single": single, "window": windowed}
        finally:
            await cluster.stop_all()


# --- broker phases (raw remoting) ------------------------------------------------------------

class Phases:
    def __init__(self, cluster: LocalBrokerCluster, master: str, seconds: float) -> None:
        self.cluster, self.master, self.seconds = cluster, master, seconds
        self.addr = cluster.addr(master)
        self.rc = cluster.remoting
        self.errors: dict[str, int] = {}
        self.sent = 0  # messages acknowledged SEND_OK, over every phase

    def _error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1

    async def _send(self, cmd: RemotingCommand, n: int = 1) -> bool:
        resp = await self.rc.invoke(self.addr, cmd, timeout=10)
        if resp.code != ResponseCode.SUCCESS:
            self._error(ResponseCode(resp.code).name)
            return False
        self.sent += n
        return True

    async def sync_send(self, count: int) -> dict:
        lat = []
        deadline = trio.current_time() + self.seconds
        for i in range(count):
            t0 = time.perf_counter()
            if await self._send(send_request(i % QUEUES)):
                lat.append(time.perf_counter() - t0)
            if trio.current_time() > deadline:
                break
        lat.sort()
        return {"count": len(lat), "p50_ms": ms(percentile(lat, 0.5)), "p99_ms": ms(percentile(lat, 0.99))}

    async def windowed(self, count: int, window: int, make, per_request: int = 1) -> dict:
        """`window` requests in flight on one connection, `count` messages in
        all, from the cheap generator (tools.bench.rawsend: the remoting
        client costs ~70 us of CPU per request and would set the rate on a
        small machine); also the master's CPU per message."""
        pid = self.cluster.brokers[self.master].pid
        templates = [FrameTemplate(make(q)) for q in range(QUEUES)]
        cpu0, own0 = cpu_seconds(pid), own_cpu_seconds()
        r = await run_window(self.addr, templates, count=count, window=window, seconds=self.seconds,
                             per_request=per_request)
        for code, n in r["errors"].items():
            self.errors[ResponseCode(code).name] = self.errors.get(ResponseCode(code).name, 0) + n
        done, elapsed = r["count"], r["seconds"]
        self.sent += done
        lat = sorted(r["latencies"])
        return {"count": done, "seconds": round(elapsed, 3), "mps": rate(done, elapsed),
                "p99_ms": ms(percentile(lat, 0.99)), "master_cpu_us": cpu_us_per(cpu0, cpu_seconds(pid), done),
                "client_cpu_us": cpu_us_per(own0, own_cpu_seconds(), done)}

    async def max_offsets(self) -> dict[int, int]:
        out = {}
        for q in range(QUEUES):
            resp = await self.rc.invoke(self.addr, RemotingCommand.create_request(
                RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": q}))
            out[q] = int(resp.ext_fields["offset"])
        return out

    async def pull_all(self, node: str, batch: int = 32) -> dict:
        """One puller per queue from offset 0 until it reaches the queue's
        max offset, `batch` messages asked per pull (maxMsgNums); messages/s
        over everything pulled."""
        addr = self.cluster.addr(node)
        targets = await self.max_offsets()
        got = [0]

        async def puller(q: int) -> None:
            offset = 0
            while offset < targets[q]:
                resp = await self.rc.invoke(addr, pull_request(q, offset, batch), timeout=10)
                if resp.code != ResponseCode.SUCCESS:
                    self._error(f"pull {ResponseCode(resp.code).name}")
                    if resp.code != ResponseCode.PULL_NOT_FOUND:
                        return
                    await trio.sleep(0.01)  # a slave still dispatching: back off briefly
                    continue
                got[0] += count_records(resp.body)
                offset = int(resp.ext_fields["nextBeginOffset"])

        t0 = time.perf_counter()
        with trio.move_on_after(self.seconds):
            async with trio.open_nursery() as nursery:
                for q in range(QUEUES):
                    nursery.start_soon(puller, q)
        elapsed = time.perf_counter() - t0
        return {"count": got[0], "expected": sum(targets.values()), "seconds": round(elapsed, 3),
                "mps": rate(got[0], elapsed)}


# --- the client library ------------------------------------------------------------------------

def client_library():
    try:
        import broker.client as client
    except ImportError:
        return None
    return client if hasattr(client, "open_producer") else None


async def client_send(client, namesrv: str, count: int, window: int, seconds: float) -> dict:
    msg = client.Message(TOPIC, BODY, tags="bench")
    lat: list[float] = []
    done = [0]
    errors: dict[str, int] = {}
    async with client.open_producer("bench_client_pg", namesrv_addr=namesrv) as producer:
        for _ in range(50):  # warm-up: routes, connection
            await producer.send(msg)
        single = []
        with trio.move_on_after(seconds):
            for _ in range(min(count, 1000)):
                t0 = time.perf_counter()
                await producer.send(msg)
                single.append(time.perf_counter() - t0)
        tickets = iter(range(count))

        async def sender():
            for _ in tickets:
                t0 = time.perf_counter()
                try:
                    r = await producer.send(msg)
                except client.ClientError as e:
                    errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                    continue
                if r.status == client.SendStatus.SEND_OK:
                    done[0] += 1
                    lat.append(time.perf_counter() - t0)

        t0, own0 = time.perf_counter(), own_cpu_seconds()
        with trio.move_on_after(seconds):
            async with trio.open_nursery() as nursery:
                for _ in range(window):
                    nursery.start_soon(sender)
        elapsed, own1 = time.perf_counter() - t0, own_cpu_seconds()
    single.sort()
    return {"single_p50_ms": ms(percentile(single, 0.5)), "single_p99_ms": ms(percentile(single, 0.99)),
            "count": done[0], "seconds": round(elapsed, 3), "mps": rate(done[0], elapsed), "errors": errors,
            "client_cpu_us": cpu_us_per(own0, own1, done[0]),
            "sent_total": done[0] + 50 + len(single)}


async def client_push(client, namesrv: str, expected: int, seconds: float) -> dict:
    got = [0]
    drained = trio.Event()

    async def handler(msgs):
        got[0] += len(msgs)
        if got[0] >= expected:
            drained.set()
        return client.ConsumeStatus.CONSUME_SUCCESS

    t0 = time.perf_counter()
    with trio.move_on_after(seconds):
        async with client.open_push_consumer("bench_client_cg", namesrv_addr=namesrv,
                                             subscriptions={TOPIC: "*"}, handler=handler,
                                             consume_from=client.ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET):
            await drained.wait()
    elapsed = time.perf_counter() - t0
    return {"count": got[0], "expected": expected, "seconds": round(elapsed, 3), "mps": rate(got[0], elapsed)}


# --- the run ----------------------------------------------------------------------------------

async def run(args) -> dict:
    out: dict = {"count": args.count, "window_size": args.window, "batch_size": BATCH, "queues": QUEUES}
    # What one SEND_MESSAGE_V2 of the run stores: the peer appends entries of that size.
    record_size = len(M.encode(M.MessageRecord(TOPIC, BODY, {"TAGS": "bench", "UNIQ_KEY": "0" * 32,
                                                             "CLUSTER": "LedgerCluster"})))
    out["log"] = await measure_log(record_size, args.count, args.window)
    out["log"]["record_size"] = record_size
    client = None if args.no_client else client_library()
    with tempfile.TemporaryDirectory(prefix="lmq-bench-broker-") as root:
        async with open_broker_cluster(root) as cluster:
            master = await cluster.wait_master()
            resp = await cluster.remoting.invoke(cluster.addr(master), create_topic_request())
            if resp.code != ResponseCode.SUCCESS:
                raise RuntimeError(f"topic creation failed: {resp.code} {resp.remark}")
            namesrv = cluster.namesrv_addr
            phases = Phases(cluster, master, args.seconds)
            await phases.windowed(2000, 64, send_request)  # warm-up
            out["sync"] = await phases.sync_send(min(args.count, 2000))
            out["window"] = await phases.windowed(args.count, args.window, send_request)
            out["batch"] = await phases.windowed(args.count, max(1, args.window // BATCH), batch_request, BATCH)
            if client is not None:
                out["client_send"] = await client_send(client, namesrv, args.count // 2,
                                                       args.window, args.seconds)
            out["pull_master"] = await phases.pull_all(master)
            slave = next(n for n in sorted(cluster.brokers) if n != master)
            out["pull_slave"] = await phases.pull_all(slave)
            if client is not None:
                out["client_push"] = await client_push(client, namesrv,
                                                       out["pull_master"]["expected"], args.seconds)
            out["errors"] = phases.errors
    if client is None:
        out["client"] = "skipped: " + ("--no-client" if args.no_client else "broker.client is not available")
    return out


def report(r: dict) -> None:
    log_single, log_window = r["log"]["single"], r["log"]["window"]
    s, w, b = r["sync"], r["window"], r["batch"]
    n = r["window_size"]
    print(f"broker benchmark: name server + 3 mqbroker processes on 127.0.0.1, ASYNC_FLUSH, 1 KiB bodies "
          f"({r['log']['record_size']}-byte records), {r['queues']} queues")
    print(f"  peer, the replicated log alone (load inside the leader): one in flight p50 {log_single['p50_ms']} ms; "
          f"{n} in flight {log_window['eps']:,} entries/s, leader CPU {log_window.get('leader_cpu_us')} us/entry")
    print(f"  sync send, raw, one in flight     p50 {s['p50_ms']} ms, p99 {s['p99_ms']} ms "
          f"(log p50 x{s['p50_ms'] / log_single['p50_ms']:.1f})" if s["p50_ms"] and log_single["p50_ms"] else
          f"  sync send: {s}")
    print(f"  window send, raw, {n} in flight   {w['mps']:,} msg/s, p99 {w['p99_ms']} ms = "
          f"{ratio(w['mps'], log_window['eps'])} of the log's rate; master CPU {w['master_cpu_us']} us/msg "
          f"= {ratio(w['master_cpu_us'], log_window.get('leader_cpu_us'))} the log's")
    print(f"  batch send, raw, {r['batch_size']}/batch        {b['mps']:,} msg/s = {ratio(b['mps'], w['mps'])} "
          f"window send; master CPU {b['master_cpu_us']} us/msg")
    if "client_send" in r:
        c = r["client_send"]
        print(f"  client send, {n} concurrent       {c['mps']:,} msg/s = {ratio(c['mps'], w['mps'])} raw; "
              f"client CPU {c['client_cpu_us']} us/msg = {ratio(c['client_cpu_us'], w['client_cpu_us'])} raw's "
              f"({w['client_cpu_us']}); one in flight p50 {c['single_p50_ms']} ms (raw {s['p50_ms']} ms)")
    for key, what in (("pull_master", "pull, raw, from the master"), ("pull_slave", "pull, raw, from a slave")):
        p = r[key]
        print(f"  {what:32}  {p['mps']:,} msg/s ({p['count']:,}/{p['expected']:,} messages) "
              f"= {ratio(p['mps'], w['mps'])} window send")
    if "client_push" in r:
        p = r["client_push"]
        print(f"  push consumer, Python client      {p['mps']:,} msg/s ({p['count']:,}/{p['expected']:,}) "
              f"= {ratio(p['mps'], r['pull_master']['mps'])} raw pull")
    if "client" in r:
        print(f"  client library: {r['client']}")
    if r.get("errors"):
        print(f"  errors: {r['errors']}")


@click.command(context_settings=CONTEXT)
@click.option("--count", type=int, default=20_000, show_default=True, help="messages per throughput phase")
@click.option("--window", type=int, default=256, show_default=True, help="sends in flight")
@click.option("--seconds", type=float, default=30.0, show_default=True, help="time cap of each phase")
@click.option("--no-client", is_flag=True, help="raw remoting only")
@click.option("--json", is_flag=True, help="print one JSON object")
def command(**kw) -> int:
    """The broker benchmark: a name server and a 3-broker group, raw remoting and client sends."""
    args = types.SimpleNamespace(**kw)
    res = trio.run(run, args)
    if args.json:
        print(json.dumps(res))
    else:
        report(res)
    return 0


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.bench.broker")


if __name__ == "__main__":
    sys.exit(main())
