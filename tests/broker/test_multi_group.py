# Two broker groups of three (broker-a, broker-b: two DLedger groups, one
# cluster) behind two name servers, as real processes (tools/brokercluster.py
# MultiGroupCluster), with our client and the stock C++ client
# (rocketmq==0.4.4):
#   * `mqadmin updateTopic -c` creates the topic on both masters; routes list
#     both groups' queues; sends spread over both groups; the consumer group
#     balances over all their queues;
#   * retry, delay and DLQ stay inside the message's group;
#   * kill -9 of broker-a's master under load: broker-b keeps acknowledging
#     sends throughout (the gap between its acknowledgements stays far below
#     a failover), no acknowledged message is lost, the stock producer
#     running through the kill loses nothing it was told was sent;
#   * `mqadmin wipeWritePerm -b broker-b` drains broker-b: producers stop
#     sending there, consumers finish its backlog, consumerProgress shows
#     its diff reach 0; `addWritePerm` opens it again.
# Slow: two real 3-broker groups and two name servers under load, a master
#   kill, the stock C++ client's processes.
import json
import sys

import pytest
import trio

from broker.client import ConsumeFromWhere, ConsumeStatus, Message, SendStatus, open_producer, open_push_consumer
from tests.broker.compat.conftest import stock_client  # noqa: F401 (the fixture: the compat venv)
from tests.broker.compat.stock_client import run_script
from tests.helpers import REPO_ROOT
from tests.helpers.waiting import wait_until
from tools.brokercluster import open_multi_group_cluster
from tools.mqadmin.adminapi import MQAdmin, NotFoundError

pytestmark = pytest.mark.slow

GROUPS = ("broker-a", "broker-b")
CLUSTER = "LedgerCluster"
TOPIC, STOCK_TOPIC, GROUP = "Orders", "StockOrders", "order_consumers"
# Every delay level 1 s: retries and delayed messages come back within the test.
EXTRA = {"messageDelayLevel": " ".join(["1s"] * 18)}


async def mqadmin(ns: str, *args, expect: int = 0) -> str:
    r = await trio.run_process([sys.executable, "-m", "tools.mqadmin", *args, "-n", ns], capture_stdout=True,
                               capture_stderr=True, check=False, cwd=str(REPO_ROOT))
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == expect and "Traceback" not in err, (args, r.returncode, out, err)
    return out


async def create_topic_on_both(ns: str, topic: str, timeout: float = 30.0) -> None:
    """updateTopic -c, retried while a group is between masters (an election
    right after startup under load, or a name server that has not yet seen
    the new master's registration): what an operator does on exit code 3."""
    with trio.fail_after(timeout):
        while True:
            r = await trio.run_process([sys.executable, "-m", "tools.mqadmin", "updateTopic", "-c", CLUSTER, "-t", topic,
                                        "-r", "4", "-w", "4", "-n", ns], capture_stdout=True, capture_stderr=True,
                                       check=False, cwd=str(REPO_ROOT))
            out, err = r.stdout.decode(), r.stderr.decode()
            if r.returncode == 3 and "has no master broker right now" in err:
                await trio.sleep(0.5)
                continue
            assert r.returncode == 0 and "Traceback" not in err, (r.returncode, out, err)
            assert out.count("create topic to") == 2, out  # one per group's master
            return


class Load:
    """`senders` concurrent sync sends until stopped; every SEND_OK kept
    with the time it was acknowledged and the group that stored it."""

    def __init__(self, producer, topic: str, senders: int = 8) -> None:
        self.producer, self.topic, self.senders = producer, topic, senders
        self.acked: list[tuple[float, str, str]] = []   # (time, brokerName, body)
        self.errors = 0
        self.stop = trio.Event()
        self.done = trio.Event()     # stopped, and every send in flight answered
        self.n = 0

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(self.senders):
                nursery.start_soon(self._sender)
        self.done.set()

    async def _sender(self) -> None:
        while not self.stop.is_set():
            body = f"load-{self.n}"
            self.n += 1
            try:
                r = await self.producer.send(Message(self.topic, body.encode()))
            except Exception:
                self.errors += 1
                await trio.sleep(0.05)
                continue
            if r.status is SendStatus.SEND_OK:
                self.acked.append((trio.current_time(), r.queue.broker_name, body))

    def to(self, broker: str, after: float = 0.0) -> list[float]:
        return [t for t, b, _ in self.acked if b == broker and t >= after]


async def diff_by_broker(ns: str) -> dict:
    out = await mqadmin(ns, "consumerProgress", "-g", GROUP, "-t", TOPIC, "--json")
    return json.loads(out)["diffByBroker"]


async def every_c_command_covers_both_groups(ns: str) -> None:
    """The mqadmin commands that take -c reach every group (updateTopic is
    checked by the caller; consumerProgress by the drain below)."""
    brokers = json.loads(await mqadmin(ns, "clusterList", "-c", CLUSTER, "--json"))["brokers"]
    assert sorted(b["brokerName"] for b in brokers if b["role"] == "MASTER") == list(GROUPS)
    assert len(brokers) == 6 and {b["brokerName"] for b in brokers} == set(GROUPS)
    addrs = {b["addr"] for b in brokers}
    assert set(json.loads(await mqadmin(ns, "brokerStatus", "-c", CLUSTER, "--json"))) == addrs
    nodes = json.loads(await mqadmin(ns, "dledgerStatus", "-c", CLUSTER, "--json"))["nodes"]
    assert sorted(n["group"] for n in nodes if n["role"] == "leader") == list(GROUPS) and len(nodes) == 6
    # A hot-reloadable setting changed on all six brokers, then put back.
    updated = json.loads(await mqadmin(ns, "updateBrokerConfig", "-c", CLUSTER, "-k", "maxWaitAckTimeMs",
                                       "-v", "2600", "--json"))
    assert set(updated["updated"]) == addrs and not updated["failed"]
    configs = json.loads(await mqadmin(ns, "getBrokerConfig", "-c", CLUSTER, "--json"))
    assert set(configs) == addrs and {str(c["maxWaitAckTimeMs"]) for c in configs.values()} == {"2600"}, configs
    await mqadmin(ns, "updateBrokerConfig", "-c", CLUSTER, "-k", "maxWaitAckTimeMs", "-v", "2500")
    # Subscription groups are written to both masters.
    out = await mqadmin(ns, "updateSubGroup", "-c", CLUSTER, "-g", "audit_consumers")
    assert out.count("create subscription group to") == 2
    out = await mqadmin(ns, "deleteSubGroup", "-c", CLUSTER, "-g", "audit_consumers")
    assert out.count("delete subscription group [audit_consumers]") == 2
    # A topic deleted with -c goes from both masters and the name servers.
    await mqadmin(ns, "updateTopic", "-c", CLUSTER, "-t", "Scratch", "-r", "2", "-w", "2")
    route = json.loads(await mqadmin(ns, "topicRoute", "-t", "Scratch", "--json"))
    assert sorted(q["brokerName"] for q in route["queueDatas"]) == list(GROUPS)
    deleted = json.loads(await mqadmin(ns, "deleteTopic", "-c", CLUSTER, "-t", "Scratch", "--json"))
    assert len(deleted["brokers"]) == 2
    await mqadmin(ns, "topicRoute", "-t", "Scratch", expect=3)


@pytest.mark.usefixtures("stock_client")
async def test_two_groups_spread_fail_over_and_drain_one(tmp_path):
    async with open_multi_group_cluster(tmp_path, groups=GROUPS, namesrv_count=2, extra_conf=EXTRA,
                                        cluster_name=CLUSTER) as mc:
        await mc.wait_masters()
        ns = mc.namesrv_addr
        for topic in (TOPIC, STOCK_TOPIC):
            await create_topic_on_both(ns, topic)
        admin = MQAdmin(mc.first.remoting, ns)
        route = await admin.route(TOPIC)
        assert sorted((q.broker_name, q.write_queue_nums) for q in route.queue_datas) == [
            ("broker-a", 4), ("broker-b", 4)]
        await every_c_command_covers_both_groups(ns)

        received: dict[str, object] = {}
        stored_in: dict[str, set[str]] = {}     # body -> every group a delivery of it came from
        changed = trio.Event()

        async def handler(msgs):
            nonlocal changed
            status = ConsumeStatus.CONSUME_SUCCESS
            for m in msgs:
                body = m.body.decode()
                stored_in.setdefault(body, set()).add(m.queue.broker_name)
                if body.startswith(("retry-", "dlq-")) and (body.startswith("dlq-") or m.reconsume_times == 0):
                    status = ConsumeStatus.RECONSUME_LATER
                else:
                    received[body] = m
            changed.set()
            changed = trio.Event()
            return status

        async def until(cond, timeout: float, what: str):
            with trio.fail_after(timeout):
                while not cond():
                    await changed.wait()

        async with open_producer("order_producers", namesrv_addr=ns, route_interval=1.0) as producer, \
                open_push_consumer(GROUP, namesrv_addr=ns, subscriptions={TOPIC: "*"}, handler=handler,
                                   consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                                   max_reconsume_times=1, rebalance_interval=2.0) as consumer, \
                trio.open_nursery() as nursery:
            # --- retry, delay and DLQ, one of each per group --------------------------------
            on = {g: (lambda qs, m, g=g: next(q for q in qs if q.broker_name == g)) for g in GROUPS}
            special = {}
            for g in GROUPS:
                for kind, level in (("retry", 0), ("delay", 1), ("dlq", 0)):
                    body = f"{kind}-{g}"
                    r = await producer.send(Message(TOPIC, body.encode(), delay_level=level), selector=on[g])
                    assert r.queue.broker_name == g
                    special[body] = (g, trio.current_time())
            await until(lambda: all(f"{k}-{g}" in received for k in ("retry", "delay") for g in GROUPS), 40,
                        "retried and delayed messages")
            for g in GROUPS:
                retried, delayed = received[f"retry-{g}"], received[f"delay-{g}"]
                assert retried.reconsume_times == 1 and retried.queue.topic == f"%RETRY%{GROUP}"
                assert retried.queue.broker_name == g                 # retried inside its own group
                assert delayed.queue.broker_name == g and delayed.reconsume_times == 0
                assert delayed.store_timestamp - delayed.born_timestamp >= 900
            for g in GROUPS:                                          # the DLQ of each group
                master = (await admin.masters(CLUSTER))[g]
                with trio.fail_after(20):
                    while True:
                        try:
                            _, _, top, records = await admin.pull(master, "tools", f"%DLQ%{GROUP}", 0, 0)
                        except NotFoundError:       # the group's first dead letter creates the DLQ topic
                            records = []
                        if any(r.body == f"dlq-{g}".encode() for r in records):
                            break
                        await trio.sleep(0.3)

            # --- load over both groups, the consumer balancing over all 8 queues -------------
            load = Load(producer, TOPIC)
            nursery.start_soon(load.run)
            await wait_until(lambda: load.to("broker-a") and load.to("broker-b"), 20,
                             "acknowledged sends in both groups")
            with trio.fail_after(20):
                while len([q for q in consumer.assigned_queues() if q.topic == TOPIC]) != 8:
                    await trio.sleep(0.2)

            # --- kill -9 broker-a's master under load; the stock producer runs through it ----
            stock_run = {}

            async def stock_producer():
                stock_run["r"] = await trio.to_thread.run_sync(lambda: run_script(
                    "produce.py", [ns, STOCK_TOPIC, "600", "--group", "stock_producers", "--body-prefix", "cpp-"],
                    timeout=120))
            nursery.start_soon(stock_producer)

            async def stock_is_sending():   # the kill lands in the middle of its 600 sends
                stored = [w["maxOffset"] for addr in (await admin.masters(CLUSTER)).values()
                          for w in (await admin.topic_stats(addr, STOCK_TOPIC)).values()]
                return sum(stored) > 0
            await wait_until(stock_is_sending, 30, "the stock producer's first stored send", interval=0.1)
            a = mc["broker-a"]
            old = await a.wait_master()
            a.kill(old)
            killed_at = trio.current_time()
            await a.wait_master(exclude={old}, timeout=30, settled=False)
            elected_at = trio.current_time()
            with trio.fail_after(30):           # broker-a takes sends again (the client avoided it meanwhile)
                while not load.to("broker-a", after=elected_at):
                    await trio.sleep(0.2)
            b_acks = load.to("broker-b", after=killed_at - 0.5)
            a_acks = load.to("broker-a", after=killed_at - 0.5)
            # broker-a's pause: its longest gap between acknowledgements across the kill (an answer
            # already on its way when the master died may land just after it): election, new
            # route, and the client's avoidance of the failed group.
            failover = max(y - x for x, y in zip(a_acks, a_acks[1:]) if y >= killed_at)
            gaps = [y - x for x, y in zip(b_acks, b_acks[1:]) if y >= killed_at]
            assert b_acks and max(gaps) < 1.0, (failover, max(gaps, default=None))
            print(f"\n[multi-group] broker-a paused {failover:.2f} s (failover); broker-b longest gap between acks "
                  f"{max(gaps) * 1000:.0f} ms, {len(b_acks)} acks meanwhile")
            await a.start_broker(old)

            # --- drain broker-b ---------------------------------------------------------------
            out = await mqadmin(ns, "wipeWritePerm", "-b", "broker-b")
            assert out.count("wipe write perm of broker[broker-b]") == 2
            wiped_at = trio.current_time()

            def only_to_a():  # after the producer's next route poll (1 s): the time it went to broker-a only
                tail = [(t, b) for t, b, _ in load.acked if t >= wiped_at][-200:]
                return len(tail) == 200 and all(b == "broker-a" for _, b in tail) and tail[0][0]
            stopped_at = await wait_until(only_to_a, 20, "the producer sending to broker-a only")
            with trio.fail_after(40):
                while (await diff_by_broker(ns)).get("broker-b") != 0:
                    await trio.sleep(0.5)
            # topicList -c (cluster model) finds the consumer group through both groups' masters.
            rows = json.loads(await mqadmin(ns, "topicList", "-c", "--json"))["topics"]
            assert {(r["cluster"], r["topic"]) for r in rows if GROUP in r["groups"]} == {(CLUSTER, TOPIC)}, rows
            assert not load.to("broker-b", after=stopped_at)   # not one send went back while wiped
            out = await mqadmin(ns, "addWritePerm", "-b", "broker-b")
            assert out.count("add write perm of broker[broker-b]") == 2
            reopened_at = trio.current_time()
            with trio.fail_after(20):
                while not load.to("broker-b", after=reopened_at):
                    await trio.sleep(0.2)
            load.stop.set()
            with trio.fail_after(30):
                await load.done.wait()

            # --- nothing acknowledged is lost -------------------------------------------------
            sent = {body for _, _, body in load.acked}
            await until(lambda: sent <= set(received), 60, "every acknowledged message consumed")
            # ... and each is in the group its answer named.  (A send whose first attempt timed out
            # in the failing group may also be stored there, besides the group that acknowledged
            # its retry: at least once, never lost.)
            misplaced = [(b, body) for _, b, body in load.acked if b not in stored_in[body]]
            assert not misplaced, misplaced[:5]
        stock = stock_run["r"].result
        ok = [s for s in stock["sent"] if s.get("status") == "OK"]
        assert len(ok) >= 500, stock                       # a few may fail during the failover
        run = await trio.to_thread.run_sync(lambda: run_script(
            "push.py", [ns, STOCK_TOPIC, str(len(ok)), "--group", "stock_consumers", "--wait", "60"], timeout=90))
        got = {m["id"] for m in run.result["messages"]}
        assert {s["msg_id"] for s in ok} <= got, run.log_text[-2000:]
        stored = {g: sum(w["maxOffset"] for w in (await admin.topic_stats(addr, STOCK_TOPIC)).values())
                  for g, addr in (await admin.masters(CLUSTER)).items()}
        assert all(stored[g] > 0 for g in GROUPS), stored      # the stock producer spread over both groups
        print(f"[multi-group] python: {len(sent)} acknowledged, {load.errors} failed attempts; "
              f"stock: {len(ok)}/{len(stock['sent'])} OK, all consumed by the stock push consumer")
