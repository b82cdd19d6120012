# The fate of appends a leader had written when it lost leadership
# (commitlog/replica.py, "Leader changes"), over the in-memory transport on
# trio's MockClock: an entry the next leader commits releases its waiter
# with success and the positions it was written at; an entry a later leader
# truncates fails with TermChangedError as soon as the truncation is
# written (not at its deadline); a leadership transfer under a stream of
# appends fails no append that reached the log.
import pytest
import trio
import trio.testing

from commitlog.errors import CommitLogError, LeaderTransferringError, NotLeaderError, TermChangedError
from commitlog.raft.state import Role
from commitlog.transport.memory import LinkFaults, MemoryNetwork
from tests.commitlog.test_replica_memory import IDS, autojump_clock, start_group, wait_leader  # noqa: F401

DROP = LinkFaults(drop=1.0)


async def until(predicate) -> None:
    """Wait on the mock clock (virtual time, as wait_leader does) until
    predicate() holds; the test's own timeout ends a wait that never does."""
    with trio.fail_after(30):
        while not predicate():
            await trio.sleep(0.01)


async def test_an_entry_the_next_leader_commits_releases_its_waiter(autojump_clock):
    net = MemoryNetwork(seed=5)
    async with trio.open_nursery() as nursery:
        members, old = await start_group(nursery, net, max_wait_ack_ms=20_000)
        await old.node.append([b"warm-up"])
        others = [m for m in members if m is not old]
        # The followers write the entry but their acknowledgements are lost:
        # the old leader cannot commit it in its term.
        for m in others:
            net.set_faults(DROP, src=m.node_id, dst=old.node_id)
        req = old.node.submit([b"held-1", b"held-2"])
        outcome = {}

        async def waiter():
            try:
                outcome["ok"] = (await old.node.wait(req)).result
            except CommitLogError as exc:
                outcome["error"] = exc
        nursery.start_soon(waiter)
        await until(lambda: req.first_index > 0 and all(m.log.end_index >= req.last_index for m in others))
        # Now the old leader is cut off; the others elect one of themselves,
        # whose NOOP commits the entries in the new term.
        net.isolate(old.node_id)
        new = await wait_leader(others)
        await new.node.committed.wait_for(req.last_index, timeout=5)
        assert outcome == {}  # the old leader has not learnt anything yet
        net.heal()
        for m in others:
            net.set_faults(LinkFaults(), src=m.node_id, dst=old.node_id)
        await old.node.committed.wait_for(req.last_index, timeout=5)
        await until(lambda: outcome)
        assert not old.node.is_leader
        assert "ok" in outcome, outcome
        [(i1, p1), (i2, p2)] = outcome["ok"]
        assert (i1, i2) == (req.first_index, req.last_index)
        assert new.log.body_at(i1) == b"held-1" and new.log.body_at(i2) == b"held-2"
        assert new.log.term_at(i1) == req.term < new.node.core.term
        nursery.cancel_scope.cancel()


async def test_an_entry_a_later_leader_truncates_fails_at_once(autojump_clock):
    net = MemoryNetwork(seed=6)
    async with trio.open_nursery() as nursery:
        members, old = await start_group(nursery, net, max_wait_ack_ms=60_000)
        await old.node.append([b"warm-up"])
        net.isolate(old.node_id)
        req = old.node.submit([b"lost"])
        outcome = {}

        async def waiter():
            try:
                outcome["ok"] = await old.node.wait(req)
            except CommitLogError as exc:
                outcome["error"] = exc
        nursery.start_soon(waiter)
        others = [m for m in members if m is not old]
        new = await wait_leader(others)
        [(replaced, _)] = await new.node.append([b"instead"])
        assert replaced >= req.first_index  # the new leader's NOOP took the index, then this
        t0 = trio.current_time()
        net.heal()
        await old.node.committed.wait_for(replaced, timeout=5)
        await until(lambda: outcome)
        assert isinstance(outcome.get("error"), TermChangedError), outcome
        assert trio.current_time() - t0 < 5  # by the truncation, not the 60 s deadline
        assert old.log.body_at(replaced) == b"instead" and old.log.body_at(req.first_index) != b"lost"
        assert old.node.stats["held_appends_lost"] == 1
        nursery.cancel_scope.cancel()


async def test_a_transfer_under_load_fails_no_append_that_reached_the_log(autojump_clock):
    net = MemoryNetwork(seed=7)
    async with trio.open_nursery() as nursery:
        members, old = await start_group(nursery, net)
        await old.node.append([b"warm-up"])
        target = next(m for m in members if m is not old)
        stored, refused, unknown = {}, [], []

        async def producer(k):
            for j in range(40):
                body = f"p{k}-{j}".encode()
                try:
                    [(index, _)] = await old.node.append([body])
                    stored[body] = index
                except (NotLeaderError, LeaderTransferringError):
                    refused.append(body)  # never in the log: the broker may hand it on
                    return
                except CommitLogError as exc:
                    unknown.append((body, exc))
                    return
                await trio.sleep(0.001)

        assert old.node.transferring_to is None
        async with trio.open_nursery() as producers:
            for k in range(8):
                producers.start_soon(producer, k)
            await trio.sleep(0.01)
            # While the transfer is under way the leader says so (appends are
            # refused meanwhile, and the broker holds them).
            during = await old.node.call(lambda core: (core.transfer_leadership(target.node_id),
                                                       old.node.transferring_to)[1])
            assert during == target.node_id
            await until(lambda: not old.node.is_leader)
        assert old.node.transferring_to is None
        assert unknown == []
        assert stored and refused
        assert await wait_leader(members) is target and old.node.soft_state.role is Role.FOLLOWER
        for body, index in stored.items():
            await target.node.committed.wait_for(index, timeout=5)
            assert target.log.body_at(index) == body
        nursery.cancel_scope.cancel()
