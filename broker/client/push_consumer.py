# Owns the push consumer (Java's DefaultMQPushConsumer): clustering mode
# (concurrently, or orderly with orderly=True: orderly.py) and broadcasting
# mode (message_model="BROADCASTING": every instance takes every queue, its
# offsets kept locally by offset_store.py):
#
#   async def handler(msgs: list[MessageExt]) -> ConsumeStatus: ...
#   async with open_push_consumer("cg", namesrv_addr=ns, subscriptions={"T": "TagA || TagB"},
#                                 handler=handler) as consumer:
#       ...  # messages flow to handler until the block ends
#
# Tasks, all in the consumer's nursery: rebalance (each subscribed topic's
# sorted queues, and %RETRY%<group>'s once routed, split among the sorted
# client ids by allocate_averagely; at start, on NOTIFY_CONSUMER_IDS_CHANGED
# and every `rebalance_interval`); one long-polling pull loop per owned queue
# (SUSPEND, the commit offset piggybacked to the master) that parks while
# `pull_threshold` messages of its queue are unconsumed; `consume_concurrency`
# workers taking batches of `consume_batch_size` from a bounded channel; an
# offset committer every `persist_interval` (and on queue drop and close).
#
# Rules.  RECONSUME_LATER (or a raising handler) sends the messages back
# (CONSUMER_SEND_MSG_BACK); when the broker refuses, they stay in their
# ProcessQueue (the commit offset cannot pass them) and are redelivered after
# `redeliver_delay`, as Java does.  RESET_CONSUMER_CLIENT_OFFSET drops the
# topic's queues without committing and takes them again from the stored
# offsets.  A queue with no committed offset starts at consume_from
# (LAST_OFFSET by default; FIRST_OFFSET; TIMESTAMP with consume_timestamp in
# ms); retry topics start at their beginning.
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import attrs
import anyio
import anyio.abc

from broker.client.consumer_api import ConsumerApi, parse_subscriptions, subscription_data
from broker.client.errors import (
    BrokerUnavailableError,
    ClientError,
    ConnectionFailedError,
    InvalidArgumentError,
    NoRouteError,
)
from broker.client.instance import ClientInstance, open_client_instance
from broker.client.model import ConsumeStatus, MessageExt, MessageQueue, PullStatus, retry_topic, subscription
from broker.client.offset_store import DEFAULT_STORE_DIR, LocalFileOffsetStore
from broker.client.orderly import OrderlyService
from broker.client.rebalance import ProcessQueue, allocate_averagely
from broker.common.values import ConsumeFromWhere, MessageModel

log = logging.getLogger("ledgermq.client.push")

Handler = Callable[[list[MessageExt]], Awaitable[ConsumeStatus]]


def _consume_from(value) -> ConsumeFromWhere:
    try:
        return value if isinstance(value, ConsumeFromWhere) else ConsumeFromWhere[str(value)]
    except KeyError:
        choices = ", ".join(c.name for c in ConsumeFromWhere)
        raise InvalidArgumentError(f"consume_from {value!r} is not one of {choices}") from None


def _message_model(value) -> MessageModel:
    try:
        return value if isinstance(value, MessageModel) else MessageModel[str(value)]
    except KeyError:
        raise InvalidArgumentError(f"message_model {value!r} is not CLUSTERING or BROADCASTING") from None


def _positive(_inst, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise InvalidArgumentError(f"{attribute.name} must be a positive number, not {value!r}")


@attrs.frozen
class PushOptions:
    consume_from: ConsumeFromWhere = attrs.field(default=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                                                 converter=_consume_from)
    consume_timestamp: int | None = None  # ms, for CONSUME_FROM_TIMESTAMP (default: 30 minutes ago)
    consume_concurrency: int = attrs.field(default=20, validator=_positive)  # consumeThreadMax
    consume_batch_size: int = attrs.field(default=1, validator=_positive)  # consumeMessageBatchMaxSize
    pull_batch_size: int = attrs.field(default=32, validator=_positive)
    pull_threshold: int = attrs.field(default=1000, validator=_positive)  # pullThresholdForQueue
    suspend_ms: int = 15000  # brokerSuspendMaxTimeMillis
    rebalance_interval: float = 20.0
    persist_interval: float = 5.0
    redeliver_delay: float = 5.0
    max_reconsume_times: int = 16
    # delayLevelWhenNextConsume: 0 lets the broker pick 3 + reconsumeTimes
    # (10 s, 30 s, 1 min, ...); -1 sends failed messages straight to the DLQ.
    retry_delay_level: int = 0
    error_backoff: tuple[float, float] = (0.1, 3.0)  # first and largest pause after a failed pull
    message_model: MessageModel = attrs.field(default=MessageModel.CLUSTERING, converter=_message_model)
    # Orderly (clustering only): one queue, one batch at a time, in offset order (orderly.py).
    orderly: bool = False
    suspend_time: float = 1.0  # suspendCurrentQueueTimeMillis: pause before a failed batch is retried in place
    lock_interval: float = 20.0  # lock renewals (RebalanceService's lockAll)
    lock_retry_interval: float = 1.0  # while an owned queue is not locked (held by its previous owner)
    # Broadcasting: where the offsets live (<dir>/<ip>@<instance_name>/<group>/offsets.json).
    offset_store_dir: str | None = None
    instance_name: str = "DEFAULT"


class PushConsumer:
    def __init__(self, instance: ClientInstance, group: str, subscriptions: dict[str, str], handler: Handler,
                 options: PushOptions = PushOptions()) -> None:
        if not subscriptions:
            raise ValueError("a push consumer needs at least one subscription")
        self.instance = instance
        self.group = group
        self.handler = handler
        self.options = options
        self.api = ConsumerApi(instance, group)
        self.broadcasting = options.message_model is MessageModel.BROADCASTING
        if options.orderly and self.broadcasting:
            raise InvalidArgumentError("orderly consumption is for the clustering model")
        self.orderly = OrderlyService(self) if options.orderly else None
        self.local_offsets = LocalFileOffsetStore(
            group, options.instance_name, options.offset_store_dir or DEFAULT_STORE_DIR) if self.broadcasting else None
        version = int(time.time() * 1000)
        # Clustering consumers also consume their retry topic (broadcasting has no retries, as in Java).
        extra = {} if self.broadcasting else {retry_topic(group): "*"}
        subs = parse_subscriptions({**subscriptions, **extra})
        self.subscriptions = {t: attrs.evolve(s, sub_version=version) for t, s in subs.items()}
        self.queues: dict[MessageQueue, ProcessQueue] = {}
        self.consumed = 0  # messages the handler took with CONSUME_SUCCESS
        self.send_backs = 0
        self.local_redeliveries = 0
        self._retry_topic = retry_topic(group)
        self.rebalances = 0
        self._kick = anyio.Event()
        self._send, self._recv = anyio.create_memory_object_stream(options.consume_concurrency * 2)
        self._busy = 0
        self._idle = anyio.Event()
        self._pulls: anyio.abc.TaskGroup | None = None
        self._scope = anyio.CancelScope()
        self.closing = False

    # --- public ----------------------------------------------------------------------

    def assigned_queues(self) -> list[MessageQueue]:
        return sorted(mq for mq, pq in self.queues.items() if not pq.dropped)

    def request_rebalance(self) -> None:
        self._kick.set()

    def offsets_reset(self, topic: str) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET: the broker has already stored the
        new offsets.  Forget the topic's queues at once, without committing
        (that would overwrite the reset), and own them again from the
        broker's offsets at the next rebalance, requested now."""
        for mq, pq in list(self.queues.items()):
            if mq.topic == topic:
                pq.drop()
                del self.queues[mq]
        self.request_rebalance()

    def consumer_data(self) -> dict:
        return {"groupName": self.group, "consumeType": "CONSUME_PASSIVELY",
                "messageModel": self.options.message_model.name,
                "consumeFromWhere": self.options.consume_from.name, "unitMode": False,
                "subscriptionDataSet": [subscription_data(t, s) for t, s in sorted(self.subscriptions.items())]}

    async def commit_offsets(self) -> None:
        """Commit every owned queue's offset that moved (to the master; in
        broadcasting mode to the local offset store)."""
        if self.local_offsets is not None:
            for pq in list(self.queues.values()):
                self.local_offsets.update(pq.mq, pq.commit_offset)
            data = self.local_offsets.render()
            try:
                await anyio.to_thread.run_sync(self.local_offsets.write, data)
            except OSError as e:
                log.warning("%s: local offsets not written to %s: %s", self.group, self.local_offsets.path, e)
            return
        async with anyio.create_task_group() as nursery:
            for pq in list(self.queues.values()):
                nursery.start_soon(self.commit_queue, pq)

    async def commit_queue(self, pq: ProcessQueue) -> None:
        offset = pq.commit_offset
        if offset == pq.committed or offset < 0:
            return
        if self.local_offsets is not None:
            self.local_offsets.update(pq.mq, offset)
            return
        try:
            await self.api.update_offset(pq.mq, offset)
            pq.committed = offset
            log.debug("%s: committed %s=%d", self.group, pq.mq, offset)
        except ClientError as e:
            log.debug("%s: commit %s=%d failed: %s", self.group, pq.mq, offset, e)

    # --- life -----------------------------------------------------------------------------

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        with self._scope:
            async with anyio.create_task_group() as nursery:
                self._pulls = nursery
                for _ in range(self.options.consume_concurrency):
                    nursery.start_soon(self._worker)
                for topic in self.subscriptions:
                    await self.instance.route(topic)
                await self.instance.heartbeat_all()
                if self.local_offsets is not None:
                    self.local_offsets.load()
                await self._rebalance()
                nursery.start_soon(self._rebalance_loop)
                nursery.start_soon(self._persist_loop)
                if self.orderly is not None:
                    nursery.start_soon(self.orderly.run_lock_keeper)
                task_status.started()

    async def shutdown(self, grace: float = 5.0) -> None:
        """Stop pulling, let running handlers finish (up to `grace` s),
        commit offsets, stop."""
        self.closing = True
        for pq in self.queues.values():
            pq.cancel_scope.cancel()
        with anyio.move_on_after(grace):
            while self._busy:
                await self._idle.wait()
        with anyio.CancelScope(shield=True), anyio.move_on_after(grace):
            if self.orderly is not None:
                for pq in self.queues.values():
                    pq.drop()
                    await pq.wait_idle()
            await self.commit_offsets()
            if self.orderly is not None:
                await self.orderly.unlock_all(list(self.queues.values()))
        self._scope.cancel()

    # --- rebalance -----------------------------------------------------------------------

    async def _rebalance_loop(self) -> None:
        while True:
            with anyio.move_on_after(self.options.rebalance_interval):
                await self._kick.wait()
            self._kick = anyio.Event()
            try:
                await self._rebalance()
            except ClientError as e:
                log.info("%s: rebalance failed, next one retries: %s", self.group, e)

    async def _rebalance(self) -> None:
        self.rebalances += 1
        for topic in self.subscriptions:
            route = await self.instance.route(topic)
            if route is None:  # e.g. %RETRY%<group> before anything was sent back
                continue
            if self.broadcasting:
                mine = set(route.read_queues)  # every instance reads everything
            else:
                try:
                    ids = await self.api.consumer_ids(topic)
                except ClientError as e:
                    log.info("%s: consumer list for %s unavailable: %s", self.group, topic, e)
                    continue
                if self.instance.client_id not in ids:  # our heartbeat has not landed there yet
                    await self.instance.heartbeat_all()
                    try:
                        ids = await self.api.consumer_ids(topic)
                    except ClientError:
                        continue
                    if self.instance.client_id not in ids:
                        continue
                mine = set(allocate_averagely(self.instance.client_id, route.read_queues, ids))
            for mq, pq in list(self.queues.items()):
                if mq.topic == topic and mq not in mine:
                    await self._drop(pq)
            for mq in sorted(mine):
                if mq not in self.queues and not self.closing:
                    pq = self.queues[mq] = ProcessQueue(mq)
                    self._pulls.start_soon(self._pull_loop, pq)
                    if self.orderly is not None:
                        self._pulls.start_soon(self.orderly.consume_loop, pq)
                        self.orderly.request_lock()
            log.debug("%s: %s -> %s", self.group, topic, sorted(str(q) for q in mine))

    async def _drop(self, pq: ProcessQueue) -> None:
        pq.drop()
        del self.queues[pq.mq]
        if self.orderly is not None:  # finish, commit, and only then unlock
            await self.orderly.release(pq, self.commit_queue)
            return
        offset = pq.commit_offset
        if pq.committed != offset and offset >= 0:
            try:
                await self.api.update_offset(pq.mq, offset)
            except ClientError as e:
                log.info("%s: commit of dropped %s failed: %s", self.group, pq.mq, e)

    # --- pulling -----------------------------------------------------------------------------

    async def _start_offset(self, mq: MessageQueue) -> int:
        if self.local_offsets is not None:
            local = self.local_offsets.read(mq)
            if local is not None:
                return local
        committed = None if self.local_offsets is not None else await self.api.query_offset(mq)
        if committed is not None:
            return committed
        if mq.topic.startswith("%RETRY%"):
            return 0
        how = self.options.consume_from
        if how is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
            return await self.api.min_offset(mq)
        if how is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
            ts = self.options.consume_timestamp or int(time.time() * 1000) - 30 * 60 * 1000
            return await self.api.search_offset(mq, ts)
        return await self.api.max_offset(mq)

    async def _backoff(self, pq: ProcessQueue, delay: float, e: ClientError) -> float:
        # Quiet while a failover is likely the cause; loud once it lasts.
        level = logging.WARNING if delay >= self.options.error_backoff[1] else logging.DEBUG
        log.log(level, "%s: pull %s failed, retry in %.1f s: %s", self.group, pq.mq, delay, e)
        if isinstance(e, (ConnectionFailedError, BrokerUnavailableError, NoRouteError)):
            route = self.instance.cached_route(pq.mq.topic)
            await self.instance.refresh_route(pq.mq.topic, route.version if route else None)
            pq.broker_id = 0
        await anyio.sleep(delay)  # retry backoff after a failure, not a poll
        return min(delay * 2, self.options.error_backoff[1])

    async def _pull_loop(self, pq: ProcessQueue) -> None:
        opts, sub = self.options, self.subscriptions[pq.mq.topic]
        first_delay = opts.error_backoff[0]
        with pq.cancel_scope:
            delay = first_delay
            if self.orderly is not None:
                # Orderly: the offset only once the lock is ours, i.e. after
                # the previous owner committed and unlocked (Java's lockedFirst).
                await pq.wait_locked()
            while True:
                try:
                    pq.next_offset = await self._start_offset(pq.mq)
                    log.debug("%s: %s starts at %d", self.group, pq.mq, pq.next_offset)
                    break
                except ClientError as e:
                    delay = await self._backoff(pq, delay, e)
            delay = first_delay
            while not pq.dropped:
                await pq.wait_below(opts.pull_threshold)
                if self.orderly is not None:
                    await pq.wait_locked()  # orderly: only the lock holder pulls
                try:
                    res = await self.api.pull(pq.mq, pq.next_offset, sub, max_nums=opts.pull_batch_size,
                                              suspend_ms=opts.suspend_ms, timeout=opts.suspend_ms / 1000 + 5,
                                              commit_offset=None if self.broadcasting else pq.commit_offset,
                                              broker_id=pq.broker_id)
                except ClientError as e:
                    delay = await self._backoff(pq, delay, e)
                    continue
                delay = first_delay
                pq.broker_id = res.suggest_broker_id
                if res.status is PullStatus.OFFSET_ILLEGAL:
                    log.warning("%s: offset %d of %s is illegal, moving to %d", self.group, pq.next_offset, pq.mq,
                                res.next_begin_offset)
                pq.next_offset = res.next_begin_offset
                if res.messages:
                    pq.add(res.messages)
                    if self.orderly is not None:
                        continue  # the queue's consume task takes them in order
                    step = opts.consume_batch_size
                    for i in range(0, len(res.messages), step):
                        await self._send.send((pq, res.messages[i:i + step]))

    # --- consuming -----------------------------------------------------------------------------

    async def _worker(self) -> None:
        async for pq, msgs in self._recv:
            if pq.dropped or self.closing:
                continue  # its new owner pulls them again from the committed offset
            self._busy += 1
            try:
                await self._consume(pq, msgs)
            finally:
                self._busy -= 1
                if not self._busy:
                    self._idle.set()
                    self._idle = anyio.Event()

    async def call_handler(self, pq: ProcessQueue, msgs: list[MessageExt]) -> bool:
        """The handler on `msgs`: True for CONSUME_SUCCESS; a raise or any
        other answer means reconsume later."""
        try:
            status = await self.handler(msgs)
        except Exception:
            log.exception("%s: the handler raised on %d message(s) of %s; reconsume later", self.group,
                          len(msgs), pq.mq)
            return False
        if status is ConsumeStatus.CONSUME_SUCCESS:
            return True
        if status is not ConsumeStatus.RECONSUME_LATER:
            log.error("%s: the handler returned %r, not a ConsumeStatus; reconsume later", self.group, status)
        return False

    async def _consume(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        if await self.call_handler(pq, msgs):
            self.consumed += len(msgs)
            pq.remove(msgs)
            return
        if pq.dropped:
            return
        if self.broadcasting:  # no retry topic in broadcasting (Java drops them too)
            log.warning("%s: %d message(s) of %s failed in broadcasting mode and are not retried", self.group,
                        len(msgs), pq.mq)
            pq.remove(msgs)
            return
        failed = []
        for m in msgs:
            try:
                await self.api.send_back(m, self.options.retry_delay_level, self.options.max_reconsume_times)
                self.send_backs += 1
            except ClientError as e:
                log.debug("%s: send back of %s failed (redeliver locally): %s", self.group, m.msg_id, e)
                failed.append(m)
        done = [m for m in msgs if m not in failed] if failed else msgs
        pq.remove(done)
        if failed:
            self.local_redeliveries += len(failed)
            self._pulls.start_soon(self._redeliver, pq, failed)
        elif not any(q.topic == self._retry_topic for q in self.queues):
            # The broker may have just created %RETRY%<group>: own its queues now, not at the next timer.
            await self.instance.refresh_route(self._retry_topic)
            self.request_rebalance()

    async def _redeliver(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        await anyio.sleep(self.options.redeliver_delay)  # Java's submitConsumeRequestLater (5 s)
        if not pq.dropped and not self.closing:
            await self._send.send((pq, msgs))

    async def _persist_loop(self) -> None:
        while True:
            await anyio.sleep(self.options.persist_interval)  # a timer
            await self.commit_offsets()


@asynccontextmanager
async def open_push_consumer(group: str, *, namesrv_addr, subscriptions: dict[str, str], handler: Handler,
                             timeout: float = 3.0, credentials=None, tls=None,
                             **options) -> AsyncIterator[PushConsumer]:
    """A started push consumer (its first rebalance done); on exit it stops
    pulling, lets running handlers finish, commits offsets and unregisters.
    `options` are PushOptions fields (consume_from, consume_concurrency, ...)."""
    # Bad arguments fail here, before anything starts.
    for expr in subscriptions.values():
        subscription(expr)
    if not callable(handler):
        raise InvalidArgumentError(f"handler must be an async function taking a message list, not {handler!r}")
    opts = PushOptions(**options)
    async with open_client_instance(namesrv_addr, timeout=timeout, credentials=credentials,
                                    tls=tls) as (instance, nursery):
        consumer = PushConsumer(instance, group, subscriptions, handler, opts)
        instance.consumers[group] = consumer.consumer_data
        instance.notify[group] = lambda _group: consumer.request_rebalance()
        instance.reset[group] = consumer.offsets_reset
        await nursery.start(consumer.run)
        try:
            yield consumer
        finally:
            with anyio.CancelScope(shield=True):
                await consumer.shutdown()


__all__ = ["Handler", "PushConsumer", "PushOptions", "open_push_consumer"]
