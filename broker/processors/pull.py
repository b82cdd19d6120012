# Owns PULL_MESSAGE (11): RocketMQ's PullMessageProcessor + PullRequestHoldService
# over our consume queues (spec §8.5, client-compat #11).
#
#   1. parse PullMessageRequestHeader (values arrive as text, numbers or
#      booleans, client-compat #1; RemotingCommand made them text);
#   2. checks: broker readable, topic exists and readable, queueId in range;
#   3. the subscription: with PullSysFlag SUBSCRIPTION the header's
#      expression (`TagA || TagB`, `*`), else the one the group registered by
#      HEART_BEAT (broker.processors.clients) -- turned into Java String.hashCode tag
#      codes; class filters are refused (NO_PERMISSION), SQL92 expressions
#      unless enablePropertyFilter=true (SYSTEM_ERROR, as in Java; an
#      expression that does not parse: SUBSCRIPTION_PARSE_FAILED first);
#   4. consumequeue.reader.read_messages, bounded by the dispatch position
#      (dispatched implies committed: uncommitted entries are never sent);
#      tags by the consume queue's tags code, SQL92 by the stored record's
#      properties (ExpressionMessageFilter.isMatchedByCommitLog: the units
#      all pass, each record is decoded and its properties evaluated);
#   5. GetMessageStatus -> response code (reader.pull_response_code), header
#      nextBeginOffset/minOffset/maxOffset/suggestWhichBrokerId, remark = the
#      status name, body = the stored records concatenated, unchanged;
#   6. COMMIT_OFFSET (0x1): on the writable leader the commitOffset is staged
#      through metadata (replicated, coalesced); ignored elsewhere, and for
#      negative offsets;
#   7. SUSPEND (0x2) and PULL_NOT_FOUND: the request is held in its own task
#      (the connection runs each request in one) until the dispatched
#      watermark moves and the queue's max offset passes the request offset,
#      or suspendTimeoutMillis (shortPollingTimeMills with long polling off)
#      elapses; then it is answered with a fresh read.  No polling: the wait
#      parks on cq.dispatcher.dispatched.
#
# Roles.  Every node serves reads: consume queues on followers hold exactly
# the committed, dispatched messages.  suggestWhichBrokerId (which broker the
# client should pull this queue from next) follows RocketMQ's slaveReadEnable
# rule of thumb: a consumer whose next message lies more than
# accessMessageInMemoryMaxRatio (40 %) of physical memory behind the
# dispatched end is reading cold data, so the master sends it to a follower
# (the one with the highest match index, by the slave id it registers
# under) to keep that I/O off the master; otherwise the answer is 0 (the
# master).  A follower keeps such a lagging consumer (suggests its own id)
# and sends it back (0) once it has caught up.  The threshold is
# PullProcessor.slave_read_lag_bytes.  Like a RocketMQ slave without
# offsetCheckInSlave, a non-leader does not correct offsets: OFFSET_MOVED
# becomes PULL_RETRY_IMMEDIATELY with nextBeginOffset = the request offset;
# neither does a master whose dispatch is behind its commit index, nor one
# that has not heard from a quorum within an election timeout
# (a follower's dispatch may lag, and resetting a consumer on a lagging view
# would rewind it).
import logging
import os

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
from broker.processors.client_manager import ClientManager
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RequestError
from broker.remoting.header import HeaderReader
from broker.store.broker_store import BrokerStore
from commitlog.errors import CommitLogError
from commitlog.raft.state import Role
from consumequeue.reader import DEFAULT_MAX_BYTES, PullResult, pull_response_code, read_messages
from consumequeue.record import MessageFormatError, decode

log = logging.getLogger("ledgermq.pull")

DEFAULT_SUSPEND_MS = 15000  # the push consumer's brokerSuspendMaxTimeMillis
SHORT_POLLING_MS = 1000  # shortPollingTimeMills
MAX_SUSPEND_MS = 24 * 3600 * 1000  # a sanity bound on a client-chosen hold
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


@attrs.define(eq=False)
class PullProcessor:
    """The RequestDispatcher processor for PULL_MESSAGE."""

    config: LiveConfig
    store: BrokerStore
    clients: ClientManager  # the subscriptions heartbeats registered
    long_polling_enable: bool = True
    short_polling_ms: int = SHORT_POLLING_MS
    max_transfer_bytes: int = DEFAULT_MAX_BYTES
    slave_read_lag_bytes: int = attrs.Factory(default_slave_read_lag_bytes)
    held: int = 0  # requests parked right now (for stats and tests)

    CODES = (RequestCode.PULL_MESSAGE,)

    def register(self, dispatcher) -> None:
        dispatcher.register(RequestCode.PULL_MESSAGE, self)

    async def __call__(self, conn, request: RemotingCommand) -> RemotingCommand:
        return await self.process(request)

    async def process(self, request: RemotingCommand) -> RemotingCommand:
        try:
            header = parse_pull_header(request)
            sub = self._check(header)
        except RequestError as e:
            return request.make_response(e.code, e.remark)
        except (PullError, SubscriptionError) as e:
            return request.make_response(e.code, e.remark)

        leader = self.store.gate.writable
        judge = self._may_correct(leader)
        result = self._read(header, sub, judge)
        code = self._code(result, header.queue_offset, judge)
        if header.commit and leader and header.commit_offset >= 0:
            self._commit(header)
        if code == ResponseCode.PULL_NOT_FOUND and header.suspend:
            timeout_ms = header.suspend_timeout_ms if self.long_polling_enable else self.short_polling_ms
            timeout_ms = min(max(timeout_ms, 0), MAX_SUSPEND_MS)
            if timeout_ms > 0:
                await self._hold(header, timeout_ms / 1000)
                judge = self._may_correct(self.store.gate.writable)
                result = self._read(header, sub, judge)
                code = self._code(result, header.queue_offset, judge)
        return self._response(request, result, code)

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
        replica = self.store.replica
        if not leader or self.store.cq.dispatcher.dispatched.value < replica.committed.value:
            return False
        return replica.has_quorum_contact(replica.core.config.election_timeout_min * replica.tick_seconds)

    def _check(self, h: PullHeader) -> Subscription:
        cfg = self.config.current
        if not cfg.broker_permission & PERM_READ:
            raise PullError(ResponseCode.NO_PERMISSION, f"the broker[{cfg.broker_ip1}] pulling message is forbidden")
        topic_cfg = self.store.metadata.topic_config(h.topic)
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
        return read_messages(self.store.cq, h.topic, h.queue_id, h.queue_offset, max(h.max_msg_nums, 1), max_bytes,
                             None if sub.codes is None else set(sub.codes), correct_offsets=leader,
                             accept=_sql_accept(sub.sql) if sub.is_sql else None)

    @staticmethod
    def _code(result: PullResult, offset: int, leader: bool) -> int:
        code = pull_response_code(result.status, offset)
        if code == ResponseCode.PULL_OFFSET_MOVED and not leader:
            return ResponseCode.PULL_RETRY_IMMEDIATELY  # a slave without offsetCheckInSlave
        return code

    def _commit(self, h: PullHeader) -> None:
        try:
            self.store.metadata.stage_offsets([(h.topic, h.consumer_group, h.queue_id, h.commit_offset)])
        except (CommitLogError, InvalidMetadataError) as e:
            log.debug("pull's commitOffset %s@%s/%d=%d not stored: %s", h.topic, h.consumer_group, h.queue_id,
                      h.commit_offset, e)

    async def _hold(self, h: PullHeader, timeout: float) -> None:
        """Park until the queue holds a message at or after the request
        offset (or its queues were rebuilt), or `timeout` seconds passed:
        only dispatches into this queue wake the pull."""
        self.held += 1
        try:
            with trio.move_on_after(timeout):
                await self.store.cq.dispatcher.arrivals.wait_beyond(h.topic, h.queue_id, h.queue_offset)
        finally:
            self.held -= 1

    def suggest_broker_id(self, result: PullResult) -> int:
        """0 (the master) unless the consumer lags beyond slave_read_lag_bytes
        (see the header)."""
        if not result.phy_offsets:
            return MASTER_ID
        behind = self.store.cq.engine.pos - result.phy_offsets[-1]
        if behind <= self.slave_read_lag_bytes:
            return MASTER_ID
        if not self.store.gate.writable:
            return self.store.broker_id  # stay on this follower while still far behind
        return self._best_follower_id()

    def _best_follower_id(self) -> int:
        replica = self.store.replica
        peers = replica.status().get("peers", {})
        best = max(((p["matchIndex"], pid) for pid, p in peers.items() if pid != replica.node_id), default=None)
        if best is None:
            return MASTER_ID
        rc = self.store.cfg.replication
        return broker_id_for(Role.FOLLOWER, best[1], rc.peer_ids)

    def _response(self, request: RemotingCommand, result: PullResult, code: int) -> RemotingCommand:
        fields = {"nextBeginOffset": result.next_begin_offset, "minOffset": result.min_offset,
                  "maxOffset": result.max_offset, "suggestWhichBrokerId": self.suggest_broker_id(result)}
        body = result.records if code == ResponseCode.SUCCESS else b""
        return request.make_response(code, result.status.value, fields, body)


def _sql_accept(sql):
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
