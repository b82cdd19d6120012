# Issue 27's attacks on the remoting port, against real broker and name
# server processes on 127.0.0.1, each with a legitimate client that must go
# on being served meanwhile:
#   * the 2 KB frame whose extFields value is JSON nested 1,000 deep (it
#     ended the name server and the master): both processes survive;
#   * 48 unauthenticated connections each holding 15 MiB of an unfinished
#     16 MiB frame (a master went from 49 to 781 MiB): the broker's peak RSS
#     stays under the documented 256 MiB, the oldest holders are shed, and a
#     client keeps sending and pulling;
#   * the long-poll flood, 12 connections x 900 pipelined PULL_MESSAGE asking
#     to be held 120 s (every other client got [OVERLOAD] and the master lost
#     its leadership within a second): no election, and another client's
#     sync sends and heartbeat succeed during it.
# (The same mechanisms in-process: tests/broker/remoting/test_containment.py,
# test_budgets.py, tests/broker/processors/test_pull.py.)
# Slow: real broker and name server processes under attack, their memory
#   measured.
import json
import struct
import urllib.request

import pytest
import trio

from broker.remoting.codec import NEED_DATA, CommandDecoder, encode_command
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from tests.broker.remoting.test_containment import deep_json_frame
from tests.helpers.waiting import wait_until
from tools.brokercluster import open_broker_cluster
from tools.chaos.soak import proc_stats
from tools.localcluster import free_ports
from tools.mqadmin.adminapi import MQAdmin

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
RSS_BOUND = 256 * MiB  # README "Limits against hostile clients"
TOPIC = "HostileTopic"
FLOOD_TOPIC = "FloodTopic"  # nobody sends to it: every pull of the flood asks to be held


def send_request(i: int, topic: str = TOPIC, queues: int = 4) -> RemotingCommand:
    fields = {"a": "hostile_pg", "b": topic, "c": "TBW102", "d": queues, "e": i % queues, "f": 0,
              "g": 1700000000000, "h": 0, "i": "", "j": 0, "k": False, "m": False}
    return RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, fields, body=b"legit-%06d" % i)


def pull_request(queue_id: int, offset: int, suspend_ms: int = 0, group: str = "hostile_cg",
                 topic: str = TOPIC) -> RemotingCommand:
    flag = 0x4 | (0x2 if suspend_ms else 0)  # SUBSCRIPTION (| SUSPEND)
    return RemotingCommand.create_request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": group, "topic": topic, "queueId": queue_id, "queueOffset": offset,
        "maxMsgNums": 32, "sysFlag": flag, "commitOffset": 0, "suspendTimeoutMillis": suspend_ms,
        "subscription": "*", "subVersion": 0, "expressionType": "TAG"})


def heartbeat_request() -> RemotingCommand:
    body = {"clientID": "127.0.0.1@legit", "producerDataSet": [{"groupName": "hostile_pg"}],
            "consumerDataSet": [{"groupName": "hostile_cg", "consumeType": "CONSUME_PASSIVELY",
                                 "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                                 "subscriptionDataSet": [{"topic": TOPIC, "subString": "*", "subVersion": 1}]}]}
    return RemotingCommand.create_request(RequestCode.HEART_BEAT, body=json.dumps(body).encode())


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def metric(samples: dict[str, float], name: str, **labels) -> float:
    for key, value in samples.items():
        if key.split("{", 1)[0] == name and all(f'{k}="{v}"' in key for k, v in labels.items()):
            return value
    raise KeyError(name)


class Count:
    """A count others wait on: reached(n) returns once it is n or more."""

    def __init__(self) -> None:
        self.value = 0
        self._changed = trio.Event()

    def add(self, k: int = 1) -> None:
        self.value += k
        self._changed.set()
        self._changed = trio.Event()

    async def reached(self, n: int) -> None:
        while self.value < n:
            await self._changed.wait()


async def until_closed(stream) -> None:
    with trio.fail_after(20):
        while True:
            try:
                if not await stream.receive_some(65536):
                    return
            except trio.BrokenResourceError:
                return


async def test_deep_json_frame_leaves_name_server_and_broker_serving(tmp_path):
    async with open_broker_cluster(tmp_path, size=1) as cluster:
        master = await cluster.wait_master()
        pids = {"broker": cluster.brokers[master].pid, "namesrv": cluster.namesrvs[0].pid}
        for addr in (cluster.namesrv_addrs[0], cluster.addr(master)):
            host, port = addr.rsplit(":", 1)
            for depth in (1000, 5000):
                stream = await trio.open_tcp_stream(host, int(port))
                await stream.send_all(deep_json_frame(depth))
                await stream.send_eof()
                await until_closed(stream)
                await stream.aclose()
        assert cluster.brokers[master].alive and cluster.brokers[master].pid == pids["broker"]
        assert cluster.namesrvs[0].alive and cluster.namesrvs[0].pid == pids["namesrv"]
        # Both go on serving others.
        brokers, _clusters = await cluster.namesrv_client().get_cluster_info()
        assert cluster.broker_name in brokers
        admin = MQAdmin(cluster.remoting, cluster.namesrv_addr)
        await admin.create_topic(cluster.addr(master), TOPIC, 4, 4, 6, False)
        resp = await cluster.remoting.invoke(cluster.addr(master), send_request(0), timeout=10)
        assert resp.code == ResponseCode.SUCCESS, resp.remark


async def hold_unfinished_frame(host: str, port: int, cut_off: Count, done: trio.Event) -> None:
    """Begin a 16 MiB frame, send 15 MiB of it and hold the connection open
    until `done`, counting in `cut_off` if the broker closes it first."""
    header = encode_command(RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=1))[8:]
    prefix = struct.pack(">ii", 16 * MiB - 64, len(header)) + header
    stream = await trio.open_tcp_stream(host, port)
    try:
        async with trio.open_nursery() as holding:
            async def until_cut_off():
                try:
                    await stream.send_all(prefix + b"z" * (15 * MiB))
                    while await stream.receive_some(65536):
                        pass
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                cut_off.add()
                holding.cancel_scope.cancel()

            holding.start_soon(until_cut_off)
            await done.wait()
            holding.cancel_scope.cancel()
    finally:
        await trio.aclose_forcefully(stream)


async def test_unfinished_frames_keep_broker_rss_bounded(tmp_path):
    prom = free_ports(1)[0]
    async with open_broker_cluster(tmp_path, size=1, extra_conf={
            "metricsExporterType": "PROM", "metricsPromExporterPort": prom}) as cluster:
        master = await cluster.wait_master()
        addr = cluster.addr(master)
        host, port = addr.rsplit(":", 1)
        pid = cluster.brokers[master].pid
        admin = MQAdmin(cluster.remoting, cluster.namesrv_addr)
        await admin.create_topic(addr, TOPIC, 4, 4, 6, False)
        rss_before, _fds, anon_before, _ = proc_stats(pid)
        cut_off, done, attack_over = Count(), trio.Event(), trio.Event()
        legit = {"sent": 0, "pulled": 0, "failed": []}

        async def legitimate_client():
            offsets = [0] * 4
            i = 0
            while not attack_over.is_set():
                resp = await cluster.remoting.invoke(addr, send_request(i), timeout=20)
                if resp.code != ResponseCode.SUCCESS:
                    legit["failed"].append(("send", resp.code, resp.remark))
                legit["sent"] += 1
                q = i % 4
                pulled = await cluster.remoting.invoke(addr, pull_request(q, offsets[q]), timeout=20)
                if pulled.code == ResponseCode.SUCCESS:
                    offsets[q] = int(pulled.ext_fields["nextBeginOffset"])
                    legit["pulled"] += 1
                elif pulled.code != ResponseCode.PULL_NOT_FOUND:
                    legit["failed"].append(("pull", pulled.code, pulled.remark))
                i += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(legitimate_client)
            async with trio.open_nursery() as attack:
                for _ in range(48):
                    attack.start_soon(hold_unfinished_frame, host, int(port), cut_off, done)
                # 64 MiB hold four frames of 15 MiB: the broker must cut off the other 44.
                with trio.fail_after(60):
                    await cut_off.reached(44)
                with open(f"/proc/{pid}/status") as f:
                    peak = int(next(line for line in f if line.startswith("VmHWM:")).split()[1]) * 1024
                rss_during, _fds, anon_during, _ = proc_stats(pid)
                samples = scrape(f"http://127.0.0.1:{prom}/metrics")
                done.set()
            attack_over.set()
        print(f"unfinished-frame attack: RSS {rss_before / MiB:.0f} -> peak {peak / MiB:.0f} MiB, "
              f"anon {anon_before / MiB:.0f} -> {anon_during / MiB:.0f} MiB with 4 frames held; "
              f"legit client: {legit['sent']} sends, {legit['pulled']} pulls")
        assert cluster.brokers[master].alive and cluster.brokers[master].pid == pid
        assert peak <= RSS_BOUND, f"peak RSS {peak / MiB:.0f} MiB"
        assert metric(samples, "ledgermq_remoting_connections_shed_total", budget="unfinished_frames") >= 44
        assert metric(samples, "ledgermq_remoting_unfinished_frame_bytes") <= 64 * MiB
        assert legit["failed"] == [] and legit["sent"] > 0 and legit["pulled"] > 0


async def flood_connection(host: str, port: int, n: int, answers: dict, answered: Count,
                           written: trio.Event) -> None:
    """n pipelined PULL_MESSAGE asking to be held 120 s, then read answers."""
    stream = await trio.open_tcp_stream(host, port)
    try:
        frames = b"".join(encode_command(attrs_opaque(pull_request(i % 4, 0, suspend_ms=120000, group="flood_cg",
                                                                   topic=FLOOD_TOPIC), i + 1))
                          for i in range(n))
        await stream.send_all(frames)
        written.set()
        dec = CommandDecoder()
        while True:
            data = await stream.receive_some(65536)
            if not data:
                return
            dec.receive_data(data)
            while (resp := dec.next_command()) is not NEED_DATA:
                answers[resp.code] = answers.get(resp.code, 0) + 1
                answered.add()
    finally:
        await trio.aclose_forcefully(stream)


def attrs_opaque(cmd: RemotingCommand, opaque: int) -> RemotingCommand:
    import attrs
    return attrs.evolve(cmd, opaque=opaque)


async def test_long_poll_flood_causes_no_election_and_others_are_served(tmp_path):
    async with open_broker_cluster(tmp_path) as cluster:
        master = await cluster.wait_master()
        addr = cluster.addr(master)
        host, port = addr.rsplit(":", 1)
        admin = MQAdmin(cluster.remoting, cluster.namesrv_addr)
        await admin.create_topic(addr, TOPIC, 4, 4, 6, False)
        await admin.create_topic(addr, FLOOD_TOPIC, 4, 4, 6, False)

        async def agreed():  # every member knows the leader (a follower learns it from its first push)
            st = {n: await admin.dledger_status(cluster.addr(n)) for n in cluster.brokers}
            views = {(s["term"], s["leader"]) for s in st.values()}
            return st if len(views) == 1 and st[master]["leader"] is not None else None
        before = await wait_until(agreed, 20, "every member agreeing on the term and the leader")
        term, leader = before[master]["term"], before[master]["leader"]

        answers: dict[int, int] = {}
        answered = Count()
        written = [trio.Event() for _ in range(12)]
        others = []
        async with trio.open_nursery() as flood:
            for ev in written:
                flood.start_soon(flood_connection, host, int(port), 900, answers, answered, ev)
            for ev in written:  # all 10,800 pulls are on their way
                await ev.wait()
            # Meanwhile, another client: a heartbeat and sync sends.
            hb = await cluster.remoting.invoke(addr, heartbeat_request(), timeout=10)
            others.append(("heartbeat", hb.code, hb.remark))
            for i in range(20):
                resp = await cluster.remoting.invoke(addr, send_request(i), timeout=10)
                others.append(("send", resp.code, resp.remark))
            with trio.fail_after(60):  # the pulls past the hold budgets are answered at once
                await answered.reached(12 * 900 - 2048)
            # A commit that needs the followers, after the whole flood was taken in.
            resp = await cluster.remoting.invoke(addr, send_request(99), timeout=10)
            others.append(("send", resp.code, resp.remark))
            after = {n: await admin.dledger_status(cluster.addr(n)) for n in cluster.brokers}
            flood.cancel_scope.cancel()
        print(f"long-poll flood: answers {answers}; terms after "
              f"{ {n: (st['term'], st['leader']) for n, st in after.items()} }")
        assert all(code == ResponseCode.SUCCESS for _, code, _ in others), others
        assert answers == {ResponseCode.SYSTEM_BUSY: 12 * 900 - 2048}  # the rest are held (2048 per address)
        assert all((st["term"], st["leader"]) == (term, leader) for st in after.values()), after
