# The ACL decision (broker/acl/validator.py) as a table: account x request
# code x resource -> allowed, or RocketMQ's refusal text, with a fake store
# behind the requests that name a commitlog offset.  Live: a 3-broker group
# in tests/broker/acl/test_secure_group.py, issue 27's bypasses in
# tests/broker/acl/test_bypasses.py.
import json

import pytest

from broker.acl.plain import parse_plain_acl_text
from broker.acl.signing import Credentials
from broker.acl.table import StoredMessage
from broker.acl.validator import ADMIN_CODES, NAMESRV_POLICY, AclDenied, broker_policy, required_resources, validate
from broker.remoting.codes import RequestCode as C
from broker.remoting.command import RemotingCommand

RULES = """\
globalWhiteRemoteAddresses: ["172.16.0.*"]
accounts:
  - accessKey: producer1
    secretKey: producer-secret
    defaultTopicPerm: DENY
    topicPerms: [Orders=PUB, Audit=SUB, Closed=DENY]
  - accessKey: consumer1
    secretKey: consumer-secret
    defaultGroupPerm: DENY
    topicPerms: [Orders=SUB]
    groupPerms: [OrderConsumers=SUB, Blocked=DENY, TxBlocked=DENY]
  - accessKey: reader01
    secretKey: reader-secret
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
  - accessKey: admin001
    secretKey: admin-secret
    admin: true
  - accessKey: admin002
    secretKey: admin-secret
    admin: true
    topicPerms: [Orders=SUB]
  - accessKey: white01
    secretKey: white-secret
    whiteRemoteAddress: 10.9.9.9
"""
SECRETS = {"producer1": "producer-secret", "consumer1": "consumer-secret", "reader01": "reader-secret",
           "admin001": "admin-secret", "admin002": "admin-secret", "white01": "white-secret"}
IP = "10.0.0.1"


def heartbeat(group: str, *topics: str) -> bytes:
    return json.dumps({"clientID": "c", "producerDataSet": [], "consumerDataSet": [{
        "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
        "subscriptionDataSet": [{"topic": t, "subString": "*"} for t in topics]}]}).encode()


def send_v2(topic):
    return C.SEND_MESSAGE_V2, {"a": "PG", "b": topic}, b"body"


REQUESTS = {
    "send Orders": (C.SEND_MESSAGE, {"producerGroup": "PG", "topic": "Orders"}, b"body"),
    "sendV2 Orders": send_v2("Orders"),
    "sendV2 Audit": send_v2("Audit"),
    "sendV2 Closed": send_v2("Closed"),
    "sendV2 Other": send_v2("Other"),
    "batch Orders": (C.SEND_BATCH_MESSAGE, {"a": "PG", "b": "Orders"}, b"body"),
    "sendV2 %RETRY%OrderConsumers": send_v2("%RETRY%OrderConsumers"),
    "pull Orders/OrderConsumers": (C.PULL_MESSAGE, {"topic": "Orders", "consumerGroup": "OrderConsumers"}, b""),
    "pull Orders/Blocked": (C.PULL_MESSAGE, {"topic": "Orders", "consumerGroup": "Blocked"}, b""),
    "pull Audit/OrderConsumers": (C.PULL_MESSAGE, {"topic": "Audit", "consumerGroup": "OrderConsumers"}, b""),
    "commit Orders/OrderConsumers": (C.UPDATE_CONSUMER_OFFSET,
                                     {"topic": "Orders", "consumerGroup": "OrderConsumers"}, b""),
    "query offset Orders/Other": (C.QUERY_CONSUMER_OFFSET, {"topic": "Orders", "consumerGroup": "Other"}, b""),
    "heartbeat OrderConsumers": (C.HEART_BEAT, {}, heartbeat("OrderConsumers", "Orders")),
    "heartbeat OrderConsumers+Audit": (C.HEART_BEAT, {}, heartbeat("OrderConsumers", "Orders", "Audit")),
    "send back OrderConsumers": (C.CONSUMER_SEND_MSG_BACK, {"group": "OrderConsumers", "offset": "1"}, b""),
    "send back of an Audit message": (C.CONSUMER_SEND_MSG_BACK, {"group": "OrderConsumers", "offset": "2"}, b""),
    "send back of nothing": (C.CONSUMER_SEND_MSG_BACK, {"group": "OrderConsumers", "offset": "7"}, b""),
    "view Orders message": (C.VIEW_MESSAGE_BY_ID, {"offset": "1"}, b""),
    "view Audit message": (C.VIEW_MESSAGE_BY_ID, {"offset": "2"}, b""),
    "view nothing": (C.VIEW_MESSAGE_BY_ID, {"offset": "7"}, b""),
    "view half for Orders": (C.VIEW_MESSAGE_BY_ID, {"offset": "3"}, b""),
    "end transaction Orders": (C.END_TRANSACTION, {"producerGroup": "TX", "commitLogOffset": "3",
                                                   "tranStateTableOffset": "0", "commitOrRollback": "8"}, b""),
    "end transaction Audit": (C.END_TRANSACTION, {"producerGroup": "TX", "commitLogOffset": "4",
                                                  "tranStateTableOffset": "0", "commitOrRollback": "8"}, b""),
    "producer heartbeat PG": (C.HEART_BEAT, {}, b'{"clientID":"c","producerDataSet":[{"groupName":"PG"}]}'),
    "producer heartbeat TxBlocked": (C.HEART_BEAT, {},
                                     b'{"clientID":"c","producerDataSet":[{"groupName":"TxBlocked"}]}'),
    "lock OrderConsumers": (C.LOCK_BATCH_MQ, {}, json.dumps({
        "consumerGroup": "OrderConsumers", "clientId": "c",
        "mqSet": [{"topic": "Orders", "brokerName": "b", "queueId": 0}]}).encode()),
    "lock Victims": (C.LOCK_BATCH_MQ, {}, json.dumps({
        "consumerGroup": "Victims", "clientId": "c",
        "mqSet": [{"topic": "Orders", "brokerName": "b", "queueId": 0}]}).encode()),
    "unlock Victims": (C.UNLOCK_BATCH_MQ, {}, json.dumps({
        "consumerGroup": "Victims", "clientId": "c", "mqSet": []}).encode()),
    "membership": (C.LEDGERMQ_CHANGE_MEMBERSHIP, {"change": "addLearner", "peerId": "n9",
                                                  "peerAddr": "127.0.0.1:1"}, b""),
    "chain crc": (C.LEDGERMQ_CHAIN_CRC, {"index": "1"}, b""),
    "query the half topic": (C.QUERY_MESSAGE, {"topic": "RMQ_SYS_TRANS_HALF_TOPIC", "key": "k"}, b""),
    "max offset Orders": (C.GET_MAX_OFFSET, {"topic": "Orders", "queueId": "0"}, b""),
    "check client config": (C.CHECK_CLIENT_CONFIG, {}, b"{}"),
    "consumer list Blocked": (C.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "Blocked"}, b""),
    "trace": send_v2("RMQ_SYS_TRACE_TOPIC"),
    "runtime info": (C.GET_BROKER_RUNTIME_INFO, {}, b""),
    "create topic": (C.UPDATE_AND_CREATE_TOPIC, {"topic": "New"}, b""),
    "delete group": (C.DELETE_SUBSCRIPTIONGROUP, {"groupName": "G"}, b""),
    "broker config": (C.UPDATE_BROKER_CONFIG, {}, b"k=v"),
    "reset offset": (C.INVOKE_BROKER_TO_RESET_OFFSET, {"topic": "Orders", "group": "G"}, b""),
    "dledger status": (C.LEDGERMQ_DLEDGER_STATUS, {}, b""),
    "transfer": (C.LEDGERMQ_TRANSFER_LEADERSHIP, {"targetId": "n1"}, b""),
}
OK = None
NOT_ADMIN = "Need admin permission for request code={code}, but accessKey={ak} is not"

TABLE = [
    ("producer1", "send Orders", OK),
    ("producer1", "sendV2 Orders", OK),
    ("producer1", "batch Orders", OK),
    ("producer1", "sendV2 Audit", "No default permission for topic:Audit"),
    ("producer1", "sendV2 Closed", "No default permission for topic:Closed"),
    ("producer1", "sendV2 Other", "No default permission for topic:Other"),
    ("producer1", "trace", OK),  # RocketMQ lets every account write message traces
    ("producer1", "runtime info", NOT_ADMIN),  # commitlog offsets of every topic: operators only
    ("producer1", "check client config", OK),  # signature only: it reads and writes nothing
    ("producer1", "producer heartbeat PG", OK),  # a producer group is refused only when DENY'd by name
    ("consumer1", "producer heartbeat TxBlocked", "No default permission for group:TxBlocked"),
    ("producer1", "end transaction Orders", OK),  # PUB on the half's REAL_TOPIC
    ("producer1", "end transaction Audit", "No default permission for the message at offset 4"),
    ("producer1", "view Orders message", "No default permission for the message at offset 1"),  # PUB only
    ("producer1", "max offset Orders", "No default permission for topic:Orders"),
    ("consumer1", "view Orders message", OK),
    ("consumer1", "view Audit message", "No default permission for the message at offset 2"),
    ("consumer1", "view nothing", "No default permission for the message at offset 7"),  # not found: same text
    ("consumer1", "view half for Orders", "No default permission for the message at offset 3"),  # the half topic
    # Internal topics holding other topics' messages need a rule naming
    # them: a default SUB does not reach a half or a delayed message.
    ("reader01", "view half for Orders", "No default permission for the message at offset 3"),
    ("reader01", "query the half topic", "No default permission for topic:RMQ_SYS_TRANS_HALF_TOPIC"),
    ("admin001", "query the half topic", OK),
    ("consumer1", "send back of an Audit message", "No default permission for the message at offset 2"),
    ("consumer1", "send back of nothing", "No default permission for the message at offset 7"),
    ("consumer1", "max offset Orders", OK),
    ("consumer1", "lock OrderConsumers", OK),
    ("consumer1", "lock Victims", "No default permission for group:Victims"),
    ("consumer1", "unlock Victims", "No default permission for group:Victims"),
    ("reader01", "lock Victims", OK),  # defaultGroupPerm SUB: every group is its own
    ("reader01", "membership", NOT_ADMIN),
    ("reader01", "chain crc", NOT_ADMIN),
    ("admin001", "membership", OK),
    ("admin001", "view Audit message", OK),
    ("admin002", "view Audit message", "No default permission for the message at offset 2"),
    ("producer1", "pull Orders/OrderConsumers", "No default permission for topic:Orders"),
    ("producer1", "create topic", NOT_ADMIN),
    ("consumer1", "pull Orders/OrderConsumers", OK),
    ("consumer1", "commit Orders/OrderConsumers", OK),
    ("consumer1", "heartbeat OrderConsumers", OK),
    ("consumer1", "send back OrderConsumers", OK),
    ("consumer1", "sendV2 %RETRY%OrderConsumers", OK),
    ("consumer1", "pull Orders/Blocked", "No default permission for group:Blocked"),
    ("consumer1", "consumer list Blocked", "No default permission for group:Blocked"),
    ("consumer1", "pull Audit/OrderConsumers", "No default permission for topic:Audit"),
    ("consumer1", "heartbeat OrderConsumers+Audit", "No default permission for topic:Audit"),
    ("consumer1", "query offset Orders/Other", "No default permission for group:Other"),
    ("consumer1", "sendV2 Orders", "No default permission for topic:Orders"),
    ("consumer1", "delete group", NOT_ADMIN),
    ("reader01", "pull Audit/OrderConsumers", OK),
    ("reader01", "sendV2 Other", "No default permission for topic:Other"),
    ("admin001", "create topic", OK),
    ("admin001", "delete group", OK),
    ("admin001", "broker config", OK),
    ("admin001", "reset offset", OK),
    ("admin001", "dledger status", OK),
    ("admin001", "transfer", OK),
    ("admin001", "sendV2 Other", OK),  # an admin without resource rules may do anything
    ("admin002", "sendV2 Orders", "No default permission for topic:Orders"),  # ... one with rules may not
    ("reader01", "dledger status", NOT_ADMIN),
    ("reader01", "transfer", NOT_ADMIN),
    ("reader01", "reset offset", NOT_ADMIN),
    ("reader01", "broker config", NOT_ADMIN),
]


@pytest.fixture(scope="module")
def rules():
    return parse_plain_acl_text(RULES)


def request(name: str, ak: str | None = None, secret: str | None = None) -> RemotingCommand:
    code, fields, body = REQUESTS[name]
    cmd = RemotingCommand.create_request(code, fields, body=body)
    return Credentials(ak, secret or SECRETS[ak]).sign(cmd) if ak else cmd


# What the fake store holds at each commitlog offset.
STORED = {1: StoredMessage("Orders"), 2: StoredMessage("Audit"),
          3: StoredMessage("RMQ_SYS_TRANS_HALF_TOPIC", "Orders"), 4: StoredMessage("RMQ_SYS_TRANS_HALF_TOPIC", "Audit")}


def outcome(rules, cmd, ip=IP):
    try:
        validate(rules, ip, cmd, broker_policy("b"), STORED.get)
    except AclDenied as e:
        return e.reason
    return None


@pytest.mark.parametrize("ak, name, expected", TABLE, ids=[f"{a}:{n}" for a, n, _ in TABLE])
def test_the_permission_table(rules, ak, name, expected):
    cmd = request(name, ak)
    if expected is not None:
        expected = expected.format(code=cmd.code, ak=ak)
    assert outcome(rules, cmd) == expected


def test_unsigned_unknown_and_wrongly_signed_requests(rules):
    assert outcome(rules, request("runtime info")) == "No accessKey is configured"
    assert outcome(rules, request("runtime info", "nobody01", "whatever")) == "No acl config for nobody01"
    assert (outcome(rules, request("sendV2 Orders", "producer1", "not-the-secret"))
            == "Check signature failed for accessKey=producer1")
    # The C++ client sends AccessKey "" when it has no credentials.
    cmd = RemotingCommand.create_request(C.GET_BROKER_RUNTIME_INFO, {"AccessKey": "", "Signature": ""})
    assert outcome(rules, cmd) == "No acl config for "


def test_whitelists(rules):
    # The global whitelist lets anything through, unsigned, admin codes included (RocketMQ's rule).
    assert outcome(rules, request("create topic"), ip="172.16.0.5") is None
    assert outcome(rules, request("create topic"), ip="172.16.1.5") == "No accessKey is configured"
    # An account's whiteRemoteAddress skips its signature check, from that address only.
    assert outcome(rules, request("sendV2 Other", "white01", "wrong-secret"), ip="10.9.9.9") is None
    assert (outcome(rules, request("sendV2 Other", "white01", "wrong-secret"), ip="10.9.9.8")
            == "Check signature failed for accessKey=white01")


def test_unreadable_heartbeat_is_refused_not_waved_through(rules):
    cmd = Credentials("consumer1", "consumer-secret").sign(RemotingCommand.create_request(C.HEART_BEAT, body=b"{"))
    assert outcome(rules, cmd).startswith("cannot read the request to check its permissions")


def test_resources_per_code():
    assert [str(r) for r in required_resources(request("pull Orders/OrderConsumers"))] == \
        ["topic:Orders (SUB)", "group:OrderConsumers (SUB)"]
    assert [str(r) for r in required_resources(request("sendV2 %RETRY%OrderConsumers"))] == \
        ["group:OrderConsumers (SUB)"]
    assert {C.LEDGERMQ_DLEDGER_STATUS, C.LEDGERMQ_TRANSFER_LEADERSHIP, C.LEDGERMQ_CHAIN_CRC,
            C.LEDGERMQ_CHANGE_MEMBERSHIP} <= ADMIN_CODES
    assert [str(r) for r in required_resources(request("lock OrderConsumers"))] == \
        ["group:OrderConsumers (SUB)", "topic:Orders (SUB)"]
    assert [str(r) for r in required_resources(request("view half for Orders"), STORED.get)] == \
        ["topic:RMQ_SYS_TRANS_HALF_TOPIC (SUB)", "topic:Orders (SUB)"]


def test_name_server_policy_guards_route_writes_only(rules):
    reg = RemotingCommand.create_request(C.REGISTER_BROKER, {"brokerName": "b"}, body=b"{}")
    route = RemotingCommand.create_request(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    assert outcome_ns(rules, route) is None  # reads stay open
    assert outcome_ns(rules, reg) == "No accessKey is configured"
    assert outcome_ns(rules, Credentials("producer1", "producer-secret").sign(reg)) == NOT_ADMIN.format(
        code=C.REGISTER_BROKER, ak="producer1")
    assert outcome_ns(rules, Credentials("admin001", "admin-secret").sign(reg)) is None


def outcome_ns(rules, cmd):
    try:
        validate(rules, IP, cmd, NAMESRV_POLICY)
    except AclDenied as e:
        return e.reason
    return None
