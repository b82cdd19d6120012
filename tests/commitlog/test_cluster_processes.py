# Three real node processes over TCP on 127.0.0.1 (python -m commitlog.node):
# kill -9 the leader while clients append, and check that a new leader takes
# over and that every acknowledged append is on the survivors and on the
# restarted node, with identical chain CRCs (identical histories); and a
# stall of the whole group (every process SIGSTOPped together) elects nobody.
# Slow: three real node processes per test, kills and a stall of the whole
#   group.
import base64
import time

import pytest
import trio

from tools.localcluster import LocalCluster

pytestmark = pytest.mark.slow

SMALL_SEGMENTS = {"mappedFileSizeCommitLog": 256 * 1024, "mappedFileSizeForEntryIndex": 32 * 1024}


async def append_loop(cluster, acked: dict, stop: trio.Event, name: str):
    """A client that appends numbered bodies to whoever leads, retrying on the
    leader the error names; records what was acknowledged."""
    seq = 0
    target = await cluster.wait_leader()
    while not stop.is_set():
        bodies = [f"{name}-{seq}-{k}".encode() for k in range(4)]
        try:
            reply = await cluster.call(target, {"op": "append",
                                                "bodies": [base64.b64encode(b).decode() for b in bodies]},
                                       timeout=5)
        except (OSError, trio.BrokenResourceError, trio.TooSlowError, ValueError):
            target = await cluster.wait_leader(exclude={target})
            continue
        if reply["ok"]:
            for (index, _pos), body in zip(reply["entries"], bodies):
                acked[index] = body
            seq += 1
        elif reply.get("leader") and reply["leader"] in cluster.nodes:
            target = reply["leader"]
        else:
            await trio.sleep(0.05)  # no leader known yet: back off briefly
            target = await cluster.wait_leader()


async def read_all(cluster, node_id, upto):
    out, nxt = {}, 0
    while nxt <= upto:
        reply = await cluster.call(node_id, {"op": "read", "from": nxt, "count": 2000})
        assert reply["ok"], reply
        if not reply["entries"]:
            break
        for index, _term, body in reply["entries"]:
            out[index] = base64.b64decode(body)
        nxt = reply["entries"][-1][0] + 1
    return out


async def test_kill_leader_under_load_loses_no_acknowledged_append(tmp_path):
    cluster = LocalCluster(str(tmp_path), extra_conf=SMALL_SEGMENTS)
    await cluster.start()
    try:
        first_leader = await cluster.wait_leader()
        acked: dict[int, bytes] = {}
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for k in range(3):
                nursery.start_soon(append_loop, cluster, acked, stop, f"c{k}")
            while len(acked) < 400:
                await trio.sleep(0.02)
            cluster.kill(first_leader)
            await cluster.wait_dead(first_leader)
            acked_at_kill = len(acked)
            new_leader = await cluster.wait_leader(exclude={first_leader})
            assert new_leader != first_leader
            while len(acked) < acked_at_kill + 400:
                await trio.sleep(0.02)
            stop.set()
        await cluster.start(first_leader)  # restart the killed node from its disk
        last = max(acked)
        sts = await cluster.wait_all_committed(last, timeout=20)
        assert len(sts) == 3
        common = min(st["committedIndex"] for st in sts.values())
        for node_id in cluster.nodes:
            log = await read_all(cluster, node_id, last)
            missing = {i for i, body in acked.items() if log.get(i) != body}
            assert not missing, f"{node_id} lost acknowledged entries {sorted(missing)[:10]}"
        chains = {nid: (await cluster.call(nid, {"op": "chain", "index": common}))["chainCrc"]
                  for nid in cluster.nodes}
        assert len(set(chains.values())) == 1, chains
        assert sts[first_leader]["role"] == "follower"
    finally:
        await cluster.stop_all()


async def test_leadership_transfer_through_the_admin_port(tmp_path):
    cluster = LocalCluster(str(tmp_path), extra_conf=SMALL_SEGMENTS)
    await cluster.start()
    try:
        leader = await cluster.wait_leader()
        target = next(n for n in cluster.nodes if n != leader)
        reply = await cluster.call(leader, {"op": "transfer", "to": target})
        assert reply["ok"], reply
        assert await cluster.wait_leader(timeout=5) == target
        # Unknown peers are refused with a typed error, not a crash.
        reply = await cluster.call(target, {"op": "transfer", "to": "n9"})
        assert not reply["ok"] and reply["type"] == "LeadershipTransferError"
        assert (await cluster.call(target, {"op": "status"}))["role"] == "leader"
    finally:
        await cluster.stop_all()


async def test_preferred_leader_takes_leadership_back(tmp_path):
    cluster = LocalCluster(str(tmp_path), extra_conf={**SMALL_SEGMENTS, "preferredLeaderId": "n2"})
    await cluster.start()
    try:
        async def until_leader_is(node_id):
            # Any node may win the first election; the preferred one then
            # takes over once it is caught up (checked every second).
            with trio.fail_after(15):
                while (await cluster.wait_leader()) != node_id:
                    await trio.sleep(0.1)

        await until_leader_is("n2")
        cluster.kill("n2")
        await cluster.wait_dead("n2")
        interim = await cluster.wait_leader(exclude={"n2"})
        assert interim != "n2"
        await cluster.start("n2")
        await until_leader_is("n2")
    finally:
        await cluster.stop_all()


async def test_a_stall_of_the_whole_group_elects_nobody(tmp_path):
    """Every node SIGSTOPped together for 1.5 s (a starved machine, a paused
    VM), then resumed: the timers wake long overdue, and the ticks they
    missed are dropped (commitlog/replica.py _ticker), so the leader's next
    heartbeat keeps its term.  Replayed, those ticks flipped the leader in
    5 stalls of 6."""
    cluster = LocalCluster(str(tmp_path), extra_conf=SMALL_SEGMENTS)
    await cluster.start()
    try:
        leader = await cluster.wait_leader()
        term = (await cluster.call(leader, {"op": "status"}))["term"]
        for _ in range(3):
            for node in cluster.nodes:
                cluster.pause(node)
            time.sleep(1.5)  # blocks this test's loop too: nothing of the group runs
            for node in cluster.nodes:
                cluster.resume(node)
            await trio.sleep(2.0)  # (an election would take 0.3-0.6 s)
            sts = await cluster.statuses()
            assert {st["term"] for st in sts.values()} == {term}, sts
            assert [n for n, st in sts.items() if st["role"] == "leader"] == [leader], sts
    finally:
        await cluster.stop_all()
