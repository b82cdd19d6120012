# Owns the MessagingService RPCs of mqproxy (RocketMQ's proxy in cluster mode, grpc/v2/*Activity):
# each RPC is checked (auth.py), translated to the remoting requests of spec §8.9 and sent through the
# client library's ClientInstance (the routes, heartbeats, retries and failover of any ledgermq
# producer).  Every error of a request becomes a Status in its response here (status.py); none leaves
# a handler, so a bad request or a failed broker never ends another client's stream.
#
# Clients.  A client is known by its x-mq-client-id once its Telemetry stream has sent Settings
# (Heartbeat before that is UNRECOGNIZED_CLIENT_TYPE, as RocketMQ's proxy answers); a consumer's
# group is then declared to the brokers by the proxy's heartbeats (CONSUME_POP with its
# subscriptions) until its last client goes.  The reply carries the server's side of the settings:
# publishing.max_body_size (enforced here), the retry policy, and for consumers receive_batch_size,
# long_polling_timeout and fifo.  The stream stays open to push commands: at most maxClients
# sessions, each with a bounded outbox (a full one drops a push, logged: the broker asks again).
#
# Transactions.  As RocketMQ's proxy, a producer's topic is its producer group: a transactional send
# carries PGROUP=<topic>, and the proxy declares each publishing topic as a producer group to every
# broker of its route, so a broker's CHECK_TRANSACTION_STATE reaches the proxy, which pushes it as
# recover_orphaned_transaction_command to one live producer of that topic (round robin).  It
# remembers (topic, transaction id) -> where the half is, bounded (maxTransactionRecords, oldest
# forgotten first), for EndTransaction; an unknown id is INVALID_TRANSACTION_ID and the broker's
# check resolves it.
#
# Consuming (ReceiveMessage, AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue) is
# consume.py's, on the brokers' POP codes.  RecallMessage is RECALL_MESSAGE 370 to the master of the
# broker the recall handle names.
import asyncio
import collections
import itertools
import logging
import time

import attrs

from broker.client.consumer_api import subscription_data
from broker.client.errors import BrokerUnavailableError, ClientError, ConnectionFailedError, InvalidArgumentError
from broker.client.instance import ClientInstance
from broker.client.model import Message, MessageSelector, subscription
from broker.client.producer import Producer, hash_selector
from broker.common.msgid import parse_offset_msg_id
from broker.common.permissions import PERM_READ, PERM_WRITE
from broker.proxy import auth, pb
from broker.proxy.config import ProxyConfig
from broker.proxy.consume import ConsumeRpcs
from broker.proxy.convert import RequestInvalid, check_topic, outgoing, recall_broker, recall_handle, to_grpc_message
from broker.proxy.renew import Renewals
from broker.proxy.status import from_client_error, ok, status
from broker.remoting.codes import LanguageCode, RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from consumequeue import record as M

log = logging.getLogger("ledgermq.proxy")

S = pb.service
D = pb.definition
ACCEPT_TYPES = (pb.MessageType.NORMAL, pb.MessageType.FIFO, pb.MessageType.DELAY, pb.MessageType.TRANSACTION)
MAX_MESSAGES_PER_SEND = 64
RECEIVE_BATCH_SIZE = 32
MAX_RECONSUME_TIMES = 16  # a group's retryMaxTimes; max_attempts is one more
# RocketMQ's messageDelayLevel from level 3 on: what a concurrent consumer's retries wait.
RETRY_BACKOFF_S = (10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)


@attrs.define(eq=False, kw_only=True)
class Session:
    client_id: str
    client_type: int
    access_key: str | None
    topics: tuple[str, ...]
    group: str | None
    outbox: asyncio.Queue
    fifo: bool = False
    subscriptions: dict = attrs.Factory(dict)  # topic -> Subscription (consumers)
    started: float = attrs.field(factory=time.monotonic)


@attrs.frozen(kw_only=True)
class TxRecord:
    broker_name: str | None
    addr: str | None
    queue_offset: int
    commitlog_offset: int


def _metadata(context) -> dict[str, str]:
    md = context.invocation_metadata() or ()
    return {k.lower(): v for k, v in md if isinstance(v, str)}


def _peer_ip(context) -> str | None:
    peer = context.peer() or ""
    if peer.startswith("ipv4:"):
        return peer[5:].rsplit(":", 1)[0]
    if peer.startswith("ipv6:"):
        return peer[5:].rsplit(":", 1)[0].strip("[]")
    return None


class MessagingService(ConsumeRpcs, pb.service_grpc.MessagingServiceServicer):
    def __init__(self, cfg: ProxyConfig, instance: ClientInstance, tasks, rules: "auth.AclFile | None") -> None:
        self.cfg = cfg
        self.inst = instance
        self.tasks = tasks  # the client instance's task group (anyio)
        self.rules = rules
        self.sessions: dict[str, Session] = {}
        self.producers: dict[str, Producer] = {}
        self.tx: collections.OrderedDict[tuple[str, str], TxRecord] = collections.OrderedDict()
        self.receives = asyncio.Semaphore(cfg.max_held_receives)
        self.renewals = Renewals(self._change_receipt, invisible_ms=cfg.auto_renew_invisible_ms,
                                 max_held=cfg.max_renewed_receipts)
        self._rr = itertools.count()
        self.checks_pushed = 0
        self.checks_dropped = 0

    # --- the checks every RPC makes --------------------------------------------------

    def _authorize(self, context, needed) -> str | None:
        if self.rules is None:
            return None
        return auth.authorize(self.rules.current(), _peer_ip(context), _metadata(context), needed)

    @staticmethod
    def _refusal(e: Exception):
        if isinstance(e, auth.AuthError):
            return status(pb.Code.UNAUTHORIZED if e.unauthorized else pb.Code.FORBIDDEN, str(e))
        if isinstance(e, RequestInvalid):
            return status(e.code, str(e))
        if isinstance(e, ClientError):
            return from_client_error(e)
        log.exception("request failed", exc_info=e)
        return status(pb.Code.INTERNAL_SERVER_ERROR, f"{type(e).__name__}: {e}")

    @staticmethod
    def _client_id(context) -> str:
        return _metadata(context).get("x-mq-client-id", "")

    def _endpoints(self, request_endpoints):
        if request_endpoints is not None and request_endpoints.addresses:
            return request_endpoints
        ep = D.Endpoints(scheme=D.AddressScheme.IPv4)
        ep.addresses.add(host=self.cfg.bind_address, port=self.cfg.grpc_port)
        return ep

    async def _relay(self, topic: str, addr: str, req: RemotingCommand, timeout: float | None = None,
                     ok: tuple | None = (ResponseCode.SUCCESS,)) -> RemotingCommand:
        """One remoting request for `topic`'s broker at `addr`.  A broker
        that is gone or no longer master (connection refused or lost,
        SERVICE_NOT_AVAILABLE) has the topic's route refreshed at once, so
        the client's retry reaches the new master without waiting for the
        30 s route poll."""
        try:
            return await self.inst.invoke(addr, req, timeout, ok=ok)
        except (ConnectionFailedError, BrokerUnavailableError):
            route = self.inst.cached_route(topic)
            await self.inst.refresh_route(topic, route.version if route is not None else None)
            raise

    async def _route(self, topic: str):
        route = await self.inst.route(topic)
        if route is None:
            self.inst.forget_route(topic)  # no slot kept per unknown name a client tries
            raise RequestInvalid(pb.Code.TOPIC_NOT_FOUND, f"No topic route info in name server for the topic: {topic}")
        return route

    # --- routes -------------------------------------------------------------------------

    async def QueryRoute(self, request, context):
        try:
            topic = check_topic(request.topic.name)
            self._authorize(context, auth.route_resources(topic))
            route = await self._route(topic)
            endpoints = self._endpoints(request.endpoints if request.HasField("endpoints") else None)
            resp = S.QueryRouteResponse(status=ok())
            for q in sorted(route.data.queue_datas, key=lambda q: q.broker_name):
                if not route.brokers.get(q.broker_name):
                    continue
                read = q.read_queue_nums if q.perm & PERM_READ else 0
                write = q.write_queue_nums if q.perm & PERM_WRITE else 0
                for i in range(max(read, write)):
                    perm = (D.Permission.READ_WRITE if i < read and i < write
                            else D.Permission.READ if i < read else D.Permission.WRITE)
                    mq = resp.message_queues.add(id=i, permission=perm, accept_message_types=ACCEPT_TYPES)
                    mq.topic.name = topic
                    mq.topic.resource_namespace = request.topic.resource_namespace
                    mq.broker.name = q.broker_name
                    mq.broker.id = 0
                    mq.broker.endpoints.CopyFrom(endpoints)
            return resp
        except Exception as e:
            return S.QueryRouteResponse(status=self._refusal(e))

    async def QueryAssignment(self, request, context):
        try:
            topic = check_topic(request.topic.name)
            group = request.group.name
            if not group:
                raise RequestInvalid(pb.Code.ILLEGAL_CONSUMER_GROUP, "consumer group cannot be empty")
            self._authorize(context, auth.consume_resources(topic, group))
            route = await self._route(topic)
            endpoints = self._endpoints(request.endpoints if request.HasField("endpoints") else None)
            resp = S.QueryAssignmentResponse(status=ok())
            for q in sorted(route.data.queue_datas, key=lambda q: q.broker_name):
                if not (q.perm & PERM_READ and q.read_queue_nums and route.brokers.get(q.broker_name)):
                    continue
                a = resp.assignments.add()
                mq = a.message_queue
                mq.topic.name = topic
                mq.topic.resource_namespace = request.topic.resource_namespace
                mq.id = -1  # POP: any queue of the broker
                mq.permission = D.Permission.READ_WRITE
                mq.accept_message_types.extend(ACCEPT_TYPES)
                mq.broker.name = q.broker_name
                mq.broker.id = 0
                mq.broker.endpoints.CopyFrom(endpoints)
            return resp
        except Exception as e:
            return S.QueryAssignmentResponse(status=self._refusal(e))

    # --- clients ----------------------------------------------------------------------

    async def Heartbeat(self, request, context):
        try:
            client_id = _metadata(context).get("x-mq-client-id", "")
            if not client_id:
                raise RequestInvalid(pb.Code.CLIENT_ID_REQUIRED, "client id cannot be empty")
            group = request.group.name if request.HasField("group") else None
            self._authorize(context, auth.consume_resources(None, group) if group else [])
            if client_id not in self.sessions:
                raise RequestInvalid(pb.Code.UNRECOGNIZED_CLIENT_TYPE,
                                     "the client's settings are not known: send them on Telemetry first")
            return S.HeartbeatResponse(status=ok())
        except Exception as e:
            return S.HeartbeatResponse(status=self._refusal(e))

    async def NotifyClientTermination(self, request, context):
        try:
            group = request.group.name if request.HasField("group") else None
            self._authorize(context, auth.consume_resources(None, group) if group else [])
            self._session_ended(_metadata(context).get("x-mq-client-id", ""))
            return S.NotifyClientTerminationResponse(status=ok())
        except Exception as e:
            return S.NotifyClientTerminationResponse(status=self._refusal(e))

    async def Telemetry(self, request_iterator, context):
        """Settings in, the server's settings back, then commands pushed for
        as long as the client keeps the stream."""
        md = _metadata(context)
        client_id = md.get("x-mq-client-id", "")
        if not client_id:
            yield S.TelemetryCommand(status=status(pb.Code.CLIENT_ID_REQUIRED, "client id cannot be empty"))
            return
        outbox: asyncio.Queue = asyncio.Queue(maxsize=self.cfg.telemetry_queue_size + 2)

        async def reader():
            try:
                async for cmd in request_iterator:
                    if cmd.WhichOneof("command") != "settings":
                        continue  # thread stack traces, verify results: nothing asked them
                    try:
                        reply = await self._settings(context, client_id, cmd.settings, outbox)
                    except Exception as e:
                        reply = S.TelemetryCommand(status=self._refusal(e))
                    await outbox.put(reply)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the client went away mid-read
                log.debug("telemetry stream of %s ended: %s", client_id, e)
            await outbox.put(None)

        task = asyncio.ensure_future(reader())
        try:
            while True:
                item = await outbox.get()
                if item is None:
                    break
                yield item
        finally:
            task.cancel()
            session = self.sessions.get(client_id)
            if session is not None and session.outbox is outbox:
                self._session_ended(client_id)

    async def _settings(self, context, client_id: str, settings, outbox: asyncio.Queue):
        ctype = settings.client_type
        reply = D.Settings()
        reply.CopyFrom(settings)
        if ctype == pb.ClientType.PRODUCER:
            topics = tuple(check_topic(t.name) for t in settings.publishing.topics)
            ak = self._authorize(context, [r for t in topics for r in auth.publish_resources(t)])
            group = None
            reply.publishing.max_body_size = self.cfg.max_body_size
            reply.publishing.validate_message_type = True
            reply.backoff_policy.Clear()
            reply.backoff_policy.max_attempts = 3
            reply.backoff_policy.exponential_backoff.initial.FromMilliseconds(10)
            reply.backoff_policy.exponential_backoff.max.FromMilliseconds(1000)
            reply.backoff_policy.exponential_backoff.multiplier = 2.0
        elif ctype in (pb.ClientType.PUSH_CONSUMER, pb.ClientType.SIMPLE_CONSUMER):
            group = settings.subscription.group.name
            if not group:
                raise RequestInvalid(pb.Code.ILLEGAL_CONSUMER_GROUP, "consumer group cannot be empty")
            topics = tuple(check_topic(s.topic.name) for s in settings.subscription.subscriptions)
            subs = {}
            for entry in settings.subscription.subscriptions:
                sql = entry.expression.type == D.FilterType.SQL
                text = entry.expression.expression or "*"
                try:
                    subs[entry.topic.name] = subscription(MessageSelector.by_sql(text) if sql else text)
                except InvalidArgumentError as e:
                    raise RequestInvalid(pb.Code.ILLEGAL_FILTER_EXPRESSION, str(e)) from None
            ak = self._authorize(context, [r for t in topics for r in auth.consume_resources(t, group)] or
                                 auth.consume_resources(None, group))
            sub = reply.subscription
            fifo = bool(topics) and await self._fifo(topics[0], group)
            sub.fifo = fifo
            sub.receive_batch_size = RECEIVE_BATCH_SIZE
            sub.long_polling_timeout.FromMilliseconds(self.cfg.long_polling_timeout_ms)
            reply.backoff_policy.Clear()
            reply.backoff_policy.max_attempts = MAX_RECONSUME_TIMES + 1
            if fifo:  # an orderly group retries in place, soon
                reply.backoff_policy.exponential_backoff.initial.FromMilliseconds(1000)
                reply.backoff_policy.exponential_backoff.max.FromMilliseconds(60_000)
                reply.backoff_policy.exponential_backoff.multiplier = 2.0
            else:
                for s in RETRY_BACKOFF_S:
                    reply.backoff_policy.customized_backoff.next.add(seconds=s)
        else:
            raise RequestInvalid(pb.Code.UNRECOGNIZED_CLIENT_TYPE,
                                 f"client type {D.ClientType.Name(ctype) if ctype in D.ClientType.values() else ctype} "
                                 f"is not served")
        if client_id not in self.sessions and len(self.sessions) >= self.cfg.max_clients:
            raise RequestInvalid(pb.Code.TOO_MANY_REQUESTS, f"the proxy serves {self.cfg.max_clients} clients at most")
        consumer = ctype != pb.ClientType.PRODUCER
        self.sessions[client_id] = Session(client_id=client_id, client_type=ctype, access_key=ak, topics=topics,
                                           group=group, outbox=outbox,
                                           fifo=consumer and reply.subscription.fifo,
                                           subscriptions=subs if consumer else {})
        if ctype == pb.ClientType.PRODUCER and topics:
            await self._declare_producer(topics)
        elif consumer:
            await self._declare_consumer(group, topics)
        return S.TelemetryCommand(status=ok(), settings=reply)

    def _consumer_data(self, group: str) -> dict:
        """The group's HEART_BEAT consumerData: its sessions' subscriptions
        (POP consumers, as RocketMQ's proxy registers them)."""
        subs: dict = {}
        for session in self.sessions.values():
            if session.group == group and session.client_type != pb.ClientType.PRODUCER:
                subs.update(session.subscriptions)
        return {"groupName": group, "consumeType": "CONSUME_POP", "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "unitMode": False,
                "subscriptionDataSet": [subscription_data(t, sub) for t, sub in sorted(subs.items())]}

    async def _declare_consumer(self, group: str, topics) -> None:
        """The group is declared to every broker of its topics (heartbeats
        carry it from now on), so mqadmin consumerConnection and the
        brokers' consumer lists show gRPC consumers."""
        self.inst.consumers[group] = lambda: self._consumer_data(group)
        for topic in topics:
            try:
                await self.inst.route(topic)
            except ClientError as e:
                log.debug("route of %s: %s", topic, e)
        self.tasks.start_soon(self.inst.heartbeat_all)

    def _session_ended(self, client_id: str) -> None:
        session = self.sessions.pop(client_id, None)
        self.renewals.forget_client(client_id)
        if session is None or session.group is None or session.client_type == pb.ClientType.PRODUCER:
            return
        if any(s.group == session.group and s.client_type != pb.ClientType.PRODUCER for s in self.sessions.values()):
            return
        addrs = self.inst.heartbeat_addrs()
        self.inst.consumers.pop(session.group, None)

        async def unregister() -> None:
            req = RemotingCommand.create_request(RequestCode.UNREGISTER_CLIENT, {
                "clientID": self.inst.client_id, "consumerGroup": session.group})
            for addr in addrs:
                try:
                    await self.inst.invoke(addr, req, 1.0)
                except ClientError as e:
                    log.debug("unregistering %s from %s: %s", session.group, addr, e)
        self.tasks.start_soon(unregister)

    async def _declare_producer(self, topics) -> None:
        """Each topic a producer group the brokers check back with."""
        new = [t for t in topics if t not in self.inst.producer_groups]
        for topic in new:
            self.inst.producer_groups.add(topic)
            self.inst.transaction_checks[topic] = self._on_check
        if new:
            for topic in new:
                try:
                    await self.inst.route(topic)
                except ClientError as e:
                    log.debug("route of %s: %s", topic, e)
            self.tasks.start_soon(self.inst.heartbeat_all)

    # --- sending ------------------------------------------------------------------------

    def _producer(self, topic: str) -> Producer:
        p = self.producers.get(topic)
        if p is None:
            p = self.producers[topic] = Producer(self.inst, self.tasks, topic,
                                                 send_timeout=self.cfg.send_timeout_ms / 1000,
                                                 max_message_size=self.cfg.max_body_size, compress_over=None)
        return p

    async def SendMessage(self, request, context):
        try:
            if not request.messages:
                raise RequestInvalid(pb.Code.BAD_REQUEST, "no message to send")
            if len(request.messages) > MAX_MESSAGES_PER_SEND:
                raise RequestInvalid(pb.Code.BAD_REQUEST, f"at most {MAX_MESSAGES_PER_SEND} messages in one request")
            out = [outgoing(m, self.cfg.max_body_size) for m in request.messages]
            for topic in {o.topic for o in out}:
                self._authorize(context, auth.publish_resources(topic))
                await self._route(topic)
            entries = await asyncio.gather(*(self._send_one(o) for o in out))
            resp = S.SendMessageResponse(status=ok())
            resp.entries.extend(entries)
            failed = next((e.status for e in entries if e.status.code != pb.Code.OK), None)
            if failed is not None:
                resp.status.CopyFrom(failed)
            return resp
        except Exception as e:
            return S.SendMessageResponse(status=self._refusal(e))

    async def _send_one(self, o):
        try:
            msg = Message(o.topic, o.body, tags=o.tag, keys=o.keys, properties=o.user_properties)
            result = await self._producer(o.topic).send_as(
                msg, o.message_id, extra_properties=o.extra_properties,
                sysflag=M.TRANSACTION_PREPARED_TYPE if o.transactional else 0,
                selector=hash_selector(o.message_group) if o.message_group else None)
        except Exception as e:
            return S.SendResultEntry(status=self._refusal(e), message_id=o.message_id)
        tx_id, recall = "", ""
        if o.deliver_ms is not None:
            recall = recall_handle(o.topic, result.queue.broker_name, o.deliver_ms, o.message_id)
        if o.transactional:
            tx_id = o.message_id
            _host, phy = parse_offset_msg_id(result.offset_msg_id)
            self._remember(o.topic, tx_id, TxRecord(broker_name=result.queue.broker_name, addr=None,
                                                    queue_offset=result.queue_offset, commitlog_offset=phy))
        return S.SendResultEntry(status=ok(), message_id=o.message_id, transaction_id=tx_id,
                                 offset=result.queue_offset, recall_handle=recall)

    def _remember(self, topic: str, tx_id: str, rec: TxRecord) -> None:
        self.tx[(topic, tx_id)] = rec
        self.tx.move_to_end((topic, tx_id))
        while len(self.tx) > self.cfg.max_transaction_records:
            self.tx.popitem(last=False)

    async def EndTransaction(self, request, context):
        try:
            topic = check_topic(request.topic.name)
            self._authorize(context, auth.publish_resources(topic))
            if not request.transaction_id:
                raise RequestInvalid(pb.Code.INVALID_TRANSACTION_ID, "transaction id cannot be empty")
            if request.resolution == pb.TransactionResolution.COMMIT:
                flag = M.TRANSACTION_COMMIT_TYPE
            elif request.resolution == pb.TransactionResolution.ROLLBACK:
                flag = M.TRANSACTION_ROLLBACK_TYPE
            else:
                raise RequestInvalid(pb.Code.BAD_REQUEST, "transaction resolution must be COMMIT or ROLLBACK")
            rec = self.tx.get((topic, request.transaction_id))
            if rec is None:
                raise RequestInvalid(pb.Code.INVALID_TRANSACTION_ID,
                                     f"transaction id {request.transaction_id[:128]} is unknown or expired")
            addr = rec.addr
            if rec.broker_name is not None:
                route = await self._route(topic)
                addr = route.master(rec.broker_name) or addr
            if addr is None:
                raise RequestInvalid(pb.Code.HA_NOT_AVAILABLE, "the broker holding the half message has no master")
            from_check = request.source == pb.TransactionSource.SOURCE_SERVER_CHECK
            req = RemotingCommand.create_request(RequestCode.END_TRANSACTION, {
                "producerGroup": topic, "tranStateTableOffset": str(rec.queue_offset),
                "commitLogOffset": str(rec.commitlog_offset), "commitOrRollback": str(flag),
                "fromTransactionCheck": "true" if from_check else "false",
                "msgId": request.message_id or request.transaction_id, "transactionId": request.transaction_id},
                language=LanguageCode.JAVA)
            await self._relay(topic, addr, req)
            self.tx.pop((topic, request.transaction_id), None)
            return S.EndTransactionResponse(status=ok())
        except Exception as e:
            return S.EndTransactionResponse(status=self._refusal(e))

    def _on_check(self, conn, cmd: RemotingCommand) -> None:
        """CHECK_TRANSACTION_STATE from a broker (the client instance's
        callback): pushed to one producer of the topic."""
        try:
            record = M.decode(cmd.body)
        except M.MessageFormatError:
            log.warning("undecodable CHECK_TRANSACTION_STATE from %s", conn.remote_address)
            return
        f = cmd.ext_fields
        topic = record.topic
        tx_id = f.get("transactionId") or f.get("msgId") or record.uniq_key or ""
        try:
            queue_offset, phy = int(f.get("tranStateTableOffset", "")), int(f.get("commitLogOffset", ""))
        except ValueError:
            log.warning("CHECK_TRANSACTION_STATE from %s without its offsets", conn.remote_address)
            return
        live = [s for s in self.sessions.values() if s.client_type == pb.ClientType.PRODUCER and topic in s.topics]
        if not live or not tx_id:
            self.checks_dropped += 1
            return
        self._remember(topic, tx_id, TxRecord(broker_name=None, addr=conn.remote_address, queue_offset=queue_offset,
                                              commitlog_offset=phy))
        session = live[next(self._rr) % len(live)]
        command = S.TelemetryCommand()
        command.recover_orphaned_transaction_command.transaction_id = tx_id
        command.recover_orphaned_transaction_command.message.CopyFrom(to_grpc_message(record))
        if session.outbox.qsize() >= self.cfg.telemetry_queue_size:
            self.checks_dropped += 1
            log.warning("telemetry outbox of %s is full: check of %s dropped (the broker asks again)",
                        session.client_id, tx_id)
            return
        session.outbox.put_nowait(command)
        self.checks_pushed += 1

    # --- timer messages ---------------------------------------------------------------------

    async def RecallMessage(self, request, context):
        try:
            topic = check_topic(request.topic.name)
            self._authorize(context, auth.publish_resources(topic))
            broker_name = recall_broker(request.recall_handle)
            route = await self._route(topic)
            addr = route.master(broker_name) if broker_name in route.brokers else None
            if addr is None:
                raise RequestInvalid(pb.Code.BAD_REQUEST, "recall handle names no broker of the topic's route")
            req = RemotingCommand.create_request(RequestCode.RECALL_MESSAGE, {
                "producerGroup": topic, "topic": topic, "recallHandle": request.recall_handle,
                "brokerName": broker_name})
            resp = await self._relay(topic, addr, req, ok=None)
            if resp.code != ResponseCode.SUCCESS:
                code = pb.Code.TOPIC_NOT_FOUND if resp.code == ResponseCode.TOPIC_NOT_EXIST else pb.Code.BAD_REQUEST
                raise RequestInvalid(code, resp.remark or "recall failed")
            return S.RecallMessageResponse(status=ok(), message_id=resp.ext_fields.get("msgId", ""))
        except Exception as e:
            return S.RecallMessageResponse(status=self._refusal(e))

    # --- not served ---------------------------------------------------------------------------

    async def PullMessage(self, request, context):
        yield S.PullMessageResponse(status=status(pb.Code.NOT_IMPLEMENTED, "PullMessage is not served"))

    async def UpdateOffset(self, request, context):
        return S.UpdateOffsetResponse(status=status(pb.Code.NOT_IMPLEMENTED, "UpdateOffset is not served"))

    async def GetOffset(self, request, context):
        return S.GetOffsetResponse(status=status(pb.Code.NOT_IMPLEMENTED, "GetOffset is not served"))

    async def QueryOffset(self, request, context):
        return S.QueryOffsetResponse(status=status(pb.Code.NOT_IMPLEMENTED, "QueryOffset is not served"))

    async def SyncLiteSubscription(self, request, context):
        return S.SyncLiteSubscriptionResponse(status=status(pb.Code.NOT_IMPLEMENTED, "lite topics are not served"))
