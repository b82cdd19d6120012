# Owns the Python face of the send-path helpers (native/src/sendpath.c):
# scanning the whole frames of a receive buffer and parsing plain
# SEND_MESSAGE_V2 headers, encoding their message records, and encoding the
# SendMessageResponseHeader answers -- each in one call per burst.
#
# The helpers take only the usual request (plain digits, no DELAY/CLUSTER/
# TRAN_MSG/TIMER_* property, strict JSON...) and decline the rest with a status; a
# declined request goes through the general path in Python
# (broker.remoting.codec + broker.processors.send), which is therefore the
# pure-Python twin of everything here: the oracle tests check that whatever
# the C accepts comes out byte for byte as the general path makes it.  With
# no extension (AVAILABLE false) callers simply never take this path.
from array import array

from native import NATIVE_LOADED, ffi, lib

AVAILABLE = NATIVE_LOADED and hasattr(lib, "lmq_scan_requests")

_new = ffi.new_allocator(should_clear_after_alloc=False) if AVAILABLE else None

SEND_OK, SEND_GENERAL, SEND_PROPS, SEND_BAD_JSON, SEND_OTHER = range(5)
# Frames scanned per call, and the most a record adds to its request's
# bytes (fixed fields and hosts, UNIQ_KEY and CLUSTER aside).
MAX_SCAN = 512
SCRATCH_MAX = 96 * 1024
_RECORD_OVERHEAD = 160
_RESPONSE_ROOM = 400


class SendScan:
    """The whole frames at the front of a receive buffer, as
    lmq_scan_requests saw them.  `data` is a copy of exactly those frames,
    so bodies and headers stay readable after the buffer moves on."""

    __slots__ = ("data", "n", "reqs", "scratch", "_data_ptr")

    def __init__(self, data: bytes, n: int, reqs, scratch) -> None:
        self.data, self.n, self.reqs, self.scratch = data, n, reqs, scratch
        self._data_ptr = None

    @property
    def end(self) -> int:
        """Bytes the scanned frames take."""
        r = self.reqs[self.n - 1]
        return r.frame_off + r.frame_len

    def header(self, i: int) -> bytes:
        r = self.reqs[i]
        return self.data[r.header_off:r.header_off + r.header_len]

    def body(self, i: int) -> bytes:
        r = self.reqs[i]
        return self.data[r.body_off:r.body_off + r.body_len]

    def topic(self, i: int) -> bytes:
        r = self.reqs[i]
        return ffi.buffer(self.scratch + r.topic_off, r.topic_len)[:]

    def properties(self, i: int) -> bytes:
        r = self.reqs[i]
        return ffi.buffer(self.scratch + r.props_off, r.props_len)[:]

    def data_ptr(self):
        if self._data_ptr is None:
            self._data_ptr = ffi.from_buffer(self.data)
        return self._data_ptr


def scan_requests(buf: bytearray, start: int, max_frame: int, max_n: int = MAX_SCAN) -> SendScan | None:
    """Scan buf[start:] (the decoder's own checks on every prefix; a frame
    failing one, or incomplete, ends the scan); None when no whole frame is
    there.  The caller reads the frames in order from the scan."""
    avail = len(buf) - start
    # Nothing to do unless the first frame is whole: a large frame arriving
    # chunk by chunk must not cost a scan (and a scratch buffer) per chunk.
    if avail < 8 or avail < 4 + int.from_bytes(buf[start:start + 4], "big", signed=True):
        return None
    reqs = _new("lmq_send_req[]", max_n)
    # Unescaped strings are never longer than their JSON: room for every
    # header of a read, bounded (a scan ends where it is full; the next
    # scan goes on) so that a large read costs no large allocation.
    room = min(avail, SCRATCH_MAX)
    scratch = _new("uint8_t[]", room)
    with ffi.from_buffer(buf) as whole:
        n = lib.lmq_scan_requests(whole + start, avail, max_frame, max_n, reqs, scratch, room)
    if n == 0:
        return None
    last = reqs[n - 1]
    with memoryview(buf) as view:  # one copy of the frames (released before the buffer moves on)
        data = bytes(view[start:start + last.frame_off + last.frame_len])
    return SendScan(data, n, reqs, scratch)


class SendEnv:
    """The per-burst constants of lmq_send_env (kept alive with it)."""

    __slots__ = ("env", "_keep")

    def __init__(self, born_host: bytes, store_host: bytes, store_timestamp: int, cluster: bytes,
                 uniq_prefix: bytes, uniq_diff: int, uniq_counter: int) -> None:
        env = ffi.new("lmq_send_env *")
        keep = [ffi.from_buffer(b) for b in (born_host, store_host, cluster, uniq_prefix)]
        env.born_host, env.store_host, env.cluster, env.uniq_prefix = keep
        env.born_host_len, env.store_host_len = len(born_host), len(store_host)
        env.cluster_len, env.uniq_prefix_len = len(cluster), len(uniq_prefix)
        env.store_timestamp, env.uniq_diff, env.uniq_counter = store_timestamp, uniq_diff, uniq_counter
        self.env, self._keep = env, keep


def encode_sends(scan: SendScan, which: array, queue_ids: array, sysflags: array,
                 env: SendEnv, n: int | None = None) -> tuple[object, array, array, array, array, int]:
    """The records of the requests `which` (indexes into the scan, 'i'),
    with their queue ids and sysflags ('i' arrays): (records buffer --
    larger than the records, which lie back to back from 0 --, record
    offsets, record lengths, UNIQ_KEY offsets and lengths in the buffer,
    the UNIQ_KEY counter after the keys it made).  The caller has checked
    the property lengths.  n: only the first n of the
    arrays (all by default)."""
    n = len(which) if n is None else n
    e = env.env
    cap = len(scan.data) + n * (_RECORD_OVERHEAD + e.cluster_len + e.uniq_prefix_len)
    out = ffi.buffer(_new("uint8_t[]", cap))  # not zeroed: the records are written whole
    rec_off, rec_len = array("q", bytes(8 * n)), array("i", bytes(4 * n))
    uniq_off, uniq_len = array("q", bytes(8 * n)), array("i", bytes(4 * n))
    counter = ffi.new("int32_t *")
    f = ffi.from_buffer
    used = lib.lmq_encode_sends(scan.data_ptr(), scan.reqs, f("int32_t[]", which), f("int32_t[]", queue_ids),
                                f("int32_t[]", sysflags), n, scan.scratch, e, f(out), cap,
                                f("int64_t[]", rec_off), f("int32_t[]", rec_len), f("int64_t[]", uniq_off),
                                f("int32_t[]", uniq_len), counter)
    if used < 0:  # pragma: no cover - the capacity above is an upper bound
        raise RuntimeError(f"lmq_encode_sends: no room for record {-1 - used}")
    return out, rec_off, rec_len, uniq_off, uniq_len, counter[0]


def encode_send_responses(opaques: array, queue_ids: array, queue_offsets: array, phy_offsets: array,
                          uniq_buf: bytes, uniq_off: array, uniq_len: array, store_host: bytes,
                          version: int, n: int | None = None) -> tuple[bytes, array]:
    """SUCCESS answers (SendMessageResponseHeader, JSON) for n sends (all
    of the arrays by default): the frames back to back, and where each
    starts."""
    n = len(opaques) if n is None else n
    cap = n * _RESPONSE_ROOM + 6 * sum(uniq_len)
    out = _new("uint8_t[]", cap)  # not zeroed: the frames are written whole
    frame_off = array("q", bytes(8 * n))
    f = ffi.from_buffer
    used = lib.lmq_encode_send_responses(f("int32_t[]", opaques), f("int32_t[]", queue_ids),
                                         f("int64_t[]", queue_offsets), f("int64_t[]", phy_offsets), f(uniq_buf),
                                         f("int64_t[]", uniq_off), f("int32_t[]", uniq_len), n, f(store_host),
                                         len(store_host), version, out, cap, f("int64_t[]", frame_off))
    if used < 0:  # pragma: no cover - the capacity above is an upper bound
        raise RuntimeError(f"lmq_encode_send_responses: no room for frame {-1 - used}")
    return ffi.buffer(out, used)[:], frame_off


BATCH_AVAILABLE = NATIVE_LOADED and hasattr(lib, "lmq_encode_batch")
# The most messages one SEND_BATCH body may hold (consumequeue/batch.py
# refuses more; the scanner declines them, so the general path refuses).
MAX_BATCH_MESSAGES = 16384


def scan_batch(body: bytes):
    """A SEND_BATCH body split into its messages (native/src/sendpath_batch.c)
    if every message's properties are plain and there are at most
    MAX_BATCH_MESSAGES: (items, count, messages without a UNIQ_KEY,
    properties bytes), else None (the general path)."""
    max_n = min(len(body) // 22 + 1, MAX_BATCH_MESSAGES)
    items = _new("lmq_batch_item[]", max_n)
    missing, props = ffi.new("int64_t *"), ffi.new("int64_t *")
    n = lib.lmq_scan_batch(ffi.from_buffer(body), len(body), items, max_n, missing, props)
    if n < 0:
        return None
    return items, n, missing[0], props[0]


def encode_batch(body: bytes, scanned, topic: bytes, magic: int, queue_id: int, sysflag: int, born_timestamp: int,
                 reconsume_times: int, env: SendEnv) -> list[bytes] | None:
    """One record per message of a scanned batch (scan_batch), UNIQ_KEYs
    made from env's (prefix, diff, counter) for the messages without one;
    None when a record would not fit (the general path names the error)."""
    items, n, _missing, props = scanned
    e = env.env
    cap = len(body) + n * (_RECORD_OVERHEAD + len(topic) + e.cluster_len + e.uniq_prefix_len) + props
    out = ffi.buffer(_new("uint8_t[]", cap))  # not zeroed: the records are written whole
    rec_off = array("q", bytes(8 * (n + 1)))
    used = lib.lmq_encode_batch(ffi.from_buffer(body), items, n, topic, len(topic), magic, queue_id, sysflag,
                                born_timestamp, reconsume_times, e, ffi.from_buffer(out), cap,
                                ffi.from_buffer("int64_t[]", rec_off))
    if used < 0:
        return None
    view = memoryview(out)  # views of one buffer: the log copies them once, into its write
    return [view[rec_off[k]:rec_off[k + 1]] for k in range(n)]


TAKE_END, TAKE_TOPIC, TAKE_CHECK = 0, 1, 2


def run_end(scan: SendScan, i: int) -> int:
    """The end of the run of plain sends starting at frame i (i itself when
    frame i is not one)."""
    return lib.lmq_send_run_end(scan.reqs, i, scan.n)


def take_rule(topic_first: int, max_queue: int, max_body: int, set_flags: int, clear_flags: int,
              props_fixed: int, props_uniq: int, max_props: int):
    """The per-message checks of one topic (lmq_take_rule)."""
    rule = _new("lmq_take_rule *")
    rule.topic_first, rule.max_queue, rule.max_body = topic_first, max_queue, max_body
    rule.set_flags, rule.clear_flags = set_flags, clear_flags
    rule.props_fixed, rule.props_uniq, rule.max_props = props_fixed, props_uniq, max_props
    return rule


def take_sends(scan: SendScan, lo: int, hi: int, rule, which: array, queue_ids: array, sysflags: array,
               opaques: array, at: int, counts: array) -> tuple[int, int]:
    """lmq_take_sends: frames lo.. of the scan into the arrays from `at`
    while they pass `rule`; counts ('q': made UNIQ_KEYs, oneway) grow.
    Returns (the first frame not taken, why: TAKE_END/TOPIC/CHECK)."""
    f = ffi.from_buffer
    why = ffi.new("int32_t *")
    end = lib.lmq_take_sends(scan.reqs, lo, hi, rule, f("int32_t[]", which), f("int32_t[]", queue_ids),
                             f("int32_t[]", sysflags), f("int32_t[]", opaques), at, f("int64_t[]", counts), why)
    return end, why[0]
