# Owns the pure-Python twin of the dispatch helpers (native/src/dispatch.c):
# the same scan, grouping, ConsumeQueue packing and IndexFile insertion,
# written from the spec, on the shared record layout of
# native/dispatch_layout.py.  It is the oracle the C is tested against and
# the backend used where the extension is not built.
import struct
import zlib
from collections.abc import Sequence

from native.dispatch_layout import (
    BAD_BODYLEN,
    BAD_DELAY,
    BAD_HOSTS,
    BAD_LENGTH,
    BAD_PROPSLEN,
    BAD_TOPICLEN,
    BAD_TOTALSIZE,
    BLANK_MAGIC,
    ERR_CHANNEL,
    ERR_ENTRY_MAGIC,
    ERR_ENTRY_SIZE,
    ERR_INDEX,
    ERR_POS,
    ERR_RECORD,
    ERR_RECORD_MAGIC,
    ERR_TOO_LARGE,
    I64BE,
    INT32_MAX,
    INT32_MIN,
    MIN_RECORD_SIZE,
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
    RECORD_MAGIC_V1,
    RECORD_MAGIC_V2,
    SCAN_CHECK_CRC,
    STOP_BLANK,
    STOP_CORRUPT,
    STOP_END,
    STOP_FULL,
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
    return v if INT32_MIN <= v <= INT32_MAX else None


def _py_parse_record(buf, off: int, L: int, options: int, delay_levels, r: dict) -> int:
    """Mirror of dispatch.c parse_record; fills r (field -> value)."""
    rd32 = lambda p: struct.unpack_from(">i", buf, off + p)[0]  # noqa: E731
    rd64 = lambda p: struct.unpack_from(">q", buf, off + p)[0]  # noqa: E731
    total, magic = rd32(0), rd32(4)
    r["size"] = total
    if L < MIN_RECORD_SIZE or total != L:
        return BAD_TOTALSIZE
    v2 = magic == RECORD_MAGIC_V2
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


def _new_rec(index: int, entry_pos: int, phy: int) -> dict:
    r = dict.fromkeys(RECORD_FIELDS, 0)
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

    def topic_queue(self, recs, i: int) -> tuple[int, int, int]:
        r = self.record(recs, i)
        return r.topic_off, r.topic_len, r.queue_id

    def store_timestamp(self, recs, i: int) -> int:
        return self.record(recs, i).store_timestamp

    def scan(self, buf, base_pos: int, recs, *, mode: int = MODE_DLEDGER, options: int = 0,
             expect_index: int = -1, max_entries: int = -1, delay_levels: Sequence[int] = ()) -> ScanResult:
        cap = len(recs) // REC_SIZE
        n = off = entries = bad_count = 0
        last_index = first_bad = -1
        size = len(buf)

        def done(stop, code=0, at=0):
            return ScanResult(backend=self, recs=recs, n=n, consumed=off, entries=entries, last_index=last_index,
                              stop=stop, err_code=code, err_offset=at,
                              bad=bad_count, first_bad=first_bad)

        def put(r):
            REC.pack_into(recs, n * REC_SIZE, *(r[f] for f in RECORD_FIELDS))

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
                if b == BLANK_MAGIC:
                    return done(STOP_BLANK)
                if a == 0 and b == 0:
                    return done(STOP_ZERO)
                if b not in (RECORD_MAGIC_V1, RECORD_MAGIC_V2):
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
                if mm in (RECORD_MAGIC_V1, RECORD_MAGIC_V2):
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

    def stamp_offsets(self, out, start: int, res: ScanResult, g: Grouping, first, first_index: int,
                      stamps) -> None:
        """The append hook's stamping (see lmq_stamp_offsets): group g's
        k-th record gets queue offset first[g] + k, a record in no group 0,
        each its own position as PHYSICALOFFSET."""
        for i in range(res.n):
            r = self._rec(res.recs, i)
            I64BE.pack_into(out, r.phy_offset - start + 28, r.phy_offset)
            if r.flags & REC_NO_CQ:
                I64BE.pack_into(out, r.phy_offset - start + 20, 0)
                stamps[r.entry_index - first_index] = 0
        for k in range(g.ngroups):
            for qo, i in enumerate(g.order[g.starts[k]:g.starts[k + 1]], first[k]):
                r = self._rec(res.recs, i)
                I64BE.pack_into(out, r.phy_offset - start + 20, qo)
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
    key_hash = 0 if key_hash == INT32_MIN else abs(key_hash)
    slot_pos = 40 + (key_hash % slot_num) * 4
    slot_value = struct.unpack_from(">i", mm, slot_pos)[0]
    if slot_value <= 0 or slot_value > hdr.index_count:
        slot_value = 0
    diff = ts - hdr.begin_timestamp
    diff = -(-diff // 1000) if diff < 0 else diff // 1000  # Java truncates toward zero
    if hdr.begin_timestamp <= 0:
        diff = 0
    elif diff > INT32_MAX:
        diff = INT32_MAX
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
