# Owns the ACL check of the sends the native scanner parsed (RawSends of a
# SendRun, broker/remoting/codec.py): a scan's plain SEND_MESSAGE_V2
# requests are checked in one C call (native/acl.py, native/src/acl.c:
# fields, accessKey, signature), the topic permission once per distinct
# (account, topic) with the validator's own authorize(), and the verdicts
# kept for the scan, so that admission asking about each send of the scan
# (AclService.check, called by the guard for each send of a run) costs an
# array lookup per send.  Nothing is built per send: no RemotingCommand, no
# dict of its fields.
#
# The general path (validator.validate on the decoded command) stays the
# oracle and the fallback: a send the C check does not model (GENERAL: a
# field the code does not define, a value not of its type, an escape where
# a name is compared, a field given twice...) is judged there, as before,
# and its refusal worded there.  The verdicts this path gives itself -- no
# accessKey, an unknown one, a signature that does not verify, a topic the
# account may not send to, and admission -- are the general path's, refusal
# text included (tests/broker/acl/test_native_acl.py holds them against it
# for generated sends, and live on a broker).
#
# Caches, all bounded and all dropped when the rules are reloaded (a new
# AclRules object): the account table (accessKeys with their secrets' HMAC
# states), per caller address the whitelist modes (at most ADDRESSES), the
# decisions per (accessKey, topic) (at most DECISIONS), and the verdicts of
# the last scan checked.
from array import array

import attrs

from broker.acl import table
from broker.acl.plain import AclRules, AddressPattern
from broker.acl.validator import AclDenied, Policy, authorize
from broker.remoting.codes import RequestCode
from native import acl as native_acl
from native import sendpath

ADDRESSES = 1024
DECISIONS = 4096
SEND_V2 = int(RequestCode.SEND_MESSAGE_V2)

OK, GENERAL, NO_KEY, UNKNOWN_KEY, BAD_SIGNATURE, DENIED = (
    native_acl.OK, native_acl.GENERAL, native_acl.NO_KEY, native_acl.UNKNOWN_KEY, native_acl.BAD_SIGNATURE,
    native_acl.DENIED)


@attrs.frozen
class _TopicSend:
    """What authorize() reads of a plain send: its code and topic field."""

    ext_fields: dict
    code: int = SEND_V2
    body: bytes = b""


@attrs.define(eq=False, kw_only=True)
class ScanChecks:
    """The verdicts of one scan's sends from index `lo` on: verdict[i] is
    OK (admitted), GENERAL (ask the general path) or a refusal, whose
    AclDenied refusal(i) makes.  `principals`: the accessKeys admitted."""

    scan: sendpath.SendScan
    rules: AclRules
    lo: int
    verdict: array  # array('i') over the whole scan
    checked: native_acl.ScanVerdicts | None = None  # (None: a globally whitelisted address)
    reasons: dict = attrs.Factory(dict)  # pair -> AclDenied (DENIED)
    principals: frozenset = frozenset()

    def refusal(self, i: int) -> AclDenied:
        v = self.verdict[i]
        if v == NO_KEY:
            return AclDenied("No accessKey is configured")
        if v == DENIED:
            return self.reasons[self.checked.pair[i]]
        ak = self.checked.access_key(i)
        if v == UNKNOWN_KEY:
            return AclDenied(f"No acl config for {ak}", ak)
        return AclDenied(f"Check signature failed for accessKey={ak}", ak)


_NO_WHITELIST = AddressPattern("")
_GLOBAL = object()  # an address in globalWhiteRemoteAddresses: everything admitted


def applies(policy: Policy) -> bool:
    """Does this policy check sends as the fast path models it (the
    broker's: every code checked, a send not an admin code)?"""
    return (native_acl.AVAILABLE and sendpath.AVAILABLE and policy.checked is None
            and SEND_V2 not in policy.admin_codes and table.rule_for(SEND_V2).fields is not None)


class SendChecks:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.broker_name = (policy.broker_name or "").encode("utf-8")
        self._rules: AclRules | None = None
        self._table = None
        self._white: list = []
        self._bound: dict[str, object] = {}
        self._decisions: dict[tuple[str, str], AclDenied | None] = {}
        self.scans = 0  # scans checked in C (tests, and what a profile counts)

    def _reset(self, rules: AclRules) -> None:
        self._rules = rules
        self._table = native_acl.AccountTable({k: a.secret_key for k, a in rules.accounts.items()})
        # the accounts with a whiteRemoteAddress (the blank one matches no address)
        self._white = [(i, rules.accounts[k].white) for i, k in enumerate(self._table.keys)
                       if rules.accounts[k].white != _NO_WHITELIST]
        self._bound = {}
        self._decisions = {}

    def _accounts(self, rules: AclRules, address: str):
        bound = self._bound.get(address)
        if bound is None:
            if rules.globally_whitelisted(address):
                bound = _GLOBAL
            else:
                modes = bytearray(self._table.n)
                for i, white in self._white:
                    modes[i] = white.matches(address)
                bound = self._table.bind(bytes(modes), self.broker_name)
            if len(self._bound) >= ADDRESSES:
                self._bound.clear()
            self._bound[address] = bound
        return bound

    def decision(self, rules: AclRules, ak: str, topic: str) -> AclDenied | None:
        """authorize() for a plain send of `ak` to `topic`, cached."""
        key = (ak, topic)
        try:
            return self._decisions[key]
        except KeyError:
            pass
        try:
            authorize(rules.accounts[ak], ak, _TopicSend({"b": topic}), self.policy)
            out = None
        except AclDenied as e:
            out = e
        if len(self._decisions) >= DECISIONS:
            self._decisions.clear()
        self._decisions[key] = out
        return out

    def check_scan(self, rules: AclRules, address: str, scan, lo: int) -> ScanChecks:
        """The verdicts of the sends lo.. of `scan` from `address` (an IP)
        under `rules`."""
        if rules is not self._rules:
            self._reset(rules)
        bound = self._accounts(rules, address)
        if bound is _GLOBAL:
            return ScanChecks(scan=scan, rules=rules, lo=lo, verdict=array("i", bytes(4 * scan.n)))
        checked = native_acl.check_sends(scan, lo, bound)
        self.scans += 1
        keys = self._table.keys
        pair_verdicts, reasons, principals = [], {}, set()
        for k in range(checked.npairs):
            account, topic_first, white = checked.pair_of(k)
            ak = keys[account]
            refusal = None if white else self.decision(rules, ak, scan.topic(topic_first).decode("utf-8"))
            if refusal is None:
                pair_verdicts.append(OK)
                principals.add(ak)
            else:
                pair_verdicts.append(DENIED)
                reasons[k] = refusal
        checked.apply(pair_verdicts)
        return ScanChecks(scan=scan, rules=rules, lo=lo, verdict=checked.verdict, checked=checked, reasons=reasons,
                          principals=frozenset(principals))
