# The ACL check of scanned sends in C (native/src/acl.c, acl_sha1.c;
# broker/acl/fastpath.py) against its oracle, the general path
# (validator.validate on the decoded command):
#   - SHA-1 and HMAC-SHA1, with the CPU's SHA extensions and portable,
#     against hashlib/hmac at every length around the block boundaries;
#   - for generated sends -- signed by each kind of account, unsigned,
#     signed with the wrong secret, tampered after signing, by an account
#     no longer in the rules (a reload took it away), to topics allowed,
#     denied, retry, carrier and trace, with extra, malformed and escaped
#     fields, from a plain, an account-whitelisted and a globally
#     whitelisted address -- every verdict the fast path gives itself is
#     the general path's: admitted as the same accessKey, or refused with
#     the same text, byte for byte; and the usual sends are decided by the
#     fast path itself, not handed to the general one;
#   - live, on a one-member group served in process: the same pipelined
#     frames answered with the fast path and without it get the same code
#     and remark, each in its place (test_refusals_identical_on_both_paths).
import base64
import hashlib
import hmac
import string

import attrs
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.acl import fastpath
from broker.acl.plain import parse_plain_acl_text
from broker.acl.signing import Credentials
from broker.acl.validator import AclDenied, broker_policy, validate
from broker.remoting.codec import SendRun, encode_command
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from consumequeue import record as M
from native import acl as native_acl
from native import sendpath
from tests.broker.acl.test_native_send_path import burst, solo_broker

pytestmark = pytest.mark.skipif(not (native_acl.AVAILABLE and sendpath.AVAILABLE),
                                reason="the native extension is not built (make native)")

BROKER = "solo"
POLICY = broker_policy(BROKER)
RULES_TEXT = """\
globalWhiteRemoteAddresses: ["172.16.0.*"]
accounts:
  - accessKey: producer1
    secretKey: producer-secret
    topicPerms: [Orders=PUB, Audit=SUB, RMQ_SYS_TRANS_HALF_TOPIC=PUB]
    groupPerms: [G1=SUB, G2=DENY]
  - accessKey: publisher
    secretKey: publisher-secret-that-is-longer-than-one-sha1-block-of-sixty-four-bytes-0123456789
    defaultTopicPerm: PUB
    topicPerms: [Closed=DENY]
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
  - accessKey: prodücer-ü
    secretKey: unicode-secret-ü
    topicPerms: [Orders=PUB]
"""
RULES = parse_plain_acl_text(RULES_TEXT)
SECRETS = {ak: a.secret_key for ak, a in RULES.accounts.items()}
# "A reload took it away": producer1 is gone from these rules.
RULES_WITHOUT_PRODUCER = parse_plain_acl_text(RULES_TEXT.replace("accessKey: producer1", "accessKey: producer9"))
ADDRESSES = ["10.0.0.1", "10.9.9.9", "172.16.0.4"]
TOPICS = ["Orders", "Audit", "Closed", "Other", "%RETRY%G1", "%RETRY%G2", "RMQ_SYS_TRACE_TOPIC",
          "RMQ_SYS_TRANS_HALF_TOPIC", "", "bad topic", "Ordérs"]


# --- SHA-1 and HMAC ---------------------------------------------------------------

@pytest.mark.parametrize("portable", [False, True])
def test_sha1_and_hmac_match_hashlib(portable):
    was = native_acl.portable_sha1(portable)
    try:
        data = bytes(range(256)) * 5
        for n in [*range(0, 140), 183, 184, 191, 192, 1000, 1024, 1279]:
            assert native_acl.sha1(data[:n]) == hashlib.sha1(data[:n]).digest(), n
            for key in (b"", b"k", b"s" * 63, b"s" * 64, b"s" * 65, b"x" * 200):
                assert native_acl.hmac_sha1(key, data[:n]) == hmac.digest(key, data[:n], "sha1"), (n, len(key))
    finally:
        native_acl.portable_sha1(was)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=700), st.binary(max_size=130))
def test_hmac_matches_hmac_module(data, key):
    assert native_acl.hmac_sha1(key, data) == hmac.digest(key, data, "sha1")


# --- generated sends ---------------------------------------------------------------

def base_fields(topic: str, seq: int) -> dict:
    props = M.properties_to_string({"TAGS": "t", "UNIQ_KEY": f"{seq:032X}"})
    return {"a": "pg", "b": topic, "c": "TBW102", "d": "4", "e": str(seq % 4), "f": "0", "g": "1700000000000",
            "h": "0", "i": props, "j": "0", "k": "false", "m": "false"}


EXTRA = st.sampled_from([
    {}, {}, {}, {"OnsChannel": "ALIYUN"}, {"OnsChannel": "aliyun"}, {"zz": "1"}, {"bname": BROKER},
    {"bname": "other"}, {"n": BROKER}, {"n": "elsewhere"}, {"ns": ""}, {"ns": "x"}, {"nsd": "TRUE"},
    {"lo": "1"}, {"oway": "no"}, {"_UNIQUE_KEY_QUERY": "true"}, {"SecurityToken": "tok\u00e9n"}, {"d": "04"},
    {"d": "-0"}, {"e": "2147483648"}, {"g": "9223372036854775807"}, {"g": "9223372036854775808"},
    {"g": "-9223372036854775808"}, {"k": "FALSE"}, {"k": "yes"}, {"m": "1"}, {"a": "p/g"}, {"a": "x" * 256},
    {"i": M.properties_to_string({"TAGS": "täg \"q\" \\ /", "KEYS": "\u2603\U0001F600"})},
])
SIGNERS = st.sampled_from(["right", "right", "right", "wrong", "unsigned", "tampered", "unknown", "empty-key",
                           "sign-then-extra"])


@st.composite
def sends(draw):
    topic = draw(st.sampled_from(TOPICS))
    fields = base_fields(topic, draw(st.integers(0, 1000)))
    extra = draw(EXTRA)
    signer = draw(SIGNERS)
    if signer != "sign-then-extra":
        fields.update(extra)
    body = draw(st.sampled_from([b"", b"m", b"x" * 55, b"y" * 64, b"z" * 1024, "ü".encode() * 70]))
    cmd = RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, fields, body=body)
    ak = draw(st.sampled_from(sorted(SECRETS)))
    if signer in ("right", "tampered", "sign-then-extra"):
        cmd = Credentials(ak, SECRETS[ak]).sign(cmd)
    elif signer == "wrong":
        cmd = Credentials(ak, SECRETS[ak] + "x").sign(cmd)
    elif signer == "unknown":
        cmd = Credentials("nobody-here", "whatever-secret").sign(cmd)
    elif signer == "empty-key":
        cmd = attrs.evolve(cmd, ext_fields={**cmd.ext_fields, "AccessKey": ""})
    if signer == "tampered":
        cmd = attrs.evolve(cmd, body=cmd.body + b"!")
    if signer == "sign-then-extra":
        cmd = attrs.evolve(cmd, ext_fields={**cmd.ext_fields, **extra})
    return cmd


def scanned(cmds: list[RemotingCommand]):
    frames = bytearray(b"".join(encode_command(c.as_request(i + 1)) for i, c in enumerate(cmds)))
    scan = sendpath.scan_requests(frames, 0, 1 << 26)
    assert scan is not None and scan.n == len(cmds)
    return scan


def general(rules, address: str, cmd) -> tuple[str, str | None]:
    try:
        return "admitted", validate(rules, address, cmd, POLICY)
    except AclDenied as e:
        return "refused", e.remark


def fast(checks: fastpath.ScanChecks, i: int) -> tuple[str, str | None] | None:
    v = checks.verdict[i]
    if v == fastpath.GENERAL:
        return None
    if v == fastpath.OK:
        return "admitted", None
    return "refused", checks.refusal(i).remark


def compare(rules, address: str, cmds: list[RemotingCommand]) -> list:
    """The fast verdicts of the sends the scanner took, each checked
    against the general path; returns them (None: handed to the general
    path)."""
    scan = scanned(cmds)
    checks = fastpath.SendChecks(POLICY).check_scan(rules, address, scan, 0)
    run = SendRun(scan, 0, scan.n)
    out = []
    for i in range(scan.n):
        if scan.reqs[i].status != sendpath.SEND_OK:
            # (never asked: only the scanner's plain sends are RawSends)
            assert checks.checked is None or checks.verdict[i] == fastpath.GENERAL
            out.append(None)
            continue
        got, want = fast(checks, i), general(rules, address, run.send(i))
        if got is not None:
            if want[0] == "admitted":
                assert got[0] == "admitted", (want, got, cmds[i])
                # admitted as the same account (the connection's principals)
                assert (want[1] is None and not checks.principals) or want[1] in checks.principals
            else:
                assert got == want, cmds[i]
        out.append(got)
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(sends(), min_size=1, max_size=12), st.sampled_from(ADDRESSES),
       st.sampled_from([RULES, RULES_WITHOUT_PRODUCER]))
def test_fast_verdicts_are_the_general_paths(cmds, address, rules):
    compare(rules, address, cmds)


def signed(ak: str, topic: str, seq: int = 0, **extra) -> RemotingCommand:
    fields = base_fields(topic, seq) | extra
    return Credentials(ak, SECRETS[ak]).sign(
        RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, fields, body=b"x" * 300))


def test_the_usual_sends_and_refusals_are_decided_in_c():
    """The fast path is not a pass-through: it decides these itself."""
    unsigned = RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, base_fields("Orders", 1), body=b"b")
    cmds = [signed("producer1", "Orders"), signed("publisher", "Anything"), signed("admin001", "Orders"),
            signed("prodücer-ü", "Orders"), signed("producer1", "RMQ_SYS_TRACE_TOPIC"),
            signed("producer1", "%RETRY%G1", OnsChannel="CPP"), unsigned,
            Credentials("nobody-here", "some-secret").sign(unsigned),
            Credentials("producer1", "not-the-secret").sign(unsigned),
            attrs.evolve(signed("producer1", "Orders"), body=b"changed"),
            signed("producer1", "Other"), signed("publisher", "Closed"), signed("producer1", "%RETRY%G2"),
            signed("producer1", "Orders", zz="1"), signed("producer1", "Orders", d="04")]
    got = compare(RULES, "10.0.0.1", cmds)
    denied = "org.apache.rocketmq.acl.common.AclException: "
    assert got == [("admitted", None)] * 6 + [
        ("refused", denied + "No accessKey is configured"),
        ("refused", denied + "No acl config for nobody-here"),
        ("refused", denied + "Check signature failed for accessKey=producer1"),
        ("refused", denied + "Check signature failed for accessKey=producer1"),
        ("refused", denied + "No default permission for topic:Other"),
        ("refused", denied + "No default permission for topic:Closed"),
        ("refused", denied + "No default permission for group:G2"),
        None, None]  # a field the code does not define, a value not of its type: worded by the general path
    # The account whitelisted for its address: admitted without a signature;
    # a globally whitelisted address: everything, as nobody.
    assert compare(RULES, "10.9.9.9", [attrs.evolve(signed("white01", "Other"), body=b"changed")]) \
        == [("admitted", None)]
    assert compare(RULES, "172.16.0.4", [unsigned]) == [("admitted", None)]
    # After a reload that took the account away: unknown.
    assert compare(RULES_WITHOUT_PRODUCER, "10.0.0.1", [signed("producer1", "Orders")]) \
        == [("refused", denied + "No acl config for producer1")]


def test_signature_is_base64_hmac_of_sorted_values_then_body():
    """The README's vector, through the C check: fields a=1, b=2 would not
    be a send, so the same rule on a send's own fields."""
    cmd = signed("producer1", "Orders")
    content = "".join(v for k, v in sorted(cmd.ext_fields.items()) if k != "Signature").encode() + cmd.body
    assert cmd.ext_fields["Signature"] == base64.b64encode(hmac.digest(b"producer-secret", content, "sha1")).decode()
    assert compare(RULES, "10.0.0.1", [cmd]) == [("admitted", None)]
    # one character of the signature changed, or its padding dropped: refused
    good = cmd.ext_fields["Signature"]
    for sig in (("B" if good[0] == "A" else "A") + good[1:], good[:-1], good + "=", ""):
        bad = attrs.evolve(cmd, ext_fields={**cmd.ext_fields, "Signature": sig})
        assert compare(RULES, "10.0.0.1", [bad])[0][0] == "refused"


def test_hostile_headers_go_to_the_general_path_or_are_refused():
    """Escaped names, fields twice, huge access keys: never admitted by the
    fast path unless the general path admits them (compare() checks), and
    nothing is read past the frame."""
    cmd = signed("producer1", "Orders")
    frame = encode_command(cmd.as_request(1))
    variants = [
        frame.replace(b'"AccessKey"', b'"\\u0041ccessKey"'),
        frame.replace(b'"a":"pg"', b'"a":"pg","a":"pg"'),
        frame.replace(b'"AccessKey":"producer1"', b'"AccessKey":"' + b"k" * 5000 + b'"'),
        frame.replace(b'"AccessKey":"producer1"', b'"AccessKey":"produc\\u0065r1"'),
    ]
    for v in variants:
        # the length fields of the frame follow the edit
        header_len = int.from_bytes(v[4:8], "big") + len(v) - len(frame)
        v = (len(v) - 4).to_bytes(4, "big") + header_len.to_bytes(4, "big") + v[8:]
        scan = sendpath.scan_requests(bytearray(v), 0, 1 << 26)
        if scan is None or scan.reqs[0].status != sendpath.SEND_OK:
            continue
        checks = fastpath.SendChecks(POLICY).check_scan(RULES, "10.0.0.1", scan, 0)
        want = general(RULES, "10.0.0.1", SendRun(scan, 0, 1).send(0))
        got = fast(checks, 0)
        assert got is None or got == want or (got[0] == want[0] == "admitted")


class FakeConn:
    def __init__(self, address: str) -> None:
        self.remote_address, self.attributes = address, {}


async def test_check_run_says_what_check_says_of_each_send():
    """AclService.check_run (a run at a time) and check (a send at a time)
    agree, with the fast path and without it, principals included."""
    from broker.acl.service import PRINCIPALS, AclService

    unsigned = RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, base_fields("Orders", 1), body=b"b")
    cmds = [signed("producer1", "Orders", seq=i) for i in range(5)] + [
        unsigned, signed("producer1", "Other"), signed("producer1", "Orders", zz="1"),
        Credentials("producer1", "not-the-secret").sign(unsigned), signed("publisher", "Anything")]
    run = SendRun(scanned(cmds), 0, len(cmds))
    for fast_path in (True, False):
        one, whole = AclService(None, RULES, POLICY), AclService(None, RULES, POLICY)
        if not fast_path:
            one.sends = whole.sends = None
        c1, c2 = FakeConn("10.0.0.1:4000"), FakeConn("10.0.0.1:4001")
        each = [(i, one.check(c1, run.send(i))) for i in range(run.lo, run.hi)]
        each = [(i, a.code, a.remark) for i, a in each if a is not None]
        assert [(i, a.code, a.remark) for i, a in whole.check_run(c2, run)] == each
        assert [i for i, _, _ in each] == [5, 6, 7, 8]
        assert c1.attributes[PRINCIPALS] == c2.attributes[PRINCIPALS] == {"producer1", "publisher"}
        assert one.refused == whole.refused == 4
        # a run of admitted sends only: nothing asked one by one
        assert whole.check_run(c2, SendRun(run.scan, 0, 5)) == []


async def test_a_send_before_the_checked_ones_is_not_taken_as_admitted():
    """The verdicts of a scan start at the send that asked first; one
    before it asked later goes to the general path (and is refused here)."""
    from broker.acl.service import AclService

    unsigned = RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, base_fields("Orders", 1), body=b"b")
    run = SendRun(scanned([unsigned, signed("producer1", "Orders"), signed("producer1", "Orders", seq=2)]), 0, 3)
    svc, conn = AclService(None, RULES, POLICY), FakeConn("10.0.0.1:4000")
    assert svc.check(conn, run.send(1)) is None
    refusal = svc.check(conn, run.send(0))
    assert refusal is not None and refusal.remark.endswith("No accessKey is configured")
    assert svc.check(conn, run.send(2)) is None
    assert svc.sends.scans == 1


# --- live: the same frames with and without the fast path -------------------------------

PLAIN_ACL = """\
accounts:
  - accessKey: producer1
    secretKey: producer-secret
    topicPerms: [ServerTopic=PUB, Audit=SUB]
"""


async def test_refusals_identical_on_both_paths(tmp_path, nursery):
    from tests.broker.acl.test_native_send_path import broker_config
    from tests.broker.test_server import send_request

    cfg = broker_config(tmp_path, acl=True)
    (tmp_path / "plain_acl.yml").write_text(PLAIN_ACL)
    broker, seen = await solo_broker(nursery, cfg)
    port = broker.server.port
    right = Credentials("producer1", "producer-secret")
    frames = []
    for i in range(24):
        cmd = send_request(i, queue_id=i % 4)
        kind = i % 8
        if kind in (0, 3):
            cmd = right.sign(cmd)
        elif kind == 1:
            pass  # unsigned
        elif kind == 2:
            cmd = Credentials("producer1", "wrong-secret").sign(cmd)
        elif kind == 4:
            cmd = Credentials("stranger1", "stranger-secret").sign(cmd)
        elif kind == 5:
            cmd = right.sign(attrs.evolve(cmd, ext_fields={**cmd.ext_fields, "b": "Audit"}))
        elif kind == 6:
            cmd = attrs.evolve(right.sign(cmd), body=b"tampered")
        else:
            cmd = right.sign(attrs.evolve(cmd, ext_fields={**cmd.ext_fields, "zz": "1"}))
        frames.append(cmd.as_request(i + 1))
    # Warm up the topic (created by the first send), then the fast path.
    await burst(port, [right.sign(send_request(100)).as_request(1)])
    before = broker.acl.sends.scans
    fast_answers = await burst(port, frames)
    assert broker.acl.sends.scans > before  # the C check judged them
    checks, broker.acl.sends = broker.acl.sends, None  # now every send takes validate()
    try:
        general_answers = await burst(port, frames)
    finally:
        broker.acl.sends = checks
    assert SendRun in seen
    got = [(a.opaque, a.code, a.remark if a.code != ResponseCode.SUCCESS else None) for a in fast_answers]
    want = [(a.opaque, a.code, a.remark if a.code != ResponseCode.SUCCESS else None) for a in general_answers]
    assert got == want
    codes = [code for _, code, _ in got]
    assert codes.count(ResponseCode.SUCCESS) == 6 and codes.count(ResponseCode.SYSTEM_ERROR) == 18
    remarks = {r for _, _, r in got if r}
    assert any("No default permission for topic:Audit" in r for r in remarks)
    assert any("No acl config for stranger1" in r for r in remarks)
    assert any("has no field 'zz'" in r for r in remarks)
