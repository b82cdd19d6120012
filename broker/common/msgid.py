# Owns RocketMQ's two message ids (spec §1.9):
#  * offsetMsgId, the server id: hex(storeHost IP + i32 port + i64
#    PHYSICALOFFSET), 32 chars for IPv4 and 56 for IPv6;
#  * UNIQ_KEY, the client id: hex(IP + i16 pid + i32 classLoader hash +
#    i32 ms since the start of the current month + i16 counter).
import os
import socket
import struct
import threading
import time
import typing

import attrs

from consumequeue.record import HostAddr, MessageFormatError

_Q = struct.Struct(">q")

def offset_msg_id(store_host: HostAddr, physical_offset: int) -> str:
    return (store_host.packed + struct.pack(">q", physical_offset)).hex().upper()


def offset_msg_ids(store_host: HostAddr, physical_offsets) -> list[str]:
    """offset_msg_id of each offset (the host packed once: the send path
    answers every message with one)."""
    host = store_host.packed
    pack = _Q.pack
    return [(host + pack(offset)).hex().upper() for offset in physical_offsets]


def parse_offset_msg_id(msg_id: str) -> tuple[HostAddr, int]:
    """decodeMessageId: length 32 means IPv4, otherwise IPv6 (56)."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise MessageFormatError(f"offsetMsgId is not hex: {msg_id[:64]!r}") from None
    ip_len = 4 if len(msg_id) == 32 else 16
    if len(raw) != ip_len + 12:
        raise MessageFormatError(f"offsetMsgId has {len(msg_id)} chars; expected 32 or 56")
    port, phys = struct.unpack_from(">iq", raw, ip_len)
    return HostAddr(raw[:ip_len], port), phys


@attrs.frozen(kw_only=True)
class UniqKeyInfo:
    ip: bytes
    pid: int
    class_loader_hash: int
    ms_since_month_start: int
    counter: int


def parse_uniq_key(key: str) -> UniqKeyInfo:
    try:
        raw = bytes.fromhex(key)
    except ValueError:
        raise MessageFormatError(f"UNIQ_KEY is not hex: {key[:64]!r}") from None
    if len(raw) not in (16, 28):
        raise MessageFormatError(f"UNIQ_KEY has {len(raw)} bytes; expected 16 or 28")
    ip_len = len(raw) - 12
    pid, cl, diff, counter = struct.unpack_from(">hiih", raw, ip_len)
    return UniqKeyInfo(ip=raw[:ip_len], pid=pid, class_loader_hash=cl, ms_since_month_start=diff, counter=counter)


def _month_start_ms(now_ms: int) -> int:
    """Start of the current month in the local time zone, as Java's
    Calendar-based setStartTime computes it."""
    t = time.localtime(now_ms / 1000)
    start = time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1))
    return int(start * 1000)


def _next_month_start_ms(now_ms: int) -> int:
    t = time.localtime(now_ms / 1000)
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return int(time.mktime((year, month, 1, 0, 0, 0, 0, 0, -1)) * 1000)


def _local_ip() -> bytes:
    try:
        return socket.inet_aton(socket.gethostbyname(socket.gethostname()))
    except OSError:
        return b"\x7f\x00\x00\x01"


@attrs.define
class UniqKeyGenerator:
    """MessageClientIDSetter.createUniqID.  The fixed prefix is IP + pid +
    a per-process constant standing in for Java's classLoader hash; the time
    part restarts every month, the counter wraps at 16 bits."""

    ip: bytes = attrs.field(factory=_local_ip)
    pid: int = attrs.field(factory=os.getpid)
    class_loader_hash: int = attrs.field(factory=lambda: int.from_bytes(os.urandom(4), "big", signed=True))
    clock_ms: typing.Callable[[], int] = lambda: int(time.time() * 1000)
    _counter: int = 0
    _start: int = 0
    _next_start: int = 0
    _lock: threading.Lock = attrs.field(factory=threading.Lock)
    prefix: str = attrs.field(init=False, default="")  # hex(IP + pid + classLoader hash), fixed

    def __attrs_post_init__(self):
        if len(self.ip) not in (4, 16):
            raise ValueError("ip must be 4 or 16 bytes")
        self.prefix = (self.ip + struct.pack(">hi", (self.pid + (1 << 15)) % (1 << 16) - (1 << 15),
                                             self.class_loader_hash)).hex().upper()

    def reserve(self, n: int) -> tuple[int, int]:
        """(time part, first counter) of n keys made elsewhere (the native
        send path formats them: prefix + %08X time + %04X counter, the
        counter wrapping at 16 bits) -- the same keys n calls of next()
        would make within this millisecond."""
        now = self.clock_ms()
        with self._lock:
            if now >= self._next_start:
                self._start, self._next_start = _month_start_ms(now), _next_month_start_ms(now)
            diff = now - self._start
            counter = self._counter
            self._counter = (self._counter + n) & 0xFFFF
        diff = ((diff + (1 << 31)) % (1 << 32)) - (1 << 31)  # Java (int) cast
        if -1_000_000 < diff < 0:
            diff = 0
        return diff, counter

    def next(self) -> str:
        diff, counter = self.reserve(1)
        return self.prefix + struct.pack(">iH", diff, counter).hex().upper()

