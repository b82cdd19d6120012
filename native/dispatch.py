# Owns the Python face of the dispatch helpers (native/src/dispatch.c): the
# commitlog scanner, grouping by queue, ConsumeQueue unit packing and
# IndexFile item insertion -- and their pure-Python twins.
#
# Both backends share one record layout: the C struct lmq_disp_rec (96
# bytes, native byte order, no padding), which the Python twin writes with
# `struct` into a bytearray.  So the oracle comparison is plain bytes
# equality of the record arrays, and of the files written from them.
# Callers take a backend (`default_backend()`, NATIVE, PYTHON) and never
# touch `lib` directly.
import struct
import zlib
from array import array
from collections.abc import Sequence

import attrs

from native import NATIVE_LOADED, ffi, lib

MODE_DLEDGER = 0
MODE_PLAIN = 1
SCAN_CHECK_CRC = 1

STOP_END, STOP_BLANK, STOP_FULL, STOP_PARTIAL, STOP_ZERO, STOP_CORRUPT = range(6)
STOP_NAMES = ("end", "blank", "full", "partial", "zero", "corrupt")

REC_NO_CQ = 1
REC_NO_INDEX = 2
REC_BAD = 4
REC_PHY_MISMATCH = 8
REC_CRC_BAD = 16
REC_DELAY = 32

ERR_ENTRY_MAGIC, ERR_ENTRY_SIZE, ERR_CHANNEL, ERR_POS, ERR_INDEX = 1, 2, 3, 4, 5
ERR_RECORD_MAGIC, ERR_RECORD, ERR_TOO_LARGE = 6, 7, 8
ERR_TEXT = {ERR_ENTRY_MAGIC: "bad entry magic", ERR_ENTRY_SIZE: "bad entry size/bodySize",
            ERR_CHANNEL: "non-zero channel", ERR_POS: "entry pos differs from its position",
            ERR_INDEX: "entry index not contiguous", ERR_RECORD_MAGIC: "bad record magic",
            ERR_RECORD: "malformed record", ERR_TOO_LARGE: "buffer larger than 4 GiB"}

BAD_TOTALSIZE, BAD_HOSTS, BAD_BODYLEN, BAD_TOPICLEN, BAD_PROPSLEN, BAD_LENGTH, BAD_DELAY = range(1, 8)
BAD_TEXT = {BAD_TOTALSIZE: "TOTALSIZE differs from the entry body size or is too small",
            BAD_HOSTS: "record too short for its hosts", BAD_BODYLEN: "BODYLEN does not fit",
            BAD_TOPICLEN: "TOPICLEN does not fit", BAD_PROPSLEN: "PROPERTIESLEN does not fit",
            BAD_LENGTH: "TOTALSIZE differs from the computed length",
            BAD_DELAY: "DELAY property of SCHEDULE_TOPIC_XXXX is not an int"}

REC = struct.Struct("=6q4i6I2i")
REC_SIZE = REC.size  # 96
UNIT = struct.Struct(">qiq")
_I64BE = struct.Struct(">q")
UNIT_SIZE = 20

_MAGIC_V1, _MAGIC_V2, _BLANK = -626843481, -626843477, -875286124
_MIN_RECORD = 91
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


@attrs.frozen
class DispatchRecord:
    """One lmq_disp_rec as Python values (tests and slow paths only)."""

    entry_index: int
    entry_pos: int
    phy_offset: int
    queue_offset: int
    tags_code: int
    store_timestamp: int
    size: int
    queue_id: int
    sysflag: int
    flags: int
    topic_off: int
    topic_len: int
    keys_off: int
    keys_len: int
    uniq_off: int
    uniq_len: int
    topic_hash: int
    bad_reason: int

    def topic(self, buf) -> str:
        return bytes(buf[self.topic_off:self.topic_off + self.topic_len]).decode("utf-8", "replace")


@attrs.define
class IndexHeader:
    """The 40-byte IndexFile header (spec §3), mutable while a file fills."""

    begin_timestamp: int = 0
    end_timestamp: int = 0
    begin_phy_offset: int = 0
    end_phy_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 1

    STRUCT = struct.Struct(">qqqqii")

    def pack(self) -> bytes:
        return self.STRUCT.pack(*attrs.astuple(self))

    @classmethod
    def unpack(cls, buf) -> "IndexHeader":
        h = cls(*cls.STRUCT.unpack_from(buf, 0))
        if h.index_count <= 0:
            h.index_count = 1  # IndexHeader.load
        return h


@attrs.define
class ScanResult:
    backend: "Backend"
    recs: object  # the backend's record array
    n: int
    consumed: int
    entries: int
    last_index: int
    stop: int
    err_code: int
    err_offset: int
    bad: int = 0  # records flagged REC_BAD
    first_bad: int = -1

    def raw(self) -> bytes:
        return self.backend.raw_records(self.recs, self.n)

    def record(self, i: int) -> DispatchRecord:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.backend.record(self.recs, i)

    def records(self) -> list[DispatchRecord]:
        raw = self.raw()
        return [DispatchRecord(*REC.unpack_from(raw, i * REC_SIZE)) for i in range(self.n)]

    @property
    def stop_name(self) -> str:
        return STOP_NAMES[self.stop]


# cq_pack_groups describes each run as a tuple of these (ints), cheaper
# than an object per run on the dispatch path:
# (first queue offset, queue id, topic offset, topic length, count,
#  run of consecutive queue offsets, first record, start in the order).
GROUP_FIELDS = 8


@attrs.frozen
class Grouping:
    """Records bound for ConsumeQueues, one run per (topic, queue id)."""

    order: object  # int32 indexes into the record array
    starts: list[int]  # run g is order[starts[g]:starts[g+1]]

    @property
    def ngroups(self) -> int:
        return len(self.starts) - 1


class Backend:
    """The interface both backends implement, with identical results:
    new_records(cap), raw_records(recs, n), record(recs, i),
    scan(buf, base_pos, recs, mode=, options=, expect_index=, max_entries=, delay_levels=),
    group(buf, res), order_slice(g, a, b), cq_pack(res, g, a, b),
    cq_pack_groups(res, g), cq_valid_units(buf),
    new_stage(), cq_pack_stage(buf, res, g, stage, limit), stage_take(stage, id, consume),
    stage_set_bad(stage, id), stage_count(stage), stage_trim(stage),
    index_put(mm, slot_num, index_num, header, buf, res, rec_from, key_from).

    delay_levels is the broker's messageDelayLevel in ms (level n is entry
    n-1): a SCHEDULE_TOPIC_XXXX record's tags code becomes its delivery
    time by it; with none given the tags code stays the TAGS hash."""

    name = "abstract"


class NativeBackend(Backend):
    name = "native"


    def new_records(self, cap: int):
        return ffi.new("lmq_disp_rec[]", cap)

    def raw_records(self, recs, n: int) -> bytes:
        return bytes(ffi.buffer(recs, n * REC_SIZE))

    def scan(self, buf, base_pos: int, recs, *, mode: int = MODE_DLEDGER, options: int = 0,
             expect_index: int = -1, max_entries: int = -1, delay_levels: Sequence[int] = ()) -> ScanResult:
        st = ffi.new("lmq_scan_state *")
        cap = len(recs)
        # The broker's messageDelayLevel (one small array per scan of a
        # whole batch; nothing shared between threads).
        levels = ffi.new("int64_t[]", tuple(delay_levels)) if delay_levels else ffi.NULL
        n = lib.lmq_dispatch_scan(ffi.from_buffer(buf), len(buf), base_pos, mode, options,
                                  expect_index, recs, cap, max_entries, levels, len(delay_levels), st)
        return ScanResult(self, recs, n, st.consumed, st.entries, st.last_index, st.stop,
                          st.err_code, st.err_offset, st.bad, st.first_bad)

    def record(self, recs, i: int) -> DispatchRecord:
        r = recs[i]
        return DispatchRecord(*(getattr(r, f) for f in _FIELDS))

    def group(self, buf, res: ScanResult) -> Grouping:
        order = ffi.new("int32_t[]", max(res.n, 1))
        starts = ffi.new("int32_t[]", res.n + 1)
        ng = ffi.new("int64_t *")
        m = lib.lmq_dispatch_group(ffi.from_buffer(buf), res.recs, res.n, order, starts, ng)
        if m < 0:
            raise MemoryError("lmq_dispatch_group")
        return Grouping(order, list(starts[0:ng[0] + 1]))

    def order_slice(self, g: Grouping, a: int, b: int) -> list[int]:
        return list(g.order[a:b])

    def cq_pack(self, res: ScanResult, g: Grouping, a: int, b: int) -> tuple[bytes, int]:
        out = ffi.new("uint8_t[]", max(b - a, 1) * UNIT_SIZE)
        run = lib.lmq_cq_pack(res.recs, g.order, a, b, out)
        return bytes(ffi.buffer(out, (b - a) * UNIT_SIZE)), run

    def cq_pack_groups(self, res: ScanResult, g: Grouping) -> tuple[bytes, list[tuple]]:
        m = g.starts[-1]
        out = ffi.new("uint8_t[]", max(m, 1) * UNIT_SIZE)
        starts = ffi.new("int32_t[]", g.starts)
        info = ffi.new("int64_t[]", max(g.ngroups, 1) * GROUP_FIELDS)
        lib.lmq_cq_pack_groups(res.recs, g.order, starts, g.ngroups, out, info)
        flat = info[0:g.ngroups * GROUP_FIELDS]
        return bytes(ffi.buffer(out, m * UNIT_SIZE)), list(zip(*[iter(flat)] * GROUP_FIELDS))

    def cq_valid_units(self, buf) -> int:
        return lib.lmq_cq_valid_units(ffi.from_buffer(buf), len(buf))

    def stamp_offsets(self, out, start: int, res: ScanResult, g: Grouping, first, first_index: int,
                      stamps) -> None:
        lib.lmq_stamp_offsets(ffi.from_buffer(out), start, res.recs, res.n, g.order,
                              ffi.from_buffer("int32_t[]", array("i", g.starts)), g.ngroups,
                              ffi.from_buffer("int64_t[]", first), first_index,
                              ffi.from_buffer("int64_t[]", stamps))

    def new_stage(self):
        return _NativeStage()

    def cq_pack_stage(self, buf, res: ScanResult, g: Grouping, stage, limit: int):
        """cq_pack_groups, then the runs into the stage (lmq_stage_groups).
        Returns the units of this batch (a view valid until the next call
        on the stage) and the runs needing the caller as (why, queue id,
        run tuple of GROUP_FIELDS)."""
        m, ng = g.starts[-1], g.ngroups
        stage.reserve(m, ng)
        out, info, ids, att = stage.out, stage.info, stage.ids, stage.att
        starts = ffi.new("int32_t[]", g.starts)
        lib.lmq_cq_pack_groups(res.recs, g.order, starts, ng, out, info)
        k = lib.lmq_stage_groups(stage.ptr, ffi.from_buffer(buf), info, ng, out, limit, ids, att)
        if k < 0:
            raise MemoryError("lmq_stage_groups")
        need = []
        for a in att[0:k]:
            gi = a >> 1
            need.append((a & 1, ids[gi], tuple(info[gi * GROUP_FIELDS:(gi + 1) * GROUP_FIELDS])))
        return memoryview(ffi.buffer(out, m * UNIT_SIZE)), need

    def stage_take(self, stage, qid: int, consume) -> None:
        first = stage.first
        n = lib.lmq_stage_len(stage.ptr, qid, first)
        if n:
            # The units are lent in place (no copy); consume must not keep them.
            consume(first[0], ffi.buffer(lib.lmq_stage_data(stage.ptr, qid), n))
            lib.lmq_stage_clear(stage.ptr, qid)

    def stage_trim(self, stage) -> None:
        lib.lmq_stage_trim(stage.ptr)

    def stage_set_bad(self, stage, qid: int) -> None:
        lib.lmq_stage_set_bad(stage.ptr, qid)

    def stage_count(self, stage) -> int:
        return lib.lmq_stage_count(stage.ptr)

    def index_put(self, mm, slot_num: int, index_num: int, hdr: IndexHeader, buf,
                  res: ScanResult, rec_from: int, key_from: int) -> tuple[int, int]:
        h = ffi.new("lmq_index_header *", attrs.astuple(hdr))
        key_next = ffi.new("int32_t *")
        nxt = lib.lmq_index_put(ffi.from_buffer(mm, require_writable=True), slot_num, index_num, h,
                                ffi.from_buffer(buf), res.recs, rec_from, res.n, key_from, key_next)
        hdr.begin_timestamp, hdr.end_timestamp = h.begin_timestamp, h.end_timestamp
        hdr.begin_phy_offset, hdr.end_phy_offset = h.begin_phy_offset, h.end_phy_offset
        hdr.hash_slot_count, hdr.index_count = h.hash_slot_count, h.index_count
        return nxt, key_next[0]


class _NativeStage:
    """An lmq_stage and the scratch arrays of cq_pack_stage, kept from batch
    to batch (fresh multi-100 KiB buffers each batch cost page faults)."""

    def __init__(self):
        ptr = lib.lmq_stage_new()
        if ptr == ffi.NULL:
            raise MemoryError("lmq_stage_new")
        self.ptr = ffi.gc(ptr, lib.lmq_stage_free)
        self.first = ffi.new("int64_t *")
        self.units_cap = self.groups_cap = 0

    def reserve(self, units: int, groups: int) -> None:
        if units > self.units_cap or self.units_cap == 0:
            self.units_cap = max(units, 1024)
            self.out = ffi.new("uint8_t[]", self.units_cap * UNIT_SIZE)
        if groups > self.groups_cap or self.groups_cap == 0:
            self.groups_cap = max(groups, 64)
            self.info = ffi.new("int64_t[]", self.groups_cap * GROUP_FIELDS)
            self.ids = ffi.new("int64_t[]", self.groups_cap)
            self.att = ffi.new("int64_t[]", self.groups_cap)


# --- the pure-Python twin -------------------------------------------------

def _jhash_utf8(h: int, data) -> int:
    """Java hashCode continued from h over `new String(data, UTF_8)`."""
    text = bytes(data).decode("utf-8", "replace")
    units = text.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h


def _s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def _parse_java_int(s: bytes) -> int | None:
    body = s[1:] if s[:1] in (b"+", b"-") else s
    if not body or any(c < 0x30 or c > 0x39 for c in body):
        return None
    v = int(s)
    return v if _INT32_MIN <= v <= _INT32_MAX else None


def _py_parse_record(buf, off: int, L: int, options: int, delay_levels, r: dict) -> int:
    """Mirror of dispatch.c parse_record; fills r (field -> value)."""
    rd32 = lambda p: struct.unpack_from(">i", buf, off + p)[0]  # noqa: E731
    rd64 = lambda p: struct.unpack_from(">q", buf, off + p)[0]  # noqa: E731
    total, magic = rd32(0), rd32(4)
    r["size"] = total
    if L < _MIN_RECORD or total != L:
        return BAD_TOTALSIZE
    v2 = magic == _MAGIC_V2
    r["queue_id"] = rd32(12)
    r["queue_offset"] = rd64(20)
    stored_phy = rd64(28)
    sysflag = r["sysflag"] = rd32(36)
    bh = 20 if sysflag & 0x10 else 8
    sh = 20 if sysflag & 0x20 else 8
    ts_pos = 48 + bh
    body_len_pos = ts_pos + 8 + sh + 12
    p = body_len_pos + 4
    if p > L:
        return BAD_HOSTS
    r["store_timestamp"] = rd64(ts_pos)
    if stored_phy != r["phy_offset"]:
        r["flags"] |= REC_PHY_MISMATCH
    body_len = rd32(body_len_pos)
    if body_len < 0 or p + body_len > L:
        return BAD_BODYLEN
    if options & SCAN_CHECK_CRC:
        crc = zlib.crc32(buf[off + p:off + p + body_len]) & 0x7FFFFFFF
        if crc != rd32(8):
            r["flags"] |= REC_CRC_BAD
    p += body_len
    tl = 2 if v2 else 1
    if p + tl > L:
        return BAD_TOPICLEN
    topic_len = struct.unpack_from(">h" if v2 else ">b", buf, off + p)[0]
    p += tl
    if topic_len < 0 or p + topic_len + 2 > L:
        return BAD_TOPICLEN
    r["topic_off"], r["topic_len"] = off + p, topic_len
    topic = bytes(buf[off + p:off + p + topic_len])
    r["topic_hash"] = _s32(_jhash_utf8(0, topic))
    p += topic_len
    props_len = struct.unpack_from(">h", buf, off + p)[0]
    p += 2
    if props_len < 0 or p + props_len > L:
        return BAD_PROPSLEN
    expect = 72 + bh + sh + body_len + tl + topic_len + 2 + props_len
    if expect != L:
        return BAD_LENGTH
    props = bytes(buf[off + p:off + p + props_len])
    base = off + p
    tags = delay = None
    i = 0
    while i < len(props):
        q = props.find(b"\x02", i)
        if q < 0:
            q = len(props)
        k = props.find(b"\x01", i, q)
        if k > i and k < q - 1:
            name, vs = props[i:k], k + 1
            if name == b"TAGS":
                tags = props[vs:q]
            elif name == b"KEYS":
                r["keys_off"], r["keys_len"] = base + vs, q - vs
            elif name == b"UNIQ_KEY":
                r["uniq_off"], r["uniq_len"] = base + vs, q - vs
            elif name == b"DELAY":
                delay = props[vs:q]
        i = q + 1
    r["tags_code"] = _s32(_jhash_utf8(0, tags)) if tags is not None else 0
    if delay is not None and topic == b"SCHEDULE_TOPIC_XXXX":
        level = _parse_java_int(delay)
        if level is None:
            return BAD_DELAY
        level = min(level, len(delay_levels))
        if level > 0:
            r["tags_code"] = r["store_timestamp"] + delay_levels[level - 1]
            r["flags"] |= REC_DELAY
    tran = sysflag & 0xC
    if tran in (0x4, 0xC):
        r["flags"] |= REC_NO_CQ
    if tran == 0xC:
        r["flags"] |= REC_NO_INDEX
    return 0


_FIELDS = [a.name for a in attrs.fields(DispatchRecord)]


def _new_rec(index: int, entry_pos: int, phy: int) -> dict:
    r = dict.fromkeys(_FIELDS, 0)
    r.update(entry_index=index, entry_pos=entry_pos, phy_offset=phy)
    return r


class _PyStage:
    """The Python twin of lmq_stage: queues interned by (topic bytes,
    queue id) in order of first sight, each [bad, first offset, next
    offset, staged units]."""

    def __init__(self):
        self.ids: dict = {}
        self.queues: list = []


class PythonBackend(Backend):
    name = "python"

    def new_records(self, cap: int):
        arr = bytearray(cap * REC_SIZE)
        return arr

    def raw_records(self, recs, n: int) -> bytes:
        return bytes(recs[:n * REC_SIZE])

    def record(self, recs, i: int) -> DispatchRecord:
        return DispatchRecord(*REC.unpack_from(recs, i * REC_SIZE))

    _rec = record

    def scan(self, buf, base_pos: int, recs, *, mode: int = MODE_DLEDGER, options: int = 0,
             expect_index: int = -1, max_entries: int = -1, delay_levels: Sequence[int] = ()) -> ScanResult:
        cap = len(recs) // REC_SIZE
        n = off = entries = bad_count = 0
        last_index = first_bad = -1
        size = len(buf)

        def done(stop, code=0, at=0):
            return ScanResult(self, recs, n, off, entries, last_index, stop, code, at,
                              bad_count, first_bad)

        def put(r):
            REC.pack_into(recs, n * REC_SIZE, *(r[f] for f in _FIELDS))

        if size > 0xFFFFFFFF:
            return done(STOP_CORRUPT, ERR_TOO_LARGE)
        while True:
            rem = size - off
            if rem == 0:
                return done(STOP_END)
            if n == cap or (max_entries >= 0 and entries == max_entries):
                return done(STOP_FULL)
            if rem < 8:
                return done(STOP_PARTIAL, 0, off)
            a, b = struct.unpack_from(">ii", buf, off)
            if mode == MODE_PLAIN:
                if b == _BLANK:
                    return done(STOP_BLANK)
                if a == 0 and b == 0:
                    return done(STOP_ZERO)
                if b not in (_MAGIC_V1, _MAGIC_V2):
                    return done(STOP_CORRUPT, ERR_RECORD_MAGIC, off)
                if a < 8:
                    return done(STOP_CORRUPT, ERR_RECORD, off)
                if a > rem:
                    return done(STOP_PARTIAL, 0, off)
                pos = base_pos + off
                r = _new_rec(-1, pos, pos)
                if _py_parse_record(buf, off, a, options, delay_levels, r):
                    return done(STOP_CORRUPT, ERR_RECORD, off)
                put(r)
                n += 1
                entries += 1
                off += a
                continue
            if a == -1:
                return done(STOP_BLANK)
            if a == 0 and b == 0:
                return done(STOP_ZERO)
            if rem < 48:
                return done(STOP_PARTIAL, 0, off)
            if not 1 <= a <= 3:
                return done(STOP_CORRUPT, ERR_ENTRY_MAGIC, off)
            body_size = struct.unpack_from(">i", buf, off + 44)[0]
            if b <= 44 or body_size + 48 != b:
                return done(STOP_CORRUPT, ERR_ENTRY_SIZE, off)
            if struct.unpack_from(">i", buf, off + 32)[0] != 0:
                return done(STOP_CORRUPT, ERR_CHANNEL, off)
            index, _term, pos = struct.unpack_from(">qqq", buf, off + 8)
            if pos != base_pos + off:
                return done(STOP_CORRUPT, ERR_POS, off)
            if expect_index >= 0 and index != expect_index:
                return done(STOP_CORRUPT, ERR_INDEX, off)
            if b > rem:
                return done(STOP_PARTIAL, 0, off)
            if a == 1 and body_size >= 8:
                mm = struct.unpack_from(">i", buf, off + 52)[0]
                if mm in (_MAGIC_V1, _MAGIC_V2):
                    r = _new_rec(index, pos, pos + 48)
                    bad = _py_parse_record(buf, off + 48, body_size, options, delay_levels, r)
                    if bad:
                        r["flags"] |= REC_BAD | REC_NO_CQ | REC_NO_INDEX
                        r["bad_reason"] = bad
                        if bad_count == 0:
                            first_bad = n
                        bad_count += 1
                    put(r)
                    n += 1
            entries += 1
            last_index = index
            expect_index = index + 1
            off += b

    def group(self, buf, res: ScanResult) -> Grouping:
        runs: dict[tuple[bytes, int], list[int]] = {}  # insertion order = first appearance
        for i in range(res.n):
            r = self._rec(res.recs, i)
            if r.flags & REC_NO_CQ:
                continue
            topic = bytes(buf[r.topic_off:r.topic_off + r.topic_len])
            runs.setdefault((topic, r.queue_id), []).append(i)
        order, starts = [], []
        for idxs in runs.values():
            starts.append(len(order))
            order += idxs
        return Grouping(order, starts + [len(order)])

    def order_slice(self, g: Grouping, a: int, b: int) -> list[int]:
        return list(g.order[a:b])

    def cq_pack(self, res: ScanResult, g: Grouping, a: int, b: int) -> tuple[bytes, int]:
        out = bytearray()
        run = 0
        prev = None
        for k in range(a, b):
            r = self._rec(res.recs, g.order[k])
            out += UNIT.pack(r.phy_offset, r.size, r.tags_code)
            if run == k - a and (prev is None or r.queue_offset == prev + 1):
                run += 1
            prev = r.queue_offset
        return bytes(out), run

    def cq_pack_groups(self, res: ScanResult, g: Grouping) -> tuple[bytes, list[tuple]]:
        out = bytearray()
        groups = []
        for k in range(g.ngroups):
            a, b = g.starts[k], g.starts[k + 1]
            units, run = self.cq_pack(res, g, a, b)
            out += units
            r = self._rec(res.recs, g.order[a])
            groups.append((r.queue_offset, r.queue_id, r.topic_off, r.topic_len, b - a, run, g.order[a], a))
        return bytes(out), groups

    def new_stage(self):
        return _PyStage()

    def cq_pack_stage(self, buf, res: ScanResult, g: Grouping, stage, limit: int):
        units, groups = self.cq_pack_groups(res, g)
        need = []
        for gt in groups:
            q0, qid, toff, tlen, count, run, _, start = gt
            key = (bytes(buf[toff:toff + tlen]), qid)
            sid = stage.ids.get(key)
            is_new = sid is None
            if is_new:
                sid = stage.ids[key] = len(stage.queues)
                stage.queues.append([False, 0, 0, bytearray()])  # bad, first, next, units
            q = stage.queues[sid]
            if is_new or q[0] or run != count or (q[3] and q[2] != q0):
                need.append((0, sid, gt))
                continue
            if not q[3]:
                q[1] = q0
            q[3] += units[start * UNIT_SIZE:(start + count) * UNIT_SIZE]
            q[2] = q0 + count
            if len(q[3]) >= limit:
                need.append((1, sid, gt))
        return memoryview(units), need

    def stage_take(self, stage, qid: int, consume) -> None:
        q = stage.queues[qid] if 0 <= qid < len(stage.queues) else None
        if q and q[3]:
            units, q[3] = q[3], bytearray()
            consume(q[1], bytes(units))

    def stage_trim(self, stage) -> None:
        pass  # taking a stage already dropped its buffer

    def stage_set_bad(self, stage, qid: int) -> None:
        stage.queues[qid][0] = True

    def stage_count(self, stage) -> int:
        return len(stage.queues)

    def stamp_offsets(self, out, start: int, res: ScanResult, g: Grouping, first, first_index: int,
                      stamps) -> None:
        """The append hook's stamping (see lmq_stamp_offsets): group g's
        k-th record gets queue offset first[g] + k, a record in no group 0,
        each its own position as PHYSICALOFFSET."""
        for i in range(res.n):
            r = self._rec(res.recs, i)
            _I64BE.pack_into(out, r.phy_offset - start + 28, r.phy_offset)
            if r.flags & REC_NO_CQ:
                _I64BE.pack_into(out, r.phy_offset - start + 20, 0)
                stamps[r.entry_index - first_index] = 0
        for k in range(g.ngroups):
            for qo, i in enumerate(g.order[g.starts[k]:g.starts[k + 1]], first[k]):
                r = self._rec(res.recs, i)
                _I64BE.pack_into(out, r.phy_offset - start + 20, qo)
                stamps[r.entry_index - first_index] = qo

    def cq_valid_units(self, buf) -> int:
        n = 0
        for off in range(0, len(buf) - UNIT_SIZE + 1, UNIT_SIZE):
            phy, size, _ = UNIT.unpack_from(buf, off)
            if phy < 0 or size <= 0:
                break
            n += 1
        return n

    def index_put(self, mm, slot_num: int, index_num: int, hdr: IndexHeader, buf,
                  res: ScanResult, rec_from: int, key_from: int) -> tuple[int, int]:
        i, kf = rec_from, key_from
        key_next = 0
        while i < res.n:
            r = self._rec(res.recs, i)
            if kf == 0:
                if hdr.index_count >= index_num:
                    break
                if r.phy_offset < hdr.end_phy_offset or r.flags & REC_NO_INDEX:
                    i, kf = i + 1, 0
                    continue
            base = (31 * (r.topic_hash & 0xFFFFFFFF) + 0x23) & 0xFFFFFFFF
            keys = []
            if r.uniq_len:
                keys.append(buf[r.uniq_off:r.uniq_off + r.uniq_len])
            keys += [t for t in bytes(buf[r.keys_off:r.keys_off + r.keys_len]).split(b" ") if t]
            full = False
            for k, key in enumerate(keys):
                if k < kf:
                    continue
                if hdr.index_count >= index_num:
                    full, key_next = True, k
                    break
                py_put_key(mm, slot_num, hdr, _jhash_utf8(base, key), r.phy_offset, r.store_timestamp)
            if full:
                break
            i, kf = i + 1, 0
        mm[0:40] = hdr.pack()
        return i, key_next


def py_put_key(mm, slot_num: int, hdr: IndexHeader, hash32: int, phy: int, ts: int) -> None:
    """IndexFile.putKey, given the key's 32-bit Java hash (twin of put_key)."""
    key_hash = _s32(hash32)
    key_hash = 0 if key_hash == _INT32_MIN else abs(key_hash)
    slot_pos = 40 + (key_hash % slot_num) * 4
    slot_value = struct.unpack_from(">i", mm, slot_pos)[0]
    if slot_value <= 0 or slot_value > hdr.index_count:
        slot_value = 0
    diff = ts - hdr.begin_timestamp
    diff = -(-diff // 1000) if diff < 0 else diff // 1000  # Java truncates toward zero
    if hdr.begin_timestamp <= 0:
        diff = 0
    elif diff > _INT32_MAX:
        diff = _INT32_MAX
    elif diff < 0:
        diff = 0
    item = 40 + slot_num * 4 + hdr.index_count * 20
    struct.pack_into(">iqii", mm, item, key_hash, phy, diff, slot_value)
    struct.pack_into(">i", mm, slot_pos, hdr.index_count)
    if hdr.index_count <= 1:
        hdr.begin_phy_offset, hdr.begin_timestamp = phy, ts
    if slot_value == 0:
        hdr.hash_slot_count += 1
    hdr.index_count += 1
    hdr.end_phy_offset, hdr.end_timestamp = phy, ts


NATIVE = NativeBackend() if NATIVE_LOADED else None
PYTHON = PythonBackend()


def default_backend() -> Backend:
    return NATIVE if NATIVE is not None else PYTHON


def backend_named(name: str) -> Backend:
    if name == "native":
        if NATIVE is None:
            raise RuntimeError("native dispatch helpers unavailable")
        return NATIVE
    if name == "python":
        return PYTHON
    raise ValueError(f"unknown dispatch backend {name!r}")
