# Owns the byte layout of DLedger entries, index units and the data-file blank
# filler (spec §5.1-5.3), plus ledgermq's body/chain CRCs.
#
# Entry:  i32 magic | i32 size | i64 index | i64 term | i64 pos | i32 channel
#         | u32 chainCrc | u32 bodyCrc | i32 bodySize | body      (48 + N bytes)
# Index:  i32 magic | i64 pos | i32 size | i64 index | i64 term  (32 bytes)
# Blank:  i32 -1 | i32 remaining | zeros to the end of the segment
#
# CRC rule (stock DLedger never fills chainCrc/bodyCrc, so both are 0 there):
#   bodyCrc  = zlib CRC32 of the body (as stored, after append hooks ran).
#   chainCrc = CRC32 over  u32 prevChainCrc | u32 bodyCrc | i64 index | i64 term
#              (big-endian), where prevChainCrc is the previous entry's
#              chainCrc (0 before the first entry of a log, and 0 after a stock
#              entry).  Equal chainCrc at index i on two replicas means equal
#              histories up to i, so replicas compare in O(1).
#   An entry whose chainCrc AND bodyCrc are both 0 is "written without CRCs"
#   and is accepted unchecked.  Once a scan has seen an entry carrying a CRC,
#   every later entry in that scan must verify (CRC mode is sticky): a
#   stock-format entry cannot follow a ledgermq entry in a real log, so a
#   zeroed pair there is corruption.  The rare computed chainCrc of exactly 0
#   verifies fine under this rule because its recomputation is also 0.
import struct

import attrs

from native.hashing import crc32

HEADER_SIZE = 48
BODY_OFFSET = 48
POS_OFFSET = 24
INDEX_UNIT_SIZE = 32
MIN_BLANK_LEN = 8

MAGIC_NORMAL = 1
MAGIC_NOOP = 2
MAGIC_CONFIG_CHANGE = 3  # DLedger HEAD reserves it; ledgermq writes membership changes with it (raft/membership.py)
VALID_MAGICS = frozenset({MAGIC_NORMAL, MAGIC_NOOP, MAGIC_CONFIG_CHANGE})
BLANK_MAGIC = -1

HEADER = struct.Struct(">iiqqqiIIi")
INDEX_UNIT = struct.Struct(">iqiqq")
BLANK = struct.Struct(">ii")
_CHAIN = struct.Struct(">IIqq")

# Offsets of single header fields, for in-place patching and peeking.
OFF_MAGIC, OFF_SIZE, OFF_INDEX, OFF_TERM, OFF_POS = 0, 4, 8, 16, 24
OFF_CHANNEL, OFF_CHAIN_CRC, OFF_BODY_CRC, OFF_BODY_SIZE = 32, 36, 40, 44


class EntryFormatError(ValueError):
    """Bytes that are not a well-formed entry, index unit or blank filler."""


def chain_crc(prev_chain_crc: int, body_crc: int, index: int, term: int) -> int:
    return crc32(_CHAIN.pack(prev_chain_crc & 0xFFFFFFFF, body_crc & 0xFFFFFFFF, index, term))


@attrs.frozen
class EntryHeader:
    magic: int
    size: int
    index: int
    term: int
    pos: int
    channel: int
    chain_crc: int
    body_crc: int
    body_size: int

    @property
    def has_crc(self) -> bool:
        return self.chain_crc != 0 or self.body_crc != 0

    def pack(self) -> bytes:
        return HEADER.pack(self.magic, self.size, self.index, self.term, self.pos,
                           self.channel, self.chain_crc, self.body_crc, self.body_size)


@attrs.frozen
class Entry:
    """A decoded DLedger entry; `body` is bytes or a memoryview into a segment."""

    magic: int
    index: int
    term: int
    pos: int
    body: bytes
    chain_crc: int = 0
    body_crc: int = 0
    channel: int = 0

    @property
    def size(self) -> int:
        return HEADER_SIZE + len(self.body)

    @property
    def header(self) -> EntryHeader:
        return EntryHeader(self.magic, self.size, self.index, self.term, self.pos,
                           self.channel, self.chain_crc, self.body_crc, len(self.body))

    def encode(self) -> bytes:
        return self.header.pack() + bytes(self.body)

    def index_unit(self) -> bytes:
        return INDEX_UNIT.pack(self.magic, self.pos, self.size, self.index, self.term)


def make_entry(body, *, index: int, term: int, pos: int, prev_chain_crc: int,
               magic: int = MAGIC_NORMAL, with_crc: bool = True) -> Entry:
    """Build an entry the way ledgermq writes it (CRCs on) or stock DLedger
    does (with_crc=False: both CRC fields 0)."""
    body = bytes(body)
    if not with_crc:
        return Entry(magic, index, term, pos, body)
    bcrc = crc32(body)
    return Entry(magic, index, term, pos, body, chain_crc(prev_chain_crc, bcrc, index, term), bcrc)


def decode_header(buf, offset: int = 0) -> EntryHeader:
    if len(buf) - offset < HEADER_SIZE:
        raise EntryFormatError(f"short entry header at +{offset}: {len(buf) - offset} bytes")
    return EntryHeader(*HEADER.unpack_from(buf, offset))


def check_header(h: EntryHeader) -> str | None:
    """The structural checks DLedger recovery applies; returns a reason or None."""
    if h.magic not in VALID_MAGICS:
        return f"bad magic {h.magic}"
    if h.size < HEADER_SIZE:
        # DLedger only demands size > 44, which admits negative body sizes.
        return f"bad size {h.size}"
    if h.body_size + HEADER_SIZE != h.size:
        return f"bodySize {h.body_size} + 48 != size {h.size}"
    if h.channel != 0:
        return f"bad channel {h.channel}"
    return None


def decode_entry(buf, offset: int = 0) -> Entry:
    h = decode_header(buf, offset)
    reason = check_header(h)
    if reason:
        raise EntryFormatError(f"{reason} at +{offset}")
    end = offset + h.size
    if end > len(buf):
        raise EntryFormatError(f"entry at +{offset} runs past the buffer ({h.size} bytes)")
    body = bytes(buf[offset + HEADER_SIZE:end])
    return Entry(h.magic, h.index, h.term, h.pos, body, h.chain_crc, h.body_crc, h.channel)


def verify_crc(h: EntryHeader, body, prev_chain_crc: int, crc_mode: bool) -> tuple[str | None, bool]:
    """Check CRCs per the rule above.  Returns (reason-or-None, new crc_mode)."""
    if not h.has_crc:
        return ("entry without CRCs after CRC-bearing entries" if crc_mode else None), crc_mode
    bcrc = crc32(body)
    if bcrc != h.body_crc:
        return f"bodyCrc mismatch (stored {h.body_crc:#010x}, computed {bcrc:#010x})", True
    ccrc = chain_crc(prev_chain_crc, bcrc, h.index, h.term)
    if ccrc != h.chain_crc:
        return f"chainCrc mismatch (stored {h.chain_crc:#010x}, computed {ccrc:#010x})", True
    return None, True


@attrs.frozen
class IndexUnit:
    magic: int
    pos: int
    size: int
    index: int
    term: int

    def pack(self) -> bytes:
        return INDEX_UNIT.pack(self.magic, self.pos, self.size, self.index, self.term)


def decode_index_unit(buf, offset: int = 0) -> IndexUnit:
    if len(buf) - offset < INDEX_UNIT_SIZE:
        raise EntryFormatError(f"short index unit at +{offset}")
    return IndexUnit(*INDEX_UNIT.unpack_from(buf, offset))


def encode_blank(remaining: int) -> bytes:
    """The blank filler header that closes a data segment with `remaining`
    bytes left; the rest of the segment stays zero (DLedger writes the zeros
    explicitly, the bytes on disk are the same)."""
    if remaining < MIN_BLANK_LEN:
        raise EntryFormatError(f"blank filler needs >= {MIN_BLANK_LEN} bytes, got {remaining}")
    return BLANK.pack(BLANK_MAGIC, remaining)


@attrs.frozen
class EntryBatch:
    """Contiguous entries as shipped between replicas: the encoded bytes back
    to back (blank fillers are not shipped; the follower re-creates them from
    each entry's pos) plus the term of every index as runs, so Raft's log
    matching can run without one Python object per entry."""

    first_index: int
    count: int
    # (first index carrying this term, term), ascending by index.
    term_runs: tuple[tuple[int, int], ...]
    raw: bytes

    @property
    def last_index(self) -> int:
        return self.first_index + self.count - 1

    @property
    def last_term(self) -> int:
        return self.term_runs[-1][1] if self.term_runs else -1

    def term_at(self, index: int) -> int:
        if not self.first_index <= index <= self.last_index:
            raise IndexError(f"index {index} outside batch [{self.first_index}, {self.last_index}]")
        term = self.term_runs[0][1]
        for start, t in self.term_runs:
            if start > index:
                break
            term = t
        return term


def batch_from_entries(entries: "list[Entry]") -> EntryBatch:
    """Build a batch from decoded entries (tests and slow paths)."""
    if not entries:
        raise ValueError("empty batch")
    runs: list[tuple[int, int]] = []
    for e in entries:
        if not runs or runs[-1][1] != e.term:
            runs.append((e.index, e.term))
    return EntryBatch(entries[0].index, len(entries), tuple(runs), b"".join(e.encode() for e in entries))


def iter_batch(batch: EntryBatch):
    """Decode every entry of a batch (tests and slow paths)."""
    off = 0
    for _ in range(batch.count):
        e = decode_entry(batch.raw, off)
        off += e.size
        yield e
