# Owns MQAdmin, mqadmin's async client of name servers and brokers: every
# request the online commands send, each answer turned into a typed result.
# It is the one translation point from the remoting layer to AdminError:
#
#   UnreachableError   no connection / no answer (name server or broker)
#   NotFoundError      the topic, group, broker or message does not exist
#   RequestFailedError the server answered with an error code (its remark)
#
# plus from_client_error(), the same mapping for the client library's
# errors (sendMessage and consumeMessage go through broker.client).
#
# The click layer (tools/mqadmin/online.py) prints an AdminError as one line
# and exits non-zero; nothing here prints.
#
# Bodies keyed by MessageQueue (TopicStatsTable, ConsumeStats,
# ResetOffsetBody) are fastjson maps with object keys, not standard JSON;
# parse_mq_map reads them.
import json
import re

import attrs
import trio

from broker.namesrv.client import NamesrvClient
from broker.namesrv.routes import BrokerData, TopicRouteData
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import (
    RemotingConnectError,
    RemotingConnectionLostError,
    RemotingError,
    RemotingTimeoutError,
    ResponseError,
)
from consumequeue import record as M

MASTER_ID = 0
TOOLS_GROUP = "TOOLS_CONSUMER"  # RocketMQ's MixAll.TOOLS_CONSUMER_GROUP
TOOLS_PRODUCER = "TOOLS_PRODUCER"  # sendMessage's producer group (RocketMQ's tools use the same)
NOT_FOUND_CODES = (ResponseCode.TOPIC_NOT_EXIST, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                   ResponseCode.CONSUMER_NOT_ONLINE, ResponseCode.QUERY_NOT_FOUND)


class AdminError(Exception):
    """What mqadmin reports as one line."""


class UnreachableError(AdminError):
    pass


class NotFoundError(AdminError):
    pass


class RequestFailedError(AdminError):
    def __init__(self, addr: str, code: int, remark: str | None):
        try:
            name = ResponseCode(code).name
        except ValueError:
            name = str(code)
        super().__init__(f"{addr} answered {name}: {remark or '(no remark)'}")
        self.addr, self.code, self.remark = addr, code, remark


def from_client_error(exc: BaseException) -> AdminError | None:
    """The AdminError for a broker.client error (None if it is not one)."""
    from broker.client import errors as ce
    if not isinstance(exc, ce.ClientError):
        return None
    if isinstance(exc, (ce.ConnectionFailedError, ce.BrokerUnavailableError)):
        return UnreachableError(str(exc))
    if isinstance(exc, (ce.NoRouteError, ce.TopicNotExistError)):
        return NotFoundError(str(exc))
    if isinstance(exc, ce.SendFailedError):
        causes = [from_client_error(e) for e in getattr(exc, "errors", ()) or ()]
        return causes[-1] if causes and causes[-1] is not None else AdminError(str(exc))
    return AdminError(str(exc))


async def gather(items, fn) -> dict:
    """{item: await fn(item), or the AdminError it raised}, asked in
    parallel: one broker that does not answer is a row, not a failure."""
    results: dict = {}

    async def one(item):
        try:
            results[item] = await fn(item)
        except AdminError as e:
            results[item] = e

    async with trio.open_nursery() as nursery:
        for item in items:
            nursery.start_soon(one, item)
    return results


@attrs.frozen
class BrokerAddr:
    cluster: str
    broker_name: str
    broker_id: int
    addr: str

    @property
    def role(self) -> str:
        return "MASTER" if self.broker_id == MASTER_ID else "SLAVE"


def parse_mq_map(body: bytes, field: str = "offsetTable") -> dict[tuple[str, str, int], object]:
    """{(topic, brokerName, queueId): value} of a fastjson map whose keys are
    MessageQueue objects (broker.processors.admin.encode_mq_map's output)."""
    text = body.decode("utf-8")
    m = re.search(r'"%s"\s*:\s*\{' % re.escape(field), text)
    if m is None:
        return {}
    dec = json.JSONDecoder()
    pos, out = m.end(), {}
    while True:
        while text[pos] in " \n\r\t,":
            pos += 1
        if text[pos] == "}":
            return out
        key, pos = dec.raw_decode(text, pos)
        while text[pos] in " \n\r\t:":
            pos += 1
        value, pos = dec.raw_decode(text, pos)
        out[(key["topic"], key["brokerName"], int(key["queueId"]))] = value


def decode_records(body: bytes) -> list[M.MessageRecord]:
    """The stored records a pull / query / view answers with, concatenated."""
    out, pos = [], 0
    while pos + 4 <= len(body):
        size = int.from_bytes(body[pos:pos + 4], "big", signed=True)
        if size <= 0 or pos + size > len(body):
            break
        out.append(M.decode(body, pos, limit=pos + size))
        pos += size
    return out


def message_json(r: M.MessageRecord, body: bytes | None = None) -> dict:
    """A stored record for people and scripts; `body` overrides the
    record's (the client library's decompressed body)."""
    from broker.common.msgid import offset_msg_id
    body = r.body if body is None else body
    try:
        body_text = body.decode("utf-8")
    except UnicodeDecodeError:
        body_text = None
    return {"topic": r.topic, "msgId": r.uniq_key or "", "offsetMsgId": offset_msg_id(r.store_host, r.physical_offset),
            "tags": r.tags or "", "keys": r.keys, "queueId": r.queue_id, "queueOffset": r.queue_offset,
            "commitLogOffset": r.physical_offset, "reconsumeTimes": r.reconsume_times,
            "bornTimestamp": r.born_timestamp, "storeTimestamp": r.store_timestamp,
            "bornHost": str(r.born_host), "storeHost": str(r.store_host), "sysFlag": r.sysflag,
            "properties": dict(r.properties), "bodyLength": len(body), "body": body_text,
            "bodyHex": None if body_text is not None else body.hex()}


def _int_or(value, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


@attrs.frozen(kw_only=True)
class ProducerTable:
    """One broker's GET_ALL_PRODUCER_INFO answer: group -> ProducerInfo
    dicts (clientId, remoteIP, language, version, lastUpdateTimestamp);
    the remark says when the broker listed only part of them."""

    addr: str
    groups: dict[str, list[dict]]
    group_total: int
    producer_total: int
    remark: str | None = None


@attrs.define
class MQAdmin:
    remoting: RemotingClient
    namesrv_addr: str
    timeout: float = 5.0

    # --- the translation point -----------------------------------------------------

    async def call(self, addr: str, code: int, fields: dict | None = None, body: bytes = b"",
                   accept=(ResponseCode.SUCCESS,), timeout: float | None = None) -> RemotingCommand:
        request = RemotingCommand.create_request(code, fields, body=body)
        try:
            resp = await self.remoting.invoke(addr, request, self.timeout if timeout is None else timeout)
        except (RemotingConnectError, RemotingTimeoutError, RemotingConnectionLostError) as e:
            raise UnreachableError(f"broker {addr} unreachable: {e}") from None
        except RemotingError as e:
            raise AdminError(f"{addr}: {e}") from None
        if resp.code in accept:
            return resp
        if resp.code in NOT_FOUND_CODES:
            raise NotFoundError(resp.remark or f"{addr}: not found")
        raise RequestFailedError(addr, resp.code, resp.remark)

    async def _namesrv(self, fn):
        try:
            return await fn(NamesrvClient(self.remoting, self.namesrv_addr, timeout=self.timeout))
        except ValueError as e:  # no address in -n
            raise AdminError(str(e)) from None
        except ResponseError as e:
            raise RequestFailedError(e.addr, e.code, e.remark) from None
        except RemotingError as e:
            raise UnreachableError(f"name server {self.namesrv_addr}: {e}") from None

    # --- name server ---------------------------------------------------------------

    async def cluster_info(self) -> tuple[dict[str, BrokerData], dict[str, list[str]]]:
        return await self._namesrv(lambda ns: ns.get_cluster_info())

    async def topic_list(self) -> list[str]:
        return await self._namesrv(lambda ns: ns.get_topic_list())

    async def route(self, topic: str) -> TopicRouteData:
        route = await self._namesrv(lambda ns: ns.get_route(topic))
        if route is None or not route.broker_datas:
            raise NotFoundError(f"topic {topic} does not exist (no route on the name server)")
        return route

    async def namesrv_call(self, code: int, fields: dict | None = None) -> RemotingCommand:
        """One request to the first name server that answers it."""
        from broker.namesrv.client import parse_namesrv_addrs
        try:
            addrs = parse_namesrv_addrs(self.namesrv_addr)
        except ValueError as e:
            raise AdminError(str(e)) from None
        error: AdminError | None = None
        for addr in addrs:
            try:
                return await self.call(addr, code, fields)
            except UnreachableError as e:
                error = UnreachableError(str(e).replace(f"broker {addr}", f"name server {addr}", 1))
        raise error

    async def topics_by_cluster(self, cluster: str) -> list[str]:
        resp = await self.namesrv_call(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": cluster})
        return list(json.loads(resp.body).get("topicList") or [])

    async def delete_topic_in_namesrv(self, topic: str, cluster: str | None) -> None:
        results = await self._namesrv(lambda ns: ns.delete_topic(topic, cluster))
        errors = [r for r in results.values() if isinstance(r, RemotingError)]
        if errors and len(errors) == len(results):
            raise UnreachableError(f"name server: {errors[0]}")

    async def brokers(self, cluster: str | None = None) -> list[BrokerAddr]:
        """Every registered broker (of `cluster`), sorted by name and id."""
        brokers, clusters = await self.cluster_info()
        if cluster is not None and cluster not in clusters:
            raise NotFoundError(f"cluster {cluster} does not exist (known: {', '.join(sorted(clusters)) or 'none'})")
        names = set(clusters[cluster]) if cluster is not None else set(brokers)
        out = [BrokerAddr(data.cluster, name, bid, addr) for name, data in brokers.items() if name in names
               for bid, addr in data.broker_addrs.items()]
        return sorted(out, key=lambda b: (b.cluster, b.broker_name, b.broker_id))

    async def masters(self, cluster: str | None = None) -> dict[str, str]:
        """brokerName -> master address (brokers without a master are left out)."""
        return {b.broker_name: b.addr for b in await self.brokers(cluster) if b.broker_id == MASTER_ID}

    async def group_addrs(self, broker_name: str) -> dict[int, str]:
        brokers, _ = await self.cluster_info()
        data = brokers.get(broker_name)
        if data is None or not data.broker_addrs:
            raise NotFoundError(f"broker {broker_name} is not registered with the name server")
        return dict(data.broker_addrs)

    async def master_of(self, broker_name: str) -> str:
        addrs = await self.group_addrs(broker_name)
        if MASTER_ID not in addrs:
            raise UnreachableError(f"broker group {broker_name} has no master right now (ids {sorted(addrs)})")
        return addrs[MASTER_ID]

    async def topic_masters(self, topic: str) -> dict[str, str]:
        """brokerName -> address to ask about `topic` (the master, else any)."""
        route = await self.route(topic)
        out = {}
        for bd in route.broker_datas:
            if bd.broker_addrs:
                out[bd.broker_name] = bd.broker_addrs.get(MASTER_ID) or bd.broker_addrs[min(bd.broker_addrs)]
        return out

    # --- brokers: status and config -------------------------------------------------

    async def runtime_info(self, addr: str) -> dict[str, str]:
        resp = await self.call(addr, RequestCode.GET_BROKER_RUNTIME_INFO)
        return dict(json.loads(resp.body).get("table") or {})

    async def broker_config(self, addr: str) -> dict[str, str]:
        from commitlog.config import iter_properties
        resp = await self.call(addr, RequestCode.GET_BROKER_CONFIG)
        return {k: v for _, k, v in iter_properties(resp.body.decode("utf-8"))}

    async def update_broker_config(self, addr: str, key: str, value: str) -> None:
        await self.call(addr, RequestCode.UPDATE_BROKER_CONFIG, body=f"{key}={value}\n".encode())

    async def dledger_status(self, addr: str) -> dict:
        resp = await self.call(addr, RequestCode.LEDGERMQ_DLEDGER_STATUS)
        return json.loads(resp.body)

    async def transfer_leadership(self, addr: str, target: str) -> dict:
        resp = await self.call(addr, RequestCode.LEDGERMQ_TRANSFER_LEADERSHIP, {"targetId": target}, timeout=10)
        return dict(resp.ext_fields)

    async def chain_crc(self, addr: str, index: int) -> int:
        resp = await self.call(addr, RequestCode.LEDGERMQ_CHAIN_CRC, {"index": index})
        return int(resp.ext_fields["chainCrc"])

    async def change_membership(self, addr: str, change: str, peer_id: str, peer_addr: str | None = None,
                                timeout: float = 60.0) -> dict:
        """One single-server change on the group's leader (`addr`); answered
        once committed: {configIndex, voters, learners}."""
        fields = {"change": change, "peerId": peer_id, "timeoutMillis": int(timeout * 1000)}
        if peer_addr:
            fields["peerAddr"] = peer_addr
        resp = await self.call(addr, RequestCode.LEDGERMQ_CHANGE_MEMBERSHIP, fields, timeout=timeout + 5)
        f = resp.ext_fields
        return {"configIndex": int(f.get("configIndex", -1)),
                "voters": [v for v in str(f.get("voters", "")).split(",") if v],
                "learners": [v for v in str(f.get("learners", "")).split(",") if v]}

    # --- name servers, one by one (what the stock tools send to each) ---------------

    async def namesrv_write_perm(self, namesrv: str, broker_name: str, wipe: bool) -> int:
        """WIPE_WRITE_PERM_OF_BROKER (205) / ADD_WRITE_PERM_OF_BROKER (327) to
        one name server; the number of topics changed."""
        code = RequestCode.WIPE_WRITE_PERM_OF_BROKER if wipe else RequestCode.ADD_WRITE_PERM_OF_BROKER
        request = RemotingCommand.create_request(code, {"brokerName": broker_name})
        try:
            resp = await self.remoting.invoke(namesrv, request, self.timeout)
        except RemotingError as e:
            raise UnreachableError(f"name server {namesrv}: {e}") from None
        if resp.code != ResponseCode.SUCCESS:
            raise RequestFailedError(namesrv, resp.code, resp.remark)
        return int(resp.ext_fields.get("wipeTopicCount" if wipe else "addTopicCount", 0))

    # --- topics ----------------------------------------------------------------------

    async def create_topic(self, addr: str, topic: str, read: int, write: int, perm: int, order: bool,
                           attributes: str | None = None) -> None:
        await self.call(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": topic, "defaultTopic": "TBW102", "readQueueNums": read, "writeQueueNums": write,
            "perm": perm, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": order,
            "attributes": attributes})

    async def delete_topic_in_broker(self, addr: str, topic: str) -> None:
        await self.call(addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic})

    async def topic_stats(self, addr: str, topic: str) -> dict:
        resp = await self.call(addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic})
        return parse_mq_map(resp.body)

    # --- consumers ---------------------------------------------------------------------

    async def consume_stats(self, addr: str, group: str, topic: str | None = None) -> dict:
        resp = await self.call(addr, RequestCode.GET_CONSUME_STATS, {"consumerGroup": group, "topic": topic})
        return parse_mq_map(resp.body)

    async def all_group_configs(self, addr: str) -> dict[str, dict]:
        resp = await self.call(addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        return dict(json.loads(resp.body).get("subscriptionGroupTable") or {})

    async def consume_by_who(self, addr: str, topic: str) -> list[str]:
        resp = await self.call(addr, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": topic})
        return list(json.loads(resp.body).get("groupSet") or [])

    async def consume_tps(self, addr: str, group: str) -> float:
        """ConsumeStats.consumeTps (the fastjson body's top-level field)."""
        resp = await self.call(addr, RequestCode.GET_CONSUME_STATS, {"consumerGroup": group})
        m = re.search(rb'"consumeTps"\s*:\s*([-0-9.eE]+)', resp.body)
        return float(m.group(1)) if m else 0.0

    async def consumer_connection(self, addr: str, group: str) -> dict:
        resp = await self.call(addr, RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group})
        return json.loads(resp.body)

    async def producer_connection(self, addr: str, group: str) -> dict:
        resp = await self.call(addr, RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": group},
                               accept=(ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR))
        if resp.code != ResponseCode.SUCCESS:
            raise NotFoundError(resp.remark or f"producer group {group} not found")
        return json.loads(resp.body)

    async def all_producer_info(self, addr: str) -> "ProducerTable":
        """GET_ALL_PRODUCER_INFO: every producer group connected to one broker
        (RocketMQ 5's ProducerTableInfo), as far as the broker lists them."""
        resp = await self.call(addr, RequestCode.GET_ALL_PRODUCER_INFO)
        try:
            data = json.loads(resp.body or b"{}").get("data") or {}
            groups = {str(g): [dict(p) for p in producers] for g, producers in data.items()}
        except (ValueError, TypeError, AttributeError) as e:
            raise AdminError(f"{addr}: an unreadable producer table: {e}") from None
        fields = resp.ext_fields or {}
        listed = sum(len(v) for v in groups.values())
        return ProducerTable(addr=addr, groups=groups, remark=resp.remark,
                             group_total=_int_or(fields.get("groupTotal"), len(groups)),
                             producer_total=_int_or(fields.get("producerTotal"), listed))

    async def reset_offset(self, addr: str, topic: str, group: str, timestamp: int, force: bool) -> dict:
        resp = await self.call(addr, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                               {"topic": topic, "group": group, "timestamp": timestamp, "isForce": force})
        return parse_mq_map(resp.body)

    async def update_sub_group(self, addr: str, config: dict) -> None:
        await self.call(addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                        body=json.dumps(config, sort_keys=True).encode())

    async def delete_sub_group(self, addr: str, group: str, remove_offset: bool) -> None:
        await self.call(addr, RequestCode.DELETE_SUBSCRIPTIONGROUP,
                        {"groupName": group, "cleanOffset": remove_offset, "removeOffset": remove_offset})

    async def offset_by_time(self, addr: str, topic: str, queue_id: int, timestamp: int) -> int:
        resp = await self.call(addr, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                               {"topic": topic, "queueId": queue_id, "timestamp": timestamp})
        return int(resp.ext_fields["offset"])

    # --- messages ------------------------------------------------------------------------

    async def view_message(self, addr: str, phy_offset: int) -> M.MessageRecord:
        resp = await self.call(addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": phy_offset},
                               accept=(ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR))
        if resp.code != ResponseCode.SUCCESS:
            raise NotFoundError(resp.remark or f"no message at commitlog offset {phy_offset}")
        records = decode_records(resp.body)
        if not records:
            raise NotFoundError(f"no message at commitlog offset {phy_offset}")
        return records[0]

    async def query_message(self, addr: str, topic: str, key: str, max_num: int = 64, begin: int = 0,
                            end: int = (1 << 63) - 1, unique: bool = False) -> list[M.MessageRecord]:
        fields = {"topic": topic, "key": key, "maxNum": max_num, "beginTimestamp": begin, "endTimestamp": end}
        if unique:
            fields["_UNIQUE_KEY_QUERY"] = True
        resp = await self.call(addr, RequestCode.QUERY_MESSAGE, fields,
                               accept=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
        if resp.code != ResponseCode.SUCCESS:
            return []
        records = decode_records(resp.body)
        # The index matches key hashes: keep exact matches only.
        if unique:
            return [r for r in records if r.topic == topic and r.uniq_key == key]
        return [r for r in records if r.topic == topic and key in r.keys]

    async def pull(self, addr: str, group: str, topic: str, queue_id: int, offset: int,
                   max_nums: int = 32) -> tuple[int, int, int, list[M.MessageRecord]]:
        """(nextBeginOffset, minOffset, maxOffset, records); no suspension."""
        resp = await self.call(addr, RequestCode.PULL_MESSAGE, {
            "consumerGroup": group, "topic": topic, "queueId": queue_id, "queueOffset": offset,
            "maxMsgNums": max_nums, "sysFlag": 0x4, "commitOffset": 0, "suspendTimeoutMillis": 0,
            "subscription": "*", "subVersion": 0, "expressionType": "TAG"},
            accept=(ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY,
                    ResponseCode.PULL_OFFSET_MOVED))
        f = resp.ext_fields
        records = decode_records(resp.body) if resp.code == ResponseCode.SUCCESS else []
        return int(f.get("nextBeginOffset", offset)), int(f.get("minOffset", 0)), int(f.get("maxOffset", 0)), records

    # --- message look-ups (queryMsgBy* and the web console share them) ------------------

    async def find_by_key(self, topic: str, key: str, unique: bool, max_num: int = 64, begin: int = 0,
                          end: int = (1 << 63) - 1) -> list[dict]:
        """message_json of each message of `topic` with this key (or unique
        key), from every group holding the topic, each stored copy once."""
        found, seen = [], set()
        for name, addr in sorted((await self.topic_masters(topic)).items()):
            for r in await self.query_message(addr, topic, key, max_num, begin, end, unique):
                if (name, r.physical_offset) not in seen:
                    seen.add((name, r.physical_offset))
                    found.append(message_json(r))
        return found

    async def find_by_offset_msg_id(self, msg_id: str) -> dict:
        """The message of an offset message id: asked of the storing broker
        first, then of any other (every replica holds the same commitlog).
        MessageFormatError if `msg_id` is not one."""
        from broker.common.msgid import parse_offset_msg_id
        host, phy = parse_offset_msg_id(msg_id)
        addrs = [str(host)] + [b.addr for b in await self.brokers() if b.addr != str(host)]
        last: AdminError | None = None
        for addr in addrs:
            try:
                return message_json(await self.view_message(addr, phy))
            except UnreachableError as e:
                last = e
        raise last or NotFoundError(f"message {msg_id} not found")

    async def find_at_queue_offset(self, topic: str, broker_name: str, queue_id: int, offset: int) -> dict:
        """The message at a queue offset, read from any member of the group."""
        return message_json(await self.record_at(topic, broker_name, queue_id, offset))

    async def record_at(self, topic: str, broker_name: str, queue_id: int, offset: int) -> M.MessageRecord:
        """The stored record at a queue offset, read from any member of the group."""
        await self.route(topic)
        addrs = await self.group_addrs(broker_name)
        records = []
        for addr in [addrs[k] for k in sorted(addrs)]:
            try:
                _next, _lo, _hi, records = await self.pull(addr, TOOLS_GROUP, topic, queue_id, offset, 1)
                break
            except UnreachableError:
                continue
        if not records or records[0].queue_offset != offset:
            raise NotFoundError(f"no message at {topic}/{broker_name}/{queue_id} offset {offset}")
        return records[0]

    async def messages_in_range(self, topic: str, begin: int | None = None, end: int | None = None,
                                limit: int = 256, batch: int = 32) -> tuple[list[dict], bool]:
        """(message_json of each message of `topic` stored in [begin, end)
        (epoch ms; None: open), each with its brokerName, queue by queue;
        whether `limit` cut the list short).  SEARCH_OFFSET_BY_TIMESTAMP
        bounds each queue, pulls (as TOOLS_CONSUMER, nothing committed) read it."""
        route = await self.route(topic)
        readers = await self.topic_masters(topic)
        out: list[dict] = []
        for q in sorted(route.queue_datas, key=lambda q: q.broker_name):
            addr = readers.get(q.broker_name)
            for qid in range(q.read_queue_nums if addr else 0):
                lo = await self.offset_by_time(addr, topic, qid, begin) if begin is not None else 0
                hi = await self.offset_by_time(addr, topic, qid, end) if end is not None else None
                offset = max(lo, 0)
                while True:
                    nxt, _qmin, qmax, records = await self.pull(addr, TOOLS_GROUP, topic, qid, offset, batch)
                    stop = qmax if hi is None else min(hi, qmax)
                    for r in records:
                        if r.queue_offset >= stop:
                            break
                        if len(out) >= limit:
                            return out, True
                        out.append({**message_json(r), "brokerName": q.broker_name})
                    if not records or nxt >= stop or nxt <= offset:
                        break
                    offset = nxt
        return out, False
