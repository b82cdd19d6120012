# Tests of the send hot path's fast paths against the slow, obvious code
# they replace: RemotingCommand.trusted (decoded requests, make_response)
# vs the converting constructor, the shared JSON encoders vs json.dumps,
# HeaderReader's digit fast path vs Java's parseInt rules, message encode()
# vs a field-by-field reference, parse_send_header's name tables.  Each
# would fail if a fast path returned different bytes or values.
import contextlib
import json
import struct

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.processors.send import V2_NAMES, parse_send_header
from broker.remoting.codec import CommandDecoder, encode_command, encode_json_header
from broker.remoting.codes import RPC_TYPE_RESPONSE, LanguageCode, RequestCode, SerializeType
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RequestError
from broker.remoting.header import HeaderReader, encode_json
from consumequeue import record as M

FIELDS = {"a": "pg", "b": "TopicA", "c": "TBW102", "d": "8", "e": "3", "f": "0", "g": "1700000000000",
          "h": "0", "i": "TAGS\x01t\x02KEYS\x01k\x02", "j": "0", "k": "false", "l": "16", "m": "false"}


def _slots(cmd: RemotingCommand) -> tuple:
    return tuple((name, type(getattr(cmd, name)), getattr(cmd, name)) for name in
                 ("code", "language", "version", "opaque", "flag", "remark", "ext_fields", "body", "serialize_type"))


@pytest.mark.parametrize("stype", [SerializeType.JSON, SerializeType.ROCKETMQ])
@pytest.mark.parametrize("remark", [None, "r\u00e9mark"])
def test_decoded_command_equals_converted_one(stype, remark):
    sent = RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=dict(FIELDS, n=7, o=True), body=b"x" * 100,
                           opaque=42, remark=remark, serialize_type=stype)
    dec = CommandDecoder()
    dec.receive_data(encode_command(sent))
    got = dec.next_command()
    # Already what the converters would make of it (a fixed point), with the sent values.
    assert _slots(got) == _slots(RemotingCommand(**{name: value for name, _, value in _slots(got)}))
    assert got == sent
    assert type(got.code) is int and all(type(v) is str for v in got.ext_fields.values())


@pytest.mark.parametrize("stype", [SerializeType.JSON, SerializeType.ROCKETMQ])
def test_make_response_equals_converted_one(stype):
    req = RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=9, serialize_type=stype)
    fields = {"msgId": "AB", "queueId": 3, "queueOffset": 12, "transactionId": None, "TRACE_ON": True}
    for body in (b"", b"body", bytearray(b"ba"), None):
        got = req.make_response(5, "why", ext_fields=fields, body=body)
        want = RemotingCommand(5, remark="why", ext_fields=fields, body=body, opaque=9, flag=RPC_TYPE_RESPONSE,
                               serialize_type=stype)
        assert _slots(got) == _slots(want)
        assert got.ext_fields == {"msgId": "AB", "queueId": "3", "queueOffset": "12", "TRACE_ON": "true"}
        assert encode_command(got) == encode_command(want)
    assert _slots(req.make_response()) == _slots(RemotingCommand(0, opaque=9, flag=RPC_TYPE_RESPONSE,
                                                                 serialize_type=stype))


@given(st.dictionaries(st.text(), st.one_of(st.text(), st.integers(), st.booleans())))
def test_shared_json_encoders_match_json_dumps(fields):
    cmd = RemotingCommand(7, ext_fields=fields, remark="\u2603\"\\", opaque=3, language=LanguageCode.CPP)
    obj = {"code": 7, "flag": 0, "language": "CPP", "opaque": 3, "serializeTypeCurrentRPC": "JSON",
           "version": cmd.version, "remark": cmd.remark}
    if cmd.ext_fields:
        obj["extFields"] = cmd.ext_fields
    assert encode_json_header(cmd) == json.dumps(obj, sort_keys=True, separators=(",", ":"),
                                                 ensure_ascii=False).encode("utf-8")
    assert encode_json(fields) == json.dumps(fields, sort_keys=True, separators=(",", ":"),
                                             ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize("text,value", [("0", 0), ("7", 7), ("007", 7), ("+7", 7), ("-1", -1),
                                        ("2147483647", 2147483647), ("-2147483648", -2147483648)])
def test_header_int_fast_path_values(text, value):
    assert HeaderReader({"x": text}).int("x") == value


@pytest.mark.parametrize("text", ["2147483648", "99999999999999999999", "", " 1", "1 ", "\u0663", "\u00b2",
                                  "1.0", "0x1", "-", "-2147483649"])
def test_header_int_fast_path_rejects_what_java_rejects(text):
    with pytest.raises(RequestError) as e:
        HeaderReader({"x": text}).int("x")
    assert e.value.remark == f"the custom field <x> is not a valid int: {text!r}"


def test_header_long_fast_path():
    assert HeaderReader({"x": "9223372036854775807"}).long("x") == (1 << 63) - 1
    with pytest.raises(RequestError):
        HeaderReader({"x": "9223372036854775808"}).long("x")


def test_parse_send_header_short_and_full_names_agree():
    short = RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=FIELDS)
    full = RemotingCommand(RequestCode.SEND_MESSAGE, ext_fields={V2_NAMES[k]: v for k, v in FIELDS.items()})
    h = parse_send_header(short)
    assert h == parse_send_header(full)
    assert (h.producer_group, h.topic, h.queue_id, h.born_timestamp, h.max_reconsume_times, h.batch) == \
        ("pg", "TopicA", 3, 1700000000000, 16, False)
    assert h.properties == {"TAGS": "t", "KEYS": "k"}
    with pytest.raises(RequestError, match="<b> is null"):
        parse_send_header(RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields={"a": "pg"}))
    with pytest.raises(RequestError, match="<topic> is null"):
        parse_send_header(RemotingCommand(RequestCode.SEND_MESSAGE, ext_fields={"producerGroup": "pg"}))


def reference_encode(m: M.MessageRecord) -> bytes:
    """The record, field by field from the spec, the slow way."""
    topic = m.topic.encode("utf-8")
    props = "".join(f"{k}\x01{v}\x02" for k, v in m.properties.items()).encode("utf-8")
    v2 = m.magic == M.MAGIC_V2
    sysflag = m.effective_sysflag
    parts = [struct.pack(">i", m.magic), struct.pack(">I", M.masked_crc32(m.body) if m.body_crc is None
                                                     else m.body_crc & 0xFFFFFFFF),
             struct.pack(">iiqqiq", m.queue_id, m.flag, m.queue_offset, m.physical_offset, sysflag,
                         m.born_timestamp),
             m.born_host.ip.packed, struct.pack(">i", m.born_host.port), struct.pack(">q", m.store_timestamp),
             m.store_host.ip.packed, struct.pack(">i", m.store_host.port),
             struct.pack(">iqi", m.reconsume_times, m.prepared_transaction_offset, len(m.body)), m.body,
             struct.pack(">h" if v2 else ">B", len(topic)), topic, struct.pack(">h", len(props)), props]
    rest = b"".join(parts)
    return struct.pack(">i", 4 + len(rest)) + rest


@pytest.mark.parametrize("magic", [M.MAGIC_V1, M.MAGIC_V2])
@pytest.mark.parametrize("hosts", [("10.1.2.3", "127.0.0.1"), ("::1", "127.0.0.1"), ("10.0.0.1", "fe80::2")])
def test_encode_matches_reference(magic, hosts):
    m = M.MessageRecord(topic="T\u00e9", body=b"\x00body" * 7, properties={"TAGS": "a", "UNIQ_KEY": "U"},
                        queue_id=5, flag=-3, queue_offset=11, physical_offset=99, sysflag=M.COMPRESSED_FLAG,
                        born_timestamp=123, born_host=M.HostAddr(hosts[0], 4000), store_timestamp=456,
                        store_host=M.HostAddr(hosts[1], 10911), reconsume_times=2,
                        prepared_transaction_offset=7, magic=magic)
    raw = M.encode(m)
    assert type(raw) is bytes
    assert raw == reference_encode(m)
    assert M.encode(M.decode(raw)) == raw


# --- the plain-record fast path vs the general path (its oracle) -----------------

_PROP_NAMES = st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "WAIT", "a", "näme", "DELAY", "CLUSTER", "X"])
_PROP_VALUES = st.text(alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
                       max_size=12)


def _processor_with_keys():
    """A SendProcessor whose only collaborators in use are its config and a
    UNIQ_KEY generator that counts (the fast path touches nothing else)."""
    import itertools

    from broker.config import BrokerConfig, LiveConfig
    from broker.processors.send import SendProcessor

    cfg, _ = BrokerConfig.from_dict({"brokerName": "b", "brokerIP1": "10.0.0.7", "listenPort": "10911",
                                     "brokerClusterName": "DefaultCluster", "dLegerGroup": "b",
                                     "dLegerPeers": "n0-127.0.0.1:40911", "dLegerSelfId": "n0",
                                     "storePathRootDir": "/nonexistent"})
    seq = itertools.count()

    class Keys:
        def next(self):
            return f"GEN{next(seq)}"
    return SendProcessor(LiveConfig(cfg), None, None, None, None, uniq_keys=Keys()), cfg


@given(props=st.lists(st.tuples(_PROP_NAMES, _PROP_VALUES), max_size=5),
       raw=st.one_of(st.none(), st.text(alphabet="ab\x01\x02", max_size=8)),
       born_v6=st.booleans(), sysflag=st.sampled_from([0, 1, 0x10, 0x30, 0x100]))
def test_plain_record_equals_the_general_path(props, raw, born_v6, sysflag):
    """Whatever the properties, the fast path either declines or builds a
    record that means what the general path's means (same fields, same
    properties as any reader parses them; a generated UNIQ_KEY aside), and
    for a well-formed string (every segment name\x01value\x02, names
    unique) the very same bytes."""
    from broker.processors.send import SendHeader, host_of

    proc, cfg = _processor_with_keys()
    text = raw if raw is not None else "".join(f"{k}\x01{v}\x02" for k, v in props)
    header = SendHeader("pg", "TopicA", "TBW102", 8, 3, sysflag, 1_700_000_000_000, 5, text, 2)
    born = host_of("[::1]:5555" if born_v6 else "127.0.0.1:5555")
    fast = proc._plain_record(header, sysflag, 3, b"body", born, 42)
    if fast is None:
        return  # declined: the general path serves it
    rec, uniq = fast
    general = M.MessageRecord(topic="TopicA", body=b"body", properties={
        **header.properties, "UNIQ_KEY": header.properties.get("UNIQ_KEY") or uniq, "CLUSTER": "DefaultCluster"},
        queue_id=3, flag=5, sysflag=sysflag, born_timestamp=1_700_000_000_000, born_host=born,
        store_timestamp=42, store_host=cfg.store_host, reconsume_times=2)
    got = M.decode(rec)
    assert got.properties == general.properties and got.uniq_key == uniq
    assert attrs.evolve(got, properties={}) == attrs.evolve(M.decode(M.encode(general)), properties={})
    segments = text.split("\x02")[:-1] if text else []
    names = [seg.partition("\x01")[0] for seg in segments]
    well_formed = all(seg.count("\x01") == 1 and not seg.startswith("\x01") and not seg.endswith("\x01")
                      for seg in segments) and len(set(names)) == len(names)
    if well_formed:
        assert rec == M.encode(attrs.evolve(general, properties=dict(
            [*((k, v) for k, v in header.properties.items()), ("UNIQ_KEY", uniq), ("CLUSTER", "DefaultCluster")])))


_BATCH_ITEM_PROPS = st.one_of(
    st.lists(st.tuples(_PROP_NAMES.filter(lambda n: n != "DELAY"), _PROP_VALUES), max_size=4).map(
        lambda kv: "".join(f"{k}\x01{v}\x02" for k, v in kv).encode()),
    st.text(alphabet="ab\x01\x02", max_size=8).map(str.encode),
    st.binary(max_size=6))  # invalid UTF-8 among them


class _MonthKeys:
    """UniqKeyGenerator's interface with a fixed time part: every path makes
    the same keys in the same order (next() is reserve(1), formatted)."""

    prefix = "AC11000100002A9F"

    def __init__(self) -> None:
        self.counter = 0

    def reserve(self, n: int) -> tuple[int, int]:
        first, self.counter = self.counter, (self.counter + n) & 0xFFFF
        return 0x1234, first

    def next(self) -> str:
        diff, counter = self.reserve(1)
        return self.prefix + struct.pack(">iH", diff, counter).hex().upper()


def _batch_records(items, born_v6: bool, path: str) -> list[bytes]:
    """SendProcessor._records of a batch of (body, flag, properties bytes)
    by `path`: "c" (as served), "plain" (no C) or "general" (neither)."""
    from unittest import mock

    from broker.common.values import TopicConfig
    from broker.processors import send_native
    from broker.processors.send import SendHeader, SendProcessor, host_of

    proc, _ = _processor_with_keys()
    proc.uniq_keys, proc.clock_ms = _MonthKeys(), lambda: 42
    body = b"".join(struct.pack(">iiiii", 22 + len(b) + len(p), 0, 0, f, len(b)) + b + struct.pack(">h", len(p)) + p
                    for b, f, p in items)  # MessageDecoder.encodeMessages, properties bytes as given
    header = SendHeader("pg", "TopicA", "TBW102", 8, 3, 0, 1_700_000_000_000, 0, "", 2, batch=True)
    born = host_of("[::1]:5555" if born_v6 else "127.0.0.1:5555")
    with contextlib.ExitStack() as stack:
        if path != "c":
            stack.enter_context(mock.patch.object(send_native, "batch_records", lambda *a: None))
        if path == "general":
            stack.enter_context(mock.patch.object(SendProcessor, "_plain_properties", lambda self, text: None))
        records, _ = proc._records(header, TopicConfig("TopicA"), 3, body, born)
    return [bytes(r) for r in records]


@given(items=st.lists(st.tuples(st.binary(min_size=1, max_size=20), st.integers(0, 7), _BATCH_ITEM_PROPS),
                      min_size=1, max_size=6), born_v6=st.booleans())
def test_batch_records_equal_the_general_path(items, born_v6):
    """A SEND_BATCH's records built in C (every message plain) or from
    wire-form parts (messages with plain properties) mean what the general
    path's mean (every field, the properties as a reader parses them, the
    same UNIQ_KEYs made in the same order) and are the very same bytes when
    each message's properties are well-formed."""
    native = _batch_records(items, born_v6, "c")
    plain = _batch_records(items, born_v6, "plain")
    general = _batch_records(items, born_v6, "general")
    assert native == plain  # the C twin is the wire-form path, byte for byte
    assert len(plain) == len(general) == len(items)
    for (item_body, flag, props), f, g in zip(items, plain, general):
        got, want = M.decode(f), M.decode(g)
        assert attrs.evolve(got, properties={}) == attrs.evolve(want, properties={})
        assert got.properties == want.properties and got.body == item_body and got.flag == flag
        text = props.decode("utf-8", "replace")
        segments = text.split("\x02")[:-1] if text else []
        names = [seg.partition("\x01")[0] for seg in segments]
        if all(seg.count("\x01") == 1 and not seg.startswith("\x01") and not seg.endswith("\x01")
               for seg in segments) and len(set(names)) == len(names) and text.encode() == props:
            assert f == g


@settings(max_examples=300, deadline=None)
@given(items=st.lists(st.tuples(st.binary(min_size=1, max_size=12), st.integers(0, 3), _BATCH_ITEM_PROPS),
                      min_size=1, max_size=4),
       damage=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=4),
       cut=st.integers(0, 30), junk=st.binary(max_size=40))
def test_native_batch_takes_hostile_bodies_safely(items, damage, cut, junk):
    """Damaged, truncated and random SEND_BATCH bodies: the C scanner either
    declines (the general path then names the error) or builds exactly the
    records the Python wire-form path builds from the same bytes."""
    from unittest import mock

    from broker.common.values import TopicConfig
    from broker.processors import send_native
    from broker.processors.send import SendError, SendHeader, host_of
    from native import sendpath

    if not sendpath.BATCH_AVAILABLE:
        pytest.skip("the native extension is not built (make native)")
    body = bytearray(b"".join(struct.pack(">iiiii", 22 + len(b) + len(p), 0, 0, f, len(b)) + b +
                              struct.pack(">h", len(p)) + p for b, f, p in items))
    for at, value in damage:
        body[at % len(body)] = value
    body = bytes(body[:max(0, len(body) - cut)]) + junk
    header = SendHeader("pg", "TopicA", "TBW102", 8, 3, 0, 1, 0, "", 0, batch=True)
    real, taken = send_native.batch_records, []

    def spy(*args):
        taken.append(real(*args))
        return taken[-1]

    def records(batch_records):
        proc, _ = _processor_with_keys()
        proc.uniq_keys, proc.clock_ms = _MonthKeys(), lambda: 42
        with mock.patch.object(send_native, "batch_records", batch_records):
            return [bytes(r) for r in proc._records(header, TopicConfig("TopicA"), 3, body, host_of("0.0.0.0:0"))[0]]

    try:
        native = records(spy)
    except (M.MessageFormatError, SendError):
        assert taken == [None]  # malformed or empty: declined, and the general path names it
        return
    if taken[0] is None:
        return  # declined: the Python path built them
    assert native == records(lambda *a: None)


def test_usual_batches_take_the_native_path():
    from broker.processors import send_native
    from native import sendpath

    if not sendpath.BATCH_AVAILABLE:
        pytest.skip("the native extension is not built (make native)")
    items = [(b"x" * 100, 0, b"TAGS\x01t\x02UNIQ_KEY\x01AB%02X\x02" % i) for i in range(3)] + [(b"y", 1, b"")]
    body = b"".join(struct.pack(">iiiii", 22 + len(b) + len(p), 0, 0, f, len(b)) + b + struct.pack(">h", len(p)) + p
                    for b, f, p in items)
    recs = send_native.batch_records(body, b"TopicA", M.MAGIC_V1, 3, 0, 1, 0, bytes(8), bytes(8), 42, b"C",
                                     _MonthKeys())
    assert recs is not None and [M.decode(r).uniq_key for r in recs] == ["AB00", "AB01", "AB02",
                                                                       _MonthKeys().next()]
    for declined in (b"DELAY\x013\x02", b"CLUSTER\x01c\x02", b"TAGS\x01t", b"\xff\x01\x02", b"UNIQ_KEY\x01\x02"):
        bad = body + struct.pack(">iiiii", 22 + 1 + len(declined), 0, 0, 0, 1) + b"z" + \
            struct.pack(">h", len(declined)) + declined
        assert send_native.batch_records(bad, b"TopicA", M.MAGIC_V1, 3, 0, 1, 0, bytes(8), bytes(8), 42, b"C",
                                         _MonthKeys()) is None, declined
    assert send_native.batch_records(body[:-1], b"TopicA", M.MAGIC_V1, 3, 0, 1, 0, bytes(8), bytes(8), 42, b"C",
                                     _MonthKeys()) is None  # malformed: the general path names the error


def test_plain_record_serves_the_usual_message_and_declines_the_rest():
    from broker.processors.send import SendHeader, host_of

    proc, _ = _processor_with_keys()
    born = host_of("127.0.0.1:5555")

    def fast(text):
        header = SendHeader("pg", "TopicA", "TBW102", 8, 3, 0, 1, 0, text)
        return proc._plain_record(header, 0, 3, b"b", born, 1)
    rec, uniq = fast("TAGS\x01t\x02KEYS\x01k\x02")
    assert uniq == "GEN0" and M.decode(rec).properties == {"TAGS": "t", "KEYS": "k", "UNIQ_KEY": "GEN0",
                                                          "CLUSTER": "DefaultCluster"}
    assert fast("UNIQ_KEY\x01mine\x02")[1] == "mine"
    assert fast("")[1] == "GEN1"
    for declined in ("DELAY\x013\x02", "CLUSTER\x01c\x02", "TAGS\x01t", "UNIQ_KEY\x01\x02",
                     "UNIQ_KEY\x01a\x02UNIQ_KEY\x01b\x02", "a\x01b\x01\x02"):
        assert fast(declined) is None, declined


@pytest.mark.parametrize("stype", [SerializeType.JSON, SerializeType.ROCKETMQ])
@pytest.mark.parametrize("remark", [None, "rémark \x01"])
def test_encode_response_equals_the_command_path(stype, remark):
    from broker.remoting.codec import encode_response
    req = RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=77, serialize_type=stype)
    fields = {"msgId": "0A00000700002A9F", "queueId": "3", "queueOffset": "12", "transactionId": "ü\"\\",
              "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
    for code in (0, 12):
        assert encode_response(req, code, remark, fields) == \
            encode_command(req.make_response(code, remark, fields).as_response_to(req))
