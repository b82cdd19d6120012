# Owns the executor side of the pipeline: what one Spark task does with one
# Split (a whole segment file, or its committed prefix).  It maps the file
# read-only and walks it with the broker's native dispatch scanner
# (native/dispatch.py over native/src/dispatch.c), one C call per batch of
# records, then turns the records into what the job needs:
#
#   compact batches  the scanner's 96-byte records plus only the bytes they
#                    point at (topic, KEYS, UNIQ_KEY), offsets rewritten, so
#                    the driver can replay them through the dispatcher's own
#                    code (rebuild) without ever seeing the segment;
#   plain summaries  how a plain commitlog segment ends (splits.plain_end);
#   message rows     full records decoded by consumequeue/record.py (export, stats).
#
# The native module is imported inside the executor.  A worker without it
# (the wheel not installed there, or LEDGERMQ_NO_NATIVE=1) fails the task
# with NativeMissingError naming the host and the fix, unless the job
# allows the pure-Python twin (same results, much slower).
import mmap
import os
import socket
import struct
import zlib

import attrs

from consumequeue.record import DEFAULT_DELAY_LEVELS_MS
from tools.pipeline.splits import PlainSummary, Split

BATCH_RECORDS = 8192
# lmq_disp_rec: topic_off, topic_len, keys_off, keys_len, uniq_off, uniq_len
_STR_FIELDS = struct.Struct("=6I")
_STR_AT = 64
_REC_FLAGS_AT = 60


class NativeMissingError(RuntimeError):
    """An executor could not import the native scanner."""


class SegmentReadError(ValueError):
    """A segment that does not scan cleanly where it must (path, offset)."""

    def __init__(self, path: str, offset: int, reason: str):
        super().__init__(f"{path}: offset {offset}: {reason}")
        self.path, self.offset, self.reason = path, offset, reason


def executor_backend(allow_fallback: bool):
    """The dispatch backend inside this executor: the native one, or the
    Python twin when allowed; otherwise a clear error."""
    import native
    from native import dispatch as D
    if D.NATIVE is not None:
        return D.NATIVE
    if allow_fallback:
        return D.PYTHON
    raise NativeMissingError(
        f"executor on {socket.gethostname()} (pid {os.getpid()}): ledgermq native scanner unavailable: "
        f"{native.LOAD_ERROR}. Install the ledgermq wheel (with its compiled native module) on every "
        f"worker, or ship a packed venv with --archives (README: The Spark pipeline); "
        f"--allow-python-fallback runs the pure-Python twin instead")


class SegmentView:
    """The split's bytes, mapped read-only (a context manager)."""

    def __init__(self, split: Split):
        self.split = split
        self._mm = None
        self.view = memoryview(b"")

    def __enter__(self) -> memoryview:
        s = self.split
        if s.length <= 0:
            return self.view
        if s.data is not None:  # handed over by Spark (a Hadoop filesystem read)
            if len(s.data) < s.length:
                raise SegmentReadError(s.path, len(s.data), f"file is {len(s.data)} bytes; the log needs {s.length}")
            self.view = memoryview(s.data)[:s.length]
            return self.view
        try:
            with open(s.path, "rb") as f:
                length = os.fstat(f.fileno()).st_size
                if length < s.length:
                    raise SegmentReadError(s.path, length, f"file is {length} bytes; the log needs {s.length}")
                self._mm = mmap.mmap(f.fileno(), s.length, mmap.MAP_SHARED, mmap.PROT_READ)
        except FileNotFoundError:
            raise SegmentReadError(s.path, 0, "segment file not found on this executor (store roots "
                                              "must be visible at the same path on every worker)") from None
        self._mm.madvise(mmap.MADV_SEQUENTIAL)
        self.view = memoryview(self._mm)
        return self.view

    def __exit__(self, *exc) -> None:
        self.view.release()
        if self._mm is not None:
            self._mm.close()


@attrs.define
class ScanEnd:
    """How a split's scan ended (all positions absolute)."""

    split: Split
    end: int = 0  # where the scan stopped
    stop: int = 0
    err_code: int = 0
    err_at: int = -1
    entries: int = 0
    records: int = 0
    bad: int = 0
    first_index: int = -1
    last_index: int = -1
    backend: str = ""


def scan_split(split: Split, backend, *, options: int = 0, batch_records: int = BATCH_RECORDS):
    """Yield (view, ScanResult, position of view[0]) per batch over the
    split's bytes; record offsets refer to that view, which is valid until
    the next batch.  The generator's return value is the ScanEnd."""
    from native.dispatch import STOP_BLANK, STOP_END, STOP_FULL
    end = ScanEnd(split, end=split.start, backend=backend.name)
    recs = backend.new_records(batch_records)
    with SegmentView(split) as view:
        off = split.skip
        end.end = split.start + off
        expect = -1
        while True:
            sub = view[off:]
            res = backend.scan(sub, split.start + off, recs, mode=split.mode, options=options,
                               expect_index=expect, delay_levels=DEFAULT_DELAY_LEVELS_MS)
            if res.entries and res.last_index >= 0:  # (plain records carry no entry index)
                if end.first_index < 0:
                    end.first_index = res.last_index - res.entries + 1
                end.last_index = res.last_index
                expect = res.last_index + 1
            end.entries += res.entries
            end.records += res.n
            end.bad += res.bad
            try:
                if res.n:
                    yield sub, res, split.start + off
            finally:
                sub.release()
            off += res.consumed
            end.end = split.start + off
            if res.stop != STOP_FULL:
                end.stop, end.err_code = res.stop, res.err_code
                if res.stop not in (STOP_END, STOP_BLANK):
                    end.err_at = end.end  # the scanner stops where the bad bytes begin
                break
    return end


def drain(gen):
    """Run a scan_split generator to its end, returning its ScanEnd."""
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value


# --- compact batches (rebuild) ---------------------------------------------------

def compact(view, res) -> tuple[bytes, bytes]:
    """The batch's records with topic/keys/uniq offsets rewritten into a
    blob holding just those bytes (a record's topic, then its properties up
    to the last of KEYS/UNIQ_KEY).  Replaying (blob, records) through the
    dispatcher writes what the segment itself would.  A plain loop: about
    0.6 us a record (a numpy version with gather indexes was 3x slower)."""
    raw = bytearray(res.raw())
    blob = bytearray()
    unpack, pack = _STR_FIELDS.unpack_from, _STR_FIELDS.pack_into
    for i in range(res.n):
        at = i * 96 + _STR_AT
        toff, tlen, koff, klen, uoff, ulen = unpack(raw, at)
        if not tlen and not klen and not ulen:
            continue  # a malformed record (flagged REC_BAD): nothing points anywhere
        lo = toff
        hi = max(toff + tlen, koff + klen, uoff + ulen)
        delta = len(blob) - lo
        blob += view[lo:hi]
        pack(raw, at, toff + delta, tlen, koff + delta if klen else 0, klen,
             uoff + delta if ulen else 0, ulen)
    return bytes(raw), bytes(blob)


def compact_split(split: Split, allow_fallback: bool, batch_records: int = BATCH_RECORDS):
    """Task body of the rebuild: (ScanEnd, [(n, bad, first_bad, entries,
    last_index, consumed, records, blob) per batch])."""
    backend = executor_backend(allow_fallback)
    batches = []
    gen = scan_split(split, backend, batch_records=batch_records)
    while True:
        try:
            view, res, _ = next(gen)
        except StopIteration as stop:
            return stop.value, batches
        raw, blob = compact(view, res)
        batches.append((res.n, res.bad, res.first_bad, res.entries, res.last_index, res.consumed, raw, blob))


def replay_result(backend, batch):
    """A ScanResult on the driver from one compact batch (the blob is the
    buffer its record offsets refer to)."""
    from native import ffi
    from native.dispatch import STOP_FULL, ScanResult
    n, bad, first_bad, entries, last_index, consumed, raw, blob = batch
    recs = backend.new_records(max(n, 1))
    if backend.name == "native":
        ffi.memmove(recs, raw, len(raw))
    else:
        recs[:len(raw)] = raw
    return blob, ScanResult(backend=backend, recs=recs, n=n, consumed=consumed, entries=entries, last_index=last_index,
                            stop=STOP_FULL, err_code=0, err_offset=0, bad=bad, first_bad=first_bad)


# --- plain summaries ---------------------------------------------------------------

def plain_summary(split: Split, allow_fallback: bool) -> PlainSummary:
    """Scan a plain segment with body CRCs checked, as recovery does."""
    from native.dispatch import ERR_TEXT, REC_CRC_BAD, SCAN_CHECK_CRC, STOP_NAMES
    backend = executor_backend(allow_fallback)
    gen = scan_split(split, backend, options=SCAN_CHECK_CRC)
    crc_bad = -1
    records = 0
    while True:
        try:
            _, res, _ = next(gen)
        except StopIteration as stop:
            end = stop.value
            break
        if crc_bad < 0:
            for i in range(res.n):
                r = res.record(i)
                if r.flags & REC_CRC_BAD:
                    crc_bad = r.phy_offset
                    records += i
                    break
            else:
                records += res.n
    reason = ""
    if end.err_code:
        reason = f"{ERR_TEXT.get(end.err_code, end.err_code)} at {end.err_at}"
    elif STOP_NAMES[end.stop] == "partial":
        reason = f"the record at {end.end} runs past its segment's data"
    return PlainSummary(split.start, split.seg_size, end.end, end.stop, records, crc_bad, reason)


# --- message rows (export, stats) ----------------------------------------------------

def records_in(split: Split, allow_fallback: bool):
    """Yield (view, offset of the record in view, DispatchRecord) for every
    well-formed message record of the split; returns the ScanEnd."""
    from native.dispatch import REC_BAD
    backend = executor_backend(allow_fallback)
    gen = scan_split(split, backend)
    while True:
        try:
            view, res, at = next(gen)
        except StopIteration as stop:
            return stop.value
        for i in range(res.n):
            r = res.record(i)
            if not r.flags & REC_BAD:
                yield view, r.phy_offset - at, r


COMPRESSION_NAMES = {0: "zlib", 1: "lz4", 2: "zstd", 3: "zlib"}


def decompress_body(body: bytes, sysflag: int) -> tuple[bytes, str | None, bool]:
    """(body, compression type name or None, whether the returned body is
    decompressed).  RocketMQ reads type 0 as ZLIB (spec §1.4).  LZ4 and ZSTD
    need the optional lz4/zstandard modules; without them (or on a corrupt
    stream) the stored bytes come back with the flag False."""
    if not sysflag & 0x1:
        return body, None, False
    kind = COMPRESSION_NAMES.get((sysflag & 0x700) >> 8, "zlib")
    try:
        if kind == "zlib":
            return zlib.decompress(body), kind, True
        if kind == "lz4":
            import lz4.frame
            return lz4.frame.decompress(body), kind, True
        import zstandard
        return zstandard.ZstdDecompressor().decompress(body), kind, True
    except Exception:  # noqa: BLE001 - unavailable codec or a corrupt stream: keep the stored bytes
        return body, kind, False
