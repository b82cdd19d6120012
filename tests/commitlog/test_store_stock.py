# Stores written by a stock-DLedger-format writer (tests/helpers/stock_dledger.py,
# built from the spec with CRCs 0) read correctly, and ledgermq's own files
# differ from stock ones only in the two CRC fields.
import os
import struct

from commitlog import metafiles
from commitlog.entry import iter_batch
from commitlog.scan import verify_store, walk_store
from commitlog.store import SegmentedStore, StoreConfig
from tests.commitlog.store_helpers import body, snapshot
from tests.helpers.stock_dledger import write_stock_store

TERMS = [1] * 10 + [2] * 15 + [4] * 20


def test_stock_store_reads_and_continues_with_crcs(tmp_path):
    entries = [(body(i), t) for i, t in enumerate(TERMS)]
    placed = write_stock_store(str(tmp_path), entries, data_size=2048, index_size=32 * 8, committed=40,
                               current_term=5, vote_leader="n1")
    # Other segment sizes in the config: the store keeps the ones on disk.
    with SegmentedStore.open(StoreConfig(root=str(tmp_path))) as s:
        assert (s.data_segment_size, s.index_segment_size) == (2048, 256)
        assert (s.begin_index, s.end_index, s.end_term, s.committed_index) == (0, 44, 4, 40)
        assert s.recovery.cut_at is None and s.recovery.index_units_rewritten == 0
        for (i, pos), (b, t) in zip(placed, entries):
            e = s.get(i)
            assert (e.pos, e.term, bytes(e.body), e.chain_crc, e.body_crc) == (pos, t, b, 0, 0)
        assert s.first_index_of_term(2) == 10 and s.first_index_of_term(4) == 25
        batch = s.read_batch(8, 10**6, 100)
        assert batch.term_runs == ((8, 1), (10, 2), (25, 4)) and batch.count == 37
        assert [e.body for e in iter_batch(batch)] == [b for b, _ in entries[8:]]
        # ledgermq continues the log with CRCs (the chain starts from 0 after stock entries)
        s.append_leader([b"with crc"], term=5)
        assert s.get(45).body_crc != 0
    assert metafiles.read_currterm(os.path.join(tmp_path, "dledger-n0")) == (5, "n1")
    with SegmentedStore.open(StoreConfig(root=str(tmp_path))) as s:
        assert s.end_index == 45 and bytes(s.get(45).body) == b"with crc"
    summary = verify_store(os.path.join(tmp_path, "dledger-n0"))
    assert summary.problems == [] and (summary.entries, summary.segments) == (46, len({p // 2048 for _, p in placed}))


def test_stock_store_whose_head_was_deleted(tmp_path):
    # Retention at DLedger deleted the first files: the log starts at index 300
    # in the data file at 6144 (index files below it are gone too).
    entries = [(body(i), 3) for i in range(300, 340)]
    write_stock_store(str(tmp_path), entries, data_size=2048, index_size=32 * 8, first_index=300, first_file=6144)
    with SegmentedStore.open(StoreConfig(root=str(tmp_path))) as s:
        assert (s.begin_index, s.end_index) == (300, 339)
        assert s.pos_of(300) == 6144 and bytes(s.get(320).body) == body(320)
    problems = []
    got = [(h.index, bytes(b)) for h, b, _, _ in walk_store(os.path.join(tmp_path, "dledger-n0"), problems)]
    assert problems == [] and got == [(i, body(i)) for i in range(300, 340)]


def test_ledgermq_files_differ_from_stock_only_in_crc_fields(tmp_path):
    entries = [(body(i), 1 + i // 20) for i in range(60)]
    write_stock_store(str(tmp_path / "stock"), entries, data_size=1024, index_size=320)
    with SegmentedStore.open(StoreConfig(root=str(tmp_path / "ours"), data_segment_size=1024,
                                         index_segment_size=320)) as s:
        for b, t in entries:
            s.append_leader([b], t)
        positions = [s.pos_of(i) for i in range(60)]
    ours = snapshot(os.path.join(tmp_path, "ours", "dledger-n0"))
    stock = snapshot(os.path.join(tmp_path, "stock", "dledger-n0"))
    assert ours.keys() == stock.keys()
    for name in ours:
        if name.startswith("index/"):
            assert ours[name] == stock[name]
    for name in (n for n in ours if n.startswith("data/")):
        a, b = bytearray(ours[name]), bytearray(stock[name])
        start = int(name[5:])
        for p in positions:
            if start <= p < start + 1024:
                assert struct.unpack_from(">II", a, p - start + 36) != (0, 0)
                a[p - start + 36:p - start + 44] = bytes(8)
        assert a == b
