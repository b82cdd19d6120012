# Owns the ACL decision for one request (RocketMQ's PlainAccessValidator.parse
# + PlainPermissionManager.validate, ACL 1.0): the order of the checks, and
# whether an account's permissions cover a list of resources (permits, also
# what the check-back filter asks).  What each request code needs is
# table.py's RULES; which header fields it may carry, fields.py.  Pure:
# rules, the caller's IP, the command and (for requests naming a commitlog
# offset) a Lookup in, an AclDenied (the reason, worded as RocketMQ words
# it) or nothing out.
#
# Order of the checks, RocketMQ's, with the field check added before the
# signature:
#   1. the caller's IP is in globalWhiteRemoteAddresses   -> allowed, nothing else checked
#   2. no AccessKey                                      -> "No accessKey is configured"
#   3. unknown AccessKey                                 -> "No acl config for <ak>"
#   4. the IP matches the account's whiteRemoteAddress   -> allowed without a signature
#   5. a field the code does not define, or a value that does not parse
#      as its field's type (fields.py)                   -> "request code=<c> has no field ..."
#   6. the signature does not verify                     -> "Check signature failed for accessKey=<ak>"
#   7. an admin code from a non-admin account            -> "Need admin permission for request code=..."
#   8. an admin account with no topicPerms and no groupPerms -> allowed
#   9. a PUB of RMQ_SYS_TRACE_TOPIC (message traces)     -> allowed
#  10. each resource against the account's explicit permission, else its
#      default for topics / groups                       -> "No default permission for topic:<t>"
#
# Groups are checked as their retry topic is (a topic %RETRY%G means group G).
#
# A Policy says which codes a server protects: the broker checks every code
# (authentication for all, the table's rule for each); the name server only
# the route writes (table.NAMESRV_ADMIN_CODES), all of which need an admin
# account (its broker credentials).
import attrs

from broker.acl import table
from broker.acl.fields import field_problem
from broker.acl.plain import PUB, Account, AclRules, check_permission
from broker.acl.signing import ACCESS_KEY, SERVER_UNSIGNED, SIGNATURE, content_to_sign, signature, signature_matches
from broker.acl.table import ADMIN_CODES, ALLOW, NAMESRV_ADMIN_CODES, REFUSE, Lookup, Resource, Unreadable
from broker.remoting.command import RemotingCommand

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


__all__ = ["ADMIN_CODES", "BROKER_POLICY", "NAMESRV_POLICY", "AclDenied", "Policy", "Resource", "authorize",
           "broker_policy", "denied", "permits", "required_resources", "validate"]


@attrs.frozen
class Policy:
    """Which codes are checked (None: all), which need an admin, and the
    broker's own name (what a `bname` / `n` field must say; None on the
    name server)."""

    checked: frozenset | None = None
    admin_codes: frozenset = ADMIN_CODES
    broker_name: str | None = None


BROKER_POLICY = Policy()
NAMESRV_POLICY = Policy(checked=NAMESRV_ADMIN_CODES, admin_codes=NAMESRV_ADMIN_CODES)


def broker_policy(broker_name: str) -> Policy:
    return attrs.evolve(BROKER_POLICY, broker_name=broker_name)


def required_resources(cmd: RemotingCommand, lookup: Lookup | None = None) -> list[Resource]:
    """The resources `cmd` touches (AclDenied if its header or body cannot
    be read: a request the table cannot judge is not let through)."""
    rule = table.rule_for(cmd.code)
    if rule.resources is None:
        return []
    try:
        return rule.resources(cmd, lookup)
    except Unreadable as e:
        raise AclDenied(f"cannot read the request to check its permissions: {e}") from None
    except Exception as e:  # a malformed body or header: refused, named
        raise AclDenied(f"cannot read the request to check its permissions: {e}") from None


def denied(account: Account, needed: list[Resource]) -> Resource | None:
    """The first resource the account's permissions do not cover, or None.
    An admin account with no topicPerms and no groupPerms holds everything."""
    if account.admin and not account.has_resource_perms:
        return None
    for r in needed:
        table_, default = ((account.topic_perms, account.default_topic_perm) if r.kind == "topic"
                           else (account.group_perms, account.default_group_perm))
        owned = table_.get(r.name)
        if owned is None:
            if r.unnamed == ALLOW:
                continue
            if r.unnamed == REFUSE:
                return r
            owned = default
        if not check_permission(r.perm, owned):
            return r
    return None


def permits(account: Account, needed: list[Resource]) -> bool:
    return denied(account, needed) is None


def _refusal(r: Resource, ak: str) -> AclDenied:
    return AclDenied(f"No default permission for {r.shown or f'{r.kind}:{r.name}'}", ak)


def validate(rules: AclRules, address: str | None, cmd: RemotingCommand, policy: Policy = BROKER_POLICY,
             lookup: Lookup | None = None) -> str | None:
    """Raise AclDenied if `cmd` from `address` (an IP) is not allowed; else
    the accessKey it was allowed as (None: a globally whitelisted address,
    or a code this policy does not check)."""
    if policy.checked is not None and cmd.code not in policy.checked:
        return None
    if rules.globally_whitelisted(address):
        return None
    ak = cmd.ext_fields.get(ACCESS_KEY)
    if ak is None:
        raise AclDenied("No accessKey is configured")
    account = rules.accounts.get(ak)
    if account is None:
        raise AclDenied(f"No acl config for {ak}", ak)
    if account.white.matches(address):
        return ak
    schema = table.rule_for(cmd.code).fields
    if schema is not None:
        problem = field_problem(cmd.code, cmd.ext_fields, schema, policy.broker_name)
        if problem is not None:
            raise AclDenied(problem, ak)
    expected = signature(content_to_sign(cmd.ext_fields, cmd.body, SERVER_UNSIGNED), account.secret_key)
    if not signature_matches(expected, cmd.ext_fields.get(SIGNATURE)):
        raise AclDenied(f"Check signature failed for accessKey={ak}", ak)
    authorize(account, ak, cmd, policy, lookup)
    return ak


def authorize(account: Account, ak: str, cmd: RemotingCommand, policy: Policy = BROKER_POLICY,
              lookup: Lookup | None = None) -> None:
    """Steps 7-10, for a request whose signature verified: raise
    AclDenied if `account` may not make it.  (broker/acl/fastpath.py asks this once per account
    and topic of a scan's sends.)"""
    if cmd.code in policy.admin_codes and not account.admin:
        raise AclDenied(f"Need admin permission for request code={cmd.code}, but accessKey={ak} is not", ak)
    if account.admin and not account.has_resource_perms:
        return
    needed = required_resources(cmd, lookup)
    if any(r.kind == "topic" and r.name == TRACE_TOPIC and r.perm == PUB for r in needed):
        return
    refused = denied(account, needed)
    if refused is not None:
        raise _refusal(refused, ak)
