# An independent reader written straight from the spec (§1 message record,
# §2 ConsumeQueue, §3 IndexFile, §5 DLedger entries) with plain struct and its
# own Java String.hashCode -- no ledgermq codec, hash helper or scanner -- that
# recomputes what the consume queues and the index must contain for a store
# and compares it with the files the dispatcher wrote.
import os
import struct

from consumequeue import service
from consumequeue.dispatcher import DispatchConfig
from tests.consumequeue.test_dispatch import leader_store

CQ_UNITS_PER_FILE = 50
SLOTS = 101
CONFIG = DispatchConfig(cq_file_size=20 * CQ_UNITS_PER_FILE, index_slot_num=SLOTS, index_num=100_000)


def java_hash(s: str) -> int:
    h = 0
    data = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def read_messages(data_dir: str):
    """(phyOffset, totalSize, topic, queueId, queueOffset, props, storeTs) of
    every message in the DLedger data segments, per spec §5.1 and §1.2."""
    for name in sorted(os.listdir(data_dir)):
        base = int(name)
        buf = open(os.path.join(data_dir, name), "rb").read()
        off = 0
        while off + 8 <= len(buf):
            magic, size = struct.unpack_from(">ii", buf, off)
            if magic == -1 or size == 0:
                break  # blank filler / end of written data
            pos, = struct.unpack_from(">q", buf, off + 24)
            assert pos == base + off
            if magic == 1:
                m = off + 48
                total, _mg, _crc, qid, _flag, qoff, phy, sysflag = struct.unpack_from(">iiiiiqqi", buf, m)
                assert phy == pos + 48 and total == size - 48
                bh = 20 if sysflag & 0x10 else 8
                sh = 20 if sysflag & 0x20 else 8
                store_ts, = struct.unpack_from(">q", buf, m + 48 + bh)
                p = m + 48 + bh + 8 + sh + 4 + 8
                blen, = struct.unpack_from(">i", buf, p)
                p += 4 + blen
                tlen = buf[p]
                topic = buf[p + 1:p + 1 + tlen].decode()
                p += 1 + tlen
                plen, = struct.unpack_from(">h", buf, p)
                props = {}
                for part in buf[p + 2:p + 2 + plen].decode().split("\x02"):
                    if len(part) >= 3 and "\x01" in part:
                        k, v = part.split("\x01", 1)
                        props[k] = v
                yield phy, total, topic, qid, qoff, props, store_ts
            off += size


def test_consume_queues_and_index_match_an_independent_reading(tmp_path):
    store, _ = leader_store(tmp_path, 700)
    engine, _ = service.open_engine(store, config=CONFIG)
    service.dispatch_committed(store, engine)
    engine.checkpoint()
    engine.close()
    msgs = list(read_messages(os.path.join(store.store_dir, "data")))
    assert len(msgs) == 700

    # §2: unit N of a queue at byte N*20 of the queue's address space.
    expected: dict[tuple[str, int], dict[int, bytes]] = {}
    for phy, total, topic, qid, qoff, props, _ts in msgs:
        tags = props.get("TAGS", "")
        code = java_hash(tags) if tags else 0
        expected.setdefault((topic, qid), {})[qoff] = struct.pack(">qiq", phy, total, code)
    for (topic, qid), units in expected.items():
        assert sorted(units) == list(range(len(units)))  # contiguous queue offsets
        qdir = os.path.join(tmp_path, "consumequeue", topic, str(qid))
        files = sorted(os.listdir(qdir))
        assert files == [f"{k * 20 * CQ_UNITS_PER_FILE:020d}" for k in range(len(files))]
        space = b"".join(open(os.path.join(qdir, f), "rb").read() for f in files)
        assert space[:20 * len(units)] == b"".join(units[i] for i in range(len(units)))
        assert space[20 * len(units):] == bytes(len(space) - 20 * len(units))

    # §3: one index file; every key's chain lists its messages newest first.
    [index_name] = os.listdir(os.path.join(tmp_path, "index"))
    raw = open(os.path.join(tmp_path, "index", index_name), "rb").read()
    assert len(raw) == 40 + SLOTS * 4 + 100_000 * 20
    begin_ts, end_ts, begin_phy, end_phy, _used, count = struct.unpack_from(">qqqqii", raw, 0)
    keyed = []
    for phy, _total, topic, _qid, _qoff, props, ts in msgs:
        keys = ([props["UNIQ_KEY"]] if props.get("UNIQ_KEY") else []) + \
               [k for k in props.get("KEYS", "").split(" ") if k]
        keyed += [(f"{topic}#{k}", phy, ts) for k in keys]
    assert count == 1 + len(keyed)
    assert (begin_phy, end_phy) == (msgs[0][0], msgs[-1][0])
    assert (begin_ts, end_ts) == (msgs[0][6], msgs[-1][6])
    by_key: dict[str, list[int]] = {}
    for key, phy, _ts in keyed:
        by_key.setdefault(key, []).append(phy)
    for key, phys in by_key.items():
        h = java_hash(key)
        key_hash = 0 if h == -(1 << 31) else abs(h)
        item, = struct.unpack_from(">i", raw, 40 + (key_hash % SLOTS) * 4)
        found = []
        while item > 0:
            khash, phy, tdiff, prev = struct.unpack_from(">iqii", raw, 40 + SLOTS * 4 + item * 20)
            if khash == key_hash:
                found.append(phy)
                assert tdiff >= 0
            item = prev
        # Other keys with the same hash could share the chain; ours are distinct.
        assert found == list(reversed(phys)), key
    store.close()
