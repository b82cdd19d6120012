# Owns PULL_MESSAGE (11): RocketMQ's PullMessageProcessor + PullRequestHoldService
# over our consume queues (spec §8.5, client-compat #1, #11): checks, the
# subscription (the header's with PullSysFlag SUBSCRIPTION, else the group's
# from HEART_BEAT, clients.py), the read (consumequeue.reader; the body is the
# stored records unchanged) and COMMIT_OFFSET (0x1).
#
# Rules.  Reads stop at the dispatch position (dispatched implies committed).
# Class filters are refused (NO_PERMISSION); SQL92 needs enablePropertyFilter
# (else SYSTEM_ERROR, as Java; unparsable: SUBSCRIPTION_PARSE_FAILED first) and
# is evaluated on each stored record's properties.  A commitOffset is staged
# through metadata on the writable leader only, never for a negative offset.
# SUSPEND (0x2) and PULL_NOT_FOUND hold the request until the queue's max
# offset passes the request offset (or its queues are rebuilt) or the suspend
# timeout elapses -- at most longPollingSuspendMaxMillis (30 s; clients ask for
# up to 24 h) -- then answer with a fresh read; waits park on the dispatcher's
# per-queue arrivals.  Held pulls are parked, not tasks (PullHolds; its shell
# PullHoldService: one task per queue, one timer), outside the remoting
# budgets but within their own (longPollingMaxHeld*: per connection, address,
# in all); past them SYSTEM_BUSY "[OVERLOAD]" (stock clients retry 3 s later;
# never PULL_NOT_FOUND, re-sent at once).  Their answers count against the
# server's Pacer; a closed connection's parked pulls are dropped at once.
#
# Roles.  Every node serves reads.  suggestWhichBrokerId: a consumer more than
# accessMessageInMemoryMaxRatio (40 %) of physical memory behind the dispatched
# end (slave_read_lag_bytes) is sent by the master to the follower with the
# highest match index, and back to 0 by that follower once caught up.  Offsets
# are corrected only by a master whose dispatch has reached its commit index
# and that heard from a quorum within an election timeout; elsewhere
# OFFSET_MOVED becomes PULL_RETRY_IMMEDIATELY at the request offset (a SUSPEND
# pull beyond the queue is held first): a lagging view never rewinds anyone.
import heapq
import itertools
import logging
import math
import os
from collections.abc import Callable

import attrs
import trio

from broker.common.permissions import PERM_READ
from broker.common.subscription import (
    FLAG_CLASS_FILTER,
    FLAG_COMMIT_OFFSET,
    FLAG_SUBSCRIPTION,
    FLAG_SUSPEND,
    Subscription,
    SubscriptionError,
    parse_subscription,
)
from broker.common.values import InvalidMetadataError
from broker.config import LiveConfig, broker_id_for
from broker.metadata.service import MetadataService
from broker.processors.client_manager import ClientManager
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.containment import exception_desc
from broker.remoting.errors import RequestError
from broker.remoting.header import HeaderReader
from broker.store.gate import RoleGate
from commitlog.errors import CommitLogError
from commitlog.raft.state import Role
from commitlog.replica import ReplicaNode
from consumequeue.dispatcher import DispatchEngine, Dispatcher
from consumequeue.reader import DEFAULT_MAX_BYTES, GetMessageStatus, PullResult, pull_response_code, read_messages
from consumequeue.record import MessageFormatError, decode
from consumequeue.service import ConsumeQueueService

log = logging.getLogger("ledgermq.pull")

# A request offset beyond this node's consume queue (see the hold in _process).
_BEYOND = (GetMessageStatus.OFFSET_OVERFLOW_BADLY, GetMessageStatus.NO_MESSAGE_IN_QUEUE,
           GetMessageStatus.NO_MATCHED_LOGIC_QUEUE)

DEFAULT_SUSPEND_MS = 15000  # the push consumer's brokerSuspendMaxTimeMillis
SHORT_POLLING_MS = 1000  # shortPollingTimeMills
ANSWER_BATCH = 64  # parked pulls answered per scheduler round
# What a parked pull may keep: its group, topic and subscription (a stock
# client's are well under 1 KiB; a SQL92 expression a few).  Longer, the
# pull is not held: the budgets count pulls, and each must stay small.
MAX_PARKED_TEXT = 16 * 1024
MASTER_ID = 0
ACCESS_MESSAGE_IN_MEMORY_MAX_RATIO = 40  # MessageStoreConfig.accessMessageInMemoryMaxRatio (%)


def default_slave_read_lag_bytes() -> int:
    """40 % of physical memory (RocketMQ's isTheBatchFull/suggestPullingFromSlave bound)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 8 << 30
    return total * ACCESS_MESSAGE_IN_MEMORY_MAX_RATIO // 100


class PullError(Exception):
    """A pull the broker refuses: answered with `code` and `remark`."""

    def __init__(self, code: int, remark: str):
        super().__init__(remark)
        self.code, self.remark = code, remark


@attrs.frozen
class PullHeader:
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int
    sys_flag: int
    commit_offset: int
    suspend_timeout_ms: int
    subscription: str | None
    sub_version: int
    expression_type: str | None
    max_msg_bytes: int | None

    @property
    def commit(self) -> bool:
        return bool(self.sys_flag & FLAG_COMMIT_OFFSET)

    @property
    def suspend(self) -> bool:
        return bool(self.sys_flag & FLAG_SUSPEND)

    @property
    def has_subscription(self) -> bool:
        return bool(self.sys_flag & FLAG_SUBSCRIPTION)


def parse_pull_header(request: RemotingCommand) -> PullHeader:
    h = HeaderReader(request.ext_fields)
    return PullHeader(
        consumer_group=h.str("consumerGroup"), topic=h.str("topic"), queue_id=h.int("queueId"),
        queue_offset=h.long("queueOffset"), max_msg_nums=h.int("maxMsgNums"), sys_flag=h.int("sysFlag"),
        commit_offset=h.long("commitOffset"), suspend_timeout_ms=h.long("suspendTimeoutMillis"),
        subscription=h.str("subscription", None), sub_version=h.long("subVersion"),
        expression_type=h.str("expressionType", None), max_msg_bytes=h.int("maxMsgBytes", None))


@attrs.define(eq=False, slots=True)
class Hold:
    """What the first read of a pull found: hold it `timeout` seconds."""

    header: PullHeader
    sub: Subscription
    timeout: float


@attrs.define(eq=False, kw_only=True)
class PullProcessor:
    """The RequestDispatcher processor for PULL_MESSAGE."""

    config: LiveConfig
    gate: RoleGate  # master or slave: who may correct an offset
    metadata: MetadataService  # topic configs, pull's commitOffset
    replica: ReplicaNode  # commit index and quorum contact; the followers' match indexes
    cq: ConsumeQueueService  # what pulls read
    queues: DispatchEngine  # the consume queues, the dispatch position
    dispatcher: Dispatcher  # arrivals wake held pulls; how far dispatch got
    clients: ClientManager  # the subscriptions heartbeats registered
    long_polling_enable: bool = True
    short_polling_ms: int = SHORT_POLLING_MS
    max_transfer_bytes: int = DEFAULT_MAX_BYTES
    slave_read_lag_bytes: int = attrs.Factory(default_slave_read_lag_bytes)
    held_in_tasks: int = 0  # process() calls holding in their own task
    holds: "PullHoldService" = attrs.field(init=False)

    CODES = (RequestCode.PULL_MESSAGE,)

    def __attrs_post_init__(self) -> None:
        self.holds = PullHoldService(self)

    @property
    def held(self) -> int:
        """Pulls held right now, parked or in a task (for stats and tests)."""
        return self.held_in_tasks + self.holds.table.total

    def register(self, dispatcher) -> None:
        dispatcher.register(RequestCode.PULL_MESSAGE, self)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The hold service (a broker service): without it running, pulls
        from connections hold in their own task as process() does."""
        await self.holds.run(task_status=task_status)

    def forget(self, conn) -> None:
        """A closed connection's parked pulls go (the server's on_close)."""
        self.holds.forget(conn)

    async def __call__(self, conn, request: RemotingCommand,
                       on_answer: Callable[[RemotingCommand], None] | None = None) -> RemotingCommand | None:
        """The answer, or None when the pull is parked: it is answered later
        on `conn` (and on_answer(response) is called then)."""
        out = self._begin(request)
        if type(out) is not Hold:
            return out
        if not self.holds.running:
            return await self._hold_here(request, out)
        return self.holds.park(conn, request, out, on_answer)

    async def process(self, request: RemotingCommand) -> RemotingCommand:
        """Answer one pull, holding it in this task when it must wait."""
        out = self._begin(request)
        if type(out) is not Hold:
            return out
        return await self._hold_here(request, out)

    def _begin(self, request: RemotingCommand) -> RemotingCommand | Hold:
        """Steps 1-7 up to the hold: the answer, or what to hold."""
        try:
            header = parse_pull_header(request)
            sub = self._check(header)
        except RequestError as e:
            return request.make_response(e.code, e.remark)
        except (PullError, SubscriptionError) as e:
            return request.make_response(e.code, e.remark)

        leader = self.gate.writable
        judge = self._may_correct(leader)
        result = self._read(header, sub, judge)
        code = self._code(result, header.queue_offset, judge)
        if header.commit and leader and header.commit_offset >= 0:
            self._commit(header)
        beyond = not judge and result.status in _BEYOND and code == ResponseCode.PULL_RETRY_IMMEDIATELY
        if header.suspend and (code == ResponseCode.PULL_NOT_FOUND or beyond):
            # (An offset beyond what this node has dispatched, on a node that
            # may not correct it -- a slave, a master whose dispatch lags its
            # commit: the messages may be committed and on their way into
            # the queue, so the pull waits for them as for a new one.)
            timeout_ms = header.suspend_timeout_ms if self.long_polling_enable else self.short_polling_ms
            timeout_ms = min(max(timeout_ms, 0), self.config.current.long_polling_suspend_max_ms)
            if timeout_ms > 0:
                return Hold(header, sub, timeout_ms / 1000)
        return self._response(request, result, code)

    def finish(self, request: RemotingCommand, hold: Hold) -> RemotingCommand:
        """The answer to a held pull: a fresh read."""
        judge = self._may_correct(self.gate.writable)
        result = self._read(hold.header, hold.sub, judge)
        return self._response(request, result, self._code(result, hold.header.queue_offset, judge))

    async def _hold_here(self, request: RemotingCommand, hold: Hold) -> RemotingCommand:
        """Park this task until the queue holds a message at or after the
        request offset (or its queues were rebuilt), or the hold's timeout
        passed: only dispatches into this queue wake the pull."""
        h = hold.header
        self.held_in_tasks += 1
        try:
            with trio.move_on_after(hold.timeout):
                await self.dispatcher.arrivals.wait_beyond(h.topic, h.queue_id, h.queue_offset)
        finally:
            self.held_in_tasks -= 1
        return self.finish(request, hold)

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.cqs.get(topic, queue_id)
        return -1 if cq is None else cq.max_offset

    # --- steps ------------------------------------------------------------------

    def _may_correct(self, leader: bool) -> bool:
        """Whether this node may call an offset illegal and move the consumer:
        only the writable master, only while its consume queues hold every
        committed entry, and only while it has heard from a quorum within an
        election timeout of real time.  A consumer can be ahead of a master
        whose dispatch lags (it read further on a slave that dispatched
        faster: the nemesis saw offset 1907 moved to 0 by a master at 1905
        after that slave died) and ahead of a stale master (one just
        continued after SIGSTOP, or cut off, still writable until its
        check-quorum ticks run, while a newer master took writes); either
        way moving it to 0 redelivered whole queues."""
        replica = self.replica
        if not leader or self.dispatcher.dispatched.value < replica.committed.value:
            return False
        return replica.has_quorum_contact(replica.core.config.election_timeout_min * replica.tick_seconds)

    def _check(self, h: PullHeader) -> Subscription:
        cfg = self.config.current
        if not cfg.broker_permission & PERM_READ:
            raise PullError(ResponseCode.NO_PERMISSION, f"the broker[{cfg.broker_ip1}] pulling message is forbidden")
        topic_cfg = self.metadata.topic_config(h.topic)
        if topic_cfg is None:
            raise PullError(ResponseCode.TOPIC_NOT_EXIST,
                            f"topic[{h.topic}] not exist, apply first please!")
        if not topic_cfg.perm & PERM_READ:
            raise PullError(ResponseCode.NO_PERMISSION, f"the topic[{h.topic}] pulling message is forbidden")
        if not 0 <= h.queue_id < topic_cfg.read_queue_nums:
            raise PullError(ResponseCode.SYSTEM_ERROR,
                            f"queueId[{h.queue_id}] is illegal, topic:[{h.topic}] "
                            f"topicConfig.readQueueNums:[{topic_cfg.read_queue_nums}] consumer:[{h.consumer_group}]")
        if h.sys_flag & FLAG_CLASS_FILTER:
            raise PullError(ResponseCode.NO_PERMISSION, "The broker does not support class filter")
        if h.has_subscription:
            return self._allowed(parse_subscription(h.subscription, h.sub_version, h.expression_type))
        # The subscription the group registered by heartbeat.
        manager = self.clients
        group = manager.group(h.consumer_group)
        if group is None:
            raise PullError(ResponseCode.SUBSCRIPTION_NOT_EXIST,
                            f"the consumer's group info not exist: {h.consumer_group}")
        data = group.subscriptions.get(h.topic)
        if data is None:
            raise PullError(ResponseCode.SUBSCRIPTION_NOT_EXIST,
                            f"the consumer's subscription not exist: {h.topic}@{h.consumer_group}")
        if data.sub_version < h.sub_version:
            raise PullError(ResponseCode.SUBSCRIPTION_NOT_LATEST, "the consumer's subscription not latest")
        return self._allowed(data.subscription())

    def _allowed(self, sub: Subscription) -> Subscription:
        if sub.is_sql and not self.config.current.enable_property_filter:
            raise PullError(ResponseCode.SYSTEM_ERROR,  # as Java's PullMessageProcessor answers
                            f"The broker does not support consumer to filter message by {sub.expression_type}")
        return sub

    def _read(self, h: PullHeader, sub: Subscription, leader: bool) -> PullResult:
        max_bytes = self.max_transfer_bytes
        if h.max_msg_bytes is not None and h.max_msg_bytes > 0:
            max_bytes = min(max_bytes, h.max_msg_bytes)
        return read_messages(self.cq, h.topic, h.queue_id, h.queue_offset, max(h.max_msg_nums, 1), max_bytes,
                             None if sub.codes is None else set(sub.codes), correct_offsets=leader,
                             accept=sql_accept(sub.sql) if sub.is_sql else None)

    @staticmethod
    def _code(result: PullResult, offset: int, leader: bool) -> int:
        code = pull_response_code(result.status, offset)
        if code == ResponseCode.PULL_OFFSET_MOVED and not leader:
            return ResponseCode.PULL_RETRY_IMMEDIATELY  # a slave without offsetCheckInSlave
        return code

    def _commit(self, h: PullHeader) -> None:
        try:
            self.metadata.stage_offsets([(h.topic, h.consumer_group, h.queue_id, h.commit_offset)])
        except (CommitLogError, InvalidMetadataError) as e:
            log.debug("pull's commitOffset %s@%s/%d=%d not stored: %s", h.topic, h.consumer_group, h.queue_id,
                      h.commit_offset, e)

    def suggest_broker_id(self, result: PullResult) -> int:
        """0 (the master) unless the consumer lags beyond slave_read_lag_bytes
        (see the header)."""
        if not result.phy_offsets:
            return MASTER_ID
        behind = self.queues.pos - result.phy_offsets[-1]
        if behind <= self.slave_read_lag_bytes:
            return MASTER_ID
        if not self.gate.writable:
            return self.gate.broker_id  # stay on this follower while still far behind
        return self._best_follower_id()

    def _best_follower_id(self) -> int:
        replica = self.replica
        peers = replica.status().get("peers", {})
        best = max(((p["matchIndex"], pid) for pid, p in peers.items() if pid != replica.node_id), default=None)
        if best is None:
            return MASTER_ID
        rc = self.config.current.replication
        return broker_id_for(Role.FOLLOWER, best[1], rc.peer_ids)

    def _response(self, request: RemotingCommand, result: PullResult, code: int) -> RemotingCommand:
        fields = {"nextBeginOffset": result.next_begin_offset, "minOffset": result.min_offset,
                  "maxOffset": result.max_offset, "suggestWhichBrokerId": self.suggest_broker_id(result)}
        body = result.records if code == ResponseCode.SUCCESS else b""
        return request.make_response(code, result.status.value, fields, body)


def sql_accept(sql):
    """The reader's record predicate for a SQL92 subscription: the record's
    properties (TAGS, KEYS and the user's) against the expression.  A record
    that does not decode is passed on: the client reports it, we do not hide it."""
    def accept(record) -> bool:
        try:
            props = decode(record).properties
        except MessageFormatError:
            return True
        return sql.matches(props)
    return accept


# --- long polls parked by connection (see the header) -----------------------------


@attrs.define(eq=False, slots=True, kw_only=True)
class Parked:
    """One pull held for a connection."""

    seq: int
    conn: object
    address: str
    request: RemotingCommand
    hold: Hold
    deadline: float
    on_answer: Callable[[RemotingCommand], None] | None = None

    @property
    def key(self) -> tuple[str, int]:
        return self.hold.header.topic, self.hold.header.queue_id

    @property
    def offset(self) -> int:
        return self.hold.header.queue_offset


def client_address(conn) -> str:
    """A connection's client address without its port (what the budgets count by)."""
    return str(getattr(conn, "remote_address", "?")).rpartition(":")[0] or "?"


@attrs.define(eq=False)
class PullHolds:
    """The table of parked pulls: by sequence, by connection, by queue, the
    counts the budgets read, and the deadlines (a heap; entries of pulls
    gone are skipped and, when they pile up, dropped).  No I/O, no clock."""

    by_seq: dict[int, Parked] = attrs.Factory(dict)
    by_conn: dict[object, dict[int, Parked]] = attrs.Factory(dict)
    by_queue: dict[tuple[str, int], dict[int, Parked]] = attrs.Factory(dict)
    by_address: dict[str, int] = attrs.Factory(dict)
    deadlines: list[tuple[float, int]] = attrs.Factory(list)
    refused: dict[str, int] = attrs.Factory(lambda: {"connection": 0, "address": 0, "broker": 0})
    parked: int = 0  # ever
    woken: int = 0  # answered because their queue moved
    expired: int = 0  # answered at their deadline

    @property
    def total(self) -> int:
        return len(self.by_seq)

    def refusal(self, conn, address: str, per_connection: int, per_address: int, total: int) -> str | None:
        """Why one more pull cannot be parked for `conn`, or None."""
        if len(self.by_conn.get(conn, ())) >= per_connection:
            self.refused["connection"] += 1
            return f"{per_connection} pulls held for this connection (longPollingMaxHeldPerConnection)"
        if self.by_address.get(address, 0) >= per_address:
            self.refused["address"] += 1
            return f"{per_address} pulls held for {address} (longPollingMaxHeldPerAddress)"
        if len(self.by_seq) >= total:
            self.refused["broker"] += 1
            return f"{total} pulls held (longPollingMaxHeld)"
        return None

    def add(self, p: Parked) -> None:
        self.by_seq[p.seq] = p
        self.by_conn.setdefault(p.conn, {})[p.seq] = p
        self.by_queue.setdefault(p.key, {})[p.seq] = p
        self.by_address[p.address] = self.by_address.get(p.address, 0) + 1
        heapq.heappush(self.deadlines, (p.deadline, p.seq))
        self.parked += 1

    def remove(self, p: Parked) -> bool:
        """Take `p` out (if still in); True if its queue has no pull left."""
        if self.by_seq.pop(p.seq, None) is None:
            return False
        mine = self.by_conn[p.conn]
        del mine[p.seq]
        if not mine:
            del self.by_conn[p.conn]
        n = self.by_address[p.address] - 1
        if n:
            self.by_address[p.address] = n
        else:
            del self.by_address[p.address]
        if len(self.deadlines) > 2 * len(self.by_seq) + 64:
            self.deadlines = [(q.deadline, q.seq) for q in self.by_seq.values()]
            heapq.heapify(self.deadlines)
        queue = self.by_queue[p.key]
        del queue[p.seq]
        if queue:
            return False
        del self.by_queue[p.key]
        return True

    def of_conn(self, conn) -> list[Parked]:
        return list(self.by_conn.get(conn, {}).values())

    def on_queue(self, key: tuple[str, int]) -> list[Parked]:
        return list(self.by_queue.get(key, {}).values())

    def next_deadline(self) -> float:
        while self.deadlines and self.deadlines[0][1] not in self.by_seq:
            heapq.heappop(self.deadlines)
        return self.deadlines[0][0] if self.deadlines else math.inf

    def due(self, now: float, limit: int) -> list[Parked]:
        """Up to `limit` pulls whose deadline is past (still in the table)."""
        out = []
        while self.deadlines and len(out) < limit and self.deadlines[0][0] <= now:
            _, seq = heapq.heappop(self.deadlines)
            p = self.by_seq.get(seq)
            if p is not None:
                out.append(p)
        return out


@attrs.define(eq=False)
class _Watch:
    """The task waiting for one queue's arrivals on behalf of its parked pulls."""

    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)  # the whole task
    wait: trio.CancelScope | None = None  # its current wait
    low: int = -1  # the offset that wait is for


class PullHoldService:
    """The shell around PullHolds: parks pulls (park), answers them when
    their queue moves (one _watch task per queue with parked pulls) or at
    their deadline (one timer task), and drops a closed connection's
    (forget).  Answers go out through conn.send_response_soon, within the
    remoting server's Pacer (or ANSWER_BATCH a step without one)."""

    def __init__(self, processor: PullProcessor, clock=trio.current_time) -> None:
        self.processor = processor
        self.table = PullHolds()
        self._clock = clock
        self._seq = itertools.count(1)
        self._nursery: trio.Nursery | None = None
        self._watches: dict[tuple[str, int], _Watch] = {}
        self._timer_changed = trio.Event()
        self._armed = math.inf  # the deadline the timer sleeps until
        self.pacer = None  # the remoting server's Pacer (broker/server.py wires it)
        self._answered_in_step = 0

    @property
    def running(self) -> bool:
        return self._nursery is not None

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._expire)
                task_status.started()
        finally:
            self._nursery = None

    def park(self, conn, request: RemotingCommand, hold: Hold,
             on_answer: Callable[[RemotingCommand], None] | None) -> RemotingCommand | None:
        """Park the pull (None), or the answer when its budgets are full."""
        cfg = self.processor.config.current
        address = client_address(conn)
        h = hold.header
        text = len(h.consumer_group) + len(h.topic) + len(h.subscription or "") + len(h.expression_type or "")
        if text > MAX_PARKED_TEXT:
            why = f"a pull naming {text} characters of group, topic and subscription (at most {MAX_PARKED_TEXT})"
        else:
            why = self.table.refusal(conn, address, cfg.long_polling_max_held_per_connection,
                                     cfg.long_polling_max_held_per_address, cfg.long_polling_max_held)
        if why is not None:
            return request.make_response(ResponseCode.SYSTEM_BUSY,
                                         f"[OVERLOAD]{why}; this pull is not held, pull again later")
        # Only what the answer needs is kept (the parsed header is in `hold`):
        # not the request's fields and body, which a client chooses.
        bare = RemotingCommand.trusted(request.code, request.language, request.version, request.opaque,
                                       request.flag, None, {}, b"", request.serialize_type)
        p = Parked(seq=next(self._seq), conn=conn, address=address, request=bare, hold=hold,
                   deadline=self._clock() + hold.timeout, on_answer=on_answer)
        self.table.add(p)
        watch = self._watches.get(p.key)
        if watch is None:
            watch = self._watches[p.key] = _Watch()
            self._nursery.start_soon(self._watch, p.key, watch)
        elif watch.wait is not None and p.offset < watch.low:
            watch.wait.cancel()  # it waits for a later offset than this pull needs
        if p.deadline < self._armed:
            self._timer_changed.set()
        return None

    def forget(self, conn) -> None:
        for p in self.table.of_conn(conn):
            self._remove(p)

    def _remove(self, p: Parked) -> None:
        if self.table.remove(p):
            watch = self._watches.pop(p.key, None)
            if watch is not None:
                watch.scope.cancel()

    def _answer(self, p: Parked) -> None:
        """A fresh read for `p`, sent on its connection (if it is still open)."""
        self._remove(p)
        try:
            response = self.processor.finish(p.request, p.hold)
        except Exception as e:  # a bug here must not end the service, which would end the broker
            log.exception("answering a held pull of %s failed", p.conn)
            response = p.request.make_response(ResponseCode.SYSTEM_ERROR, exception_desc(e))
        send = getattr(p.conn, "send_response_soon", None)
        if send is not None and send(p.request, response) and p.on_answer is not None:
            p.on_answer(response)

    async def _turn(self) -> None:
        """Wait, if need be, until this scheduler round has room for one more
        answer: the remoting server's Pacer when wired (answers count with
        the requests the connections hand over), else ANSWER_BATCH a round."""
        if self.pacer is not None:
            while not self.pacer.take(1):
                await self.pacer.next_round()
            return
        self._answered_in_step += 1
        if self._answered_in_step >= ANSWER_BATCH:
            self._answered_in_step = 0
            await trio.lowlevel.checkpoint()

    async def _answer_all(self, parked: list[Parked]) -> None:
        for p in parked:
            if p.seq in self.table.by_seq:
                await self._turn()
                if p.seq in self.table.by_seq:  # (still: forget() may have run meanwhile)
                    self._answer(p)

    async def _watch(self, key: tuple[str, int], watch: _Watch) -> None:
        topic, queue_id = key
        arrivals = self.processor.dispatcher.arrivals
        with watch.scope:
            while True:
                parked = self.table.on_queue(key)
                if not parked:
                    return
                watch.low = low = min(p.offset for p in parked)
                with trio.CancelScope() as wait:
                    watch.wait = wait
                    await arrivals.wait_beyond(topic, queue_id, low)
                watch.wait = None
                if wait.cancelled_caught:
                    continue  # a pull for an earlier offset was parked: wait for that one
                top = self.processor.max_offset(topic, queue_id)
                if top <= low:  # woken by a reset (queues rebuilt or rebased): everyone re-reads
                    ready = self.table.on_queue(key)
                else:
                    ready = [p for p in self.table.on_queue(key) if p.offset < top]
                self.table.woken += len(ready)
                await self._answer_all(ready)

    async def _expire(self) -> None:
        while True:
            self._armed = self.table.next_deadline()
            self._timer_changed = trio.Event()
            with trio.move_on_at(self._armed):
                await self._timer_changed.wait()
            while due := self.table.due(self._clock(), ANSWER_BATCH):
                self.table.expired += len(due)
                await self._answer_all(due)

