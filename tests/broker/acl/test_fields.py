# Honest signing (broker/acl/fields.py): with ACL on, a request may carry
# only its code's fields, each parsing as its type.  What stock clients send
# passes (the C++ client's captured SEND_MESSAGE, its V2 and end-transaction
# forms with to_string bools, ali-ons' fields, 5.x RPC fields); the issue's
# reshaped replays -- bytes moved from the body into a field, an added
# empty field, a/b moved on a code without them -- are refused though their
# signature verifies.  The last test pins what ACL 1.0 still cannot tell
# apart (README "What ACL 1.0 can and cannot promise").
import json
from pathlib import Path

import attrs
import pytest

from broker.acl.fields import BOOL, BROKER, CHANNEL, EMPTY, INT, LONG, NAME, field_problem, value_fits
from broker.acl.plain import parse_plain_acl_text
from broker.acl.signing import Credentials
from broker.acl.table import rule_for
from broker.acl.validator import AclDenied, broker_policy, validate
from broker.remoting.codes import RequestCode as C
from broker.remoting.command import RemotingCommand

GOLDEN = Path(__file__).parents[1] / "compat" / "golden" / "send_message_cpp_1.0.1.json"
RULES = parse_plain_acl_text("""\
accounts:
  - accessKey: producer1
    secretKey: producer-secret
    defaultTopicPerm: PUB
  - accessKey: admin001
    secretKey: admin-secret
    admin: true
""")
PRODUCER = Credentials("producer1", "producer-secret")


def problem(code: int, fields: dict) -> str | None:
    cmd = RemotingCommand.create_request(code, fields)
    return field_problem(code, cmd.ext_fields, rule_for(code).fields, "broker-a")


def test_types():
    assert all(value_fits(INT, v) for v in ("0", "-1", "2147483647", "-2147483648"))
    assert not any(value_fits(INT, v) for v in ("", "+1", "01", "2147483648", "1.0", " 1", "1x", "٣"))
    assert value_fits(LONG, "9223372036854775807") and not value_fits(LONG, "9223372036854775808")
    assert all(value_fits(BOOL, v) for v in ("true", "FALSE", "0", "1"))
    assert not any(value_fits(BOOL, v) for v in ("", "yes", "falsehello", "2"))
    assert all(value_fits(NAME, v) for v in ("", "Orders", "%RETRY%group_1", "broker-a.1", "a|b"))
    assert not any(value_fits(NAME, v) for v in ("a b", "{", "x" * 256, "topic\n"))
    assert value_fits(CHANNEL, "ALIYUN") and not value_fits(CHANNEL, "brokerPermission")
    assert value_fits(BROKER, "broker-a", "broker-a") and not value_fits(BROKER, "broker-b", "broker-a")
    assert value_fits(BROKER, "", "broker-a") and value_fits(BROKER, "any-name")
    assert value_fits(EMPTY, "") and not value_fits(EMPTY, "ns1")


def test_what_stock_clients_send_passes():
    golden = json.loads(GOLDEN.read_text())  # the C++ 1.0.1 client's SEND_MESSAGE, captured
    fields = dict(golden["ext_fields"], properties="TAGS\x01TagA\x02", bornTimestamp="1700000000000", queueId="3")
    assert problem(golden["code"], fields) is None
    # rocketmq-client-cpp 2.x: V2 with to_string bools, and END_TRANSACTION
    assert problem(C.SEND_MESSAGE_V2, {"a": "g", "b": "T", "c": "TBW102", "d": 4, "e": 1, "f": 0, "g": "17",
                                       "h": 0, "i": "", "j": "0", "k": "0", "l": 16, "m": "0",
                                       "AccessKey": "ak", "OnsChannel": "ALIYUN", "Signature": "s"}) is None
    assert problem(C.END_TRANSACTION, {"msgId": "m", "transactionId": "t", "producerGroup": "g",
                                       "tranStateTableOffset": "3", "commitLogOffset": "99",
                                       "commitOrRollback": "8", "fromTransactionCheck": "1"}) is None
    # ali-ons (Node.js): send-back with JSON booleans, pull with a long subVersion
    assert problem(C.CONSUMER_SEND_MSG_BACK, {"offset": 5, "group": "G", "delayLevel": 0, "originMsgId": "x",
                                              "originTopic": "T", "unitMode": False, "maxReconsumeTimes": 16}) is None
    assert problem(C.PULL_MESSAGE, {"consumerGroup": "G", "topic": "T", "queueId": 0, "queueOffset": 0,
                                    "maxMsgNums": 32, "sysFlag": 6, "commitOffset": 0, "suspendTimeoutMillis": 15000,
                                    "subscription": "*", "subVersion": 1700000000000}) is None
    # RocketMQ 5.x remoting clients: the RPC header fields
    assert problem(C.GET_MAX_OFFSET, {"topic": "T", "queueId": 0, "committed": True, "bname": "broker-a",
                                      "lo": False, "oway": False, "nsd": False}) is None


@pytest.mark.parametrize("code, fields, expected", [
    (C.SEND_MESSAGE_V2, {"b": "T", "zz": ""}, "request code=310 has no field 'zz'"),
    (C.SEND_MESSAGE_V2, {"b": "T", "topic": "T"}, "request code=310 has no field 'topic'"),
    (C.SEND_MESSAGE_V2, {"b": "T", "e": "1x"}, "field e='1x' of request code=310 is not a int"),
    (C.SEND_MESSAGE_V2, {"b": "T", "n": "broker-b"}, "field n='broker-b' of request code=310 is not a broker name"),
    (C.SEND_MESSAGE_V2, {"b": "T", "ns": "space"}, "field ns='space' of request code=310 is not a empty"),
    (C.UPDATE_AND_CREATE_TOPIC, {"topic": "T", "a": "1", "b": "2"}, "request code=17 has no field 'a'"),
    (C.VIEW_MESSAGE_BY_ID, {"offset": "12 "}, "field offset='12 ' of request code=33 is not a long"),
    (C.GET_BROKER_RUNTIME_INFO, {"OnsChannel": "brokerPermission"},
     "field OnsChannel='brokerPermission' of request code=28 is not a channel"),
])
def test_fields_a_code_does_not_define_or_values_that_do_not_parse_are_refused(code, fields, expected):
    assert problem(code, fields) == expected


def signed_send(body: bytes = b"PAYLOAD-part2") -> RemotingCommand:
    return PRODUCER.sign(RemotingCommand.create_request(C.SEND_MESSAGE_V2, {
        "a": "pg", "b": "Orders", "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 1, "h": 0, "i": "", "j": 0,
        "k": False, "m": False}, body=body))


def reshaped(cmd: RemotingCommand, body: bytes | None = None, **fields) -> RemotingCommand:
    ext = {k: v for k, v in {**cmd.ext_fields, **fields}.items() if v is not None}
    return attrs.evolve(cmd, ext_fields=ext, body=cmd.body if body is None else body)


def outcome(cmd: RemotingCommand) -> str | None:
    try:
        validate(RULES, "10.0.0.1", cmd, broker_policy("broker-a"))
    except AclDenied as e:
        return e.reason
    return None


def test_the_issues_reshaped_replays_are_refused():
    captured = signed_send()
    assert outcome(captured) is None
    for cmd in (reshaped(captured, body=b"part2", m="falsePAYLOAD-"),  # body into the last field
                reshaped(captured, body=b"part2", n="PAYLOAD-"),  # ... into an added one
                reshaped(captured, body=b"part2", ns="PAYLOAD-"),
                reshaped(captured, body=b"part2", oway="PAYLOAD-"),
                reshaped(captured, zz=""),  # an added empty field
                reshaped(captured, e="", f="00"),  # "0"+"0" as ""+"00"
                reshaped(captured, g="", h="10")):
        assert outcome(cmd) is not None and not outcome(cmd).startswith("Check signature"), cmd.ext_fields
    admin = Credentials("admin001", "admin-secret").sign(
        RemotingCommand.create_request(C.DELETE_TOPIC_IN_BROKER, {"topic": "Orders"}))
    assert outcome(admin) is None
    assert outcome(reshaped(admin, topic=None, a="Ord", b="ers")) == "request code=215 has no field 'a'"


def test_what_acl_1_0_still_cannot_tell_apart():
    """Limits written in the README: each of these verifies."""
    captured = signed_send()
    # A replay, unchanged: nothing in the signature is fresh.
    assert outcome(captured) is None
    # Bytes moved between two adjacent text fields of the same request: the
    # producer group "pg" and topic "Orders" as "p" and "gOrders" (the
    # signer's account must then hold PUB on gOrders: here its default does).
    assert outcome(reshaped(captured, a="p", b="gOrders")) is None
    # An empty text field signs no bytes: the signer's empty properties
    # can be left out (or a defined text field the signer left out added
    # empty).
    assert outcome(reshaped(captured, i=None)) is None
