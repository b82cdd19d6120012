# Timer messages across a kill -9 of the master, with real processes: a
# 3-broker DLedger group; timers due before, around and after the kill; the
# new master delivers every one of them, and none twice (the delivered
# records and the timer.done record that marks them are one append, and a
# new master finishes an append its predecessor committed only in part).
import time

import pytest
import trio

from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from consumequeue import record as M
from tests.broker.processors.test_send import v2

TOPIC = "TimerKillT"


def timed(at_ms: int, uniq: str) -> str:
    return M.properties_to_string({"UNIQ_KEY": uniq, "TIMER_DELIVER_MS": str(at_ms)})


def now_ms() -> int:
    return int(time.time() * 1000)


async def pull_all(rc, addr, offset: int, want: int, timeout: float = 40) -> list[M.MessageRecord]:
    """Long-poll queue 0 from `offset` until `want` messages came."""
    out = []
    with trio.fail_after(timeout):
        while len(out) < want:
            req = RemotingCommand.create_request(RequestCode.PULL_MESSAGE, {
                "consumerGroup": "tk", "topic": TOPIC, "queueId": 0, "queueOffset": offset, "maxMsgNums": 32,
                "sysFlag": 0x2 | 0x4, "commitOffset": 0, "suspendTimeoutMillis": 5000, "subscription": "*",
                "subVersion": 0})
            resp = await rc.invoke(addr, req, 15)
            if resp.code == ResponseCode.SUCCESS:
                off = 0
                while off < len(resp.body):
                    out.append(M.decode(resp.body, off))
                    off += int.from_bytes(resp.body[off:off + 4], "big")
            elif resp.code not in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY):
                raise AssertionError((resp.code, resp.remark))
            offset = int(resp.ext_fields.get("nextBeginOffset", offset))
    return out


@pytest.mark.slow
async def test_kill_master_while_timers_wait(tmp_path):
    """Slow: a kill -9 of a real master process is the subject (3 broker
    processes, an election, timers due across it)."""
    from tools.brokercluster import open_broker_cluster
    async with open_broker_cluster(tmp_path, size=3, extra_conf={"timerPrecisionMs": "1"}) as cluster:
        rc = cluster.remoting
        node = await cluster.wait_master()
        master = cluster.addr(node)
        t0 = now_ms()
        asked = {}

        async def send(i: int, at: int) -> None:
            body = f"k{i}".encode()
            asked[body] = at
            resp = await rc.invoke(master, v2(topic=TOPIC, body=body, queue_id=0, props=timed(at, f"K{i}")), 10)
            assert resp.code == ResponseCode.SUCCESS, resp.remark

        # 0-19 due at +1.5 s (delivered by the first master), 20-219 spread
        # over +2.0..+3.0 s (the kill comes while they are delivered), 220-239
        # at +8 s (long after it: the new master's).
        async with trio.open_nursery() as nursery:
            for k in range(8):
                async def some(k=k):
                    for i in range(k, 240, 8):
                        at = t0 + 1500 if i < 20 else t0 + 2000 + (i - 20) * 5 if i < 220 else t0 + 8000
                        await send(i, at)
                nursery.start_soon(some)
        first = await pull_all(rc, master, 0, 20)
        assert {r.body for r in first[:20]} == {f"k{i}".encode() for i in range(20)}  # due order
        with trio.fail_after(10):
            while now_ms() < t0 + 2300:  # into the second wave
                await trio.sleep((t0 + 2300 - now_ms()) / 1000)
        cluster.kill(node)
        await cluster.wait_dead(node)
        killed_at = now_ms()
        new = cluster.addr(await cluster.wait_master(exclude={node}, timeout=30))
        got = await pull_all(rc, new, 0, 240)
        # the barrier a late duplicate would pass first: one more timer after all the others
        resp = await rc.invoke(new, v2(topic=TOPIC, body=b"end", queue_id=0, props=timed(now_ms() + 300, "END")), 10)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        got += await pull_all(rc, new, len(got), 1)
        bodies = [r.body for r in got]
        assert bodies[-1] == b"end", bodies[-5:]
        dup = sorted({b for b in bodies if bodies.count(b) > 1})
        assert not dup, f"delivered twice: {dup[:10]}"
        assert sorted(bodies[:-1]) == sorted(asked)
        early = [r.body for r in got[:-1] if r.store_timestamp < asked[r.body]]
        assert not early, early[:10]
        before = sum(1 for r in got[:-1] if r.store_timestamp < killed_at)
        late = sorted(r.store_timestamp - asked[r.body] for r in got[:-1])
        print(f"\ntimers across kill -9: {before} delivered before the kill, {240 - before} by the new master; "
              f"lateness p50 {late[len(late) // 2]} ms, max {late[-1]} ms (includes the election)")
