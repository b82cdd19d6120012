# Owns the Python face of the dispatch helpers (native/src/dispatch.c): the
# commitlog scanner, grouping by queue, ConsumeQueue unit packing and
# IndexFile item insertion, as NativeBackend; and the choice of backend.
# The pure-Python twin is native/dispatch_twin.py; what both share (codes,
# the record layout, values, the Backend interface) is
# native/dispatch_layout.py, re-exported here.
#
# Both backends share one record layout: the C struct lmq_disp_rec (96
# bytes, native byte order, no padding), which the Python twin writes with
# `struct` into a bytearray.  So the oracle comparison is plain bytes
# equality of the record arrays, and of the files written from them.
# Callers take a backend (`default_backend()`, NATIVE, PYTHON) and never
# touch `lib` directly.
from array import array
from collections.abc import Sequence

import attrs

from native import NATIVE_LOADED, ffi, lib
from native.dispatch_layout import (  # re-exported: callers import these from here
    BAD_BODYLEN,
    BAD_DELAY,
    BAD_HOSTS,
    BAD_LENGTH,
    BAD_PROPSLEN,
    BAD_TEXT,
    BAD_TOPICLEN,
    BAD_TOTALSIZE,
    ERR_CHANNEL,
    ERR_ENTRY_MAGIC,
    ERR_ENTRY_SIZE,
    ERR_INDEX,
    ERR_POS,
    ERR_RECORD,
    ERR_RECORD_MAGIC,
    ERR_TEXT,
    ERR_TOO_LARGE,
    GROUP_FIELDS,
    MODE_DLEDGER,
    MODE_PLAIN,
    REC,
    REC_BAD,
    REC_CRC_BAD,
    REC_DELAY,
    REC_NO_CQ,
    REC_NO_INDEX,
    REC_PHY_MISMATCH,
    REC_SIZE,
    RECORD_FIELDS,
    SCAN_CHECK_CRC,
    STOP_BLANK,
    STOP_CORRUPT,
    STOP_END,
    STOP_FULL,
    STOP_NAMES,
    STOP_PARTIAL,
    STOP_ZERO,
    UNIT,
    UNIT_SIZE,
    Backend,
    DispatchRecord,
    Grouping,
    IndexHeader,
    ScanResult,
)
from native.dispatch_twin import PythonBackend, py_put_key

__all__ = [
    "BAD_BODYLEN",
    "BAD_DELAY",
    "BAD_HOSTS",
    "BAD_LENGTH",
    "BAD_PROPSLEN",
    "BAD_TEXT",
    "BAD_TOPICLEN",
    "BAD_TOTALSIZE",
    "Backend",
    "DispatchRecord",
    "ERR_CHANNEL",
    "ERR_ENTRY_MAGIC",
    "ERR_ENTRY_SIZE",
    "ERR_INDEX",
    "ERR_POS",
    "ERR_RECORD",
    "ERR_RECORD_MAGIC",
    "ERR_TEXT",
    "ERR_TOO_LARGE",
    "GROUP_FIELDS",
    "Grouping",
    "IndexHeader",
    "MODE_DLEDGER",
    "MODE_PLAIN",
    "NATIVE",
    "NativeBackend",
    "PYTHON",
    "PythonBackend",
    "REC",
    "REC_BAD",
    "REC_CRC_BAD",
    "REC_DELAY",
    "REC_NO_CQ",
    "REC_NO_INDEX",
    "REC_PHY_MISMATCH",
    "REC_SIZE",
    "SCAN_CHECK_CRC",
    "STOP_BLANK",
    "STOP_CORRUPT",
    "STOP_END",
    "STOP_FULL",
    "STOP_NAMES",
    "STOP_PARTIAL",
    "STOP_ZERO",
    "ScanResult",
    "UNIT",
    "UNIT_SIZE",
    "backend_named",
    "default_backend",
    "py_put_key",
]


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
        return ScanResult(backend=self, recs=recs, n=n, consumed=st.consumed, entries=st.entries,
                          last_index=st.last_index, stop=st.stop,
                          err_code=st.err_code, err_offset=st.err_offset, bad=st.bad, first_bad=st.first_bad)

    def record(self, recs, i: int) -> DispatchRecord:
        r = recs[i]
        return DispatchRecord(*(getattr(r, f) for f in RECORD_FIELDS))

    def topic_queue(self, recs, i: int) -> tuple[int, int, int]:
        """(topic_off, topic_len, queue_id) of record i: what the append
        hook needs per queue, without a whole DispatchRecord."""
        r = recs[i]
        return r.topic_off, r.topic_len, r.queue_id

    def store_timestamp(self, recs, i: int) -> int:
        """Record i's store timestamp, without a whole DispatchRecord."""
        return recs[i].store_timestamp

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
