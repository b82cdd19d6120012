# Tests of the in-memory transport: every fault demonstrably happens, runs
# are reproducible from the seed, and the API matches the TCP transport.
# All tests run in virtual time (pytest-trio's autojump_clock is
# trio.testing.MockClock(autojump_threshold=0)).
from contextlib import AsyncExitStack

import pytest
import trio

from commitlog.transport import FrameError, LinkFaults, MemoryNetwork, TransportError, UnknownPeerError

IDS = ("n0", "n1", "n2")


async def start(net: MemoryNetwork, stack: AsyncExitStack, ids=IDS, group="default"):
    return {i: await stack.enter_async_context(net.open_transport(i, ids, group=group)) for i in ids}


async def collect(transport, seconds: float = 10.0) -> list[tuple[float, str, bytes]]:
    """Everything that arrives within `seconds` of virtual time, stamped."""
    got = []
    with trio.move_on_after(seconds):
        async for src, payload in transport.incoming():
            got.append((trio.current_time(), src, payload))
    return got


def msgs(n: int) -> list[bytes]:
    return [b"m%03d" % i for i in range(n)]


async def test_delivery_both_ways_in_order(autojump_clock):
    net = MemoryNetwork(seed=1)
    async with AsyncExitStack() as stack:
        t = await start(net, stack)
        await t["n0"].wait_connected()
        assert t["n0"].connected_peers() == {"n1", "n2"}
        for src in IDS:
            for dst in IDS:
                if src != dst:
                    for m in msgs(5):
                        assert t[src].send(dst, src.encode() + m)
        for dst in IDS:
            got = [(s, p) for _, s, p in await collect(t[dst], 1)]
            for src in IDS:
                if src != dst:
                    assert [p for s, p in got if s == src] == [src.encode() + m for m in msgs(5)]
        st = t["n0"].stats().peers["n1"]
        assert (st.sent_frames, st.received_frames, st.sent_bytes) == (5, 5, 5 * 6)
        with pytest.raises(UnknownPeerError, match="unknown peer 'n9'"):
            t["n0"].send("n9", b"x")
        with pytest.raises(TransportError, match="already running"):
            async with net.open_transport("n0", IDS):
                pass


async def test_drop(autojump_clock):
    net = MemoryNetwork(seed=7, faults=LinkFaults(drop=0.3))
    async with AsyncExitStack() as stack:
        t = await start(net, stack)
        for m in msgs(300):
            assert t["n0"].send("n1", m)  # a drop is invisible to the sender
        got = [p for _, _, p in await collect(t["n1"])]
    dropped = t["n0"].stats().peers["n1"].dropped_fault
    assert 50 < dropped < 130
    assert len(got) == 300 - dropped
    assert got == [m for m in msgs(300) if m in set(got)]  # survivors keep their order


async def test_duplicate(autojump_clock):
    net = MemoryNetwork(seed=3, faults=LinkFaults(duplicate=0.25))
    async with AsyncExitStack() as stack:
        t = await start(net, stack)
        for m in msgs(200):
            t["n0"].send("n1", m)
        got = [p for _, _, p in await collect(t["n1"])]
    dups = t["n0"].stats().peers["n1"].duplicated
    assert 20 < dups < 80
    assert len(got) == 200 + dups
    assert list(dict.fromkeys(got)) == msgs(200)
    assert t["n1"].stats().peers["n0"].received_frames == 200 + dups


async def test_delay_keeps_fifo(autojump_clock):
    net = MemoryNetwork(seed=5, faults=LinkFaults(delay=(0.1, 0.3)))
    got = []
    async with AsyncExitStack() as stack:
        t = await start(net, stack)
        sent = {}
        async with trio.open_nursery() as nursery:
            async def receiver():  # stamps arrivals as they happen
                got.extend(await collect(t["n1"]))
            nursery.start_soon(receiver)
            for m in msgs(50):
                sent[m] = trio.current_time()
                t["n0"].send("n1", m)
                await trio.sleep(0.01)
    assert [p for _, _, p in got] == msgs(50)  # random delays alone never reorder
    lat = [at - sent[p] for at, _, p in got]
    assert all(0.1 - 1e-9 <= x <= 0.3 + 1e-9 for x in lat), lat
    assert max(lat) - min(lat) > 0.05  # the delays really vary


async def test_reorder(autojump_clock):
    net = MemoryNetwork(seed=11, faults=LinkFaults(reorder=0.2, reorder_delay=0.05))
    async with AsyncExitStack() as stack:
        t = await start(net, stack)
        for m in msgs(100):
            t["n0"].send("n1", m)
            await trio.sleep(0.01)
        got = [p for _, _, p in await collect(t["n1"])]
    assert sorted(got) == msgs(100)
    assert got != msgs(100)
    assert 5 < t["n0"].stats().peers["n1"].reordered < 40


async def test_partition_and_heal(autojump_clock):
    net = MemoryNetwork(seed=2)
    async with AsyncExitStack() as stack:
        t = await start(net, stack)
        net.partition({"n0", "n1"}, {"n2"})
        assert t["n0"].connected_peers() == {"n1"}
        assert t["n2"].connected_peers() == set()
        for src, dst in [("n0", "n1"), ("n0", "n2"), ("n2", "n0"), ("n2", "n1"), ("n1", "n0")]:
            assert t[src].send(dst, f"{src}>{dst}".encode())
        assert [p for _, _, p in await collect(t["n1"], 1)] == [b"n0>n1"]
        assert [p for _, _, p in await collect(t["n0"], 1)] == [b"n1>n0"]
        assert await collect(t["n2"], 1) == []
        assert t["n2"].stats().peers["n0"].dropped_fault == 1
        async with trio.open_nursery() as nursery:
            nursery.start_soon(t["n2"].wait_connected)
            nursery.start_soon(t["n0"].wait_state, lambda s: s.peers["n2"].connected)
            await trio.sleep(1)
            net.heal()
        with pytest.raises(UnknownPeerError):
            await t["n2"].wait_connected(["n7"])
        assert t["n2"].send("n0", b"healed")
        assert [p for _, _, p in await collect(t["n0"], 1)] == [b"healed"]
        with pytest.raises(ValueError, match="more than one"):
            net.partition({"n0"}, {"n0", "n1"})
        net.partition({"n0", "n1"})  # n2 named nowhere: cut off
        assert t["n2"].connected_peers() == set()


async def test_partition_eats_messages_in_flight(autojump_clock):
    net = MemoryNetwork(seed=2, faults=LinkFaults(delay=(1.0, 1.0)))
    async with AsyncExitStack() as stack:
        t = await start(net, stack)
        t["n0"].send("n1", b"early")
        await trio.sleep(0.5)
        net.partition({"n0"}, {"n1", "n2"})
        await trio.sleep(1)
        net.heal()
        t["n0"].send("n1", b"late")
        assert [p for _, _, p in await collect(t["n1"], 3)] == [b"late"]


async def test_isolate(autojump_clock):
    net = MemoryNetwork(seed=4)
    async with AsyncExitStack() as stack:
        t = await start(net, stack)
        net.isolate("n1")
        assert t["n1"].connected_peers() == set()
        assert t["n0"].connected_peers() == {"n2"}
        t["n0"].send("n1", b"lost")
        t["n1"].send("n2", b"lost too")
        t["n0"].send("n2", b"fine")
        assert [p for _, _, p in await collect(t["n2"], 1)] == [b"fine"]
        assert await collect(t["n1"], 1) == []
        net.heal()
        t["n0"].send("n1", b"back")
        assert [p for _, _, p in await collect(t["n1"], 1)] == [b"back"]


async def test_per_link_faults_are_directional(autojump_clock):
    net = MemoryNetwork(seed=4)
    net.set_faults(LinkFaults(drop=1.0), src="n0", dst="n1")
    with pytest.raises(ValueError):
        net.set_faults(LinkFaults(), src="n0")
    async with AsyncExitStack() as stack:
        t = await start(net, stack)
        t["n0"].send("n1", b"x")
        t["n1"].send("n0", b"y")
        t["n0"].send("n2", b"z")
        assert await collect(t["n1"], 1) == []
        assert [p for _, _, p in await collect(t["n0"], 1)] == [b"y"]
        assert [p for _, _, p in await collect(t["n2"], 1)] == [b"z"]


async def test_backpressure_bound(autojump_clock):
    net = MemoryNetwork(seed=0, send_queue_messages=3, max_frame_size=100)
    async with AsyncExitStack() as stack:
        t = await start(net, stack)
        with pytest.raises(FrameError, match="exceeds max_frame_size 100"):
            t["n0"].send("n1", b"x" * 101)
        assert [t["n0"].send("n1", m) for m in msgs(5)] == [True, True, True, False, False]
        st = t["n0"].stats().peers["n1"]
        assert (st.dropped_full, st.queued_messages) == (2, 3)
        assert t["n0"].send("n2", b"other link unaffected")
        assert await t["n1"].receive() == ("n0", b"m000")
        assert t["n0"].send("n1", b"again")
        assert not t["n0"].send("n1", b"full again")
        assert [p for _, _, p in await collect(t["n1"], 1)] == [b"m001", b"m002", b"again"]


async def test_stopped_node_and_groups(autojump_clock):
    net = MemoryNetwork(seed=0)
    async with net.open_transport("n0", IDS) as t0:
        async with net.open_transport("n1", IDS) as t1:
            assert t0.connected_peers() == {"n1"}
            t1.send("n0", b"unread")
        # n1 stopped: its slot in n0's view is gone and messages to it are lost.
        assert t0.connected_peers() == frozenset()
        assert t1.send("n0", b"after close") is False
        with pytest.raises(trio.EndOfChannel):
            await t1.receive()
        t0.send("n1", b"into the void")
        assert t0.stats().peers["n1"].dropped_fault == 1
        async with net.open_transport("n1", IDS, group="other") as t1b:
            assert t0.connected_peers() == frozenset()  # wrong group: no talking
            t0.send("n1", b"x")
            assert await collect(t1b, 1) == []
        assert [p for _, _, p in await collect(t0, 1)] == [b"unread"]


async def _scenario(seed: int) -> list:
    net = MemoryNetwork(seed=seed, faults=LinkFaults(drop=0.2, duplicate=0.2, delay=(0.0, 0.05),
                                                     reorder=0.2))
    async with AsyncExitStack() as stack:
        t = await start(net, stack)
        async with trio.open_nursery() as nursery:
            # Senders run concurrently; per-link randomness keeps the
            # outcome independent of trio's (randomised) scheduling order.
            for src in IDS:
                async def run(src=src):
                    for m in msgs(40):
                        for dst in IDS:
                            if dst != src:
                                t[src].send(dst, src.encode() + m)
                        await trio.sleep(0.01)
                nursery.start_soon(run)
        out = []
        for dst in IDS:
            got = await collect(t[dst], 2)
            for src in IDS:
                out.append([p for _, s, p in got if s == src])
        return out


async def test_seeded_runs_are_reproducible(autojump_clock):
    a, b, c = await _scenario(42), await _scenario(42), await _scenario(43)
    assert a == b
    assert a != c


def test_fault_values_validated():
    for bad in (dict(drop=1.5), dict(duplicate=-0.1), dict(reorder=2), dict(delay=(0.2, 0.1)),
                dict(delay=(-1, 0))):
        with pytest.raises(ValueError):
            LinkFaults(**bad)
    assert LinkFaults(delay=[0.1, 0.2]).delay == (0.1, 0.2)


async def test_a_sink_gets_queued_then_delivered_messages_with_the_counts(autojump_clock):
    net = MemoryNetwork(seed=3, send_queue_messages=2)
    async with AsyncExitStack() as stack:
        t = await start(net, stack)
        assert t["n0"].send("n1", b"early")
        await trio.sleep(1)  # delivered into n1's queue
        got = []
        t["n1"].set_sink(lambda src, payload: got.append((trio.current_time(), src, payload)))
        assert [(s, p) for _, s, p in got] == [("n0", b"early")]
        for m in msgs(6):  # the link's slots free up as the sink takes them
            while not t["n0"].send("n1", m):
                await trio.sleep(0.01)
        await trio.sleep(1)
        assert [p for _, _, p in got] == [b"early", *msgs(6)]
        assert t["n1"].stats().peers["n0"].received_frames == 7
