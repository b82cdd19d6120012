# Owns POP consumption's requests (RocketMQ 5's PopMessageProcessor,
# AckMessageProcessor, ChangeInvisibleTimeProcessor), answered by the writable
# master only: POP_MESSAGE 200050 (maxMsgNums <= 32, else INVALID_PARAMETER;
# queueId -1: any, round-robin; receipts in property POP_CK, pop_receipt.py;
# none to hand out: POLLING_TIMEOUT after holding up to pollTime), ACK_MESSAGE
# 200051, BATCH_ACK_MESSAGE 200151 (acked offsets so+i as a java.util.BitSet,
# base64) and CHANGE_MESSAGE_INVISIBLETIME 200053 (a new receipt).
#
# Replication: every decision -- the offsets a pop hands out, an ack, a new
# invisible time -- is a metadata op (broker/metadata/pop.py), and the request
# is answered only once that op is committed AND applied here.  So a receipt
# a client holds is in the committed log: a new master neither hands those
# messages out again early nor loses them, and an acked message stays acked
# (a failed append is answered with the error).
#
# Ordering: one (group, topic, queue)'s offsets are decided under that
# queue's lock, held until the op is applied; a queue another pop holds is
# skipped (queueLockManager.tryLock).  An ack or change of an ordinary
# checkpoint holds the checkpoint's lock, which the revive service
# (pop_revive.py) takes too; order acks take the queue lock.  An ack for a
# checkpoint that is gone is answered SUCCESS and appends nothing.
# FIFO (order=true): a queue with an unacked, unexpired order checkpoint is
# skipped; an expired one is handed out again with reconsumeTimes + attempts
# (orderCountInfo), or past the group's retryMaxTimes appended to %DLQ%<group>
# with the op that moves the offset past it.  Budgets: held pops park on the queues' arrivals and their group's acks,
# changes and revives, at most popPollingMaxHeldPerConnection per connection
# and popPollingMaxHeld in all (then POLLING_FULL), below the remoting
# server's in-flight budgets so acks, sends and heartbeats find room; a queue
# with popInflightMessageThreshold unacked messages is skipped.
import base64
import contextlib
import itertools
import logging
import math
import random
import time
import typing

import attrs
import trio

from broker.common.permissions import PERM_READ, PERM_WRITE
from broker.common.subscription import Subscription, SubscriptionError, parse_subscription
from broker.common.values import RETRY_DLQ_TOPIC_MAX_LENGTH
from broker.config import LiveConfig
from broker.metadata.pop import ORDER_REVIVE_QID, PopAckOp, PopChangeOp, PopCheckpoint, PopCheckpointOp
from broker.metadata.service import MetadataService
from broker.processors.base import RequestProcessor
from broker.processors.pop_receipt import (
    Receipt,
    ReceiptError,
    decode_bitset,
    offset_info,
    parse_receipt,
    pop_retry_topic,
    real_topic,
    revived,
    topic_type,
)
from broker.processors.pull import sql_accept
from broker.processors.retry import DLQ_NUMS_PER_GROUP, dlq_topic, ensure_group, ensure_topic
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RequestError
from broker.remoting.header import HeaderReader, decode_json
from broker.store.gate import RoleGate
from commitlog.replica import ReplicaNode
from consumequeue import record as M
from consumequeue.dispatcher import DispatchEngine, Dispatcher
from consumequeue.reader import DEFAULT_MAX_BYTES, GetMessageStatus, read_messages
from consumequeue.service import ConsumeQueueService

log = logging.getLogger("ledgermq.pop")

PROPERTY_POP_CK = "POP_CK"
MAX_POP_NUMS = 32
INIT_MODE_MIN, INIT_MODE_MAX = 0, 1  # ConsumeInitMode
MAX_BATCH_ACKS = 1024
TIMEOUT_TOO_MUCH_MS = 500  # PopMessageRequestHeader.isTimeoutTooMuch


class PopError(Exception):
    def __init__(self, code: int, remark: str):
        super().__init__(remark)
        self.code, self.remark = code, remark


@attrs.frozen(kw_only=True)
class PopHeader:
    group: str
    topic: str
    queue_id: int
    max_nums: int
    invisible_time: int
    poll_time: int
    born_time: int
    init_mode: int
    exp_type: str | None
    exp: str | None
    order: bool
    attempt_id: str | None


def parse_pop_header(request: RemotingCommand) -> PopHeader:
    h = HeaderReader(request.ext_fields)
    return PopHeader(group=h.str("consumerGroup"), topic=h.str("topic"), queue_id=h.int("queueId"),
                     max_nums=h.int("maxMsgNums"),
                     invisible_time=h.long("invisibleTime"), poll_time=h.long("pollTime"), born_time=h.long("bornTime"),
                     init_mode=h.int("initMode"),
                     exp_type=h.str("expType", None), exp=h.str("exp", None), order=bool(h.bool("order", False)),
                     attempt_id=h.str("attemptId", None))


class KeyedLocks:
    """One trio.Lock per key, created on demand and dropped when unused."""

    def __init__(self) -> None:
        self._locks: dict = {}
        self._users: dict = {}

    @contextlib.asynccontextmanager
    async def hold(self, key):
        lock = self._locks.setdefault(key, trio.Lock())
        self._users[key] = self._users.get(key, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._release_user(key)

    def try_take(self, key) -> bool:
        lock = self._locks.setdefault(key, trio.Lock())
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            if not self._users.get(key):
                del self._locks[key]
            return False
        self._users[key] = self._users.get(key, 0) + 1
        return True

    def give_back(self, key) -> None:
        self._locks[key].release()
        self._release_user(key)

    def _release_user(self, key) -> None:
        n = self._users[key] - 1
        if n:
            self._users[key] = n
        else:
            del self._users[key]
            del self._locks[key]

    def __len__(self) -> int:
        return len(self._locks)


@attrs.define
class _Popped:
    """What one pop attempt handed out."""

    pop_time: int
    records: list = attrs.Factory(list)
    start: list = attrs.Factory(list)  # (topicType, queueId, startOffset)
    msgs: list = attrs.Factory(list)  # (topicType, queueId, [offsets])
    counts: list = attrs.Factory(list)  # (topicType, queueId, attempts)  order pops
    rest: int = 0
    waits: list = attrs.Factory(list)  # (topic, queueId, offset) a held pop waits beyond
    wake_at_ms: float = math.inf  # the earliest deadline of a FIFO queue that blocked this pop
    moved: bool = False  # an offset moved past filtered-out messages with more to look at


@attrs.define(eq=False, kw_only=True)
class PopProcessor(RequestProcessor):
    config: LiveConfig
    gate: RoleGate  # POP runs on the writable master only
    metadata: MetadataService  # checkpoints, acks and their ops; topics and groups
    replica: ReplicaNode  # ops and dead letters are appended through it
    cq: ConsumeQueueService  # what pops read
    queues: DispatchEngine  # the consume queues
    dispatcher: Dispatcher  # arrivals wake held pops
    clock_ms: typing.Callable[[], int] = lambda: int(time.time() * 1000)
    rng: random.Random = attrs.Factory(random.Random)
    max_transfer_bytes: int = DEFAULT_MAX_BYTES
    # The revive service's hook: a checkpoint with this deadline (ms) was added.
    on_checkpoint: typing.Callable[[int], None] | None = None
    queue_locks: KeyedLocks = attrs.Factory(KeyedLocks)
    ck_locks: KeyedLocks = attrs.Factory(KeyedLocks)
    held: int = 0
    held_by_conn: dict = attrs.Factory(dict)
    stats: dict = attrs.Factory(lambda: {"popped": 0, "acked": 0, "changed": 0, "polling_full": 0,
                                         "fifo_to_dlq": 0})
    _changed: dict = attrs.Factory(dict)  # group -> the event its held pops wait on
    _rr: typing.Iterator[int] = attrs.Factory(itertools.count)

    CODES = (RequestCode.POP_MESSAGE, RequestCode.ACK_MESSAGE, RequestCode.BATCH_ACK_MESSAGE,
             RequestCode.CHANGE_MESSAGE_INVISIBLETIME)
    not_leader_remark = "POP checkpoints are kept by the master"

    def state_changed(self, group: str | None = None) -> None:
        """Acks, changes and revives wake the group's held pops (a FIFO
        queue may be free, a retry topic may have appeared); None: every group's."""
        for g in list(self._changed) if group is None else [group]:
            event = self._changed.pop(g, None)
            if event is not None:
                event.set()

    async def handle(self, conn, request: RemotingCommand) -> RemotingCommand:
        try:
            if request.code == RequestCode.POP_MESSAGE:
                return await self.pop(conn, request)
            if request.code == RequestCode.ACK_MESSAGE:
                return await self.ack(request)
            if request.code == RequestCode.BATCH_ACK_MESSAGE:
                return await self.batch_ack(request)
            return await self.change_invisible(request)
        except PopError as e:
            return request.make_response(e.code, e.remark)
        except SubscriptionError as e:
            return request.make_response(e.code, e.remark)
        except ReceiptError as e:
            return request.make_response(ResponseCode.INVALID_PARAMETER, str(e))

    # --- POP_MESSAGE ------------------------------------------------------------------

    def _check_pop(self, h: PopHeader):
        cfg = self.config.current
        if h.born_time > 0 and h.poll_time >= 0 and self.clock_ms() - h.born_time - h.poll_time > TIMEOUT_TOO_MUCH_MS:
            raise PopError(ResponseCode.POLLING_TIMEOUT,
                           f"the broker[{cfg.broker_ip1}] pop message is timeout too much")
        if not cfg.broker_permission & PERM_READ:
            raise PopError(ResponseCode.NO_PERMISSION, f"the broker[{cfg.broker_ip1}] pop message is forbidden")
        if not 0 < h.max_nums <= MAX_POP_NUMS:
            raise PopError(ResponseCode.INVALID_PARAMETER,
                           f"the broker[{cfg.broker_ip1}] pop message's num is greater than 32"
                           if h.max_nums > MAX_POP_NUMS else f"maxMsgNums {h.max_nums} must be positive")
        if not 0 < h.invisible_time <= cfg.pop_invisible_time_max_ms:
            raise PopError(ResponseCode.INVALID_PARAMETER, f"invisibleTime {h.invisible_time} is not in "
                           f"[1, {cfg.pop_invisible_time_max_ms}] (popInvisibleTimeMaxMillis)")
        topic_cfg = self.metadata.topic_config(h.topic)
        if topic_cfg is None:
            raise PopError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{h.topic}] not exist, apply first please!")
        if not topic_cfg.perm & PERM_READ:
            raise PopError(ResponseCode.NO_PERMISSION, f"the topic[{h.topic}] peeking message is forbidden")
        if h.queue_id >= topic_cfg.read_queue_nums or h.queue_id < -1:
            raise PopError(ResponseCode.INVALID_PARAMETER,
                           f"queueId[{h.queue_id}] is illegal, topic:[{h.topic}] "
                           f"topicConfig.readQueueNums:[{topic_cfg.read_queue_nums}]")
        for name in (pop_retry_topic(h.topic, h.group), dlq_topic(h.group)):
            if len(name) > RETRY_DLQ_TOPIC_MAX_LENGTH:  # its unacked messages could never go back
                raise PopError(ResponseCode.INVALID_PARAMETER, f"the group's POP retry or DLQ topic {name[:40]}... "
                               f"would be longer than {RETRY_DLQ_TOPIC_MAX_LENGTH} characters")
        sub = parse_subscription(h.exp or "*", 0, h.exp_type or "TAG")
        if sub.is_sql and not cfg.enable_property_filter:
            raise PopError(ResponseCode.SYSTEM_ERROR,
                           f"The broker does not support consumer to filter message by {sub.expression_type}")
        return topic_cfg, sub

    async def pop(self, conn, request: RemotingCommand) -> RemotingCommand:
        h = parse_pop_header(request)
        topic_cfg, sub = self._check_pop(h)
        self.gate.check_writable()
        group_cfg = await ensure_group(self.metadata, self.config.current, h.group)
        if group_cfg is None:
            raise PopError(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group [{h.group}] does not exist")
        if not group_cfg.consume_enable:
            raise PopError(ResponseCode.NO_PERMISSION, f"subscription group no permission, {h.group}")
        changed = self._event(h.group)  # taken before looking: no change can slip between
        popped = await self._pop_once(h, topic_cfg, sub, group_cfg.retry_max_times)
        if popped.records or h.poll_time <= 0:
            return self._pop_response(request, h, popped)
        cfg = self.config.current
        if self.held >= cfg.pop_polling_max_held or \
                self.held_by_conn.get(conn, 0) >= cfg.pop_polling_max_held_per_connection:
            self.stats["polling_full"] += 1
            return self._pop_response(request, h, popped, ResponseCode.POLLING_FULL)
        deadline = trio.current_time() + min(h.poll_time, cfg.long_polling_suspend_max_ms) / 1000
        self.held += 1
        self.held_by_conn[conn] = self.held_by_conn.get(conn, 0) + 1
        try:
            while not popped.records and trio.current_time() < deadline:
                # (a blocked FIFO queue frees itself at its deadline: no event says so)
                unblocked = trio.current_time() + max(popped.wake_at_ms - self.clock_ms(), 0) / 1000 + 0.001
                if not popped.moved:  # (else look further at once: the offset moved, more follows)
                    with trio.move_on_at(min(deadline, unblocked)):
                        await self._wait_for_news(changed, popped.waits)
                changed = self._event(h.group)
                topic_cfg, sub = self._check_pop(attrs.evolve(h, born_time=0))
                popped = await self._pop_once(h, topic_cfg, sub, group_cfg.retry_max_times)
        finally:
            self.held -= 1
            n = self.held_by_conn[conn] - 1
            if n:
                self.held_by_conn[conn] = n
            else:
                del self.held_by_conn[conn]
        return self._pop_response(request, h, popped)

    def _event(self, group: str) -> trio.Event:
        event = self._changed.get(group)
        if event is None:
            event = self._changed[group] = trio.Event()
        return event

    async def _wait_for_news(self, changed: trio.Event, waits: list) -> None:
        """Until a message arrives beyond one of `waits` or the group's
        checkpoints change (`changed`: an ack may free a FIFO queue)."""
        arrivals = self.dispatcher.arrivals
        async with trio.open_nursery() as nursery:
            async def one(wait) -> None:
                await wait()
                nursery.cancel_scope.cancel()
            nursery.start_soon(one, changed.wait)
            for topic, queue_id, offset in waits:
                nursery.start_soon(one, lambda t=topic, q=queue_id, o=offset: arrivals.wait_beyond(t, q, o))

    def _sources(self, h: PopHeader, topic_cfg) -> list[tuple[str, int]]:
        n = topic_cfg.read_queue_nums
        start = next(self._rr)
        main = [(h.topic, h.queue_id)] if h.queue_id >= 0 else [(h.topic, (start + i) % n) for i in range(n)]
        if h.order:
            return main
        retry_cfg = self.metadata.topic_config(pop_retry_topic(h.topic, h.group))
        if retry_cfg is None:
            return main
        retry = [(retry_cfg.topic_name, (start + i) % retry_cfg.read_queue_nums)
                 for i in range(retry_cfg.read_queue_nums)]
        if self.rng.randrange(100) < self.config.current.pop_from_retry_probability:
            return retry + main
        return main + retry

    async def _pop_once(self, h: PopHeader, topic_cfg, sub: Subscription, max_times: int) -> _Popped:
        self.gate.check_writable()
        pop_time = self.clock_ms()
        popped = _Popped(pop_time)
        taken: list = []
        cks: list[tuple[PopCheckpoint, list]] = []
        dead: list[bytes] = []  # FIFO messages past retryMaxTimes, for the DLQ
        try:
            for topic, queue_id in self._sources(h, topic_cfg):
                key = (h.group, topic, queue_id)
                if not self.queue_locks.try_take(key):
                    continue
                taken.append(key)
                left = h.max_nums - sum(len(c.offsets) for c, _ in cks)
                ck, raws = self._read_queue(h, topic, queue_id, left, pop_time, sub, popped)
                if ck is not None and ck.attempts and M.decode(raws[0]).reconsume_times + ck.attempts > max_times:
                    dead += await self._to_dlq(ck, raws)
                    ck, raws = attrs.evolve(ck, offsets=()), []  # the offset moves past them
                if ck is not None:
                    cks.append((ck, raws))
            if cks:
                bodies = dead + [self.metadata.encode(PopCheckpointOp(ck)) for ck, _ in cks]
                self.gate.check_writable()
                placed = await self.replica.append(bodies)
                await self.metadata.wait_applied(placed[-1][0])
        finally:
            for key in taken:
                self.queue_locks.give_back(key)
        broker_name = self.config.current.broker_name
        for ck, raws in cks:
            if not ck.offsets:
                continue
            ttype = topic_type(ck.topic)
            popped.start.append((ttype, ck.queue_id, ck.start_offset))
            popped.msgs.append((ttype, ck.queue_id, list(ck.offsets)))
            if ck.order:
                popped.counts.append((ttype, ck.queue_id, ck.attempts))
            for raw in raws:
                popped.records.append(self._with_receipt(raw, ck, ttype, h.topic, broker_name))
            if self.on_checkpoint is not None and not ck.order:
                self.on_checkpoint(ck.deadline)
        self.stats["popped"] += len(popped.records)
        if dead:
            self.stats["fifo_to_dlq"] += len(dead)
            self.state_changed(h.group)  # the queue moved on: held pops look again
        return popped

    async def _to_dlq(self, ck: PopCheckpoint, raws: list) -> list[bytes]:
        """The DLQ records of a FIFO batch handed out too often (its
        reconsumeTimes would pass the group's retryMaxTimes)."""
        cfg = self.config.current
        await ensure_topic(self.metadata, dlq_topic(ck.group), DLQ_NUMS_PER_GROUP, PERM_READ | PERM_WRITE)
        out = []
        for raw in raws:
            rec = M.decode(raw)
            rec = attrs.evolve(rec, reconsume_times=rec.reconsume_times + ck.attempts - 1)
            out.append(M.encode(revived(rec, rec.physical_offset, ck.topic, to_dlq=True, group=ck.group,
                                        now_ms=self.clock_ms(), store_host=cfg.store_host)))
        log.info("%d FIFO messages of %s@%d go to %s after %d attempts", len(out), ck.topic, ck.queue_id,
                 dlq_topic(ck.group), ck.attempts)
        return out

    def _read_queue(self, h: PopHeader, topic: str, queue_id: int, left: int, pop_time: int, sub: Subscription,
                    popped: _Popped) -> tuple[PopCheckpoint | None, list]:
        state = self.metadata.state
        cq = self.queues.cqs.get(topic, queue_id)
        offset = state.offsets.query(topic, h.group, queue_id)
        if cq is None:
            popped.waits.append((topic, queue_id, 0))
            return None, []
        if offset is None:
            if h.init_mode == INIT_MODE_MIN or topic != h.topic or cq.min_offset <= 0:
                offset = cq.min_offset
            else:
                offset = max(cq.max_offset - 1, 0)  # getInitOffset: pop the last one
        offset = max(offset, cq.min_offset)
        attempts = 0
        if h.order:
            if state.pop.blocked(h.group, topic, queue_id, pop_time):
                popped.wake_at_ms = min(popped.wake_at_ms, state.pop.order_ck(h.group, topic, queue_id).deadline)
                return None, []  # an ack (state_changed) or the deadline frees it
            prev = state.pop.order_ck(h.group, topic, queue_id)
            if prev is not None and prev.unacked and offset <= prev.offsets[-1]:
                attempts = prev.attempts + 1
        rest = max(cq.max_offset - offset, 0)
        if state.pop.in_flight(h.group, topic, queue_id) >= self.config.current.pop_inflight_message_threshold:
            popped.rest += rest
            return None, []
        if left <= 0:
            popped.rest += rest
            return None, []
        result = read_messages(self.cq, topic, queue_id, offset, left, self.max_transfer_bytes,
                               None if sub.codes is None else set(sub.codes), correct_offsets=True,
                               accept=sql_accept(sub.sql) if sub.is_sql else None)
        popped.rest += max(result.max_offset - result.next_begin_offset, 0)
        if result.status is GetMessageStatus.FOUND:
            invisible = h.invisible_time
            ck = PopCheckpoint(group=h.group, topic=topic, queue_id=queue_id, start_offset=offset, pop_time=pop_time,
                               invisible_time=invisible, offsets=tuple(result.queue_offsets),
                               next_offset=result.next_begin_offset, order=h.order,
                               revive_qid=ORDER_REVIVE_QID if h.order else 0, attempts=attempts)
            return ck, _split(result.records)
        if max(result.next_begin_offset, offset) >= result.max_offset:  # caught up: wait for the next one
            popped.waits.append((topic, queue_id, max(result.next_begin_offset, offset)))
        if result.next_begin_offset > offset:  # filtered out or moved: only the offset moves
            popped.moved = popped.moved or result.next_begin_offset < result.max_offset
            return PopCheckpoint(group=h.group, topic=topic, queue_id=queue_id, start_offset=offset, pop_time=pop_time,
                                 invisible_time=h.invisible_time, offsets=(),
                                 next_offset=result.next_begin_offset, order=h.order), []
        return None, []

    @staticmethod
    def _with_receipt(raw: bytes, ck: PopCheckpoint, ttype: str, topic: str, broker_name: str) -> bytes:
        rec = M.decode(raw)
        props = dict(rec.properties)
        props[PROPERTY_POP_CK] = str(Receipt(ck_queue_offset=ck.start_offset, pop_time=ck.pop_time,
                                             invisible_time=ck.invisible_time, revive_qid=ck.revive_qid,
                                             topic_type=ttype,
                                             broker_name=broker_name, queue_id=ck.queue_id,
                                             queue_offset=rec.queue_offset))
        return M.encode(attrs.evolve(rec, topic=topic, properties=props,
                                     reconsume_times=rec.reconsume_times + ck.attempts, magic=None))

    def _pop_response(self, request: RemotingCommand, h: PopHeader, popped: _Popped,
                      empty_code: int = ResponseCode.POLLING_TIMEOUT) -> RemotingCommand:
        fields = {"popTime": popped.pop_time, "invisibleTime": h.invisible_time,
                  "reviveQid": ORDER_REVIVE_QID if h.order else 0, "restNum": popped.rest,
                  "startOffsetInfo": offset_info(popped.start), "msgOffsetInfo": offset_info(popped.msgs)}
        if h.order and popped.counts:
            fields["orderCountInfo"] = offset_info(popped.counts)
        if popped.records:
            return request.make_response(ResponseCode.SUCCESS, GetMessageStatus.FOUND.value, fields,
                                         b"".join(popped.records))
        return request.make_response(empty_code, GetMessageStatus.NO_MESSAGE_IN_QUEUE.value, fields)

    # --- ACK_MESSAGE, BATCH_ACK_MESSAGE --------------------------------------------------

    def _where(self, group: str, topic: str, queue_id: int, receipt: Receipt, offset: int, *,
               change: bool) -> tuple[str, int]:
        """The checks RocketMQ makes of an ack or change: (real topic, queue)."""
        topic_cfg = self.metadata.topic_config(topic)
        if topic_cfg is None:
            raise PopError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not 0 <= queue_id < topic_cfg.read_queue_nums and receipt.topic_type == "0":
            raise PopError(ResponseCode.MESSAGE_ILLEGAL, f"queueId[{queue_id}] is illegal, topic:[{topic}] "
                           f"topicConfig.readQueueNums:[{topic_cfg.read_queue_nums}]")
        real = real_topic(topic, group, receipt.topic_type)
        cq = self.queues.cqs.get(real, receipt.queue_id)
        lo, hi = (cq.min_offset, cq.max_offset) if cq is not None else (0, 0)
        if offset < lo or offset > hi or (change and offset >= hi):
            raise PopError(ResponseCode.NO_MESSAGE,
                           f"offset is illegal, key:{real}@{receipt.queue_id}, commit:{offset}, store:{lo}~{hi}")
        return real, receipt.queue_id

    async def ack(self, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        group, topic, queue_id = h.str("consumerGroup"), h.str("topic"), h.int("queueId")
        receipt, offset = parse_receipt(h.str("extraInfo")), h.long("offset")
        real, qid = self._where(group, topic, queue_id, receipt, offset, change=False)
        await self._ack(group, real, qid, receipt.ck_queue_offset, receipt.pop_time, receipt.order, [offset])
        return request.make_response(ResponseCode.SUCCESS)

    async def _ack(self, group: str, topic: str, queue_id: int, start: int, pop_time: int, order: bool,
                   offsets: list[int]) -> bool:
        """Append the ack of `offsets` if its checkpoint still holds them
        unacked; False (and nothing appended) otherwise."""
        self.gate.check_writable()
        locks, key = ((self.queue_locks, (group, topic, queue_id)) if order
                      else (self.ck_locks, (group, topic, queue_id, start, pop_time)))
        async with locks.hold(key):
            ck = self.metadata.state.pop.find(group, topic, queue_id, start, pop_time, order)
            fresh = [] if ck is None else [o for o in offsets if o in ck.offsets and o not in ck.acked]
            if not fresh:
                return False
            op = PopAckOp(group=group, topic=topic, queue_id=queue_id, start_offset=ck.start_offset,
                          pop_time=ck.pop_time, offsets=tuple(fresh), order=order)
            await self._append([op])
        self.stats["acked"] += len(fresh)
        self.state_changed(group)
        return True

    async def _append(self, ops) -> int:
        self.gate.check_writable()
        placed = await self.replica.append([self.metadata.encode(op) for op in ops])
        return await self.metadata.wait_applied(placed[-1][0])

    async def batch_ack(self, request: RemotingCommand) -> RemotingCommand:
        acks = parse_batch_ack(request.body)
        if not acks:
            return request.make_response(ResponseCode.NO_MESSAGE, "no acks in the request body")
        for a in acks:
            topic_cfg = self.metadata.topic_config(a.topic)
            if topic_cfg is None:
                raise PopError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{a.topic}] not exist, apply first please!")
            real = real_topic(a.topic, a.group, a.retry)
            await self._ack(a.group, real, a.queue_id, a.start_offset, a.pop_time, a.revive_qid == ORDER_REVIVE_QID,
                            a.offsets)
        return request.make_response(ResponseCode.SUCCESS)

    # --- CHANGE_MESSAGE_INVISIBLETIME ----------------------------------------------------

    async def change_invisible(self, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        group, topic, queue_id = h.str("consumerGroup"), h.str("topic"), h.int("queueId")
        receipt, offset, invisible = parse_receipt(h.str("extraInfo")), h.long("offset"), h.long("invisibleTime")
        limit = self.config.current.pop_invisible_time_max_ms
        if not 0 <= invisible <= limit:
            raise PopError(ResponseCode.INVALID_PARAMETER,
                           f"invisibleTime {invisible} is not in [0, {limit}] (popInvisibleTimeMaxMillis)")
        real, qid = self._where(group, topic, queue_id, receipt, offset, change=True)
        self.gate.check_writable()
        order = receipt.order
        locks, key = ((self.queue_locks, (group, real, qid)) if order
                      else (self.ck_locks, (group, real, qid, receipt.ck_queue_offset, receipt.pop_time)))
        table = self.metadata.state.pop
        async with locks.hold(key):
            ck = table.find(group, real, qid, receipt.ck_queue_offset, receipt.pop_time, order)
            if ck is None or offset not in ck.offsets or offset in ck.acked:
                raise PopError(ResponseCode.NO_MESSAGE, f"invalid receipt: the message at {real}@{qid}:{offset} "
                               f"of {group} was acked or revived (its invisible time is over)")
            now = self.clock_ms()
            if not order:
                while table.find(group, real, qid, offset, now, False) is not None:
                    now += 1  # one checkpoint per (offset, popTime)
            await self._append([PopChangeOp(group=group, topic=real, queue_id=qid, start_offset=ck.start_offset,
                                            pop_time=ck.pop_time, offset=offset, new_pop_time=now,
                                            invisible_time=invisible,
                                            revive_qid=ck.revive_qid, order=order)])
        self.stats["changed"] += 1
        self.state_changed(group)
        if order:
            fields = {"popTime": ck.pop_time, "invisibleTime": now + invisible - ck.pop_time,
                      "reviveQid": ORDER_REVIVE_QID}
        else:
            fields = {"popTime": now, "invisibleTime": invisible, "reviveQid": ck.revive_qid}
            if self.on_checkpoint is not None:
                self.on_checkpoint(now + invisible)
        return request.make_response(ResponseCode.SUCCESS, None, fields)


def _split(records: bytes) -> list[bytes]:
    out, off = [], 0
    while off < len(records):
        size = M.I32.unpack_from(records, off)[0]
        out.append(records[off:off + size])
        off += size
    return out


@attrs.frozen(kw_only=True)
class BatchAck:
    group: str
    topic: str
    retry: str
    start_offset: int
    queue_id: int
    revive_qid: int
    pop_time: int
    invisible_time: int
    offsets: list


def parse_batch_ack(body: bytes) -> list[BatchAck]:
    """BatchAckMessageRequestBody (fastjson names c/t/r/so/q/rq/pt/it/b, or
    the long ones), bounded: at most MAX_BATCH_ACKS acks."""
    obj = decode_json(body, "BatchAckMessageRequestBody") if body else None
    if obj is None:
        return []
    if not isinstance(obj, dict) or not isinstance(obj.get("acks", []), list):
        raise RequestError(ResponseCode.INVALID_PARAMETER, "BatchAckMessageRequestBody: acks must be a list")
    acks = obj.get("acks") or []
    if len(acks) > MAX_BATCH_ACKS:
        raise RequestError(ResponseCode.INVALID_PARAMETER, f"{len(acks)} acks in one batch (at most {MAX_BATCH_ACKS})")
    out = []
    for a in acks:
        if not isinstance(a, dict):
            raise RequestError(ResponseCode.INVALID_PARAMETER, "BatchAckMessageRequestBody: an ack is not an object")

        def get(short: str, long: str, kind: type):
            v = a.get(short, a.get(long))
            if not isinstance(v, kind) or isinstance(v, bool) or (kind is int and not 0 <= v < 1 << 63):
                raise RequestError(ResponseCode.INVALID_PARAMETER, f"BatchAck: bad {long} {v!r}")
            return v
        bits = get("b", "bitSet", str)
        try:
            raw = base64.b64decode(bits, validate=True)
        except ValueError:
            raise RequestError(ResponseCode.INVALID_PARAMETER, "BatchAck: bitSet is not base64") from None
        so = get("so", "startOffset", int)
        retry = str(a.get("r", a.get("retry", "0")))
        if retry not in ("0", "1", "2"):
            raise RequestError(ResponseCode.INVALID_PARAMETER, f"BatchAck: bad retry {retry!r}")
        out.append(BatchAck(group=get("c", "consumerGroup", str), topic=get("t", "topic", str), retry=retry,
                            start_offset=so,
                            queue_id=get("q", "queueId", int), revive_qid=get("rq", "reviveQueueId", int),
                            pop_time=get("pt", "popTime", int),
                            invisible_time=get("it", "invisibleTime", int),
                            offsets=[so + i for i in decode_bitset(raw)]))
    return out


