# Fixture stores and oracles for the pipeline tests (no tests here):
# ledgermq stores written through the real segmented store with the
# leader's append hook (several segments, an uncommitted tail, compressed
# and IPv6 records), the dispatcher's own output for them, direct decodes
# of committed messages, and file-tree digests for byte comparisons.
import hashlib
import os
import zlib

from commitlog.scan import walk_store
from commitlog.store import SegmentedStore, StoreConfig
from consumequeue import record as M
from consumequeue import service
from consumequeue.dispatcher import DispatchConfig, DispatchEngine
from consumequeue.queue_offsets import QueueOffsetTable

SEG = 1 << 16
SMALL = DispatchConfig(cq_file_size=20 * 50, index_slot_num=101, index_num=300, batch_records=64)
SMALL_ARGS = (("cq_file_size", SMALL.cq_file_size), ("index_slots", SMALL.index_slot_num),
              ("index_items", SMALL.index_num))
T0 = 1_700_000_000_000


def message(i: int, *, term_tag: str = "") -> bytes:
    """Message i: two topics over three queues, tags, keys, UNIQ_KEY on
    most; every 13th body zlib-compressed (COMPRESSED flag), every 17th
    from an IPv6 producer; store times spread over two UTC days."""
    props = {"TAGS": f"tag{i % 3}", "KEYS": f"k{i % 17} order{i}{term_tag}", "UNIQ_KEY": f"UNIQ{i:08d}{term_tag}"}
    if i % 11 == 5:
        del props["UNIQ_KEY"]
    if i % 19 == 7:
        del props["TAGS"]
    body = (b"m%d-" % i) * (10 + i % 40) + term_tag.encode()
    sysflag = 0
    if i % 13 == 3:
        body, sysflag = zlib.compress(body), M.COMPRESSED_FLAG
    born = M.HostAddr("::1", 40000 + i % 7) if i % 17 == 4 else M.HostAddr("10.0.0.2", 50000)
    return M.encode(M.MessageRecord(topic=("OrderTopic", "PayTopic")[i % 2], queue_id=i % 3, body=body,
                                    properties=props, sysflag=sysflag, born_timestamp=T0 + i * 1000,
                                    born_host=born, store_host=M.HostAddr("10.0.0.1", 10911),
                                    store_timestamp=T0 + i * 60_000, reconsume_times=i % 2))


def build_store(root, n: int, *, committed: int | None = None, seg: int = SEG, diverge_at: int | None = None,
                term_tag: str = "x") -> None:
    """A ledgermq store of n messages (entry i = message i, except from
    `diverge_at` on, where the bodies differ: another leader's history);
    entries up to `committed` (default: all) are committed."""
    store = SegmentedStore.open(StoreConfig(str(root), data_segment_size=seg, index_segment_size=32 * 1024))
    table = QueueOffsetTable()
    store.add_append_hook(table.append_hook)
    cuts = sorted(set(range(0, n, 50)) | ({diverge_at} if diverge_at is not None and diverge_at < n else set()))
    for a, b in zip(cuts, cuts[1:] + [n]):
        forked = diverge_at is not None and a >= diverge_at
        store.append_leader([message(i, term_tag=term_tag if forked else "") for i in range(a, b)],
                            term=2 if forked else 1)
    store.set_committed(store.end_index if committed is None else committed)
    store.close()


def dispatcher_output(root, out, config: DispatchConfig = SMALL) -> None:
    """What the broker's dispatcher writes for the store's committed log
    (a fresh engine dispatching everything committed into `out`)."""
    store = SegmentedStore.open(StoreConfig(str(root)))
    try:
        engine = DispatchEngine(str(out), service.source_for(store), config=config)
        p = service.positions(store)
        assert engine.open(p.begin_pos, p.committed_pos, p.committed_index).action == "fresh"
        engine.dispatch_to(p.committed_pos)
        engine.checkpoint()
        engine.close()
        engine.source.close()
    finally:
        store.close()


def digests(root) -> dict:
    """md5 of every consume queue file (by path) and of every index file
    (by order: their names are creation times)."""
    out = {}
    base = os.path.join(str(root), "consumequeue")
    for d, _, files in os.walk(base):
        for f in files:
            out["cq/" + os.path.relpath(os.path.join(d, f), base)] = _md5(os.path.join(d, f))
    idx = os.path.join(str(root), "index")
    if os.path.isdir(idx):
        for k, name in enumerate(sorted(os.listdir(idx))):
            out[f"index#{k}"] = _md5(os.path.join(idx, name))
    return out


def _md5(path: str) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def committed_messages(root) -> list[tuple[int, M.MessageRecord]]:
    """(physical offset, record) of every committed message, decoded
    directly from the entries (the oracle of export and stats)."""
    from commitlog.metafiles import read_checkpoint
    store_dir = os.path.join(str(root), "dledger-n0")
    _, committed = read_checkpoint(store_dir)
    out = []
    for h, body, _, _ in walk_store(store_dir):
        if h.index > committed:
            break
        if M.looks_like_record(body):
            out.append((h.pos + 48, M.decode(bytes(body))))
    return out


def commit_up_to(root, index: int) -> None:
    """Raise the store's committed index, as the group's progress would."""
    store = SegmentedStore.open(StoreConfig(str(root)))
    try:
        store.set_committed(index)
        store.write_checkpoint()
    finally:
        store.close()


def build_reset_store(root, ref_root, begin: int, n: int, *, prev_chain_crc: int | None = None,
                      seg: int = SEG) -> None:
    """A follower reset to the leader's begin `begin` after retention
    (SegmentedStore.reset_to with the leader's entry begin-1), then given
    messages begin..n-1 and committed.  `prev_chain_crc` overrides the
    leader's chainCrc of entry begin-1 (another history)."""
    ref_dir = os.path.join(str(ref_root), "dledger-n0")
    prev = pos = None
    for h, _, _, _ in walk_store(ref_dir):
        if h.index == begin - 1:
            prev = h
        if h.index == begin:
            pos = h.pos
            break
    assert prev is not None and pos is not None, f"entries {begin - 1} and {begin} are not both in {ref_root}"
    store = SegmentedStore.open(StoreConfig(str(root), data_segment_size=seg, index_segment_size=32 * 1024))
    try:
        store.reset_to(begin, pos, prev.term, prev.chain_crc if prev_chain_crc is None else prev_chain_crc)
        table = QueueOffsetTable()
        store.add_append_hook(table.append_hook)
        for a in range(begin, n, 50):
            store.append_leader([message(i) for i in range(a, min(n, a + 50))], term=prev.term)
        store.set_committed(store.end_index)
    finally:
        store.close()
