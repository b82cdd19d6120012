# Owns the small metadata files next to a DLedger store (spec §5.4), all in
# Java-properties text (`key=value\n`):
#   currterm        currTerm, voteLeader         (Raft's durable vote)
#   checkpoint      endIndex, committedIndex     (DLedger 0.2.x-0.3.1.2)
#   ledgermq-base   the log's lower boundary (ledgermq only): the first
#                   index and its position, and the term and chainCrc of the
#                   entry just below it; written by reset_to, by retention and
#                   by a truncation of every entry (Raft asks for that term)
# Writes are atomic: write `<f>.tmp`, fsync it, rename it over `<f>`, fsync
# the directory.  Reads tolerate what DLedger's own safe-write routine can
# leave behind (a `<f>.bak` copy, the file itself missing) and fall back to
# defaults when neither exists.
import os

import attrs

from commitlog.atomicfile import fsync_dir, write_atomic
from commitlog.errors import CorruptStoreError

CURRTERM = "currterm"
CHECKPOINT = "checkpoint"
BASE = "ledgermq-base"


# --- Java properties -----------------------------------------------------

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _logical_lines(text: str):
    """Java Properties logical lines: comments dropped, backslash-newline
    continuations joined (leading whitespace of continuation lines dropped)."""
    pending = ""
    for raw in text.splitlines():
        line = raw.lstrip(" \t\f")
        if not pending and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending += line[:-1]
            continue
        yield pending + line
        pending = ""
    if pending:
        yield pending


def _unescape(s: str) -> str:
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            n = s[i + 1]
            if n == "u" and i + 6 <= len(s):
                out.append(chr(int(s[i + 2:i + 6], 16)))
                i += 6
                continue
            out.append(_ESCAPES.get(n, n))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def parse_properties(text: str) -> dict[str, str]:
    props = {}
    for line in _logical_lines(text):
        i, n = 0, len(line)
        while i < n and line[i] not in "=: \t\f":
            i += 2 if line[i] == "\\" else 1
        key = line[:i]
        while i < n and line[i] in " \t\f":
            i += 1
        if i < n and line[i] in "=:":
            i += 1
        while i < n and line[i] in " \t\f":
            i += 1
        props[_unescape(key)] = _unescape(line[i:])
    return props


def format_properties(props: dict[str, str]) -> str:
    """key=value lines, as DLedger's IOUtils.properties2String writes them."""
    lines = []
    for key, value in props.items():
        if any(c in key for c in "=:#!\n\r \t\\") or any(c in value for c in "\n\r\\"):
            raise ValueError(f"property {key!r}={value!r} needs escaping; not supported")
        lines.append(f"{key}={value}\n")
    return "".join(lines)


def read_properties(path: str) -> dict[str, str] | None:
    """The properties in `path`, else in `path.bak`; None when neither exists."""
    for candidate in (path, path + ".bak"):
        try:
            with open(candidate, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            continue
        try:
            return parse_properties(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            # A damaged file is a typed error naming it (found by the
            # recovery fuzzer: a flipped byte in `checkpoint` was a traceback).
            raise CorruptStoreError(candidate, e.start, "not a properties file (bytes that are not UTF-8)") from None
    return None


def write_properties(path: str, props: dict[str, str]) -> None:
    """Replace `path` atomically (tmp, fsync, rename, fsync directory)."""
    write_atomic(path, format_properties(props).encode("utf-8"))


def _long(props: dict[str, str], key: str, default: int, path: str) -> int:
    value = props.get(key, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise CorruptStoreError(path, 0, f"{key}={value!r} is not a number") from None


# --- currterm --------------------------------------------------------------

def read_currterm(directory: str) -> tuple[int, str | None]:
    """(currTerm, voteLeader); (0, None) when the file does not exist, as
    for a fresh DLedger member."""
    path = os.path.join(directory, CURRTERM)
    props = read_properties(path)
    if props is None:
        return 0, None
    return _long(props, "currTerm", 0, path), (props.get("voteLeader") or None)


def write_currterm(directory: str, term: int, vote_leader: str | None) -> None:
    write_properties(os.path.join(directory, CURRTERM),
                     {"currTerm": str(int(term)), "voteLeader": vote_leader or ""})


# --- checkpoint ------------------------------------------------------------

def read_checkpoint(directory: str) -> tuple[int, int]:
    """(endIndex, committedIndex); (-1, -1) when the file does not exist."""
    path = os.path.join(directory, CHECKPOINT)
    props = read_properties(path)
    if props is None:
        return -1, -1
    return _long(props, "endIndex", -1, path), _long(props, "committedIndex", -1, path)


def write_checkpoint(directory: str, end_index: int, committed_index: int) -> None:
    write_properties(os.path.join(directory, CHECKPOINT),
                     {"endIndex": str(int(end_index)), "committedIndex": str(int(committed_index))})


# --- ledgermq-base ---------------------------------------------------------

@attrs.frozen(kw_only=True)
class StoreBase:
    """The lower boundary of a log: its first entry is `index`, at data
    position `pos`; the entry before it (deleted, or only on the leader) had
    `prev_term` and `prev_chain_crc`."""

    index: int
    pos: int
    prev_term: int
    prev_chain_crc: int


def read_base(directory: str) -> StoreBase | None:
    path = os.path.join(directory, BASE)
    props = read_properties(path)
    if props is None:
        return None
    return StoreBase(index=_long(props, "beginIndex", 0, path), pos=_long(props, "beginPos", 0, path),
                     prev_term=_long(props, "prevTerm", -1, path), prev_chain_crc=_long(props, "prevChainCrc", 0, path))


def write_base(directory: str, base: StoreBase) -> None:
    write_properties(os.path.join(directory, BASE), {
        "beginIndex": str(base.index), "beginPos": str(base.pos),
        "prevTerm": str(base.prev_term), "prevChainCrc": str(base.prev_chain_crc & 0xFFFFFFFF)})


def remove_base(directory: str) -> None:
    for suffix in ("", ".bak", ".tmp"):
        try:
            os.unlink(os.path.join(directory, BASE + suffix))
        except FileNotFoundError:
            continue
    fsync_dir(directory)
