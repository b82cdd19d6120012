# Owns group membership as the Raft core sees it (etcd's confchange and tracker, in DLedger terms): the
# Membership value -- voters, learners and every member's peer address --, its encoding as the body of
# a CONFIG_CHANGE entry (magic 3), the single-server changes with the rules that keep two
# configurations' majorities overlapping, and MembershipLog, the configurations a log holds plus the
# one in force below its first entry.
#
# The rules (Raft dissertation §4.1-4.3 and the 2015 single-server fix), enforced by
# RaftCore.propose_conf_change and the roles:
#   * A configuration is an entry in the log and takes effect on a node as soon as the node APPENDS
#     it, committed or not: every node uses the latest configuration in its log, and the previous one
#     if that entry is truncated (MembershipLog.truncate).  On append, not on commit, because the
#     leader must count the new majority for the very entry that introduces it -- else a removed
#     voter's ack could commit its own removal.
#   * One server changes at a time, so the old and the new majority always share a node.  A leader
#     proposes a change only when the latest configuration in its log is committed ...
#   * ... and only once it has committed an entry of its own term (its NOOP): else a new leader may
#     not see a deposed leader's uncommitted change, and both could commit with majorities that do
#     not overlap (Ongaro, raft-dev, 2015).
#   * Learners receive the log but count in no quorum (commit, election, check-quorum) and never
#     campaign; a learner is promoted only within max_promote_lag entries of the leader's log.
#   * The leader is never removed by a change: hand leadership over first, so a leader always belongs
#     to the majority it counts.
#
# Entry body: b"LMQCONF1" + compact JSON {"addresses": {id: "host:port"}, "learners": [...], "voters":
# [...]}.  The prefix keeps it from ever looking like a RocketMQ message (whose magic sits at +4), so
# the dispatcher and the metadata applier pass it by like a NOOP.
import enum
import json

import attrs

from commitlog.errors import CommitLogError

BODY_PREFIX = b"LMQCONF1"


class ChangeKind(enum.Enum):
    ADD_LEARNER = "addLearner"
    PROMOTE = "promote"
    REMOVE = "remove"


@attrs.define(str=False)
class MembershipChangeError(CommitLogError):
    """A membership change the leader refuses.  `code` says why:
    INVALID (not a valid change of this configuration), PENDING (the previous
    change is not committed yet), NOT_READY (the leader has not committed an
    entry of its term yet), FALL_BEHIND (the learner to promote is not caught
    up), IS_LEADER (remove the leader: transfer leadership first),
    TRANSFERRING (a leadership transfer is under way).  PENDING, NOT_READY,
    FALL_BEHIND and TRANSFERRING pass with time (`retryable`)."""

    code: str
    reason: str

    RETRYABLE = frozenset({"PENDING", "NOT_READY", "FALL_BEHIND", "TRANSFERRING"})

    @property
    def retryable(self) -> bool:
        return self.code in self.RETRYABLE

    def __str__(self) -> str:
        return f"membership change refused ({self.code}): {self.reason}"


@attrs.frozen
class ConfChange:
    """One single-server change; `address` (host:port of the peer's DLedger
    port) is needed to add a learner."""

    kind: ChangeKind
    node_id: str
    address: str | None = None

    def describe(self) -> str:
        where = f" at {self.address}" if self.address else ""
        return f"{self.kind.value} {self.node_id}{where}"


def _addresses(value) -> tuple[tuple[str, str], ...]:
    items = value.items() if isinstance(value, dict) else value
    return tuple(sorted((str(k), str(v)) for k, v in items))


@attrs.frozen
class Membership:
    """Voters and learners of a group, with each member's peer address
    (host:port; may be empty for a bootstrap member whose address only its
    broker.conf knows)."""

    voters: tuple[str, ...] = attrs.field(converter=tuple, default=())
    learners: tuple[str, ...] = attrs.field(converter=tuple, default=())
    addresses: tuple[tuple[str, str], ...] = attrs.field(converter=_addresses, default=())

    def __attrs_post_init__(self) -> None:
        members = self.voters + self.learners
        if len(set(members)) != len(members):
            raise ValueError(f"a member is listed twice: voters {self.voters}, learners {self.learners}")

    @property
    def members(self) -> tuple[str, ...]:
        return self.voters + self.learners

    @property
    def address_map(self) -> dict[str, str]:
        return dict(self.addresses)

    @property
    def empty(self) -> bool:
        return not self.voters and not self.learners

    def is_voter(self, node_id: str) -> bool:
        return node_id in self.voters

    def is_member(self, node_id: str) -> bool:
        return node_id in self.voters or node_id in self.learners

    def apply(self, change: ConfChange) -> "Membership":
        """The configuration after `change`; MembershipChangeError(INVALID)
        for a change that does not fit this configuration."""
        nid = change.node_id
        addrs = self.address_map
        if change.kind is ChangeKind.ADD_LEARNER:
            if self.is_member(nid):
                raise MembershipChangeError("INVALID", f"{nid} is already a {self.role_of(nid)}")
            if not change.address or ":" not in change.address:
                raise MembershipChangeError("INVALID", f"adding {nid} needs its peer address host:port")
            taken = next((m for m, a in addrs.items() if a == change.address), None)
            if taken is not None:
                raise MembershipChangeError("INVALID", f"address {change.address} belongs to {taken}")
            addrs[nid] = change.address
            return Membership(self.voters, self.learners + (nid,), addrs)
        if change.kind is ChangeKind.PROMOTE:
            if nid not in self.learners:
                what = "a voter already" if self.is_voter(nid) else "not a member"
                raise MembershipChangeError("INVALID", f"{nid} is {what}; only a learner can be promoted")
            return Membership(self.voters + (nid,), tuple(x for x in self.learners if x != nid), addrs)
        if not self.is_member(nid):
            raise MembershipChangeError("INVALID", f"{nid} is not a member (voters {', '.join(self.voters)}"
                                                   f"; learners {', '.join(self.learners) or '-'})")
        if self.voters == (nid,):
            raise MembershipChangeError("INVALID", f"{nid} is the last voter")
        addrs.pop(nid, None)
        return Membership(tuple(x for x in self.voters if x != nid), tuple(x for x in self.learners if x != nid),
                          addrs)

    def role_of(self, node_id: str) -> str | None:
        if node_id in self.voters:
            return "voter"
        if node_id in self.learners:
            return "learner"
        return None

    # --- the CONFIG_CHANGE entry body ------------------------------------------

    def encode(self) -> bytes:
        doc = {"addresses": dict(self.addresses), "learners": list(self.learners), "voters": list(self.voters)}
        return BODY_PREFIX + json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, body) -> "Membership":
        body = bytes(body)
        if not body.startswith(BODY_PREFIX):
            raise ValueError("not a ledgermq configuration entry body")
        try:
            doc = json.loads(body[len(BODY_PREFIX):])
            voters, learners = doc["voters"], doc.get("learners", [])
            addresses = doc.get("addresses", {})
            if not (isinstance(voters, list) and isinstance(learners, list) and isinstance(addresses, dict)
                    and all(isinstance(x, str) and x for x in voters + learners)
                    and all(isinstance(v, str) for v in addresses.values())):
                raise TypeError("voters and learners must be lists of ids, addresses an object of strings")
            return cls(tuple(voters), tuple(learners), addresses)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            raise ValueError(f"malformed configuration entry body: {e}") from None

    def describe(self) -> str:
        return f"voters {','.join(self.voters) or '-'} learners {','.join(self.learners) or '-'}"


@attrs.frozen
class ConfigEntry:
    """A configuration and the log entry that carries it (index -1, term 0
    for the bootstrap configuration from dLegerPeers, which no entry holds)."""

    index: int
    term: int
    membership: Membership


class MembershipLog:
    """The configurations of one log, oldest first: the one in force below
    the log's first entry (or the bootstrap one), then every CONFIG_CHANGE
    entry the log holds.  `latest` is the node's configuration.  What is
    kept is what the core may still need: every entry at or above the floor
    (the log's begin, or commit + 1 if lower) -- for truncation, for the
    leader's batch framing and for resets -- and the last one below it."""

    def __init__(self, entries) -> None:
        entries = sorted(entries, key=lambda e: e.index)
        if not entries:
            raise ValueError("a membership log needs at least its base configuration")
        self.entries: list[ConfigEntry] = entries

    @classmethod
    def bootstrap(cls, voters, addresses=()) -> "MembershipLog":
        return cls([ConfigEntry(-1, 0, Membership(tuple(voters), (), addresses))])

    @property
    def latest(self) -> Membership:
        return self.entries[-1].membership

    @property
    def latest_entry(self) -> ConfigEntry:
        return self.entries[-1]

    @property
    def latest_index(self) -> int:
        return self.entries[-1].index

    def snapshot(self) -> tuple[ConfigEntry, ...]:
        return tuple(self.entries)

    def append(self, index: int, term: int, membership: Membership) -> None:
        if index <= self.entries[-1].index:
            raise ValueError(f"configuration entry {index} does not follow {self.entries[-1].index}")
        self.entries.append(ConfigEntry(index, term, membership))

    def put(self, index: int, term: int, membership: Membership) -> None:
        """The log now holds this configuration entry at `index` and nothing
        after it: replaces whatever was known at or above `index` (a
        retransmit, or a log that lost entries in a crash and gets them back)."""
        self.entries = [e for e in self.entries if e.index < index] + [ConfigEntry(index, term, membership)]

    def truncate(self, cut: int) -> bool:
        """Forget configurations at `cut` and later (their entries are being
        truncated); the base entry always stays.  True if the latest changed."""
        keep = [e for e in self.entries if e.index < cut] or self.entries[:1]
        changed = len(keep) != len(self.entries)
        self.entries = keep
        return changed

    def reset(self, entry: ConfigEntry) -> None:
        """The log restarts after `entry` (a retention reset): its
        configuration is the base, nothing above is known."""
        self.entries = [entry]

    def at(self, index: int) -> ConfigEntry:
        """The configuration in force at `index` (the last entry <= index)."""
        best = self.entries[0]
        for e in self.entries:
            if e.index > index:
                break
            best = e
        return best

    def next_index_from(self, index: int) -> int | None:
        """The first configuration entry at or after `index`, if any (the
        leader ships configuration entries in batches of their own)."""
        for e in self.entries:
            if e.index >= index:
                return e.index
        return None

    def members_since(self, committed: int) -> set[str]:
        """Every member of every configuration not yet superseded by a
        committed one: whom the leader replicates to (a removed peer keeps
        receiving the log until its removal is committed, so it learns it)."""
        out: set[str] = set()
        entries = self.entries
        for i, e in enumerate(entries):
            if i + 1 == len(entries) or entries[i + 1].index > committed:
                out.update(e.membership.members)
        return out

    def compact(self, floor: int) -> bool:
        """Drop configurations superseded below `floor`; True if any went."""
        i = 0
        while i + 1 < len(self.entries) and self.entries[i + 1].index < floor:
            i += 1
        if i:
            self.entries = self.entries[i:]
        return bool(i)

    def __repr__(self) -> str:
        return "MembershipLog(" + ", ".join(f"{e.index}@{e.term}: {e.membership.describe()}"
                                           for e in self.entries) + ")"


def is_config_entry(raw, offset: int = 0) -> bool:
    """Whether the encoded DLedger entry at `offset` has magic 3 (a big-endian
    i32: three zero bytes, then 3)."""
    return raw[offset + 3] == 3 and raw[offset] == 0 and raw[offset + 1] == 0 and raw[offset + 2] == 0
