# Owns what both dispatch backends share (native/dispatch.py's C one and
# native/dispatch_twin.py's pure-Python twin): the scan's stop, error and
# record-flag codes, the record layout lmq_disp_rec (96 bytes, native byte
# order, no padding; the twin writes it with `struct`, so the oracle
# comparison is bytes equality), the ConsumeQueue unit, the IndexFile
# header, the scan result and grouping values, and the Backend interface.
import struct

import attrs

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
I64BE = struct.Struct(">q")
UNIT_SIZE = 20

RECORD_MAGIC_V1, RECORD_MAGIC_V2, BLANK_MAGIC = -626843481, -626843477, -875286124
MIN_RECORD_SIZE = 91
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


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


RECORD_FIELDS = [a.name for a in attrs.fields(DispatchRecord)]


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


@attrs.define(kw_only=True)
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

    def store_timestamp(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.backend.store_timestamp(self.recs, i)

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
    new_records(cap), raw_records(recs, n), record(recs, i), topic_queue(recs, i),
    scan(buf, base_pos, recs, mode=, options=, expect_index=, max_entries=, delay_levels=),
    group(buf, res), order_slice(g, a, b), cq_pack(res, g, a, b),
    cq_pack_groups(res, g), cq_valid_units(buf),
    new_stage(), cq_pack_stage(buf, res, g, stage, limit), stage_take(stage, id, consume),
    stage_set_bad(stage, id), stage_trim(stage),
    index_put(mm, slot_num, index_num, header, buf, res, rec_from, key_from).

    delay_levels is the broker's messageDelayLevel in ms (level n is entry
    n-1): a SCHEDULE_TOPIC_XXXX record's tags code becomes its delivery
    time by it; with none given the tags code stays the TAGS hash."""

    name = "abstract"
