# Owns the membership file next to a DLedger store and the recovery of a
# log's configuration history when the node starts:
#
#   ${storePathRootDir}/dledger-<selfId>/ledgermq-members   (ledgermq only)
#
#     configCount=2
#     config.0.index=-1              -1: the bootstrap configuration (dLegerPeers)
#     config.0.term=0
#     config.0.voters=n0,n1,n2
#     config.0.learners=
#     config.0.addresses=n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913
#     config.1.index=1041            the CONFIG_CHANGE entry (magic 3) at 1041
#     ...
#
# Java-properties text written atomically, like currterm and checkpoint.  A
# store without the file (a stock DLedger store, one never reconfigured) has
# the bootstrap configuration: voters = dLegerPeers.  A node started with dLegerJoin=true and no file knows no
# configuration: it campaigns for nothing and votes for nobody until the
# leader's log (or its retention reset) tells it who is in the group.
#
# The file is a cache of the log, written BEFORE the log changes in the same
# Ready (commitlog/raft/state.py), so it can name an entry the log lost in a
# crash but never lack one the log holds -- except after a crash between
# rewriting it for a truncation and the truncation itself, which leaves
# configuration entries in the log's uncommitted tail that the file no
# longer names.  recover() therefore (1) drops file entries the log does not
# hold (wrong term, beyond the end, not a configuration entry) and (2) reads
# the uncommitted tail for configuration entries the file lacks.  Entries
# below the log's begin cannot be checked and are kept: they are committed,
# the group's own history.
import os
import struct
from collections.abc import Sequence

from commitlog.config import Peer, format_peers, parse_peers
from commitlog.entry import HEADER_SIZE, OFF_SIZE, decode_entry
from commitlog.errors import CorruptStoreError, IndexBelowBeginError, IndexBeyondEndError
from commitlog.metafiles import read_properties, write_properties
from commitlog.raft.membership import ConfigEntry, Membership, MembershipLog, is_config_entry

MEMBERS = "ledgermq-members"
_SCAN_BATCH_BYTES = 4 << 20
_I32 = struct.Struct(">i")


def _peers_text(m: Membership) -> str:
    peers = []
    for nid, addr in m.addresses:
        host, _, port = addr.rpartition(":")
        if host and port.isdigit():      # (tests run members with made-up addresses)
            peers.append(Peer(nid, host.strip("[]"), int(port)))
    return format_peers(peers)


def write_members(directory: str, entries: Sequence[ConfigEntry]) -> None:
    props = {"configCount": str(len(entries))}
    for i, e in enumerate(entries):
        m = e.membership
        props.update({f"config.{i}.index": str(e.index), f"config.{i}.term": str(e.term),
                      f"config.{i}.voters": ",".join(m.voters), f"config.{i}.learners": ",".join(m.learners),
                      f"config.{i}.addresses": _peers_text(m)})
    write_properties(os.path.join(directory, MEMBERS), props)


def read_members(directory: str) -> list[ConfigEntry] | None:
    """The configuration history in the file, oldest first; None without one."""
    path = os.path.join(directory, MEMBERS)
    props = read_properties(path)
    if props is None:
        return None
    try:
        out = []
        for i in range(int(props["configCount"])):
            addrs = props.get(f"config.{i}.addresses", "").strip()
            peers = parse_peers(addrs, f"config.{i}.addresses") if addrs else ()
            voters = [x for x in props.get(f"config.{i}.voters", "").split(",") if x]
            learners = [x for x in props.get(f"config.{i}.learners", "").split(",") if x]
            out.append(ConfigEntry(int(props[f"config.{i}.index"]), int(props[f"config.{i}.term"]),
                                   Membership(voters, learners, {p.peer_id: p.address for p in peers})))
    except (KeyError, ValueError) as e:
        raise CorruptStoreError(path, 0, f"unreadable membership file: {e}") from None
    if not out:
        raise CorruptStoreError(path, 0, "membership file lists no configuration")
    return out


def _entry_at(log, index: int):
    batch = log.read_batch(index, 1 << 30, 1)
    return batch, bytes(memoryview(batch.raw)[HEADER_SIZE:])


def _checked(log, e: ConfigEntry) -> ConfigEntry | None:
    """`e` as the log holds it (same index and term: the same entry, by log
    matching; its membership read from the log), or None when the log does
    not hold it."""
    if e.index < max(log.begin_index, 0):
        return e             # deleted by retention: committed, cannot be checked
    if e.index > log.end_index:
        return None          # written to the file, lost from the log in a crash
    try:
        batch, body = _entry_at(log, e.index)
    except (IndexBelowBeginError, IndexBeyondEndError):
        return None
    if batch.last_term != e.term or not is_config_entry(batch.raw):
        return None
    try:
        return ConfigEntry(e.index, e.term, Membership.decode(body))
    except ValueError:
        return None


def config_entries(log, first: int, last: int):
    """(index, term, Membership) of every configuration entry in
    [first, last] (reads and walks the entries: start-up only)."""
    i = max(first, log.begin_index, 0)
    while i <= last:
        batch = log.read_batch(i, _SCAN_BATCH_BYTES, last - i + 1)
        raw, off = batch.raw, 0
        for _ in range(batch.count):
            if is_config_entry(raw, off):
                e = decode_entry(raw, off)
                yield e.index, e.term, Membership.decode(e.body)
            off += _I32.unpack_from(raw, off + OFF_SIZE)[0]
        i = batch.last_index + 1


def recover(entries: Sequence[ConfigEntry], log) -> list[ConfigEntry]:
    """The configuration history to start with, from the file's entries and
    the (recovered) log; see the module comment."""
    kept = [entries[0]] + [c for c in (_checked(log, e) for e in entries[1:]) if c is not None]
    known = {e.index for e in kept}
    tail_from = max(log.committed_index + 1, 0)
    for index, term, m in config_entries(log, tail_from, log.end_index):
        if index not in known:
            kept.append(ConfigEntry(index, term, m))
    return sorted(kept, key=lambda e: e.index)


def load_membership(directory: str, log, *, voters: Sequence[str], addresses: dict[str, str],
                    joining: bool = False) -> MembershipLog:
    """The node's MembershipLog at start-up: the file's history checked
    against the log, or the bootstrap configuration (dLegerPeers) for a store
    without one -- no configuration at all for a joining node."""
    entries = read_members(directory)
    if entries is None:
        base = Membership() if joining else Membership(tuple(voters), (), addresses)
        entries = [ConfigEntry(-1, 0, base)]
    return MembershipLog(recover(entries, log))
