# Owns the ACL rule of every request code: the one table (RULES) the validator decides by, the
# README's tables are generated from (tools/codes_table.py) and tests/broker/acl/test_table.py holds
# against broker/remoting/codes.py and every code the broker and the name server register.  Each
# code is exactly one of
#
#   admin       only an account with `admin: true`
#   resources   the topics and groups the request reads or writes, each with the permission it needs:
#               read from the header or the body, or -- VIEW_MESSAGE_BY_ID 33, CONSUMER_SEND_MSG_BACK
#               36, END_TRANSACTION 37 -- from the message stored at the commitlog offset the request
#               names (a Lookup the composition root hands in; an offset holding no message is refused
#               like one the account may not read, and neither refusal names the topic)
#   signature   a valid signature is enough, with the reason written down ("not served ..." for codes
#               the broker answers REQUEST_CODE_NOT_SUPPORTED)
#
# and carries the header fields the code may have (fields.py; None: not checked, for codes no server
# here answers) and what the name server requires of it (NS_ADMIN for a route write, NS_OPEN for a
# route read, None where it does not serve it).  A code not in the table is one ledgermq does not
# know: signature only, nothing serves it.
#
# Producer groups are not resources in plain_acl.yml (producing accounts usually have no group rules),
# so a producer group named by a heartbeat, an unregistration or an end-transaction is refused only
# when the account DENYs it by name.  Internal topics that carry other topics' messages
# (CARRIER_TOPICS) need a rule naming them: an account's default does not reach them.  A check-back
# (CHECK_TRANSACTION_STATE, a half message inside) goes only to a connection whose account holds PUB
# on the half's topic (AclService.may_check_back).  Pure.
import enum
import json
from collections.abc import Callable, Mapping

import attrs

from broker.acl import fields as F
from broker.acl.plain import ANY, PUB, RETRY_PREFIX, SUB, perm_name
from broker.remoting.codes import RequestCode as C
from broker.remoting.command import RemotingCommand


class Kind(enum.Enum):
    ADMIN = "admin"
    RESOURCES = "resources"
    SIGNATURE = "signature"


NS_ADMIN = "admin (the brokers' credentials or an admin account)"
NS_OPEN = "open (clients find brokers without credentials)"
NOT_SERVED = "not served by the broker"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"  # MessageConst: where a half or delayed message is for


class Unreadable(Exception):
    """The request cannot be read well enough to know what it touches."""


# Where an account has no rule naming a resource: its default decides
# (ACCOUNT), the resource is allowed (ALLOW: producer groups) or refused
# (REFUSE: the internal topics below).
ACCOUNT, ALLOW, REFUSE = "account", "allow", "refuse"
# Topics that hold other topics' messages (halves of transactions, delayed,
# timer and retried-later messages, transaction ops): a default permission does
# not reach them, only a rule naming them (or an admin account).
CARRIER_TOPICS = frozenset({"RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "SCHEDULE_TOPIC_XXXX",
                            "rmq_sys_wheel_timer"})


@attrs.frozen(kw_only=True)
class Resource:
    kind: str  # "topic" or "group"
    name: str
    perm: int
    unnamed: str = ACCOUNT  # what decides when no rule of the account names it
    # What a refusal calls it instead of kind:name (a stored message, whose
    # topic the caller must not learn from the refusal).
    shown: str | None = None

    def __str__(self) -> str:
        return f"{self.kind}:{self.name} ({'ANY' if self.perm == ANY else perm_name(self.perm)})"


@attrs.frozen
class StoredMessage:
    """What the ACL needs of a message stored at a commitlog offset."""

    topic: str
    real_topic: str | None = None  # REAL_TOPIC of a half or a delayed message


# A commitlog offset -> the committed message starting there, or None.
Lookup = Callable[[int], StoredMessage | None]
Resources = Callable[[RemotingCommand, Lookup | None], list[Resource]]


@attrs.frozen(kw_only=True)
class Rule:
    kind: Kind
    needs: str  # README text: what is required, or why a signature is enough
    resources: Resources | None = None  # Kind.RESOURCES only
    fields: Mapping[str, str] | None = None
    namesrv: str | None = None

    @property
    def not_served(self) -> bool:
        return self.kind is Kind.SIGNATURE and self.needs.startswith(NOT_SERVED)


# --- what requests touch --------------------------------------------------------------

def topic(name: str | None, perm: int) -> list[Resource]:
    if not name:
        return []
    if name.startswith(RETRY_PREFIX):  # a retry topic is its group, and needs SUB on it
        return [Resource(kind="group", name=name[len(RETRY_PREFIX):], perm=SUB)]
    return [Resource(kind="topic", name=name, perm=perm, unnamed=REFUSE if name in CARRIER_TOPICS else ACCOUNT)]


def group(name: str | None) -> list[Resource]:
    return [Resource(kind="group", name=name, perm=SUB)] if name else []


def producer_group(name: str | None) -> list[Resource]:
    return [Resource(kind="group", name=name, perm=ANY, unnamed=ALLOW)] if name else []


def _f(cmd: RemotingCommand, name: str) -> str | None:
    return cmd.ext_fields.get(name)


def _header(*parts: Callable[[RemotingCommand], list[Resource]]) -> Resources:
    return lambda cmd, _lookup: [r for part in parts for r in part(cmd)]


def _topic_field(name: str, perm: int):
    return lambda cmd: topic(_f(cmd, name), perm)


def _group_field(name: str):
    return lambda cmd: group(_f(cmd, name))


def _json_object(cmd: RemotingCommand, what: str) -> dict:
    try:
        data = json.loads(cmd.body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise Unreadable(f"{what} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise Unreadable(f"{what} must be a JSON object")
    return data


def _heartbeat(cmd: RemotingCommand, _lookup) -> list[Resource]:
    data = _json_object(cmd, "HeartbeatData")
    out: list[Resource] = []
    for cd in data.get("consumerDataSet") or []:
        if not isinstance(cd, dict):
            raise Unreadable("HeartbeatData consumer data must be JSON objects")
        out += group(cd.get("groupName"))
        for sub in cd.get("subscriptionDataSet") or []:
            out += topic(sub.get("topic") if isinstance(sub, dict) else None, SUB)
    for pd in data.get("producerDataSet") or []:
        if not isinstance(pd, dict):
            raise Unreadable("HeartbeatData producer data must be JSON objects")
        out += producer_group(pd.get("groupName"))
    return out


def _locks(cmd: RemotingCommand, _lookup) -> list[Resource]:
    data = _json_object(cmd, "LockBatchRequestBody")
    out = group(data.get("consumerGroup") if isinstance(data.get("consumerGroup"), str) else None)
    if not out:
        raise Unreadable("LockBatchRequestBody needs a consumerGroup")
    mqs = data.get("mqSet") or []
    if not isinstance(mqs, list):
        raise Unreadable("LockBatchRequestBody: mqSet must be a list")
    for name in dict.fromkeys(m.get("topic") for m in mqs if isinstance(m, dict)):
        out += topic(name if isinstance(name, str) else None, SUB)
    return out


def _batch_ack(cmd: RemotingCommand, _lookup) -> list[Resource]:
    data = _json_object(cmd, "BatchAckMessageRequestBody")
    acks = data.get("acks") or []
    if not isinstance(acks, list) or not all(isinstance(a, dict) for a in acks):
        raise Unreadable("BatchAckMessageRequestBody: acks must be a list of objects")
    out: list[Resource] = []
    for a in acks:
        t, g = a.get("t", a.get("topic")), a.get("c", a.get("consumerGroup"))
        if not isinstance(t, str) or not t or not isinstance(g, str) or not g:
            raise Unreadable("BatchAckMessageRequestBody: an ack without its topic and group")
        out += topic(t, SUB) + group(g)
    return list(dict.fromkeys(out))


def _offset(cmd: RemotingCommand, name: str) -> int:
    text = _f(cmd, name)
    if text is None or not F.value_fits(F.LONG, text):
        raise Unreadable(f"the custom field <{name}> is not a valid long: {text!r}")
    return int(text)


def _stored(cmd: RemotingCommand, lookup: Lookup | None, field: str) -> tuple[StoredMessage, str]:
    offset = _offset(cmd, field)
    shown = f"the message at offset {offset}"
    if lookup is None:
        raise Unreadable(f"{shown} cannot be looked up here")
    msg = lookup(offset)
    if msg is None:  # refused as one the account may not read: the caller learns nothing
        return StoredMessage(""), shown
    return msg, shown


def _message_topics(msg: StoredMessage, perm: int, shown: str) -> list[Resource]:
    if not msg.topic:
        return [Resource(kind="topic", name="", perm=perm, shown=shown)]  # nobody holds a permission on ""
    names = [msg.topic] + ([msg.real_topic] if msg.real_topic and msg.real_topic != msg.topic else [])
    return [attrs.evolve(r, shown=shown) for name in names for r in topic(name, perm)]


def _view(cmd, lookup) -> list[Resource]:
    msg, shown = _stored(cmd, lookup, "offset")
    return _message_topics(msg, SUB, shown)


def _send_back(cmd, lookup) -> list[Resource]:
    msg, shown = _stored(cmd, lookup, "offset")
    return group(_f(cmd, "group")) + _message_topics(msg, SUB, shown)


def _end_transaction(cmd, lookup) -> list[Resource]:
    msg, shown = _stored(cmd, lookup, "commitLogOffset")
    # A half is stored on RMQ_SYS_TRANS_HALF_TOPIC for its REAL_TOPIC: the
    # producer holds PUB on that one.
    real = StoredMessage(msg.real_topic or msg.topic)
    return producer_group(_f(cmd, "producerGroup")) + _message_topics(real, PUB, shown)


def check_back_resources(group_name: str, real_topic: str) -> list[Resource]:
    """What a producer connection's account must hold to be sent a
    CHECK_TRANSACTION_STATE for a half of `real_topic`."""
    return producer_group(group_name) + topic(real_topic, PUB)


# --- the table -------------------------------------------------------------------------

ADMIN = "an admin account"


def admin(fields=F.NONE, namesrv=None) -> Rule:
    return Rule(kind=Kind.ADMIN, needs=ADMIN, resources=None, fields=fields, namesrv=namesrv)


def needs(text: str, resources: Resources, fields) -> Rule:
    return Rule(kind=Kind.RESOURCES, needs=text, resources=resources, fields=fields)


def signature(reason: str, fields=F.NONE, namesrv=None) -> Rule:
    return Rule(kind=Kind.SIGNATURE, needs=reason, resources=None, fields=fields, namesrv=namesrv)


def not_served(namesrv=None, fields=None, why: str = "") -> Rule:
    return Rule(kind=Kind.SIGNATURE, needs=NOT_SERVED + why, resources=None, fields=fields, namesrv=namesrv)


_SEND = "topic PUB (a `%RETRY%G` topic: group G SUB)"
_TOPIC_SUB = "topic SUB"
_OFFSETS = "group SUB, topic SUB"
_GROUP_SUB = "group SUB"
_POP = "topic SUB, group SUB (as PULL_MESSAGE)"

RULES: dict[int, Rule] = {
    C.SEND_MESSAGE: needs(_SEND, _header(_topic_field("topic", PUB)), F.SEND),
    C.SEND_MESSAGE_V2: needs(_SEND, _header(_topic_field("b", PUB)), F.SEND_V2),
    C.SEND_BATCH_MESSAGE: needs(_SEND, _header(_topic_field("b", PUB)), F.SEND_V2),
    C.PULL_MESSAGE: needs("topic SUB, group SUB", _header(_topic_field("topic", SUB), _group_field("consumerGroup")),
                          F.PULL),
    C.QUERY_MESSAGE: needs(_TOPIC_SUB, _header(_topic_field("topic", SUB)), F.QUERY_MESSAGE),
    C.QUERY_BROKER_OFFSET: not_served(),
    C.QUERY_CONSUMER_OFFSET: needs(_OFFSETS, _header(_group_field("consumerGroup"), _topic_field("topic", SUB)),
                                   F.QUERY_CONSUMER_OFFSET),
    C.UPDATE_CONSUMER_OFFSET: needs(_OFFSETS, _header(_group_field("consumerGroup"), _topic_field("topic", SUB)),
                                    F.UPDATE_CONSUMER_OFFSET),
    C.UPDATE_AND_CREATE_TOPIC: admin(F.CREATE_TOPIC),
    C.GET_ALL_TOPIC_CONFIG: admin(F.GET_ALL_TOPIC_CONFIG),
    C.GET_TOPIC_CONFIG_LIST: not_served(),
    C.GET_TOPIC_NAME_LIST: not_served(),
    C.UPDATE_BROKER_CONFIG: admin(),
    C.GET_BROKER_CONFIG: admin(),
    C.TRIGGER_DELETE_FILES: admin(None),
    # Commitlog offsets and counters of every topic: with them a caller
    # knows where messages are; only operators' tools ask.
    C.GET_BROKER_RUNTIME_INFO: admin(),
    C.SEARCH_OFFSET_BY_TIMESTAMP: needs(_TOPIC_SUB, _header(_topic_field("topic", SUB)), F.SEARCH_OFFSET),
    C.GET_MAX_OFFSET: needs(_TOPIC_SUB, _header(_topic_field("topic", SUB)), F.GET_MAX_OFFSET),
    C.GET_MIN_OFFSET: needs(_TOPIC_SUB, _header(_topic_field("topic", SUB)), F.TOPIC_QUEUE),
    C.GET_EARLIEST_MSG_STORETIME: needs(_TOPIC_SUB, _header(_topic_field("topic", SUB)), F.TOPIC_QUEUE),
    C.VIEW_MESSAGE_BY_ID: needs("SUB on the topic of the message stored at `offset` (and on its REAL_TOPIC: a "
                                "half or delayed message)", _view, F.VIEW_MESSAGE),
    C.HEART_BEAT: needs("each consumer group SUB and each subscribed topic SUB; each producer group not DENY'd "
                        "by name", _heartbeat, F.NONE),
    C.UNREGISTER_CLIENT: needs("`consumerGroup` SUB; `producerGroup` not DENY'd by name",
                               _header(_group_field("consumerGroup"),
                                       lambda c: producer_group(_f(c, "producerGroup"))), F.UNREGISTER_CLIENT),
    C.CONSUMER_SEND_MSG_BACK: needs("`group` SUB, and SUB on the topic of the message stored at `offset` (as 33)",
                                    _send_back, F.SEND_BACK),
    C.END_TRANSACTION: needs("PUB on the topic of the half message stored at `commitLogOffset` (its REAL_TOPIC); "
                             "`producerGroup` not DENY'd by name", _end_transaction, F.END_TRANSACTION),
    C.GET_CONSUMER_LIST_BY_GROUP: needs(_GROUP_SUB, _header(_group_field("consumerGroup")), F.CONSUMER_GROUP),
    C.CHECK_TRANSACTION_STATE: not_served(why=" (the broker sends it, only to a producer connection whose account "
                                              "holds PUB on the half message's topic)"),
    C.NOTIFY_CONSUMER_IDS_CHANGED: not_served(why=" (the broker sends it to consumers)"),
    C.LOCK_BATCH_MQ: needs("group SUB and SUB on each queue's topic (body)", _locks, F.NONE),
    C.UNLOCK_BATCH_MQ: needs("group SUB and SUB on each queue's topic (body)", _locks, F.NONE),
    C.GET_ALL_CONSUMER_OFFSET: not_served(),
    C.GET_ALL_DELAY_OFFSET: not_served(),
    C.CHECK_CLIENT_CONFIG: signature("it only compiles a filter expression; no topic or group is read or written"),
    C.PUT_KV_CONFIG: not_served(NS_ADMIN, F.KV_CONFIG),
    C.GET_KV_CONFIG: not_served(),
    C.DELETE_KV_CONFIG: not_served(NS_ADMIN, F.KV_CONFIG),
    C.REGISTER_BROKER: not_served(NS_ADMIN, F.REGISTER_BROKER),
    C.UNREGISTER_BROKER: not_served(NS_ADMIN, F.UNREGISTER_BROKER),
    C.GET_ROUTEINFO_BY_TOPIC: not_served(NS_OPEN),
    C.GET_BROKER_CLUSTER_INFO: not_served(NS_OPEN),
    C.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: admin(),
    C.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: admin(),
    C.GET_TOPIC_STATS_INFO: needs(_TOPIC_SUB, _header(_topic_field("topic", SUB)), F.TOPIC),
    C.GET_CONSUMER_CONNECTION_LIST: needs(_GROUP_SUB, _header(_group_field("consumerGroup")), F.CONSUMER_GROUP),
    C.GET_PRODUCER_CONNECTION_LIST: admin(F.PRODUCER_GROUP),
    C.WIPE_WRITE_PERM_OF_BROKER: admin(F.BROKER_NAME, NS_ADMIN),
    C.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: not_served(NS_OPEN),
    C.DELETE_SUBSCRIPTIONGROUP: admin(F.DELETE_GROUP),
    C.GET_CONSUME_STATS: needs("group SUB (and `topic` SUB when given)",
                               _header(_group_field("consumerGroup"), _topic_field("topic", SUB)), F.CONSUME_STATS),
    C.DELETE_TOPIC_IN_BROKER: admin(F.TOPIC),
    C.DELETE_TOPIC_IN_NAMESRV: not_served(NS_ADMIN, F.DELETE_TOPIC_IN_NAMESRV),
    C.REGISTER_TOPIC_IN_NAMESRV: not_served(NS_ADMIN, F.TOPIC),
    C.GET_KVLIST_BY_NAMESPACE: not_served(),
    C.RESET_CONSUMER_CLIENT_OFFSET: not_served(why=" (the broker sends it to consumers)"),
    C.INVOKE_BROKER_TO_RESET_OFFSET: admin(F.RESET_OFFSET),
    C.GET_TOPICS_BY_CLUSTER: not_served(NS_OPEN),
    C.QUERY_TOPIC_CONSUME_BY_WHO: needs(_TOPIC_SUB, _header(_topic_field("topic", SUB)), F.TOPIC),
    C.QUERY_CONSUME_TIME_SPAN: not_served(),
    C.GET_SYSTEM_TOPIC_LIST_FROM_NS: not_served(NS_OPEN),
    C.GET_SYSTEM_TOPIC_LIST_FROM_BROKER: not_served(),
    C.CLEAN_EXPIRED_CONSUMEQUEUE: admin(None),
    # The broker asks the client on its connection; the answer holds the
    # client's subscriptions, settings and (Java) thread dump.
    C.GET_CONSUMER_RUNNING_INFO: admin(F.CONSUMER_RUNNING_INFO),
    C.QUERY_CORRECTION_OFFSET: not_served(),
    C.CONSUME_MESSAGE_DIRECTLY: not_served(),
    C.CLONE_GROUP_OFFSET: not_served(),
    C.VIEW_BROKER_STATS_DATA: admin(F.BROKER_STATS),
    C.CLEAN_UNUSED_TOPIC: not_served(),
    C.GET_BROKER_CONSUME_STATS: not_served(),
    C.UPDATE_NAMESRV_CONFIG: not_served(),
    C.GET_NAMESRV_CONFIG: not_served(),
    C.QUERY_CONSUME_QUEUE: not_served(),
    C.QUERY_DATA_VERSION: not_served(),
    C.SEND_REPLY_MESSAGE: not_served(),
    C.SEND_REPLY_MESSAGE_V2: not_served(),
    C.PUSH_REPLY_MESSAGE_TO_CLIENT: not_served(),
    C.ADD_WRITE_PERM_OF_BROKER: admin(F.BROKER_NAME, NS_ADMIN),
    # every producer group's clients, their addresses and ids (RocketMQ 5 files it under
    # CLUSTER GET); GetAllProducerInfoRequestHeader has no field
    C.GET_ALL_PRODUCER_INFO: admin(),
    C.GET_TOPIC_CONFIG: not_served(),
    C.LITE_PULL_MESSAGE: not_served(),
    C.QUERY_ASSIGNMENT: not_served(),
    C.SET_MESSAGE_REQUEST_MODE: not_served(),
    C.GET_BROKER_MEMBER_GROUP: not_served(),
    C.BROKER_HEARTBEAT: not_served(),
    C.POP_MESSAGE: needs(_POP, _header(_topic_field("topic", SUB), _group_field("consumerGroup")), F.POP_MESSAGE),
    C.ACK_MESSAGE: needs(_POP, _header(_topic_field("topic", SUB), _group_field("consumerGroup")), F.ACK_MESSAGE),
    C.CHANGE_MESSAGE_INVISIBLETIME: needs(_POP, _header(_topic_field("topic", SUB), _group_field("consumerGroup")),
                                          F.CHANGE_INVISIBLE_TIME),
    C.BATCH_ACK_MESSAGE: needs("topic SUB and group SUB of each ack (body)", _batch_ack, F.NONE),
    C.RECALL_MESSAGE: needs("`topic` PUB (the topic the timer message is for); `producerGroup` not DENY'd by name",
                            _header(_topic_field("topic", PUB), lambda cmd: producer_group(_f(cmd, "producerGroup"))),
                            F.RECALL_MESSAGE),
    # ledgermq's replication codes: each changes or reveals the replicated
    # log (a learner added at a stranger's address receives all of it).
    C.LEDGERMQ_DLEDGER_STATUS: admin(),
    C.LEDGERMQ_TRANSFER_LEADERSHIP: admin(F.TRANSFER_LEADERSHIP),
    C.LEDGERMQ_CHAIN_CRC: admin(F.CHAIN_CRC),
    C.LEDGERMQ_CHANGE_MEMBERSHIP: admin(F.CHANGE_MEMBERSHIP),
}

UNKNOWN = not_served(why=" (a code ledgermq does not know)")


def rule_for(code: int) -> Rule:
    return RULES.get(code, UNKNOWN)


ADMIN_CODES = frozenset(code for code, rule in RULES.items() if rule.kind is Kind.ADMIN)
NAMESRV_ADMIN_CODES = frozenset(code for code, rule in RULES.items() if rule.namesrv == NS_ADMIN)
