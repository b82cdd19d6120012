# Owns the broker's client-facing consumer/offset requests and its client
# registry (RocketMQ's ConsumerManageProcessor, ClientManageProcessor,
# ConsumerManager/ProducerManager, ClientHousekeepingService):
#
#   QUERY_CONSUMER_OFFSET 14       committed (or staged) offset; with none,
#                                  SUCCESS 0 while the queue still starts at
#                                  0, else QUERY_NOT_FOUND 22 (client-compat #7)
#   UPDATE_CONSUMER_OFFSET 15      staged through metadata (replicated,
#                                  coalesced) on the writable leader; negative
#                                  offsets ignored; answered unless oneway
#                                  (client-compat #8)
#   GET_MAX_OFFSET 30 / GET_MIN_OFFSET 31 / SEARCH_OFFSET_BY_TIMESTAMP 29 /
#   GET_EARLIEST_MSG_STORETIME 32  over the consume queues (committed only)
#   HEART_BEAT 34                  producer/consumer registration; enums by
#                                  name or ordinal (client-compat #5); on
#                                  the writable leader each consumer group
#                                  and its %RETRY%<group> topic are
#                                  auto-created through the replicated
#                                  metadata (broker.retry), as Java does
#   UNREGISTER_CLIENT 35
#   GET_CONSUMER_LIST_BY_GROUP 38  {"consumerIdList":[...]}
#
# and NOTIFY_CONSUMER_IDS_CHANGED (40, oneway, header consumerGroup) pushed
# to the group's other connections when its membership changes (a client
# registers, unregisters, its connection closes or its heartbeat expires).
#
# Wiring for the server (register() returns the ClientManager):
#   manager = consumer.register(dispatcher, broker)
#   nursery.start_soon(manager.run)        # notifications + expiry timer
#   serve_remoting(..., on_close=manager.on_connection_closed)
# The manager is also set as broker.client_manager when that attribute can
# be set (broker.pull finds the heartbeat subscriptions there).  Without
# run() the registry still works (reads skip expired clients and closed
# connections) but notifications wait in the queue until it runs.  Without
# the on_close hook a closed connection's clients are skipped at once and
# dropped (with notification) by the next expiry scan.
import enum
import inspect
import logging
import math
import time
import typing

import attrs
import trio

from broker.metadata.tables import InvalidMetadataError
from broker.pull import Subscription, broker_config, parse_subscription
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RemotingError, RequestError
from broker.remoting.header import HeaderReader, decode_json, encode_json
from commitlog.errors import CommitLogError, NotLeaderError

log = logging.getLogger("ledgermq.consumer")

CHANNEL_EXPIRED_MS = 120_000  # ConsumerManager/ProducerManager channelExpiredTimeout
SCAN_INTERVAL_S = 10.0  # ClientHousekeepingService period
NOTIFY_TIMEOUT_S = 3.0


class ConsumeType(enum.Enum):
    CONSUME_ACTIVELY = 0
    CONSUME_PASSIVELY = 1
    CONSUME_POP = 2


class MessageModel(enum.Enum):
    BROADCASTING = 0
    CLUSTERING = 1


class ConsumeFromWhere(enum.Enum):
    CONSUME_FROM_LAST_OFFSET = 0
    CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST = 1
    CONSUME_FROM_MIN_OFFSET = 2
    CONSUME_FROM_MAX_OFFSET = 3
    CONSUME_FROM_FIRST_OFFSET = 4
    CONSUME_FROM_TIMESTAMP = 5


E = typing.TypeVar("E", bound=enum.Enum)


def parse_enum(enum_type: type[E], value: object, default: E) -> E:
    """An enum sent by name (`"CLUSTERING"`) or ordinal (`1`, `"1"`)."""
    if value is None:
        return default
    if isinstance(value, bool):
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"bad {enum_type.__name__}: {value!r}")
    if isinstance(value, int) or (isinstance(value, str) and value.strip().lstrip("-").isdigit()):
        try:
            return list(enum_type)[int(value)] if int(value) >= 0 else _bad_enum(enum_type, value)
        except IndexError:
            return _bad_enum(enum_type, value)
    if isinstance(value, str):
        try:
            return enum_type[value.strip()]
        except KeyError:
            return _bad_enum(enum_type, value)
    return _bad_enum(enum_type, value)


def _bad_enum(enum_type, value):
    raise RequestError(ResponseCode.SYSTEM_ERROR, f"bad {enum_type.__name__}: {value!r}")


@attrs.frozen
class SubscriptionData:
    topic: str
    sub_string: str
    tags: tuple[str, ...] = ()
    codes: tuple[int, ...] = ()
    sub_version: int = 0
    expression_type: str = "TAG"

    def subscription(self) -> Subscription:
        """The filter pulls without the SUBSCRIPTION flag use."""
        if self.sub_string.strip() in ("", "*"):
            return Subscription("*", sub_version=self.sub_version)
        if self.codes:
            return Subscription(self.sub_string, frozenset(self.tags), frozenset(self.codes), self.sub_version,
                                self.expression_type)
        return parse_subscription(self.sub_string, self.sub_version, self.expression_type)


def _parse_subscription_data(d: dict) -> SubscriptionData:
    if not isinstance(d, dict) or not isinstance(d.get("topic"), str):
        raise RequestError(ResponseCode.SYSTEM_ERROR, "heartbeat subscription without a topic")
    sub = d.get("subString")
    sub = "*" if sub is None else str(sub)
    tags = tuple(str(t) for t in d.get("tagsSet") or ())
    try:
        codes = tuple(int(c) for c in d.get("codeSet") or ())
        version = int(d.get("subVersion") or 0)
    except (TypeError, ValueError):
        raise RequestError(ResponseCode.SYSTEM_ERROR, "heartbeat subscription with bad codeSet/subVersion") from None
    return SubscriptionData(d["topic"], sub, tags, codes, version, str(d.get("expressionType") or "TAG"))


@attrs.define(eq=False)
class ClientChannel:
    client_id: str
    conn: object
    language: object
    version: int
    last_update_ms: int


@attrs.define(eq=False)
class ConsumerGroupInfo:
    name: str
    consume_type: ConsumeType = ConsumeType.CONSUME_PASSIVELY
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    channels: dict[str, ClientChannel] = attrs.Factory(dict)  # client id -> channel
    subscriptions: dict[str, SubscriptionData] = attrs.Factory(dict)  # topic -> data


@attrs.define(eq=False)
class ClientManager:
    """Consumer and producer registries with expiry, plus the notifier."""

    clock_ms: typing.Callable[[], int] = lambda: int(time.time() * 1000)
    expired_ms: int = CHANNEL_EXPIRED_MS
    notify_enabled: bool = True
    consumers: dict[str, ConsumerGroupInfo] = attrs.Factory(dict)
    producers: dict[str, dict[str, ClientChannel]] = attrs.Factory(dict)
    notifications_sent: int = 0
    _send: trio.MemorySendChannel = attrs.field(init=False)
    _recv: trio.MemoryReceiveChannel = attrs.field(init=False)

    def __attrs_post_init__(self):
        self._send, self._recv = trio.open_memory_channel(math.inf)

    # --- reads -------------------------------------------------------------------

    def _alive(self, ch: ClientChannel, now: int) -> bool:
        return now - ch.last_update_ms <= self.expired_ms and not getattr(ch.conn, "closed", False)

    def group(self, name: str) -> ConsumerGroupInfo | None:
        return self.consumers.get(name)

    def consumer_ids(self, group: str) -> list[str]:
        info = self.consumers.get(group)
        if info is None:
            return []
        now = self.clock_ms()
        return [cid for cid, ch in info.channels.items() if self._alive(ch, now)]

    def producer_ids(self, group: str) -> list[str]:
        now = self.clock_ms()
        return [cid for cid, ch in self.producers.get(group, {}).items() if self._alive(ch, now)]

    # --- changes ---------------------------------------------------------------

    def heartbeat(self, conn, request: RemotingCommand, data: dict) -> None:
        client_id = data.get("clientID")
        if not isinstance(client_id, str) or not client_id:
            raise RequestError(ResponseCode.SYSTEM_ERROR, "heartbeat without a clientID")
        now = self.clock_ms()
        consumer_sets = data.get("consumerDataSet") or []
        producer_sets = data.get("producerDataSet") or []
        if not isinstance(consumer_sets, list) or not isinstance(producer_sets, list):
            raise RequestError(ResponseCode.SYSTEM_ERROR, "heartbeat data sets must be lists")
        # Parse everything before changing anything.
        parsed = []
        for cd in consumer_sets:
            if not isinstance(cd, dict) or not isinstance(cd.get("groupName"), str) or not cd["groupName"]:
                raise RequestError(ResponseCode.SYSTEM_ERROR, "heartbeat consumer data without a groupName")
            subs = [_parse_subscription_data(s) for s in cd.get("subscriptionDataSet") or []]
            parsed.append((cd["groupName"],
                           parse_enum(ConsumeType, cd.get("consumeType"), ConsumeType.CONSUME_PASSIVELY),
                           parse_enum(MessageModel, cd.get("messageModel"), MessageModel.CLUSTERING),
                           parse_enum(ConsumeFromWhere, cd.get("consumeFromWhere"),
                                      ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET), subs))
        producer_groups = []
        for pd in producer_sets:
            if not isinstance(pd, dict) or not isinstance(pd.get("groupName"), str) or not pd["groupName"]:
                raise RequestError(ResponseCode.SYSTEM_ERROR, "heartbeat producer data without a groupName")
            producer_groups.append(pd["groupName"])
        attributes = getattr(conn, "attributes", None)
        if attributes is not None:
            attributes["clientID"] = client_id
        for group, ctype, model, cfw, subs in parsed:
            info = self.consumers.setdefault(group, ConsumerGroupInfo(group))
            info.consume_type, info.message_model, info.consume_from_where = ctype, model, cfw
            old = info.channels.get(client_id)
            joined = old is None or not self._alive(old, now)
            info.channels[client_id] = ClientChannel(client_id, conn, request.language, request.version, now)
            # updateSubscription: the heartbeat's set replaces the group's.
            # (A Java broker keeps the newer subVersion per topic.)
            fresh = {}
            for s in subs:
                cur = info.subscriptions.get(s.topic)
                fresh[s.topic] = cur if cur is not None and cur.sub_version > s.sub_version else s
            if subs or not info.subscriptions:
                info.subscriptions = fresh
            if joined:
                log.info("consumer %s joined group %s", client_id, group)
                self._notify(group, exclude=client_id)
        for group in producer_groups:
            self.producers.setdefault(group, {})[client_id] = ClientChannel(
                client_id, conn, request.language, request.version, now)

    def unregister(self, client_id: str, *, producer_group: str | None = None,
                   consumer_group: str | None = None) -> None:
        if producer_group:
            chans = self.producers.get(producer_group)
            if chans is not None:
                chans.pop(client_id, None)
                if not chans:
                    del self.producers[producer_group]
        if consumer_group:
            self._remove_consumer(consumer_group, client_id)

    def _remove_consumer(self, group: str, client_id: str, conn=None) -> bool:
        info = self.consumers.get(group)
        if info is None:
            return False
        ch = info.channels.get(client_id)
        if ch is None or (conn is not None and ch.conn is not conn):
            return False
        del info.channels[client_id]
        log.info("consumer %s left group %s", client_id, group)
        if not info.channels:
            del self.consumers[group]
        else:
            self._notify(group)
        return True

    def on_connection_closed(self, conn) -> None:
        """serve_remoting's on_close: forget every client on `conn`."""
        for group, info in list(self.consumers.items()):
            for cid, ch in list(info.channels.items()):
                if ch.conn is conn:
                    self._remove_consumer(group, cid, conn)
        for group, chans in list(self.producers.items()):
            for cid, ch in list(chans.items()):
                if ch.conn is conn:
                    del chans[cid]
            if not chans:
                del self.producers[group]

    def scan_expired(self) -> int:
        """Drop clients without a heartbeat for expired_ms (and closed
        connections); returns how many were dropped."""
        now, dropped = self.clock_ms(), 0
        for group, info in list(self.consumers.items()):
            for cid, ch in list(info.channels.items()):
                if not self._alive(ch, now):
                    dropped += self._remove_consumer(group, cid, ch.conn)
        for group, chans in list(self.producers.items()):
            for cid, ch in list(chans.items()):
                if not self._alive(ch, now):
                    del chans[cid]
                    dropped += 1
            if not chans:
                del self.producers[group]
        return dropped

    # --- notifications -------------------------------------------------------------

    def _notify(self, group: str, exclude: str | None = None) -> None:
        if not self.notify_enabled:
            return
        info = self.consumers.get(group)
        if info is None:
            return
        now = self.clock_ms()
        for cid, ch in info.channels.items():
            if cid != exclude and self._alive(ch, now) and hasattr(ch.conn, "send_request_oneway"):
                self._send.send_nowait((ch.conn, group))

    async def _deliver(self, conn, group: str) -> None:
        cmd = RemotingCommand.create_request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})
        try:
            await conn.send_request_oneway(cmd, timeout=NOTIFY_TIMEOUT_S)
            self.notifications_sent += 1
        except (RemotingError, OSError, trio.BrokenResourceError, trio.ClosedResourceError) as e:
            log.debug("NOTIFY_CONSUMER_IDS_CHANGED to %r failed: %s", conn, e)

    async def run(self, *, scan_interval: float = SCAN_INTERVAL_S, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Deliver notifications (each in its own task: a slow client delays
        nobody) and run the expiry scan every scan_interval seconds."""
        async def scanner():
            while True:
                await trio.sleep(scan_interval)  # a timer, not a poll
                self.scan_expired()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(scanner)
            task_status.started(self)
            async for conn, group in self._recv:
                nursery.start_soon(self._deliver, conn, group)


class _Managers:
    """One ClientManager per broker object (pull looks up subscriptions in
    the same registry the heartbeats fill)."""

    def __init__(self):
        self._by_id: dict[int, tuple[object, ClientManager]] = {}

    def get(self, broker) -> ClientManager:
        mgr = getattr(broker, "client_manager", None)
        if isinstance(mgr, ClientManager):
            return mgr
        entry = self._by_id.get(id(broker))
        if entry is not None and entry[0] is broker:
            return entry[1]
        mgr = ClientManager()
        try:
            broker.client_manager = mgr
        except (AttributeError, TypeError):
            self._by_id[id(broker)] = (broker, mgr)
        return mgr


_managers = _Managers()


def manager_for(broker) -> ClientManager:
    return _managers.get(broker)


# --- the processor ------------------------------------------------------------------


@attrs.define(eq=False)
class ConsumerProcessor:
    broker: object  # .store (BrokerStore), .config (BrokerConfig)
    manager: ClientManager

    CODES = (RequestCode.QUERY_CONSUMER_OFFSET, RequestCode.UPDATE_CONSUMER_OFFSET, RequestCode.GET_MAX_OFFSET,
             RequestCode.GET_MIN_OFFSET, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
             RequestCode.GET_EARLIEST_MSG_STORETIME, RequestCode.HEART_BEAT, RequestCode.UNREGISTER_CLIENT,
             RequestCode.GET_CONSUMER_LIST_BY_GROUP)

    @property
    def bs(self):
        return self.broker.store

    def register(self, dispatcher) -> None:
        for code in self.CODES:
            dispatcher.register(code, self)

    async def __call__(self, conn, request: RemotingCommand) -> RemotingCommand | None:
        handler = {
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.update_consumer_offset,
            RequestCode.GET_MAX_OFFSET: self.get_max_offset,
            RequestCode.GET_MIN_OFFSET: self.get_min_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset_by_timestamp,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self.get_earliest_msg_storetime,
            RequestCode.HEART_BEAT: self.heart_beat,
            RequestCode.UNREGISTER_CLIENT: self.unregister_client,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.get_consumer_list_by_group,
        }[request.code]
        try:
            response = handler(conn, request)
            if inspect.isawaitable(response):
                response = await response
        except RequestError as e:
            response = request.make_response(e.code, e.remark)
        return None if request.is_oneway else response

    # --- helpers -------------------------------------------------------------------

    def _cq(self, topic: str, queue_id: int):
        return self.bs.cq.engine.cqs.get(topic, queue_id)

    def _min_max(self, topic: str, queue_id: int) -> tuple[int, int]:
        cq = self._cq(topic, queue_id)
        return (0, 0) if cq is None else (cq.min_offset, cq.max_offset)

    # --- offsets ---------------------------------------------------------------------

    def query_consumer_offset(self, conn, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        group, topic, queue_id = h.str("consumerGroup"), h.str("topic"), h.int("queueId")
        set_zero = h.bool("setZeroIfNotFound", True)
        offset = self.bs.metadata.query_offset(topic, group, queue_id)
        if offset is not None and offset >= 0:
            return request.make_response(ResponseCode.SUCCESS, None, {"offset": offset})
        if set_zero:
            lo, _ = self._min_max(topic, queue_id)
            # checkInMemByConsumeOffset(0): message 0 is still stored
            if lo <= 0:
                return request.make_response(ResponseCode.SUCCESS, None, {"offset": 0})
        return request.make_response(ResponseCode.QUERY_NOT_FOUND, "Not found, maybe this group consumer boot first")

    def update_consumer_offset(self, conn, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        group, topic = h.str("consumerGroup"), h.str("topic")
        queue_id, offset = h.int("queueId"), h.long("commitOffset")
        if offset < 0 or queue_id < 0:
            return request.make_response(ResponseCode.SUCCESS)  # client-compat #8: ignored
        try:
            self.bs.gate.check_writable()
            self.bs.metadata.stage_offsets([(topic, group, queue_id, offset)])
        except NotLeaderError as e:
            return request.make_response(ResponseCode.SERVICE_NOT_AVAILABLE,
                                         f"offsets are stored on the DLedger leader (master): {e}")
        except InvalidMetadataError as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, str(e))
        except CommitLogError as e:
            return request.make_response(ResponseCode.SERVICE_NOT_AVAILABLE, str(e))
        return request.make_response(ResponseCode.SUCCESS)

    def get_max_offset(self, conn, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        topic, queue_id = h.str("topic"), h.int("queueId")
        h.bool("committed", True)  # every consume queue unit is committed
        return request.make_response(ResponseCode.SUCCESS, None, {"offset": self._min_max(topic, queue_id)[1]})

    def get_min_offset(self, conn, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        topic, queue_id = h.str("topic"), h.int("queueId")
        return request.make_response(ResponseCode.SUCCESS, None, {"offset": self._min_max(topic, queue_id)[0]})

    def search_offset_by_timestamp(self, conn, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        topic, queue_id, ts = h.str("topic"), h.int("queueId"), h.long("timestamp")
        boundary = (h.str("boundaryType", None) or "LOWER").strip().upper()
        if boundary not in ("LOWER", "UPPER"):
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"bad boundaryType {boundary!r}")
        offset = self.bs.cq.engine.offset_by_time(topic, queue_id, ts, boundary.lower())
        return request.make_response(ResponseCode.SUCCESS, None, {"offset": offset})

    def get_earliest_msg_storetime(self, conn, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        topic, queue_id = h.str("topic"), h.int("queueId")
        cq, ts = self._cq(topic, queue_id), -1
        if cq is not None and cq.min_offset < cq.max_offset:
            unit = cq.get_unit(cq.min_offset)
            if not unit.is_blank:
                found = self.bs.cq.engine.store_timestamp_of(unit.phy, unit.size)
                ts = -1 if found is None else found
        return request.make_response(ResponseCode.SUCCESS, None, {"timestamp": ts})

    # --- clients -------------------------------------------------------------------------

    async def heart_beat(self, conn, request: RemotingCommand) -> RemotingCommand:
        data = decode_json(request.body, "HeartbeatData")
        if not isinstance(data, dict):
            raise RequestError(ResponseCode.SYSTEM_ERROR, "HeartbeatData must be a JSON object")
        self.manager.heartbeat(conn, request, data)
        for cd in data.get("consumerDataSet") or []:
            await self._ensure_retry_topic(cd["groupName"], bool(cd.get("unitMode")))
        return request.make_response(ResponseCode.SUCCESS)

    async def _ensure_retry_topic(self, group: str, unit_mode: bool) -> None:
        # The heartbeat is answered SUCCESS whatever happens here (Java
        # does too); the next heartbeat tries again.
        from broker.retry import ensure_retry_topic  # late: retry imports send, which is heavier
        bs = getattr(self.broker, "store", None)
        if getattr(bs, "gate", None) is None:  # a registry without a store (tests)
            return
        try:
            await ensure_retry_topic(self.bs.metadata, self.bs.gate, broker_config(self.broker), group,
                                     unit_mode=unit_mode)
        except (CommitLogError, InvalidMetadataError) as e:
            log.warning("heartbeat of group %s: %%RETRY%% topic / group not created: %s", group, e)

    def unregister_client(self, conn, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        self.manager.unregister(h.str("clientID"), producer_group=h.str("producerGroup", None),
                                consumer_group=h.str("consumerGroup", None))
        return request.make_response(ResponseCode.SUCCESS)

    def get_consumer_list_by_group(self, conn, request: RemotingCommand) -> RemotingCommand:
        group = HeaderReader(request.ext_fields).str("consumerGroup")
        ids = self.manager.consumer_ids(group)
        if not ids:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return request.make_response(ResponseCode.SUCCESS, None, None, encode_json({"consumerIdList": ids}))


def register(dispatcher, broker) -> ClientManager:
    """Plug the consumer/client requests into `dispatcher`; `broker` has
    .store and .config.  Returns the ClientManager (start its run())."""
    manager = manager_for(broker)
    ConsumerProcessor(broker, manager).register(dispatcher)
    return manager
