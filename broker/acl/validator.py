# Owns the ACL decision for one request (RocketMQ's PlainAccessValidator.parse
# + PlainPermissionManager.validate, ACL 1.0): which resources a request code
# touches with which permission (RESOURCES below, the one table), and the
# order of the checks.  Pure: rules, the caller's IP and the command in, an
# AclDenied (the reason, worded as RocketMQ words it) or nothing out.
#
# Order of the checks, RocketMQ's:
#   1. the caller's IP is in globalWhiteRemoteAddresses   -> allowed, nothing else checked
#   2. no AccessKey                                      -> "No accessKey is configured"
#   3. unknown AccessKey                                 -> "No acl config for <ak>"
#   4. the IP matches the account's whiteRemoteAddress   -> allowed without a signature
#   5. the signature does not verify                     -> "Check signature failed for accessKey=<ak>"
#   6. a PUB of RMQ_SYS_TRACE_TOPIC (message traces)     -> allowed
#   7. an admin code from a non-admin account            -> "Need admin permission for request code=..."
#   8. each resource against the account's explicit permission, else its
#      default for topics / groups (an admin account with no topicPerms and
#      no groupPerms skips this)                         -> "No default permission for topic:<t>"
#
# Groups are checked as their retry topic %RETRY%<group> is in RocketMQ, so a
# topic named %RETRY%G means group G.
#
# A Policy says which codes a server protects: the broker checks every code
# (authentication for all, the table for some); the name server only the
# route writes, all of which need an admin account (its broker credentials).
import attrs

from broker.acl.plain import PUB, RETRY_PREFIX, SUB, AclRules, check_permission, perm_name
from broker.acl.signing import ACCESS_KEY, SERVER_UNSIGNED, SIGNATURE, content_to_sign, signature, signature_matches
from broker.remoting.codes import RequestCode as C
from broker.remoting.command import RemotingCommand
from broker.remoting.header import decode_json

TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
EXCEPTION_PREFIX = "org.apache.rocketmq.acl.common.AclException: "  # how Java's refusal remark begins


class AclDenied(Exception):
    """Why a request is refused (the text after EXCEPTION_PREFIX)."""

    def __init__(self, reason: str, access_key: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.access_key = reason, access_key

    @property
    def remark(self) -> str:
        return EXCEPTION_PREFIX + self.reason


@attrs.frozen
class Resource:
    kind: str  # "topic" or "group"
    name: str
    perm: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.name} ({perm_name(self.perm)})"


def _topic(name: str | None, perm: int) -> list[Resource]:
    if not name:
        return []
    if name.startswith(RETRY_PREFIX):  # a retry topic is its group, and needs SUB on it
        return [Resource("group", name[len(RETRY_PREFIX):], SUB)]
    return [Resource("topic", name, perm)]


def _group(name: str | None) -> list[Resource]:
    return [Resource("group", name, SUB)] if name else []


def _heartbeat(cmd: RemotingCommand) -> list[Resource]:
    data = decode_json(cmd.body, "HeartbeatData")
    if not isinstance(data, dict):
        raise AclDenied("HeartbeatData must be a JSON object")
    out: list[Resource] = []
    for cd in data.get("consumerDataSet") or []:
        if not isinstance(cd, dict):
            raise AclDenied("HeartbeatData consumer data must be JSON objects")
        out += _group(cd.get("groupName"))
        for sub in cd.get("subscriptionDataSet") or []:
            out += _topic(sub.get("topic") if isinstance(sub, dict) else None, SUB)
    return out


def _f(cmd: RemotingCommand, name: str) -> str | None:
    return cmd.ext_fields.get(name)


# request code -> the resources it touches.  RocketMQ 4.9's table, plus the
# rows marked (+), which RocketMQ leaves to authentication alone but the
# issue's rule ("offsets need group and topic SUB", "sends need topic PUB")
# covers.  Codes not listed need a valid signature only.
RESOURCES = {
    C.SEND_MESSAGE: lambda c: _topic(_f(c, "topic"), PUB),
    C.SEND_MESSAGE_V2: lambda c: _topic(_f(c, "b"), PUB),
    C.SEND_BATCH_MESSAGE: lambda c: _topic(_f(c, "b"), PUB),                               # (+)
    C.CONSUMER_SEND_MSG_BACK: lambda c: _group(_f(c, "group")),
    C.PULL_MESSAGE: lambda c: _topic(_f(c, "topic"), SUB) + _group(_f(c, "consumerGroup")),
    C.QUERY_MESSAGE: lambda c: _topic(_f(c, "topic"), SUB),
    C.HEART_BEAT: _heartbeat,
    C.UNREGISTER_CLIENT: lambda c: _group(_f(c, "consumerGroup")),
    C.GET_CONSUMER_LIST_BY_GROUP: lambda c: _group(_f(c, "consumerGroup")),
    C.UPDATE_CONSUMER_OFFSET: lambda c: _group(_f(c, "consumerGroup")) + _topic(_f(c, "topic"), SUB),
    C.QUERY_CONSUMER_OFFSET: lambda c: _group(_f(c, "consumerGroup")) + _topic(_f(c, "topic"), SUB),  # (+)
}

# Codes only an admin account may send: RocketMQ's Permission.ADMIN_CODE
# (17, 25, 215, 200, 207) plus (+) the offset reset, file and queue cleanup,
# broker write-permission codes and ledgermq's replication codes 9100-9102.
ADMIN_CODES = frozenset({
    C.UPDATE_AND_CREATE_TOPIC, C.UPDATE_BROKER_CONFIG, C.DELETE_TOPIC_IN_BROKER,
    C.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, C.DELETE_SUBSCRIPTIONGROUP,
    C.INVOKE_BROKER_TO_RESET_OFFSET, C.TRIGGER_DELETE_FILES, C.CLEAN_EXPIRED_CONSUMEQUEUE,
    C.WIPE_WRITE_PERM_OF_BROKER, C.ADD_WRITE_PERM_OF_BROKER,
    C.LEDGERMQ_DLEDGER_STATUS, C.LEDGERMQ_TRANSFER_LEADERSHIP, C.LEDGERMQ_CHAIN_CRC,
})

# What the name server protects when ACL is on: every write to the route
# tables.  Reads (routes, cluster info, topic lists) stay open, as clients
# without credentials must find brokers.
NAMESRV_PROTECTED = frozenset({
    C.REGISTER_BROKER, C.UNREGISTER_BROKER, C.DELETE_TOPIC_IN_NAMESRV, C.REGISTER_TOPIC_IN_NAMESRV,
    C.PUT_KV_CONFIG, C.DELETE_KV_CONFIG, C.WIPE_WRITE_PERM_OF_BROKER, C.ADD_WRITE_PERM_OF_BROKER,
})


@attrs.frozen
class Policy:
    """Which codes are checked (None: all) and which need an admin."""

    checked: frozenset | None = None
    admin_codes: frozenset = ADMIN_CODES


BROKER_POLICY = Policy()
NAMESRV_POLICY = Policy(checked=NAMESRV_PROTECTED, admin_codes=NAMESRV_PROTECTED)


def required_resources(cmd: RemotingCommand) -> list[Resource]:
    """The resources `cmd` touches (AclDenied if its header or body cannot
    be read: a request the table cannot judge is not let through)."""
    parse = RESOURCES.get(cmd.code)
    if parse is None:
        return []
    try:
        return parse(cmd)
    except AclDenied:
        raise
    except Exception as e:  # a malformed body or header: refused, named
        raise AclDenied(f"cannot read the request to check its permissions: {e}") from None


def validate(rules: AclRules, address: str | None, cmd: RemotingCommand, policy: Policy = BROKER_POLICY) -> None:
    """Raise AclDenied if `cmd` from `address` (an IP) is not allowed."""
    if policy.checked is not None and cmd.code not in policy.checked:
        return
    if rules.globally_whitelisted(address):
        return
    ak = cmd.ext_fields.get(ACCESS_KEY)
    if ak is None:
        raise AclDenied("No accessKey is configured")
    account = rules.accounts.get(ak)
    if account is None:
        raise AclDenied(f"No acl config for {ak}", ak)
    if account.white.matches(address):
        return
    expected = signature(content_to_sign(cmd.ext_fields, cmd.body, SERVER_UNSIGNED), account.secret_key)
    if not signature_matches(expected, cmd.ext_fields.get(SIGNATURE)):
        raise AclDenied(f"Check signature failed for accessKey={ak}", ak)
    needed = required_resources(cmd)
    if any(r.kind == "topic" and r.name == TRACE_TOPIC and r.perm == PUB for r in needed):
        return
    if cmd.code in policy.admin_codes and not account.admin:
        raise AclDenied(f"Need admin permission for request code={cmd.code}, but accessKey={ak} is not", ak)
    if not needed or (account.admin and not account.has_resource_perms):
        return
    for r in needed:
        table, default = ((account.topic_perms, account.default_topic_perm) if r.kind == "topic"
                          else (account.group_perms, account.default_group_perm))
        if not check_permission(r.perm, table.get(r.name, default)):
            raise AclDenied(f"No default permission for {r.kind}:{r.name}", ak)
