# Owns the record of how far dispatch has durably got:
#  * ${root}/checkpoint -- RocketMQ's StoreCheckpoint (spec §4.1): a
#    4096-byte file of big-endian i64s: physicMsgTimestamp, logicsMsgTimestamp,
#    indexMsgTimestamp, masterFlushedOffset, confirmPhyOffset.  ledgermq
#    uses bytes RocketMQ leaves unused for its extension: @40 i64
#    dispatchedPhyOffset (next commitlog position to dispatch), @48 i64
#    dispatchedIndex (last DLedger index dispatched), @56 u32 'LMQD', @60 u32
#    CRC32 of bytes 0..59.  A stock broker ignores them.
#  * ${root}/dispatch_state.json -- the same position plus what the consume
#    queues and index files must hold there (every queue's max offset and
#    first unit's commitlog position, every index file's item count).  Restart compares the files against it, so a
#    deleted or damaged consume queue is noticed and rebuilt instead of
#    silently serving holes.
#
# Write order (dispatcher.checkpoint): fsync CQ + index files, then the JSON
# (atomic rename), then the binary checkpoint.  Both describe only flushed
# data; on disagreement (a crash between the two) the JSON, written first,
# is the newer truth.
import json
import os
import struct
import zlib

import attrs

from commitlog.atomicfile import write_atomic

CHECKPOINT_FILE = "checkpoint"
STATE_FILE = "dispatch_state.json"
CHECKPOINT_SIZE = 4096
EXT_MAGIC = 0x4C4D5144  # "LMQD"
_LAYOUT = struct.Struct(">qqqqqqqI")  # 60 bytes, then the CRC


@attrs.define
class StoreCheckpoint:
    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0
    master_flushed_offset: int = 0
    confirm_phy_offset: int = 0
    dispatched_phy_offset: int = -1
    dispatched_index: int = -1

    def pack(self) -> bytes:
        head = _LAYOUT.pack(*attrs.astuple(self), EXT_MAGIC)
        return head + struct.pack(">I", zlib.crc32(head)) + bytes(CHECKPOINT_SIZE - len(head) - 4)

    @classmethod
    def unpack(cls, raw: bytes) -> "StoreCheckpoint":
        if len(raw) < 64:
            raise ValueError(f"checkpoint file has {len(raw)} bytes")
        *fields, magic = _LAYOUT.unpack_from(raw, 0)
        (crc,) = struct.unpack_from(">I", raw, 60)
        if magic != EXT_MAGIC or crc != zlib.crc32(raw[:60]):
            # A stock RocketMQ checkpoint: its timestamps, no dispatch position.
            return cls(*fields[:5])
        return cls(*fields)

    @classmethod
    def load(cls, root: str) -> "StoreCheckpoint | None":
        try:
            with open(os.path.join(root, CHECKPOINT_FILE), "rb") as f:
                return cls.unpack(f.read(CHECKPOINT_SIZE))
        except FileNotFoundError:
            return None

    def store(self, root: str) -> None:
        """Rewrite in place and fsync, as StoreCheckpoint.flush does."""
        path = os.path.join(root, CHECKPOINT_FILE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, self.pack(), 0)
            os.fsync(fd)
        finally:
            os.close(fd)


@attrs.define(kw_only=True)
class DispatchState:
    phy: int  # next commitlog position to dispatch
    index: int  # last dispatched entry index, -1 before the first
    # (topic, queue id) -> (max offset, phy of its first unit)
    queues: dict[tuple[str, int], tuple[int, int]] = attrs.field(factory=dict)
    index_files: list[tuple[str, int]] = attrs.field(factory=list)

    def to_json(self) -> bytes:
        body = {
            "phy": self.phy,
            "index": self.index,
            "queues": [[t, q, m, f] for (t, q), (m, f) in sorted(self.queues.items())],
            "indexFiles": [[n, c] for n, c in self.index_files],
        }
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return json.dumps({"crc": zlib.crc32(text.encode()), "state": body},
                          sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> "DispatchState":
        outer = json.loads(raw)
        body = outer["state"]
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        if zlib.crc32(text.encode()) != outer["crc"]:
            raise ValueError("dispatch state CRC mismatch")
        return cls(phy=int(body["phy"]), index=int(body["index"]),
                   queues={(t, int(q)): (int(m), int(f)) for t, q, m, f in body["queues"]},
                   index_files=[(n, int(c)) for n, c in body["indexFiles"]])

    @classmethod
    def load(cls, root: str) -> "DispatchState | None":
        """None when absent; raises ValueError when unreadable."""
        try:
            with open(os.path.join(root, STATE_FILE), "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        try:
            return cls.from_json(raw)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{os.path.join(root, STATE_FILE)}: {exc}") from None

    def store(self, root: str) -> None:
        write_atomic(os.path.join(root, STATE_FILE), self.to_json())


def remove_all(root: str) -> None:
    for name in (STATE_FILE, CHECKPOINT_FILE):
        try:
            os.unlink(os.path.join(root, name))
        except FileNotFoundError:
            pass
