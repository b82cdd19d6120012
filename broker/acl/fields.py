# Owns the header fields each request code may carry when ACL is on, and what
# each field's text must look like.  ACL 1.0 signs the ext field VALUES in key
# order, then the body, with nothing between (signing.py), so under one
# signature bytes can move between fields, into an added field or the body.
# Refusing every field a code does not define and every value that does not
# parse as its type closes most of those moves:
#
#   INT, LONG   Java's Integer / Long, written as Java writes them: decimal,
#               no sign but "-", no leading zeros, in range
#   BOOL        true / false in any case, and 0 / 1 (the C++ client writes
#               its bools with to_string: "0")
#   NAME        a topic, group, broker or cluster name: RocketMQ's topic
#               characters [%|a-zA-Z0-9_-] and ".", 255 at most; may be
#               empty (the C++ client sends "" for a group it has not)
#   ADDR        host:port
#   CHANNEL     the C++ and Node.js clients' OnsChannel: capital letters
#   BROKER      the 5.x broker name (`bname`, V2's `n`): a NAME, and on a
#               broker the broker's own name (a request for another broker
#               is malformed, and an unchecked field after the last one
#               signed could take bytes from the body)
#   EMPTY       5.x's namespace `ns`: ledgermq has no namespaces, so only ""
#   TEXT        anything (properties, expressions, keys, client ids)
#
# The schemas are RocketMQ's *RequestHeader classes, 4.9 and 5.x together
# (5.x added setZeroIfNotFound, boundaryType, cleanOffset, topic on view
# and end-transaction, ...), plus what each client is seen to send:
# GENERIC on every code (AccessKey, Signature, SecurityToken, the C++ and
# Node.js OnsChannel, the query flag Java's admin adds, and the 5.x
# RpcRequestHeader / TopicRequestHeader fields ns, nsd, bname, oway, lo);
# ledgermq's codes 9100-9103 have the fields mqadmin sends.  Pure.
import re
from collections.abc import Mapping

INT, LONG, BOOL, NAME, ADDR, CHANNEL, BROKER, EMPTY, TEXT = (
    "int", "long", "bool", "name", "host:port", "channel", "broker name", "empty", "text")

_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)")
_RANGE = {INT: (-(1 << 31), (1 << 31) - 1), LONG: (-(1 << 63), (1 << 63) - 1)}
_BOOLS = frozenset({"true", "false", "0", "1"})
_PATTERNS = {
    NAME: re.compile(r"[%|a-zA-Z0-9_.\-]{0,255}"),
    BROKER: re.compile(r"[%|a-zA-Z0-9_.\-]{0,255}"),
    ADDR: re.compile(r"[a-zA-Z0-9_.:\[\]%\-]{0,300}"),
    CHANNEL: re.compile(r"[A-Z]{0,32}"),
}

GENERIC: Mapping[str, str] = {
    "AccessKey": TEXT, "Signature": TEXT, "SecurityToken": TEXT, "OnsChannel": CHANNEL,
    "_UNIQUE_KEY_QUERY": BOOL,
    "ns": EMPTY, "nsd": BOOL, "bname": BROKER, "oway": BOOL, "lo": BOOL,
}


def value_fits(kind: str, value: str, broker_name: str | None = None) -> bool:
    """Does `value` parse as a field of this kind?"""
    if kind == TEXT:
        return True
    if kind in _RANGE:
        if not _NUMBER.fullmatch(value):
            return False
        lo, hi = _RANGE[kind]
        return lo <= int(value) <= hi
    if kind == BOOL:
        return value.lower() in _BOOLS
    if kind == EMPTY:
        return value == ""
    if kind == BROKER and broker_name is not None and value:
        return value == broker_name
    pattern = _PATTERNS.get(kind)
    return pattern is not None and pattern.fullmatch(value) is not None


def field_problem(code: int, fields: Mapping[str, str], schema: Mapping[str, str],
                  broker_name: str | None = None) -> str | None:
    """Why these ext fields are not a request of `code`, or None."""
    for name, value in fields.items():
        kind = schema.get(name) or GENERIC.get(name)
        if kind is None:
            return f"request code={code} has no field {name!r}"
        if not value_fits(kind, value, broker_name):
            shown = value if len(value) <= 40 else value[:40] + "..."
            return f"field {name}={shown!r} of request code={code} is not a {kind}"
    return None


# --- the schemas -------------------------------------------------------------------

NONE: Mapping[str, str] = {}  # a code whose request has no header, only a body or nothing

SEND = {  # SendMessageRequestHeader (10)
    "producerGroup": NAME, "topic": NAME, "defaultTopic": NAME, "defaultTopicQueueNums": INT, "queueId": INT,
    "sysFlag": INT, "bornTimestamp": LONG, "flag": INT, "properties": TEXT, "reconsumeTimes": INT,
    "unitMode": BOOL, "batch": BOOL, "maxReconsumeTimes": INT}
SEND_V2 = {  # SendMessageRequestHeaderV2 (310, 320): SEND's fields as a..n
    "a": NAME, "b": NAME, "c": NAME, "d": INT, "e": INT, "f": INT, "g": LONG, "h": INT, "i": TEXT, "j": INT,
    "k": BOOL, "l": INT, "m": BOOL, "n": BROKER}
PULL = {
    "consumerGroup": NAME, "topic": NAME, "queueId": INT, "queueOffset": LONG, "maxMsgNums": INT, "sysFlag": INT,
    "commitOffset": LONG, "suspendTimeoutMillis": LONG, "subscription": TEXT, "subVersion": LONG,
    "expressionType": NAME, "maxMsgBytes": INT, "requestSource": INT, "proxyFrowardClientId": TEXT}
QUERY_MESSAGE = {"topic": NAME, "key": TEXT, "maxNum": INT, "beginTimestamp": LONG, "endTimestamp": LONG}
QUERY_CONSUMER_OFFSET = {"consumerGroup": NAME, "topic": NAME, "queueId": INT, "setZeroIfNotFound": BOOL}
UPDATE_CONSUMER_OFFSET = {"consumerGroup": NAME, "topic": NAME, "queueId": INT, "commitOffset": LONG}
CREATE_TOPIC = {
    "topic": NAME, "defaultTopic": NAME, "readQueueNums": INT, "writeQueueNums": INT, "perm": INT,
    "topicFilterType": NAME, "topicSysFlag": INT, "order": BOOL, "attributes": TEXT, "force": BOOL}
GET_ALL_TOPIC_CONFIG = {"topicSeq": INT, "dataVersion": TEXT, "maxTopicNum": INT}
TOPIC_QUEUE = {"topic": NAME, "queueId": INT}  # GetMin/EarliestMsgStoretime
GET_MAX_OFFSET = {**TOPIC_QUEUE, "committed": BOOL}
SEARCH_OFFSET = {**TOPIC_QUEUE, "timestamp": LONG, "boundaryType": NAME}
VIEW_MESSAGE = {"offset": LONG, "topic": NAME}
UNREGISTER_CLIENT = {"clientID": TEXT, "producerGroup": NAME, "consumerGroup": NAME}
SEND_BACK = {
    "offset": LONG, "group": NAME, "delayLevel": INT, "originMsgId": TEXT, "originTopic": NAME, "unitMode": BOOL,
    "maxReconsumeTimes": INT}
END_TRANSACTION = {
    "producerGroup": NAME, "tranStateTableOffset": LONG, "commitLogOffset": LONG, "commitOrRollback": INT,
    "fromTransactionCheck": BOOL, "msgId": TEXT, "transactionId": TEXT, "topic": NAME}
CONSUMER_GROUP = {"consumerGroup": NAME}
PRODUCER_GROUP = {"producerGroup": NAME}
TOPIC = {"topic": NAME}
DELETE_GROUP = {"groupName": NAME, "removeOffset": BOOL, "cleanOffset": BOOL}
CONSUME_STATS = {"consumerGroup": NAME, "topic": NAME, "topicList": TEXT}
RESET_OFFSET = {"topic": NAME, "group": NAME, "timestamp": LONG, "isForce": BOOL, "queueId": INT, "offset": LONG}
CONSUMER_RUNNING_INFO = {"consumerGroup": NAME, "clientId": TEXT, "jstackEnable": BOOL}
BROKER_STATS = {"statsName": NAME, "statsKey": TEXT}
# RocketMQ 5's POP consumption (broker/processors/pop.py); BATCH_ACK_MESSAGE
# 200151 has only a body (BatchAckMessageRequestBody)
POP_MESSAGE = {
    "consumerGroup": NAME, "topic": NAME, "queueId": INT, "maxMsgNums": INT, "invisibleTime": LONG,
    "pollTime": LONG, "bornTime": LONG, "initMode": INT, "expType": NAME, "exp": TEXT, "order": BOOL,
    "attemptId": TEXT}
ACK_MESSAGE = {"consumerGroup": NAME, "topic": NAME, "queueId": INT, "extraInfo": TEXT, "offset": LONG}
CHANGE_INVISIBLE_TIME = {**ACK_MESSAGE, "invisibleTime": LONG}
# RECALL_MESSAGE 370 (RecallMessageRequestHeader; broker/processors/recall.py)
RECALL_MESSAGE = {"producerGroup": NAME, "topic": NAME, "recallHandle": TEXT, "brokerName": BROKER}
# ledgermq's own (broker/processors/admin_dledger.py, tools/mqadmin/adminapi.py)
TRANSFER_LEADERSHIP = {"targetId": NAME}
CHAIN_CRC = {"index": LONG}
CHANGE_MEMBERSHIP = {"change": NAME, "peerId": NAME, "peerAddr": ADDR, "timeoutMillis": LONG}
# the name server's route writes
REGISTER_BROKER = {
    "brokerName": NAME, "brokerAddr": ADDR, "clusterName": NAME, "haServerAddr": ADDR, "brokerId": LONG,
    "compressed": BOOL, "bodyCrc32": INT, "heartbeatTimeoutMillis": LONG, "enableActingMaster": BOOL}
UNREGISTER_BROKER = {"brokerName": NAME, "brokerAddr": ADDR, "clusterName": NAME, "brokerId": LONG}
DELETE_TOPIC_IN_NAMESRV = {"topic": NAME, "clusterName": NAME}
KV_CONFIG = {"namespace": NAME, "key": TEXT, "value": TEXT}
BROKER_NAME = {"brokerName": NAME}
