# Orderly consumption's queue locks (broker/processors/locks.py) on a 3-node
# in-memory group (MockClock): a queue goes to one client at a time, renewals
# keep it, unlock frees it, an unrenewed lock expires after
# rebalanceLockMaxLiveTime -- and the table is replicated: after the master
# stops, the new master refuses the queue to a second client until the
# first one's lock expires (and renews it for the first), with no pause.
# Followers refuse; the table survives a snapshot.
import trio
import trio.testing

from broker.config import LiveConfig
from broker.metadata import snapshot
from broker.processors.locks import QueueLockProcessor
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.header import decode_json, encode_json
from tests.broker.store.test_gate import Group

T = "OrderT"


def lock_req(client: str, *queues: int, code=RequestCode.LOCK_BATCH_MQ) -> RemotingCommand:
    body = {"consumerGroup": "og", "clientId": client,
            "mqSet": [{"topic": T, "brokerName": "b", "queueId": q} for q in queues]}
    return RemotingCommand.create_request(code, body=encode_json(body))


async def locked(p: QueueLockProcessor, client: str, *queues: int) -> list[int]:
    resp = await p(None, lock_req(client, *queues))
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return sorted(m["queueId"] for m in decode_json(resp.body, "x")["lockOKMQSet"])


async def test_locks_are_exclusive_expire_and_survive_failover(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery, rebalanceLockMaxLiveTime="60000")
        await g.start()
        # Lock records are stamped by a clock this test moves by hand: lock
        # decisions use only those stamps, and the virtual Raft clock races
        # ahead whenever the loop waits for a worker thread (autojump counts
        # that as idle), e.g. 150 virtual seconds in write_snapshot.
        now = [1_000]
        for m in g.alive():
            m.bs.metadata.clock_ms = lambda: now[0]
        leader = await g.wait_leader()
        p = QueueLockProcessor(LiveConfig(leader.cfg), leader.bs.metadata)
        assert await locked(p, "A", 0, 1) == [0, 1]
        assert await locked(p, "B", 1, 2) == [2]  # 1 is A's
        assert await locked(p, "A", 0, 1) == [0, 1]  # a renewal
        resp = await p(None, lock_req("A", 0, code=RequestCode.UNLOCK_BATCH_MQ))
        assert resp.code == ResponseCode.SUCCESS
        assert await locked(p, "B", 0) == [0]
        follower = next(m for m in g.alive() if m is not leader)
        refused = await QueueLockProcessor(LiveConfig(follower.cfg), follower.bs.metadata)(None, lock_req("C", 3))
        assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE

        await g.settle()
        await leader.bs.metadata.write_snapshot()
        loaded = snapshot.load_snapshot(leader.cfg.store_path_root_dir).state.locks
        assert loaded == leader.bs.metadata.state.locks and len(loaded.locks) == 3

        old = leader
        await old.stop()
        leader = await g.wait_leader(exclude=(old.nid,))
        p = QueueLockProcessor(LiveConfig(leader.cfg), leader.bs.metadata)
        assert await locked(p, "B", 1) == []  # still A's on the new master
        now[0] += 30_000
        assert await locked(p, "A", 1) == [1]  # A renews on the new master
        now[0] += 45_000
        assert await locked(p, "B", 1) == []  # renewed 45 s ago: still A's
        now[0] += 20_000
        assert await locked(p, "B", 1) == [1]  # A stopped renewing 65 s ago: expired
        nursery.cancel_scope.cancel()
