# AppendRequest.on_done (commitlog/appends.py): a request submitted with a
# callback instead of a waiter is handed to it exactly once, by the task
# that resolves it -- on commit with its positions, on a quorum timeout or
# a lost leadership with the error -- and a callback that raises is logged
# and dropped: the driver goes on and later appends still commit.
import trio
import trio.testing

from commitlog.errors import QuorumTimeoutError
from commitlog.transport.memory import MemoryNetwork
from tests.commitlog.test_replica_leader_change import until
from tests.commitlog.test_replica_memory import autojump_clock, start_group  # noqa: F401


async def test_committed_requests_are_handed_to_their_callback_once(autojump_clock):
    net = MemoryNetwork(seed=11)
    async with trio.open_nursery() as nursery:
        members, leader = await start_group(nursery, net)
        seen: list = []
        reqs = []
        for k in range(5):
            req = leader.node.submit([b"a%d" % k, b"b%d" % k])
            req.on_done = lambda r: seen.append((r, r.error, r.result))
            reqs.append(req)
        await until(lambda: len(seen) == 5)
        assert [r for r, _, _ in seen] == reqs  # in log order
        for r, error, result in seen:
            assert error is None and len(result) == 2
            assert r.last_index <= leader.node.committed.value
            assert leader.log.body_at(result[0][0]) == r.bodies[0]
        await leader.node.append([b"more"])
        assert len(seen) == 5  # once each
        nursery.cancel_scope.cancel()


async def test_a_failing_callback_does_not_stop_the_driver(autojump_clock, caplog):
    net = MemoryNetwork(seed=12)
    async with trio.open_nursery() as nursery:
        members, leader = await start_group(nursery, net)

        def explode(r):
            raise RuntimeError("a bug in the caller")
        leader.node.submit([b"x"]).on_done = explode
        placed = await leader.node.append([b"after"])  # the driver went on
        assert leader.log.body_at(placed[0][0]) == b"after"
        assert "completion callback failed" in caplog.text
        nursery.cancel_scope.cancel()


async def test_a_request_that_times_out_is_handed_its_error(autojump_clock):
    net = MemoryNetwork(seed=13)
    async with trio.open_nursery() as nursery:
        members, leader = await start_group(nursery, net, max_wait_ack_ms=2_000)
        await leader.node.append([b"warm-up"])
        for m in members:
            if m is not leader:
                net.isolate(m.node_id)
        got: list = []
        leader.node.submit([b"never"]).on_done = lambda r: got.append(r.error)
        await until(lambda: got)
        assert len(got) == 1 and isinstance(got[0], QuorumTimeoutError)
        nursery.cancel_scope.cancel()


async def test_a_proposal_to_an_idle_driver_is_written_and_pushed_in_submit(autojump_clock):
    net = MemoryNetwork(seed=14)
    async with trio.open_nursery() as nursery:
        members, leader = await start_group(nursery, net)
        await leader.node.append([b"warm-up"])
        assert not leader.log.sync_flush  # the async flush policy: nothing to fsync before sending
        await trio.testing.wait_all_tasks_blocked()  # the driver is parked, nothing queued
        def frames_sent() -> int:
            return sum(p.sent_frames for p in leader.node.transport.stats().peers.values())
        sent_before = frames_sent()
        req = leader.node.submit([b"now"])
        # Written and pushed before submit returned: no task ran in between.
        assert req.first_index > 0 and leader.log.end_index == req.last_index
        assert leader.log.body_at(req.first_index) == b"now"
        assert frames_sent() >= sent_before + 2  # the push to each follower
        await leader.node.wait(req)
        assert req.error is None and leader.node.committed.value >= req.last_index
        nursery.cancel_scope.cancel()


async def test_under_sync_flush_a_proposal_waits_for_the_driver_round(autojump_clock):
    """SYNC_FLUSH: a round's writes are fdatasync'ed before its pushes leave,
    off the event loop, so submit() never runs the round itself."""
    net = MemoryNetwork(seed=15)
    async with trio.open_nursery() as nursery:
        members, leader = await start_group(nursery, net)
        await leader.node.append([b"warm-up"])
        flushes: list = []

        async def flush_async():  # (MemLog has nothing to sync: count the rounds that would)
            flushes.append(leader.log.end_index)
        leader.log.sync_flush, leader.log.flush_async = True, flush_async
        await trio.testing.wait_all_tasks_blocked()
        end = leader.log.end_index
        req = leader.node.submit([b"later"])
        assert leader.log.end_index == end and req.first_index == -1  # queued for the driver
        await leader.node.wait(req)
        assert req.error is None and leader.log.body_at(req.first_index) == b"later"
        assert req.last_index in flushes  # flushed by the driver before its pushes left
        nursery.cancel_scope.cancel()
