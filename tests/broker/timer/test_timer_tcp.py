# Timer messages end to end in one process over TCP on 127.0.0.1: a name
# server and a one-member DLedger broker (serve_broker), the Python client
# library's producer (Message(deliver_at_ms=...), Producer.recall) and pull
# consumer (long polls), and raw RECALL_MESSAGE requests for the refusals.
# Visibility is checked with long polls: a message that became visible
# before its time would end the poll before it.  Lateness is printed, not
# asserted.
import time
from contextlib import asynccontextmanager

import pytest
import trio

from broker.client import Message, PullStatus, open_producer, open_pull_consumer
from broker.client.errors import BrokerError, ClientError
from broker.client.model import MessageQueue
from broker.common.values import TopicConfig
from broker.config import BrokerConfig
from broker.namesrv.service import NamesrvConfig, serve_namesrv
from broker.remoting.client import open_remoting_client
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.server import serve_broker
from broker.store.timer import RecallHandle
from tools.localcluster import free_ports

TOPIC = "TimerT"


def now_ms() -> int:
    return int(time.time() * 1000)


@asynccontextmanager
async def timer_bed(tmp_path, **conf):
    ns_port, peer_port = free_ports(2)
    async with trio.open_nursery() as nursery:
        ns = await nursery.start(serve_namesrv, NamesrvConfig(listen_port=ns_port, bind_address="127.0.0.1"))
        cfg, _ = BrokerConfig.from_dict({
            "brokerName": "timerb", "brokerIP1": "127.0.0.1", "listenPort": "0", "dLegerGroup": "timerb",
            "dLegerPeers": f"n0-127.0.0.1:{peer_port}", "dLegerSelfId": "n0", "storePathRootDir": str(tmp_path / "n0"),
            "flushDiskType": "ASYNC_FLUSH", "namesrvAddr": f"127.0.0.1:{ns_port}", "registerNameServerPeriod": "10000",
            "messageDelayLevel": "1s 2s", **conf})
        broker = await nursery.start(lambda task_status: serve_broker(cfg, bind_host="127.0.0.1",
                                                                      task_status=task_status))
        await broker.gate.wait_writable(timeout=20)
        await broker.metadata.update_topic(TopicConfig(TOPIC, 1, 1, 6))

        def known(routes) -> bool:
            r = routes.topic_route(TOPIC)
            return r is not None and any(b.master_addr == broker.broker_addr for b in r.broker_datas)
        with trio.fail_after(20):
            await ns.wait_until(known)
        ns_addr = f"127.0.0.1:{ns_port}"
        async with open_producer("timer_pg", namesrv_addr=ns_addr) as producer, \
                open_pull_consumer("timer_cg", namesrv_addr=ns_addr) as consumer:
            yield broker, producer, consumer
        nursery.cancel_scope.cancel()


class Reader:
    """Reads the topic's one queue in order with long polls, noting when
    each message became visible to the consumer."""

    def __init__(self, consumer, broker_name="timerb"):
        self.consumer, self.mq, self.offset = consumer, MessageQueue(TOPIC, broker_name, 0), 0
        self.seen: list[tuple[bytes, int, object]] = []  # (body, visible at ms, MessageExt)

    async def until(self, body: bytes, timeout: float = 20) -> int:
        """Read until `body` arrived; its index in `seen`."""
        with trio.fail_after(timeout):
            while True:
                for i, (b, _, _) in enumerate(self.seen):
                    if b == body:
                        return i
                res = await self.consumer.pull(self.mq, self.offset, block=5.0, timeout=10)
                at = now_ms()
                assert res.status in (PullStatus.FOUND, PullStatus.NO_NEW_MSG), res
                self.seen += [(m.body, at, m) for m in res.messages]
                self.offset = res.next_begin_offset

    def bodies(self) -> list[bytes]:
        return [b for b, _, _ in self.seen]


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p / 100))] if values else None


async def test_timer_messages_over_tcp(tmp_path):
    async with timer_bed(tmp_path) as (broker, producer, consumer):
        timer = broker.processors.timer
        reader = Reader(consumer)
        # delivered at the time asked, not before
        due = now_ms() + 1500
        r = await producer.send(Message(TOPIC, b"at-time", deliver_at_ms=due))
        assert r.recall_handle and RecallHandle.decode(r.recall_handle).message_id == r.msg_id
        # a time in the past: stored to the topic at once, no recall handle
        past = await producer.send(Message(TOPIC, b"past", deliver_at_ms=now_ms() - 1000))
        assert past.recall_handle is None and past.queue_offset == 0
        assert (await reader.until(b"past")) == 0
        # recalled before its time: never delivered (the barrier after it is due later)
        doomed = await producer.send(Message(TOPIC, b"recalled", deliver_at_ms=due + 300))
        await producer.send(Message(TOPIC, b"barrier", deliver_at_ms=due + 600))
        assert await producer.recall(TOPIC, doomed.recall_handle) == doomed.msg_id
        with pytest.raises(BrokerError) as err:  # twice: not pending any more
            await producer.recall(TOPIC, doomed.recall_handle)
        assert err.value.code == ResponseCode.ILLEGAL_OPERATION
        i = await reader.until(b"at-time")
        body, visible_at, ext = reader.seen[i]
        assert visible_at >= due and ext.store_timestamp >= due
        assert ext.properties["TIMER_DELIVER_MS"] == str(due)
        await reader.until(b"barrier")
        assert reader.bodies() == [b"past", b"at-time", b"barrier"]
        print(f"\ntimer over TCP: visible {visible_at - due} ms after its time (stored +{ext.store_timestamp - due})")
        # beyond timerMaxDelaySec (3 days): refused with upstream's wording
        with pytest.raises(ClientError) as err:
            await producer.send(Message(TOPIC, b"far", deliver_at_ms=now_ms() + 4 * 86400 * 1000))
        assert "the delay time should not be bigger than the max delay 259200000ms" in str(err.value)
        # delay levels still work (level 1 = 1 s here)
        sent = now_ms()
        await producer.send(Message(TOPIC, b"delayed", delay_level=1))
        i = await reader.until(b"delayed")
        assert reader.seen[i][1] >= sent + 1000
        assert timer.delivered == 2 and timer.recalled == 1 and timer.pending == 0


async def test_recall_refusals_over_remoting(tmp_path):
    async with timer_bed(tmp_path) as (broker, producer, _consumer):
        r = await producer.send(Message(TOPIC, b"x", deliver_at_ms=now_ms() + 60_000))
        h = RecallHandle.decode(r.recall_handle)

        def recall(topic=TOPIC, handle=r.recall_handle, **extra):
            return RemotingCommand.create_request(RequestCode.RECALL_MESSAGE, {
                "producerGroup": "timer_pg", "topic": topic, "recallHandle": handle, **extra})
        other = RecallHandle(topic=TOPIC, broker_name="elsewhere", timestamp=h.timestamp,
                             message_id=h.message_id).encode()
        gone = RecallHandle(topic=TOPIC, broker_name="timerb", timestamp=str(now_ms() - 1),
                            message_id=h.message_id).encode()
        unknown = RecallHandle(topic=TOPIC, broker_name="timerb", timestamp=h.timestamp,
                               message_id="0A0000000000000000000000DEADBEEF").encode()
        await broker.metadata.update_topic(TopicConfig("OtherT", 1, 1, 6))
        cases = [
            (recall(handle="not base64 !"), ResponseCode.ILLEGAL_OPERATION, "recall handle is invalid"),
            (recall(topic="OtherT"), ResponseCode.ILLEGAL_OPERATION, "recall failed, topic not match"),
            (recall(topic="NoSuchT"), ResponseCode.TOPIC_NOT_EXIST, "recall failed, the topic[NoSuchT] not exist"),
            (recall(handle=other), ResponseCode.ILLEGAL_OPERATION, "recall failed, broker service not available"),
            (recall(handle=gone), ResponseCode.ILLEGAL_OPERATION, "recall failed, timestamp invalid"),
            (recall(handle=unknown), ResponseCode.ILLEGAL_OPERATION, "no pending timer message"),
            (recall(), ResponseCode.SUCCESS, None),
            (recall(), ResponseCode.ILLEGAL_OPERATION, "no pending timer message"),
        ]
        async with open_remoting_client() as rc:
            for req, code, remark in cases:
                resp = await rc.invoke(broker.broker_addr, req, 10)
                assert resp.code == code, (req.ext_fields, resp.code, resp.remark)
                if remark:
                    assert remark in resp.remark
                else:
                    assert resp.ext_fields["msgId"] == r.msg_id
            # the send answer carries the handle in its header
            send = RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, {
                "a": "pg", "b": TOPIC, "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": now_ms(), "h": 0,
                "i": "UNIQ_KEY\x01RAW1\x02TIMER_DELAY_SEC\x0130\x02", "j": 0, "k": False, "m": False}, body=b"raw")
            resp = await rc.invoke(broker.broker_addr, send, 10)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            assert RecallHandle.decode(resp.ext_fields["recallHandle"]).message_id == "RAW1"
            # nobody sends to the timer topic directly
            send.ext_fields["b"] = "rmq_sys_wheel_timer"
            resp = await rc.invoke(broker.broker_addr, send, 10)
            assert resp.code == ResponseCode.NO_PERMISSION
        assert broker.processors.timer.pending == 1  # RAW1; x was recalled


async def test_lateness_under_load(tmp_path):
    """400 timer messages sent from 16 tasks, due over ~1.5 s: each is
    delivered no earlier than its time; lateness (delivery store time and
    consumer visibility, minus the time asked) is printed."""
    async with timer_bed(tmp_path) as (broker, producer, consumer):
        n, base = 400, now_ms() + 1000
        asked = {}

        async def send_some(k):
            for i in range(k, n, 16):
                at = base + (i * 1500) // n
                asked[f"L{i}".encode()] = at
                await producer.send(Message(TOPIC, f"L{i}".encode(), deliver_at_ms=at))
        async with trio.open_nursery() as nursery:
            for k in range(16):
                nursery.start_soon(send_some, k)
        reader = Reader(consumer)
        with trio.fail_after(30):
            while len(reader.seen) < n:
                res = await consumer.pull(reader.mq, reader.offset, block=5.0, timeout=10)
                at = now_ms()
                reader.seen += [(m.body, at, m) for m in res.messages]
                reader.offset = res.next_begin_offset
        assert sorted(reader.bodies()) == sorted(asked)
        stored = [ext.store_timestamp - asked[b] for b, _, ext in reader.seen]
        visible = [at - asked[b] for b, at, _ in reader.seen]
        assert min(stored) >= 0 and min(visible) >= 0  # never early
        print(f"\ntimer lateness, {n} messages: stored p50 {pct(stored, 50)} ms p99 {pct(stored, 99)} ms max "
              f"{max(stored)} ms; visible to a long-polling consumer p50 {pct(visible, 50)} ms p99 "
              f"{pct(visible, 99)} ms")
