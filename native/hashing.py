# Owns the hashes the RocketMQ/DLedger formats are built on: zlib CRC32,
# RocketMQ's masked body CRC, and Java's String.hashCode (tags codes, index
# keys).  Native when available, pure Python otherwise; both give identical
# results (tests/native/test_hashing.py checks them against each other).
import zlib

from native import NATIVE_LOADED, ffi, lib

MASK31 = 0x7FFFFFFF


def py_crc32(data, crc: int = 0) -> int:
    return zlib.crc32(data, crc) & 0xFFFFFFFF


def py_java_hash_str(s: str) -> int:
    """Java String.hashCode over UTF-16 code units, as a signed int32."""
    units = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def py_java_hash_utf8(data) -> int:
    """Java hashCode of the string that `new String(data, UTF_8)` would give."""
    return py_java_hash_str(bytes(data).decode("utf-8", "replace"))


if NATIVE_LOADED:

    def crc32(data, crc: int = 0) -> int:
        """zlib CRC32 of a bytes-like object (chainable like zlib.crc32).
        Uses the carry-less-multiply CRC of native/src/entries.c (an order of
        magnitude faster than the table-driven lmq_crc32 on long buffers)."""
        return lib.lmq_body_crc32(crc, ffi.from_buffer(data), len(data))

    def java_hash_str(s: str) -> int:
        units = s.encode("utf-16-le", "surrogatepass")
        return lib.lmq_java_hash_utf16(ffi.from_buffer("uint16_t[]", units), len(units) // 2)

    def java_hash_utf8(data) -> int:
        return lib.lmq_java_hash_utf8(ffi.from_buffer(data), len(data))

else:
    crc32 = py_crc32
    java_hash_str = py_java_hash_str
    java_hash_utf8 = py_java_hash_utf8


def masked_crc32(data) -> int:
    """RocketMQ's message BODYCRC: CRC32 with the top bit cleared."""
    return crc32(data) & MASK31


def index_key_hash(key: str) -> int:
    """IndexFile keyHash: abs(hashCode), with Integer.MIN_VALUE mapped to 0."""
    h = java_hash_str(key)
    return 0 if h == -(1 << 31) else abs(h)
