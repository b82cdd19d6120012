# Owns the broker's client registry (RocketMQ's ConsumerManager,
# ProducerManager and ClientHousekeepingService): which clients of which
# producer and consumer groups are connected, with what subscriptions, and
# NOTIFY_CONSUMER_IDS_CHANGED (40, oneway, header consumerGroup) pushed to a
# group's other connections when its membership changes (a client registers,
# unregisters, its connection closes or its heartbeat expires).  A client
# unregisters only what it registered on the same connection.
#
# One ClientManager per broker, built by the composition root
# (broker.server.serve_broker) and handed to the processors that read it
# (clients, pull, admin_clients):
#   nursery.start_soon(manager.run)        # notifications + expiry timer
#   serve_remoting(..., on_close=manager.on_connection_closed)
# Without run() the registry still works (reads skip expired clients and
# closed connections) but notifications wait in the queue until it runs.
#
# Notifications have a budget.  At most notify_budget (connection, group)
# notifications wait, a pair already waiting is not queued twice (one push
# says "look again"), and at most notify_in_flight are being sent.  Past the
# budget a notification is dropped: counted (notifications_dropped), logged
# at most once per DROP_LOG_INTERVAL_MS, never waited for -- a heartbeat
# must not stall behind a flood of clients joining a group.  Dropping is
# safe: a RocketMQ client rebalances every 20 s whether told or not (and
# RocketMQ itself drops a oneway it has no permit for).
import enum
import logging
import time
import typing

import attrs
import trio

from broker.common.subscription import Subscription, parse_subscription
from broker.common.values import ConsumeFromWhere, ConsumeType, MessageModel
from broker.remoting.codes import LanguageCode, RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import ClientConnection
from broker.remoting.errors import RemotingError, RequestError

log = logging.getLogger("ledgermq.clients")

CHANNEL_EXPIRED_MS = 120_000  # ConsumerManager/ProducerManager channelExpiredTimeout
SCAN_INTERVAL_S = 10.0  # ClientHousekeepingService period
NOTIFY_TIMEOUT_S = 3.0
NOTIFY_QUEUE_MAX = 10_000  # notifications waiting to be sent
NOTIFY_IN_FLIGHT = 64  # notifications being sent at once
DROP_LOG_INTERVAL_MS = 10_000  # at most one "dropped" log line per interval


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


@attrs.frozen(kw_only=True)
class SubscriptionData:
    topic: str
    sub_string: str
    tags: tuple[str, ...] = ()
    codes: tuple[int, ...] = ()
    sub_version: int = 0
    expression_type: str = "TAG"

    def subscription(self) -> Subscription:
        """The filter pulls without the SUBSCRIPTION flag use."""
        if self.expression_type.strip().upper() not in ("", "TAG"):  # SQL92: compiled (cached) there
            return parse_subscription(self.sub_string, self.sub_version, self.expression_type)
        if self.sub_string.strip() in ("", "*"):
            return Subscription(sub_string="*", sub_version=self.sub_version)
        if self.codes:
            return Subscription(sub_string=self.sub_string, tags=frozenset(self.tags), codes=frozenset(self.codes),
                                sub_version=self.sub_version,
                                expression_type=self.expression_type)
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
    return SubscriptionData(topic=d["topic"], sub_string=sub, tags=tags, codes=codes, sub_version=version,
                            expression_type=str(d.get("expressionType") or "TAG"))


@attrs.define(eq=False, kw_only=True)
class ClientChannel:
    client_id: str
    conn: ClientConnection
    language: LanguageCode
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
    # group -> connection -> channel: keyed by connection, as RocketMQ's
    # ProducerManager keys by channel, so a heartbeat naming another
    # client's id (no secret) adds a channel and never replaces that
    # client's own (its transaction check-backs).
    producers: dict[str, dict[object, ClientChannel]] = attrs.Factory(dict)
    notify_budget: int = NOTIFY_QUEUE_MAX
    notify_in_flight: int = NOTIFY_IN_FLIGHT
    notifications_sent: int = 0
    notifications_dropped: int = 0
    _dropped_logged_ms: float = attrs.field(default=-DROP_LOG_INTERVAL_MS, init=False)
    _dropped_since_log: int = attrs.field(default=0, init=False)
    _pending: set = attrs.field(factory=set, init=False)  # (connection, group) queued, not yet being sent
    _send: trio.MemorySendChannel = attrs.field(init=False)
    _recv: trio.MemoryReceiveChannel = attrs.field(init=False)

    def __attrs_post_init__(self):
        self._send, self._recv = trio.open_memory_channel(self.notify_budget)

    # --- reads -------------------------------------------------------------------

    def _alive(self, ch: ClientChannel, now: int) -> bool:
        return now - ch.last_update_ms <= self.expired_ms and not ch.conn.closed

    def group(self, name: str) -> ConsumerGroupInfo | None:
        return self.consumers.get(name)

    def consumer_ids(self, group: str) -> list[str]:
        info = self.consumers.get(group)
        if info is None:
            return []
        now = self.clock_ms()
        return [cid for cid, ch in info.channels.items() if self._alive(ch, now)]

    def producer_ids(self, group: str) -> list[str]:
        return list(dict.fromkeys(ch.client_id for ch in self.producer_channels(group)))

    def producer_channels(self, group: str) -> list[ClientChannel]:
        """The live connections of a producer group (transaction check-backs
        go to one of them, ProducerManager.getAvailableChannel)."""
        now = self.clock_ms()
        return [ch for ch in self.producers.get(group, {}).values() if self._alive(ch, now)]

    # --- changes ---------------------------------------------------------------

    def heartbeat(self, conn: ClientConnection, request: RemotingCommand, data: dict) -> None:
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
        conn.attributes["clientID"] = client_id
        for group, ctype, model, cfw, subs in parsed:
            info = self.consumers.setdefault(group, ConsumerGroupInfo(group))
            info.consume_type, info.message_model, info.consume_from_where = ctype, model, cfw
            old = info.channels.get(client_id)
            joined = old is None or not self._alive(old, now)
            info.channels[client_id] = ClientChannel(client_id=client_id, conn=conn, language=request.language,
                                                     version=request.version, last_update_ms=now)
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
            self.producers.setdefault(group, {})[conn] = ClientChannel(
                client_id=client_id, conn=conn, language=request.language, version=request.version, last_update_ms=now)

    def unregister(self, conn: ClientConnection, client_id: str, *, producer_group: str | None = None,
                   consumer_group: str | None = None) -> None:
        """UNREGISTER_CLIENT: the client leaves its groups -- as registered
        on `conn` only (RocketMQ keys its tables by channel): a client id is
        no secret, and another connection must not unregister it."""
        if producer_group:
            chans = self.producers.get(producer_group)
            ch = chans.get(conn) if chans is not None else None
            if ch is not None and ch.client_id == client_id:
                del chans[conn]
                if not chans:
                    del self.producers[producer_group]
        if consumer_group:
            self._remove_consumer(consumer_group, client_id, conn)

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

    def on_connection_closed(self, conn: ClientConnection) -> None:
        """serve_remoting's on_close: forget every client on `conn`."""
        for group, info in list(self.consumers.items()):
            for cid, ch in list(info.channels.items()):
                if ch.conn is conn:
                    self._remove_consumer(group, cid, conn)
        for group, chans in list(self.producers.items()):
            chans.pop(conn, None)
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
            for key, ch in list(chans.items()):
                if not self._alive(ch, now):
                    del chans[key]
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
            key = (ch.conn, group)
            if cid == exclude or not self._alive(ch, now) or key in self._pending:
                continue
            try:
                self._send.send_nowait(key)
            except trio.WouldBlock:
                self._drop(group, now)
            else:
                self._pending.add(key)

    def _drop(self, group: str, now: int) -> None:
        self.notifications_dropped += 1
        self._dropped_since_log += 1
        if now - self._dropped_logged_ms >= DROP_LOG_INTERVAL_MS:
            log.warning("NOTIFY_CONSUMER_IDS_CHANGED queue full (%d waiting): dropped %d notification(s), "
                        "latest for group %s", self.notify_budget, self._dropped_since_log, group)
            self._dropped_logged_ms, self._dropped_since_log = now, 0

    async def _deliver(self, conn, group: str) -> None:
        cmd = RemotingCommand.create_request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})
        try:
            await conn.send_request_oneway(cmd, timeout=NOTIFY_TIMEOUT_S)
            self.notifications_sent += 1
        except (RemotingError, OSError, trio.BrokenResourceError, trio.ClosedResourceError) as e:
            log.debug("NOTIFY_CONSUMER_IDS_CHANGED to %r failed: %s", conn, e)

    async def run(self, *, scan_interval: float = SCAN_INTERVAL_S, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Deliver notifications (each in its own task, at most
        notify_in_flight at once: a slow client delays nobody else) and run
        the expiry scan every scan_interval seconds."""
        async def scanner():
            while True:
                await trio.sleep(scan_interval)  # a timer, not a poll
                self.scan_expired()

        slots = trio.Semaphore(self.notify_in_flight)

        async def deliver(conn, group):
            try:
                await self._deliver(conn, group)
            finally:
                slots.release()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(scanner)
            task_status.started(self)
            async for conn, group in self._recv:
                await slots.acquire()  # while every slot is busy the queue fills up to its budget
                self._pending.discard((conn, group))
                nursery.start_soon(deliver, conn, group)
