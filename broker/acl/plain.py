# Owns plain_acl.yml (RocketMQ's PlainPermissionManager file format, ACL
# 1.0): parsing and validating it into AclRules, and the address patterns of
# globalWhiteRemoteAddresses / whiteRemoteAddress.  Pure: text in, rules (or
# an AclConfigError naming what is wrong and where) out; service.py reads
# the file and decides when.
#
#   globalWhiteRemoteAddresses: ["10.10.103.*", "192.168.0.*"]
#   accounts:
#     - accessKey: RocketMQ          # 7 characters or more (RocketMQ: "longer than 6")
#       secretKey: 12345678          # likewise
#       whiteRemoteAddress: 192.168.0.*
#       admin: false
#       defaultTopicPerm: DENY       # DENY (the default), PUB, SUB, PUB|SUB
#       defaultGroupPerm: SUB
#       topicPerms: [topicA=DENY, topicB=PUB|SUB, topicC=SUB]
#       groupPerms: [groupA=DENY, groupB=PUB|SUB, groupC=SUB]
#
# Address patterns (RemoteAddressStrategyFactory): blank matches nothing;
# `*`, `*.*.*.*` and `*:*:*:*:*:*:*:*` match everything; `a.b.c.{1,2,3}` (or an
# IPv6 `...:{x,y}`) a set; `a,b,c` a list; a `*` or `lo-hi` in one position
# (those after it `*`) a range, e.g. `192.168.1.1-100`, `192.168.*.*`; else one
# address.
#
# Where we are stricter than RocketMQ, on purpose: an unknown permission word
# (`PUBB`) or a malformed `Res=Perm` entry is an error rather than a silent
# DENY, and an accessKey listed twice is an error rather than "first wins",
# since a file that does not mean what its author thinks must not load.
import functools
import ipaddress
import re

import attrs

# Permission bits, RocketMQ's values (Permission.java).
DENY = 1
ANY = 2
PUB = 4
SUB = 8
_PERM_WORDS = {"DENY": DENY, "PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB}
MIN_KEY_LENGTH = 7  # AclConstants: length must be longer than 6
RETRY_PREFIX = "%RETRY%"

_ACCOUNT_KEYS = frozenset({"accessKey", "secretKey", "whiteRemoteAddress", "admin", "defaultTopicPerm",
                           "defaultGroupPerm", "topicPerms", "groupPerms"})
_TOP_KEYS = frozenset({"globalWhiteRemoteAddresses", "accounts", "dataVersion"})


class AclConfigError(ValueError):
    """plain_acl.yml cannot be used; the message names the place."""


def perm_name(perm: int) -> str:
    if perm & DENY:
        return "DENY"
    return "|".join(n for n, bit in (("PUB", PUB), ("SUB", SUB)) if perm & bit) or "DENY"


def parse_perm(text: object, where: str) -> int:
    word = str(text).strip() if text is not None else ""
    try:
        return _PERM_WORDS[word]
    except KeyError:
        raise AclConfigError(f"{where}: {text!r} is not a permission (DENY, PUB, SUB or PUB|SUB)") from None


def check_permission(needed: int, owned: int) -> bool:
    """Permission.checkPermission: DENY wins; ANY is PUB or SUB."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


# --- address patterns ---------------------------------------------------------------

@attrs.frozen
class AddressPattern:
    """One whitelist entry.  `exact` holds whole addresses; `prefix` +
    `position` + (`lo`, `hi`) a range over one part (an IPv4 octet or an IPv6
    group) with everything before it fixed and everything after it free."""

    text: str
    everything: bool = False
    exact: frozenset = frozenset()
    version: int = 4
    prefix: tuple[int, ...] = ()
    lo: int = 0
    hi: int = -1

    def matches(self, address: str | None) -> bool:
        if self.everything:
            return True
        if not address or (not self.exact and self.hi < 0):  # an empty pattern (no whitelist)
            return False
        ip = _client_ip(address)
        if ip is None:
            return False
        if self.exact:
            return ip in self.exact
        if ip.version != self.version or self.hi < 0:
            return False
        parts = _parts(ip)
        n = len(self.prefix)
        return tuple(parts[:n]) == self.prefix and self.lo <= parts[n] <= self.hi


@functools.lru_cache(maxsize=4096)
def _client_ip(address: str):
    """A client's address as whitelists compare it (None if not an IP).
    Cached: every request is checked, and a connection's address repeats."""
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # a dual-stack listener sees IPv4 clients as ::ffff:a.b.c.d
    return ip


def _parts(ip) -> list[int]:
    if ip.version == 4:
        return list(ip.packed)
    return [int(g, 16) for g in ip.exploded.split(":")]


def _one_ip(text: str, where: str):
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        raise AclConfigError(f"{where}: {text!r} is not an IP address") from None


def parse_address_pattern(text: object, where: str) -> AddressPattern:
    raw = "" if text is None else str(text).strip()
    if not raw:
        return AddressPattern(raw)  # matches nothing (BlankRemoteAddressStrategy)
    if raw in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
        return AddressPattern(raw, everything=True)
    if raw.endswith("}"):
        head, sep, items = raw.rpartition("{")
        if not sep or not head or head[-1] not in ".:":
            raise AclConfigError(f"{where}: {raw!r}: braces must hold the last part, as in 192.168.1.{{1,2}}")
        ips = [_one_ip(head + item.strip(), where) for item in items[:-1].split(",") if item.strip()]
        return AddressPattern(raw, exact=frozenset(ips))
    if "," in raw:
        return AddressPattern(raw, exact=frozenset(_one_ip(a, where) for a in raw.split(",") if a.strip()))
    if "*" in raw or "-" in raw:
        return _range(raw, where)
    return AddressPattern(raw, exact=frozenset({_one_ip(raw, where)}))


def _range(raw: str, where: str) -> AddressPattern:
    v6 = ":" in raw
    bad = AclConfigError(f"{where}: {raw!r} is not a range pattern (one `*` or `lo-hi` part, `*` after it)")
    if v6:
        # The groups before the range are written out in full ("::" would
        # leave the range's position ambiguous).
        groups = raw.split(":")
        idx = next((i for i, g in enumerate(groups) if g.strip() == "*" or "-" in g), None)
        if idx is None or idx == 0 or len(groups) > 8:
            raise bad
        tail = groups[idx + 1:]
        try:
            prefix = tuple(int(g, 16) for g in groups[:idx])
        except ValueError:
            raise AclConfigError(f"{where}: {raw!r}: write the IPv6 groups before the range in full") from None
        if not all(0 <= p <= 0xFFFF for p in prefix):
            raise bad
        base, top = 16, 0xFFFF
    else:
        groups = raw.split(".")
        if len(groups) != 4:
            raise bad
        idx = next((i for i, g in enumerate(groups) if g.strip() == "*" or "-" in g), None)
        if idx is None or idx == 0:
            raise bad
        tail = groups[idx + 1:]
        try:
            prefix = tuple(int(g) for g in groups[:idx])
        except ValueError:
            raise bad from None
        if not all(0 <= p <= 255 for p in prefix):
            raise bad
        base, top = 10, 255
    if any(t.strip() != "*" for t in tail):
        raise bad
    part = groups[idx].strip()
    if part == "*":
        lo, hi = 0, top
    else:
        m = re.fullmatch(r"([0-9a-fA-F]+)-([0-9a-fA-F]+)", part)
        if m is None:
            raise bad
        try:
            lo, hi = int(m.group(1), base), int(m.group(2), base)
        except ValueError:
            raise bad from None
        if not 0 <= lo <= hi <= top:
            raise bad
    return AddressPattern(raw, version=6 if v6 else 4, prefix=prefix, lo=lo, hi=hi)


# --- accounts and rules ---------------------------------------------------------------

@attrs.frozen(repr=False, kw_only=True)
class Account:
    access_key: str
    secret_key: str
    white: AddressPattern = AddressPattern("")
    admin: bool = False
    default_topic_perm: int = DENY
    default_group_perm: int = DENY
    topic_perms: dict[str, int] = attrs.Factory(dict)
    group_perms: dict[str, int] = attrs.Factory(dict)

    def __repr__(self) -> str:  # never the secret
        return f"Account({self.access_key!r}, admin={self.admin})"

    @property
    def has_resource_perms(self) -> bool:
        return bool(self.topic_perms or self.group_perms)


@attrs.frozen
class AclRules:
    """The parsed file: what the validator decides with."""

    global_white: tuple[AddressPattern, ...] = ()
    accounts: dict[str, Account] = attrs.Factory(dict)
    source: str = "<rules>"

    def globally_whitelisted(self, address: str | None) -> bool:
        return any(p.matches(address) for p in self.global_white)

    def with_account(self, account: Account) -> "AclRules":
        """These rules plus one account defined outside the file (the name
        server's broker credentials); an account of the same key in the file
        is replaced."""
        return attrs.evolve(self, accounts={**self.accounts, account.access_key: account})


def _text(value: object, where: str, required: bool = True) -> str:
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise AclConfigError(f"{where} is missing")
        return ""
    if isinstance(value, (dict, list)):
        raise AclConfigError(f"{where} must be text, not a {type(value).__name__}")
    return str(value).strip()  # YAML reads 12345678 as a number; Java's loader takes it as text


def _bool(value: object, where: str) -> bool:
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise AclConfigError(f"{where}: {value!r} is not true or false")
    return text == "true"


def _resource_perms(value: object, where: str, kind: str) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, list):
        raise AclConfigError(f"{where} must be a list of {kind}=PERM entries")
    out: dict[str, int] = {}
    for item in value:
        name, sep, perm = str(item).partition("=")
        if not sep or not name.strip() or "=" in perm:
            raise AclConfigError(f"{where}: {item!r} is not {kind}=PERM (for example {kind}A=SUB)")
        out[name.strip()] = parse_perm(perm, f"{where}: {item!r}")
    return out


def _account(obj: object, n: int) -> Account:
    where = f"accounts[{n}]"
    if not isinstance(obj, dict):
        raise AclConfigError(f"{where} must be a mapping with accessKey and secretKey")
    unknown = sorted(set(map(str, obj)) - _ACCOUNT_KEYS)
    if unknown:
        raise AclConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
    ak = _text(obj.get("accessKey"), f"{where}.accessKey")
    where = f"accounts[{n}] ({ak})"
    sk = _text(obj.get("secretKey"), f"{where}.secretKey")
    if len(ak) < MIN_KEY_LENGTH or len(sk) < MIN_KEY_LENGTH:
        raise AclConfigError(f"{where}: accessKey and secretKey must be at least {MIN_KEY_LENGTH} characters")
    topics = _resource_perms(obj.get("topicPerms"), f"{where}.topicPerms", "topic")
    groups = _resource_perms(obj.get("groupPerms"), f"{where}.groupPerms", "group")
    for name in [t for t in topics if t.startswith(RETRY_PREFIX)]:
        # A retry topic is its group (PlainAccessResource keys groups by it).
        groups.setdefault(name[len(RETRY_PREFIX):], topics.pop(name))
    return Account(
        access_key=ak, secret_key=sk,
        white=parse_address_pattern(obj.get("whiteRemoteAddress"), f"{where}.whiteRemoteAddress"),
        admin=_bool(obj.get("admin"), f"{where}.admin"),
        default_topic_perm=(parse_perm(obj["defaultTopicPerm"], f"{where}.defaultTopicPerm")
                            if obj.get("defaultTopicPerm") else DENY),
        default_group_perm=(parse_perm(obj["defaultGroupPerm"], f"{where}.defaultGroupPerm")
                            if obj.get("defaultGroupPerm") else DENY),
        topic_perms=topics, group_perms=groups)


def parse_plain_acl(data: object, source: str = "plain_acl.yml") -> AclRules:
    """A loaded YAML document (dict) to AclRules, or AclConfigError."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise AclConfigError(f"{source}: the document must be a mapping (globalWhiteRemoteAddresses, accounts)")
    unknown = sorted(set(map(str, data)) - _TOP_KEYS)
    if unknown:
        raise AclConfigError(f"{source}: unknown key(s) {', '.join(unknown)}")
    white = data.get("globalWhiteRemoteAddresses") or []
    if not isinstance(white, list):
        raise AclConfigError(f"{source}: globalWhiteRemoteAddresses must be a list")
    patterns = tuple(parse_address_pattern(w, f"{source}: globalWhiteRemoteAddresses[{i}]")
                     for i, w in enumerate(white))
    accounts_raw = data.get("accounts") or []
    if not isinstance(accounts_raw, list):
        raise AclConfigError(f"{source}: accounts must be a list")
    accounts: dict[str, Account] = {}
    for n, obj in enumerate(accounts_raw):
        try:
            account = _account(obj, n)
        except AclConfigError as e:
            raise AclConfigError(f"{source}: {e}") from None
        if account.access_key in accounts:
            raise AclConfigError(f"{source}: accessKey {account.access_key!r} appears twice")
        accounts[account.access_key] = account
    return AclRules(patterns, accounts, source)


def parse_plain_acl_text(text: str, source: str = "plain_acl.yml") -> AclRules:
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise AclConfigError(f"{source}: not valid YAML: {e}") from None
    return parse_plain_acl(data, source)


def load_plain_acl(path: str) -> AclRules:
    """Read and parse; AclConfigError for a missing, unreadable or bad file."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise AclConfigError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    return parse_plain_acl_text(text, path)
