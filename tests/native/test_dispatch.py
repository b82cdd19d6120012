# The C dispatch helpers against their pure-Python twins (the oracle), on
# random commitlog buffers, plus golden checks of what the scanner extracts.
import mmap
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commitlog import entry as E
from consumequeue import record as M
from native import dispatch as D
from native.hashing import java_hash_str
from tests.helpers.spec_vectors import ENTRY_HEADER, message_with_physical_offset

pytestmark = pytest.mark.skipif(D.NATIVE is None, reason="native helpers not built")
BACKENDS = [D.NATIVE, D.PYTHON]

TOPICS = ["T", "TopicA", "主题", "SCHEDULE_TOPIC_XXXX", "%RETRY%g"]
words = st.text(st.characters(blacklist_characters="\x01\x02 ", blacklist_categories=("Cs",)),
                min_size=1, max_size=6)


@st.composite
def messages(draw):
    props = {}
    if draw(st.booleans()):
        props["TAGS"] = draw(st.one_of(words, st.just("TagA")))
    if draw(st.booleans()):
        props["KEYS"] = " ".join(draw(st.lists(st.one_of(words, st.just("")), max_size=4)))
        if not props["KEYS"]:
            del props["KEYS"]
    if draw(st.booleans()):
        props["UNIQ_KEY"] = draw(st.one_of(words, st.just("AC110001000118B4AAC2000000000000")))
    if draw(st.integers(0, 4)) == 0:
        props["DELAY"] = draw(st.sampled_from(["3", "0", "-1", "99", "+2", "x", "2147483648"]))
    topic = draw(st.sampled_from(TOPICS))
    v6 = draw(st.integers(0, 3))
    return M.MessageRecord(
        topic=topic, body=draw(st.binary(max_size=40)), properties=props,
        queue_id=draw(st.integers(0, 3)), queue_offset=draw(st.integers(0, 5)),
        sysflag=draw(st.sampled_from([0, 0, 0, 4, 8, 12])),
        born_host=M.HostAddr("::1" if v6 & 1 else "1.2.3.4", 5),
        store_host=M.HostAddr("::2" if v6 & 2 else "10.0.0.1", 10911),
        store_timestamp=draw(st.integers(1, 1 << 42)))


def corrupt(raw: bytes, how: int) -> bytes:
    buf = bytearray(raw)
    lay = M.parse_layout(raw)
    if how == 1:
        struct.pack_into(">i", buf, 0, len(buf) + 1)  # TOTALSIZE != entry body size
    elif how == 2:
        struct.pack_into(">h", buf, lay.props_pos - 2, lay.props_len + 1)  # PROPERTIESLEN
    elif how == 3:
        buf[36] ^= 0x10  # flips the born host family: every later field moves
    return bytes(buf)


@st.composite
def dledger_buffers(draw, max_entries=12):
    """(buffer, base_pos, first_index): message entries, NOOPs, non-message
    bodies and the odd malformed record, at an arbitrary base position."""
    base = draw(st.integers(0, 1 << 34))
    first = draw(st.integers(0, 1000))
    out = bytearray()
    prev = 0
    for i in range(draw(st.integers(0, max_entries))):
        kind = draw(st.integers(0, 9))
        pos = base + len(out)
        if kind == 0:
            body, magic = b"", E.MAGIC_NOOP
        elif kind == 1:
            body, magic = draw(st.binary(min_size=0, max_size=30)), E.MAGIC_NORMAL
        else:
            msg = draw(messages())
            raw = bytearray(M.encode(msg))
            M.set_physical_offset(raw, pos + 48 if kind != 2 else 7)
            body = corrupt(bytes(raw), draw(st.integers(0, 3))) if kind == 3 else bytes(raw)
            magic = E.MAGIC_NORMAL
        e = E.make_entry(body, index=first + i, term=1, pos=pos, prev_chain_crc=prev, magic=magic)
        prev = e.chain_crc
        out += e.encode()
    return bytes(out), base, first


def scan_both(buf, base, cap=64, **kw):
    kw.setdefault("delay_levels", M.DEFAULT_DELAY_LEVELS_MS)
    return [be.scan(buf, base, be.new_records(cap), **kw) for be in BACKENDS]


def same(results):
    a, b = results
    assert a.raw() == b.raw()
    for f in ("n", "consumed", "entries", "last_index", "stop", "err_code", "err_offset", "bad", "first_bad"):
        assert getattr(a, f) == getattr(b, f), f
    return a


def test_golden_entry_vector():
    body = message_with_physical_offset(48)
    buf = ENTRY_HEADER + body
    res = same(scan_both(buf, 0))
    assert (res.n, res.entries, res.last_index, res.stop, res.consumed) == (1, 1, 0, D.STOP_END, 194)
    r = res.record(0)
    assert (r.entry_index, r.entry_pos, r.phy_offset, r.size, r.queue_offset) == (0, 0, 48, 146, 5)
    assert (r.tags_code, r.store_timestamp, r.flags) == (2598919, 1700000000123, 0)
    assert r.topic(buf) == "T" and r.topic_hash == java_hash_str("T")
    assert buf[r.uniq_off:r.uniq_off + r.uniq_len] == b"AC110001000118B4AAC2000000000000"
    assert r.keys_len == 0
    # PHYSICALOFFSET 1000 inside an entry at pos 0 is flagged, not fatal.
    res = same(scan_both(ENTRY_HEADER + message_with_physical_offset(1000), 0))
    assert res.record(0).flags == D.REC_PHY_MISMATCH


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dledger_buffers(), st.integers(1, 5), st.booleans())
def test_scan_group_pack_native_equals_python(data, cap, check_crc):
    buf, base, first = data
    opts = D.SCAN_CHECK_CRC if check_crc else 0
    off = 0
    expect = first
    while True:  # drive both through the same small-capacity batches
        view = buf[off:]
        results = scan_both(view, base + off, cap=cap, options=opts, expect_index=expect)
        res = same(results)
        ga, gb = [be.group(view, r) for be, r in zip(BACKENDS, results)]
        assert list(ga.order[0:ga.starts[-1]]) == list(gb.order) and ga.starts == gb.starts
        for g in range(ga.ngroups):
            a, b = ga.starts[g], ga.starts[g + 1]
            assert D.NATIVE.cq_pack(results[0], ga, a, b) == D.PYTHON.cq_pack(results[1], gb, a, b)
        assert D.NATIVE.cq_pack_groups(results[0], ga) == D.PYTHON.cq_pack_groups(results[1], gb)
        recs = res.records()
        for r in results:  # the one-field accessor says what the whole record says
            assert [r.store_timestamp(i) for i in range(r.n)] == [x.store_timestamp for x in recs]
        keys = []
        for g in range(ga.ngroups):  # one run per queue, log order inside, first-seen order
            run = list(ga.order[ga.starts[g]:ga.starts[g + 1]])
            assert run == sorted(run)
            assert len({(recs[i].topic(view), recs[i].queue_id) for i in run}) == 1
            keys.append((recs[run[0]].topic(view), recs[run[0]].queue_id))
        assert len(set(keys)) == len(keys)
        assert [ga.order[ga.starts[g]] for g in range(ga.ngroups)] == sorted(
            ga.order[ga.starts[g]] for g in range(ga.ngroups))
        assert sorted(ga.order[0:ga.starts[-1]]) == [i for i, r in enumerate(recs) if not r.flags & D.REC_NO_CQ]
        off += res.consumed
        if res.entries:
            expect = res.last_index + 1
        if res.stop != D.STOP_FULL:
            break
    assert res.stop == D.STOP_END and off == len(buf)


@settings(max_examples=100, deadline=None)
@given(dledger_buffers(max_entries=20), st.integers(2, 9), st.integers(1, 13))
def test_index_put_native_equals_python(data, index_num, slot_num):
    buf, base, _ = data
    maps = []
    for be in BACKENDS:
        res = be.scan(buf, base, be.new_records(64))
        mm = bytearray(40 + slot_num * 4 + index_num * 20)
        files = []
        hdr = D.IndexHeader()
        rec = key = 0
        while True:  # rotate through as many small "files" as needed
            rec, key = be.index_put(mm, slot_num, index_num, hdr, buf, res, rec, key)
            files.append((bytes(mm), str(hdr)))
            if rec >= res.n:
                break
            prev = hdr
            mm = bytearray(len(mm))
            hdr = D.IndexHeader(prev.end_timestamp, prev.end_timestamp, prev.end_phy_offset,
                                prev.end_phy_offset, 0, 1)
        maps.append(files)
    assert maps[0] == maps[1]


@st.composite
def plain_buffers(draw):
    base = draw(st.integers(0, 1 << 34))
    out = bytearray()
    bad_at = None
    for _ in range(draw(st.integers(0, 8))):
        msg = draw(messages())
        if bad_at is None and msg.topic == "SCHEDULE_TOPIC_XXXX" and "DELAY" in msg.properties:
            try:
                M.parse_java_int(msg.properties["DELAY"])
            except M.MessageFormatError:
                bad_at = len(out)  # plain mode stops at a record the broker cannot read
        raw = bytearray(M.encode(msg))
        M.set_physical_offset(raw, base + len(out))
        out += raw
    end = draw(st.sampled_from(["blank", "zero", "end", "garbage"]))
    if bad_at is not None:
        end = ("bad", bad_at)
    if end == "blank":
        out += M.encode_blank(100) + bytes(92)
    elif end == "zero":
        out += bytes(16)
    elif end == "garbage":
        out += b"\x00\x00\x00\x20\x12\x34\x56\x78" + bytes(24)
    return bytes(out), base, end


@settings(max_examples=100, deadline=None)
@given(plain_buffers())
def test_plain_mode_native_equals_python(data):
    buf, base, end = data
    res = same(scan_both(buf, base, mode=D.MODE_PLAIN))
    if isinstance(end, tuple):
        assert (res.stop, res.err_code, res.err_offset, res.consumed) == (D.STOP_CORRUPT, D.ERR_RECORD,
                                                                          end[1], end[1])
        return
    want = {"blank": D.STOP_BLANK, "zero": D.STOP_ZERO, "end": D.STOP_END, "garbage": D.STOP_CORRUPT}[end]
    assert res.stop == want
    assert all(r.entry_index == -1 and r.phy_offset == r.entry_pos for r in res.records())
    assert not any(r.flags & D.REC_PHY_MISMATCH for r in res.records())


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=24), st.binary(min_size=1, max_size=24))
def test_malformed_utf8_hashes_agree(topic_bytes, tag_bytes):
    # Raw bytes in the topic, TAGS and KEYS go through both decoders.
    tag_bytes = tag_bytes.replace(b"\x01", b"").replace(b"\x02", b"") or b"x"
    props = b"TAGS\x01" + tag_bytes + b"\x02KEYS\x01" + tag_bytes + b"\x02UNIQ_KEY\x01" + tag_bytes + b"\x02"
    raw = M.encode(M.MessageRecord(topic="x", body=b"b"))
    head = raw[:M.parse_layout(raw).topic_pos - 1]  # everything before TOPICLEN
    rec = head + bytes([len(topic_bytes)]) + topic_bytes + struct.pack(">h", len(props)) + props
    rec = struct.pack(">i", len(rec)) + rec[4:]
    buf = E.make_entry(rec, index=0, term=1, pos=0, prev_chain_crc=0).encode()
    res = same(scan_both(buf, 0))
    r = res.record(0)
    assert r.flags & D.REC_BAD == 0
    assert r.topic_hash == java_hash_str(topic_bytes.decode("utf-8", "replace"))
    idx = []
    for be in BACKENDS:
        mm = bytearray(40 + 7 * 4 + 10 * 20)
        be.index_put(mm, 7, 10, D.IndexHeader(), buf, be.scan(buf, 0, be.new_records(4)), 0, 0)
        idx.append(bytes(mm))
    assert idx[0] == idx[1]


def entries(n, base=0, first=0, body=b"not a message"):
    out, prev = bytearray(), 0
    for i in range(n):
        e = E.make_entry(body, index=first + i, term=1, pos=base + len(out), prev_chain_crc=prev)
        prev = e.chain_crc
        out += e.encode()
    return bytes(out)


def test_stop_reasons():
    buf = entries(3)
    size = len(buf) // 3
    assert same(scan_both(buf + E.encode_blank(64) + bytes(56), 0)).stop == D.STOP_BLANK
    r = same(scan_both(buf + bytes(64), 0))
    assert (r.stop, r.consumed, r.entries, r.last_index) == (D.STOP_ZERO, len(buf), 3, 2)
    r = same(scan_both(buf[:-5], 0))
    assert (r.stop, r.err_offset, r.consumed) == (D.STOP_PARTIAL, 2 * size, 2 * size)
    r = same(scan_both(buf, 1))  # pos fields disagree with where the bytes sit
    assert (r.stop, r.err_code, r.err_offset) == (D.STOP_CORRUPT, D.ERR_POS, 0)
    r = same(scan_both(buf, 0, expect_index=5))
    assert (r.stop, r.err_code) == (D.STOP_CORRUPT, D.ERR_INDEX)
    r = same(scan_both(buf, 0, max_entries=2))
    assert (r.stop, r.entries, r.consumed) == (D.STOP_FULL, 2, 2 * size)
    bad = bytearray(buf)
    bad[size + 3] = 9  # entry 1 magic
    r = same(scan_both(bytes(bad), 0))
    assert (r.stop, r.err_code, r.err_offset, r.entries) == (D.STOP_CORRUPT, D.ERR_ENTRY_MAGIC, size, 1)
    # Non-message and NOOP entries produce no records but are consumed.
    assert same(scan_both(buf, 0)).n == 0


def test_record_flags_for_transactions_delay_and_bad():
    def one(msg, mutate=None):
        raw = bytearray(M.encode(msg))
        M.set_physical_offset(raw, 48)
        if mutate:
            mutate(raw)
        return same(scan_both(E.make_entry(bytes(raw), index=0, term=1, pos=0, prev_chain_crc=0).encode(), 0))

    base = M.MessageRecord(topic="T", body=b"x", properties={"TAGS": "TagA"}, store_timestamp=10_000)
    assert one(M.MessageRecord(topic="T", sysflag=M.TRANSACTION_PREPARED_TYPE)).record(0).flags == D.REC_NO_CQ
    assert one(M.MessageRecord(topic="T", sysflag=M.TRANSACTION_ROLLBACK_TYPE)).record(0).flags == \
        D.REC_NO_CQ | D.REC_NO_INDEX
    delayed = one(M.MessageRecord(topic="SCHEDULE_TOPIC_XXXX", properties={"DELAY": "3", "TAGS": "a"},
                                  store_timestamp=10_000)).record(0)
    assert (delayed.flags, delayed.tags_code) == (D.REC_DELAY, 10_000 + 10_000)  # level 3 = 10s
    capped = one(M.MessageRecord(topic="SCHEDULE_TOPIC_XXXX", properties={"DELAY": "99"},
                                 store_timestamp=0)).record(0)
    assert capped.tags_code == 7_200_000  # clamped to the last level (2h)
    # The table is the broker's messageDelayLevel, passed in; without one
    # the tags code stays the TAGS hash (the DELAY value is still checked).
    raw = bytearray(M.encode(M.MessageRecord(topic="SCHEDULE_TOPIC_XXXX", store_timestamp=10_000,
                                             properties={"DELAY": "2", "TAGS": "a"})))
    M.set_physical_offset(raw, 48)
    entry = E.make_entry(bytes(raw), index=0, term=1, pos=0, prev_chain_crc=0).encode()
    custom = same(scan_both(entry, 0, delay_levels=(7, 70, 700))).record(0)
    assert (custom.flags, custom.tags_code) == (D.REC_DELAY, 10_000 + 70)
    plain = same(scan_both(entry, 0, delay_levels=())).record(0)
    assert (plain.flags, plain.tags_code) == (0, M.tags_code("a"))
    bad_delay = one(M.MessageRecord(topic="SCHEDULE_TOPIC_XXXX", properties={"DELAY": "x"}))
    assert bad_delay.bad == 1 and bad_delay.record(0).bad_reason == D.BAD_DELAY
    r = one(base, lambda raw: struct.pack_into(">i", raw, 0, len(raw) - 1))
    assert (r.bad, r.first_bad, r.record(0).bad_reason) == (1, 0, D.BAD_TOTALSIZE)
    assert r.record(0).flags & (D.REC_NO_CQ | D.REC_NO_INDEX | D.REC_BAD) == 7
    crc = [be.scan(E.make_entry(bytes(M.encode(base))[:-1] + b"!", index=0, term=1, pos=0,
                                prev_chain_crc=0).encode(), 0, be.new_records(2), options=D.SCAN_CHECK_CRC)
           for be in BACKENDS]
    assert crc[0].raw() == crc[1].raw()


def test_index_put_resumes_mid_record_in_a_new_file():
    msg = M.MessageRecord(topic="T", properties={"UNIQ_KEY": "u", "KEYS": "a b c"}, store_timestamp=5000)
    raw = bytearray(M.encode(msg))
    M.set_physical_offset(raw, 48)
    buf = E.make_entry(bytes(raw), index=0, term=1, pos=0, prev_chain_crc=0).encode()
    for be in BACKENDS:
        res = be.scan(buf, 0, be.new_records(2))
        mm = mmap.mmap(-1, 40 + 4 * 3 + 20 * 3)  # room for 2 items
        hdr = D.IndexHeader()
        assert be.index_put(mm, 3, 3, hdr, buf, res, 0, 0) == (0, 2)  # u, a went in; resume at key 2
        assert hdr.index_count == 3 and hdr.end_phy_offset == 48
        hdr2 = D.IndexHeader(hdr.end_timestamp, hdr.end_timestamp, 48, 48, 0, 1)
        mm2 = mmap.mmap(-1, len(mm))
        assert be.index_put(mm2, 3, 3, hdr2, buf, res, 0, 2) == (1, 0)
        assert hdr2.index_count == 3  # b, c
        # Re-indexing the same record into that file is a no-op (phy < end rule
        # does not apply at equality, but a full file is full).
        assert be.index_put(mm2, 3, 3, hdr2, buf, res, 0, 0) == (0, 0)
