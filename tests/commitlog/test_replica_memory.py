# The trio shell (commitlog/replica.py) driving three pure cores over the
# in-memory transport, on trio's MockClock: election, group-committed appends,
# leader loss, and the typed errors of the client-facing append API.
import functools
import random

import pytest
import trio
import trio.testing

from commitlog.errors import NotLeaderError, PendingFullError, QuorumTimeoutError
from commitlog.raft.core import RaftCore
from commitlog.raft.memlog import MemLog
from commitlog.raft.state import HardState, RaftConfig
from commitlog.replica import ReplicaNode
from commitlog.transport.memory import MemoryNetwork

IDS = ("n0", "n1", "n2")


class Member:
    """A node's durable state (log + hard state) that survives restarts."""

    def __init__(self, node_id):
        self.node_id = node_id
        self.log = MemLog()
        self.hard = HardState()
        self.node = None
        self.scope = None


async def run_member(m: Member, net: MemoryNetwork, seed: int, *, task_status=trio.TASK_STATUS_IGNORED,
                     max_pending=10000, max_wait_ack_ms=2500):
    with trio.CancelScope() as scope:
        m.scope = scope
        async with net.open_transport(m.node_id, IDS) as transport:
            core = RaftCore(m.node_id, IDS, m.log, random.Random(seed), RaftConfig(),
                            hard_state=m.hard, committed_index=m.log.committed_index)

            def persist(hs, m=m):
                m.hard = hs

            m.node = ReplicaNode(core=core, log=m.log, transport=transport, persist_hard_state=persist,
                                 peer_addresses={i: f"addr-{i}" for i in IDS},
                                 max_pending=max_pending, max_wait_ack_ms=max_wait_ack_ms)
            async with trio.open_nursery() as nursery:
                await nursery.start(m.node.run)
                task_status.started(m)


async def wait_leader(members, exclude=()):
    while True:
        leaders = [m for m in members if m.node and m.node_id not in exclude and m.node.is_leader
                   and m.scope and not m.scope.cancel_called]
        if leaders:
            return leaders[0]
        await trio.sleep(0.01)


async def start_group(nursery, net: MemoryNetwork, **options) -> tuple[list, Member]:
    """A member per id of IDS running in `nursery` (run_member's `options`),
    and the one they elected."""
    members = [Member(i) for i in IDS]
    for k, m in enumerate(members):
        await nursery.start(functools.partial(run_member, m, net, k, **options))
    return members, await wait_leader(members)


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


async def test_elect_append_and_fail_over(autojump_clock):
    net = MemoryNetwork(seed=1)
    async with trio.open_nursery() as nursery:
        members, leader = await start_group(nursery, net)
        # Concurrent callers are group-committed; each gets its own indexes.
        results = {}

        async def client(k):
            results[k] = await leader.node.append([f"m{k}-{j}".encode() for j in range(3)])

        async with trio.open_nursery() as clients:
            for k in range(20):
                clients.start_soon(client, k)
        indexes = sorted(i for r in results.values() for i, _ in r)
        assert len(indexes) == 60 and len(set(indexes)) == 60
        last = indexes[-1]
        for m in members:
            await m.node.committed.wait_for(last, timeout=5)
            assert m.log.body_at(results[7][1][0]) == b"m7-1"
        # Followers refuse appends and name the leader.
        follower = next(m for m in members if m is not leader)
        with pytest.raises(NotLeaderError) as err:
            await follower.node.append([b"x"])
        assert err.value.leader_id == leader.node_id and err.value.leader_addr == f"addr-{leader.node_id}"

        # Kill the leader: the others elect a new one within a second of
        # (mock) time and keep every committed entry.
        t0 = trio.current_time()
        leader.scope.cancel()
        new = await wait_leader(members, exclude={leader.node_id})
        assert trio.current_time() - t0 < 1.0
        [(idx, _)] = await new.node.append([b"after"])
        assert idx > last
        assert new.log.body_at(results[0][0][0]) == b"m0-0"
        status = new.node.status()
        assert status["role"] == "leader" and status["term"] > leader.hard.term - 1
        nursery.cancel_scope.cancel()


async def test_quorum_timeout_then_pending_full(autojump_clock):
    net = MemoryNetwork(seed=2)
    async with trio.open_nursery() as nursery:
        members, leader = await start_group(nursery, net, max_pending=5, max_wait_ack_ms=300)
        await leader.node.append([b"warm-up"])
        for m in members:
            if m is not leader:
                net.isolate(m.node_id)
        with pytest.raises(QuorumTimeoutError):
            await leader.node.append([b"lost-1", b"lost-2"])
        # Entries waiting for their quorum count against max_pending (5): a
        # client that keeps pushing into a stalled group hits backpressure
        # instead of growing memory without bound.
        blocked = []

        async def stuck():
            try:
                await leader.node.append([b"a", b"b", b"c"])
            except QuorumTimeoutError:
                blocked.append(True)

        async with trio.open_nursery() as inner:
            inner.start_soon(stuck)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(PendingFullError):
                await leader.node.append([b"d", b"e", b"f"])
        assert blocked == [True]
        nursery.cancel_scope.cancel()


async def test_a_full_inbox_holds_the_readers_until_the_driver_takes_it(autojump_clock):
    """The transport's sink (the node's PeerInbox.deliver) answers with an
    Event once max_messages wait for the driver; the driver's next round
    takes them all and sets it (the TCP reader waits on it: test_tcp)."""
    net = MemoryNetwork(seed=2)
    async with trio.open_nursery() as nursery:
        members, leader = await start_group(nursery, net)
        follower = next(m for m in members if m is not leader).node
        captured = []
        deliver = follower.inbox.deliver

        def spy(src, payload):
            captured.append((src, payload))
            return deliver(src, payload)
        follower.transport.set_sink(spy)
        await leader.node.append([b"x"])
        assert captured  # the leader's appends and heartbeats reached the follower through the sink
        follower.inbox.max_messages = len(follower.inbox) + 3
        # A round is due (the driver is busy): deliveries queue for it instead
        # of being stepped in the reader's step (ReplicaNode._peer_spoke).
        follower._wake()
        src, payload = captured[-1]  # replayed: Raft takes a duplicate in its stride
        assert deliver(src, payload) is None and deliver(src, payload) is None
        room = deliver(src, payload)
        assert isinstance(room, trio.Event) and not room.is_set()
        assert deliver(src, payload) is room  # one Event for every reader that finds it full
        with trio.fail_after(1):
            await room.wait()
        assert len(follower.inbox) < follower.inbox.max_messages
        [(idx, _)] = await leader.node.append([b"y"])  # and the group carries on
        await follower.committed.wait_for(idx, timeout=5)
        nursery.cancel_scope.cancel()


async def test_a_stalled_ticker_drops_the_ticks_it_missed(autojump_clock):
    """A ticker that wakes STALL_TICKS or more late (the process was
    stopped) counts one tick, not the ones it missed (those would time the
    followers out before the heartbeats that came meanwhile are read);
    lateness below that is caught up."""
    from commitlog.replica import STALL_TICKS
    net = MemoryNetwork(seed=3)
    async with trio.open_nursery() as nursery:
        members, leader = await start_group(nursery, net)
        node = leader.node
        assert node.stats["ticks_dropped"] == 0
        autojump_clock.jump((STALL_TICKS - 2) * node.tick_seconds)  # a busy loop: caught up
        await trio.sleep(0.5)
        assert node.stats["ticks_dropped"] == 0
        autojump_clock.jump(2.0)  # 200 ticks missed
        await trio.sleep(0.5)
        assert 190 <= node.stats["ticks_dropped"] <= 200
        assert all(m.node.stats["ticks_dropped"] >= 190 for m in members)
        assert leader.node.is_leader
        nursery.cancel_scope.cancel()
