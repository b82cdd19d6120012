# A follower whose log cannot hold the leader's entries where they say they
# belong (here: its log continues at another origin, as a replica migrated
# with another divided offset would) refuses them without exiting, writing
# or acknowledging anything; the other two go on; once the operator replaced
# the bad store and restarted the node, it catches up byte for byte.
import shutil

import pytest
import trio
import trio.testing

from commitlog.store import SegmentedStore
from tests.commitlog.replicated_helpers import Cluster, assert_identical


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


async def test_follower_refuses_entries_it_cannot_place_then_recovers(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, seed=7)
        bad = c["n2"]
        with SegmentedStore.open(bad.store_config()) as s:  # its log starts 4096 bytes later
            s.reset_to(0, 4096, -1, 0)
        await c.start()
        leader = await c.wait_leader(exclude={"n2"})
        idx = await c.append_many(leader, "a", 30)
        good = [m for m in c.members.values() if m is not bad]
        await c.wait_committed(idx[-1], members=good)
        await c.wait_until(lambda: bad.node.refused is not None)
        refused = bad.node.status()["refusedLeader"]
        assert "pos field 0 is not the entry's position 4096" in refused["reason"], refused
        assert refused["leader"] in ("n0", "n1")
        assert bad.running and bad.store.end_index == -1 and bad.store.end_pos == 4096  # nothing written
        assert bad.node.committed.value == -1
        # The leader never counted it: its match index stays below the log.
        leader = await c.wait_leader(exclude={"n2"})
        assert leader.node.status()["peers"]["n2"]["matchIndex"] < idx[0]
        more = await c.append_many(leader, "b", 10)
        await c.wait_committed(more[-1], members=good)

        await bad.stop()
        shutil.rmtree(bad.store_dir)  # the operator's fix: a fresh store
        await c.start("n2")
        await c.wait_committed(more[-1], members=[bad])
        assert bad.node.refused is None
        leader = await c.wait_leader()
        for m in c.members.values():
            if m is not leader:
                assert_identical(leader.store, m.store)
        nursery.cancel_scope.cancel()
