# Owns orderly consumption in the push consumer (Java's
# ConsumeMessageOrderlyService and the lock half of RebalanceImpl):
#
#   * locks.  A queue is consumed only while this client holds its broker
#     lock (LOCK_BATCH_MQ to the master, broker/processors/locks.py).  The
#     lock keeper asks for every owned queue every `lock_interval` seconds
#     (renewals; RocketMQ's 20 s) and, while some owned queue is not held,
#     again every `lock_retry_interval` seconds -- a backoff on a resource
#     another client holds, it wakes at once when a rebalance hands us a
#     queue.  A lock not renewed for `lock_max_live` seconds (30 s, half the
#     broker's 60 s) counts as lost: consumption of that queue pauses.
#   * one consume task per queue.  It hands the handler the oldest messages
#     of the queue (consume_batch_size) and only then the next ones, so a
#     queue's messages reach the handler one batch at a time, in queue
#     offset order.  CONSUME_SUCCESS advances the offset.  RECONSUME_LATER
#     (or a raise) suspends the queue for `suspend_time` seconds and retries
#     the same messages in place -- not sent back, so nothing overtakes them
#     -- with reconsume_times counted on the client; a message that failed
#     max_reconsume_times times goes to %DLQ%<group> (CONSUMER_SEND_MSG_BACK
#     with delayLevel -1) and the queue moves on.
#   * giving a queue up (rebalance, close).  Pulling stops, the message being
#     handled is finished, the offset is committed, and only then is the
#     queue unlocked, so the next owner -- who can lock it only after that --
#     starts exactly after the last message handled here.
import logging

import anyio
import attrs

from broker.client.consumer_api import ConsumerApi
from broker.client.errors import ClientError
from broker.client.model import ConsumeStatus, MessageExt, MessageQueue
from broker.client.rebalance import ProcessQueue

log = logging.getLogger("ledgermq.client.orderly")

LOCK_MAX_LIVE = 30.0  # RebalanceImpl: REBALANCE_LOCK_MAX_LIVE_TIME on the client


def with_reconsume_times(msg: MessageExt, times: int) -> MessageExt:
    """The message as handed over again: the client's count of its tries."""
    return MessageExt(attrs.evolve(msg.record, reconsume_times=times), msg.queue, msg.body)


class OrderlyService:
    """Built by the push consumer (orderly=True); `run_lock_keeper` runs in its
    task group, `consume_loop(pq)` once per owned queue."""

    def __init__(self, consumer) -> None:
        self.consumer = consumer
        self.api: ConsumerApi = consumer.api
        self.options = consumer.options
        self._want = anyio.Event()
        self.suspended = 0  # batches retried in place (stats, tests)
        self.dead_lettered = 0

    # --- locks --------------------------------------------------------------------

    def request_lock(self) -> None:
        self._want.set()

    def _owned(self) -> list[ProcessQueue]:
        return [pq for pq in self.consumer.queues.values() if not pq.dropped]

    async def lock_owned(self) -> None:
        """One LOCK_BATCH_MQ per broker for every owned queue."""
        by_broker: dict[str, list[MessageQueue]] = {}
        for pq in self._owned():
            by_broker.setdefault(pq.mq.broker_name, []).append(pq.mq)
        for mqs in by_broker.values():
            try:
                held = await self.api.lock_batch(sorted(mqs))
            except ClientError as e:
                log.info("%s: lock of %d queues failed: %s", self.consumer.group, len(mqs), e)
                continue
            now = anyio.current_time()
            for mq in mqs:
                pq = self.consumer.queues.get(mq)
                if pq is not None and not pq.dropped:
                    pq.set_locked(mq in held, now)

    async def run_lock_keeper(self) -> None:
        opts = self.options
        while True:
            self._want = anyio.Event()
            await self.lock_owned()
            pending = any(not pq.locked for pq in self._owned())
            with anyio.move_on_after(opts.lock_retry_interval if pending else opts.lock_interval):
                await self._want.wait()

    # --- consuming one queue ------------------------------------------------------

    async def consume_loop(self, pq: ProcessQueue) -> None:
        opts = self.options
        tries: dict[int, int] = {}  # queue offset -> failed tries so far
        while not pq.dropped:
            await pq.wait_messages()
            if pq.dropped:
                break
            if not pq.lock_valid(anyio.current_time(), LOCK_MAX_LIVE):
                self.request_lock()
                await pq.wait_locked()
                if not pq.lock_valid(anyio.current_time(), LOCK_MAX_LIVE):
                    await anyio.sleep(opts.lock_retry_interval)  # a lock the keeper could not renew yet
                continue
            msgs = pq.head(opts.consume_batch_size)
            batch = [with_reconsume_times(m, tries.get(m.queue_offset, m.reconsume_times)) for m in msgs]
            pq.begin_consume()
            try:
                with anyio.CancelScope(shield=True):  # a handler in progress finishes, even on drop
                    ok = await self.consumer.call_handler(pq, batch)
            finally:
                pq.end_consume()
            if ok:
                for m in msgs:
                    tries.pop(m.queue_offset, None)
                self.consumer.consumed += len(msgs)
                pq.remove(msgs)
                continue
            done = []
            for m, shown in zip(msgs, batch):
                times = shown.reconsume_times + 1
                tries[m.queue_offset] = times
                if times > opts.max_reconsume_times and await self._dead_letter(m, times):
                    done.append(m)
                    tries.pop(m.queue_offset, None)
            if done:
                pq.remove(done)
            if len(done) < len(msgs):
                self.suspended += 1
                await anyio.sleep(opts.suspend_time)  # SUSPEND_CURRENT_QUEUE_A_MOMENT, then the same again

    async def _dead_letter(self, msg: MessageExt, times: int) -> bool:
        try:
            await self.api.send_back(msg, -1, self.options.max_reconsume_times)
        except ClientError as e:
            log.info("%s: %s to the DLQ failed, retried in place: %s", self.consumer.group, msg.msg_id, e)
            return False
        log.warning("%s: %s failed %d times in order; sent to %%DLQ%%%s", self.consumer.group, msg.msg_id, times,
                    self.consumer.group)
        self.dead_lettered += 1
        return True

    # --- giving queues up -----------------------------------------------------------

    async def release(self, pq: ProcessQueue, commit) -> None:
        """After pq.drop(): let the handler finish, commit, then unlock."""
        with anyio.CancelScope(shield=True):
            await pq.wait_idle()
            await commit(pq)
            if pq.locked:
                try:
                    await self.api.unlock_batch([pq.mq])
                except ClientError as e:
                    log.info("%s: unlock of %s failed (it expires): %s", self.consumer.group, pq.mq, e)
                pq.set_locked(False, anyio.current_time())

    async def unlock_all(self, pqs: list[ProcessQueue]) -> None:
        by_broker: dict[str, list[MessageQueue]] = {}
        for pq in pqs:
            if pq.locked:
                by_broker.setdefault(pq.mq.broker_name, []).append(pq.mq)
        for mqs in by_broker.values():
            try:
                await self.api.unlock_batch(mqs)
            except ClientError as e:
                log.info("%s: unlock on close failed (the locks expire): %s", self.consumer.group, e)
