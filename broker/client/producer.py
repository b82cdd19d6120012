# Owns the producer (Java's DefaultMQProducer): send (the awaited, "sync"
# send), send_async (fire and get a callback), send_oneway, send_batch
# (SEND_BATCH_MESSAGE, body per spec §1.10), send_orderly (a sharding key
# hashed to a queue), queue selection, and retries.  Transactional sends
# build on it in transaction.py.
#
#   async with open_producer("pg", namesrv_addr=ns) as producer:
#       result = await producer.send(Message("T", b"body", tags="A"))
#
# Retries (retryTimesWhenSendFailed = 2, as Java): a retriable failure
# (errors.py) sends again, preferring another broker.  A failure that says
# the route is stale -- connection refused or lost, timeout, SERVICE_NOT_
# AVAILABLE from a node that stopped being the DLedger leader -- marks that
# address bad for this send and refreshes the route at once; if the name
# servers still show no other master, the send waits for the route to change
# (the new leader registers as soon as it takes writes), bounded by the
# send's deadline.  That is what makes failover take about a second instead
# of Java's 30 s route poll.  A retried send keeps its UNIQ_KEY, so a
# duplicate caused by a lost response is recognisable downstream.  With
# several broker groups, latency fault tolerance (latency.py, on by default)
# keeps sends away from a group that just failed or answered slowly.
#
# Per-send cost.  A send's request is a wire.SendRequest,
# its header assembled from pre-encoded pieces (byte-identical to the
# general encoding, tests/broker/client/test_wire.py); send() and
# send_async() make their first attempt inline when nothing has to wait
# (cached route, current heartbeat, open connection) and hand a failed one
# to _send, which makes the rest exactly as for any other send.
import base64
import itertools
import logging
import math
import time
import zlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import anyio
import anyio.abc

from broker.client.errors import (
    BrokerBusyError,
    BrokerUnavailableError,
    ClientClosedError,
    ClientError,
    ConnectionFailedError,
    InvalidMessageError,
    NoRouteError,
    SendFailedError,
    check_response,
)
from broker.client.instance import ROUTE_INTERVAL, ClientInstance, TopicRoute, open_client_instance
from broker.client.latency import LatencyFaultTolerance
from broker.client.model import (
    DEFAULT_MAX_MESSAGE_SIZE,
    Message,
    MessageQueue,
    SendResult,
    SendStatus,
    send_result,
)
from broker.client.wire import SendRequest
from broker.common.msgid import UniqKeyGenerator
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import LocalProtocolError
from consumequeue import batch as batches
from consumequeue import record as M
from native.hashing import java_hash_str

log = logging.getLogger("ledgermq.client.producer")

Selector = Callable[[list[MessageQueue], Message], MessageQueue]
SendCallback = Callable[[SendResult | None, ClientError | None], object]

DEFAULT_SEND_TIMEOUT = 3.0  # sendMsgTimeout
DEFAULT_RETRIES = 2  # retryTimesWhenSendFailed
COMPRESS_OVER = 4096  # compressMsgBodyOverHowmuch
COMPRESS_LEVEL = 5
AUTO_CREATE_TOPIC_KEY = "TBW102"

_STATUS = {ResponseCode.SUCCESS: SendStatus.SEND_OK, ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
           ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
           ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE}
_SENT_CODES = tuple(_STATUS)
_V2 = int(RequestCode.SEND_MESSAGE_V2)
_NO_ADDRS: frozenset = frozenset()


class Producer:
    """Use open_producer(); every method is a coroutine (asyncio or trio) except
    send_async, which starts the send in the producer's nursery."""

    def __init__(self, instance: ClientInstance, nursery: anyio.abc.TaskGroup, group: str, *,
                 send_timeout: float = DEFAULT_SEND_TIMEOUT, retries: int = DEFAULT_RETRIES,
                 max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE, compress_over: int | None = COMPRESS_OVER,
                 default_topic_queue_nums: int = 4, latency_fault_enable: bool = True) -> None:
        self.instance = instance
        self.group = group
        self.send_timeout = send_timeout
        self.retries = retries
        self.max_message_size = max_message_size
        self.compress_over = compress_over
        self.default_topic_queue_nums = default_topic_queue_nums
        self._nursery = nursery
        self._uniq = UniqKeyGenerator()
        self._counter = itertools.count()
        self._pending_async = 0
        self._async_done = anyio.Event()
        self.faults = LatencyFaultTolerance(latency_fault_enable)
        self.closed = False

    # --- public API -----------------------------------------------------------------

    async def send(self, msg: Message, *, selector: Selector | None = None,
                   timeout: float | None = None) -> SendResult:
        """Send and wait for the broker's answer (the entry is committed on
        a quorum when status is SEND_OK)."""
        uniq, req = self._request(msg)
        # The first attempt inline when nothing has to wait (a cached route
        # with a master, a connection our heartbeat went over): _send's
        # first turn without its closures and clock reads.  Anything else,
        # and the attempts after a failure, are _send's.
        inst = self.instance
        route = inst.cached_route(msg.topic)
        if route is not None and route.write_queues and not self.closed:
            mq = self._choose(route, msg, selector, _NO_ADDRS, None)
            addr = route.master(mq.broker_name)
            if addr is not None and inst.heartbeat_current(addr):
                inst.auto_create_topics.add(msg.topic)
                timeout = self.send_timeout if timeout is None else timeout
                request = req.for_queue(mq.queue_id, mq.broker_name, _V2)
                sent_at = time.monotonic()
                try:
                    resp = await inst.invoke(addr, request, timeout, ok=None)
                    if resp.code not in _SENT_CODES:
                        check_response(resp, addr, _V2, _SENT_CODES)
                except ClientError as e:
                    now = time.monotonic()
                    if isinstance(e, (ConnectionFailedError, BrokerUnavailableError)):
                        self.faults.record(mq.broker_name, 0.0, True, now, addr)
                    return await self._send(msg.topic, msg, lambda q: self._for_queue(req, q, _V2),
                                            lambda r, q: self._result1(r, q, uniq), selector,
                                            timeout - (now - sent_at), failed=(e, route, mq))
                if self.faults.enabled:
                    now = time.monotonic()
                    self.faults.record(mq.broker_name, now - sent_at, False, now, addr)
                return self._result1(resp, mq, uniq)
        return await self._send(msg.topic, msg, lambda mq: self._for_queue(req, mq, RequestCode.SEND_MESSAGE_V2),
                                lambda resp, mq: self._result1(resp, mq, uniq), selector, timeout)

    async def send_orderly(self, msg: Message, sharding_key, *, timeout: float | None = None) -> SendResult:
        """Send to the queue `sharding_key` hashes to (SelectMessageQueueByHash:
        Java's hashCode of the key's text, modulo the write queues), so the
        messages of one key keep their order in one queue.  A failed send is
        retried on the same queue, never another one."""
        return await self.send(msg, selector=hash_selector(sharding_key), timeout=timeout)

    async def send_oneway(self, msg: Message, *, selector: Selector | None = None,
                          timeout: float | None = None) -> None:
        """Send without waiting for an answer (no guarantee it was stored)."""
        _uniq, req = self._request(msg)
        await self._send(msg.topic, msg, lambda mq: self._for_queue(req, mq, RequestCode.SEND_MESSAGE_V2),
                         None, selector, timeout)

    async def recall(self, topic: str, recall_handle: str, *, timeout: float | None = None) -> str:
        """RECALL_MESSAGE: cancel a timer message before it is delivered
        (`recall_handle` from its SendResult).  Returns the message id;
        raises BrokerError when the broker refuses (delivered already,
        unknown, a handle for another topic)."""
        if self.closed:
            raise ClientClosedError("the producer is closed")
        broker_name = _handle_broker(recall_handle)
        timeout = self.send_timeout if timeout is None else timeout
        deadline = anyio.current_time() + timeout
        route = await self.instance.wait_route(topic, lambda r: r.master(broker_name) is not None, deadline)
        addr = route.master(broker_name)
        request = RemotingCommand.create_request(RequestCode.RECALL_MESSAGE, {
            "producerGroup": self.group, "topic": topic, "recallHandle": recall_handle, "brokerName": broker_name})
        resp = await self.instance.invoke(addr, request, max(0.0, deadline - anyio.current_time()))
        return resp.ext_fields.get("msgId", "")

    async def send_batch(self, msgs: Sequence[Message], *, selector: Selector | None = None,
                         timeout: float | None = None) -> list[SendResult]:
        """Send messages of one topic as one SEND_BATCH_MESSAGE: they land
        in one queue, at consecutive offsets, all or none.  One SendResult
        per message."""
        msgs = list(msgs)
        if not msgs:
            raise InvalidMessageError("empty batch")
        topic = msgs[0].topic
        items, uniqs = [], []
        for m in msgs:
            if m.topic != topic:
                raise InvalidMessageError(f"a batch holds one topic; got {topic!r} and {m.topic!r}")
            if m.delay_level:
                raise InvalidMessageError("a batch cannot carry delayed messages (the broker refuses them)")
            m.check(self.max_message_size)
            uniq = self._uniq.next()
            uniqs.append(uniq)
            items.append(batches.BatchItem(m.body, m.wire_properties(uniq), m.flag))
        body = batches.encode_batch(items)
        if len(body) > self.max_message_size:
            raise InvalidMessageError(f"the batch is {len(body)} bytes, over the {self.max_message_size} limit")
        req = self._header_request(topic, body, sysflag=0, flag=0, props="", batch=True)
        return await self._send(topic, msgs[0], lambda mq: self._for_queue(req, mq, RequestCode.SEND_BATCH_MESSAGE),
                                lambda resp, mq: self._result(resp, mq, *uniqs), selector, timeout)

    def send_async(self, msg: Message, callback: SendCallback | None = None, *,
                   selector: Selector | None = None, timeout: float | None = None) -> None:
        """Start sending `msg` and return at once; `callback(result, error)`
        runs in the producer's event loop when the send ends (an async
        callback is awaited in a task of its own).  Many async sends share
        one pipelined connection per broker.  When the route and the
        connection are ready, the request goes out now and its answer is
        handled by the connection's reader: no task per send.  The first
        attempt that fails retriably, and any send that must wait first
        (route, dial, heartbeat, a full outbox), runs in a task as send()."""
        if self.closed:
            raise ClientClosedError("the producer is closed")
        self._pending_async += 1
        try:
            submitted = self._submit(msg, callback, selector, timeout)
        except LocalProtocolError:  # not encodable: send() says so, to the callback
            submitted = False
        if not submitted:
            self._nursery.start_soon(self._send_and_call, msg, callback, selector, timeout)

    def _submit(self, msg: Message, callback, selector, timeout) -> bool:
        """send_async's first attempt without a task, if nothing has to wait."""
        inst = self.instance
        route = inst.cached_route(msg.topic)
        if route is None or not route.write_queues:
            return False
        try:
            uniq, req = self._request(msg)
            mq = self._choose(route, msg, selector, set(), None)
        except ClientError:
            return False  # send() raises it again, in the task, for the callback
        addr = route.master(mq.broker_name)
        if addr is None or not inst.heartbeat_current(addr):
            return False
        timeout = self.send_timeout if timeout is None else timeout
        request = self._for_queue(req, mq, RequestCode.SEND_MESSAGE_V2)
        started = time.monotonic()

        def done(resp: RemotingCommand | None, error: ClientError | None) -> None:
            if error is None:
                try:
                    check_response(resp, addr, request.code, _SENT_CODES)
                except ClientError as e:
                    error = e
            if error is not None:
                if self.faults.enabled and isinstance(error, (ConnectionFailedError, BrokerUnavailableError)):
                    self.faults.record(mq.broker_name, 0.0, True, time.monotonic(), addr)
                left = timeout - (time.monotonic() - started)
                if error.retriable and self.retries > 0 and left > 0:  # the rest of send()'s attempts
                    self._nursery.start_soon(self._send_and_call, msg, callback, selector, left,
                                             (uniq, req, error, route, mq))
                    return
                self._async_ended(callback, None, SendFailedError(msg.topic, [error]))
                return
            if self.faults.enabled:
                now = time.monotonic()
                self.faults.record(mq.broker_name, now - started, False, now, addr)
            self._async_ended(callback, self._result1(resp, mq, uniq), None)

        inst.auto_create_topics.add(msg.topic)
        return inst.submit(addr, request, timeout, done)

    def _async_ended(self, callback, result, error) -> None:
        """A send_async ended in its connection's reader: the callback, then
        the count drain() waits on (after an async callback's own task)."""
        if callback is None:
            if error is not None:
                log.warning("async send failed: %s", error)
            self._async_done_one()
            return
        try:
            out = callback(result, error)
        except Exception:
            self._async_done_one()
            raise  # (the connection logs it)
        if hasattr(out, "__await__"):
            async def finish():
                try:
                    await out
                finally:
                    self._async_done_one()
            self._nursery.start_soon(finish)
            return
        self._async_done_one()

    def _async_done_one(self) -> None:
        self._pending_async -= 1
        if not self._pending_async:
            self._async_done.set()
            self._async_done = anyio.Event()

    async def drain(self) -> None:
        """Wait until every send_async so far has ended."""
        while self._pending_async:
            await self._async_done.wait()

    # --- internals ------------------------------------------------------------------

    async def _send_and_call(self, msg, callback, selector, timeout, failed: tuple | None = None) -> None:
        """send_async in a task: the whole send(), or (`failed`: uniq, the
        request, the error, route and queue of the first attempt _submit
        made) the rest of its attempts."""
        try:
            try:
                if failed is None:
                    result = await self.send(msg, selector=selector, timeout=timeout)
                else:
                    uniq, req, first, route, mq = failed
                    result = await self._send(msg.topic, msg,
                                              lambda q: self._for_queue(req, q, RequestCode.SEND_MESSAGE_V2),
                                              lambda resp, q: self._result1(resp, q, uniq), selector, timeout,
                                              failed=(first, route, mq))
                error = None
            except ClientError as e:
                result, error = None, e
            if callback is not None:
                out = callback(result, error)
                if hasattr(out, "__await__"):
                    await out
            elif error is not None:
                log.warning("async send to %s failed: %s", msg.topic, error)
        finally:
            self._async_done_one()

    async def send_as(self, msg: Message, uniq_key: str, *, extra_properties: dict | None = None, sysflag: int = 0,
                      selector: Selector | None = None, timeout: float | None = None) -> SendResult:
        """send() of a message whose UNIQ_KEY the caller chose already (a
        gateway relaying another client's message id: broker/proxy), with
        the properties and sysflag a timed or transactional send adds; the
        attempts and retries are send()'s."""
        uniq, req = self._request(msg, extra_properties, sysflag, uniq_key=uniq_key)
        return await self._send(msg.topic, msg, lambda q: self._for_queue(req, q, _V2),
                                lambda resp, q: self._result1(resp, q, uniq), selector, timeout)

    def _request(self, msg: Message, extra_properties: dict | None = None,
                 sysflag: int = 0, uniq_key: str | None = None) -> tuple[str, SendRequest]:
        """The V2 request without its queue, built once per message
        (`extra_properties` and `sysflag`: what a transactional send adds)."""
        msg.check(self.max_message_size)
        uniq = uniq_key or self._uniq.next()
        body = msg.body
        if self.compress_over is not None and len(body) > self.compress_over:
            body, sysflag = zlib.compress(body, COMPRESS_LEVEL), sysflag | M.COMPRESSED_FLAG
        props = msg.wire_properties(uniq)
        if extra_properties:
            props.update(extra_properties)
        return uniq, self._header_request(msg.topic, body, sysflag, msg.flag, M.properties_to_string(props),
                                          batch=False)

    def _header_request(self, topic: str, body: bytes, sysflag: int, flag: int, props: str,
                        batch: bool) -> SendRequest:
        # wire.py assembles the header from pre-encoded pieces (the same
        # bytes as the RemotingCommand of these fields: a send pays this).
        return SendRequest(int(RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2),
                           self.group, topic, self.default_topic_queue_nums, sysflag, int(time.time() * 1000), flag,
                           props, batch, body)

    @staticmethod
    def _for_queue(req: SendRequest, mq: MessageQueue, code: int) -> SendRequest:
        """req addressed to mq.  The request belongs to this one send, and
        each attempt is encoded before the next one readdresses it, so it
        is readdressed in place."""
        return req.for_queue(mq.queue_id, mq.broker_name, int(code))

    def _result(self, resp: RemotingCommand, mq: MessageQueue, *uniqs: str) -> list[SendResult]:
        f = resp.ext_fields
        queue = MessageQueue(mq.topic, mq.broker_name, int(f.get("queueId", mq.queue_id)))
        first = int(f.get("queueOffset", -1))
        ids = (f.get("msgId") or "").split(",")
        status = _STATUS[resp.code]
        return [SendResult(status=status, msg_id=uniq, offset_msg_id=ids[i] if i < len(ids) else "", queue=queue,
                           queue_offset=first + i if first >= 0 else -1,
                           region_id=f.get("MSG_REGION")) for i, uniq in enumerate(uniqs)]

    def _result1(self, resp: RemotingCommand, mq: MessageQueue, uniq: str) -> SendResult:
        """_result of a one-message send."""
        f = resp.ext_fields
        queue_id = f.get("queueId")
        queue = mq if queue_id is None or queue_id == str(mq.queue_id) else \
            MessageQueue(mq.topic, mq.broker_name, int(queue_id))
        offset = int(f.get("queueOffset", -1))
        return send_result(_STATUS[resp.code], uniq, f.get("msgId") or "", queue, offset if offset >= 0 else -1,
                           f.get("MSG_REGION"), f.get("recallHandle"))

    def _choose(self, route: TopicRoute, msg: Message, selector: Selector | None, bad: set[str],
                last_broker: str | None) -> MessageQueue:
        if selector is None and not bad and last_broker is None and not self.faults.items:
            queues = route.write_queues  # the usual case: round robin over every write queue
            return queues[next(self._counter) % len(queues)]
        queues = self.faults.choose([q for q in route.write_queues if route.master(q.broker_name) not in bad],
                                    time.monotonic(), route.master)
        if selector is not None:
            chosen = selector(list(route.write_queues), msg)
            if not isinstance(chosen, MessageQueue):
                raise InvalidMessageError(f"the selector returned {chosen!r}, not a MessageQueue")
            return chosen
        n = len(queues)
        for _ in range(n):  # selectOneMessageQueue(lastBrokerName): prefer another broker
            q = queues[next(self._counter) % n]
            if q.broker_name != last_broker:
                return q
        return queues[next(self._counter) % n]

    async def _send(self, topic: str, msg: Message, build: Callable[[MessageQueue], RemotingCommand],
                    parse, selector: Selector | None, timeout: float | None, failed: tuple | None = None):
        """The attempts of one send; `failed` (error, route, queue): a first
        attempt that was made elsewhere (send_async's) and failed so."""
        if self.closed:
            raise ClientClosedError("the producer is closed")
        inst = self.instance
        inst.auto_create_topics.add(topic)
        started = anyio.current_time()
        deadline = started + (self.send_timeout if timeout is None else timeout)
        errors: list[ClientError] = []
        bad: set[str] = set()  # addresses that failed this send in a way that says the route is stale
        route: TopicRoute | None = None
        mq: MessageQueue | None = None
        if failed is not None:
            first, route, mq = failed
            await self._failed(first, topic, errors, bad, route, mq, deadline)
        while True:
            try:
                waited = bool(errors)
                route = inst.cached_route(topic)
                if route is None or not route.write_queues or bad:  # (write_queues: those with a master)
                    route = await inst.wait_route(
                        topic, lambda r: any(r.master(q.broker_name) not in bad for q in r.write_queues), deadline)
                    waited = True
                mq = self._choose(route, msg, selector, bad, mq.broker_name if mq is not None else None)
                addr = route.master(mq.broker_name)
                if addr is None:  # a selector chose a queue whose broker has no master now
                    raise NoRouteError(topic, f"no master for {mq.broker_name} in the route")
                request = build(mq)
                if await inst.ensure_heartbeat(addr) or waited:
                    started = anyio.current_time()  # (else the clock read on entry still holds)
                remaining = max(0.0, deadline - started)
                if parse is None:
                    await inst.invoke_oneway(addr, request, remaining)
                    return None
                sent_at = time.monotonic()  # the fault tolerance's clock: a cheap read
                resp = await inst.invoke(addr, request, remaining, ok=None)
                check_response(resp, addr, request.code, _SENT_CODES)
                if self.faults.enabled:
                    now = time.monotonic()
                    self.faults.record(mq.broker_name, now - sent_at, False, now, addr)
                return parse(resp, mq)
            except ClientError as e:
                if mq is not None and isinstance(e, (ConnectionFailedError, BrokerUnavailableError)):
                    self.faults.record(mq.broker_name, 0.0, True, time.monotonic(), route.master(mq.broker_name))
                await self._failed(e, topic, errors, bad, route, mq, deadline)

    async def _failed(self, e: ClientError, topic: str, errors: list, bad: set, route: TopicRoute | None,
                      mq: MessageQueue | None, deadline: float) -> None:
        """After a failed attempt: SendFailedError when it was the last one,
        else what the next attempt must avoid, and a fresh route."""
        errors.append(e)
        if not e.retriable or len(errors) > self.retries or anyio.current_time() >= deadline:
            raise SendFailedError(topic, errors) from e
        log.debug("send to %s failed (attempt %d), retrying: %s", topic, len(errors), e)
        if isinstance(e, (ConnectionFailedError, BrokerUnavailableError)):
            bad.add(e.addr)
        if not isinstance(e, BrokerBusyError):
            await self.instance.refresh_route(topic, route.version if route is not None else None)


def _handle_broker(handle: str) -> str:
    """The broker name a recall handle (base64url of "v1 topic broker ts id") names."""
    try:
        raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)).decode("utf-8").split(" ")
    except (ValueError, TypeError):
        raw = []
    if len(raw) < 5 or raw[0] != "v1":
        raise InvalidMessageError("recall handle is invalid")
    return raw[2]


def hash_selector(sharding_key) -> Selector:
    """SelectMessageQueueByHash with Java's String.hashCode of the key's text
    (Math.abs of the signed remainder), so a Java producer with the same key
    picks the same queue."""
    code = java_hash_str(str(sharding_key))

    def select(queues: list[MessageQueue], _msg: Message) -> MessageQueue:
        if not queues:
            raise NoRouteError(_msg.topic, "no write queue to select from")
        return queues[abs(int(math.fmod(code, len(queues))))]
    return select


@asynccontextmanager
async def open_producer(group: str, *, namesrv_addr, timeout: float = 3.0, route_interval: float = ROUTE_INTERVAL,
                        credentials=None, tls=None, **options) -> AsyncIterator[Producer]:
    """A started producer; on exit it waits for its send_async calls, then
    unregisters from the brokers.  `route_interval` is Java's
    pollNameServerInterval (how soon a drained group is noticed); `options`
    are Producer's keywords."""
    async with open_client_instance(namesrv_addr, timeout=timeout, route_interval=route_interval,
                                    credentials=credentials, tls=tls) as (instance, nursery):
        producer = Producer(instance, nursery, group, **options)
        instance.producer_groups.add(group)
        instance.default_topic_queue_nums = producer.default_topic_queue_nums
        try:
            yield producer
            await producer.drain()
        finally:
            producer.closed = True
