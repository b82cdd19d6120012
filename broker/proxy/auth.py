# Owns who may call which gRPC RPC: the `authorization` header of the official
# clients checked against the plain ACL accounts (plain_acl.yml, broker/acl/
# plain.py: the accounts and permissions remoting uses), and each RPC's rule.
# Pure: rules, the caller's IP, the metadata and the request's resources in,
# the access key (or None) or an AuthError out.
#
# The header (spec §8.9): `MQv2-HMAC-SHA1 Credential=<ak>, SignedHeaders=x-mq-date-time,
# Signature=<hex>`, Signature = hex(HMAC-SHA1(secretKey, x-mq-date-time's value)), parsed as RocketMQ
# does (split at the first space, then on commas; the access key is Credential up to its first `/`; hex
# in any case).  An empty Credential (the Python client's) is anonymous, refused when ACL is on.  The
# date is not checked against the clock (the Python client writes local time with a literal Z; nor
# does RocketMQ's proxy).  The file is re-read when it changes (mtime and size, looked at most once a
# second, on a request); a file that no longer parses keeps the rules in force, logged.
#
# Who checks: as RocketMQ's proxy in cluster mode, this one verifies the signature and the account's
# permissions itself, in the broker validator's order (global whitelist; known key; account whitelist;
# signature; admin; resources), then signs every remoting request with innerAccessKey/innerSecretKey
# (it holds no client's secret), an account the brokers must give what the proxy relays.
#
# Each RPC's rule is that of the remoting code it becomes (broker/acl/table.py), on the resources named:
#   QueryRoute               GET_ROUTEINFO_BY_TOPIC 105   topic: PUB or SUB
#   Heartbeat                HEART_BEAT 34                consumer group: SUB (producers: a valid signature)
#   Telemetry (settings)     HEART_BEAT 34                producer: PUB on each topic; consumer: SUB on group and topics
#   SendMessage, EndTransaction, RecallMessage (310, 37, 370)                  topic: PUB
#   QueryAssignment, ReceiveMessage, AckMessage, ChangeInvisibleDuration,
#   ForwardMessageToDLQ (105, 200050, 200051, CHANGE_MESSAGE_INVISIBLETIME, 36) topic: SUB, group: SUB
#   NotifyClientTermination  UNREGISTER_CLIENT 35         group (if any): SUB
# The other RPCs (PullMessage, offsets, lite topics) are not served: NOT_IMPLEMENTED, before any check.
import binascii
import hashlib
import hmac
import logging
import os
import time

import attrs

from broker.acl.plain import ANY, PUB, SUB, AclConfigError, AclRules, load_plain_acl
from broker.acl.table import Resource, group, topic
from broker.acl.validator import denied

log = logging.getLogger("ledgermq.proxy")

SCHEME = "MQv2-HMAC-SHA1"
DATE_HEADER = "x-mq-date-time"
MAX_HEADER = 1024  # an authorization header longer than this is not read


class AuthError(Exception):
    """`unauthorized`: the caller is not authenticated (UNAUTHORIZED 40100),
    else it is not allowed (FORBIDDEN 40300)."""

    def __init__(self, message: str, *, unauthorized: bool) -> None:
        super().__init__(message)
        self.unauthorized = unauthorized


@attrs.frozen
class Authorization:
    access_key: str
    signature: bytes


def parse_authorization(value: str | None) -> Authorization | None:
    """The header's credential and signature; None when there is no header
    or its Credential is empty (anonymous)."""
    if not value:
        return None
    if len(value) > MAX_HEADER:
        raise AuthError("the authorization header is too long", unauthorized=True)
    scheme, _, rest = value.strip().partition(" ")
    if scheme != SCHEME:
        raise AuthError(f"authorization scheme {scheme[:40]!r} is not {SCHEME}", unauthorized=True)
    fields: dict[str, str] = {}
    for part in rest.split(","):
        key, sep, val = part.strip().partition("=")
        if sep:
            fields[key.strip()] = val.strip()
    credential = fields.get("Credential", "")
    access_key = credential.split("/", 1)[0]
    if not access_key:
        return None
    try:
        signature = binascii.unhexlify(fields.get("Signature", ""))
    except (binascii.Error, ValueError):
        raise AuthError("the signature is not hex", unauthorized=True) from None
    return Authorization(access_key, signature)


def sign(secret_key: str, date_time: str) -> str:
    """What a client puts in Signature (lowercase hex, as the Python client)."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def authorize(rules: AclRules, address: str | None, metadata: dict[str, str], needed: list[Resource]) -> str | None:
    """The access key the call is allowed as (None: a globally whitelisted
    address); AuthError if it is not allowed."""
    if rules.globally_whitelisted(address):
        return None
    auth = parse_authorization(metadata.get("authorization"))
    if auth is None:
        raise AuthError("no credential: the request is anonymous and ACL is on", unauthorized=True)
    account = rules.accounts.get(auth.access_key)
    if account is None:
        raise AuthError(f"No acl config for {auth.access_key}", unauthorized=True)
    if not account.white.matches(address):
        date = metadata.get(DATE_HEADER, "")
        expected = hmac.new(account.secret_key.encode(), date.encode(), hashlib.sha1).digest()
        if not date or not hmac.compare_digest(expected, auth.signature):
            raise AuthError(f"Check signature failed for accessKey={auth.access_key}", unauthorized=True)
    refused = denied(account, needed)
    if refused is not None:
        raise AuthError(f"No permission for {refused.shown or f'{refused.kind}:{refused.name}'} "
                        f"(accessKey={auth.access_key})", unauthorized=False)
    return auth.access_key


class AclFile:
    """plain_acl.yml and the rules read from it, read again when it changes."""

    def __init__(self, path: str, *, clock=time.monotonic) -> None:
        self.path, self.clock = path, clock
        self.rules = load_plain_acl(path)  # a bad file at start fails the start
        self._seen = self._stamp()
        self._looked = clock()

    def _stamp(self):
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def current(self) -> AclRules:
        now = self.clock()
        if now - self._looked < 1.0:
            return self.rules
        self._looked = now
        stamp = self._stamp()
        if stamp != self._seen:
            self._seen = stamp
            try:
                self.rules = load_plain_acl(self.path)
                log.info("%s changed: ACL rules reloaded (%d accounts)", self.path, len(self.rules.accounts))
            except (AclConfigError, OSError) as e:
                log.error("%s changed but cannot be used, the rules in force stay: %s", self.path, e)
        return self.rules


# --- what each RPC touches --------------------------------------------------------------

def route_resources(topic_name: str) -> list[Resource]:
    return topic(topic_name, ANY)


def publish_resources(topic_name: str) -> list[Resource]:
    return topic(topic_name, PUB)


def consume_resources(topic_name: str | None, group_name: str | None) -> list[Resource]:
    return [*(topic(topic_name, SUB) if topic_name else []), *group(group_name)]
