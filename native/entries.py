# Owns the batched entry helpers of the segmented store: layout (placing
# bodies, headers and blank fillers), sealing (CRCs and index units, after
# the append hooks) and scanning (recovery, follower appends, offline tools).
# The C versions live in native/src/entries.c; the py_* twins below have the
# identical API and are the test oracle and the fallback.
#
# Conventions shared by both twins:
#   * lengths and positions are array('q') (any writable int64 buffer);
#   * `out` buffers are zeroed bytearrays mirroring the data address space
#     [start_pos, end_pos) of one batch;
#   * the scan state is an array('q') of STATE_LEN slots (S_* below); the
#     caller fills the inputs, the scan updates them in place and sets the
#     outputs (S_COUNT entries accepted, S_CONSUMED bytes, S_DETAIL and
#     S_EXPECTED describing a problem) and returns a reason code (R_*).
import struct
from array import array

from native import NATIVE_LOADED, ffi, lib
from native.hashing import py_crc32

HDR, UNIT, MIN_BLANK = 48, 32, 8

# Scan state slots.
(S_NEXT_INDEX, S_LAST_TERM, S_POS, S_SEG_END, S_SEG_SIZE, S_PREV_CHAIN,
 S_CRC_MODE, S_CHAIN_KNOWN, S_COUNT, S_CONSUMED, S_DETAIL, S_EXPECTED) = range(12)
STATE_LEN = 12

# Scan flags: SEGMENT walks one segment region (blank fillers and a zero end
# allowed, buf[0] is at S_POS, the region ends at S_SEG_END); BATCH walks
# entries packed back to back whose pos fields may jump to the next segment
# (R_ROLL); CHECK_CRC verifies bodyCrc/chainCrc (sticky CRC mode).
F_SEGMENT, F_BATCH, F_CHECK_CRC = 1, 2, 4

# Reasons below 16 are normal stops, 16 and up are problems.
R_END, R_BLANK, R_MAX, R_SHORT, R_ROLL = 0, 1, 2, 3, 4
(R_BAD_MAGIC, R_BAD_SIZE, R_BAD_BODY_SIZE, R_BAD_CHANNEL, R_BAD_POS, R_BAD_INDEX,
 R_BAD_TERM, R_BAD_BODY_CRC, R_BAD_CHAIN_CRC, R_MISSING_CRC, R_TORN, R_BAD_BLANK,
 R_NO_ROOM) = range(16, 29)
PROBLEM = 16

_REASON_TEXT = {
    R_BAD_MAGIC: "bad magic {d}",
    R_BAD_SIZE: "bad size {d}",
    R_BAD_BODY_SIZE: "bodySize {d} does not match size (expected {e})",
    R_BAD_CHANNEL: "bad channel {d}",
    R_BAD_POS: "pos field {d} is not the entry's position {e}",
    R_BAD_INDEX: "index {d} where {e} was expected",
    R_BAD_TERM: "term {d} below previous term {e}",
    R_BAD_BODY_CRC: "bodyCrc mismatch (stored {d:#010x}, computed {e:#010x})",
    R_BAD_CHAIN_CRC: "chainCrc mismatch (stored {d:#010x}, computed {e:#010x})",
    R_MISSING_CRC: "entry without CRCs after CRC-bearing entries",
    R_TORN: "torn entry ({d} bytes present, {e} needed)",
    R_BAD_BLANK: "blank filler of {d} bytes where {e} remain in the segment",
    R_NO_ROOM: "entry of {d} bytes violates the blank rule ({e} bytes left in the segment)",
}


def reason_text(reason: int, detail: int = 0, expected: int = 0) -> str:
    """Human-readable text for a problem reason code."""
    text = _REASON_TEXT.get(reason, f"scan reason {reason}")
    if "{d:#" in text or "{e:#" in text:
        detail, expected = detail & 0xFFFFFFFF, expected & 0xFFFFFFFF
    return text.format(d=detail, e=expected)


def new_state(*, next_index: int = -1, last_term: int = -1, pos: int, seg_end: int,
              seg_size: int, prev_chain: int = 0, crc_mode: bool = False,
              chain_known: bool = True) -> array:
    st = array("q", bytes(8 * STATE_LEN))
    st[S_NEXT_INDEX], st[S_LAST_TERM], st[S_POS], st[S_SEG_END] = next_index, last_term, pos, seg_end
    st[S_SEG_SIZE], st[S_PREV_CHAIN] = seg_size, prev_chain & 0xFFFFFFFF
    st[S_CRC_MODE], st[S_CHAIN_KNOWN] = int(crc_mode), int(chain_known)
    return st


# --- pure-Python twins ----------------------------------------------------

_HEADER = struct.Struct(">iiqqqiIIi")
_CHAIN = struct.Struct(">IIqq")
_I32 = struct.Struct(">i")
_BLANK = struct.Struct(">ii")


def _unit(h) -> bytes:
    return struct.pack(">iqiqq", h[0], h[4], h[1], h[2], h[3])


def py_layout_plan(lens, pos: int, seg_end: int, seg_size: int, pos_out) -> int:
    for i, n in enumerate(lens):
        size = HDR + n
        if size + MIN_BLANK > seg_size:
            return -1 - i
        if size + MIN_BLANK > seg_end - pos:
            pos, seg_end = seg_end, seg_end + seg_size
        pos_out[i] = pos
        pos += size
    return pos


def py_layout_fill(out, bodies, lens, positions, start_pos: int, first_index: int,
                   term: int, magic: int) -> None:
    at, src = start_pos, 0
    for i, n in enumerate(lens):
        p = positions[i]
        if p != at:
            _BLANK.pack_into(out, at - start_pos, -1, p - at)
        o = p - start_pos
        _HEADER.pack_into(out, o, magic, HDR + n, first_index + i, term, p, 0, 0, 0, n)
        out[o + HDR:o + HDR + n] = bodies[src:src + n]
        src += n
        at = p + HDR + n


def py_layout_seal(out, positions, start_pos: int, prev_chain: int, with_crc: bool,
                   index_out) -> int:
    for i, p in enumerate(positions):
        o = p - start_pos
        h = _HEADER.unpack_from(out, o)
        if with_crc:
            bcrc = py_crc32(out[o + HDR:o + h[1]])
            prev_chain = py_crc32(_CHAIN.pack(prev_chain, bcrc, h[2], h[3]))
            struct.pack_into(">II", out, o + 36, prev_chain, bcrc)
        else:
            prev_chain = 0
        if index_out is not None:
            index_out[i * UNIT:(i + 1) * UNIT] = _unit(h)
    return prev_chain


def py_first_nonzero(buf) -> int:
    data = bytes(buf)
    stripped = data.lstrip(b"\0")
    return -1 if not stripped else len(data) - len(stripped)


def py_first_diff(a, b) -> int:
    """Offset of the first byte where two equally long buffers differ, or -1."""
    if len(a) != len(b):
        raise ValueError("first_diff needs buffers of equal length")
    a, b = bytes(a), bytes(b)
    if a == b:
        return -1
    return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)


def py_scan_entries(buf, flags: int, max_count: int, st, index_out) -> int:
    segment, check_crc = bool(flags & F_SEGMENT), bool(flags & F_CHECK_CRC)
    off = count = 0
    st[S_COUNT] = 0
    length = len(buf)

    def stop(reason, detail=0, expected=0):
        st[S_CONSUMED], st[S_DETAIL], st[S_EXPECTED] = off, detail, expected
        return reason

    while True:
        pos = st[S_POS]
        rem_seg, rem_buf = st[S_SEG_END] - pos, length - off
        if count == max_count:
            return stop(R_MAX)
        if rem_buf == 0:
            return stop(R_SHORT if segment else R_END)
        if segment and rem_buf < MIN_BLANK:
            return stop(R_END if py_first_nonzero(buf[off:]) < 0 else R_TORN, rem_buf)
        if not segment and rem_buf < HDR:
            return stop(R_TORN, rem_buf, HDR)
        magic, size = _BLANK.unpack_from(buf, off)
        if segment:
            if magic == 0 and size == 0:
                return stop(R_END)
            if magic == -1:
                return stop(R_BLANK, size) if size == rem_seg else stop(R_BAD_BLANK, size, rem_seg)
        if not 1 <= magic <= 3:
            return stop(R_BAD_MAGIC, magic)
        if size <= HDR - 4 or size + MIN_BLANK > st[S_SEG_SIZE]:
            return stop(R_BAD_SIZE, size)
        if rem_buf < HDR:
            return stop(R_TORN, rem_buf, HDR)
        h = _HEADER.unpack_from(buf, off)
        _, _, index, term, epos, channel, chain, bcrc, body_size = h
        if body_size < 0 or body_size + HDR != size:
            return stop(R_BAD_BODY_SIZE, body_size, size - HDR)
        if channel != 0:
            return stop(R_BAD_CHANNEL, channel)
        if size + MIN_BLANK > rem_seg:
            if segment:
                return stop(R_BAD_SIZE, size, rem_seg) if size > rem_seg else stop(R_NO_ROOM, size, rem_seg)
            if epos == st[S_SEG_END]:
                return stop(R_ROLL, epos)
            return stop(R_BAD_POS, epos, st[S_SEG_END])
        if epos != pos:
            return stop(R_BAD_POS, epos, pos)
        if index < 0 or (st[S_NEXT_INDEX] >= 0 and index != st[S_NEXT_INDEX]):
            return stop(R_BAD_INDEX, index, st[S_NEXT_INDEX])
        if term < 0 or term < st[S_LAST_TERM]:
            return stop(R_BAD_TERM, term, st[S_LAST_TERM])
        if size > rem_buf:
            return stop(R_TORN, rem_buf, size)
        if check_crc:
            if chain == 0 and bcrc == 0:
                if st[S_CRC_MODE]:
                    return stop(R_MISSING_CRC)
            else:
                got = py_crc32(buf[off + HDR:off + size])
                if got != bcrc:
                    return stop(R_BAD_BODY_CRC, bcrc, got)
                if st[S_CHAIN_KNOWN]:
                    want = py_crc32(_CHAIN.pack(st[S_PREV_CHAIN], got, index, term))
                    if want != chain:
                        return stop(R_BAD_CHAIN_CRC, chain, want)
                st[S_CRC_MODE] = 1
        if index_out is not None:
            index_out[count * UNIT:(count + 1) * UNIT] = _unit(h)
        st[S_PREV_CHAIN], st[S_CHAIN_KNOWN], st[S_LAST_TERM] = chain, 1, term
        st[S_NEXT_INDEX], st[S_POS] = index + 1, pos + size
        count += 1
        st[S_COUNT] = count
        off += size


# --- native versions ------------------------------------------------------

NATIVE = NATIVE_LOADED and hasattr(lib, "lmq_scan_entries")

if NATIVE:
    _from = ffi.from_buffer

    def layout_plan(lens, pos: int, seg_end: int, seg_size: int, pos_out) -> int:
        """Place entries of the given body lengths from `pos` (its segment
        ending at `seg_end`); fills pos_out and returns the end position, or
        -1-i when entry i can never fit in a segment."""
        return lib.lmq_layout_plan(_from("int64_t[]", lens), len(lens), pos, seg_end, seg_size,
                                   _from("int64_t[]", pos_out, require_writable=True))

    def layout_fill(out, bodies, lens, positions, start_pos: int, first_index: int,
                    term: int, magic: int) -> None:
        """Write headers (CRCs 0), bodies (concatenated in `bodies`) and blank
        fillers into the zeroed `out`, which mirrors [start_pos, end)."""
        lib.lmq_layout_fill(_from("uint8_t[]", out, require_writable=True), _from("uint8_t[]", bodies),
                            _from("int64_t[]", lens), _from("int64_t[]", positions), len(lens),
                            start_pos, first_index, term, magic)

    def layout_seal(out, positions, start_pos: int, prev_chain: int, with_crc: bool,
                    index_out) -> int:
        """Compute bodyCrc/chainCrc into the headers in `out` (or leave them 0
        when with_crc is false) and write one index unit per entry into
        index_out (may be None).  Returns the last chainCrc."""
        return lib.lmq_layout_seal(_from("uint8_t[]", out, require_writable=True),
                                   _from("int64_t[]", positions), len(positions), start_pos,
                                   prev_chain & 0xFFFFFFFF, int(with_crc),
                                   ffi.NULL if index_out is None else _from("uint8_t[]", index_out, require_writable=True))

    def scan_entries(buf, flags: int, max_count: int, state, index_out) -> int:
        """Walk entries in `buf` per `flags` from `state`; see the module comment."""
        return lib.lmq_scan_entries(_from("uint8_t[]", buf), len(buf), flags, max_count,
                                    _from("int64_t[]", state, require_writable=True),
                                    ffi.NULL if index_out is None else _from("uint8_t[]", index_out, require_writable=True))

    def first_nonzero(buf) -> int:
        """Offset of the first non-zero byte of buf, or -1."""
        return lib.lmq_first_nonzero(_from("uint8_t[]", buf), len(buf))

    def body_crc32(data, crc: int = 0) -> int:
        """zlib CRC32 as the store computes bodyCrc (carry-less multiply
        folding where the CPU has it)."""
        return lib.lmq_body_crc32(crc, _from("uint8_t[]", data), len(data))

    def first_diff(a, b) -> int:
        """Offset of the first byte where two equally long buffers differ, or -1."""
        if len(a) != len(b):
            raise ValueError("first_diff needs buffers of equal length")
        return lib.lmq_first_diff(_from("uint8_t[]", a), _from("uint8_t[]", b), len(a))

else:
    body_crc32 = py_crc32
    first_diff = py_first_diff
    layout_plan = py_layout_plan
    layout_fill = py_layout_fill
    layout_seal = py_layout_seal
    scan_entries = py_scan_entries
    first_nonzero = py_first_nonzero
