# The shell over the real store under a lossy link and under SYNC_FLUSH:
# a follower that loses every third push still ends byte-identical, and an
# acknowledged append is on disk (fdatasync'ed) on the leader and on a quorum
# before append() returns -- and, as a control, not so under ASYNC_FLUSH
# without a flusher, which is what makes the durability check able to fail.
import pytest
import trio
import trio.testing

from tests.commitlog.replicated_helpers import WIRE_PUSH_REQUEST, Cluster, assert_identical, body


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


class LossyPushes:
    """A transport wrapper: every third PushRequest this node sends to the
    victim is lost (sent as far as the node can tell)."""

    victim: str | None = None  # shared by every node's wrapper

    def __init__(self, inner, stats: dict) -> None:
        self.inner = inner
        self.stats = stats

    def send(self, peer_id: str, payload) -> bool:
        head = payload[0] if type(payload) is tuple else payload  # (a push with entries comes in pieces)
        if peer_id == LossyPushes.victim and head[1] == WIRE_PUSH_REQUEST:
            self.stats["pushes"] += 1
            if self.stats["pushes"] % 3 == 0:
                self.stats["dropped"] += 1
                return True
        return self.inner.send(peer_id, payload)

    def __getattr__(self, name):
        return getattr(self.inner, name)


async def test_follower_losing_every_third_push_ends_identical(tmp_path, autojump_clock):
    stats = {"pushes": 0, "dropped": 0}
    LossyPushes.victim = None
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, seed=11, wrap_transport=lambda m, t: LossyPushes(t, stats))
        await c.start()
        leader = await c.wait_leader()
        victim = next(m for m in c.members.values() if m is not leader)
        LossyPushes.victim = victim.node_id
        done = []

        async def client(k):
            done.extend(await c.append_many(leader, f"c{k}", 60, batch=3))

        async with trio.open_nursery() as clients:
            for k in range(6):
                clients.start_soon(client, k)
        assert len(done) == 360
        await c.wait_committed(max(done))
        assert stats["dropped"] >= 5, stats                  # lost pushes were recovered from
        assert_identical(leader.store, victim.store)
        got = {e.index: bytes(e.body) for e in victim.node.read_committed(min(done), 400)}
        assert got[min(done)] == bytes(leader.node.read_committed(min(done), 1)[0].body)
        assert sorted(b for i, b in got.items() if i in set(done)) == sorted(
            body(f"c{k}", i) for k in range(6) for i in range(60))
        nursery.cancel_scope.cancel()


async def _acks_and_flushes(c: Cluster, clients: int, appends: int) -> list[tuple[int, int, int]]:
    """(index, leader's flushed index, replicas flushed past index) at the
    moment each append returned; checks that the ack came after the commit."""
    leader = await c.wait_leader()
    seen = []

    async def client(k):
        for j in range(appends):
            placed = await leader.node.append([body(f"s{k}", j), body(f"s{k}", j + 1000)])
            last = placed[-1][0]
            assert leader.node.committed.value >= last and leader.store.committed_index >= last
            assert sum(m.store.end_index >= last for m in c.members.values()) >= 2
            seen.append((last, leader.store.flushed_index,
                         sum(m.store.flushed_index >= last for m in c.members.values())))

    async with trio.open_nursery() as nursery:
        for k in range(clients):
            nursery.start_soon(client, k)
    return seen


async def test_sync_flush_ack_means_durable_on_leader_and_quorum(tmp_path):
    # Real clock: the fdatasync runs in a worker thread, which MockClock's
    # autojump would race.
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, seed=13, sync_flush=True)
        await c.start()
        leader = await c.wait_leader()
        flushes = leader.store.flush_count
        seen = await _acks_and_flushes(c, clients=8, appends=15)
        assert len(seen) == 120
        for index, leader_flushed, durable_replicas in seen:
            assert leader_flushed >= index
            assert durable_replicas >= 2
        # Group commit: far fewer fdatasyncs than appends, but some.
        assert 0 < leader.store.flush_count - flushes < 120
        nursery.cancel_scope.cancel()


async def test_async_flush_acks_before_fdatasync(tmp_path, autojump_clock):
    # The control: the rig runs no background flusher, so under ASYNC_FLUSH
    # acknowledged entries are (here) never fdatasync'ed.
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, seed=13, sync_flush=False)
        await c.start()
        seen = await _acks_and_flushes(c, clients=4, appends=5)
        assert all(leader_flushed < index for index, leader_flushed, _ in seen)
        nursery.cancel_scope.cancel()


async def test_cancelled_caller_is_forgotten_and_its_entries_still_commit(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, seed=17)
        await c.start()
        leader = await c.wait_leader()
        await c.append_many(leader, "warm", 3)
        for m in c.members.values():
            if m is not leader:
                c.net.isolate(m.node_id)
        with trio.move_on_after(0.05) as scope:
            await leader.node.append([body("gone", 0), body("gone", 1)])
        assert scope.cancelled_caught
        assert leader.node.status()["pendingAppends"] == 0
        written = leader.store.end_index
        assert bytes(leader.store.get(written).body) == body("gone", 1)
        c.net.heal()
        [(index, _)] = await leader.node.append([body("after", 0)])
        assert index == written + 1 and leader.node.status()["pendingAppends"] == 0
        await c.wait_committed(index)
        assert bytes(leader.node.read_committed(written, 1)[0].body) == body("gone", 1)
        nursery.cancel_scope.cancel()
