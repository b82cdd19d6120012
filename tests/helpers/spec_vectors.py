# Golden vectors copied from ../shared/spec/rocketmq-dledger-formats.md, shared
# by the codec tests of every layer.

# §1.11: the 146-byte v1/IPv4 message record ("hi" to topic T, PHYSICALOFFSET 1000).
MESSAGE_146_HEX = (
    "00000092 daa320a7 58932aac 00000000 00000000 00000000 00000005 00000000"
    "000003e8 00000000 0000018b cfe56800 7f000001 0000c350 0000018b cfe5687b"
    "0a000001 00002a9f 00000000 00000000 00000000 00000002 68690154 00345441"
    "47530154 61674102 554e4951 5f4b4559 01414331 31303030 31303030 31313842"
    "34414143 32303030 30303030 30303030 3002"
)
MESSAGE_146 = bytes.fromhex(MESSAGE_146_HEX.replace(" ", ""))
MESSAGE_146_OFFSET_MSG_ID = "0A00000100002A9F00000000000003E8"

# §7.6: that message as DLedger entry 0, term 1, pos 0 (stock: CRCs 0).
ENTRY_HEADER_HEX = (
    "00000001 000000c2 0000000000000000 0000000000000001 0000000000000000"
    " 00000000 00000000 00000000 00000092"
)
ENTRY_HEADER = bytes.fromhex(ENTRY_HEADER_HEX.replace(" ", ""))
INDEX_UNIT_HEX = "00000001 0000000000000000 000000c2 0000000000000000 0000000000000001"
INDEX_UNIT = bytes.fromhex(INDEX_UNIT_HEX.replace(" ", ""))


def message_with_physical_offset(phys: int) -> bytes:
    """The §1.11 record with PHYSICALOFFSET rewritten (the body CRC covers the
    body only, so nothing else changes)."""
    buf = bytearray(MESSAGE_146)
    buf[28:36] = phys.to_bytes(8, "big", signed=True)
    return bytes(buf)
