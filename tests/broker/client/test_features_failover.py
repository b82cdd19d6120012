# Orderly consumption, transactions, broadcasting and SQL92 selectors across
# a kill -9 of the master, under asyncio and trio, on a real 3-broker group:
# per-key order holds and no two handlers ever share a queue (the queue
# locks are replicated, so the new master keeps the old owner's locks),
# every message arrives; transactions left open when the master dies are
# checked back by the new master (the check progress and the halves are in
# the log) and delivered only after their commit, a rolled-back one never;
# two broadcasting consumers with a SQL92 selector each get every matching
# message from before and after the kill, and nothing else.
# Slow: a real 3-broker group per test, a kill -9 of its master, transaction
#   checks on the new master.
import collections

import anyio
import pytest

from broker.client import (
    ConsumeFromWhere,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    MessageSelector,
    open_producer,
    open_pull_consumer,
    open_push_consumer,
    open_transactional_producer,
)
from tests.broker.client.cluster_helpers import thread_cluster
from tests.broker.client.feature_helpers import order_problems, wait_group_caught_up
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
S = LocalTransactionState


@pytest.fixture
def cluster(tmp_path):
    # Started outside the test's event loop (a sync fixture): the harness's
    # own loop runs in its thread.
    with thread_cluster(tmp_path) as c:
        yield c


async def test_features_across_a_leader_kill(cluster, anyio_backend, tmp_path):
    ns = cluster.namesrv_addr
    keys, per_phase = [f"k{i}" for i in range(5)], 10
    consumed: dict[str, list[int]] = collections.defaultdict(list)
    active: collections.Counter = collections.Counter()
    overlaps: list = []
    tx_got: dict[bytes, float] = {}
    answered: dict[bytes, float] = {}

    async def ordered(msgs):
        for m in msgs:
            q = m.queue_id
            active[q] += 1
            if active[q] > 1:
                overlaps.append(q)
            key, seq = m.body.decode().split(":")
            consumed[key].append(int(seq))
            await anyio.sleep(0.002)
            active[q] -= 1
        return ConsumeStatus.CONSUME_SUCCESS

    async def tx_handler(msgs):
        for m in msgs:
            tx_got.setdefault(m.body, anyio.current_time())
        return ConsumeStatus.CONSUME_SUCCESS

    evens: dict[str, list[bytes]] = {"A": [], "B": []}

    def broadcast(name):
        async def handle(msgs):
            evens[name].extend(m.body for m in msgs)
            return ConsumeStatus.CONSUME_SUCCESS
        return handle

    async def execute(msg, state):
        return state

    async def check(msg):
        answered.setdefault(msg.body, anyio.current_time())
        return S.ROLLBACK_MESSAGE if msg.body.startswith(b"rb") else S.COMMIT_MESSAGE

    async with open_producer("fo_p", namesrv_addr=ns) as p, \
            open_transactional_producer("fo_tx", namesrv_addr=ns, execute=execute, check=check,
                                        topics=["FoTx"], heartbeat_interval=1.0) as txp:
        seq = collections.Counter()

        async def phase():
            for _ in range(per_phase):
                for k in keys:
                    await p.send_orderly(Message("FoOrd", f"{k}:{seq[k]}".encode()), k)
                    seq[k] += 1
                n = seq["sql"]
                seq["sql"] += 1
                await p.send(Message("FoSql", f"s{n}".encode(), properties={"parity": "odd" if n % 2 else "even"}))

        await phase()
        await txp.send_in_transaction(Message("FoTx", b"committed"), S.COMMIT_MESSAGE)
        async with open_push_consumer("fo_ord", namesrv_addr=ns, subscriptions={"FoOrd": "*"}, handler=ordered,
                                      orderly=True, consume_from=FIRST, lock_retry_interval=0.3), \
                open_push_consumer("fo_txc", namesrv_addr=ns, subscriptions={"FoTx": "*"}, handler=tx_handler,
                                   consume_from=FIRST, persist_interval=0.5), \
                open_push_consumer("fo_bc", namesrv_addr=ns, handler=broadcast("A"), consume_from=FIRST,
                                   subscriptions={"FoSql": MessageSelector.by_sql("parity = 'even'")},
                                   message_model="BROADCASTING", instance_name="A",
                                   offset_store_dir=str(tmp_path / "offsets")), \
                open_push_consumer("fo_bc", namesrv_addr=ns, handler=broadcast("B"), consume_from=FIRST,
                                   subscriptions={"FoSql": MessageSelector.by_sql("parity = 'even'")},
                                   message_model="BROADCASTING", instance_name="B",
                                   offset_store_dir=str(tmp_path / "offsets")):
            await wait_until(lambda: sum(len(v) for v in consumed.values()) >= len(keys) * per_phase, 30,
                             "phase 1")
            # open transactions, then the master dies before it may check them (timeout 1.5 s)
            for body in (b"open-1", b"open-2", b"rb-open"):
                await txp.send_in_transaction(Message("FoTx", body), S.UNKNOW)
            master = await cluster.wait_master()
            cluster.kill(master)
            await phase()  # sends ride through the failover
            await cluster.wait_master(exclude={master})
            await phase()
            await wait_until(lambda: all(len(set(consumed[k])) >= 3 * per_phase for k in keys), 60,
                             "every ordered message")
            await wait_until(lambda: {b"committed", b"open-1", b"open-2"} <= set(tx_got), 60,
                             "the open transactions, checked back by the new master")
            want = {f"s{n}".encode() for n in range(0, seq["sql"], 2)}
            await wait_until(lambda: all(want <= set(v) for v in evens.values()), 60, "every even one, twice")
            # The barriers a late wrong delivery would have to pass first: an
            # even marker at the end of every FoSql queue (an odd message let
            # through, pulled in offset order, comes before it), and the
            # rolled-back half checked by the new master, then fo_txc caught
            # up with every FoTx queue.
            markers = {f"end-{i}".encode() for i in range(16)}
            for body in sorted(markers):
                await p.send(Message("FoSql", body, properties={"parity": "even"}),
                             selector=lambda qs, m: qs[int(m.body[4:]) % len(qs)])
            await wait_until(lambda: all(markers <= set(v) for v in evens.values()), 30, "the end markers")
            await wait_until(lambda: b"rb-open" in answered, 30, "the rolled-back half's check")
            async with open_pull_consumer("fo_obs", namesrv_addr=ns) as observer:
                await wait_group_caught_up(observer, "fo_txc", await observer.fetch_queues("FoTx"))
    assert not overlaps, overlaps[:5]
    for k in keys:
        assert not order_problems(consumed[k], 3 * per_phase), (k, str(consumed[k]))
    assert set(tx_got) == {b"committed", b"open-1", b"open-2"}  # rb-open never
    for body in (b"open-1", b"open-2"):
        assert tx_got[body] >= answered[body]  # invisible until the check's commit
    for name, got in evens.items():
        got = set(got) - markers
        assert got == want, (name, sorted(got ^ want))  # every even one, no odd one
