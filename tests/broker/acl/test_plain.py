# plain_acl.yml (broker/acl/plain.py): what a good file becomes, every
# malformed file refused with a message naming the place, and the address
# patterns of the whitelists.
import pytest

from broker.acl.plain import (
    DENY,
    PUB,
    SUB,
    AclConfigError,
    check_permission,
    parse_address_pattern,
    parse_plain_acl_text,
)

STOCK = """\
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.*

accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
    groupPerms:
      # the group should convert to retry topic
      - groupA=DENY
      - groupB=PUB|SUB
      - groupC=SUB

  - accessKey: rocketmq2
    secretKey: 12345678
    whiteRemoteAddress: 192.168.1.*
    # if it is admin, it could access all resources
    admin: true
"""


def test_the_stock_example_file_loads():
    # (RocketMQ 4.9's distribution/conf/plain_acl.yml, as shipped)
    rules = parse_plain_acl_text(STOCK)
    assert [p.text for p in rules.global_white] == ["10.10.103.*", "192.168.0.*"]
    a, b = rules.accounts["RocketMQ"], rules.accounts["rocketmq2"]
    assert (a.secret_key, a.admin, a.default_topic_perm, a.default_group_perm) == ("12345678", False, DENY, SUB)
    assert a.topic_perms == {"topicA": DENY, "topicB": PUB | SUB, "topicC": SUB}
    assert a.group_perms == {"groupA": DENY, "groupB": PUB | SUB, "groupC": SUB}
    assert not a.white.matches("10.0.0.1")  # blank: matches nobody
    assert b.admin and b.white.matches("192.168.1.7") and not b.white.matches("192.168.2.7")
    assert (b.default_topic_perm, b.default_group_perm) == (DENY, DENY)  # unset means DENY


def test_retry_topics_in_topic_perms_are_groups():
    rules = parse_plain_acl_text("accounts: [{accessKey: abcdefg, secretKey: 1234567, "
                                 "topicPerms: ['%RETRY%G=SUB', 'T=PUB']}]")
    assert rules.accounts["abcdefg"].group_perms == {"G": SUB}
    assert rules.accounts["abcdefg"].topic_perms == {"T": PUB}


@pytest.mark.parametrize("text, message", [
    ("accounts: [{accessKey: short, secretKey: 12345678}]", "at least 7 characters"),
    ("accounts: [{accessKey: abcdefgh, secretKey: 123}]", "at least 7 characters"),
    ("accounts: [{secretKey: 12345678}]", r"accounts\[0\].accessKey is missing"),
    ("accounts: [{accessKey: abcdefgh, secretKey: 12345678, defaultTopicPerm: PUBB}]",
     r"\(abcdefgh\).defaultTopicPerm: 'PUBB' is not a permission"),
    ("accounts: [{accessKey: abcdefgh, secretKey: 12345678, topicPerms: [topicA]}]", "is not topic=PERM"),
    ("accounts: [{accessKey: abcdefgh, secretKey: 12345678, groupPerms: [g=SUB=PUB]}]", "is not group=PERM"),
    ("accounts: [{accessKey: abcdefgh, secretKey: 12345678, admin: maybe}]", "is not true or false"),
    ("accounts: [{accessKey: abcdefgh, secretKey: 12345678, secretkey: x}]", "unknown key"),
    ("accounts:\n - {accessKey: abcdefgh, secretKey: 12345678}\n - {accessKey: abcdefgh, secretKey: 87654321}",
     "appears twice"),
    ("globalWhiteRemoteAddresses: [300.1.1.1]", "is not an IP address"),
    ("globalWhiteRemoteAddresses: ['192.*.1.1']", "is not a range pattern"),
    ("accounts: {accessKey: abcdefgh}", "accounts must be a list"),
    ("acounts: []", "unknown key"),
    ("- a\n- b", "must be a mapping"),
    ("accounts: [", "not valid YAML"),
])
def test_bad_files_are_refused_with_the_place_named(text, message):
    with pytest.raises(AclConfigError, match=message):
        parse_plain_acl_text(text, "conf/plain_acl.yml")


def test_an_empty_file_has_no_accounts():
    assert parse_plain_acl_text("").accounts == {}


@pytest.mark.parametrize("pattern, inside, outside", [
    ("*", ["1.2.3.4", "::1"], []),
    ("*.*.*.*", ["1.2.3.4"], []),
    ("", [], ["1.2.3.4"]),
    ("192.168.1.1-100", ["192.168.1.1", "192.168.1.100"], ["192.168.1.101", "192.168.2.1"]),
    ("192.168.*.*", ["192.168.0.1", "192.168.255.9"], ["192.169.0.1"]),
    ("10.*.*.*", ["10.1.2.3"], ["11.1.2.3"]),
    ("192.168.0.{1,2}", ["192.168.0.1", "192.168.0.2"], ["192.168.0.3"]),
    ("127.0.0.1,10.0.0.2", ["127.0.0.1", "10.0.0.2"], ["10.0.0.3"]),
    ("127.0.0.1", ["127.0.0.1", "::ffff:127.0.0.1"], ["127.0.0.2", "garbage"]),
    ("1:2:3:4:5:6:7:1-ff", ["1:2:3:4:5:6:7:10"], ["1:2:3:4:5:6:7:100", "1.2.3.4"]),
    ("::1", ["::1"], ["127.0.0.1"]),
])
def test_address_patterns(pattern, inside, outside):
    p = parse_address_pattern(pattern, "x")
    assert all(p.matches(a) for a in inside)
    assert not any(p.matches(a) for a in outside)


def test_permission_rule():
    assert check_permission(PUB, PUB | SUB) and check_permission(SUB, SUB)
    assert not check_permission(PUB, SUB)
    assert not check_permission(SUB, DENY | SUB)  # DENY wins
