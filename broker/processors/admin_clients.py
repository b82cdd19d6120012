# Owns the broker's admin requests about its configuration and its clients
# (RocketMQ's AdminBrokerProcessor, the part mqadmin's getBrokerConfig /
# updateBrokerConfig / consumerConnection / producerConnection / producer /
# resetOffsetByTime send):
#
#   GET_BROKER_CONFIG 26              the effective broker.conf keys as Java properties text
#   UPDATE_BROKER_CONFIG 25           properties text; only HOT_KEYS change (in memory, this broker only,
#                                     the file is not rewritten); any other key refuses the whole request,
#                                     naming it
#   GET_CONSUMER_CONNECTION_LIST 203  ConsumerConnection JSON; CONSUMER_NOT_ONLINE when nobody is in it
#   GET_PRODUCER_CONNECTION_LIST 204  ProducerConnection JSON; SYSTEM_ERROR when the group has no producer here
#   GET_ALL_PRODUCER_INFO 328         ProducerTableInfo JSON {"data": {group: [ProducerInfo{clientId,
#                                     remoteIP ("/ip:port", as Java prints it), language, version,
#                                     lastUpdateTimestamp}]}} of every live producer connection, sorted by
#                                     name; at most MAX_PRODUCERS_LISTED clients and MAX_PRODUCER_TABLE_BYTES,
#                                     the cut said in the remark (ext fields groupTotal, producerTotal: the
#                                     whole count)
#   INVOKE_BROKER_TO_RESET_OFFSET 222 per write queue: the first offset stored at or after `timestamp` (-1:
#                                     the max offset), taken when isForce or when behind the group's offset;
#                                     committed through the replicated offsets (leader only), then
#                                     RESET_CONSUMER_CLIENT_OFFSET (220, oneway) to every online client of the
#                                     group (Broker2Client); body ResetOffsetBody.  Works with the group
#                                     offline too: the offsets are the broker's, not only the clients'
#   QUERY_TOPIC_CONSUME_BY_WHO 300    GroupList {"groupSet"}: online groups subscribed to the topic and
#                                     groups with offsets on it
#   GET_CONSUMER_RUNNING_INFO 307     forwarded to the named client on its own connection
#                                     (Broker2Client.callClient), its answer returned unchanged;
#                                     SYSTEM_ERROR "The Consumer <g> <id> not online" when not connected here
import enum
import logging

import attrs
import trio

from broker.config import KEYS as BROKER_KEYS
from broker.config import LiveConfig
from broker.metadata.service import MetadataService
from broker.processors.admin import encode_mq_map
from broker.processors.base import RequestProcessor
from broker.processors.client_manager import ClientManager
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RemotingError, RequestError
from broker.remoting.header import HeaderReader, encode_json
from broker.store.gate import RoleGate
from commitlog.config import KEYS as REPLICATION_KEYS
from commitlog.config import ConfigError, Peer, iter_properties
from commitlog.replica import ReplicaNode
from consumequeue.dispatcher import DispatchEngine

log = logging.getLogger("ledgermq.admin.clients")

# What a running broker can change without a restart: key -> how.
HOT_KEYS = ("brokerPermission", "maxPendingRequestsNum", "maxWaitAckTimeMs")
NOTIFY_TIMEOUT_S = 3.0
CALL_CLIENT_TIMEOUT_S = 5.0  # RocketMQ's callClient waits 5 s too
# GET_ALL_PRODUCER_INFO's bounds: clients listed, and the body's bytes (a
# reader such as broker.remoting.header.decode_json takes 1 MiB at most; a
# client id is whatever the heartbeat said).
MAX_PRODUCERS_LISTED = 5_000
MAX_PRODUCER_TABLE_BYTES = 900 << 10


def _text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return ";".join(_text(v) for v in value)
    if isinstance(value, Peer):
        return f"{value.peer_id}-{value.address}"
    if isinstance(value, enum.Enum):
        return value.name
    return "" if value is None else str(value)


def _delay_text(levels_ms) -> str:
    """messageDelayLevel as broker.conf spells it ("1s 5s ... 2h")."""
    words = []
    for ms in levels_ms:
        for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
            if ms % size == 0:
                words.append(f"{ms // size}{unit}")
                break
        else:
            words.append(f"{max(1, round(ms / 1000))}s")
    return " ".join(words)


# Keys whose text is not the generic rendering of their parsed value.
_RENDER = {"messageDelayLevel": _delay_text}
# Never in an answer or a printout: GET_BROKER_CONFIG goes to any client the
# ACL lets in (or anyone, with ACL off).
SECRET_KEYS = frozenset({"brokerSecretKey", "dLegerPeerSecret", "dLegerPeerSecretFile"})


def broker_config_properties(cfg) -> dict[str, str]:
    """The effective broker.conf keys of a BrokerConfig, as text (secrets
    left out)."""
    out = {key: _RENDER.get(key, _text)(getattr(cfg, field)) for key, (field, _) in BROKER_KEYS.items()
           if key not in SECRET_KEYS}
    rc = cfg.replication
    values = {key: getattr(rc, field) for key, (field, _) in REPLICATION_KEYS.items() if key not in SECRET_KEYS}
    out.update({key: _text(value) for key, value in values.items() if value is not None})
    out["enableDLegerCommitLog"] = "true"
    m = cfg.metrics
    out.update({"metricsExporterType": m.exporter_type, "metricsPromExporterHost": m.prom_host,
                "metricsPromExporterPort": str(m.prom_port)})
    return dict(sorted(out.items()))


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("=", "\\=").replace(":", "\\:")


def properties_text(props: dict[str, str]) -> str:
    return "".join(f"{k}={_escape(v)}\n" for k, v in props.items())


def _language(ch) -> str:
    return str(ch.language.name if isinstance(ch.language, enum.Enum) else ch.language)


def _connection(ch) -> dict:
    addr = ch.conn.remote_address
    return {"clientId": ch.client_id, "clientAddr": "" if addr is None else str(addr),
            "language": _language(ch), "version": ch.version}


def _producer_info(ch) -> dict:
    """ProducerInfo as fastjson writes it (fields in name order)."""
    addr = ch.conn.remote_address
    return {"clientId": ch.client_id, "language": _language(ch), "lastUpdateTimestamp": ch.last_update_ms,
            "remoteIP": "" if addr is None else f"/{addr}", "version": ch.version}


def producer_table(clients: ClientManager, limit: int = MAX_PRODUCERS_LISTED,
                   max_bytes: int = MAX_PRODUCER_TABLE_BYTES) -> tuple[dict, int, int, int]:
    """(ProducerTableInfo's data, clients listed, clients in all, groups
    in all): every group with a live connection, by name, each group's
    clients by client id; listing stops at `limit` clients or once the
    body would pass `max_bytes`."""
    data: dict[str, list[dict]] = {}
    listed = total = groups = 0
    size, full = len('{"data":{}}'), False
    for group in sorted(clients.producers):
        chans = sorted(clients.producer_channels(group), key=lambda ch: (ch.client_id, str(ch.conn.remote_address)))
        if not chans:
            continue
        groups += 1
        total += len(chans)
        for ch in chans:
            if full:
                break
            info = _producer_info(ch)
            grow = len(encode_json(info)) + 1 + (0 if group in data else len(encode_json(group)) + 4)
            if listed >= limit or size + grow > max_bytes:
                full = True
                break
            data.setdefault(group, []).append(info)
            size += grow
            listed += 1
    return data, listed, total, groups


@attrs.define(eq=False, kw_only=True)
class ClientsAdminProcessor(RequestProcessor):
    config: LiveConfig
    gate: RoleGate  # offsets are reset on the writable leader only
    metadata: MetadataService  # offsets and topics
    queues: DispatchEngine  # the consume queues (resetOffsetByTime's offsets)
    replica: ReplicaNode  # the hot keys it takes
    clients: ClientManager

    CODES = (RequestCode.GET_BROKER_CONFIG, RequestCode.UPDATE_BROKER_CONFIG,
             RequestCode.GET_CONSUMER_CONNECTION_LIST, RequestCode.GET_PRODUCER_CONNECTION_LIST,
             RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO,
             RequestCode.GET_CONSUMER_RUNNING_INFO, RequestCode.GET_ALL_PRODUCER_INFO)
    not_leader_remark = "offsets are written on the DLedger leader (master)"

    def handlers(self) -> dict:
        return {
            RequestCode.GET_BROKER_CONFIG: self.get_broker_config,
            RequestCode.UPDATE_BROKER_CONFIG: self.update_broker_config,
            RequestCode.GET_CONSUMER_CONNECTION_LIST: self.consumer_connections,
            RequestCode.GET_PRODUCER_CONNECTION_LIST: self.producer_connections,
            RequestCode.GET_ALL_PRODUCER_INFO: self.all_producer_info,
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: self.reset_offset,
            RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: self.consume_by_who,
            RequestCode.GET_CONSUMER_RUNNING_INFO: self.consumer_running_info,
        }

    # --- broker config ----------------------------------------------------------------

    async def get_broker_config(self, request: RemotingCommand) -> RemotingCommand:
        text = properties_text(broker_config_properties(self.config.current))
        dv = self.metadata.state.topics.data_version
        return request.make_response(ResponseCode.SUCCESS, None, {"version": encode_json(dv.to_json()).decode()},
                                     text.encode("utf-8"))

    async def update_broker_config(self, request: RemotingCommand) -> RemotingCommand:
        try:
            text = request.body.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(ResponseCode.SYSTEM_ERROR, "the config body is not UTF-8") from None
        props = {key: value for _, key, value in iter_properties(text)}
        if not props:
            raise RequestError(ResponseCode.SYSTEM_ERROR, "no key=value in the request body")
        cold = sorted(k for k in props if k not in HOT_KEYS)
        if cold:
            known = [k for k in cold if k in BROKER_KEYS or k in REPLICATION_KEYS]
            why = (f"{', '.join(known)} cannot change while the broker runs: edit broker.conf and restart"
                   if known else f"unknown key(s) {', '.join(cold)}")
            raise RequestError(ResponseCode.NO_PERMISSION,
                               f"{why} (hot-reloadable: {', '.join(HOT_KEYS)}); nothing was changed")
        cfg = self.config.current
        try:
            values = {key: (BROKER_KEYS.get(key) or REPLICATION_KEYS[key])[1](key, value)
                      for key, value in props.items()}
        except ConfigError as e:
            raise RequestError(ResponseCode.INVALID_PARAMETER, str(e)) from None
        replica = self.replica
        rc = cfg.replication
        if "brokerPermission" in values:
            cfg = attrs.evolve(cfg, broker_permission=values["brokerPermission"])
        if "maxPendingRequestsNum" in values:
            replica.max_pending = values["maxPendingRequestsNum"]
            rc = attrs.evolve(rc, max_pending_requests=values["maxPendingRequestsNum"])
        if "maxWaitAckTimeMs" in values:
            replica.max_wait_ack_ms = values["maxWaitAckTimeMs"]
            rc = attrs.evolve(rc, max_wait_ack_time_ms=values["maxWaitAckTimeMs"])
        # Every processor reads config.current; the registration listener
        # re-registers, so the name servers see the new topic permissions.
        self.config.update(attrs.evolve(cfg, replication=rc))
        log.info("broker config updated: %s", ", ".join(f"{k}={v}" for k, v in props.items()))
        return request.make_response(ResponseCode.SUCCESS)

    # --- connections -------------------------------------------------------------------

    async def consumer_connections(self, request: RemotingCommand) -> RemotingCommand:
        group = HeaderReader(request.ext_fields).str("consumerGroup")
        manager = self.clients
        info, ids = manager.group(group), set(manager.consumer_ids(group))
        if info is None or not ids:
            return request.make_response(ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        body = {
            "connectionSet": [_connection(ch) for cid, ch in info.channels.items() if cid in ids],
            "subscriptionTable": {t: {"topic": s.topic, "subString": s.sub_string, "tagsSet": list(s.tags),
                                      "codeSet": list(s.codes), "subVersion": s.sub_version,
                                      "expressionType": s.expression_type, "classFilterMode": False}
                                  for t, s in info.subscriptions.items()},
            "consumeType": info.consume_type.name, "messageModel": info.message_model.name,
            "consumeFromWhere": info.consume_from_where.name}
        return request.make_response(ResponseCode.SUCCESS, None, None, encode_json(body))

    async def producer_connections(self, request: RemotingCommand) -> RemotingCommand:
        group = HeaderReader(request.ext_fields).str("producerGroup")
        manager = self.clients
        chans = manager.producer_channels(group)
        if not chans:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"the producer group[{group}] not exist")
        body = {"connectionSet": [_connection(ch) for ch in chans]}
        return request.make_response(ResponseCode.SUCCESS, None, None, encode_json(body))

    async def all_producer_info(self, request: RemotingCommand) -> RemotingCommand:
        data, listed, total, groups = producer_table(self.clients)
        remark = None
        if listed < total:
            remark = (f"{listed} of {total} producers listed ({len(data)} of {groups} groups): "
                      f"an answer lists at most {MAX_PRODUCERS_LISTED} in {MAX_PRODUCER_TABLE_BYTES} bytes")
        return request.make_response(ResponseCode.SUCCESS, remark, {"groupTotal": groups, "producerTotal": total},
                                     encode_json({"data": data}))

    def groups_of_topic(self, topic: str) -> list[str]:
        online = {name for name, info in self.clients.consumers.items()
                  if topic in info.subscriptions and self.clients.consumer_ids(name)}
        return sorted(online | set(self.metadata.state.offsets.groups_of_topic(topic)))

    async def consume_by_who(self, request: RemotingCommand) -> RemotingCommand:
        topic = HeaderReader(request.ext_fields).str("topic")
        return request.make_response(ResponseCode.SUCCESS, None, None,
                                     encode_json({"groupSet": self.groups_of_topic(topic)}))

    async def consumer_running_info(self, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        group, client_id = h.str("consumerGroup"), h.str("clientId")
        info = self.clients.group(group)
        ch = info.channels.get(client_id) if info is not None else None
        if ch is None or client_id not in self.clients.consumer_ids(group) or not hasattr(ch.conn, "invoke"):
            return request.make_response(ResponseCode.SYSTEM_ERROR,
                                         f"The Consumer <{group}> <{client_id}> not online")
        forward = RemotingCommand.create_request(RequestCode.GET_CONSUMER_RUNNING_INFO, dict(request.ext_fields),
                                                 body=request.body)
        try:
            answer = await ch.conn.invoke(forward, CALL_CLIENT_TIMEOUT_S)
        except (RemotingError, OSError, trio.BrokenResourceError, trio.ClosedResourceError) as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR,
                                         f"invoke consumer <{group}> <{client_id}> failed: {e}")
        return request.make_response(answer.code, answer.remark, dict(answer.ext_fields or {}), answer.body)

    # --- offsets -----------------------------------------------------------------------

    def reset_table(self, topic: str, group: str, timestamp: int, force: bool) -> dict[int, int]:
        """queueId -> the offset resetOffsetByTime sets (pure over the store)."""
        metadata, engine = self.metadata, self.queues
        tc = metadata.topic_config(topic)
        table = {}
        for qid in range(tc.write_queue_nums):
            cq = engine.cqs.get(topic, qid)
            if timestamp < 0:
                target = cq.max_offset if cq is not None else 0
            else:
                target = engine.offset_by_time(topic, qid, timestamp, "lower")
            current = metadata.query_offset(topic, group, qid)
            table[qid] = target if force or current is None or target < current else current
        return table

    async def reset_offset(self, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        topic, group = h.str("topic"), h.str("group")
        timestamp, force = h.long("timestamp"), h.bool("isForce", True)
        if self.metadata.topic_config(topic) is None:
            return request.make_response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        self.gate.check_writable()
        table = self.reset_table(topic, group, timestamp, force)
        await self.metadata.reset_offsets(topic, group, table)
        name = self.config.current.broker_name
        body = encode_mq_map({(topic, name, q): o for q, o in table.items()})
        notified = await self._notify_reset(topic, group, timestamp, force, body)
        log.info("offsets of %s on %s reset to %s (timestamp %d, %d clients notified)", group, topic, table,
                 timestamp, notified)
        return request.make_response(ResponseCode.SUCCESS, None, {"notifiedClients": notified}, body)

    async def _notify_reset(self, topic, group, timestamp, force, body: bytes) -> int:
        manager = self.clients
        info, ids = manager.group(group), set(manager.consumer_ids(group))
        if info is None:
            return 0
        cmd = RemotingCommand.create_request(RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
                                             {"topic": topic, "group": group, "timestamp": timestamp,
                                              "isForce": force}, body=body)
        sent = 0
        for cid, ch in list(info.channels.items()):
            if cid not in ids:
                continue
            try:
                await ch.conn.send_request_oneway(cmd, timeout=NOTIFY_TIMEOUT_S)
                sent += 1
            except (RemotingError, OSError, trio.BrokenResourceError, trio.ClosedResourceError) as e:
                log.debug("RESET_CONSUMER_CLIENT_OFFSET to %s failed: %s", cid, e)
        return sent
