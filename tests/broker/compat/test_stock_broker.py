# The stock PyPI client rocketmq==0.4.4 (rocketmq-client-cpp 1.0.1) against
# a real `mqbroker` group: an in-process name server and three mqbroker
# subprocesses (one DLedger group) on 127.0.0.1, reusing the helpers of
# tests/broker/test_server.py.  Checked:
#  - the stock producer sends N messages with tags/keys; the stock
#    PullConsumer pulls every queue from offset 0 until NO_NEW_MSG and gets
#    every sent body exactly once, with its tags/keys;
#  - the stock PushConsumer receives everything produced by the stock
#    producer and by our RemotingClient (SEND_MESSAGE_V2), mixed, while it
#    runs; after its clean shutdown QUERY_CONSUMER_OFFSET (our client) shows
#    the committed offsets at every queue's max offset;
#  - kill -9 of the master while the push consumer runs: after the C++
#    client's route refresh (every 30 s; its in-flight long polls to the dead
#    master time out after 30 s) it continues on the new master, nothing lost
#    or re-delivered, and commits there; a fresh consumer of the group then
#    starts from those committed offsets.  (About 35 s, client timers.)
#  - a push consumer whose callback fails gets those messages again through
#    %RETRY%<group> (CONSUMER_SEND_MSG_BACK, delay level 3 = 10 s).
# Every stock-client run is a subprocess with HOME in a temporary directory
# and a hard timeout (tests/broker/compat/stock_client.run_script).
# Slow: three mqbroker processes per test and stock C++ client processes; the
#   master kill waits out the C++ client's 30 s route poll and pull timeout.
import os
import signal

import pytest
import trio

from broker.namesrv.client import NamesrvClient
from broker.remoting.client import open_remoting_client
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from consumequeue import record as M
from tests.broker.compat.stock_client import run_script
from tests.broker.test_server import running_group, wait_group, wait_route
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.slow


def v2_send(topic: str, body: str, queue_id: int, tags: str = "TagOwn") -> RemotingCommand:
    props = M.properties_to_string({"TAGS": tags, "KEYS": body, "UNIQ_KEY": os.urandom(16).hex().upper()})
    fields = {"a": "own_producer", "b": topic, "c": "TBW102", "d": 4, "e": queue_id, "f": 0,
              "g": "1700000000000", "h": 0, "i": props, "j": 0, "k": False, "m": False}
    return RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, fields, body=body.encode())


async def run_stock(script: str, args: list, timeout: float):
    return await trio.to_thread.run_sync(lambda: run_script(script, [str(a) for a in args], timeout=timeout))


async def query_offsets(rc, addr: str, group: str, topic: str, nq: int) -> dict[int, int | None]:
    out = {}
    for q in range(nq):
        req = RemotingCommand.create_request(RequestCode.QUERY_CONSUMER_OFFSET,
                                             {"consumerGroup": group, "topic": topic, "queueId": q})
        resp = await rc.invoke(addr, req, 5)
        out[q] = int(resp.ext_fields["offset"]) if resp.code == ResponseCode.SUCCESS else None
    return out


async def consumer_online(rc, addr: str, group: str) -> None:
    """Until the broker at `addr` has a heartbeat of a consumer of `group`
    (the stock push consumer has started: it heartbeats before its first
    rebalance and pulls)."""
    async def online():
        req = RemotingCommand.create_request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
        resp = await rc.invoke(addr, req, 5)
        return resp.code == ResponseCode.SUCCESS
    await wait_until(online, 60, f"a consumer of {group} heartbeating to {addr}", interval=0.1)


async def committed_at(rc, addr: str, group: str, topic: str, maxes: dict[int, int]) -> bool:
    return await query_offsets(rc, addr, group, topic, len(maxes)) == maxes


async def max_offsets(rc, addr: str, topic: str, nq: int) -> dict[int, int]:
    out = {}
    for q in range(nq):
        req = RemotingCommand.create_request(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": q})
        resp = await rc.invoke(addr, req, 5)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        out[q] = int(resp.ext_fields["offset"])
    return out


async def test_stock_producer_then_pull_consumer(tmp_path, stock_client):
    topic, n = "PullTopic", 24
    async with running_group(tmp_path) as g, open_remoting_client() as rc:
        ns = NamesrvClient(rc, [g.nsrv.address])
        addrs = await wait_group(ns, set(g.addr_of.values()), timeout=30)
        prod = await run_stock("produce.py", [g.nsrv.address, topic, n, "--tags", "TagP", "--keys", "key-",
                                              "--body-prefix", "pull-"], timeout=60)
        assert prod.result["ok"] == n, (prod.result, prod.log_text[-3000:])
        await wait_route(ns, addrs[0], topic)
        pull = await run_stock("pull.py", [g.nsrv.address, topic, "--max-num", 8], timeout=90)
        msgs = pull.result["messages"]
        assert pull.result["error"] is None, (pull.result, pull.log_text[-3000:])
        bodies = sorted(m["body"] for m in msgs)
        assert bodies == sorted(f"pull-{i}" for i in range(n)), (msgs, pull.log_text[-3000:])
        for m in msgs:
            i = int(m["body"].split("-")[1])
            assert (m["topic"], m["tags"], m["keys"]) == (topic, "TagP", f"key-{i}")
        # per queue: contiguous offsets from 0
        by_q: dict[int, list[int]] = {}
        for m in msgs:
            by_q.setdefault(m["queue_id"], []).append(m["queue_offset"])
        for offs in by_q.values():
            assert sorted(offs) == list(range(len(offs)))


async def test_stock_push_consumer_mixed_producers_commits_offsets(tmp_path, stock_client):
    topic, group, n_stock, n_own = "PushTopic", "compat_push_g", 12, 12
    async with running_group(tmp_path) as g, open_remoting_client() as rc:
        ns = NamesrvClient(rc, [g.nsrv.address])
        addrs = await wait_group(ns, set(g.addr_of.values()), timeout=30)
        master = addrs[0]
        prod = await run_stock("produce.py", [g.nsrv.address, topic, n_stock, "--body-prefix", "stock-"],
                               timeout=60)
        assert prod.result["ok"] == n_stock, (prod.result, prod.log_text[-3000:])
        route = await wait_route(ns, master, topic)
        nq = route.queue_datas[0].read_queue_nums
        result = {}

        async def push():
            result["run"] = await run_stock("push.py", [g.nsrv.address, topic, n_stock + n_own, "--group", group,
                                                        "--wait", 60, "--shutdown"], timeout=100)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(push)
            await consumer_online(rc, master, group)  # started: these go through long polling
            for i in range(n_own):
                resp = await rc.invoke(master, v2_send(topic, f"own-{i}", i % nq), 10)
                assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
        run = result["run"]
        got = [m["body"] for m in run.result["messages"]]
        expect = {f"stock-{i}" for i in range(n_stock)} | {f"own-{i}" for i in range(n_own)}
        assert run.result["complete"], (sorted(set(got)), run.log_text[-4000:])
        assert set(got) == expect
        assert len(got) == len(expect), sorted(got)  # exactly once
        maxes = await max_offsets(rc, master, topic, nq)
        assert sum(maxes.values()) == n_stock + n_own
        await wait_until(lambda: committed_at(rc, master, group, topic, maxes), 15,
                         f"{group} committed {maxes} (push log: {run.log_text[-4000:]})", interval=0.2)


async def black_hole(port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Accept connections on 127.0.0.1:port and never answer (a host that
    stopped answering), until cancelled."""
    async def swallow(stream):
        async with stream:
            while await stream.receive_some(65536):
                pass

    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, swallow, listeners)
        task_status.started()


async def test_stock_push_consumer_survives_master_kill(tmp_path, stock_client):
    topic, group, n1, n2 = "FailTopic", "compat_fail_g", 12, 12
    async with running_group(tmp_path) as g, open_remoting_client() as rc:
        ns = NamesrvClient(rc, [g.nsrv.address])
        addrs = await wait_group(ns, set(g.addr_of.values()), timeout=30)
        master = addrs[0]
        node_of = {a: node for node, a in g.addr_of.items()}
        for i in range(4):  # create the topic (4 queues) before the consumer starts
            resp = await rc.invoke(master, v2_send(topic, f"a-{i}", i), 10)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        await wait_route(ns, master, topic)
        result = {}

        async def push():
            result["run"] = await run_stock("push.py", [g.nsrv.address, topic, 4 + n1 + n2, "--group", group,
                                                        "--wait", 120, "--shutdown"], timeout=160)

        async with trio.open_nursery() as silent:  # the dead master's port, see below
            async with trio.open_nursery() as nursery:
                nursery.start_soon(push)
                await consumer_online(rc, master, group)
                for i in range(n1):
                    resp = await rc.invoke(master, v2_send(topic, f"b-{i}", i % 4), 10)
                    assert resp.code == ResponseCode.SUCCESS, resp.remark
                # let the consumer commit (C++ persists offsets every 5 s)
                async def committed_before_kill():
                    return sum((await query_offsets(rc, master, group, topic, 4)).values()) >= 4 + n1
                await wait_until(committed_before_kill, 30, "the consumer's commit of everything sent so far",
                                 interval=0.5)
                dead = node_of[master]
                os.kill(g.procs[dead].pid, signal.SIGKILL)
                await g.procs[dead].wait()
                rc.close_connection(master)
                # The dead master's host goes silent rather than refusing
                # connections: the stock C++ core (rocketmq-client-cpp 2.x)
                # re-issues a pull whose connect was refused at once, with no
                # delay, and that spin starves its own name-server route refresh
                # (`GetTransport of <namesrv> get timed_mutex timeout` in its
                # log), on a loaded machine for minutes.  Against a silent host
                # its pulls time out (30 s) and are retried after 1 s, and the
                # route refresh (every 30 s) finds the new master.
                await silent.start(black_hole, int(master.rsplit(":", 1)[1]))
                live = {a for a in g.addr_of.values() if a != master}
                addrs = await wait_group(ns, live, timeout=20, not_master=master)
                new_master = addrs[0]
                for i in range(n2):
                    resp = await rc.invoke(new_master, v2_send(topic, f"c-{i}", i % 4), 10)
                    assert resp.code == ResponseCode.SUCCESS, resp.remark
            silent.cancel_scope.cancel()
        run = result["run"]
        got = [m["body"] for m in run.result["messages"]]
        expect = {f"a-{i}" for i in range(4)} | {f"b-{i}" for i in range(n1)} | {f"c-{i}" for i in range(n2)}
        if not run.result["complete"]:
            print(run.log_text[-200_000:])  # the C++ core's log, for the report
        assert run.result["complete"], (sorted(expect - set(got)), run.log_text[-4000:])
        assert set(got) == expect
        # offsets committed before the kill were not re-delivered
        assert len(got) == len(expect), sorted(got)
        # the consumer committed to the new master: every queue at its max
        maxes = await max_offsets(rc, new_master, topic, 4)
        assert sum(maxes.values()) == len(expect)
        await wait_until(lambda: committed_at(rc, new_master, group, topic, maxes), 15,
                         f"{group} committed {maxes} on the new master", interval=0.2)
        # a fresh consumer in the same group starts from those committed
        # offsets (none would mean offset 0, i.e. everything again)
        for i in range(8):
            resp = await rc.invoke(new_master, v2_send(topic, f"d-{i}", i % 4), 10)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        run = await run_stock("push.py", [g.nsrv.address, topic, 8, "--group", group, "--wait", 30, "--shutdown"],
                              timeout=60)
        got = [m["body"] for m in run.result["messages"]]
        assert sorted(got) == sorted(f"d-{i}" for i in range(8)), (got, run.log_text[-3000:])


async def test_stock_push_consumer_failed_messages_are_redelivered(tmp_path, stock_client):
    """A raising callback means reconsume later: the C++ client sends
    CONSUMER_SEND_MSG_BACK {group, offset (commitlog), delayLevel: "0"} and
    gets the message back through %RETRY%<group> (created by its heartbeat)."""
    topic, group = "RetryTopic", "compat_retry_g"
    async with running_group(tmp_path) as g, open_remoting_client() as rc:
        ns = NamesrvClient(rc, [g.nsrv.address])
        addrs = await wait_group(ns, set(g.addr_of.values()), timeout=30)
        for i in range(4):
            resp = await rc.invoke(addrs[0], v2_send(topic, f"r-{i}", i), 10)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        await wait_route(ns, addrs[0], topic)
        run = await run_stock("push.py", [g.nsrv.address, topic, 4, "--group", group, "--fail-first", 2,
                                          "--wait", 25, "--shutdown"], timeout=60)
        got = sorted({m["body"] for m in run.result["messages"]})
        assert got == [f"r-{i}" for i in range(4)], (got, run.log_text[-3000:])
        # the two failed deliveries came back once each through %RETRY%<group> (reconsumeTimes 1,
        # the client restores the topic from RETRY_TOPIC), after level 3 (10 s) of the default table
        retried = sorted(m["body"] for m in run.result["messages"] if m["reconsume_times"] == 1)
        assert len(retried) == 2 and run.result["deliveries"] == 6, run.result
        assert all(m["topic"] == topic for m in run.result["messages"])
