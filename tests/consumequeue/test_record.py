import struct

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.common.msgid import UniqKeyGenerator, offset_msg_id, parse_offset_msg_id, parse_uniq_key
from consumequeue import batch as batches
from consumequeue import record as M
from tests.helpers.spec_vectors import MESSAGE_146, MESSAGE_146_OFFSET_MSG_ID

GOLDEN = M.MessageRecord(
    topic="T", body=b"hi", properties={"TAGS": "TagA", "UNIQ_KEY": "AC110001000118B4AAC2000000000000"},
    queue_offset=5, physical_offset=1000, born_timestamp=1700000000000,
    born_host=M.HostAddr("127.0.0.1", 50000), store_timestamp=1700000000123,
    store_host=M.HostAddr("10.0.0.1", 10911))


def test_golden_146_byte_vector_encodes_and_decodes():
    assert M.encode(GOLDEN) == MESSAGE_146
    rec = M.decode(MESSAGE_146, check_crc=True)
    assert rec == attrs.evolve(GOLDEN, body_crc=0x58932AAC, magic=M.MAGIC_V1)
    assert rec.tags_code == 2598919  # spec §2: "TagA"
    assert M.encode(rec) == MESSAGE_146
    assert M.record_length(2, 1, 52) == 146 == 91 + 2 + 1 + 52
    assert M.check_record(MESSAGE_146, 1000) is None
    assert offset_msg_id(rec.store_host, rec.physical_offset) == MESSAGE_146_OFFSET_MSG_ID
    assert M.read_store_timestamp(MESSAGE_146) == 1700000000123


def test_ipv6_hosts_set_sysflag_bits_and_move_fields():
    m = attrs.evolve(GOLDEN, born_host=M.HostAddr("::1", 7), store_host=M.HostAddr("fe80::2", 10911))
    raw = M.encode(m)
    assert len(raw) == 146 + 12 + 12
    sysflag = struct.unpack_from(">i", raw, M.POS_SYSFLAG)[0]
    assert sysflag == M.BORNHOST_V6_FLAG | M.STOREHOST_V6_FLAG
    assert M.store_timestamp_pos(sysflag) == 48 + 20
    assert struct.unpack_from(">q", raw, 68)[0] == 1700000000123
    back = M.decode(raw)
    assert back.born_host == M.HostAddr("::1", 7) and back.store_host.is_v6
    assert M.encode(back) == raw
    mid = offset_msg_id(back.store_host, 1000)
    assert len(mid) == 56 and parse_offset_msg_id(mid) == (M.HostAddr("fe80::2", 10911), 1000)
    # Only the born host v6: only bit 0x10.
    raw2 = M.encode(attrs.evolve(GOLDEN, born_host=M.HostAddr("::1", 7)))
    assert struct.unpack_from(">i", raw2, M.POS_SYSFLAG)[0] == M.BORNHOST_V6_FLAG


def test_v2_magic_for_long_topics_only():
    long_topic = "%RETRY%" + "g" * 121  # 128 chars
    raw = M.encode(attrs.evolve(GOLDEN, topic=long_topic))
    assert struct.unpack_from(">i", raw, 4)[0] == M.MAGIC_V2
    assert len(raw) == 146 - 1 + 128 + 1  # 128-char topic, TOPICLEN grows to 2 bytes
    assert M.decode(raw).topic == long_topic
    raw127 = M.encode(attrs.evolve(GOLDEN, topic="t" * 127))
    assert struct.unpack_from(">i", raw127, 4)[0] == M.MAGIC_V1
    # Java compares chars, not bytes: 127 two-byte chars would overflow v1's i8.
    with pytest.raises(M.MessageFormatError):
        M.encode(attrs.evolve(GOLDEN, topic="é" * 127))
    assert M.encode(attrs.evolve(GOLDEN, topic="é" * 127, magic=M.MAGIC_V2))


def test_properties_parser_follows_java_rules():
    P = M.string_to_properties
    assert P("TAGS\x01TagA\x02KEYS\x01a b\x02") == {"TAGS": "TagA", "KEYS": "a b"}
    assert P("a\x01b") == {"a": "b"}  # no trailing separator
    assert P("ab\x02a\x01\x02\x01x\x02") == {}  # too short, empty value, empty name
    assert P("k\x01v\x01w\x02") == {"k": "v\x01w"}  # split at the first 0x01
    assert P("k\x01old\x02k\x01new\x02") == {"k": "new"}  # HashMap.put
    assert P("\U0001F600\x01") == {}  # 2 code points but 3 UTF-16 units: kept, empty value
    assert P("\U0001F600\x01x") == {"\U0001F600": "x"}
    assert M.properties_to_string({"A": "1", "B": None, "C": "x y"}) == "A\x011\x02C\x01x y\x02"
    with pytest.raises(M.MessageFormatError):
        M.properties_to_string({"A": "bad\x02value"})


def test_keys_tags_uniq_accessors():
    m = attrs.evolve(GOLDEN, properties={"KEYS": " k1  k2 ", "TAGS": "", "UNIQ_KEY": "U"})
    assert m.keys == ["k1", "k2"] and m.uniq_key == "U" and m.tags_code == 0


def test_body_crc_is_masked_and_checked():
    raw = bytearray(MESSAGE_146)
    assert struct.unpack_from(">I", raw, 8)[0] == 0x58932AAC
    raw[88] ^= 1  # flip a body byte
    assert "BODYCRC" in M.check_record(bytes(raw))
    with pytest.raises(M.MessageFormatError, match="BODYCRC"):
        M.decode(bytes(raw), check_crc=True)
    assert M.decode(bytes(raw)).body == b"ii"


def test_check_record_reasons():
    assert "PHYSICALOFFSET" in M.check_record(MESSAGE_146, 48)
    assert "TOTALSIZE" in M.check_record(MESSAGE_146 + b"\0")
    bad = bytearray(MESSAGE_146)
    bad[4:8] = b"\0\0\0\1"
    assert "magic" in M.check_record(bytes(bad))
    bad = bytearray(MESSAGE_146)
    struct.pack_into(">h", bad, 0x5C, 53)  # PROPLEN one too long
    assert "PROPERTIESLEN" in M.check_record(bytes(bad))
    assert M.check_record(b"\0" * 4) is not None
    assert not M.looks_like_record(b"x" * 10) and M.looks_like_record(MESSAGE_146)


def test_patch_fields_in_place():
    buf = bytearray(M.encode(GOLDEN))
    M.set_queue_offset(buf, 77)
    M.set_physical_offset(buf, 48)
    M.set_store_timestamp(buf, 5)
    r = M.decode(buf)
    assert (r.queue_offset, r.physical_offset, r.store_timestamp) == (77, 48, 5)
    assert M.read_topic_queue(buf) == ("T", 0, 0)


def test_blank_filler():
    assert M.encode_blank(1000) == struct.pack(">ii", 1000, -875286124)
    assert M.is_blank(M.encode_blank(8)) and not M.is_blank(MESSAGE_146)
    with pytest.raises(M.MessageFormatError):
        M.encode_blank(7)


def test_batch_body_roundtrip_and_records():
    items = [batches.BatchItem(b"one", {"KEYS": "a"}, flag=3), batches.BatchItem(b"", {}), batches.BatchItem(b"x" * 300, {"TAGS": "t"})]
    body = batches.encode_batch(items)
    total, magic, crc, flag, blen = struct.unpack_from(">iiiii", body, 0)
    assert (total, magic, crc, flag, blen) == (4 * 5 + 3 + 2 + len("KEYS\x01a\x02"), 0, 0, 3, 3)
    assert batches.decode_batch(body) == items
    recs = batches.records_from_batch(body, attrs.evolve(GOLDEN, properties={}, prepared_transaction_offset=9))
    decoded = [M.decode(r, check_crc=True) for r in recs]
    assert [d.body for d in decoded] == [b"one", b"", b"x" * 300]
    assert [d.flag for d in decoded] == [3, 0, 0]
    assert all(d.topic == "T" and d.prepared_transaction_offset == 0 for d in decoded)
    with pytest.raises(M.MessageFormatError):
        batches.decode_batch(body[:-1])


def test_offset_msg_id_and_uniq_key():
    host, phys = parse_offset_msg_id(MESSAGE_146_OFFSET_MSG_ID)
    assert host == M.HostAddr("10.0.0.1", 10911) and phys == 1000
    with pytest.raises(M.MessageFormatError):
        parse_offset_msg_id("0A00")
    info = parse_uniq_key("AC110001000118B4AAC2000000000000")  # the spec's example
    assert info.ip == bytes([172, 17, 0, 1]) and info.pid == 1 and info.counter == 0
    clock = [1_700_000_000_000]
    gen = UniqKeyGenerator(ip=bytes([10, 0, 0, 1]), pid=70000, class_loader_hash=-2,
                           clock_ms=lambda: clock[0])
    a, b = gen.next(), gen.next()
    assert len(a) == 32 and a != b and a[:24] == b[:24]
    ia, ib = parse_uniq_key(a), parse_uniq_key(b)
    assert ia.pid == 70000 - 65536 and ia.class_loader_hash == -2  # (short) cast
    assert (ia.counter, ib.counter) == (0, 1)
    assert 0 <= ia.ms_since_month_start < 31 * 86400 * 1000


hosts = st.one_of(
    st.builds(M.HostAddr, st.ip_addresses(v=4), st.integers(0, 65535)),
    st.builds(M.HostAddr, st.ip_addresses(v=6), st.integers(0, 65535)))
prop_text = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
                    min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(topic=st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40),
       body=st.binary(max_size=200), props=st.dictionaries(prop_text, prop_text, max_size=5),
       born=hosts, store=hosts, qid=st.integers(-5, 1000), qoff=st.integers(0, 1 << 40),
       sysflag=st.sampled_from([0, 1, 2, 4, 8, 12, 0x100]))
def test_roundtrip_random_records(topic, body, props, born, store, qid, qoff, sysflag):
    m = M.MessageRecord(topic=topic, body=body, properties=props, queue_id=qid, queue_offset=qoff,
                        sysflag=sysflag, born_host=born, store_host=store, store_timestamp=123)
    try:
        raw = M.encode(m)
    except M.MessageFormatError:
        assert len(topic.encode()) > 127
        return
    back = M.decode(raw, check_crc=True)
    assert back.properties == props and back.topic == topic and back.body == body
    assert back.sysflag == m.effective_sysflag and back.born_host == born
    assert M.encode(back) == raw
    assert M.check_record(raw) is None


@settings(max_examples=200, deadline=None)
@given(topic=st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=140),
       body=st.binary(max_size=100), props=st.dictionaries(prop_text, prop_text, max_size=4),
       born=hosts, store=hosts, sysflag=st.sampled_from([0, 1, 0x100]), data=st.data())
def test_decode_fast_path_equals_the_layout_walk(topic, body, props, born, store, sysflag, data):
    """decode() takes one unpack for the usual record; it must return what
    parse_layout's walk returns (decode with a limit always walks), and on
    damaged bytes fail (or not) exactly as the walk does."""
    m = M.MessageRecord(topic=topic, body=body, properties=props, sysflag=sysflag, born_host=born, store_host=store)
    try:
        raw = bytearray(M.encode(m))
    except M.MessageFormatError:
        return
    mutations = data.draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(0, 255)), max_size=3))
    for at, value in mutations:
        raw[at] = value
    cut = data.draw(st.integers(0, 8))
    buf = bytes(raw[:len(raw) - cut] if cut < len(raw) else raw)
    outcome = []
    for kw in ({}, {"limit": len(buf)}):
        try:
            outcome.append(M.decode(memoryview(buf), **kw))
        except M.MessageFormatError as e:
            outcome.append(("error", e.reason))
    assert outcome[0] == outcome[1]


@given(st.text(alphabet="ab\x01\x02\u00e9\U0001d11e", max_size=14))
def test_properties_split_equals_the_walk(text):
    assert M.string_to_properties(text) == M._properties_walk(text)


def test_delay_tags_code_matches_the_schedule_rule():
    assert M.delay_tags_code("3", 1000) == 1000 + 10_000  # level 3 = 10s
    assert M.delay_tags_code("99", 0) == 7_200_000  # clamped to the last level
    assert M.delay_tags_code("0", 1000) is None and M.delay_tags_code("-2", 1000) is None
    assert M.delay_tags_code("+1", 0) == 1000
    for bad in ("x", "", "+", "2147483648", "１"):
        with pytest.raises(M.MessageFormatError):
            M.delay_tags_code(bad, 0)


# --- limits on outside bytes -------------------------------------------------------

def test_properties_longer_than_a_record_can_hold_are_refused():
    at_limit = "a\x01" + "v" * (M.MAX_PROPERTIES_LEN - 3) + "\x02"
    assert M.string_to_properties(at_limit) == {"a": "v" * (M.MAX_PROPERTIES_LEN - 3)}
    many = "".join(f"k{i}\x01v\x02" for i in range(100_000))
    for text in (at_limit + "b", many):
        with pytest.raises(M.MessageFormatError):
            M.string_to_properties(text)
    # The densest string within the limit holds at most 8192 properties.
    dense = "".join(f"{chr(0x100 + i)}\x01v\x02" for i in range(M.MAX_PROPERTIES_LEN // 4))
    assert len(M.string_to_properties(dense)) == M.MAX_PROPERTIES_LEN // 4 <= 8192


def test_batch_message_count_limit_c_and_general_path_agree():
    from native import sendpath
    limit = sendpath.MAX_BATCH_MESSAGES
    at_limit = batches.encode_batch([batches.BatchItem(b"", {"a": "1"})] * limit)
    over = at_limit + batches.encode_batch([batches.BatchItem(b"", {"a": "1"})])
    assert len(batches.decode_batch_raw(at_limit)) == limit
    with pytest.raises(M.MessageFormatError) as info:
        batches.decode_batch_raw(over)
    assert str(limit) in str(info.value)
    if sendpath.BATCH_AVAILABLE:
        scanned = sendpath.scan_batch(at_limit)
        assert scanned is not None and scanned[1] == limit
        assert sendpath.scan_batch(over) is None  # declined: the general path refuses it


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=40), st.dictionaries(st.text("abUNIQ_KEY", min_size=1, max_size=9),
                                                                  st.text(max_size=6), max_size=3),
                          st.integers(-2 ** 31, 2 ** 31 - 1)), min_size=1, max_size=6),
       st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=4), st.integers(0, 400))
def test_batch_scanner_and_general_decoder_agree_on_damaged_bodies(messages, damage, cut):
    """Whatever the C scanner takes, the general decoder reads to the same
    messages; a body the decoder refuses, the scanner declines."""
    from native import sendpath
    try:
        body = bytearray(batches.encode_batch([batches.BatchItem(b, p, f) for b, p, f in messages]))
    except M.MessageFormatError:
        return
    for at, value in damage:
        if at < len(body):
            body[at] = value
    body = bytes(body[:max(1, len(body) - cut % 5)])
    try:
        general = batches.decode_batch_raw(body)
    except M.MessageFormatError:
        general = None
    if not sendpath.BATCH_AVAILABLE:
        return
    scanned = sendpath.scan_batch(body)
    if scanned is None:
        return  # declined: the general path decides (above, without an unexpected error)
    items, n, _missing, _props = scanned
    assert general is not None and n == len(general)
    for k in range(n):
        it = items[k]
        assert (body[it.body_off:it.body_off + it.body_len], it.flag,
                body[it.props_off:it.props_off + it.props_len]) == general[k]
