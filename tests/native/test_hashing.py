import os
import zlib

from hypothesis import given
from hypothesis import strategies as st

import native
from native import hashing


def test_native_module_loaded():
    # CI must exercise the C helpers; only an explicit opt-out may skip them.
    if os.environ.get("LEDGERMQ_NO_NATIVE") == "1":
        assert not native.NATIVE_LOADED
    else:
        assert native.NATIVE_LOADED, native.LOAD_ERROR


def test_crc32_golden():
    assert hashing.crc32(b"hi") == 0xD8932AAC  # spec §1.11
    assert hashing.masked_crc32(b"hi") == 0x58932AAC
    assert hashing.crc32(b"") == 0
    assert hashing.crc32(b"123456789") == 0xCBF43926  # the CRC-32 check value


def test_java_hash_golden():
    assert hashing.java_hash_str("TagA") == 2598919  # spec §2
    assert hashing.java_hash_str("T#key1") == -1854506879  # spec §3
    assert hashing.index_key_hash("T#key1") % 5_000_000 == 4506879
    assert hashing.java_hash_str("") == 0
    assert hashing.java_hash_utf8("TagA".encode()) == 2598919


def test_index_key_hash_min_value_maps_to_zero():
    # "polygenelubricants" is the classic string whose hashCode is MIN_VALUE.
    assert hashing.java_hash_str("polygenelubricants") == -(1 << 31)
    assert hashing.index_key_hash("polygenelubricants") == 0


@given(st.binary(max_size=300), st.integers(0, 0xFFFFFFFF))
def test_crc32_matches_zlib(data, seed):
    assert hashing.crc32(data) == zlib.crc32(data)
    assert hashing.crc32(data, seed) == zlib.crc32(data, seed)
    assert hashing.py_crc32(data, seed) == zlib.crc32(data, seed)


@given(st.text(max_size=60))
def test_java_hash_native_equals_fallback(s):
    expected = hashing.py_java_hash_str(s.encode("utf-8", "surrogatepass").decode("utf-8", "replace"))
    data = s.encode("utf-8", "surrogatepass")
    assert hashing.java_hash_utf8(data) == hashing.py_java_hash_utf8(data) == expected
    assert hashing.java_hash_str(s) == hashing.py_java_hash_str(s)


@given(st.binary(max_size=40))
def test_java_hash_utf8_of_malformed_bytes_matches_fallback(data):
    assert hashing.java_hash_utf8(data) == hashing.py_java_hash_utf8(data)


@given(st.binary(max_size=40), st.binary(max_size=40))
def test_java_hash_utf8_from_continues_a_prefix(a, b):
    # dispatch.c hashes "topic#key" by continuing the hash of "topic#" over
    # the key's bytes: the hash of the two decoded strings joined.
    if not native.NATIVE_LOADED:
        return
    from native._native import ffi, lib
    prefix = hashing.java_hash_utf8(a) & 0xFFFFFFFF
    got = lib.lmq_java_hash_utf8_from(prefix, ffi.from_buffer(b), len(b))
    joined = a.decode("utf-8", "replace") + b.decode("utf-8", "replace")
    assert got == hashing.py_java_hash_str(joined) & 0xFFFFFFFF
