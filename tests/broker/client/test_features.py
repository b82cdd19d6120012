# The features applications are written against, through the Python client on
# a real 3-broker group, under asyncio AND trio (anyio backends; the harness
# runs in its own thread, cluster_helpers.py): SQL92 selectors (and the
# broker's SUBSCRIPTION_PARSE_FAILED for a bad expression, on pull and on
# CHECK_CLIENT_CONFIG), send_orderly with
# orderly push consumers while consumers join and leave (per-key order, never
# two handlers on one queue at once), transactions (commit delivers, rollback
# never, an unknown state is checked back, a half is invisible until its
# commit, a producer that closes or is killed -9 mid-transaction is checked
# back through another producer of its group), broadcasting (every instance gets
# everything; a restart resumes from its local offsets).  The leader-kill
# versions are in test_features_failover.py.
# Slow: a real 3-broker group (one for the module), every feature on two event
#   loops, transaction checks every 2 s.
import collections
import json
import os
import signal
import sys

import anyio
import pytest

from broker.client import (
    ConsumeFromWhere,
    ConsumeStatus,
    InvalidArgumentError,
    LocalTransactionState,
    Message,
    MessageSelector,
    SendStatus,
    open_producer,
    open_pull_consumer,
    open_push_consumer,
    open_transactional_producer,
)
from broker.client.errors import SubscriptionError
from broker.common.subscription import Subscription
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from tests.broker.client.cluster_helpers import thread_cluster
from tests.broker.client.feature_helpers import order_problems, wait_group_caught_up
from tests.helpers import REPO_ROOT
from tests.helpers.waiting import WaitTimeout, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with thread_cluster(tmp_path_factory.mktemp("features")) as c:
        yield c


def collector(into: list):
    async def handle(msgs):
        into.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS
    return handle


async def test_sql92_selector(cluster, anyio_backend):
    ns, topic = cluster.namesrv_addr, f"Sql_{anyio_backend}"
    got: list = []
    async with open_producer("sql_p", namesrv_addr=ns) as p:
        cases = [("7", "red"), ("3", "red"), ("9", "blue"), (None, "red"), ("11", "red"), ("x", "red")]
        for i, (a, color) in enumerate(cases):
            props = {"color": color, **({"a": a} if a is not None else {})}
            assert (await p.send(Message(topic, f"m{i}".encode(), properties=props))).status is SendStatus.SEND_OK
        async with open_push_consumer(f"sql_g_{anyio_backend}", namesrv_addr=ns, consume_from=FIRST,
                                      subscriptions={topic: MessageSelector.by_sql("a > 5 AND color = 'red'")},
                                      handler=collector(got)):
            await wait_until(lambda: len(got) >= 2, 20, "the matching messages")
            async with open_pull_consumer(f"sql_obs_{anyio_backend}", namesrv_addr=ns) as observer:
                await wait_group_caught_up(observer, f"sql_g_{anyio_backend}", await observer.fetch_queues(topic))
        assert sorted(m.body for m in got) == [b"m0", b"m4"]
        async with open_pull_consumer(f"sql_pull_{anyio_backend}", namesrv_addr=ns) as pc:
            queues = await pc.fetch_queues(topic)
            found = []
            for mq in queues:
                res = await pc.pull(mq, 0, 32, MessageSelector.by_sql("color = 'blue' OR a IS NULL"))
                found += [m.body for m in res.messages]
            assert sorted(found) == [b"m2", b"m3"]
            with pytest.raises(InvalidArgumentError):  # caught before anything is sent
                await pc.pull(queues[0], 0, 32, MessageSelector.by_sql("a >> 5"))
            # what the broker answers a bad expression (sent raw, past the client's check)
            with pytest.raises(SubscriptionError) as info:
                await pc.api.pull(queues[0], 0, Subscription(sub_string="a >> 5", expression_type="SQL92"))
            assert info.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
            # and what a Java consumer asks at start (CHECK_CLIENT_CONFIG), on the master
            for expression, code in (("a > 5", ResponseCode.SUCCESS),
                                     ("a >> 5", ResponseCode.SUBSCRIPTION_PARSE_FAILED)):
                body = {"clientId": "java@1", "group": "sql_java",
                        "subscriptionData": {"topic": topic, "subString": expression, "expressionType": "SQL92"}}
                req = RemotingCommand.create_request(RequestCode.CHECK_CLIENT_CONFIG, {},
                                                     body=json.dumps(body).encode())
                assert (await pc.api.on_master(queues[0], req, ok=None)).code == code


async def test_orderly_consumption_through_a_rebalance(cluster, anyio_backend):
    ns, topic, group = cluster.namesrv_addr, f"Ord_{anyio_backend}", f"ord_g_{anyio_backend}"
    keys, per_phase = [f"k{i}" for i in range(6)], 8
    consumed: dict[str, list[int]] = collections.defaultdict(list)
    active: collections.Counter = collections.Counter()
    overlaps: list = []

    def handler(name):
        async def handle(msgs):
            for m in msgs:
                q = (m.queue.broker_name, m.queue_id)
                active[q] += 1
                if active[q] > 1:
                    overlaps.append((name, q))
                key, seq = m.body.decode().split(":")
                consumed[key].append(int(seq))
                await anyio.sleep(0.005)  # long enough for a second handler on the queue to show
                active[q] -= 1
            return ConsumeStatus.CONSUME_SUCCESS
        return handle

    opts = dict(namesrv_addr=ns, subscriptions={topic: "*"}, orderly=True, consume_from=FIRST,
                lock_retry_interval=0.3, rebalance_interval=60)
    queue_of: dict[str, set] = collections.defaultdict(set)
    async with open_producer("ord_p", namesrv_addr=ns) as p:
        seq = collections.Counter()

        async def phase():
            for _ in range(per_phase):
                for k in keys:
                    r = await p.send_orderly(Message(topic, f"{k}:{seq[k]}".encode()), k)
                    queue_of[k].add(r.queue.queue_id)
                    seq[k] += 1

        def total():
            return sum(len(set(v)) for v in consumed.values())

        await phase()
        async with open_push_consumer(group, handler=handler("c1"), **opts) as c1:
            await wait_until(lambda: total() >= len(keys) * per_phase, 30, "phase 1")
            async with open_push_consumer(group, handler=handler("c2"), **opts) as c2:
                await phase()
                await wait_until(lambda: total() >= 2 * len(keys) * per_phase, 30, "phase 2")
                assert c1.assigned_queues() and c2.assigned_queues()
            await phase()  # c2 left: c1 takes its queues back
            await wait_until(lambda: total() >= 3 * len(keys) * per_phase, 30, "phase 3")
    assert all(len(qs) == 1 for qs in queue_of.values()), queue_of  # one key, one queue
    assert not overlaps, overlaps[:5]
    for k in keys:
        assert consumed[k] == list(range(3 * per_phase)), (k, str(consumed[k]))  # in order, no redelivery


async def test_orderly_failure_retries_in_place_then_dlq(cluster, anyio_backend):
    ns, topic, group = cluster.namesrv_addr, f"OrdFail_{anyio_backend}", f"ordf_g_{anyio_backend}"
    seen: list[tuple[bytes, int]] = []

    async def handle(msgs):
        for m in msgs:
            seen.append((m.body, m.reconsume_times))
            if m.body == b"poison":
                return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    async with open_producer("ordf_p", namesrv_addr=ns) as p:
        for body in (b"before", b"poison", b"after"):
            await p.send_orderly(Message(topic, body), "one-key")
        async with open_push_consumer(group, namesrv_addr=ns, subscriptions={topic: "*"}, handler=handle,
                                      orderly=True, consume_from=FIRST, suspend_time=0.2,
                                      max_reconsume_times=2) as c:
            await wait_until(lambda: (b"after", 0) in seen, 30, "the message after the poison")
            assert c.orderly.dead_lettered == 1
    # tried 1 + 2 times in place, in order: nothing overtook it
    assert seen == [(b"before", 0), (b"poison", 0), (b"poison", 1), (b"poison", 2), (b"after", 0)]
    async with open_pull_consumer(f"ordf_dlq_{anyio_backend}", namesrv_addr=ns) as pc:
        dlq = await pc.fetch_queues(f"%DLQ%{group}")
        res = await pc.pull(dlq[0], 0)
        assert [m.body for m in res.messages] == [b"poison"]


async def test_transactions(cluster, anyio_backend):
    ns, topic, group = cluster.namesrv_addr, f"Tx_{anyio_backend}", f"tx_g_{anyio_backend}"
    got: list = []
    seen_during_execute: list = []
    checked: list = []

    live: dict = {}  # "marker": a plain producer of the topic, while the consumer runs

    async def execute(msg, arg):
        # The half is stored now.  Once the consumer has a plain message sent
        # after it (so it is live on the topic), it must still not see the half.
        body = b"marker-%d" % len(seen_during_execute)
        assert (await live["marker"].send(Message(topic, body))).status is SendStatus.SEND_OK
        await wait_until(lambda: any(m.body == body for m in got), 20, "the marker")
        seen_during_execute.append(any(m.body == msg.body for m in got))
        return arg

    async def check(msg):
        checked.append(msg.body)
        return LocalTransactionState.COMMIT_MESSAGE

    # While it lives, the other producer of the group may be asked about any
    # half of the group (the broker picks one, as RocketMQ does), so it
    # answers alike; once closed or killed it must not be asked any more.
    checked_by_dying: list = []

    async def also_commits(msg):
        checked_by_dying.append(msg.body)
        return LocalTransactionState.COMMIT_MESSAGE

    S = LocalTransactionState
    # The topic exists before the consumer subscribes: a consumer of a topic
    # the name servers do not know yet finds it at its next route poll (30 s,
    # as Java's does), which is not what this test is about.
    async with open_producer(f"tx_first_{anyio_backend}", namesrv_addr=ns) as plain:
        assert (await plain.send(Message(topic, b"first"))).status is SendStatus.SEND_OK
    async with open_push_consumer(f"tx_c_{anyio_backend}", namesrv_addr=ns, subscriptions={topic: "*"},
                                  consume_from=FIRST, handler=collector(got), persist_interval=0.5), \
            open_producer(f"tx_marker_{anyio_backend}", namesrv_addr=ns) as marker, \
            open_transactional_producer(group, namesrv_addr=ns, execute=execute, check=check,
                                        topics=[topic]) as survivor:
        live["marker"] = marker
        for body, state in ((b"commit", S.COMMIT_MESSAGE), (b"rollback", S.ROLLBACK_MESSAGE),
                            (b"unknown", S.UNKNOW)):
            r = await survivor.send_in_transaction(Message(topic, body), state)
            assert r.send_result.status is SendStatus.SEND_OK and r.local_state is state
        async with open_transactional_producer(group, namesrv_addr=ns, execute=execute,
                                               check=also_commits) as dying:
            await dying.send_in_transaction(Message(topic, b"orphan"), S.UNKNOW)
        # `dying` closed mid-transaction: the broker asks `survivor` about the
        # orphan; then a producer process killed -9 right after its half was
        # stored (no unregister: the broker sees its connection drop)
        killed = await anyio.run_process([sys.executable, "-c", KILLED_PRODUCER, ns, group, topic],
                                         check=False, cwd=str(REPO_ROOT))
        assert killed.returncode == -signal.SIGKILL and b"half stored" in killed.stdout, killed.stderr[-2000:]
        want = {b"first", b"commit", b"unknown", b"orphan", b"killed-orphan"}
        try:  # generous: checks come every transactionCheckInterval (2 s), the machine may be loaded
            await wait_until(lambda: want <= {m.body for m in got}, 60, "commits")
        except WaitTimeout as e:
            raise AssertionError(f"delivered {[m.body for m in got]}, checked {checked}") from e
        # The barrier a wrongly committed rollback would have to pass: the
        # check that committed the last half ("killed-orphan") had passed the
        # rollback's half already (halves are checked in order), and the group
        # has now consumed every queue up to its max offset.
        async with open_pull_consumer(f"tx_obs_{anyio_backend}", namesrv_addr=ns) as observer:
            await wait_group_caught_up(observer, f"tx_c_{anyio_backend}", await observer.fetch_queues(topic))
    bodies = [m.body for m in got if not m.body.startswith(b"marker-")]
    assert sorted(bodies) == [b"commit", b"first", b"killed-orphan", b"orphan", b"unknown"]
    assert seen_during_execute == [False] * 4
    assert set(checked) | set(checked_by_dying) == {b"unknown", b"orphan", b"killed-orphan"}
    # the killed producer's half came after `dying` had left: only `survivor` could answer it
    assert b"killed-orphan" in checked and b"killed-orphan" not in checked_by_dying


# A transactional producer process that dies by SIGKILL mid-transaction: its
# half is stored, its local transaction never answers.  (Its check listener
# agrees with the group's others: while it lives it may be asked about them.)
KILLED_PRODUCER = '''
import os, signal, sys
from broker.client import LocalTransactionState, Message
from broker.client.blocking import BlockingTransactionalProducer
ns, group, topic = sys.argv[1:4]
tp = BlockingTransactionalProducer(group, namesrv_addr=ns, execute=lambda m, a: LocalTransactionState.UNKNOW,
                                   check=lambda m: LocalTransactionState.COMMIT_MESSAGE)
tp.__enter__()
r = tp.send_in_transaction(Message(topic, b"killed-orphan"))
print("half stored", r.send_result.status, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
'''


async def test_broadcasting_with_local_offsets(cluster, anyio_backend, tmp_path):
    ns, topic, group = cluster.namesrv_addr, f"Bc_{anyio_backend}", f"bc_g_{anyio_backend}"
    a, b = [], []
    opts = dict(namesrv_addr=ns, subscriptions={topic: "*"}, message_model="BROADCASTING", consume_from=FIRST,
                persist_interval=0.5)
    async with open_producer("bc_p", namesrv_addr=ns) as p:
        await p.send(Message(topic, b"first"))
        async with open_push_consumer(group, handler=collector(a), instance_name="A", offset_store_dir=str(tmp_path),
                                      **opts):
            async with open_push_consumer(group, handler=collector(b), instance_name="B",
                                          offset_store_dir=str(tmp_path), **opts) as cb:
                for i in range(20):
                    await p.send(Message(topic, f"m{i}".encode()))
                await wait_until(lambda: len(a) >= 21 and len(b) >= 21, 30, "everyone has everything")
                path = cb.local_offsets.path
            assert os.path.exists(path) and "B" in path
            for i in range(20, 30):
                await p.send(Message(topic, f"m{i}".encode()))
            b_before = len(b)
            async with open_push_consumer(group, handler=collector(b), instance_name="B",
                                          offset_store_dir=str(tmp_path), **opts):
                # Every message sent while B was away, each in a queue after B's
                # saved offset: a re-read of an older one (pulled in offset
                # order) would have come before them and fails the check below.
                later = {f"m{i}".encode() for i in range(20, 30)}
                await wait_until(lambda: later <= {m.body for m in b[b_before:]} and len(a) >= 31, 30,
                                 "the restart resumes")
    assert sorted(m.body for m in a) == sorted([b"first"] + [f"m{i}".encode() for i in range(30)])
    # B's restart took only what came while it was away
    assert sorted(m.body for m in b[b_before:]) == sorted(f"m{i}".encode() for i in range(20, 30))
    assert len(b) == 31


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_blocking_facade(cluster, backend):
    """Plain functions, no event loop in sight: send_orderly, an orderly
    consumer, a transactional producer whose executor and check listener
    are plain functions (run in worker threads)."""
    import threading
    import time

    from broker.client.blocking import BlockingProducer, BlockingPushConsumer, BlockingTransactionalProducer

    ns, topic = cluster.namesrv_addr, f"Blk_{backend}"
    lock, got = threading.Lock(), []

    def handler(msgs):
        with lock:
            got.extend(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    def execute(msg, arg):
        return LocalTransactionState.UNKNOW if msg.body == b"tx-later" else LocalTransactionState.COMMIT_MESSAGE

    def check(msg):
        return LocalTransactionState.COMMIT_MESSAGE

    with BlockingProducer(f"blk_p_{backend}", namesrv_addr=ns, backend=backend) as p, \
            BlockingTransactionalProducer(f"blk_tx_{backend}", namesrv_addr=ns, execute=execute, check=check,
                                          topics=[topic], backend=backend) as tp:
        for i in range(6):
            assert p.send_orderly(Message(topic, f"o{i}".encode()), "one-key").status is SendStatus.SEND_OK
        assert tp.send_in_transaction(Message(topic, b"tx-now")).local_state is LocalTransactionState.COMMIT_MESSAGE
        assert tp.send_in_transaction(Message(topic, b"tx-later")).local_state is LocalTransactionState.UNKNOW
        with BlockingPushConsumer(f"blk_c_{backend}", namesrv_addr=ns, subscriptions={topic: "*"}, handler=handler,
                                  orderly=True, consume_from=FIRST, backend=backend):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with lock:
                    if {b"tx-now", b"tx-later"} <= set(got) and sum(b.startswith(b"o") for b in got) >= 6:
                        break
                time.sleep(0.05)
    ordered = [b for b in got if b.startswith(b"o")]
    assert ordered == [f"o{i}".encode() for i in range(6)]
    assert {b"tx-now", b"tx-later"} <= set(got)
