# Owns how a request is signed (RocketMQ's AclClientRPCHook + AclUtils +
# AclSigner, ACL 1.0), for both sides: the client adds its AccessKey (and
# SecurityToken) to the ext fields, then
#
#   Signature = Base64(HmacSHA1(secretKey, content))
#   content   = UTF-8 of the VALUES of every ext field except Signature, in
#               ascending key order (Java TreeMap: UTF-16 code unit order),
#               followed by the body bytes
#
# and adds Signature.  The server recomputes content from what arrived (also
# leaving out `_UNIQUE_KEY_QUERY`, which Java's admin adds outside the header
# its hook signs; so does Credentials.sign) and compares.  The C++ client
# also sends `OnsChannel` and signs it as one more ext field, which the same
# rule covers.
#
# Nothing separates the values from each other or from the body, and
# nothing in the content is fresh: one signature fits every request whose
# concatenation is the same, and a request can be sent again.  What the
# broker does about the first is fields.py (only a code's own fields, each
# parsing as its type); about the second, nothing but TLS (README "What ACL
# 1.0 can and cannot promise").  Test vector (README, and
# tests/broker/acl/test_signing.py): ext fields {"a": "1", "b": "2"}, body
# b"xy", accessKey "ak", secretKey "sk" -> content "ak12xy" ->
# "Zsd7jyGm5P42DQPsUvyGT52ekt8=".
#
# Pure: no I/O except load_tools_credentials (mqadmin's conf/tools.yml).
import base64
import hmac
import os
from collections.abc import Mapping

import attrs

from broker.remoting.command import RemotingCommand

ACCESS_KEY = "AccessKey"
SECRET_KEY = "SecretKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"  # MixAll.UNIQUE_MSG_QUERY_FLAG: added after signing
# What the broker leaves out of the content it recomputes.
SERVER_UNSIGNED = frozenset({SIGNATURE, UNIQUE_KEY_QUERY})


def _java_order(key: str) -> bytes:
    # TreeMap<String, ...> compares UTF-16 code units; the big-endian UTF-16
    # bytes compare the same way (Python's str order is by code point, which
    # differs above U+FFFF).
    return key.encode("utf-16-be", "surrogatepass")


def content_to_sign(ext_fields: Mapping[str, str], body: bytes = b"",
                    skip: frozenset[str] = frozenset({SIGNATURE})) -> bytes:
    """The bytes a signature covers (AclUtils.combineRequestContent)."""
    # ASCII keys (every field RocketMQ defines) sort the same either way;
    # the UTF-16 key is for the rest.
    keys = sorted(ext_fields) if all(map(str.isascii, ext_fields)) else sorted(ext_fields, key=_java_order)
    values = "".join(ext_fields[k] for k in keys if k not in skip)
    return values.encode("utf-8", "replace") + (body or b"")


def signature(content: bytes, secret_key: str) -> str:
    """Base64 of HmacSHA1 keyed with the secret's UTF-8 bytes (AclSigner)."""
    return base64.b64encode(hmac.digest(secret_key.encode("utf-8"), content, "sha1")).decode("ascii")


def signature_matches(expected: str, given: str | None) -> bool:
    """Constant-time comparison: a timing difference must not tell a
    guesser how much of a signature was right."""
    return given is not None and hmac.compare_digest(expected.encode("ascii"), given.encode("utf-8", "replace"))


@attrs.frozen(repr=False)
class Credentials:
    """An account's keys (RocketMQ's SessionCredentials).  The secret never
    appears in a repr or a log line."""

    access_key: str
    secret_key: str
    security_token: str | None = None

    def __repr__(self) -> str:
        return f"Credentials(access_key={self.access_key!r}, secret_key=<hidden>)"

    def sign(self, cmd: RemotingCommand) -> RemotingCommand:
        """`cmd` with AccessKey (SecurityToken) and Signature added: the
        client-side RPC hook.  Any Signature it carried is replaced."""
        fields = {k: v for k, v in cmd.ext_fields.items() if k != SIGNATURE}
        fields[ACCESS_KEY] = self.access_key
        if self.security_token is not None:
            fields[SECURITY_TOKEN] = self.security_token
        # The query flag is added outside the header by Java's admin, so
        # neither side signs it.
        fields[SIGNATURE] = signature(content_to_sign(fields, cmd.body, SERVER_UNSIGNED), self.secret_key)
        return attrs.evolve(cmd, ext_fields=fields)

    def __call__(self, cmd: RemotingCommand) -> RemotingCommand:
        return self.sign(cmd)


def credentials_or_none(access_key: str | None, secret_key: str | None) -> Credentials | None:
    """Credentials from an optional pair; ValueError if only one is given."""
    if not access_key and not secret_key:
        return None
    if not access_key or not secret_key:
        raise ValueError("give both an access key and a secret key (or neither)")
    return Credentials(access_key, secret_key)


def load_tools_credentials(rocketmq_home: str | None = None) -> Credentials | None:
    """mqadmin's fallback, as RocketMQ's MQAdminStartup reads it:
    `$ROCKETMQ_HOME/conf/tools.yml` with `accessKey` and `secretKey`.
    None when there is no such file; ValueError when it is unreadable."""
    home = rocketmq_home if rocketmq_home is not None else os.environ.get("ROCKETMQ_HOME")
    if not home:
        return None
    path = os.path.join(home, "conf", "tools.yml")
    if not os.path.exists(path):
        return None
    import yaml  # only mqadmin pays for the import, and only with a tools.yml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected accessKey and secretKey")
    try:
        return credentials_or_none(str(data.get("accessKey") or ""), str(data.get("secretKey") or ""))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
