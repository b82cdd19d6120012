# Owns SEND_BATCH_MESSAGE bodies (spec §1.10): what a producer sends as
# one request (MessageDecoder.encodeMessages) and its messages back, and
# the stored records a batch becomes.
#
# Limits on outside bytes, each refused with MessageFormatError: every
# message's TOTALSIZE, BODYLEN and PROPLEN must agree and fit the body (so a
# message's body and properties are bounded by the batch, whose size the
# send path bounds by maxMessageSize); at most MAX_BATCH_MESSAGES (16384)
# messages, each becoming a log entry.  The C scanner
# (native/src/sendpath_batch.c) declines whatever this refuses, so the two
# paths agree.
import struct

import attrs

from consumequeue.record import (
    MAX_PROPERTIES_LEN,
    MessageFormatError,
    MessageRecord,
    encode,
    properties_to_string,
    string_to_properties,
)
from native.sendpath import MAX_BATCH_MESSAGES


@attrs.frozen
class BatchItem:
    body: bytes = attrs.field(converter=bytes)
    properties: dict = attrs.field(factory=dict, converter=dict)
    flag: int = 0


def encode_batch(items) -> bytes:
    """MessageDecoder.encodeMessages: per message
    `i32 TOTALSIZE, i32 MAGIC=0, i32 BODYCRC=0, i32 FLAG, i32 BODYLEN, BODY, i16 PROPLEN, PROPS`."""
    out = bytearray()
    for item in items:
        props = properties_to_string(item.properties).encode("utf-8", "surrogatepass")
        if len(props) > MAX_PROPERTIES_LEN:
            raise MessageFormatError(f"properties of {len(props)} bytes exceed {MAX_PROPERTIES_LEN}")
        total = 4 + 4 + 4 + 4 + 4 + len(item.body) + 2 + len(props)
        out += struct.pack(">iiiii", total, 0, 0, item.flag, len(item.body))
        out += item.body
        out += struct.pack(">h", len(props)) + props
    return bytes(out)


def decode_batch_raw(buf) -> list[tuple[bytes, int, bytes]]:
    """The messages of a SEND_BATCH body as (body, flag, properties bytes),
    the properties string undecoded (the broker's send path keeps a
    well-formed one as sent)."""
    items = []
    off, n = 0, len(buf)
    while off < n:
        if len(items) == MAX_BATCH_MESSAGES:
            raise MessageFormatError(f"batch of more than {MAX_BATCH_MESSAGES} messages", off)
        if n - off < 20:
            raise MessageFormatError("truncated batch message header", off)
        total, _magic, _crc, flag, body_len = struct.unpack_from(">iiiii", buf, off)
        if total < 22 or off + total > n or body_len < 0 or 20 + body_len + 2 > total:
            raise MessageFormatError(f"bad batch message sizes (TOTALSIZE {total}, BODYLEN {body_len})", off)
        body = bytes(buf[off + 20:off + 20 + body_len])
        p = off + 20 + body_len
        props_len = struct.unpack_from(">h", buf, p)[0]
        if props_len < 0 or 20 + body_len + 2 + props_len != total:
            raise MessageFormatError(f"bad batch PROPLEN {props_len} for TOTALSIZE {total}", off)
        items.append((body, flag, bytes(buf[p + 2:p + 2 + props_len])))
        off += total
    return items


def decode_batch(buf) -> list[BatchItem]:
    return [BatchItem(body, string_to_properties(props.decode("utf-8", "replace")), flag)
            for body, flag, props in decode_batch_raw(buf)]


def records_from_batch(batch_body, template: MessageRecord) -> list[bytes]:
    """Re-encode each message of a SEND_BATCH body as a full record
    (MessageExtEncoder.encode(MessageExtBatch)): topic, queue, hosts,
    timestamps and sysflag come from `template`, each message brings flag,
    body and properties, BODYCRC is per message and PREPAREDTXOFFSET 0.
    QUEUEOFFSET/PHYSICALOFFSET are left for the append hook: on DLedger each
    record becomes its own entry (spec §6.3), so consecutive appends get
    consecutive queue offsets."""
    return [encode(attrs.evolve(template, body=item.body, properties=item.properties,
                                flag=item.flag, body_crc=None, prepared_transaction_offset=0))
            for item in decode_batch(batch_body)]
