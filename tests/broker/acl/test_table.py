# Every request code has an ACL rule (broker/acl/table.py), held against
# every code there is: RocketMQ's (broker/remoting/codes.py), every code the
# broker's processors and the name server register (as tools/codes_table.py
# enumerates them), and codes nobody knows.  Then each code the broker
# serves is tried: an admin code refuses a non-admin account, a resource
# code names exactly the topics and groups listed here (an account without
# them is refused, one with them is not), a signature-only code lets any
# valid account through.  A served code without a sample here fails, so a
# new code cannot arrive without its rule being tested.
import json

import pytest

from broker.acl import table
from broker.acl.fields import field_problem
from broker.acl.plain import parse_plain_acl_text
from broker.acl.signing import Credentials
from broker.acl.table import NS_ADMIN, NS_OPEN, RULES, Kind, StoredMessage, rule_for
from broker.acl.validator import AclDenied, broker_policy, required_resources, validate
from broker.remoting.codes import RequestCode as C
from broker.remoting.command import RemotingCommand
from tools import codes_table

UNKNOWN_CODES = (0, 1, 16, 9104, 9999, 3442, 200052, 2**31 - 1)


@pytest.fixture(scope="module")
def served():
    return codes_table.broker_codes(), codes_table.namesrv_codes()


def test_every_code_of_codes_py_has_its_own_rule():
    assert set(C) <= set(RULES), sorted(set(C) - set(RULES))
    assert set(RULES) <= set(C)  # and no rule for a code without a name
    for code, rule in RULES.items():
        assert rule.needs, code
        assert (rule.kind is Kind.RESOURCES) == (rule.resources is not None), code


def test_every_served_code_has_a_rule_and_a_header_schema(served):
    broker, namesrv = served
    for code in broker:
        rule = RULES.get(code)
        assert rule is not None, f"the broker serves {code} without an ACL rule"
        assert not rule.not_served, f"{code} is served, but its rule says it is not"
        assert rule.fields is not None, f"{code} is served without a header schema"
    for code in set(RULES) - broker:
        if RULES[code].kind is not Kind.ADMIN:
            assert RULES[code].not_served, f"{code} is not served but its rule is {RULES[code]}"
    for code in namesrv:
        assert RULES[code].namesrv in (NS_ADMIN, NS_OPEN), f"the name server serves {code} without a rule"
    for code, rule in RULES.items():
        if rule.namesrv == NS_ADMIN:
            assert rule.fields is not None, code  # route writes: their header is checked
    assert {C.LEDGERMQ_DLEDGER_STATUS, C.LEDGERMQ_TRANSFER_LEADERSHIP, C.LEDGERMQ_CHAIN_CRC,
            C.LEDGERMQ_CHANGE_MEMBERSHIP} <= table.ADMIN_CODES
    assert C.GET_BROKER_RUNTIME_INFO in table.ADMIN_CODES


@pytest.mark.parametrize("code", UNKNOWN_CODES)
def test_an_unknown_code_needs_a_signature_and_nothing_serves_it(code, served):
    assert code not in served[0] and code not in served[1]
    assert rule_for(code) is table.UNKNOWN and table.UNKNOWN.not_served and table.UNKNOWN.fields is None


RULES_YML = """\
accounts:
  - accessKey: nobody01
    secretKey: nobody-secret
  - accessKey: holder01
    secretKey: holder-secret
    topicPerms: [T=PUB|SUB, Real=PUB|SUB]
    groupPerms: [G=SUB]
  - accessKey: admin001
    secretKey: admin-secret
    admin: true
"""
SECRETS = {"nobody01": "nobody-secret", "holder01": "holder-secret", "admin001": "admin-secret"}
STORED = {100: StoredMessage("T"), 200: StoredMessage("RMQ_SYS_TRANS_HALF_TOPIC", "Real")}
MQS = [{"topic": "T", "brokerName": "b", "queueId": 0}, {"topic": "%RETRY%G", "brokerName": "b", "queueId": 0}]
HALF = "RMQ_SYS_TRANS_HALF_TOPIC"

# code -> (fields, body, what it needs: "admin", "signature", or the resources)
SAMPLES = {
    C.SEND_MESSAGE: ({"producerGroup": "P", "topic": "T", "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
                      "queueId": 0, "sysFlag": 0, "bornTimestamp": 1, "flag": 0, "properties": "",
                      "reconsumeTimes": 0, "unitMode": "0", "batch": "0"}, b"x", ["topic:T (PUB)"]),
    C.SEND_MESSAGE_V2: ({"a": "P", "b": "T", "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 1, "h": 0, "i": "",
                         "j": 0, "k": False, "m": False, "n": "b"}, b"x", ["topic:T (PUB)"]),
    C.SEND_BATCH_MESSAGE: ({"a": "P", "b": "%RETRY%G", "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 1, "h": 0,
                            "m": True}, b"x", ["group:G (SUB)"]),
    C.PULL_MESSAGE: ({"consumerGroup": "G", "topic": "T", "queueId": 0, "queueOffset": 0, "maxMsgNums": 32,
                      "sysFlag": 2, "commitOffset": 0, "suspendTimeoutMillis": 15000, "subscription": "*",
                      "subVersion": 0, "expressionType": "TAG"}, b"", ["topic:T (SUB)", "group:G (SUB)"]),
    C.QUERY_MESSAGE: ({"topic": "T", "key": "k", "maxNum": 32, "beginTimestamp": 0, "endTimestamp": 1,
                       "_UNIQUE_KEY_QUERY": "true"}, b"", ["topic:T (SUB)"]),
    C.QUERY_CONSUMER_OFFSET: ({"consumerGroup": "G", "topic": "T", "queueId": 0, "setZeroIfNotFound": False}, b"",
                              ["group:G (SUB)", "topic:T (SUB)"]),
    C.UPDATE_CONSUMER_OFFSET: ({"consumerGroup": "G", "topic": "T", "queueId": 0, "commitOffset": 5}, b"",
                               ["group:G (SUB)", "topic:T (SUB)"]),
    C.UPDATE_AND_CREATE_TOPIC: ({"topic": "T", "defaultTopic": "TBW102", "readQueueNums": 4, "writeQueueNums": 4,
                                 "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False},
                                b"", "admin"),
    C.GET_ALL_TOPIC_CONFIG: ({}, b"", "admin"),
    C.UPDATE_BROKER_CONFIG: ({}, b"brokerPermission=6\n", "admin"),
    C.GET_BROKER_CONFIG: ({}, b"", "admin"),
    C.GET_BROKER_RUNTIME_INFO: ({}, b"", "admin"),
    C.SEARCH_OFFSET_BY_TIMESTAMP: ({"topic": "T", "queueId": 0, "timestamp": 1, "boundaryType": "LOWER"}, b"",
                                   ["topic:T (SUB)"]),
    C.GET_MAX_OFFSET: ({"topic": "T", "queueId": 0}, b"", ["topic:T (SUB)"]),
    C.GET_MIN_OFFSET: ({"topic": "T", "queueId": 0, "bname": "b"}, b"", ["topic:T (SUB)"]),
    C.GET_EARLIEST_MSG_STORETIME: ({"topic": "T", "queueId": 0}, b"", ["topic:T (SUB)"]),
    C.VIEW_MESSAGE_BY_ID: ({"offset": 100}, b"", ["topic:T (SUB)"]),
    C.HEART_BEAT: ({}, json.dumps({"clientID": "c", "producerDataSet": [{"groupName": "P"}], "consumerDataSet": [
        {"groupName": "G", "subscriptionDataSet": [{"topic": "T"}, {"topic": "%RETRY%G"}]}]}).encode(),
        ["group:G (SUB)", "topic:T (SUB)", "group:G (SUB)", "group:P (ANY)"]),
    C.UNREGISTER_CLIENT: ({"clientID": "c", "producerGroup": "", "consumerGroup": "G"}, b"", ["group:G (SUB)"]),
    C.CONSUMER_SEND_MSG_BACK: ({"offset": 100, "group": "G", "delayLevel": 0, "originMsgId": "", "originTopic": "T",
                                "unitMode": "0", "maxReconsumeTimes": 16}, b"", ["group:G (SUB)", "topic:T (SUB)"]),
    C.END_TRANSACTION: ({"producerGroup": "P", "tranStateTableOffset": 0, "commitLogOffset": 200,
                         "commitOrRollback": 8, "fromTransactionCheck": "1", "msgId": "m", "transactionId": "m"},
                        b"", ["group:P (ANY)", "topic:Real (PUB)"]),
    C.GET_CONSUMER_LIST_BY_GROUP: ({"consumerGroup": "G"}, b"", ["group:G (SUB)"]),
    C.POP_MESSAGE: ({"consumerGroup": "G", "topic": "T", "queueId": -1, "maxMsgNums": 32, "invisibleTime": 60000,
                     "pollTime": 15000, "bornTime": 1, "initMode": 0, "expType": "TAG", "exp": "*", "order": False,
                     "attemptId": "a"}, b"", ["topic:T (SUB)", "group:G (SUB)"]),
    C.ACK_MESSAGE: ({"consumerGroup": "G", "topic": "T", "queueId": 0, "extraInfo": "0 1 60000 0 0 b 0 0",
                     "offset": 0}, b"", ["topic:T (SUB)", "group:G (SUB)"]),
    C.CHANGE_MESSAGE_INVISIBLETIME: ({"consumerGroup": "G", "topic": "T", "queueId": 0,
                                      "extraInfo": "0 1 60000 0 0 b 0 0", "offset": 0, "invisibleTime": 5000}, b"",
                                     ["topic:T (SUB)", "group:G (SUB)"]),
    C.BATCH_ACK_MESSAGE: ({}, json.dumps({"brokerName": "b", "acks": [
        {"c": "G", "t": "T", "r": "0", "so": 0, "q": 0, "rq": 0, "pt": 1, "it": 60000, "b": "Aw=="}]}).encode(),
        ["topic:T (SUB)", "group:G (SUB)"]),
    C.RECALL_MESSAGE: ({"producerGroup": "P", "topic": "T", "recallHandle": "djEgVCBiIDEgbQ==", "brokerName": "b"},
                       b"", ["topic:T (PUB)", "group:P (ANY)"]),
    C.LOCK_BATCH_MQ: ({}, json.dumps({"consumerGroup": "G", "clientId": "c", "mqSet": MQS}).encode(),
                      ["group:G (SUB)", "topic:T (SUB)", "group:G (SUB)"]),
    C.UNLOCK_BATCH_MQ: ({}, json.dumps({"consumerGroup": "G", "clientId": "c", "mqSet": MQS}).encode(),
                        ["group:G (SUB)", "topic:T (SUB)", "group:G (SUB)"]),
    C.CHECK_CLIENT_CONFIG: ({}, b'{"clientId":"c","group":"X","subscriptionData":{"topic":"Y"}}', "signature"),
    C.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: ({}, b'{"groupName":"G"}', "admin"),
    C.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: ({}, b"", "admin"),
    C.GET_TOPIC_STATS_INFO: ({"topic": "T"}, b"", ["topic:T (SUB)"]),
    C.GET_CONSUMER_CONNECTION_LIST: ({"consumerGroup": "G"}, b"", ["group:G (SUB)"]),
    C.GET_PRODUCER_CONNECTION_LIST: ({"producerGroup": "P"}, b"", "admin"),
    C.GET_ALL_PRODUCER_INFO: ({}, b"", "admin"),
    C.DELETE_SUBSCRIPTIONGROUP: ({"groupName": "G", "removeOffset": True, "cleanOffset": True}, b"", "admin"),
    C.GET_CONSUME_STATS: ({"consumerGroup": "G", "topic": "T"}, b"", ["group:G (SUB)", "topic:T (SUB)"]),
    C.DELETE_TOPIC_IN_BROKER: ({"topic": "T"}, b"", "admin"),
    C.INVOKE_BROKER_TO_RESET_OFFSET: ({"topic": "T", "group": "G", "timestamp": 0, "isForce": True}, b"", "admin"),
    C.QUERY_TOPIC_CONSUME_BY_WHO: ({"topic": "T"}, b"", ["topic:T (SUB)"]),
    C.GET_CONSUMER_RUNNING_INFO: ({"consumerGroup": "G", "clientId": "c", "jstackEnable": False}, b"", "admin"),
    C.VIEW_BROKER_STATS_DATA: ({"statsName": "TOPIC_PUT_NUMS", "statsKey": "T"}, b"", "admin"),
    C.LEDGERMQ_DLEDGER_STATUS: ({}, b"", "admin"),
    C.LEDGERMQ_TRANSFER_LEADERSHIP: ({"targetId": "n1"}, b"", "admin"),
    C.LEDGERMQ_CHAIN_CRC: ({"index": 5}, b"", "admin"),
    C.LEDGERMQ_CHANGE_MEMBERSHIP: ({"change": "addLearner", "peerId": "n3", "peerAddr": "127.0.0.1:40911",
                                    "timeoutMillis": 30000}, b"", "admin"),
}


@pytest.fixture(scope="module")
def rules():
    return parse_plain_acl_text(RULES_YML)


def outcome(rules, ak: str, code: int, fields: dict, body: bytes) -> str | None:
    cmd = Credentials(ak, SECRETS[ak]).sign(RemotingCommand.create_request(code, fields, body=body))
    try:
        validate(rules, "10.0.0.1", cmd, broker_policy("b"), STORED.get)
    except AclDenied as e:
        return e.reason
    return None


def test_every_served_code_has_a_sample(served):
    assert served[0] <= set(SAMPLES), sorted(served[0] - set(SAMPLES))


@pytest.mark.parametrize("code", sorted(SAMPLES), ids=[C(c).name for c in sorted(SAMPLES)])
def test_the_rule_of_each_served_code(rules, code):
    fields, body, expected = SAMPLES[code]
    cmd = RemotingCommand.create_request(code, fields, body=body)
    rule = rule_for(code)
    assert field_problem(code, cmd.ext_fields, rule.fields, "b") is None  # the sample is a well-formed request
    assert outcome(rules, "admin001", code, fields, body) is None
    if expected == "admin":
        assert rule.kind is Kind.ADMIN
        reason = f"Need admin permission for request code={code}, but accessKey=holder01 is not"
        assert outcome(rules, "holder01", code, fields, body) == reason
    elif expected == "signature":
        assert rule.kind is Kind.SIGNATURE
        assert outcome(rules, "nobody01", code, fields, body) is None
    else:
        assert rule.kind is Kind.RESOURCES
        assert [str(r) for r in required_resources(cmd, STORED.get)] == expected
        assert outcome(rules, "holder01", code, fields, body) is None
        assert outcome(rules, "nobody01", code, fields, body).startswith("No default permission for ")


def test_a_request_naming_an_offset_is_refused_without_a_store(rules):
    fields, body, _ = SAMPLES[C.VIEW_MESSAGE_BY_ID]
    cmd = Credentials("holder01", "holder-secret").sign(RemotingCommand.create_request(C.VIEW_MESSAGE_BY_ID, fields))
    with pytest.raises(AclDenied, match="the message at offset 100 cannot be looked up here"):
        validate(rules, "10.0.0.1", cmd, broker_policy("b"), None)
