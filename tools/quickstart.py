# Owns `make quickstart` (python -m tools.quickstart), the main job: a
# RocketMQ-style broker group failing over without losing a message.  On
# 127.0.0.1 it starts a name server and three `mqbroker` processes forming
# one DLedger group (tools/brokercluster.py), then
#
#   1. waits for the master (the DLedger leader) and creates a topic on it;
#   2. produces 10,000 messages with the Python client (sync sends, several
#      in flight) while a push consumer group consumes them;
#   3. produces a second batch and kill -9s the master in the middle of it;
#      the producer refreshes its route and carries on with the new master,
#      the consumer carries on too;
#   4. restarts the killed broker and waits until it has caught up;
#   5. prints a summary (sent / acknowledged / consumed / duplicates / lost,
#      failover time, each node's role, term and committed index);
#   6. stops the group and verifies every node's store offline (entries,
#      message records, consume queues: `mqadmin verifyStore --cq`).
#
# It exits 0 only when every acknowledged message was consumed (duplicates
# are allowed: at-least-once, and reported) at the queue offset its send
# result named, and verification found nothing.
#
#   python -m tools.quickstart [--dir DIR] [--messages N] [--keep] [--grpc]
import json
import os
import sys
import tempfile
import time
import types

import attrs
import click
import trio
from rich.console import Console
from rich.table import Table

from broker.common.msgid import parse_offset_msg_id
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RemotingError
from commitlog.scan import resolve_store_dir, verify_store
from commitlog.watermark import Watermark
from consumequeue.record import check_entry_body
from tools.brokercluster import LocalBrokerCluster
from tools.cli import CONTEXT, run_command
from tools.mqadmin.cq_cmds import verify_consume_queues

TOPIC = "QuickstartTopic"
QUEUES = 4
PRODUCER_GROUP, CONSUMER_GROUP = "quickstart_pg", "quickstart_cg"
BODY_SIZE = 1024
SENDERS = 32  # sync sends in flight
SEND_DEADLINE = 60.0  # seconds one message may keep being retried across a failover
# Small segments, so that a run spans several commitlog files.
SEGMENTS = {"mappedFileSizeCommitLog": 4 * 1024 * 1024, "mappedFileSizeForEntryIndex": 320 * 1024}
# mqadmin verifyStore's defaults (RocketMQ's): the consume queue file size and index geometry.
CQ_FORMAT = {"cq_file_size": 6_000_000, "index_slots": 5_000_000, "index_items": 20_000_000}

# Wide enough for the tables when the output is a pipe (make, tests), where rich assumes 80.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)


def say(msg: str) -> None:
    console.print(msg, markup=False)


# --- what the demo knows about every message ------------------------------------------------

@attrs.define
class Tally:
    """Each message carries its sequence number in its key ("qs-<seq>").  The
    producers record where SEND_OK said it went, the consumer where it was
    delivered; `confirmed` counts acknowledged messages that were consumed,
    so the demo can park until it reaches len(acked)."""

    attempted: set[int] = attrs.Factory(set)
    acked: dict[int, tuple[int, int]] = attrs.Factory(dict)  # seq -> (queueId, queueOffset)
    send_errors: int = 0  # failed send calls (each retried)
    given_up: int = 0  # messages never acknowledged within SEND_DEADLINE
    consumed: dict[int, set[tuple[int, int]]] = attrs.Factory(dict)  # seq -> positions delivered
    deliveries: int = 0
    confirmed: Watermark = attrs.Factory(lambda: Watermark(0))
    acked_count: Watermark = attrs.Factory(lambda: Watermark(0))
    # failover
    old_master_addr: str | None = None
    killed_at: float | None = None
    first_ack_after_kill: float | None = None

    def on_ack(self, seq: int, position: tuple[int, int], store_addr: str) -> None:
        if seq in self.acked:
            return
        self.acked[seq] = position
        if seq in self.consumed:
            self.confirmed.advance(self.confirmed.value + 1)
        self.acked_count.advance(len(self.acked))
        if self.killed_at is not None and self.first_ack_after_kill is None and store_addr != self.old_master_addr:
            self.first_ack_after_kill = time.perf_counter()

    def on_consume(self, seq: int, position: tuple[int, int]) -> None:
        self.deliveries += 1
        first = seq not in self.consumed
        self.consumed.setdefault(seq, set()).add(position)
        if first and seq in self.acked:
            self.confirmed.advance(self.confirmed.value + 1)

    @property
    def duplicates(self) -> int:
        return self.deliveries - len(self.consumed)

    @property
    def lost(self) -> list[int]:
        return sorted(seq for seq in self.acked if seq not in self.consumed)

    @property
    def misplaced(self) -> list[int]:
        """Acknowledged messages never delivered at the position SEND_OK named."""
        return sorted(seq for seq, pos in self.acked.items() if seq in self.consumed and pos not in self.consumed[seq])


def seq_of(keys) -> int | None:
    for key in keys:
        if key.startswith("qs-") and key[3:].isdigit():
            return int(key[3:])
    return None


# --- producing and consuming ------------------------------------------------------------------

def cpu_by_process(cluster, master: str) -> dict[str, float]:
    """CPU seconds so far: this process (producer and push consumer), the
    master, the slaves and the name servers (Linux /proc)."""
    from tools.bench.broker import cpu_split, own_cpu_seconds
    out = {"client": own_cpu_seconds()}
    for name, proc in cluster.brokers.items():
        split = cpu_split(proc.pid)
        if split is not None:
            out["master" if name == master else f"slave {name}"] = sum(split)
    out["name server"] = sum(sum(split) for p in cluster.namesrvs if (split := cpu_split(p.pid)) is not None)
    return out


def cpu_report(before: dict, after: dict, messages: int, seconds: float) -> str:
    """Where the messages' CPU went: µs per message by process, and how
    busy the machine's cores were (the sends are CPU-bound on a small
    machine: messages/s ~ cores / the sum of these)."""
    per = {k: (after[k] - before[k]) / max(messages, 1) * 1e6 for k in after if k in before}
    total = sum(per.values())
    cores = os.cpu_count() or 1
    busy = total * messages / 1e6 / max(seconds, 1e-9) / cores
    parts = ", ".join(f"{k} {v:,.0f}" for k, v in per.items())
    return (f"CPU per message, µs: {parts}; {total:,.0f} in all, {busy:.0%} of {cores} cores "
            f"while producing and consuming")


async def produce(client, producer, tally: Tally, seqs: range, tag: str) -> None:
    """Sync sends of `seqs` with SENDERS in flight; a failed send is retried
    (same message) until SEND_OK or SEND_DEADLINE."""
    todo = iter(seqs)

    async def send_one(seq: int) -> None:
        tally.attempted.add(seq)
        body = f"quickstart {seq}".encode().ljust(BODY_SIZE, b".")
        msg = client.Message(TOPIC, body, tags=tag, keys=[f"qs-{seq}"])
        deadline = trio.current_time() + SEND_DEADLINE
        while trio.current_time() < deadline:
            try:
                result = await producer.send(msg)
            except client.ClientError:
                tally.send_errors += 1
                continue  # the producer already waited for a new route
            if result.status == client.SendStatus.SEND_OK:
                host, _ = parse_offset_msg_id(result.offset_msg_id)
                tally.on_ack(seq, (result.queue.queue_id, result.queue_offset), str(host))
                return
            tally.send_errors += 1
        tally.given_up += 1

    async def sender() -> None:
        for seq in todo:
            await send_one(seq)

    async with trio.open_nursery() as nursery:
        for _ in range(SENDERS):
            nursery.start_soon(sender)


def consumer_handler(client, tally: Tally):
    async def handle(msgs) -> object:
        for m in msgs:
            seq = seq_of(m.keys)
            if seq is not None:
                tally.on_consume(seq, (m.queue_id, m.queue_offset))
        return client.ConsumeStatus.CONSUME_SUCCESS
    return handle


async def wait_consumed(tally: Tally, timeout: float) -> bool:
    """Park until every acknowledged message was consumed (or timeout)."""
    with trio.move_on_after(timeout):
        await tally.confirmed.wait_for(len(tally.acked))
        return True
    return False


# --- the group ------------------------------------------------------------------------------------

async def runtime_info(cluster: LocalBrokerCluster, node: str) -> dict:
    resp = await cluster.remoting.invoke(cluster.addr(node),
                                         RemotingCommand.create_request(RequestCode.GET_BROKER_RUNTIME_INFO), timeout=3)
    if resp.code != ResponseCode.SUCCESS:
        raise RemotingError(f"{node}: runtime info refused ({resp.code} {resp.remark})")
    return json.loads(resp.body)["table"]


async def node_table(cluster: LocalBrokerCluster) -> dict[str, dict]:
    out = {}
    for node, proc in sorted(cluster.brokers.items()):
        if not proc.alive:
            out[node] = {}
            continue
        try:
            out[node] = await runtime_info(cluster, node)
        except RemotingError:
            out[node] = {}
    return out


async def wait_caught_up(cluster: LocalBrokerCluster, timeout: float) -> dict[str, dict]:
    """Every node alive, registered, with the same committed index and its
    consume queues dispatched up to it.  The nodes expose no event to park
    on from outside, so this asks every 100 ms."""
    with trio.move_on_after(timeout):
        try:
            await cluster.wait_master(timeout=timeout)  # all three registered under distinct ids
        except trio.TooSlowError:
            return await node_table(cluster)
        while True:
            infos = await node_table(cluster)
            committed = {i.get("dledgerCommittedIndex") for i in infos.values()}
            if all(infos.values()) and len(committed) == 1 and all(
                    i.get("dispatchBehindBytes") == "0" for i in infos.values()):
                return infos
            await trio.sleep(0.1)
    return await node_table(cluster)


async def create_topic(cluster: LocalBrokerCluster, master: str) -> str:
    """Create the topic on the master; returns the master that took it.
    An election right after startup (a loaded machine: "term changed
    before the append committed", or a node that just stopped being
    master) is retried on whoever is master then: the request is
    idempotent, and this is what an operator would do."""
    cmd = RemotingCommand.create_request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": TOPIC, "defaultTopic": "TBW102", "readQueueNums": QUEUES, "writeQueueNums": QUEUES,
        "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False})
    with trio.fail_after(60):
        while True:
            try:
                resp = await cluster.remoting.invoke(cluster.addr(master), cmd, timeout=10)
            except RemotingError as e:
                say(f"   creating {TOPIC} on {master} failed ({e}); retrying on the master")
            else:
                if resp.code == ResponseCode.SUCCESS:
                    break
                if resp.code != ResponseCode.SERVICE_NOT_AVAILABLE:
                    raise RuntimeError(f"creating {TOPIC} on {master} failed: {resp.code} {resp.remark}")
                say(f"   {master} did not take the topic ({resp.remark}); retrying on the master")
            await trio.sleep(0.2)
            master = await cluster.wait_master()
    # The master re-registers when its topics change; wait for the route.
    ns = cluster.namesrv_client()
    with trio.fail_after(15):
        while True:
            try:
                if await ns.get_route(TOPIC) is not None:
                    return master
            except RemotingError:
                pass
            await trio.sleep(0.05)


def print_nodes(infos: dict[str, dict], cluster: LocalBrokerCluster) -> None:
    table = Table(title=None, show_edge=False, pad_edge=False)
    for col in ("node", "address", "role", "brokerId", "term", "committed", "ledgerEnd", "pid"):
        table.add_column(col, justify="left" if col in ("node", "address", "role") else "right")
    for node, info in infos.items():
        proc = cluster.brokers[node]
        table.add_row(node, proc.addr or "", info.get("brokerRole", "down"), info.get("brokerId", "-"),
                      info.get("dledgerTerm", "-"), info.get("dledgerCommittedIndex", "-"),
                      info.get("dledgerEndIndex", "-"), str(proc.pid) if proc.alive else "-")
    console.print(table)


def verify_node(root: str, node: str) -> tuple[int, int, list[str]]:
    """(entries, messages, problems) of one node's store, offline."""
    summary = verify_store(resolve_store_dir(os.path.join(root, node), node), check_entry_body)
    span, report = verify_consume_queues(os.path.join(root, node), node, **CQ_FORMAT)
    problems = [f"{p.file} at {p.offset}: {p.reason}" for p in summary.problems] + [str(p) for p in report.problems]
    return summary.entries, report.messages, problems


# --- the run ----------------------------------------------------------------------------------------

async def run(args, client) -> int:
    cluster = LocalBrokerCluster(args.dir, extra_conf=SEGMENTS)
    tally = Tally()
    keep = False
    say(f"ledgermq quickstart: a name server and a 3-broker DLedger group under {args.dir}")
    from broker.remoting.client import open_remoting_client
    async with open_remoting_client() as rc:
        cluster.remoting = rc
        try:
            t0 = time.perf_counter()
            await cluster.start()
            master = await cluster.wait_master()
            namesrv = cluster.namesrv_addr
            say(f"1. name server {namesrv}; {master} ({cluster.addr(master)}) is master "
                f"after {time.perf_counter() - t0:.2f} s")
            master = await create_topic(cluster, master)
            say(f"   created topic {TOPIC} with {QUEUES} queues on the master")
            first, second = range(args.messages), range(args.messages, args.messages + args.second)
            async with client.open_producer(PRODUCER_GROUP, namesrv_addr=namesrv) as producer, \
                    client.open_push_consumer(CONSUMER_GROUP, namesrv_addr=namesrv,
                                              subscriptions={TOPIC: "*"},
                                              handler=consumer_handler(client, tally),
                                              consume_from=client.ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET):
                t1 = time.perf_counter()
                cpu0 = cpu_by_process(cluster, master)
                await produce(client, producer, tally, first, "first")
                sent_s = time.perf_counter() - t1
                consumed_all = await wait_consumed(tally, 60)
                say(f"2. produced {len(tally.acked):,} messages of {BODY_SIZE} bytes in {sent_s:.2f} s "
                    f"({len(tally.acked) / sent_s:,.0f}/s, {SENDERS} sync sends in flight); the push consumer "
                    f"{'has them all' if consumed_all else 'is still missing some'} after "
                    f"{time.perf_counter() - t1:.2f} s")
                say("   " + cpu_report(cpu0, cpu_by_process(cluster, master), len(tally.acked),
                                       time.perf_counter() - t1))

                tally.old_master_addr = cluster.addr(master)
                acked_before = len(tally.acked)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(produce, client, producer, tally, second, "second")
                    await tally.acked_count.wait_for(acked_before + max(1, args.second // 3))
                    pid = cluster.brokers[master].pid
                    cluster.kill(master)
                    tally.killed_at = time.perf_counter()
                    say(f"3. kill -9 {master} (pid {pid}) in the middle of a second batch of {args.second:,} "
                        f"({len(tally.acked) - acked_before:,} acknowledged so far)")
                    await cluster.wait_dead(master)
                    new_master = await cluster.wait_master(exclude={master}, settled=False)
                    say(f"   {new_master} ({cluster.addr(new_master)}) is master after "
                        f"{time.perf_counter() - tally.killed_at:.2f} s")
                failover = (tally.first_ack_after_kill - tally.killed_at) if tally.first_ack_after_kill else None
                say(f"   second batch done: {len(tally.acked) - acked_before:,} acknowledged, first "
                    f"acknowledgement from the new master {failover:.2f} s after the kill" if failover is not None
                    else "   second batch done, but no send was acknowledged by a new master")

                await cluster.start_broker(master)
                infos = await wait_caught_up(cluster, 30)
                say(f"4. restarted {master}: it rejoined as {infos.get(master, {}).get('brokerRole', '?')} "
                    f"and caught up")
                await wait_consumed(tally, 30)
            if args.grpc:  # --grpc: the RocketMQ 5 gRPC proxy beside the group (broker/proxy)
                await trio.to_thread.run_sync(grpc_demo, args.dir, namesrv)
            print_nodes(infos, cluster)

            lost, misplaced = tally.lost, tally.misplaced
            if args.keep:
                keep = True
                print_summary(tally, master, new_master, failover, lost, misplaced, None)
                print_keep(cluster)
                return 0 if not lost and not misplaced else 1
        finally:
            if not keep:
                await cluster.stop_all()
                for proc in [*cluster.brokers.values(), *cluster.namesrvs]:
                    if proc.alive:  # stop_all escalates to SIGKILL; this only covers an interrupted stop
                        proc.process.kill()
    say("5. stopped the group; verifying every node's store offline (verifyStore --cq)")
    verification = {}
    for node in sorted(cluster.brokers):
        entries, messages, problems = verify_node(args.dir, node)
        verification[node] = problems
        say(f"   {node}: {entries:,} entries, {messages:,} messages in consume queues, {len(problems)} problems")
        for p in problems[:5]:
            say(f"     {p}")
    return print_summary(tally, master, new_master, failover, lost, misplaced, verification)


# --- --grpc: mqproxy beside the group, a few messages through gRPC -----------------------------------

def grpc_demo(root: str, namesrv: str, count: int = 5) -> None:
    """Start mqproxy (its own process, RocketMQ's cluster mode), send
    `count` messages with SendMessage and take them back with
    ReceiveMessage + AckMessage (grpcio stubs, as the official clients
    call them), then stop the proxy."""
    import json
    import subprocess

    from broker.proxy import pb
    conf = os.path.join(root, "proxy.conf")
    with open(conf, "w") as f:
        f.write(f"namesrvAddr={namesrv}\ngrpcServerPort=0\nbindAddress=127.0.0.1\n")
    proxy = subprocess.Popen([sys.executable, "-m", "broker.proxy.server", "-c", conf], stdout=subprocess.PIPE,
                             stderr=open(os.path.join(root, "proxy.log"), "w"), text=True)
    try:
        import grpc
        endpoint = json.loads(proxy.stdout.readline())["grpcEndpoint"]
        say(f"   --grpc: mqproxy (pid {proxy.pid}) serves gRPC on {endpoint}")
        stub = pb.service_grpc.MessagingServiceStub(grpc.insecure_channel(endpoint))
        md = [("x-mq-client-id", "quickstart@grpc")]
        for i in range(count):
            req = pb.service.SendMessageRequest()
            m = req.messages.add(body=f"grpc-{i}".encode())
            m.topic.name = TOPIC
            m.system_properties.message_id = f"01QUICKSTART{i:022d}"
            m.system_properties.message_type = pb.MessageType.NORMAL
            r = stub.SendMessage(req, metadata=md, timeout=10)
            say(f"   SendMessage {m.system_properties.message_id}: {pb.Code.Name(r.status.code)}")
        got = 0
        for _ in range(20):
            if got >= count:
                break
            req = pb.service.ReceiveMessageRequest(batch_size=32)
            req.group.name, req.message_queue.topic.name = "quickstart_grpc", TOPIC
            req.invisible_duration.seconds, req.long_polling_timeout.seconds = 30, 2
            for r in stub.ReceiveMessage(req, metadata=md, timeout=10):
                if r.HasField("message") and r.message.body.startswith(b"grpc-"):
                    ack = pb.service.AckMessageRequest()
                    ack.group.name, ack.topic.name = "quickstart_grpc", TOPIC
                    ack.entries.add(message_id=r.message.system_properties.message_id,
                                    receipt_handle=r.message.system_properties.receipt_handle)
                    a = stub.AckMessage(ack, metadata=md, timeout=10)
                    got += 1
                    digest = r.message.system_properties.body_digest.checksum
                    say(f"   ReceiveMessage {r.message.body.decode()} (MD5 {digest[:8]}...), "
                        f"AckMessage: {pb.Code.Name(a.status.code)}")
        say(f"   --grpc: {got} of {count} messages back through gRPC; stopping the proxy")
    finally:
        proxy.terminate()
        proxy.wait(10)


def print_summary(tally: Tally, master, new_master, failover, lost, misplaced, verification) -> int:
    clean = verification is None or not any(verification.values())
    ok = not lost and not misplaced and not tally.given_up and clean
    table = Table(title="summary", show_header=False, show_edge=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    rows = [
        ("messages sent", f"{len(tally.attempted):,}"),
        ("acknowledged (SEND_OK)", f"{len(tally.acked):,}"),
        ("send errors (retried)", f"{tally.send_errors:,}"),
        ("never acknowledged", f"{tally.given_up:,}"),
        ("consumed (distinct)", f"{len(tally.consumed):,}"),
        ("duplicates (redelivered)", f"{tally.duplicates:,}"),
        ("lost (acknowledged, never consumed)", f"{len(lost):,}"),
        ("consumed at another offset than acknowledged", f"{len(misplaced):,}"),
        ("master before / after", f"{master} -> {new_master}"),
        ("failover (kill -9 to first SEND_OK on the new master)",
         f"{failover:.2f} s" if failover is not None else "n/a"),
        ("store verification", "skipped (--keep)" if verification is None else
         ("clean" if clean else f"{sum(len(p) for p in verification.values())} problems")),
    ]
    for what, value in rows:
        table.add_row(what, value)
    console.print(table)
    if lost:
        say(f"lost sequence numbers (first 20): {lost[:20]}")
    say(f"result: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


def print_keep(cluster: LocalBrokerCluster) -> None:
    ns = cluster.namesrv_addr
    say("\nThe group keeps running (--keep).  To reach it:")
    say(f"  export NAMESRV_ADDR={ns}")
    for node, proc in sorted(cluster.brokers.items()):
        say(f"  {node}: broker {proc.addr}, pid {proc.pid}, log {proc.log_path}")
    say("  .venv/bin/mqadmin clusterList")
    say(f"  .venv/bin/mqadmin topicStatus -t {TOPIC}")
    say("  .venv/bin/mqadmin dledgerStatus")
    say("  stop it with: kill " + " ".join(str(p.pid) for p in [*cluster.brokers.values(), *cluster.namesrvs]
                                           if p.alive))


def load_client():
    try:
        import broker.client as client
        client.open_producer, client.open_push_consumer  # noqa: B018 - the API the demo needs
    except (ImportError, AttributeError) as e:
        raise SystemExit(f"quickstart: the Python client library (broker.client) is not available: {e}")
    return client


@click.command(context_settings=CONTEXT)
@click.option("--dir", "store_dir", help="where the brokers keep their stores (default: a new temporary directory)")
@click.option("--messages", type=click.IntRange(1), default=10_000, show_default=True,
              help="messages in the first batch")
@click.option("--second", type=click.IntRange(1), default=5_000, show_default=True,
              help="messages in the batch the master dies in")
@click.option("--keep", is_flag=True, help="leave the group running and print how to reach it")
@click.option("--grpc", is_flag=True, help="also start mqproxy and send/receive a few messages through RocketMQ 5 gRPC")
def command(store_dir: str | None, messages: int, second: int, keep: bool, grpc: bool) -> int:
    """ledgermq quickstart: a name server and a 3-broker group, sends, a
    killed master, failover, and the stores checked."""
    client = load_client()
    args = types.SimpleNamespace(
        dir=os.path.abspath(store_dir or tempfile.mkdtemp(prefix="ledgermq-quickstart-")), messages=messages,
        second=second, keep=keep, grpc=grpc)
    return trio.run(run, args, client)


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.quickstart")


if __name__ == "__main__":
    sys.exit(main())
