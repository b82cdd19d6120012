# POP checkpoints survive a master kill (issue 30): on a real 3-broker group
# (processes), messages are popped with a short invisible time, half of them
# acked, then the master is killed with SIGKILL while the rest are
# invisible.  From the new master: every unacked message comes back (through
# %RETRY%G_T, reconsumeTimes 1), none before its invisible time is over,
# and no acked message is ever handed out again -- up to a marker sent to
# the new master after the failover, and a drain after it.  A follower
# refuses a pop (SERVICE_NOT_AVAILABLE, naming the master).
# Slow: real processes, a kill -9.
import time

import pytest

from broker.client import BrokerError, open_pop_client
from broker.remoting.codes import ResponseCode
from tools.bench.broker import create_topic_request
from tools.brokercluster import open_broker_cluster

pytestmark = pytest.mark.slow

TOPIC, QUEUES, G, N = "PopFailover", 2, "pop_fo_cg", 12
INVISIBLE_MS = 3000


def send(queue_id: int, body: bytes):
    from broker.remoting.codes import RequestCode
    from broker.remoting.command import RemotingCommand
    fields = {"a": "pop_fo_pg", "b": TOPIC, "c": "TBW102", "d": QUEUES, "e": queue_id, "f": 0,
              "g": int(time.time() * 1000), "h": 0, "i": "", "j": 0, "k": False, "m": False}
    return RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, fields, body=body)


async def test_unacked_pops_come_back_from_a_new_master_and_acked_ones_never(tmp_path):
    async with open_broker_cluster(tmp_path) as cluster:
        master = await cluster.wait_master()
        addr = cluster.addr(master)
        resp = await cluster.remoting.invoke(addr, create_topic_request(TOPIC, QUEUES), 10)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        for i in range(N):
            resp = await cluster.remoting.invoke(addr, send(i % QUEUES, b"pf-%02d" % i), 10)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        async with open_pop_client(cluster.namesrv_addr) as pc:
            popped = []
            while len(popped) < N:
                res = await pc.pop(addr, G, TOPIC, max_nums=4, invisible_ms=INVISIBLE_MS, poll_ms=1000)
                popped += res.messages
            assert sorted(m.message.body for m in popped) == [b"pf-%02d" % i for i in range(N)]
            # a follower keeps no checkpoints: it refuses, naming the master
            follower = cluster.addr(next(n for n in cluster.brokers if n != master))
            with pytest.raises(BrokerError) as err:
                await pc.pop(follower, G, TOPIC, invisible_ms=INVISIBLE_MS)
            assert err.value.code == ResponseCode.SERVICE_NOT_AVAILABLE and addr in str(err.value)
            acked, unacked = popped[::2], popped[1::2]
            for m in acked:
                await pc.ack(addr, G, TOPIC, m.receipt)
            deadlines = {m.message.body: int(m.receipt.split(" ")[1]) + int(m.receipt.split(" ")[2])
                         for m in unacked}

            cluster.kill(master)
            new = cluster.addr(await cluster.wait_master(exclude={master}, timeout=30))
            resp = await cluster.remoting.invoke(new, send(0, b"marker"), 10)
            assert resp.code == ResponseCode.SUCCESS, resp.remark

            seen: dict[bytes, list] = {}
            want = set(deadlines) | {b"marker"}
            while not want <= set(seen):
                res = await pc.pop(new, G, TOPIC, max_nums=32, invisible_ms=60000, poll_ms=3000)
                now = int(time.time() * 1000)
                for m in res.messages:
                    seen.setdefault(m.message.body, []).append((now, m.reconsume_times))
                    await pc.ack(new, G, TOPIC, m.receipt)
            drain = await pc.pop(new, G, TOPIC, max_nums=32, invisible_ms=60000, poll_ms=500)
            for m in drain.messages:
                seen.setdefault(m.message.body, []).append((0, m.reconsume_times))

        assert not {m.message.body for m in acked} & set(seen), "an acked message was handed out again"
        for body, deadline in deadlines.items():
            (got_at, times), *more = seen[body]
            assert not more, f"{body} handed out twice by the new master"
            assert got_at >= deadline, f"{body} came back before its invisible time was over"
            assert times == 1
