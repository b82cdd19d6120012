# Owns what both sides of the ledgermq-vs-NATS comparison share: the rows
# (name, what is measured, which way is better), the per-workload message
# counts and time caps (full and --quick), and the meter that reads CPU and
# RSS of every server process and of this client process around a phase.
# It has no event loop of its own: the ledgermq side runs it under trio, the
# NATS side under asyncio (nats-py is asyncio-only).
import os
import resource
import signal
import subprocess

import attrs
import psutil

from tools.bench.broker import ms, percentile, rate

BODY = b"m" * 1024  # 1 KiB, both sides
BATCH = 32  # messages per SEND_BATCH_MESSAGE / per burst of async publishes
BATCHES_IN_FLIGHT = 8  # 8 x 32 = 256 messages in flight, like the window-256 row
FAILOVER_SENDERS = 32  # concurrent client sends while the leader is killed

__all__ = ["BODY", "BATCH", "BATCHES_IN_FLIGHT", "FAILOVER_SENDERS", "ROWS", "Row", "Workload", "Meter",
           "latency_result", "ms", "percentile", "rate", "stop_pid", "workload"]


@attrs.frozen
class Row:
    key: str
    kind: str  # "mps" (higher is better), "latency" (ms, lower is better), "failover" (s, lower is better)
    title: str
    ledgermq: str  # what runs on each side
    nats: str


ROWS = [
    Row("send_1_raw", "latency", "one in flight, raw",
        "SEND_MESSAGE_V2, raw remoting", "PUB + PubAck, raw protocol"),
    Row("send_1_client", "latency", "one in flight, client",
        "producer.send", "nats-py js.publish"),
    Row("window_256_raw", "mps", "256 in flight, raw",
        "pipelined SEND_MESSAGE_V2, 1 socket", "pipelined PUB, 1 socket"),
    Row("window_1000_raw", "mps", "1000 in flight, raw",
        "pipelined SEND_MESSAGE_V2, 1 socket", "pipelined PUB, 1 socket"),
    Row("window_256_client", "mps", "256 in flight, client",
        "producer.send_async, 256 pending", "nats-py publish_async, 256 pending"),
    Row("window_1000_client", "mps", "1000 in flight, client",
        "producer.send_async, 1000 pending", "nats-py publish_async, 1000 pending"),
    Row("batch_32_raw", "mps", "batches of 32, 8 in flight, raw",
        "SEND_BATCH_MESSAGE of 32", "bursts of 32 PUBs in one write"),
    Row("batch_32_client", "mps", "batches of 32, 8 in flight, client",
        "producer.send_batch of 32", "32 publish_async awaited together"),
    Row("fsync_window_256_raw", "mps", "fsync per write, 256 in flight, raw",
        "SYNC_FLUSH", "sync_interval: always"),
    Row("fsync_send_1_raw", "latency", "fsync per write, one in flight, raw",
        "SYNC_FLUSH", "sync_interval: always"),
    Row("consume_raw", "mps", "consume the backlog, raw",
        "PULL_MESSAGE of 256, one puller per queue", "pull consumer, MSG.NEXT batch 256, raw protocol"),
    Row("consume_client", "mps", "consume the backlog, client",
        "push consumer", "nats-py pull_subscribe fetch(256)"),
    Row("failover", "failover", "kill -9 leader under load",
        "kill -9 master: first SEND_OK of a send started after it",
        "kill -9 stream leader: first PubAck of a publish started after it"),
]
ROW_KEYS = [r.key for r in ROWS]


@attrs.frozen
class Workload:
    """Messages per phase (each phase also stops at `cap` seconds)."""
    single: int  # one in flight, raw
    single_client: int
    window: int  # per windowed raw phase
    window_client: int
    batch: int
    fsync_window: int
    fsync_single: int
    failover_warmup: float  # seconds of load before the kill
    cap: float  # time cap of each phase
    failover_cap: float  # time cap from the kill to the first acknowledgement


def workload(quick: bool) -> Workload:
    if quick:
        return Workload(single=100, single_client=50, window=400, window_client=300, batch=320,
                        fsync_window=300, fsync_single=50, failover_warmup=0.5, cap=20.0, failover_cap=30.0)
    return Workload(single=2000, single_client=1000, window=20_000, window_client=10_000, batch=20_000,
                    fsync_window=10_000, fsync_single=500, failover_warmup=2.0, cap=40.0, failover_cap=45.0)


def latency_result(lat: list[float], extra: dict | None = None) -> dict:
    lat.sort()
    return {"count": len(lat), "p50_ms": ms(percentile(lat, 0.5)), "p99_ms": ms(percentile(lat, 0.99)),
            **(extra or {})}


def _own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return r.ru_utime + r.ru_stime


class Meter:
    """CPU seconds of each server process (psutil) and of this process
    (getrusage) around one phase, as microseconds per message; RSS of each
    server at the end.  `roles` maps a stable label ("master", "slave1",
    "leader", ...) to a PID, so rounds aggregate by role, not by node."""

    def __init__(self, roles: dict[str, int]) -> None:
        self.procs = {}
        for role, pid in roles.items():
            try:
                self.procs[role] = psutil.Process(pid)
            except psutil.NoSuchProcess:
                pass
        self._t0: dict[str, float] = {}

    @staticmethod
    def _cpu(proc: psutil.Process) -> float | None:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            return None
        return t.user + t.system

    def start(self) -> None:
        self._t0 = {role: self._cpu(p) for role, p in self.procs.items()}
        self._t0["client"] = _own_cpu()

    def stop(self, count: int) -> dict:
        """{"cpu_us": {role: us/msg, ..., "client": us/msg}, "rss_mb": {role: MB}}"""
        cpu, rss = {}, {}
        for role, p in self.procs.items():
            now, before = self._cpu(p), self._t0.get(role)
            if now is not None and before is not None and count:
                cpu[role] = round((now - before) / count * 1e6, 1)
            try:
                rss[role] = round(p.memory_info().rss / 2**20, 1)
            except psutil.Error:
                pass
        if count:
            cpu["client"] = round((_own_cpu() - self._t0["client"]) / count * 1e6, 1)
        return {"cpu_us": cpu, "rss_mb": rss}


def stop_pid(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM one process we started, SIGKILL after `timeout` (by its PID)."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass
