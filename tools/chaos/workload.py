# Owns the clients the nemesis run drives and the history they record: every
# send (unique body, when it started and ended, and its outcome), every
# acknowledged offset commit, every delivery.  The checker (checker.py) judges
# the history against what the brokers hold afterwards.
#
#   producers   Python client sync sends (several in flight), some with a
#               delay level, some marked to be failed once by the push
#               consumer (so they come back through %RETRY%); optionally the
#               stock C++ client (stock_producer.py in the compat venv)
#   push        a push consumer group (offsets committed by the client)
#   pull        a pull consumer that commits each queue's offset after every
#               batch and records the commits the broker acknowledged
#   metadata    a topic and a subscription group created now and then
#
# Outcomes: "ok" (SEND_OK, with the queue and offset it named), "refused"
# (every attempt was refused before anything was appended: not the master,
# catching up, no route, busy, disk full) and "unknown" (a timeout, a lost
# connection, FLUSH_SLAVE_TIMEOUT, a leader that lost its term with the entry
# in flight: the message may or may not be in the log).
import collections
import json
import os
import re
import subprocess
import tempfile

import attrs
import trio

import broker.client as client
from broker.remoting.client import RemotingClient
from tools.mqadmin.adminapi import AdminError, MQAdmin

TOPIC = "ChaosTopic"
QUEUES = 4
PRODUCER_GROUP, PUSH_GROUP, PULL_GROUP = "chaos_pg", "chaos_push", "chaos_pull"
RETRY_MARK, DELAY_MARK = b"|retry", b"|delay"
# A refusal that proves nothing was appended (client errors' remarks).
_REFUSED = re.compile(r"not the DLedger leader|catching up|broker busy|full; writes refused|no route|"
                      r"does not accept writes|TOPIC_NOT_EXIST", re.I)


@attrs.define
class Send:
    body: bytes
    client: str
    start: float
    end: float | None = None
    outcome: str = "pending"  # ok | refused | unknown | pending
    queue_id: int | None = None
    queue_offset: int | None = None
    error: str | None = None


@attrs.define
class History:
    t0: float
    sends: list[Send] = attrs.Factory(list)
    ack_times: list[float] = attrs.Factory(list)
    # (group, queue_id) -> the highest offset commit the broker acknowledged
    commits: dict[tuple[str, int], int] = attrs.Factory(dict)
    push_deliveries: collections.Counter = attrs.Factory(collections.Counter)
    pull_deliveries: collections.Counter = attrs.Factory(collections.Counter)
    retried_first: set[bytes] = attrs.Factory(set)   # failed once on purpose by the push handler
    topics_created: list[str] = attrs.Factory(list)
    groups_created: list[str] = attrs.Factory(list)
    errors: collections.Counter = attrs.Factory(collections.Counter)

    def rel(self, t: float) -> float:
        return round(t - self.t0, 2)


def _classify(exc: BaseException) -> str:
    errors = exc.errors if isinstance(exc, client.SendFailedError) else [exc]
    for e in errors:
        if isinstance(e, (client.NoRouteError, client.BrokerBusyError)):
            continue
        if isinstance(e, client.BrokerError) and _REFUSED.search(e.remark or ""):
            continue
        return "unknown"
    return "refused"


@attrs.define(eq=False)
class Workload:
    namesrv_addr: str
    history: History
    senders: int = 8
    send_timeout: float = 3.0
    _seq: int = 0

    def _body(self, who: str, mark: bytes = b"") -> bytes:
        self._seq += 1
        return f"{who}-{self._seq:08d}".encode() + mark

    async def produce(self, stop: trio.Event) -> None:
        async with client.open_producer(PRODUCER_GROUP, namesrv_addr=self.namesrv_addr,
                                        timeout=self.send_timeout) as producer:
            async with trio.open_nursery() as nursery:
                for i in range(self.senders):
                    nursery.start_soon(self._sender, producer, i, stop)

    async def _sender(self, producer, i: int, stop: trio.Event) -> None:
        while not stop.is_set():
            n = self._seq
            mark = RETRY_MARK if n % 53 == 0 else DELAY_MARK if n % 41 == 0 else b""
            body = self._body(f"py{i}", mark)
            s = Send(body, "py", trio.current_time())
            self.history.sends.append(s)
            msg = client.Message(TOPIC, body, keys=[body.decode()], delay_level=1 if mark == DELAY_MARK else 0)
            try:
                r = await producer.send(msg, timeout=self.send_timeout)
            except client.ClientError as e:
                s.end, s.outcome, s.error = trio.current_time(), _classify(e), str(e)[:300]
                self.history.errors[type(e).__name__] += 1
                if s.outcome == "refused":
                    await trio.sleep(0.05)  # a route refresh is under way; don't spin
                continue
            s.end = trio.current_time()
            if r.status == client.SendStatus.SEND_OK:
                s.outcome, s.queue_id, s.queue_offset = "ok", r.queue.queue_id, r.queue_offset
                self.history.ack_times.append(s.end)
            else:
                s.outcome, s.error = "unknown", r.status.name

    # --- the stock C++ client ---------------------------------------------------------

    async def produce_stock(self, compat_python: str, stop: trio.Event) -> None:
        """Run the stock client (rocketmq==0.4.4) in its venv; it prints one
        JSON line per send, read as it comes."""
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stock_producer.py")
        home = tempfile.mkdtemp(prefix="chaos-cpp-home-")
        proc = await trio.lowlevel.open_process(
            [compat_python, script, self.namesrv_addr, TOPIC], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env={**os.environ, "HOME": home})
        pending: dict[str, Send] = {}
        buf = b""
        try:
            async with trio.open_nursery() as nursery:
                async def stopper():
                    await stop.wait()
                    proc.terminate()
                nursery.start_soon(stopper)
                while True:
                    chunk = await proc.stdout.receive_some(65536)
                    if not chunk:
                        break
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        self._on_stock_line(json.loads(line), pending)
                nursery.cancel_scope.cancel()
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
            for s in pending.values():  # in flight when the client stopped
                s.end, s.outcome, s.error = trio.current_time(), "unknown", "stock client stopped"

    def _on_stock_line(self, rec: dict, pending: dict[str, Send]) -> None:
        body = rec["body"]
        if rec["event"] == "start":
            s = pending[body] = Send(body.encode(), "cpp", trio.current_time())
            self.history.sends.append(s)
            return
        s = pending.pop(body)
        s.end = trio.current_time()
        if rec.get("status") == "OK":
            s.outcome, s.queue_offset = "ok", int(rec["offset"])
            self.history.ack_times.append(s.end)
        else:
            # Always unknown: the C++ client retries internally and reports
            # only its last attempt's error ("No route info" after an earlier
            # attempt that timed out but was stored: the checker saw one).
            s.outcome, s.error = "unknown", rec.get("error") or rec.get("status") or "?"
            self.history.errors["stock: " + (rec.get("error") or rec.get("status") or "?")[:70]] += 1

    # --- consumers -----------------------------------------------------------------------

    async def push_consume(self, stop: trio.Event) -> None:
        h = self.history

        async def handler(msgs):
            for m in msgs:
                body = bytes(m.body)
                h.push_deliveries[body] += 1
                if body.endswith(RETRY_MARK) and body not in h.retried_first:
                    h.retried_first.add(body)
                    return client.ConsumeStatus.RECONSUME_LATER
            return client.ConsumeStatus.CONSUME_SUCCESS

        async with client.open_push_consumer(PUSH_GROUP, namesrv_addr=self.namesrv_addr,
                                             subscriptions={TOPIC: "*"}, handler=handler,
                                             consume_from=client.ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                                             retry_delay_level=1, persist_interval=1.0, rebalance_interval=5.0):
            await stop.wait()

    async def pull_consume(self, stop: trio.Event) -> None:
        h = self.history
        async with client.open_pull_consumer(PULL_GROUP, namesrv_addr=self.namesrv_addr) as consumer:
            queues: list = []
            while not queues and not stop.is_set():
                try:
                    queues = await consumer.fetch_queues(TOPIC)
                except client.ClientError:
                    await trio.sleep(0.2)
            offsets = {mq.queue_id: 0 for mq in queues}
            while not stop.is_set():
                progressed = False
                for mq in queues:
                    try:
                        r = await consumer.pull(mq, offsets[mq.queue_id], max_nums=32)
                        for m in r.messages:
                            h.pull_deliveries[bytes(m.body)] += 1
                        if r.next_begin_offset != offsets[mq.queue_id]:
                            progressed = True
                            offsets[mq.queue_id] = r.next_begin_offset
                            await consumer.update_offset(mq, r.next_begin_offset)
                            key = (PULL_GROUP, mq.queue_id)
                            h.commits[key] = max(h.commits.get(key, 0), r.next_begin_offset)
                    except client.ClientError as e:
                        h.errors["pull:" + type(e).__name__] += 1
                        await trio.sleep(0.1)
                if not progressed:
                    await trio.sleep(0.2)

    # --- metadata ------------------------------------------------------------------------

    async def create_metadata(self, admin: MQAdmin, master_addr: str, n: int) -> None:
        """A topic and a subscription group; recorded only when acknowledged."""
        topic, group = f"ChaosCreated{n}", f"chaos_created_{n}"
        try:
            await admin.create_topic(master_addr, topic, 2, 2, 6, False)
            self.history.topics_created.append(topic)
            await admin.update_sub_group(master_addr, {"groupName": group, "consumeEnable": True,
                                                       "retryQueueNums": 1, "retryMaxTimes": 16})
            self.history.groups_created.append(group)
        except AdminError as e:
            self.history.errors["admin:" + type(e).__name__] += 1


def new_admin(remoting: RemotingClient, namesrv_addr: str) -> MQAdmin:
    return MQAdmin(remoting, namesrv_addr, timeout=5.0)
