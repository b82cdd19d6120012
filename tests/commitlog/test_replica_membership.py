# Membership changes through the trio shell over real stores on the memory
# network (MockClock): a fresh node joins as a learner, catches up, is
# promoted and an old voter is removed while appends keep flowing; nothing
# acknowledged is lost, the stores end byte-identical, the configuration is
# in `ledgermq-members` next to each store and survives a restart; the
# shell's refusals.
import os
import time

import pytest
import trio
import trio.testing

from commitlog.errors import NotLeaderError
from commitlog.members import MEMBERS, read_members
from commitlog.raft.membership import ChangeKind, ConfChange, MembershipChangeError
from tests.commitlog.replicated_helpers import Cluster, assert_identical, body


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


def roles(m):
    # (the rig's made-up bootstrap addresses are not host:port, so the file omits them)
    return m.voters, m.learners


class Load:
    """Appends batches of 10 (every 2 ms) until stopped, remembering what was acknowledged."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.acked: dict[int, bytes] = {}
        self.failed = 0
        self.stop = trio.Event()

    async def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            leader = next((m for m in self.cluster.running() if m.node.is_leader), None)
            if leader is None:
                await trio.sleep(0.01)
                continue
            bodies = [body("load", n + i, 200) for i in range(10)]
            n += 10
            try:
                placed = await leader.node.append(bodies)
            except Exception:
                self.failed += 1
                await trio.sleep(0.01)
                continue
            self.acked.update((i, b) for (i, _), b in zip(placed, bodies))
            await trio.sleep(0.002)   # let the MockClock advance (the memory network has no delay)


async def test_replace_a_member_under_load_loses_nothing_and_survives_restart(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, seed=3)
        await c.start()
        load = Load(c)
        nursery.start_soon(load.run)
        await c.wait_committed(100, timeout=30)
        new = c.add_member("n3")
        await c.start("n3")
        leader = await c.wait_leader()
        entry = await leader.node.change_membership(ConfChange(ChangeKind.ADD_LEARNER, "n3", "mem-n3:1"))
        assert entry.membership.learners == ("n3",)
        assert not new.node.core.is_voter
        # Promotion waits until the learner has caught up.
        leader = await c.wait_leader()
        entry = await leader.node.change_membership(ConfChange(ChangeKind.PROMOTE, "n3"), timeout=30)
        assert set(entry.membership.voters) == {"n0", "n1", "n2", "n3"}
        old = c["n0"]
        leader = await c.wait_leader()
        if leader is old:
            await old.node.transfer_leadership("n1")
            leader = await c.wait_leader(exclude=("n0",))
        entry = await leader.node.change_membership(ConfChange(ChangeKind.REMOVE, "n0"))
        assert set(entry.membership.voters) == {"n1", "n2", "n3"}
        await old.stop()
        await trio.sleep(1)
        load.stop.set()
        await trio.sleep(0.5)
        members = [c[i] for i in ("n1", "n2", "n3")]
        leader = await c.wait_leader()
        top = leader.node.committed.value
        await c.wait_committed(top, members)
        for m in members:
            m.node.status()
            assert m.node.core.membership.latest == entry.membership
            history = read_members(m.store_dir)
            assert roles(history[-1].membership) == roles(entry.membership) and history[-1].index == entry.index
        for m in members[1:]:
            await c.wait_until(lambda m=m: m.store.end_index == members[0].store.end_index)
            assert_identical(members[0].store, m.store)
        for index, b in load.acked.items():
            if index >= max(m.store.begin_index for m in members):
                assert bytes(leader.node.read_committed(index, 1)[0].body) == b
        assert len(load.acked) > 300
        # A restart reads the configuration back from ledgermq-members.
        await c["n3"].stop()
        await c.start("n3")
        assert roles(c["n3"].node.core.membership.latest) == roles(entry.membership)
        leader = await c.wait_leader()
        placed = await leader.node.append([b"after"])
        await c.wait_committed(placed[0][0], members)
        nursery.cancel_scope.cancel()


async def test_the_shell_refuses_what_the_core_refuses(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, seed=4)
        await c.start()
        leader = await c.wait_leader()
        follower = next(m for m in c.running() if m is not leader)
        with pytest.raises(NotLeaderError):
            await follower.node.change_membership(ConfChange(ChangeKind.ADD_LEARNER, "n3", "mem-n3:1"))
        with pytest.raises(MembershipChangeError, match="IS_LEADER"):
            await leader.node.change_membership(ConfChange(ChangeKind.REMOVE, leader.node_id))
        with pytest.raises(MembershipChangeError, match="INVALID"):
            await leader.node.change_membership(ConfChange(ChangeKind.PROMOTE, "n7"))
        # A learner that never starts cannot be promoted: refused after the timeout.
        await leader.node.change_membership(ConfChange(ChangeKind.ADD_LEARNER, "n3", "mem-n3:1"))
        with pytest.raises(MembershipChangeError, match="FALL_BEHIND"):
            await leader.node.change_membership(ConfChange(ChangeKind.PROMOTE, "n3"), timeout=2)
        status = leader.node.status()
        assert status["learners"] == ["n3"] and status["configCommitted"]
        assert os.path.exists(os.path.join(leader.store_dir, MEMBERS))
        nursery.cancel_scope.cancel()


async def test_a_node_joining_after_retention_starts_at_the_leaders_begin_with_the_configuration(
        tmp_path, autojump_clock):
    """The log's start was deleted by retention: the joiner is reset to the
    leader's first segment (its files named as the leader's, the boundary
    recorded) and learns the configuration in force there with the reset."""
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, seed=6, store_kw={"file_reserved_hours": 0})
        await c.start()
        leader = await c.wait_leader()
        idx = await c.append_many(leader, "a", 400)              # ~7 segments of 64 KiB
        await c.wait_committed(idx[-1])
        for m in c.running():
            m.store.delete_expired(int((time.time() + 3600) * 1000))
        begin = leader.store.begin_index
        assert begin > 100
        await c.start(c.add_member("n3").node_id)
        entry = await leader.node.change_membership(ConfChange(ChangeKind.ADD_LEARNER, "n3", "mem-n3:1"))
        entry = await leader.node.change_membership(ConfChange(ChangeKind.PROMOTE, "n3"), timeout=30)
        new = c["n3"]
        assert new.store.begin_index == begin
        assert roles(new.node.core.membership.latest) == roles(entry.membership)
        more = await c.append_many(leader, "b", 20)
        await c.wait_committed(more[-1], [new])
        assert_identical(leader.store, new.store)
        nursery.cancel_scope.cancel()
