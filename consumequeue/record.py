# Owns RocketMQ's commitlog message record (spec §1), byte for byte: the v1/v2
# record layout with IPv4/IPv6 born and store hosts, the 0x01/0x02 properties
# string, the masked body CRC, the end-of-file BLANK filler of a plain
# commitlog, SEND_BATCH bodies (§1.10), and in-place patching of the fields
# the leader fills in at append time (QUEUEOFFSET, PHYSICALOFFSET).
# Message ids (offsetMsgId, UNIQ_KEY) live in broker/common/msgid.py.
#
# Decoding follows the broker's own reader (`checkMessageAndReturnSize`): a
# record is accepted only if every length fits and TOTALSIZE equals the
# recomputed length.  Strings decode as Java's `new String(b, UTF_8)` does
# (malformed bytes become U+FFFD), so tag and key hashes agree with Java.
#
# Limits on outside bytes, each refused with MessageFormatError: a record's
# lengths must fit its TOTALSIZE (and its bytes); a properties string is at
# most MAX_PROPERTIES_LEN (32767, the record's i16) characters wherever it
# comes from -- a record, a batch body or a send header -- so it holds at
# most 8192 properties (a name, 0x01, a value, 0x02: 4 characters at least).
import functools
import ipaddress
import struct

import attrs

from native.hashing import java_hash_str, masked_crc32

MAGIC_V1 = -626843481  # 0xDAA320A7
MAGIC_V2 = -626843477  # 0xDAA320AB: TOPICLEN is an i16 instead of an i8
BLANK_MAGIC = -875286124  # 0xCBD43194, the end-of-file filler of a plain commitlog
END_FILE_MIN_BLANK_LENGTH = 8

# SYSFLAG bits (MessageSysFlag).
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_MASK = 0xC
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
BORNHOST_V6_FLAG = 0x10
STOREHOST_V6_FLAG = 0x20
NEED_UNWRAP_FLAG = 0x40
INNER_BATCH_FLAG = 0x80
COMPRESSION_TYPE_MASK = 0x700

# Fixed field positions (the same for every host family).
POS_TOTALSIZE = 0
POS_MAGIC = 4
POS_BODYCRC = 8
POS_QUEUEID = 12
POS_FLAG = 16
POS_QUEUEOFFSET = 20
POS_PHYSICALOFFSET = 28
POS_SYSFLAG = 36
POS_BORNTIMESTAMP = 40
POS_BORNHOST = 48

# Property names the store reads (MessageConst).
PROPERTY_TAGS = "TAGS"
PROPERTY_KEYS = "KEYS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_DELAY = "DELAY"
PROPERTY_CLUSTER = "CLUSTER"
KEY_SEPARATOR = " "
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
MAX_PROPERTIES_LEN = 32767
MAX_V1_TOPIC_CHARS = 127  # Byte.MAX_VALUE, compared against Java chars

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
# The broker's default `messageDelayLevel`, in ms; level n is entry n-1.
DEFAULT_DELAY_LEVELS_MS = (1000, 5000, 10000, 30000, 60000, 120000, 180000, 240000, 300000,
                           360000, 420000, 480000, 540000, 600000, 1200000, 1800000, 3600000, 7200000)

I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_HEAD = struct.Struct(">iiiiiqqiq")  # TOTALSIZE .. BORNTIMESTAMP (48 bytes)
_TAIL = struct.Struct(">iqi")  # RECONSUMETIMES, PREPAREDTRANSACTIONOFFSET, BODYLEN
_I16 = struct.Struct(">h")
_U8 = struct.Struct(">B")
_BLANK = struct.Struct(">ii")


class MessageFormatError(ValueError):
    """Bytes that are not a well-formed RocketMQ message record (or batch)."""

    def __init__(self, reason: str, offset: int = 0):
        super().__init__(f"{reason} (at +{offset})" if offset else reason)
        self.reason = reason
        self.offset = offset


def host_flags(sysflag: int, born_v6: bool, store_v6: bool) -> int:
    """`sysflag` with the V6 bits saying what the hosts are (the one rule:
    the broker sets them from the hosts, whatever the producer sent)."""
    return (sysflag & ~(BORNHOST_V6_FLAG | STOREHOST_V6_FLAG)) | (BORNHOST_V6_FLAG if born_v6 else 0) | \
        (STOREHOST_V6_FLAG if store_v6 else 0)


def _ip(value) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if isinstance(value, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        return value
    if isinstance(value, bytearray):
        value = bytes(value)
    return _parse_ip(value)


# A broker sees few distinct hosts and parses them on every send and decode;
# ipaddress parsing was the top per-message cost in the master's profile.
@functools.lru_cache(maxsize=4096)
def _parse_ip(value: str | bytes) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(value)


@attrs.frozen
class HostAddr:
    """A socket address as the record stores it: raw IP bytes then i32 port."""

    ip: ipaddress.IPv4Address | ipaddress.IPv6Address = attrs.field(converter=_ip)
    port: int = 0

    @property
    def is_v6(self) -> bool:
        return self.ip.version == 6

    @property
    def packed(self) -> bytes:
        return self.ip.packed + I32.pack(self.port)

    @classmethod
    def parse(cls, text: str) -> "HostAddr":
        """`1.2.3.4:10911` or `[::1]:10911`."""
        host, _, port = text.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"not a host:port address: {text!r}")
        return cls(host.strip("[]"), int(port))

    def __str__(self) -> str:
        return f"[{self.ip}]:{self.port}" if self.is_v6 else f"{self.ip}:{self.port}"


LOCALHOST = HostAddr("127.0.0.1", 0)


def host_len(sysflag: int, v6_flag: int) -> int:
    return 20 if sysflag & v6_flag else 8


def store_timestamp_pos(sysflag: int) -> int:
    return POS_BORNHOST + host_len(sysflag, BORNHOST_V6_FLAG)


def java_len(s: str) -> int:
    """String.length(): UTF-16 code units."""
    return len(s.encode("utf-16-le", "surrogatepass")) // 2


def record_length(body_len: int, topic_len: int, props_len: int, *, sysflag: int = 0,
                  v2: bool = False) -> int:
    """MessageExtEncoder.calMsgLength: TOTALSIZE for the given field sizes."""
    bh = host_len(sysflag, BORNHOST_V6_FLAG)
    sh = host_len(sysflag, STOREHOST_V6_FLAG)
    return 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + bh + 8 + sh + 4 + 8 + 4 + body_len \
        + (2 if v2 else 1) + topic_len + 2 + props_len


# --- properties ----------------------------------------------------------

def properties_to_string(props: dict) -> str:
    """messageProperties2String: `name 0x01 value 0x02` per non-null pair, in
    the dict's order (Java's order is HashMap's; readers must not care)."""
    parts = []
    for name, value in props.items():
        if value is None:
            continue
        if type(name) is not str or type(value) is not str:  # str() of a str is itself: skip the calls
            name, value = str(name), str(value)
        if not name or NAME_VALUE_SEPARATOR in name or PROPERTY_SEPARATOR in name:
            raise MessageFormatError(f"bad property name {name!r}")
        if PROPERTY_SEPARATOR in value:
            raise MessageFormatError(f"property {name!r} value contains the 0x02 separator")
        parts.append(f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}")
    return "".join(parts)


def string_to_properties(text: str) -> dict[str, str]:
    """string2messageProperties, rule for rule: split on 0x02; a segment under
    3 chars is ignored; it splits at the first 0x01 and needs a non-empty name
    and value; a later duplicate name wins (HashMap.put).  MessageFormatError
    for a string longer than MAX_PROPERTIES_LEN characters (no record can
    carry it: a UTF-8 byte is at most one character)."""
    if len(text) > MAX_PROPERTIES_LEN:
        raise MessageFormatError(f"properties of {len(text)} characters exceed {MAX_PROPERTIES_LEN}")
    # The usual string, every segment `name 0x01 value` with both non-empty
    # (so none is under 3 chars): split at once.  Anything else: the walk.
    out: dict[str, str] = {}
    parts = text.split(PROPERTY_SEPARATOR)
    if parts[-1] == "":
        parts.pop()
    for seg in parts:
        name, _, value = seg.partition(NAME_VALUE_SEPARATOR)
        if not name or not value:
            break
        out[name] = value
    else:
        return out
    return _properties_walk(text)


def _properties_walk(text: str) -> dict[str, str]:
    """string_to_properties segment by segment, for any string."""
    out: dict[str, str] = {}
    n = len(text)
    i = 0
    while i < n:
        j = text.find(PROPERTY_SEPARATOR, i)
        if j < 0:
            j = n
        # Java counts UTF-16 units; Python str counts code points.
        if j - i >= 3 or java_len(text[i:j]) >= 3:
            k = text.find(NAME_VALUE_SEPARATOR, i)
            if i < k < j - 1:
                out[text[i:k]] = text[k + 1:j]
        i = j + 1
    return out


def tags_code(tags: str | None) -> int:
    """ConsumeQueue tagsCode: String.hashCode of the whole TAGS value, 0 if none."""
    return java_hash_str(tags) if tags else 0


def delay_tags_code(level_text: str, store_timestamp: int,
                    levels_ms=DEFAULT_DELAY_LEVELS_MS) -> int | None:
    """For SCHEDULE_TOPIC_XXXX the CQ holds the delivery time instead of the
    tag hash.  Returns None when the level leaves the tag hash in place (level
    <= 0); raises MessageFormatError where Java's Integer.parseInt throws."""
    level = parse_java_int(level_text)
    level = min(level, len(levels_ms))
    if level <= 0:
        return None
    return store_timestamp + levels_ms[level - 1]


def parse_java_int(text: str) -> int:
    """Integer.parseInt for ASCII input: optional sign, digits, int32 range."""
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body or not body.isascii() or not body.isdigit():
        raise MessageFormatError(f"not an int: {text!r}")
    value = int(text)
    if not -(1 << 31) <= value < (1 << 31):
        raise MessageFormatError(f"int out of range: {text!r}")
    return value


# --- the record ----------------------------------------------------------

@attrs.frozen
class MessageRecord:
    """One commitlog message record.  `body_crc` None means "compute on
    encode"; `magic` None means "v1 unless the topic needs v2" (the broker's
    autoMessageVersionOnTopicLen rule).  Decoding fills both from the bytes,
    so decode -> encode reproduces the record."""

    topic: str
    body: bytes = attrs.field(converter=bytes, default=b"")
    properties: dict = attrs.field(factory=dict, converter=dict)
    queue_id: int = 0
    flag: int = 0
    queue_offset: int = 0
    physical_offset: int = 0
    sysflag: int = 0
    born_timestamp: int = 0
    born_host: HostAddr = LOCALHOST
    store_timestamp: int = 0
    store_host: HostAddr = LOCALHOST
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    body_crc: int | None = None
    magic: int | None = None

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR) if k]

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_KEY)

    @property
    def tags_code(self) -> int:
        return tags_code(self.tags)

    @property
    def transaction_type(self) -> int:
        return self.sysflag & TRANSACTION_MASK

    @property
    def effective_sysflag(self) -> int:
        """SYSFLAG with the V6 bits set from the hosts, as the broker does."""
        return host_flags(self.sysflag, self.born_host.is_v6, self.store_host.is_v6)

    def encode(self) -> bytes:
        return encode(self)


def choose_magic(topic: str) -> int:
    return MAGIC_V2 if java_len(topic) > MAX_V1_TOPIC_CHARS else MAGIC_V1


def encode(msg: MessageRecord) -> bytes:
    """The record bytes (MessageExtEncoder.encode)."""
    topic = msg.topic.encode("utf-8", "surrogatepass")
    props = properties_to_string(msg.properties).encode("utf-8", "surrogatepass")
    magic = msg.magic if msg.magic is not None else choose_magic(msg.topic)
    return encode_parts(magic, topic, props, msg.body, queue_id=msg.queue_id, flag=msg.flag,
                        queue_offset=msg.queue_offset, physical_offset=msg.physical_offset,
                        sysflag=msg.effective_sysflag, born_timestamp=msg.born_timestamp,
                        born_host=msg.born_host.packed, store_timestamp=msg.store_timestamp,
                        store_host=msg.store_host.packed, reconsume_times=msg.reconsume_times,
                        prepared_transaction_offset=msg.prepared_transaction_offset, body_crc=msg.body_crc)


def encode_parts(magic: int, topic: bytes, props: bytes, body: bytes, *, queue_id: int, flag: int,
                 queue_offset: int = 0, physical_offset: int = 0, sysflag: int, born_timestamp: int,
                 born_host: bytes, store_timestamp: int, store_host: bytes, reconsume_times: int = 0,
                 prepared_transaction_offset: int = 0, body_crc: int | None = None) -> bytes:
    """The record bytes from fields already in wire form (UTF-8 topic and
    properties string, packed hosts, SYSFLAG with its V6 bits matching the
    hosts): the send path builds records this way, without a MessageRecord."""
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise MessageFormatError(f"bad magic {magic:#x}")
    v2 = magic == MAGIC_V2
    if len(topic) > (32767 if v2 else 127):
        # Java would overflow the (byte) cast and write a record nobody reads.
        raise MessageFormatError(f"topic of {len(topic)} UTF-8 bytes does not fit a "
                                 f"{'v2' if v2 else 'v1'} record")
    if len(props) > MAX_PROPERTIES_LEN:
        raise MessageFormatError(f"properties of {len(props)} bytes exceed {MAX_PROPERTIES_LEN}")
    total = record_length(len(body), len(topic), len(props), sysflag=sysflag, v2=v2)
    crc = masked_crc32(body) if body_crc is None else body_crc
    # One join, no growing bytearray and final copy: the broker encodes every message it takes.
    out = b"".join((
        _HEAD.pack(total, magic, crc, queue_id, flag, queue_offset, physical_offset, sysflag, born_timestamp),
        born_host, _I64.pack(store_timestamp), store_host,
        _TAIL.pack(reconsume_times, prepared_transaction_offset, len(body)), body,
        (_I16 if v2 else _U8).pack(len(topic)), topic, _I16.pack(len(props)), props))
    if len(out) != total:
        raise MessageFormatError(f"record of {len(out)} bytes, TOTALSIZE {total}: the hosts do not match "
                                 f"SYSFLAG {sysflag:#x}")
    return out


@attrs.frozen(kw_only=True)
class RecordLayout:
    """Where the variable parts of a record sit (offsets relative to it)."""

    total_size: int
    magic: int
    sysflag: int
    store_ts_pos: int
    body_pos: int
    body_len: int
    topic_pos: int
    topic_len: int
    props_pos: int
    props_len: int


def parse_layout(buf, offset: int = 0, limit: int | None = None) -> RecordLayout:
    """Walk the record at `offset` exactly as checkMessageAndReturnSize does,
    bounds-checking every length against min(TOTALSIZE, limit).  Raises
    MessageFormatError with the reason."""
    end = len(buf) if limit is None else min(len(buf), offset + limit)
    avail = end - offset
    if avail < 8:
        raise MessageFormatError("record shorter than 8 bytes", offset)
    total, magic = struct.unpack_from(">ii", buf, offset)
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise MessageFormatError(f"bad magic {magic & 0xFFFFFFFF:#010x}", offset)
    if total > avail:
        raise MessageFormatError(f"TOTALSIZE {total} runs past the {avail} bytes available", offset)
    if total < record_length(0, 0, 0):
        raise MessageFormatError(f"TOTALSIZE {total} below the minimum record size", offset)
    v2 = magic == MAGIC_V2
    sysflag = I32.unpack_from(buf, offset + POS_SYSFLAG)[0]
    bh = host_len(sysflag, BORNHOST_V6_FLAG)
    sh = host_len(sysflag, STOREHOST_V6_FLAG)
    store_ts = POS_BORNHOST + bh
    body_len_pos = store_ts + 8 + sh + 12
    p = body_len_pos + 4
    if p > total:
        raise MessageFormatError("record too short for its hosts", offset)
    body_len = I32.unpack_from(buf, offset + body_len_pos)[0]
    if body_len < 0 or p + body_len > total:
        raise MessageFormatError(f"BODYLEN {body_len} does not fit TOTALSIZE {total}", offset)
    body_pos = p
    p += body_len
    tl = 2 if v2 else 1
    if p + tl > total:
        raise MessageFormatError("record too short for TOPICLEN", offset)
    topic_len = (struct.unpack_from(">h", buf, offset + p)[0] if v2
                 else struct.unpack_from(">b", buf, offset + p)[0])
    p += tl
    if topic_len < 0 or p + topic_len + 2 > total:
        raise MessageFormatError(f"TOPICLEN {topic_len} does not fit TOTALSIZE {total}", offset)
    topic_pos = p
    p += topic_len
    props_len = struct.unpack_from(">h", buf, offset + p)[0]
    p += 2
    if props_len < 0 or p + props_len > total:
        raise MessageFormatError(f"PROPERTIESLEN {props_len} does not fit TOTALSIZE {total}", offset)
    expect = record_length(body_len, topic_len, props_len, sysflag=sysflag, v2=v2)
    if expect != total:
        raise MessageFormatError(f"TOTALSIZE {total} != computed length {expect}", offset)
    return RecordLayout(total_size=total, magic=magic, sysflag=sysflag, store_ts_pos=store_ts, body_pos=body_pos,
                        body_len=body_len, topic_pos=topic_pos,
                        topic_len=topic_len, props_pos=p, props_len=props_len)


def decode(buf, offset: int = 0, *, limit: int | None = None, check_crc: bool = False) -> MessageRecord:
    """Decode the record at `offset` (its TOTALSIZE bytes)."""
    if limit is None and not check_crc:
        rec = _decode_usual(buf, offset)
        if rec is not None:
            return rec
    lay = parse_layout(buf, offset, limit)
    o = offset
    (_, magic, crc, queue_id, flag, queue_offset, phys, sysflag,
     born_ts) = _HEAD.unpack_from(buf, o)
    bh = lay.store_ts_pos - POS_BORNHOST
    born = _host(buf, o + POS_BORNHOST, bh)
    store_ts = _I64.unpack_from(buf, o + lay.store_ts_pos)[0]
    sh_pos = lay.store_ts_pos + 8
    sh = lay.body_pos - 4 - 12 - sh_pos
    store = _host(buf, o + sh_pos, sh)
    reconsume, prepared = struct.unpack_from(">iq", buf, o + sh_pos + sh)
    body = bytes(buf[o + lay.body_pos:o + lay.body_pos + lay.body_len])
    if check_crc and masked_crc32(body) != crc:
        raise MessageFormatError(f"BODYCRC {crc:#010x} != computed {masked_crc32(body):#010x}", offset)
    topic = bytes(buf[o + lay.topic_pos:o + lay.topic_pos + lay.topic_len]).decode("utf-8", "replace")
    props = bytes(buf[o + lay.props_pos:o + lay.props_pos + lay.props_len]).decode("utf-8", "replace")
    return MessageRecord(topic=topic, body=body, properties=string_to_properties(props),
                         queue_id=queue_id, flag=flag, queue_offset=queue_offset,
                         physical_offset=phys, sysflag=sysflag, born_timestamp=born_ts,
                         born_host=born, store_timestamp=store_ts, store_host=store,
                         reconsume_times=reconsume, prepared_transaction_offset=prepared,
                         body_crc=crc, magic=magic)


_FIXED_V4 = struct.Struct(">iiiiiqqiq8sq8siqi")  # TOTALSIZE .. BODYLEN with both hosts IPv4 (88 bytes)
_V6_BITS = BORNHOST_V6_FLAG | STOREHOST_V6_FLAG
_RECORD_FIELDS = ("topic", "body", "properties", "queue_id", "flag", "queue_offset", "physical_offset", "sysflag",
                  "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times",
                  "prepared_transaction_offset", "body_crc", "magic")


@functools.lru_cache(maxsize=1024)  # a consumer sees few hosts; HostAddr is immutable
def _host_v4(wire: bytes) -> HostAddr:
    return HostAddr(wire[:4], I32.unpack_from(wire, 4)[0])


def _decode_usual(buf, o: int) -> MessageRecord | None:
    """decode() of the usual record (both hosts IPv4, every length
    consistent) in one unpack, or None: parse_layout's walk then decodes it
    or names what is wrong.  A consumer decodes every message it gets."""
    if len(buf) - o < 88:
        return None
    (total, magic, crc, queue_id, flag, queue_offset, phys, sysflag, born_ts, born, store_ts, store, reconsume,
     prepared, body_len) = _FIXED_V4.unpack_from(buf, o)
    if sysflag & _V6_BITS or total > len(buf) - o or body_len < 0:
        return None
    p = o + 88 + body_len
    end = o + total
    if magic == MAGIC_V1:
        if p + 3 > end or buf[p] >= 0x80:  # TOPICLEN is a signed byte
            return None
        topic_len, p = buf[p], p + 1
    elif magic == MAGIC_V2:
        if p + 4 > end:
            return None
        topic_len, p = _I16.unpack_from(buf, p)[0], p + 2
    else:
        return None
    if topic_len < 0 or p + topic_len + 2 > end:
        return None
    props_len = _I16.unpack_from(buf, p + topic_len)[0]
    props_at = p + topic_len + 2
    if props_len < 0 or props_at + props_len != end:
        return None
    rec = _new_record(MessageRecord)
    for setter, value in zip(_RECORD_SETTERS, (
            bytes(buf[p:p + topic_len]).decode("utf-8", "replace"), bytes(buf[o + 88:o + 88 + body_len]),
            string_to_properties(bytes(buf[props_at:end]).decode("utf-8", "replace")), queue_id, flag,
            queue_offset, phys, sysflag, born_ts, _host_v4(born), store_ts, _host_v4(store), reconsume, prepared,
            crc, magic)):
        setter(rec, value)  # every value already what the converters would make of it
    return rec


def _host(buf, pos: int, length: int) -> HostAddr:
    ip_len = length - 4
    return HostAddr(bytes(buf[pos:pos + ip_len]), I32.unpack_from(buf, pos + ip_len)[0])


# --- cheap views used on the append path and by verifiers -----------------

def looks_like_record(buf) -> bool:
    """Does this entry body claim to be exactly one message record?  (Magic
    v1/v2 at +4 and TOTALSIZE equal to the body length.)  Bodies that do not
    are "non-message entries" and are skipped by dispatch."""
    if len(buf) < 8:
        return False
    total, magic = struct.unpack_from(">ii", buf, 0)
    return magic in (MAGIC_V1, MAGIC_V2) and total == len(buf)


def check_record(buf, expected_physical_offset: int | None = None, *, check_crc: bool = True) -> str | None:
    """The per-entry body check verifiers call: None if `buf` is exactly one
    well-formed record (body CRC checked; PHYSICALOFFSET checked when the
    caller knows where the record lives), else the reason.  Non-message
    bodies are reported too; callers that allow them test
    looks_like_record first."""
    if len(buf) >= 8:
        total = I32.unpack_from(buf, 0)[0]
        if total != len(buf) and I32.unpack_from(buf, 4)[0] in (MAGIC_V1, MAGIC_V2):
            return f"TOTALSIZE {total} != body length {len(buf)}"
    try:
        lay = parse_layout(buf)
    except MessageFormatError as exc:
        return exc.reason
    if check_crc:
        stored = I32.unpack_from(buf, POS_BODYCRC)[0]
        crc = masked_crc32(bytes(buf[lay.body_pos:lay.body_pos + lay.body_len]))
        if stored != crc:
            return f"BODYCRC {stored & 0xFFFFFFFF:#010x} != computed {crc:#010x}"
    if expected_physical_offset is not None:
        phys = _I64.unpack_from(buf, POS_PHYSICALOFFSET)[0]
        if phys != expected_physical_offset:
            return f"PHYSICALOFFSET {phys} != actual position {expected_physical_offset}"
    return None


def check_entry_body(header, body) -> str | None:
    """The body checker for commitlog.scan.verify_store (mqadmin
    verifyStore): a NORMAL entry whose body carries a message magic must be
    exactly one good record sitting at entry pos + 48; other bodies are not
    messages and pass."""
    if len(body) < 8 or I32.unpack_from(body, 4)[0] not in (MAGIC_V1, MAGIC_V2):
        return None
    reason = check_record(body, header.pos + 48)
    return f"message: {reason}" if reason else None


def read_topic_queue(buf) -> tuple[str, int, int]:
    """(topic, queueId, sysflag) of a record, without decoding the rest."""
    lay = parse_layout(buf)
    topic = bytes(buf[lay.topic_pos:lay.topic_pos + lay.topic_len]).decode("utf-8", "replace")
    return topic, I32.unpack_from(buf, POS_QUEUEID)[0], lay.sysflag


def set_queue_offset(buf, queue_offset: int) -> None:
    _I64.pack_into(buf, POS_QUEUEOFFSET, queue_offset)


def set_physical_offset(buf, physical_offset: int) -> None:
    _I64.pack_into(buf, POS_PHYSICALOFFSET, physical_offset)


def set_store_timestamp(buf, store_timestamp: int) -> None:
    sysflag = I32.unpack_from(buf, POS_SYSFLAG)[0]
    _I64.pack_into(buf, store_timestamp_pos(sysflag), store_timestamp)


def read_store_timestamp(buf, offset: int = 0) -> int:
    sysflag = I32.unpack_from(buf, offset + POS_SYSFLAG)[0]
    return _I64.unpack_from(buf, offset + store_timestamp_pos(sysflag))[0]


def encode_blank(max_blank: int) -> bytes:
    """The 8 bytes a plain commitlog writes when a record does not fit the
    rest of the segment (`max_blank` = bytes left; the rest stays as is)."""
    if max_blank < END_FILE_MIN_BLANK_LENGTH:
        raise MessageFormatError(f"BLANK needs >= {END_FILE_MIN_BLANK_LENGTH} bytes, got {max_blank}")
    return _BLANK.pack(max_blank, BLANK_MAGIC)


def is_blank(buf, offset: int = 0) -> bool:
    return len(buf) - offset >= 8 and I32.unpack_from(buf, offset + 4)[0] == BLANK_MAGIC


# MessageRecord is slotted (attrs.frozen): the slots' own setters fill a
# decoded record without the converters (see _decode_usual).
_new_record = object.__new__
_RECORD_SETTERS = tuple(MessageRecord.__dict__[name].__set__ for name in _RECORD_FIELDS)
