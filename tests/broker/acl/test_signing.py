# The ACL 1.0 signature (broker/acl/signing.py) against the rule read from
# upstream's AclClientRPCHook / AclUtils / AclSigner: the README's test
# vector, key order, what the server leaves out, and the client hook.
import pytest

from broker.acl.plain import parse_plain_acl
from broker.acl.signing import (
    Credentials,
    content_to_sign,
    credentials_or_none,
    load_tools_credentials,
    signature,
    signature_matches,
)
from broker.acl.validator import validate
from broker.remoting.command import RemotingCommand

VECTOR = "Zsd7jyGm5P42DQPsUvyGT52ekt8="


def test_the_readme_test_vector():
    fields = {"a": "1", "b": "2", "AccessKey": "ak"}
    content = content_to_sign(fields, b"xy")
    assert content == b"ak12xy"
    assert signature(content, "sk") == VECTOR


def test_the_client_hook_adds_access_key_then_signs_every_field_and_the_body():
    cmd = RemotingCommand.create_request(310, {"b": "2", "a": "1"}, body=b"xy")
    signed = Credentials("ak", "sk").sign(cmd)
    assert signed.ext_fields == {"a": "1", "b": "2", "AccessKey": "ak", "Signature": VECTOR}
    assert signed.body == b"xy" and signed.code == 310
    # Signing again (a retried request) replaces the old signature, never signs it.
    assert Credentials("ak", "sk").sign(signed).ext_fields["Signature"] == VECTOR


def test_security_token_is_signed_too():
    signed = Credentials("ak", "sk", security_token="tok").sign(RemotingCommand.create_request(10, {"a": "1"}))
    # Keys in Java TreeMap order: AccessKey, SecurityToken, a.
    assert signed.ext_fields["Signature"] == signature(b"aktok1", "sk")


def test_keys_sort_as_java_strings_do():
    # Upper case sorts before lower case, and UTF-16 code units decide
    # between a supplementary character and one just below U+FFFF.
    fields = {"b": "B", "A": "a", "\U0001F600": "smile", "\uFFFD": "rep"}
    assert content_to_sign(fields) == "aBsmilerep".encode()


def test_server_side_content_leaves_out_the_unique_key_query_flag():
    fields = {"AccessKey": "ak", "topic": "T", "Signature": "x", "_UNIQUE_KEY_QUERY": "true"}
    assert content_to_sign(fields, skip=frozenset({"Signature", "_UNIQUE_KEY_QUERY"})) == b"akT"


def test_signature_comparison():
    assert signature_matches(VECTOR, VECTOR)
    assert not signature_matches(VECTOR, VECTOR[:-1] + "A")
    assert not signature_matches(VECTOR, None)
    assert not signature_matches(VECTOR, "é")


def test_a_signed_request_verifies_and_a_tampered_one_does_not():
    rules = parse_plain_acl({"accounts": [{"accessKey": "RocketMQ", "secretKey": "12345678", "admin": True}]})
    cmd = Credentials("RocketMQ", "12345678").sign(RemotingCommand.create_request(215, {"topic": "T1"}, body=b"b"))
    validate(rules, "10.0.0.1", cmd)
    tampered = RemotingCommand.create_request(215, {**cmd.ext_fields, "topic": "T2"}, body=b"b")
    with pytest.raises(Exception, match="Check signature failed for accessKey=RocketMQ"):
        validate(rules, "10.0.0.1", tampered)
    with pytest.raises(Exception, match="Check signature failed"):
        validate(rules, "10.0.0.1", RemotingCommand.create_request(215, cmd.ext_fields, body=b"c"))
    # A field the code does not define is refused before the signature is looked at.
    added = RemotingCommand.create_request(215, {**cmd.ext_fields, "extra": ""}, body=b"b")
    with pytest.raises(Exception, match="request code=215 has no field 'extra'"):
        validate(rules, "10.0.0.1", added)


def test_the_query_flag_is_not_signed_by_either_side():
    # Java's admin adds _UNIQUE_KEY_QUERY outside the header its hook signs,
    # and the broker leaves it out: our client must leave it out too.
    rules = parse_plain_acl({"accounts": [{"accessKey": "RocketMQ", "secretKey": "12345678", "admin": True}]})
    cmd = Credentials("RocketMQ", "12345678").sign(RemotingCommand.create_request(
        12, {"topic": "T", "key": "k", "maxNum": 32, "beginTimestamp": 0, "endTimestamp": 1,
             "_UNIQUE_KEY_QUERY": "true"}))
    validate(rules, "10.0.0.1", cmd)
    assert cmd.ext_fields["Signature"] == signature(b"RocketMQ01k32T", "12345678")


def test_credentials_never_show_the_secret():
    assert "12345678" not in repr(Credentials("RocketMQ", "12345678"))


def test_credential_pairs_and_tools_yml(tmp_path):
    assert credentials_or_none(None, None) is None
    assert credentials_or_none("ak", "sk") == Credentials("ak", "sk")
    with pytest.raises(ValueError, match="both"):
        credentials_or_none("ak", None)
    assert load_tools_credentials(str(tmp_path)) is None
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "tools.yml").write_text("accessKey: rocketmq2\nsecretKey: 12345678\n")
    assert load_tools_credentials(str(tmp_path)) == Credentials("rocketmq2", "12345678")
    (tmp_path / "conf" / "tools.yml").write_text("accessKey: [\n")
    with pytest.raises(ValueError, match="tools.yml"):
        load_tools_credentials(str(tmp_path))
