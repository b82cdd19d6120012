# The trio shell (commitlog/replica.py) over the real segmented store: three
# nodes in one process on a MemoryNetwork under trio's MockClock, each node
# on its own files in tmp_path.  Restart from disk, retention reset of a
# lagging follower, a divergent uncommitted tail, check-quorum step-down --
# every scenario ends with replicas compared byte for byte.
import time

import pytest
import trio
import trio.testing

from commitlog import metafiles
from commitlog.errors import NotLeaderError, QuorumTimeoutError
from commitlog.raft.state import Role
from tests.commitlog.replicated_helpers import Cluster, assert_identical, body, data_files


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


async def test_follower_restart_from_disk_keeps_leader_and_term(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, seed=3)
        await c.start()
        leader = await c.wait_leader()
        term = leader.node.core.term
        idx = await c.append_many(leader, "a", 150)          # ~2.5 data segments
        await c.wait_committed(idx[-1])
        f = next(m for m in c.members.values() if m is not leader)
        before = (f.store.begin_index, f.store.end_index, f.store.committed_index, (term, leader.node_id))
        assert f.currterm() == (term, leader.node_id)        # voted for the leader, on disk
        await f.stop()
        assert metafiles.read_checkpoint(f.store_dir) == (before[1], before[2])

        more = await c.append_many(leader, "b", 100)         # the group goes on without it
        await c.start(f.node_id)
        # Recovery restored the log, the committed index (checkpoint) and the
        # term and vote (currterm) before the node saw any message.
        assert f.recovered == before
        await c.wait_committed(more[-1])
        assert leader.node.is_leader and f.node.core.leader_id == leader.node_id
        for m in c.members.values():
            assert m.node.core.term == term and m.currterm()[0] == term
        assert f.node.read_committed(more[-1], 1)[0].body == body("b", 99)
        for m in c.members.values():
            if m is not leader:
                assert_identical(leader.store, m.store)
        nursery.cancel_scope.cancel()


async def test_isolated_follower_is_reset_to_leaders_begin_after_retention(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        # fileReservedHours 0: every committed segment but the last is expired.
        c = Cluster(tmp_path, nursery, seed=5, store_kw={"file_reserved_hours": 0})
        await c.start()
        leader = await c.wait_leader()
        first = await c.append_many(leader, "a", 20)
        await c.wait_committed(first[-1])
        lagger = next(m for m in c.members.values() if m is not leader)
        other = next(m for m in c.members.values() if m not in (leader, lagger))
        lagger_end = lagger.store.end_index
        c.net.isolate(lagger.node_id)
        idx = await c.append_many(leader, "b", 400)          # ~7 segments
        await c.wait_committed(idx[-1], [leader, other])
        deleted = leader.store.delete_expired(int((time.time() + 3600) * 1000))
        assert len([p for p in deleted if "/data/" in p]) >= 5
        begin = leader.store.begin_index
        assert begin > lagger_end + 1                        # what the lagger needs next is gone

        resets = []
        lagger.node.on_log_reset = lambda: resets.append(lagger.store.begin_index)
        c.net.heal()
        more = await c.append_many(leader, "c", 30)
        await c.wait_committed(more[-1])
        assert resets == [begin]  # derived state (consume queues) was told at once
        # The follower restarted its log at the leader's begin (Ready.reset_to
        # -> store.reset_to: old files gone, boundary recorded) and caught up.
        assert lagger.store.begin_index == begin
        assert metafiles.read_base(lagger.store_dir).index == begin
        assert sorted(data_files(lagger.store)) == sorted(data_files(leader.store))
        assert_identical(leader.store, lagger.store)
        assert lagger.node.read_committed(begin, 1)[0].index == begin
        assert lagger.store.chain_crc_at(begin - 1) == leader.store.chain_crc_at(begin - 1)

        # A reset follower restarts from its (boundary-recorded) files too.
        await lagger.stop()
        await c.start(lagger.node_id)
        assert lagger.recovered[:2] == (begin, more[-1])
        tail = await c.append_many(leader, "d", 5)
        await c.wait_committed(tail[-1])
        assert_identical(leader.store, lagger.store)
        nursery.cancel_scope.cancel()


async def test_divergent_uncommitted_tail_is_truncated_after_heal(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, seed=7)
        await c.start()
        old = await c.wait_leader()
        old_term = old.node.core.term
        idx = await c.append_many(old, "a", 100)
        await c.wait_committed(idx[-1])
        others = [m.node_id for m in c.members.values() if m is not old]
        c.net.partition([old.node_id], others)

        outcome = []

        async def doomed_append():
            try:
                await old.node.append([body("lost", i) for i in range(40)])
            except QuorumTimeoutError as exc:
                outcome.append(exc)

        nursery.start_soon(doomed_append)
        await c.wait_until(lambda: old.store.end_index == idx[-1] + 40)   # written, never acknowledged
        lost_range = range(idx[-1] + 1, idx[-1] + 41)
        new = await c.wait_leader(exclude={old.node_id})
        assert new.node.core.term > old_term
        kept = await c.append_many(new, "n", 120)
        await c.wait_committed(kept[-1], [c[o] for o in others])
        # Check-quorum: the isolated leader stepped down, keeping its term.
        await c.wait_until(lambda: old.node.core.role is not Role.LEADER)
        assert old.node.core.term == old_term and old.currterm()[0] == old_term
        await c.wait_until(lambda: outcome)                  # maxWaitAckTimeMs
        assert isinstance(outcome[0], QuorumTimeoutError)
        assert old.store.committed_index == idx[-1]

        c.net.heal()
        await c.wait_committed(kept[-1])
        commit = new.node.committed.value
        await old.node.committed.wait_for(commit, timeout=5)
        assert old.store.chain_crc_at(commit) == new.store.chain_crc_at(commit)
        assert_identical(new.store, old.store)
        for i in lost_range:
            assert old.store.term_at(i) == new.node.core.term
            assert not bytes(old.store.get(i).body).startswith(b"lost-")
        nursery.cancel_scope.cancel()


async def test_leader_without_followers_steps_down_keeping_its_term(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, seed=9)
        await c.start()
        leader = await c.wait_leader()
        idx = await c.append_many(leader, "a", 30)
        await c.wait_committed(idx[-1])
        term = leader.node.core.term
        assert leader.currterm() == (term, leader.node_id)
        followers = [m for m in c.members.values() if m is not leader]
        for f in followers:
            await f.stop()
        t0 = trio.current_time()
        await c.wait_until(lambda: not leader.node.is_leader)
        # Check-quorum fires after one minimum election timeout (300 ms).
        assert trio.current_time() - t0 < 1.0
        assert leader.node.core.term == term and leader.currterm()[0] == term
        with pytest.raises(NotLeaderError):
            await leader.node.append([b"x"])
        # Alone, it keeps timing out, but pre-vote never bumps its term.
        await trio.sleep(5)
        assert leader.node.core.role is not Role.LEADER
        assert leader.node.core.term == term and leader.currterm()[0] == term

        # The followers come back from disk; a new term is elected and the
        # log (including the step-down leader's) continues intact.
        for f in followers:
            await c.start(f.node_id)
        new = await c.wait_leader()
        assert new.node.core.term > term
        more = await c.append_many(new, "b", 20)
        await c.wait_committed(more[-1])
        for m in c.members.values():
            assert m.node.read_committed(idx[0], 1)[0].body == body("a", 0)
            if m is not new:
                assert_identical(new.store, m.store)
        nursery.cancel_scope.cancel()


def test_read_batch_reuse_never_serves_replaced_entries(tmp_path):
    # The leader reads each range once per follower; the store hands the
    # second reader the same batch -- but never across a truncation (a
    # follower whose tail was replaced up to the same end index) or a reset.
    from commitlog.store import SegmentedStore, StoreConfig

    with SegmentedStore.open(StoreConfig(root=str(tmp_path), data_segment_size=64 * 1024,
                                         index_segment_size=4096)) as store:
        store.append_leader([body("a", i) for i in range(20)], 1)
        first = store.read_batch(5, 1 << 20, 10)
        assert store.read_batch(5, 1 << 20, 10) is first
        assert store.read_batch(5, 1 << 20, 9) is not first
        store.truncate_from(10)
        store.append_leader([body("b", i) for i in range(10)], 2)  # same end index again
        again = store.read_batch(5, 1 << 20, 10)
        assert again.raw != first.raw and again.last_term == 2
        store.reset_to(100, 64 * 1024, 2, 0)
        store.append_leader([body("c", i) for i in range(20)], 3)
        assert store.read_batch(105, 1 << 20, 10).last_term == 3


@pytest.mark.parametrize("how", ["space_check", "enospc"])
async def test_follower_out_of_space_acknowledges_nothing_and_catches_up(tmp_path, autojump_clock, how,
                                                                         monkeypatch):
    """A follower whose writes find no space (the broker's disk reserve, or a
    real ENOSPC from the store) stays up, writes and acknowledges nothing, and
    replicates again once there is room (issue 14: a follower's full disk
    ended the process)."""
    import errno

    from commitlog.errors import DiskFullError

    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, seed=5)
        await c.start()
        leader = await c.wait_leader()
        f, other = [m for m in c.members.values() if m is not leader]
        first = await c.append_many(leader, "a", 20)
        await c.wait_committed(first[-1])
        full = True
        if how == "space_check":
            def no_room():
                if full:
                    raise DiskFullError(f.store_dir, 1.0)
            f.node.space_check = no_room
        else:
            from commitlog.segments import Segment
            real_write = Segment.write

            def enospc(seg, *args, **kw):
                if full and seg.path.startswith(f.store_dir):
                    raise OSError(errno.ENOSPC, "No space left on device")
                return real_write(seg, *args, **kw)
            monkeypatch.setattr(Segment, "write", enospc)
        end_before = f.store.end_index
        more = await c.append_many(leader, "b", 30)       # committed by leader + other
        await c.wait_committed(more[-1], members=[leader, other])
        assert f.store.end_index == end_before and f.node.stats["out_of_space"] > 0
        assert f.node.out_of_space is not None and f.running
        full = False
        await c.wait_committed(more[-1], members=[f])
        assert f.node.out_of_space is None
        assert_identical(leader.store, f.store)
        nursery.cancel_scope.cancel()


async def test_quorum_contact_is_real_time_evidence_of_leadership(tmp_path, autojump_clock):
    """has_quorum_contact: the leader heard from a quorum within the window;
    a leader cut off from its followers loses it within that window, in real
    time, whatever its ticks say (issue 14: a leader continued after SIGSTOP
    moved consumers' offsets before its check-quorum ran)."""
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, seed=7)
        await c.start()
        leader = await c.wait_leader()
        await trio.sleep(0.5)
        assert leader.node.has_quorum_contact(0.3)
        followers = [m for m in c.members.values() if m is not leader]
        assert not any(f.node.has_quorum_contact(0.3) for f in followers)  # only a leader
        for f in followers:
            await f.stop()
        await trio.sleep(0.31)
        assert not leader.node.has_quorum_contact(0.3)
        nursery.cancel_scope.cancel()
