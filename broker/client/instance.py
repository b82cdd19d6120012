# Owns what one producer or consumer shares with the cluster (Java's
# MQClientInstance): the remoting connections, the topic routes from the
# name servers, heartbeats to the brokers, UNREGISTER_CLIENT on close, and
# the handler for requests brokers push (NOTIFY_CONSUMER_IDS_CHANGED,
# RESET_CONSUMER_CLIENT_OFFSET).
#
# Routes.  Kept per topic with a version number.  They are refreshed every
# `route_interval` seconds (Java's pollNameServerInterval, 30 s) and at once
# when a caller reports a failure (`refresh_route(topic, seen=version)`):
# concurrent reporters of the same failure share one name server call,
# because the refresh only runs if nobody refreshed since they looked.
#
# Heartbeats.  Every `heartbeat_interval` seconds to every broker of every
# route in use (consumers: all ids, since any node may become master and
# they must know the group; producers only: masters), and also whenever the
# connection to a broker is new (`ensure_heartbeat`: a restarted broker has
# forgotten us, and our first request after a redial would otherwise reach
# a broker that does not know the group for up to 30 s).
import itertools
import logging
import os
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import attrs

from broker.acl.signing import Credentials
from broker.client.errors import ClientError, InvalidArgumentError, NoRouteError, check_response, from_remoting
from broker.client.model import MessageQueue
from broker.client.running_info import no_route_reason, running_info_response
from broker.common.permissions import PERM_READ, PERM_WRITE
from broker.namesrv.client import NamesrvClient, parse_namesrv_addrs
from broker.namesrv.routes import TopicRouteData
from broker.remoting.client import RemotingClient, not_supported, open_remoting_client, parse_addr
from broker.remoting.codes import LanguageCode, RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RemotingError
from broker.remoting.header import encode_json
from broker.remoting.tls import ClientTls
from consumequeue import record as M

log = logging.getLogger("ledgermq.client")

ROUTE_INTERVAL = 30.0
HEARTBEAT_INTERVAL = 30.0
MASTER_ID = 0
AUTO_CREATE_TOPIC_KEY = "TBW102"
_instance_seq = itertools.count(1)


def _local_ip() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def new_client_id() -> str:
    """ip@pid#n: unique per instance (Java's instanceName is the pid plus
    nanoTime for the same reason: two clients in one process must differ)."""
    return f"{_local_ip()}@{os.getpid()}#{next(_instance_seq)}.{time.monotonic_ns() % 1_000_000_000}"


@attrs.frozen
class TopicRoute:
    """A topic's route with the queue lists clients use (sorted, as Java's
    topicRouteData2TopicPublishInfo / Subscribe info are)."""

    topic: str
    data: TopicRouteData
    version: int
    write_queues: tuple[MessageQueue, ...]
    read_queues: tuple[MessageQueue, ...]
    brokers: dict  # broker name -> {broker id: addr}

    @classmethod
    def build(cls, topic: str, data: TopicRouteData, version: int) -> "TopicRoute":
        brokers = {b.broker_name: dict(b.broker_addrs) for b in data.broker_datas}
        writes, reads = [], []
        for q in sorted(data.queue_datas, key=lambda q: q.broker_name):
            if q.perm & PERM_WRITE and brokers.get(q.broker_name, {}).get(MASTER_ID):
                writes += [MessageQueue(topic, q.broker_name, i) for i in range(q.write_queue_nums)]
            if q.perm & PERM_READ:
                reads += [MessageQueue(topic, q.broker_name, i) for i in range(q.read_queue_nums)]
        return cls(topic, data, version, tuple(writes), tuple(sorted(reads)), brokers)

    def master(self, broker_name: str) -> str | None:
        return self.brokers.get(broker_name, {}).get(MASTER_ID)

    def addr(self, broker_name: str, broker_id: int = MASTER_ID) -> str | None:
        """The address of broker_id, else the master, else any node (a
        follower serves reads while no master is registered)."""
        addrs = self.brokers.get(broker_name, {})
        return addrs.get(broker_id) or addrs.get(MASTER_ID) or (addrs[min(addrs)] if addrs else None)

    def all_addrs(self, masters_only: bool = False) -> set[str]:
        return {a for ids in self.brokers.values() for i, a in ids.items() if not masters_only or i == MASTER_ID}


@attrs.define(eq=False)
class _RouteSlot:
    route: TopicRoute | None = None
    version: int = 0
    lock: anyio.Lock = attrs.Factory(anyio.Lock)
    error: RemotingError | None = None  # why the last ask failed (named in NoRouteError)


ConsumerDataFn = Callable[[], dict]
NotifyFn = Callable[[str], None]


class ClientInstance:
    def __init__(self, remoting: RemotingClient, namesrv_addr, *, client_id: str | None = None,
                 timeout: float = 3.0, route_interval: float = ROUTE_INTERVAL,
                 heartbeat_interval: float = HEARTBEAT_INTERVAL) -> None:
        self.remoting = remoting
        try:
            addrs = parse_namesrv_addrs(namesrv_addr)
            for addr in addrs:
                parse_addr(addr)
        except (ValueError, TypeError, AttributeError) as e:
            raise InvalidArgumentError(f"namesrv_addr {namesrv_addr!r}: {e}") from None
        self.namesrv = NamesrvClient(remoting, addrs, timeout)
        self.client_id = client_id or new_client_id()
        self.timeout = timeout
        self.route_interval = route_interval
        self.heartbeat_interval = heartbeat_interval
        self.producer_groups: set[str] = set()
        self.auto_create_topics: set[str] = set()  # topics a producer sends to (template route allowed)
        self.default_topic_queue_nums = 4
        self.consumers: dict[str, ConsumerDataFn] = {}  # group -> consumerData builder
        self.notify: dict[str, NotifyFn] = {}  # group -> NOTIFY_CONSUMER_IDS_CHANGED callback
        self.reset: dict[str, NotifyFn] = {}  # group -> RESET_CONSUMER_CLIENT_OFFSET callback (topic)
        # producer group -> CHECK_TRANSACTION_STATE callback (conn, request): a transactional producer
        self.transaction_checks: dict[str, Callable] = {}
        self._routes: dict[str, _RouteSlot] = {}
        self._hb_conns: dict[str, object] = {}  # addr -> the connection our last heartbeat used
        self._hb_locks: dict[str, anyio.Lock] = {}
        self.closed = False

    # --- requests ---------------------------------------------------------------

    async def invoke(self, addr: str, request: RemotingCommand, timeout: float | None = None,
                     ok: tuple[int, ...] | None = (ResponseCode.SUCCESS,)) -> RemotingCommand:
        """One request; remoting failures and (with `ok`) unexpected codes
        become ClientErrors here."""
        try:
            resp = await self.remoting.invoke(addr, request, self.timeout if timeout is None else timeout)
        except RemotingError as e:
            raise from_remoting(e, addr) from None
        return resp if ok is None else check_response(resp, addr, request.code, ok)

    def submit(self, addr: str, request: RemotingCommand, timeout: float,
               done: Callable[[RemotingCommand | None, ClientError | None], None]) -> bool:
        """invoke() without a task waiting (RemotingClient.submit): `done`
        gets the response, or the remoting failure as a ClientError; False
        when there is no open connection to `addr` yet."""
        def translated(resp, error) -> None:
            done(resp, None if error is None else from_remoting(error, addr))
        return self.remoting.submit(addr, request, timeout, translated)

    async def invoke_oneway(self, addr: str, request: RemotingCommand, timeout: float | None = None) -> None:
        try:
            await self.remoting.invoke_oneway(addr, request, self.timeout if timeout is None else timeout)
        except RemotingError as e:
            raise from_remoting(e, addr) from None

    async def handle_pushed(self, conn, cmd: RemotingCommand) -> RemotingCommand | None:
        """Requests a broker sends us (RemotingClient's handler)."""
        if cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            group = cmd.ext_fields.get("consumerGroup", "")
            callback = self.notify.get(group)
            if callback is not None:
                log.debug("%s: consumer ids of %s changed (from %s)", self.client_id, group, conn.remote_address)
                callback(group)
            return None if cmd.is_oneway else cmd.make_response(ResponseCode.SUCCESS)
        if cmd.code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET:  # mqadmin resetOffsetByTime
            group, topic = cmd.ext_fields.get("group", ""), cmd.ext_fields.get("topic", "")
            callback = self.reset.get(group)
            if callback is not None:
                log.info("%s: offsets of %s on %s were reset (by %s)", self.client_id, group, topic,
                         conn.remote_address)
                callback(topic)
            return None if cmd.is_oneway else cmd.make_response(ResponseCode.SUCCESS)
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:  # a broker asks a transactional producer
            try:  # the group is the PGROUP property of the half message it carries
                group = M.decode(cmd.body).properties.get("PGROUP", "")
            except M.MessageFormatError:
                log.warning("%s: undecodable CHECK_TRANSACTION_STATE from %s", self.client_id, conn.remote_address)
                return None
            callback = self.transaction_checks.get(group)
            if callback is not None:
                callback(conn, cmd)
            return None  # oneway
        if cmd.code == RequestCode.GET_CONSUMER_RUNNING_INFO:  # (dashboards, RocketMQ mqadmin consumerStatus)
            return running_info_response(cmd, self.client_id, self.consumers)
        return await not_supported(conn, cmd)

    # --- routes -------------------------------------------------------------------

    def _slot(self, topic: str) -> _RouteSlot:
        slot = self._routes.get(topic)
        if slot is None:
            slot = self._routes[topic] = _RouteSlot()
        return slot

    def cached_route(self, topic: str) -> TopicRoute | None:
        slot = self._routes.get(topic)
        return slot.route if slot is not None else None

    async def route(self, topic: str) -> TopicRoute | None:
        """The cached route, fetched on first use."""
        slot = self._slot(topic)
        if slot.route is None:
            await self.refresh_route(topic, slot.version)
        return slot.route

    async def refresh_route(self, topic: str, seen: int | None = None) -> TopicRoute | None:
        """Ask the name servers now, unless someone refreshed after the
        caller saw version `seen` (then that newer route is returned).  A
        producer's topic the name servers do not know yet is routed like
        the auto-create template topic TBW102 (Java's producer does the same;
        the broker creates the topic on the first send)."""
        slot = self._slot(topic)
        async with slot.lock:
            if seen is not None and slot.version != seen:
                return slot.route
            try:
                data = await self.namesrv.get_route(topic)
                if data is None and topic in self.auto_create_topics:
                    data = await self._template_route()
            except RemotingError as e:
                log.debug("route of %s: name servers unreachable: %s", topic, e)
                slot.error = e
                return slot.route
            slot.error = None
            slot.version += 1
            slot.route = None if data is None else TopicRoute.build(topic, data, slot.version)
            return slot.route

    async def _template_route(self) -> TopicRouteData | None:
        data = await self.namesrv.get_route(AUTO_CREATE_TOPIC_KEY)
        if data is None:
            return None
        n = self.default_topic_queue_nums
        queues = tuple(attrs.evolve(q, read_queue_nums=min(n, q.write_queue_nums),
                                    write_queue_nums=min(n, q.write_queue_nums))
                       for q in data.queue_datas if q.perm & PERM_WRITE)
        return attrs.evolve(data, queue_datas=queues)

    async def wait_route(self, topic: str, usable: Callable[[TopicRoute], bool], deadline: float) -> TopicRoute:
        """A route that is `usable` (e.g. has a master), refreshing until
        `deadline`.  The name server has no push, so this is a backoff
        between asks (50 ms doubling to 500 ms), bounded by the deadline."""
        delay = 0.05
        slot = self._slot(topic)
        while True:
            route = slot.route
            if route is not None and usable(route):
                return route
            route = await self.refresh_route(topic, slot.version)
            if route is not None and usable(route):
                return route
            if anyio.current_time() + delay > deadline:
                reason = "no route with a usable master" if route else "no route at the name servers"
                raise NoRouteError(topic, no_route_reason(reason, slot.error))  # name the cause
            await anyio.sleep(delay)
            delay = min(delay * 2, 0.5)

    def forget_route(self, topic: str) -> None:
        """Drop a topic's slot whose route is unknown (a gateway asked for a
        name that does not exist: broker/proxy keeps no slot per such name)."""
        slot = self._routes.get(topic)
        if slot is not None and slot.route is None and not slot.lock.locked():
            del self._routes[topic]

    def topics(self) -> list[str]:
        return list(self._routes)

    # --- heartbeats ---------------------------------------------------------------

    def heartbeat_body(self) -> bytes:
        return encode_json({
            "clientID": self.client_id,
            "producerDataSet": [{"groupName": g} for g in sorted(self.producer_groups)],
            "consumerDataSet": [build() for build in self.consumers.values()],
        })

    def heartbeat_addrs(self) -> set[str]:
        # Consumers and transactional producers: every node, since any may
        # become master and must know the group (for check-backs too).
        masters_only = not self.consumers and not self.transaction_checks
        addrs: set[str] = set()
        for slot in self._routes.values():
            if slot.route is not None:
                addrs |= slot.route.all_addrs(masters_only)
        return addrs

    def heartbeat_current(self, addr: str) -> bool:
        conn = self.remoting.cached(addr)
        return conn is not None and self._hb_conns.get(addr) is conn

    async def heartbeat(self, addr: str, only_if_stale: bool = False) -> None:
        lock = self._hb_locks.setdefault(addr, anyio.Lock())
        async with lock:  # concurrent callers share one heartbeat
            if only_if_stale and self.heartbeat_current(addr):
                return
            req = RemotingCommand.create_request(RequestCode.HEART_BEAT, body=self.heartbeat_body(),
                                                 language=LanguageCode.PYTHON)
            await self.invoke(addr, req)
            self._hb_conns[addr] = self.remoting.cached(addr)

    async def ensure_heartbeat(self, addr: str) -> bool:
        """Heartbeat `addr` if our connection to it is not the one the last
        heartbeat went over (new broker, redial after a restart); True if
        that had to wait."""
        if self.heartbeat_current(addr):
            return False
        await self.heartbeat(addr, only_if_stale=True)
        return True

    async def heartbeat_all(self) -> None:
        async def one(addr):
            try:
                await self.heartbeat(addr)
            except ClientError as e:
                log.debug("heartbeat to %s failed: %s", addr, e)

        async with anyio.create_task_group() as nursery:
            for addr in self.heartbeat_addrs():
                nursery.start_soon(one, addr)

    async def unregister_all(self, timeout: float = 1.0) -> None:
        async def one(addr, fields):
            req = RemotingCommand.create_request(RequestCode.UNREGISTER_CLIENT, {"clientID": self.client_id, **fields})
            with anyio.move_on_after(timeout):
                try:
                    await self.invoke(addr, req, timeout)
                except ClientError as e:
                    log.debug("unregister from %s failed: %s", addr, e)

        async with anyio.create_task_group() as nursery:
            for addr in self.heartbeat_addrs():
                for g in self.producer_groups:
                    nursery.start_soon(one, addr, {"producerGroup": g})
                for g in self.consumers:
                    nursery.start_soon(one, addr, {"consumerGroup": g})

    # --- timers ---------------------------------------------------------------------

    async def run_timers(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Periodic route refresh and heartbeats (timers, not polls)."""
        async def routes():
            while True:
                await anyio.sleep(self.route_interval)
                for topic in self.topics():
                    await self.refresh_route(topic)

        async def heartbeats():
            while True:
                await anyio.sleep(self.heartbeat_interval)
                await self.heartbeat_all()

        async with anyio.create_task_group() as nursery:
            nursery.start_soon(routes)
            nursery.start_soon(heartbeats)
            task_status.started()


@asynccontextmanager
async def open_client_instance(namesrv_addr, **kw) -> AsyncIterator[tuple[ClientInstance, anyio.abc.TaskGroup]]:
    """A ClientInstance with its timers running, and a nursery for the
    client's own tasks (cancelled first on exit); unregisters on exit.
    `credentials` (client_credentials) signs every request for a broker
    with ACL on; `tls` (client_tls) dials with TLS."""
    holder: dict = {}

    async def handler(conn, cmd):
        return await holder["instance"].handle_pushed(conn, cmd)

    try:
        async with _instance(namesrv_addr, handler, holder, kw) as pair:
            yield pair
    except BaseExceptionGroup as group:
        # Three nurseries deep, an error from the caller's block (or one of
        # ours) would come out wrapped three times: hand over the one error.
        leaf = _single(group)
        if leaf is None:
            raise
        raise leaf from None


def _single(error: BaseException) -> BaseException | None:
    while isinstance(error, BaseExceptionGroup):
        if len(error.exceptions) != 1:
            return None
        error = error.exceptions[0]
    return error


def client_credentials(credentials) -> Credentials | None:
    """`credentials=`: None, Credentials or (accessKey, secretKey)."""
    if credentials is None or isinstance(credentials, Credentials):
        return credentials
    try:
        access_key, secret_key = credentials
    except (TypeError, ValueError):
        raise InvalidArgumentError("credentials must be Credentials(access_key, secret_key) or a pair") from None
    return Credentials(str(access_key), str(secret_key))


def client_tls(tls) -> ClientTls | None:
    """`tls=`: None/False (plaintext), True (TLS, the system's CAs), a CA
    bundle path, an ssl.SSLContext or a ClientTls."""
    if tls is None or tls is False:
        return None
    if tls is True:
        return ClientTls.create()
    if isinstance(tls, str):
        return ClientTls.create(tls)
    if isinstance(tls, ssl.SSLContext):
        return ClientTls.from_context(tls)
    if isinstance(tls, ClientTls):
        return tls
    raise InvalidArgumentError(f"tls must be True, a CA file, an ssl.SSLContext or a ClientTls, not {tls!r}")


@asynccontextmanager
async def _instance(namesrv_addr, handler, holder, kw):
    # Every request of the instance (name servers and brokers) is signed
    # with the credentials and travels over TLS when asked.
    rpc_hook = client_credentials(kw.pop("credentials", None))
    tls = client_tls(kw.pop("tls", None))
    async with open_remoting_client(handler=handler, rpc_hook=rpc_hook, tls=tls) as remoting:
        instance = ClientInstance(remoting, namesrv_addr, **kw)
        holder["instance"] = instance
        async with anyio.create_task_group() as outer:
            await outer.start(instance.run_timers)
            try:
                async with anyio.create_task_group() as tasks:
                    yield instance, tasks
                    tasks.cancel_scope.cancel()
            finally:
                with anyio.CancelScope(shield=True):
                    await instance.unregister_all()
                instance.closed = True
                outer.cancel_scope.cancel()
