# Owns the replication configuration: a Java-properties reader (RocketMQ's
# broker.conf format) and ReplicationConfig, parsed from the broker.conf keys
# that RocketMQ-on-DLedger uses (spec §6.1-6.2), the DLedgerConfig names for
# the Raft knobs (§5.7) and a few ledgermq keys.
#
# Defaults are DLedger's except the timing ones: DLedger's 2 s heartbeat and
# 300-1000 ms vote interval give failovers of several seconds; ledgermq's
# 100 ms heartbeat and 300-600 ms election timeout make a failover on
# loopback finish in well under a second (one election timeout plus a vote
# round trip).
#
# Unknown keys never fail the parse: they come back as warnings (with a
# "did you mean" for likely typos), because a broker.conf carries many broker
# keys and a typo must not take a node down.  Keys that belong to the broker
# rather than to replication (BROKER_KEYS) are passed over silently.
#
# The peer secret is on by default where it matters: a group whose
# dLegerPeers reach beyond loopback does not validate without
# dLegerPeerSecret (or dLegerPeerSecretFile) unless dLegerPeerInsecure=true
# says the operator means it (ReplicationConfig.check_peer_secret).
import difflib
import enum
import ipaddress
import os
import re
from collections.abc import Iterator, Mapping

import attrs

from commitlog.entry import HEADER_SIZE, INDEX_UNIT_SIZE, MIN_BLANK_LEN
from commitlog.errors import CommitLogError
from commitlog.transport.base import TransportConfig
from commitlog.transport.framing import PeerAuth


@attrs.define(str=False)
class ConfigError(CommitLogError, ValueError):
    """A configuration value that cannot be used; names the key and value."""

    key: str
    value: object
    reason: str

    def __str__(self) -> str:
        if self.value is None:
            return f"{self.key}: {self.reason}"
        return f"{self.key}={self.value!r}: {self.reason}"


# --- Java properties --------------------------------------------------------

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_WS = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _continues(line: str) -> bool:
    """An odd number of trailing backslashes joins the next line."""
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _unescape(text: str, lineno: int) -> str:
    if "\\" not in text:
        return text
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch != "\\" or i + 1 == len(text):
            out.append(ch if ch != "\\" else "")
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u":
            digits = text[i + 2:i + 6]
            if len(digits) != 4 or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise ConfigError(f"<line {lineno}>", text, "malformed \\uxxxx escape")
            out.append(chr(int(digits, 16)))
            i += 6
        else:
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
    return "".join(out)


def iter_properties(text: str) -> Iterator[tuple[int, str, str]]:
    """(line number, key, value) for every entry, in file order, following
    java.util.Properties.load: `#`/`!` comment lines, `=`, `:` or whitespace
    as separator, backslash line continuation (the next line's leading
    whitespace dropped), backslash escapes including \\uXXXX.  Like Java,
    trailing whitespace of a value is kept; ReplicationConfig strips it."""
    lines = _LINE_BREAK.split(text)
    i = 0
    while i < len(lines):
        lineno = i + 1
        line = lines[i].lstrip(_WS)
        i += 1
        if not line or line[0] in "#!":
            continue
        while _continues(line):
            line = line[:-1]
            if i == len(lines):
                break
            line += lines[i].lstrip(_WS)
            i += 1
        k = 0
        while k < len(line) and line[k] not in "=:" + _WS:
            k += 2 if line[k] == "\\" else 1
        key, rest = line[:k], line[k:].lstrip(_WS)
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip(_WS)
        yield lineno, _unescape(key, lineno), _unescape(rest, lineno)


def parse_properties(text: str) -> dict[str, str]:
    """Properties text to a dict (a repeated key keeps its last value)."""
    return {key: value for _, key, value in iter_properties(text)}


def read_properties_text(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")  # what Java's Properties.load(InputStream) reads


def load_properties(path: str | os.PathLike) -> dict[str, str]:
    """Read a broker.conf-style file (UTF-8, or ISO-8859-1 as Java reads it)."""
    return parse_properties(read_properties_text(path))


# --- peers -------------------------------------------------------------------

_PEER_ID = re.compile(r"[A-Za-z0-9_.]+")
_HOST = re.compile(r"[A-Za-z0-9._-]+")


@attrs.frozen
class Peer:
    peer_id: str
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _parse_hostport(key: str, value: str, text: str, entry: str) -> tuple[str, int]:
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep or not host:
            raise ConfigError(key, value, f"peer {entry!r}: expected [ipv6]:port")
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            raise ConfigError(key, value, f"peer {entry!r}: address has no ':port'")
        if not host:
            raise ConfigError(key, value, f"peer {entry!r}: address has no host")
        if ":" in host:
            raise ConfigError(key, value, f"peer {entry!r}: IPv6 addresses need brackets, [::1]:port")
        if not _HOST.fullmatch(host):
            raise ConfigError(key, value, f"peer {entry!r}: bad host {host!r}")
    if not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(key, value, f"peer {entry!r}: port {port!r} is not in 1..65535")
    return host, int(port)


def parse_peers(text: str, key: str = "dLegerPeers") -> tuple[Peer, ...]:
    """`id-host:port;id-host:port...` (DLedger's peers string).  The id is
    everything before the first '-', so hosts may contain '-'.  Trailing ';'
    are allowed (Java's split drops them); empty entries elsewhere, bad
    ports, duplicate ids and duplicate addresses are errors."""
    entries = text.strip().split(";")
    while entries and not entries[-1].strip():
        entries.pop()
    if not entries:
        raise ConfigError(key, text, "no peers (expected id-host:port;id-host:port...)")
    peers: list[Peer] = []
    for n, raw in enumerate(entries, 1):
        entry = raw.strip()
        if not entry:
            raise ConfigError(key, text, f"entry {n} is empty")
        peer_id, sep, addr = entry.partition("-")
        if not sep:
            raise ConfigError(key, text, f"peer {entry!r} has no '-' between id and address "
                                         f"(expected id-host:port)")
        if not _PEER_ID.fullmatch(peer_id):
            raise ConfigError(key, text, f"peer {entry!r}: bad id {peer_id!r} "
                                         f"(letters, digits, '_' and '.' only)")
        host, port = _parse_hostport(key, text, addr, entry)
        peers.append(Peer(peer_id, host, port))
    seen_ids, seen_addrs = set(), set()
    for p in peers:
        if p.peer_id in seen_ids:
            raise ConfigError(key, text, f"peer id {p.peer_id!r} appears twice")
        if (p.host, p.port) in seen_addrs:
            raise ConfigError(key, text, f"address {p.address} appears twice")
        seen_ids.add(p.peer_id)
        seen_addrs.add((p.host, p.port))
    return tuple(peers)


def is_loopback(host: str) -> bool:
    """A peer host only this machine reaches: `localhost`, 127.0.0.0/8, ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def format_peers(peers) -> str:
    return ";".join(f"{p.peer_id}-{p.address}" for p in peers)


# --- the configuration --------------------------------------------------------

class FlushDiskType(enum.Enum):
    """RocketMQ's flushDiskType, the one flush setting (StoreConfig carries
    it to the store, whose owner acts on it).  SYNC_FLUSH: nothing is
    acknowledged before it was fdatasync'ed -- the replica shell syncs once
    per driver round (group commit), a standalone caller after its append.
    ASYNC_FLUSH: the background flusher syncs every flushIntervalMs."""

    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


@attrs.frozen
class ReplicationConfig:
    group: str
    peers: tuple[Peer, ...]
    self_id: str
    store_path_root_dir: str = attrs.field(factory=lambda: os.path.expanduser("~/store"))
    store_path_dledger_commitlog: str | None = None
    # Flush policy.  SYNC_FLUSH: an entry is fsynced before the node acks it.
    # ASYNC_FLUSH: fsync every flush_interval_ms (DLedger's flushFileInterval,
    # 10 ms; RocketMQ's own 500 ms default does not apply in DLedger mode).
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    flush_interval_ms: int = 10
    sync_flush_timeout_ms: int = 5000
    preferred_leader_id: str | None = None
    enable_batch_push: bool = False
    heartbeat_interval_ms: int = 100
    election_timeout_min_ms: int = 300
    election_timeout_max_ms: int = 600
    max_pending_requests: int = 10000
    max_wait_ack_time_ms: int = 2500
    # DLedger uses 1000; 300 resends a lost push before a follower could
    # time out on the leader.
    max_push_timeout_ms: int = 300
    mapped_file_size_commitlog: int = 1024 * 1024 * 1024
    mapped_file_size_entry_index: int = INDEX_UNIT_SIZE * 5 * 1024 * 1024
    file_reserved_time_hours: int = 72
    delete_when: tuple[int, ...] = (4,)
    disk_max_used_space_ratio: int = 75
    admin_port: int | None = None
    # dLegerJoin: this node joins an existing group (mqadmin addDLedgerPeer
    # first).  A store without a membership file then starts with no
    # configuration -- it neither campaigns nor votes -- and learns the
    # group's from the leader, instead of taking dLegerPeers as its voters.
    join: bool = False
    peer_send_queue_size: int = 1024
    peer_max_frame_size: int = 64 * 1024 * 1024
    # The group's shared secret (dLegerPeerSecret, or the content of
    # dLegerPeerSecretFile): when set, the peer port admits only nodes that
    # prove they hold it (transport/framing.py, "peer authentication").
    peer_secret: str | None = attrs.field(default=None, repr=False)
    # dLegerPeerInsecure: run a group whose peers listen beyond loopback
    # without a secret (refused otherwise: see check_peer_secret).
    peer_insecure: bool = False
    # The peer port's caps on connections still in their handshake
    # (TransportConfig.max_handshakes, max_handshakes_per_address).
    peer_max_handshakes: int = 64
    peer_max_handshakes_per_address: int = 16

    def __attrs_post_init__(self) -> None:
        ids = [p.peer_id for p in self.peers]
        if not self.group:
            raise ConfigError("dLegerGroup", self.group, "must not be empty")
        if not self.peers:
            raise ConfigError("dLegerPeers", None, "no peers")
        if self.self_id not in ids:
            raise ConfigError("dLegerSelfId", self.self_id,
                              f"not one of the peers in dLegerPeers ({', '.join(ids)})")
        if self.preferred_leader_id is not None and self.preferred_leader_id not in ids:
            raise ConfigError("preferredLeaderId", self.preferred_leader_id,
                              f"not one of the peers in dLegerPeers ({', '.join(ids)})")
        if not 0 < self.heartbeat_interval_ms < self.election_timeout_min_ms < self.election_timeout_max_ms:
            raise ConfigError(
                "heartBeatTimeIntervalMs/minVoteIntervalMs/maxVoteIntervalMs",
                (self.heartbeat_interval_ms, self.election_timeout_min_ms, self.election_timeout_max_ms),
                "need 0 < heartBeatTimeIntervalMs < minVoteIntervalMs < maxVoteIntervalMs")
        if self.mapped_file_size_commitlog < HEADER_SIZE + MIN_BLANK_LEN:
            raise ConfigError("mappedFileSizeCommitLog", self.mapped_file_size_commitlog,
                              f"must be at least {HEADER_SIZE + MIN_BLANK_LEN}")
        if (self.mapped_file_size_entry_index < INDEX_UNIT_SIZE
                or self.mapped_file_size_entry_index % INDEX_UNIT_SIZE):
            raise ConfigError("mappedFileSizeForEntryIndex", self.mapped_file_size_entry_index,
                              f"must be a positive multiple of {INDEX_UNIT_SIZE}")
        if not 10 <= self.disk_max_used_space_ratio <= 95:
            raise ConfigError("diskMaxUsedSpaceRatio", self.disk_max_used_space_ratio,
                              "must be in 10..95")
        self.check_peer_secret()

    def check_peer_secret(self) -> None:
        """A group's peer ports admit anyone who reaches them unless a
        secret is set: without one, every peer must listen on loopback
        (nothing else can reach it), or the operator says so with
        dLegerPeerInsecure=true."""
        if self.peer_secret or self.peer_insecure:
            return
        exposed = [p.address for p in self.peers if not is_loopback(p.host)]
        if exposed:
            raise ConfigError("dLegerPeerSecret", None,
                              f"not set, and dLegerPeers lists peers beyond loopback ({', '.join(exposed)}), whose "
                              f"peer ports would let anyone who reaches them vote, append and truncate: set "
                              f"dLegerPeerSecret (or dLegerPeerSecretFile), the same on every member, or "
                              f"dLegerPeerInsecure=true to run the group unauthenticated")

    # --- derived values --------------------------------------------------------

    @property
    def self_peer(self) -> Peer:
        return next(p for p in self.peers if p.peer_id == self.self_id)

    @property
    def peer_ids(self) -> tuple[str, ...]:
        return tuple(p.peer_id for p in self.peers)

    @property
    def other_peer_ids(self) -> tuple[str, ...]:
        return tuple(p.peer_id for p in self.peers if p.peer_id != self.self_id)

    @property
    def peer_addrs(self) -> dict[str, tuple[str, int]]:
        """Every member (self included) to (host, port): what
        open_peer_transport() takes."""
        return {p.peer_id: (p.host, p.port) for p in self.peers}

    @property
    def file_reserved_hours(self) -> int:
        """DLedger's fileReservedHours = broker fileReservedTime + 1 (§6.2)."""
        return self.file_reserved_time_hours + 1

    @property
    def disk_space_ratio(self) -> float:
        """DLedger's diskSpaceRatioToCheckExpired = diskMaxUsedSpaceRatio/100."""
        return self.disk_max_used_space_ratio / 100

    @property
    def dledger_dir(self) -> str:
        return os.path.join(self.store_path_root_dir, f"dledger-{self.self_id}")

    @property
    def data_dir(self) -> str:
        return self.store_path_dledger_commitlog or os.path.join(self.dledger_dir, "data")

    @property
    def index_dir(self) -> str:
        return os.path.join(self.dledger_dir, "index")

    def peer_auth(self) -> PeerAuth | None:
        return PeerAuth(self.peer_secret, self.group) if self.peer_secret else None

    def transport_config(self, **overrides) -> TransportConfig:
        return TransportConfig(**{
            "max_frame_size": self.peer_max_frame_size, "send_queue_messages": self.peer_send_queue_size,
            "max_handshakes": self.peer_max_handshakes,
            "max_handshakes_per_address": self.peer_max_handshakes_per_address, **overrides})

    # --- parsing -------------------------------------------------------------

    @classmethod
    def from_dict(cls, props: Mapping[str, object]) -> "tuple[ReplicationConfig, list[str]]":
        """Build from broker.conf keys.  Returns (config, warnings); raises
        ConfigError for a missing required key or an unusable value."""
        return _from_dict(props, [])

    @classmethod
    def from_properties(cls, text: str) -> "tuple[ReplicationConfig, list[str]]":
        warnings: list[str] = []
        props: dict[str, str] = {}
        first_line: dict[str, int] = {}
        for lineno, key, value in iter_properties(text):
            if key in props:
                warnings.append(f"line {lineno}: {key} set again (line {first_line[key]}); "
                                f"the last value wins")
            first_line.setdefault(key, lineno)
            props[key] = value
        return _from_dict(props, warnings)


def load_replication_config(path: str | os.PathLike) -> tuple[ReplicationConfig, list[str]]:
    return ReplicationConfig.from_properties(read_properties_text(path))


# --- value parsers -------------------------------------------------------------

def _text(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise ConfigError(key, value, f"expected text, got {type(value).__name__}")
    return value.strip()


def _nonempty(key: str, value: object) -> str:
    text = _text(key, value)
    if not text:
        raise ConfigError(key, value, "must not be empty")
    return text


def _int(lo: int, hi: int = 2**63 - 1):
    def parse(key: str, value: object) -> int:
        if isinstance(value, bool):
            raise ConfigError(key, value, "expected an integer, got a boolean")
        if isinstance(value, int):
            n = value
        else:
            text = _text(key, value)
            if not re.fullmatch(r"[+-]?[0-9]+", text):
                raise ConfigError(key, value, "expected an integer")
            n = int(text)
        if not lo <= n <= hi:
            raise ConfigError(key, value, f"must be in {lo}..{hi}")
        return n
    return parse


def _bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = _text(key, value).lower()
    if text not in ("true", "false"):
        raise ConfigError(key, value, "expected true or false")
    return text == "true"


def _flush_type(key: str, value: object) -> FlushDiskType:
    text = _text(key, value)
    try:
        return FlushDiskType(text)
    except ValueError:
        raise ConfigError(key, value, "expected ASYNC_FLUSH or SYNC_FLUSH") from None


def _secret_file(key: str, value: object) -> str:
    path = _nonempty(key, value)
    try:
        with open(path, encoding="utf-8") as f:
            secret = f.read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(key, value, f"cannot read the peer secret: {getattr(e, 'strerror', None) or e}") from None
    if len(secret) < MIN_PEER_SECRET:
        raise ConfigError(key, value, f"the peer secret must be at least {MIN_PEER_SECRET} characters")
    return secret


def _secret(key: str, value: object) -> str:
    secret = _nonempty(key, value)
    if len(secret) < MIN_PEER_SECRET:
        raise ConfigError(key, "<hidden>", f"the peer secret must be at least {MIN_PEER_SECRET} characters")
    return secret


MIN_PEER_SECRET = 16


def _peers(key: str, value: object) -> tuple[Peer, ...]:
    return parse_peers(_text(key, value), key)


def _hours(key: str, value: object) -> tuple[int, ...]:
    # RocketMQ's deleteWhen: "04", or several hours as "01;02;03".
    parts = [p.strip() for p in _text(key, value).split(";") if p.strip()]
    if not parts or not all(p.isascii() and p.isdigit() and int(p) < 24 for p in parts):
        raise ConfigError(key, value, "expected hours of the day 00..23, ';'-separated")
    return tuple(sorted({int(p) for p in parts}))


_JAVA_INT = 2**31 - 1
_MS = _int(1, _JAVA_INT)

# broker.conf key -> (ReplicationConfig field, parser)
KEYS = {
    "dLegerGroup": ("group", _nonempty),
    "dLegerPeers": ("peers", _peers),
    "dLegerSelfId": ("self_id", _nonempty),
    "storePathRootDir": ("store_path_root_dir", _nonempty),
    "storePathDLedgerCommitLog": ("store_path_dledger_commitlog", _nonempty),
    "flushDiskType": ("flush_disk_type", _flush_type),
    "flushIntervalCommitLog": ("flush_interval_ms", _MS),
    "syncFlushTimeout": ("sync_flush_timeout_ms", _MS),
    "preferredLeaderId": ("preferred_leader_id", _nonempty),
    "enableBatchPush": ("enable_batch_push", _bool),
    "heartBeatTimeIntervalMs": ("heartbeat_interval_ms", _MS),
    "minVoteIntervalMs": ("election_timeout_min_ms", _MS),
    "maxVoteIntervalMs": ("election_timeout_max_ms", _MS),
    "maxPendingRequestsNum": ("max_pending_requests", _int(1, _JAVA_INT)),
    "maxWaitAckTimeMs": ("max_wait_ack_time_ms", _MS),
    "maxPushTimeOutMs": ("max_push_timeout_ms", _MS),
    "mappedFileSizeCommitLog": ("mapped_file_size_commitlog", _int(1, _JAVA_INT)),
    "mappedFileSizeForEntryIndex": ("mapped_file_size_entry_index", _int(1, _JAVA_INT)),
    "fileReservedTime": ("file_reserved_time_hours", _int(0, _JAVA_INT - 1)),
    "deleteWhen": ("delete_when", _hours),
    "diskMaxUsedSpaceRatio": ("disk_max_used_space_ratio", _int(0, _JAVA_INT)),
    "adminPort": ("admin_port", _int(0, 65535)),
    "dLegerJoin": ("join", _bool),
    "peerSendQueueSize": ("peer_send_queue_size", _int(1, _JAVA_INT)),
    "peerMaxFrameSize": ("peer_max_frame_size", _int(1024, 0xFFFFFFFF)),
    "dLegerPeerSecret": ("peer_secret", _secret),
    "dLegerPeerSecretFile": ("peer_secret", _secret_file),
    "dLegerPeerInsecure": ("peer_insecure", _bool),
    "peerMaxHandshakes": ("peer_max_handshakes", _int(1, _JAVA_INT)),
    "peerMaxHandshakesPerAddress": ("peer_max_handshakes_per_address", _int(1, _JAVA_INT)),
}
REQUIRED = ("dLegerGroup", "dLegerPeers", "dLegerSelfId")
# Old RocketMQ spellings still found in broker.conf files.
ALIASES = {"mapedFileSizeCommitLog": "mappedFileSizeCommitLog"}

# Broker keys that are not about replication: left to the broker's own
# config, so they are neither parsed nor warned about here.
BROKER_KEYS = frozenset({
    "brokerClusterName", "brokerName", "brokerId", "brokerRole", "brokerIP1", "brokerIP2",
    "listenPort", "namesrvAddr", "storePathCommitLog", "storePathConsumeQueue",
    "storePathIndex", "sendMessageThreadPoolNums", "pullMessageThreadPoolNums",
    "autoCreateTopicEnable", "autoCreateSubscriptionGroup", "defaultTopicQueueNums",
    "mappedFileSizeConsumeQueue", "mapedFileSizeConsumeQueue", "maxMessageSize",
    "clientCloseSocketIfTimeout", "transientStorePoolEnable", "transferMsgByHeap",
    "cleanFileForciblyEnable", "brokerPermission", "flushCommitLogLeastPages",
    "flushConsumeQueueLeastPages", "useReentrantLockWhenPutMessage", "waitTimeMillsInSendQueue",
    "haListenPort", "enablePropertyFilter", "traceTopicEnable", "aclEnable",
})


def _from_dict(props: Mapping[str, object], warnings: list[str]) -> tuple[ReplicationConfig, list[str]]:
    values: dict[str, object] = {}
    for raw_key, value in props.items():
        key = ALIASES.get(raw_key, raw_key)
        if key != raw_key:
            warnings.append(f"{raw_key} is an old spelling of {key}")
        if key == "enableDLegerCommitLog":
            if not _bool(key, value):
                warnings.append("enableDLegerCommitLog=false ignored: "
                                "ledgermq always keeps its commitlog in DLedger format")
            continue
        if key in BROKER_KEYS:
            continue
        if key not in KEYS:
            hint = difflib.get_close_matches(key, KEYS, n=1, cutoff=0.8)
            warnings.append(f"unknown key {raw_key!r} ignored"
                            + (f" (did you mean {hint[0]!r}?)" if hint else ""))
            continue
        field, parse = KEYS[key]
        values[field] = parse(key, value)
    for key in REQUIRED:
        if KEYS[key][0] not in values:
            raise ConfigError(key, None, "required but not set")
    ratio = values.get("disk_max_used_space_ratio")
    if isinstance(ratio, int) and not 10 <= ratio <= 95:
        # RocketMQ clamps diskMaxUsedSpaceRatio to 10..95 silently; we clamp
        # too (old configs keep working) but say so.
        values["disk_max_used_space_ratio"] = min(95, max(10, ratio))
        warnings.append(f"diskMaxUsedSpaceRatio={ratio} clamped to "
                        f"{values['disk_max_used_space_ratio']} (allowed 10..95)")
    self_id = values["self_id"]
    if not re.fullmatch(r".[0-9]+", str(self_id)):
        warnings.append(f"dLegerSelfId={self_id!r} is not of the form n<digits>; RocketMQ derives "
                        f"a follower's brokerId from the digits after the first character")
    return ReplicationConfig(**values), warnings


# The value parsers are shared with broker/config.py (broker.conf holds both
# the replication keys and the broker's own).
parse_text, parse_nonempty, parse_int, parse_bool = _text, _nonempty, _int, _bool
