# Pipelined sends in flight while the master is killed (kill -9), on a real
# 3-broker group: the burst path (one append per read, answers after commit)
# must keep Raft's promise.  Every send answered SUCCESS is stored on the new
# master exactly where its answer said (queue id, queue offset, physical
# offset in the msgId); nothing is stored twice; nothing is stored that was
# not sent; and what is stored without an answer is bounded by what was in
# flight when the master died.
# Slow: a real 3-broker group, a kill -9 of its master under pipelined sends.
import pytest
import trio

from broker.common.msgid import parse_offset_msg_id
from broker.remoting.codec import NEED_DATA, CommandDecoder, encode_command
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from consumequeue import record as M
from tools.bench.broker import create_topic_request
from tools.brokercluster import open_broker_cluster

pytestmark = pytest.mark.slow

TOPIC, QUEUES, WINDOW = "FailoverTopic", 4, 256


def send(i: int) -> RemotingCommand:
    fields = {"a": "fo_pg", "b": TOPIC, "c": "TBW102", "d": QUEUES, "e": i % QUEUES, "f": 0, "g": 1700000000000,
              "h": 0, "i": "TAGS\x01fo\x02", "j": 0, "k": False, "m": False}
    return RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, fields, body=b"fo-%06d" % i + b"." * 200,
                                          opaque=i + 1)


async def pipeline(addr: str, kill, kill_after: int, limit: int) -> dict[int, RemotingCommand]:
    """Keep WINDOW sends in flight on one connection; call kill() once
    kill_after are answered; stop when the connection dies (or `limit`
    are answered).  Returns the answers by message number."""
    host, _, port = addr.rpartition(":")
    stream = await trio.open_tcp_stream(host, int(port))
    answers: dict[int, RemotingCommand] = {}
    state = {"next": 0, "killed": False}
    room = trio.Event()

    async def writer():
        nonlocal room
        while state["next"] < limit:
            n = min(WINDOW - (state["next"] - len(answers)), limit - state["next"])
            if n <= 0:
                await room.wait()
                room = trio.Event()
                continue
            frames = b"".join(encode_command(send(i)) for i in range(state["next"], state["next"] + n))
            state["next"] += n
            await stream.send_all(frames)

    async def reader():
        dec = CommandDecoder()
        while len(answers) < limit:
            data = await stream.receive_some(1 << 16)
            if not data:
                return
            dec.receive_data(data)
            while (resp := dec.next_command()) is not NEED_DATA:
                answers[resp.opaque - 1] = resp
            room.set()
            if len(answers) >= kill_after and not state["killed"]:
                state["killed"] = True
                kill()

    with trio.move_on_after(60):
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer)
                await reader()
                nursery.cancel_scope.cancel()
        except* (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the master died under us
    await trio.aclose_forcefully(stream)
    assert state["killed"], f"only {len(answers)} answers before the connection ended"
    return answers, state["next"]


async def stored_messages(rc, addr: str) -> list[M.MessageRecord]:
    out = []
    for q in range(QUEUES):
        offset = 0
        while True:
            resp = await rc.invoke(addr, RemotingCommand.create_request(RequestCode.PULL_MESSAGE, {
                "consumerGroup": "fo_cg", "topic": TOPIC, "queueId": q, "queueOffset": offset, "maxMsgNums": 32,
                "sysFlag": 0x4, "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*",
                "subVersion": 0}), 10)
            if resp.code != ResponseCode.SUCCESS:
                assert resp.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY), resp.remark
                break
            pos = 0
            while pos < len(resp.body):
                size = int.from_bytes(resp.body[pos:pos + 4], "big")
                out.append(M.decode(resp.body[pos:pos + size], check_crc=True))
                pos += size
            offset = int(resp.ext_fields["nextBeginOffset"])
    return out


async def test_answered_sends_survive_a_master_kill_mid_burst(tmp_path):
    async with open_broker_cluster(tmp_path) as cluster:
        master = await cluster.wait_master()
        addr = cluster.addr(master)
        resp = await cluster.remoting.invoke(addr, create_topic_request(TOPIC, QUEUES), 10)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        answers, sent = await pipeline(addr, lambda: cluster.kill(master), kill_after=2000, limit=200_000)
        await cluster.wait_dead(master)
        new = cluster.addr(await cluster.wait_master(exclude={master}, timeout=30))
        # Let the new master's consume queues catch up with everything it committed.
        with trio.fail_after(30):
            while True:
                before = len(await stored_messages(cluster.remoting, new))
                await trio.sleep(1)
                stored = await stored_messages(cluster.remoting, new)
                if len(stored) == before:
                    break
        by_number = {}
        for rec in stored:
            n = int(rec.body[3:9])
            assert n not in by_number, f"message {n} stored twice"
            by_number[n] = rec
        assert all(n < sent for n in by_number), "stored something never sent"
        ok = {n: r for n, r in answers.items() if r.code == ResponseCode.SUCCESS}
        assert len(ok) >= 2000 and sent > len(ok)  # some were in flight when the master died
        for n, r in ok.items():
            rec = by_number.get(n)
            assert rec is not None, f"message {n} was answered SUCCESS but is not on the new master"
            _, phy = parse_offset_msg_id(r.ext_fields["msgId"])
            assert (rec.queue_id, rec.queue_offset, rec.physical_offset) == \
                (int(r.ext_fields["queueId"]), int(r.ext_fields["queueOffset"]), phy)
        # Answered otherwise (the kill's errors) or not at all: at most what was in flight.
        unanswered_but_stored = [n for n in by_number if n not in ok]
        assert len(unanswered_but_stored) <= WINDOW + len([r for r in answers.values() if r.code !=
                                                           ResponseCode.SUCCESS])
        # and the group takes writes again, continuing the queues
        resp = await cluster.remoting.invoke(new, send(sent), 10)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        q = sent % QUEUES
        assert int(resp.ext_fields["queueOffset"]) == 1 + max(r.queue_offset for r in stored if r.queue_id == q)
