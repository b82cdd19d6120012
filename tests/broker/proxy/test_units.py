# mqproxy's pure parts: the authorization header and its check against
# plain ACL rules, receipts, recall handles, the SendMessage checks and
# proxy.conf; no sockets.
import hashlib
import hmac

import pytest

from broker.acl.plain import parse_plain_acl_text
from broker.proxy import auth, pb
from broker.proxy.config import ProxyConfig
from broker.proxy.consume import parse_receipt
from broker.proxy.convert import RequestInvalid, outgoing, recall_broker, recall_handle, to_grpc_message
from commitlog.config import ConfigError
from consumequeue import record as M

RULES = parse_plain_acl_text("""\
globalWhiteRemoteAddresses: ["10.9.*.*"]
accounts:
  - accessKey: writer01
    secretKey: writer-secret
    topicPerms: [Orders=PUB]
  - accessKey: trusted1
    secretKey: trusted-secret
    whiteRemoteAddress: 192.168.7.*
    defaultTopicPerm: SUB
""")
DATE = "20260102T030405Z"


def md(ak, sk, date=DATE, sig=None):
    sig = sig if sig is not None else hmac.new(sk.encode(), date.encode(), hashlib.sha1).hexdigest()
    return {"x-mq-date-time": date,
            "authorization": f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, Signature={sig}"}


def test_the_header_is_parsed_as_rocketmq_does():
    a = auth.parse_authorization("MQv2-HMAC-SHA1 Credential=ak1234/2026/region, SignedHeaders=x-mq-date-time, "
                                 "Signature=0A0b")
    assert a.access_key == "ak1234" and a.signature == b"\x0a\x0b"
    assert auth.parse_authorization("MQv2-HMAC-SHA1 Credential=, SignedHeaders=x, Signature=") is None
    assert auth.parse_authorization(None) is None
    for bad in ("Basic abc", "MQv2-HMAC-SHA1 Credential=ak, Signature=xyz", "MQv2-HMAC-SHA1 " + "a" * 2000):
        with pytest.raises(auth.AuthError):
            auth.parse_authorization(bad)


def test_authorize():
    pub = auth.publish_resources("Orders")
    assert auth.authorize(RULES, "127.0.0.1", md("writer01", "writer-secret"), pub) == "writer01"
    upper = md("writer01", "writer-secret", sig=auth.sign("writer-secret", DATE).upper())
    assert auth.authorize(RULES, "127.0.0.1", upper, pub) == "writer01"
    with pytest.raises(auth.AuthError) as e:
        auth.authorize(RULES, "127.0.0.1", md("writer01", "wrong"), pub)
    assert e.value.unauthorized
    with pytest.raises(auth.AuthError) as e:  # signed over another date
        auth.authorize(RULES, "127.0.0.1", {**md("writer01", "writer-secret"), "x-mq-date-time": "x"}, pub)
    assert e.value.unauthorized
    with pytest.raises(auth.AuthError) as e:
        auth.authorize(RULES, "127.0.0.1", md("writer01", "writer-secret"), auth.consume_resources("Orders", "G"))
    assert not e.value.unauthorized  # authenticated, not allowed: FORBIDDEN
    with pytest.raises(auth.AuthError):
        auth.authorize(RULES, "127.0.0.1", {}, pub)  # anonymous
    assert auth.authorize(RULES, "10.9.1.2", {}, pub) is None  # globally whitelisted
    # whitelisted account address: no signature needed, permissions still apply
    assert auth.authorize(RULES, "192.168.7.5", md("trusted1", "", sig="00"), auth.route_resources("X")) == "trusted1"
    with pytest.raises(auth.AuthError):
        auth.authorize(RULES, "192.168.7.5", md("trusted1", "", sig="00"), auth.publish_resources("X"))


def test_receipts():
    now = 1_700_000_000_000
    r = parse_receipt(f"5 {now} 30000 2 0 broker-a 3 7 4096", now_ms=now + 1)
    assert (r.ck_offset, r.broker_name, r.queue_id, r.queue_offset, r.commitlog_offset) == (5, "broker-a", 3, 7, 4096)
    assert r.text == f"5 {now} 30000 2 0 broker-a 3 7" and r.handle().endswith(" 4096")
    for bad in ("", "1 2 3", f"5 {now} 30000 2 7 b 3 7", f"x {now} 30000 2 0 b 3 7", f"5 {now} 30000 2 0 b 3 -7",
                f"5 {now} 30000 2 0 b 3 7 1 2", "9" * 2000):
        with pytest.raises(RequestInvalid) as e:
            parse_receipt(bad, now_ms=now)
        assert e.value.code == pb.Code.INVALID_RECEIPT_HANDLE and "invalid" in str(e.value)
    with pytest.raises(RequestInvalid) as e:
        parse_receipt(f"5 {now} 30000 2 0 b 3 7", now_ms=now + 30000)
    assert "expired" in str(e.value)


def test_recall_handles():
    h = recall_handle("T", "broker-a", 1_700_000_000_000, "01ABC")
    assert recall_broker(h) == "broker-a"
    for bad in ("", "!!!", "djEgVA", "a" * 2000):
        with pytest.raises(RequestInvalid):
            recall_broker(bad)


def test_outgoing_and_back():
    m = pb.definition.Message(body=b"x" * 10)
    m.topic.name = "T"
    sp = m.system_properties
    sp.message_id, sp.message_type, sp.message_group, sp.tag = "01ID", pb.MessageType.FIFO, "g", "TagA"
    sp.keys.extend(["k1", "k2"])
    m.user_properties["color"] = "red"
    o = outgoing(m, 1024)
    assert o.extra_properties == {"__SHARDINGKEY": "g"} and o.keys == ("k1", "k2") and o.message_group == "g"
    rec = M.MessageRecord("T", b"x" * 10, {"UNIQ_KEY": "01ID", "TAGS": "TagA", "KEYS": "k1 k2", "__SHARDINGKEY": "g",
                                           "color": "red"}, reconsume_times=2)
    back = to_grpc_message(rec)
    assert back.system_properties.message_group == "g" and back.system_properties.message_type == pb.MessageType.FIFO
    assert list(back.system_properties.keys) == ["k1", "k2"] and dict(back.user_properties) == {"color": "red"}
    assert back.system_properties.delivery_attempt == 3
    assert back.system_properties.body_digest.checksum == hashlib.md5(b"x" * 10).hexdigest().upper()


def test_proxy_conf():
    cfg = ProxyConfig.from_properties("namesrvAddr=127.0.0.1:9876;127.0.0.1:9877\nmaxMessageBodySize=1024\n")
    assert cfg.namesrv_addr == ("127.0.0.1:9876", "127.0.0.1:9877") and cfg.grpc_port == 8081
    assert cfg.max_body_size == 1024 and cfg.max_inbound_message_size == 1024 + 1024 * 1024
    for text, key in (("grpcServerPort=1", "namesrvAddr"), ("namesrvAddr=a:1\ngrpcServerPort=70000", "grpcServerPort"),
                      ("namesrvAddr=a:1\nmaxHeldReceives=0", "maxHeldReceives"),
                      ("namesrvAddr=a:1\nnoSuchKey=1", "noSuchKey"),
                      ("namesrvAddr=a:1\ninnerAccessKey=abcdefg", "innerAccessKey"),
                      ("namesrvAddr=a:1\nproxyMode=local", "proxyMode"),
                      ("namesrvAddr=a:1\ntls.server.mode=permissive", "tls.server.mode"),
                      ("namesrvAddr=a:1\ntls.server.mode=enforcing", "tls.server.certPath")):
        with pytest.raises(ConfigError) as e:
            ProxyConfig.from_properties(text)
        assert e.value.key == key, text


def test_the_acl_file_is_read_again_when_it_changes(tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text("accounts:\n  - accessKey: first001\n    secretKey: first-secret\n")
    now = [0.0]
    f = auth.AclFile(str(path), clock=lambda: now[0])
    assert set(f.current().accounts) == {"first001"}
    path.write_text("accounts:\n  - accessKey: second01\n    secretKey: second-secret\n")
    assert set(f.current().accounts) == {"first001"}  # looked at most once a second
    now[0] = 2.0
    assert set(f.current().accounts) == {"second01"}
    path.write_text("accounts: [ {accessKey: x")  # broken: the rules in force stay
    now[0] = 4.0
    assert set(f.current().accounts) == {"second01"}
