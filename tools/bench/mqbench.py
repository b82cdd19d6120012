# Owns `mqbench`, the benchmark an operator points at a running cluster, in
# the spirit of RocketMQ's benchmark/producer.sh and consumer.sh and of
# `nats bench`: N concurrent producers (or a push consumer group) through the
# Python client library, a line per second while it runs, and a summary
# (messages/s, MiB/s, send latency percentiles, failures) at the end.
#
#   mqbench producer -n 10.0.0.1:9876 -t BenchmarkTopic -s 1024 -c 16 --seconds 30
#   mqbench consumer -n 10.0.0.1:9876 -t BenchmarkTopic -g bench_consumer --count 100000
#   mqbench producer --count 20000          # no -n: a throwaway local group
#
# Without -n it starts a name server and a 3-broker DLedger group on
# 127.0.0.1 in a temporary folder (tools/brokercluster.py) and removes it at
# the end.  Every run is bounded by --count and --seconds, whichever comes
# first.  Errors (dead name server, unknown topic) end in one line.
import json
import shutil
import sys
import tempfile
import time
from contextlib import asynccontextmanager

import click
import trio

from broker.telemetry.commands import CauseFirstGroup
from broker.telemetry.logs import cli_logging, log_options, version_text

REPORT_EVERY_S = 1.0


def percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


@asynccontextmanager
async def _cluster(namesrv: str | None, topic: str, queues: int):
    """The name server address to use: -n as given, or a local group."""
    if namesrv:
        yield namesrv
        return
    from tools.bench.broker import create_topic_request
    from tools.brokercluster import open_broker_cluster
    root = tempfile.mkdtemp(prefix="mqbench-")
    try:
        click.echo(f"mqbench: no -n: starting a local name server and 3-broker group in {root}", err=True)
        async with open_broker_cluster(root) as cluster:
            master = await cluster.wait_master()
            await cluster.remoting.invoke(cluster.addr(master), create_topic_request(topic, queues), 5.0)
            yield cluster.namesrv_addr
    finally:
        shutil.rmtree(root, ignore_errors=True)


@click.group(cls=CauseFirstGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version_text(), "--version", prog_name="mqbench", message="%(prog)s (ledgermq) %(version)s")
@log_options(default_level="ERROR")
@click.pass_context
def main(ctx, log_level, log_file, log_format):
    """Benchmark a ledgermq (or RocketMQ) cluster with the Python client."""
    ctx.obj = (log_level, log_file, log_format)


def _common(fn):
    fn = click.option("--json", "as_json", is_flag=True, help="print the summary as one JSON document")(fn)
    fn = click.option("--seconds", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
                      help="stop after this long")(fn)
    fn = click.option("--count", type=click.IntRange(min=1), default=None, help="stop after this many messages")(fn)
    fn = click.option("-t", "--topic", default="BenchmarkTest_ledgermq", show_default=True)(fn)
    fn = click.option("-n", "--namesrvAddr", "namesrv", envvar="NAMESRV_ADDR", default=None,
                      help="name server(s) of the cluster to measure (default: $NAMESRV_ADDR, else a local group)")(fn)
    return fn


def _run(coro_fn, *args) -> dict:
    from broker.client import ClientError
    cli_logging(*(click.get_current_context().obj or ("ERROR", None, "text")))
    try:
        return trio.run(coro_fn, *args)
    except ClientError as e:
        raise click.ClickException(str(e)) from None
    except KeyboardInterrupt:
        sys.exit(130)


def _summary(kind: str, result: dict, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result))
        return
    line = (f"{kind}: {result['messages']} messages in {result['seconds']:.1f} s: {result['msgPerSec']:.0f} msg/s, "
            f"{result['mibPerSec']:.2f} MiB/s")
    if kind == "producer":
        line += (f", latency p50 {result['latencyMs']['p50']:.2f} ms p99 {result['latencyMs']['p99']:.2f} ms "
                 f"max {result['latencyMs']['max']:.2f} ms, {result['failed']} failed")
    click.echo(line)


@main.command()
@_common
@click.option("-s", "--size", type=click.IntRange(1, 4 << 20), default=1024, show_default=True,
              help="message body bytes")
@click.option("-c", "--concurrency", type=click.IntRange(1, 4096), default=16, show_default=True,
              help="sends in flight")
@click.option("-q", "--queues", type=click.IntRange(1, 1024), default=8, show_default=True,
              help="queues of the topic on a local group")
def producer(namesrv, topic, count, seconds, as_json, size, concurrency, queues):
    """Send messages of --size bytes with --concurrency sends in flight."""
    result = _run(_produce, namesrv, topic, count, seconds, size, concurrency, queues)
    _summary("producer", result, as_json)
    if result["messages"] == 0:
        raise click.ClickException(f"no message could be sent: {result['lastError']}")


async def _produce(namesrv, topic, count, seconds, size, concurrency, queues) -> dict:
    from broker.client import ClientError, Message, open_producer
    body = b"x" * size
    latencies: list[float] = []
    state = {"sent": 0, "failed": 0, "issued": 0, "error": None}
    first_sent = trio.Event()  # progress lines only once sends get through: a dead cluster's error is the first line
    async with _cluster(namesrv, topic, queues) as ns:
        async with open_producer("mqbench_producer", namesrv_addr=ns) as p:
            start = time.perf_counter()
            deadline = trio.current_time() + seconds

            async def sender():
                while trio.current_time() < deadline and (count is None or state["issued"] < count):
                    state["issued"] += 1
                    t0 = time.perf_counter()
                    try:
                        await p.send(Message(topic, body))
                    except ClientError as e:
                        state["failed"] += 1
                        state["error"] = str(e)
                        if state["sent"] == 0 and state["failed"] >= concurrency:
                            return  # nothing gets through: say why instead of retrying until the deadline
                        continue
                    latencies.append(time.perf_counter() - t0)
                    state["sent"] += 1
                    first_sent.set()

            async def reporter():
                await first_sent.wait()
                last = 0
                while True:
                    await trio.sleep(REPORT_EVERY_S)
                    now = state["sent"]
                    click.echo(f"Send TPS: {now - last:.0f}  Sent: {now}  Failed: {state['failed']}", err=True)
                    last = now

            async with trio.open_nursery() as nursery:
                nursery.start_soon(reporter)
                async with trio.open_nursery() as senders:
                    for _ in range(concurrency):
                        senders.start_soon(sender)
                nursery.cancel_scope.cancel()
            elapsed = time.perf_counter() - start
    n = state["sent"]
    return {"kind": "producer", "topic": topic, "messages": n, "failed": state["failed"], "seconds": elapsed,
            "msgPerSec": n / elapsed if elapsed else 0.0, "mibPerSec": n * size / elapsed / (1 << 20) if elapsed else 0,
            "size": size, "concurrency": concurrency, "lastError": state["error"],
            "latencyMs": {k: percentile(latencies, q) * 1000 for k, q in (("p50", 0.5), ("p99", 0.99))}
            | {"max": max(latencies, default=0.0) * 1000}}


@main.command()
@_common
@click.option("-g", "--group", default="mqbench_consumer", show_default=True, help="consumer group")
def consumer(namesrv, topic, count, seconds, as_json, group):
    """Consume the topic as a push consumer group, from its first offset."""
    result = _run(_consume, namesrv, topic, count, seconds, group)
    _summary("consumer", result, as_json)


async def _consume(namesrv, topic, count, seconds, group) -> dict:
    from broker.client import ConsumeFromWhere, ConsumeStatus, open_push_consumer
    state = {"n": 0, "bytes": 0}
    done = trio.Event()

    async def handle(msgs):
        state["n"] += len(msgs)
        state["bytes"] += sum(len(m.body) for m in msgs)
        if count is not None and state["n"] >= count:
            done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    async with _cluster(namesrv, topic, 8) as ns:
        start = time.perf_counter()
        async with open_push_consumer(group, namesrv_addr=ns, subscriptions={topic: "*"}, handler=handle,
                                      consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET):
            with trio.move_on_after(seconds):
                last = 0
                while not done.is_set():
                    with trio.move_on_after(REPORT_EVERY_S):
                        await done.wait()
                    click.echo(f"Consume TPS: {state['n'] - last:.0f}  Received: {state['n']}", err=True)
                    last = state["n"]
        elapsed = time.perf_counter() - start
    return {"kind": "consumer", "topic": topic, "group": group, "messages": state["n"], "seconds": elapsed,
            "msgPerSec": state["n"] / elapsed if elapsed else 0.0,
            "mibPerSec": state["bytes"] / elapsed / (1 << 20) if elapsed else 0.0}


if __name__ == "__main__":
    main()
