# The broker's read path (consumequeue/reader.py) over a real store and real
# consume queue files: every GetMessageStatus with its nextBeginOffset, tag
# filtering by hash code, the max_msgs / max_bytes limits, the committed
# bound, and records byte-equal to the data segment files on disk; plus
# VIEW_MESSAGE_BY_ID and QUERY_MESSAGE lookups.
import os
import struct

import pytest

from commitlog.watermark import Watermark
from consumequeue import record as M
from consumequeue import service
from consumequeue.errors import InconsistentStateError, MessageNotFoundError
from consumequeue.queue_offsets import QueueOffsetTable
from consumequeue.reader import DEFAULT_MAX_BYTES, message_at, pull_response_code, query_by_key, read_messages
from consumequeue.reader import GetMessageStatus as S
from consumequeue.service import ConsumeQueueService
from tests.consumequeue.test_dispatch import SEG, SMALL, bodies, leader_store, open_store

PER_FILE = SMALL.cq_file_size // 20  # 50 units per consume queue file


def on_disk(store, phy: int, size: int) -> bytes:
    """The record's bytes read straight from its data segment file."""
    start = phy - phy % SEG
    with open(os.path.join(store.store_dir, "data", f"{start:020d}"), "rb") as f:
        f.seek(phy - start)
        return f.read(size)


def split(records: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(records):
        (size,) = struct.unpack_from(">i", records, at)
        out.append(records[at:at + size])
        at += size
    assert at == len(records)
    return out


def open_service(store) -> ConsumeQueueService:
    engine, _ = service.open_engine(store, config=SMALL)
    service.dispatch_committed(store, engine)
    return ConsumeQueueService(store, engine, Watermark(store.committed_index))


@pytest.fixture
def svc(tmp_path):
    store, _ = leader_store(tmp_path, 800)  # 200 messages per queue, several CQ files and segments
    s = open_service(store)
    yield s
    s.close()
    store.close()


def test_found_records_are_the_stored_bytes(svc):
    r = read_messages(svc, "T", 0, 0, max_msgs=10)
    assert (r.status, r.next_begin_offset, r.min_offset, r.max_offset) == (S.FOUND, 10, 0, 200)
    assert r.queue_offsets == list(range(10)) and r.message_count == 10
    recs = split(r.records)
    assert len(recs) == 10
    cq = svc.engine.cqs.get("T", 0)
    for rec, unit, phy, qoff in zip(recs, cq.read(0, 10), r.phy_offsets, r.queue_offsets):
        assert (unit.phy, unit.size) == (phy, len(rec))
        assert rec == on_disk(svc.store, phy, unit.size)
        msg = M.decode(rec, check_crc=True)
        assert (msg.topic, msg.queue_id, msg.queue_offset, msg.physical_offset) == ("T", 0, qoff, phy)
    assert b"".join(on_disk(svc.store, u.phy, u.size) for u in cq.read(0, 10)) == r.records
    # The next pull continues where this one stopped; a pull never crosses a
    # consume queue file (getIndexBuffer), so it ends at offset 50.
    r2 = read_messages(svc, "T", 0, r.next_begin_offset, max_msgs=1000, max_bytes=1 << 30)
    assert r2.status is S.FOUND and r2.queue_offsets == list(range(10, PER_FILE))
    assert r2.next_begin_offset == PER_FILE
    assert pull_response_code(r2.status, 10) == 0


def test_max_msgs_and_max_bytes(svc):
    sizes = [u.size for u in svc.engine.cqs.get("U", 1).read(0, 10)]
    r = read_messages(svc, "U", 1, 0, max_msgs=4)
    assert r.message_count == 4 and r.next_begin_offset == 4 and len(r.records) == sum(sizes[:4])
    # max_bytes caps the total, but the first record always goes out.
    r = read_messages(svc, "U", 1, 0, max_msgs=32, max_bytes=1)
    assert r.message_count == 1 and r.next_begin_offset == 1 and len(r.records) == sizes[0]
    r = read_messages(svc, "U", 1, 0, max_msgs=32, max_bytes=sum(sizes[:3]))
    assert r.message_count == 3 and r.next_begin_offset == 3
    r = read_messages(svc, "U", 1, 0, max_msgs=32, max_bytes=sum(sizes[:3]) - 1)
    assert r.message_count == 2
    r = read_messages(svc, "U", 1, 0, max_msgs=0)  # like RocketMQ: 0 still returns one
    assert r.message_count == 1
    assert read_messages(svc, "U", 1, 0, max_msgs=40).message_count == 40
    assert DEFAULT_MAX_BYTES == 256 << 10


def test_queue_offset_statuses_and_corrections(svc):
    # Unknown queue and empty queue.
    r = read_messages(svc, "nope", 0, 7)
    assert (r.status, r.next_begin_offset, r.min_offset, r.max_offset) == (S.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
    assert pull_response_code(r.status, 7) == 21 and pull_response_code(r.status, 0) == 19
    svc.engine.cqs.get_or_create("Empty", 0)
    r = read_messages(svc, "Empty", 0, 3)
    assert (r.status, r.next_begin_offset) == (S.NO_MESSAGE_IN_QUEUE, 0)
    assert pull_response_code(r.status, 3) == 21 and pull_response_code(r.status, 0) == 19
    # At the end: wait there; beyond it (queue starting at 0): back to 0.
    r = read_messages(svc, "T", 2, 200)
    assert (r.status, r.next_begin_offset, r.records) == (S.OFFSET_OVERFLOW_ONE, 200, b"")
    assert pull_response_code(r.status, 200) == 19
    r = read_messages(svc, "T", 2, 250)
    assert (r.status, r.next_begin_offset) == (S.OFFSET_OVERFLOW_BADLY, 0)
    assert pull_response_code(r.status, 250) == 21
    # Retention moved the queue's min offset: below it -> min; beyond the end -> max.
    cq = svc.engine.cqs.get("T", 2)
    cut = cq.get_unit(120).phy
    svc.engine.delete_expired(cut)
    assert cq.min_offset == 120 and cq.starts[0] == 100 * 20
    r = read_messages(svc, "T", 2, 30)
    assert (r.status, r.next_begin_offset, r.min_offset, r.max_offset) == (S.OFFSET_TOO_SMALL, 120, 120, 200)
    assert pull_response_code(r.status, 30) == 21
    assert read_messages(svc, "T", 2, 250).next_begin_offset == 200
    # A slave without offsetCheckInSlave keeps the request offset.
    assert read_messages(svc, "T", 2, 30, correct_offsets=False).next_begin_offset == 30
    assert read_messages(svc, "T", 2, 250, correct_offsets=False).next_begin_offset == 250
    assert read_messages(svc, "nope", 0, 7, correct_offsets=False).next_begin_offset == 7
    r = read_messages(svc, "T", 2, 120, max_msgs=1)
    assert r.status is S.FOUND and r.queue_offsets == [120]


def test_missing_consume_queue_file_is_offset_found_null(svc):
    cq = svc.engine.cqs.get("U", 3)
    assert cq.starts[:3] == [0, 1000, 2000]
    cq.fds.unlink(cq._path(1000))  # damage: the file holding 50..99 is gone
    cq.starts.remove(1000)
    r = read_messages(svc, "U", 3, 60)
    assert (r.status, r.next_begin_offset, r.records) == (S.OFFSET_FOUND_NULL, 100, b"")
    assert pull_response_code(r.status, 60) == 19
    assert read_messages(svc, "U", 3, 100).status is S.FOUND


def test_tag_filter_by_hash_code(tmp_path):
    store = open_store(tmp_path)
    table = QueueOffsetTable()
    store.add_append_hook(table.append_hook)
    tags = ["TagA", "TagB", "tag-zz", None, "TagA"] * 12  # tag-zz hashes negative
    store.append_leader([M.encode(M.MessageRecord(topic="F", body=f"b{i}".encode(),
                                                  properties={"TAGS": t} if t else {}))
                         for i, t in enumerate(tags)], term=1)
    store.set_committed(store.end_index)
    svc = open_service(store)
    try:
        code_a, code_neg = M.tags_code("TagA"), M.tags_code("tag-zz")
        assert code_neg < 0
        r = read_messages(svc, "F", 0, 0, max_msgs=5, tag_codes={code_a})
        assert r.status is S.FOUND and r.queue_offsets == [0, 4, 5, 9, 10]
        assert r.next_begin_offset == 11  # skipped units count as consumed
        assert [M.decode(x).tags for x in split(r.records)] == ["TagA"] * 5
        # The consume queue keeps tagsCode sign-extended; codes compare as Java ints
        # (a client may also send the unsigned form).
        for codes in ({code_neg}, {code_neg & 0xFFFFFFFF}):
            r = read_messages(svc, "F", 0, 0, max_msgs=3, tag_codes=codes)
            assert r.queue_offsets == [2, 7, 12] and r.next_begin_offset == 13
        r = read_messages(svc, "F", 0, 0, max_msgs=100, tag_codes={code_a, M.tags_code("TagB")})
        assert r.message_count == 30 and r.next_begin_offset == PER_FILE  # 3 of every 5, to the file end
        # Nothing matches: scan to the end of the CQ file and move on.
        r = read_messages(svc, "F", 0, 0, tag_codes={12345})
        assert (r.status, r.next_begin_offset, r.records) == (S.NO_MATCHED_MESSAGE, PER_FILE, b"")
        assert pull_response_code(r.status, 0) == 20
        r = read_messages(svc, "F", 0, PER_FILE, tag_codes={12345})
        assert (r.status, r.next_begin_offset) == (S.NO_MATCHED_MESSAGE, 60)
        assert read_messages(svc, "F", 0, 0, max_msgs=100, tag_codes=set()).status is S.NO_MATCHED_MESSAGE
        # None means no filter (untagged messages included).
        assert read_messages(svc, "F", 0, 0, max_msgs=5).queue_offsets == [0, 1, 2, 3, 4]
    finally:
        svc.close()
        store.close()


def test_deleted_commitlog_is_message_was_removing(svc):
    cq = svc.engine.cqs.get("T", 0)
    first_seg_units = [u for u in cq.read(0, 200) if u.phy < SEG]
    assert len(first_seg_units) > PER_FILE  # the first CQ file points only into segment 0
    read_messages(svc, "T", 0, 0)  # map segment 0
    # Retention behind the store's back: the source still maps the deleted
    # file, and must notice instead of serving its stale pages.
    os.unlink(os.path.join(svc.store.store_dir, "data", f"{0:020d}"))
    r = read_messages(svc, "T", 0, 0)
    assert (r.status, r.next_begin_offset, r.records) == (S.MESSAGE_WAS_REMOVING, PER_FILE, b"")
    assert pull_response_code(r.status, 0) == 20
    # A pull straddling the deleted segment skips the rest of it and returns
    # what follows (nextPhyFileStartOffset).
    k = len(first_seg_units)
    r = read_messages(svc, "T", 0, k - 2, max_msgs=3)
    assert r.status is S.FOUND and r.queue_offsets == [k, k + 1, k + 2] and r.next_begin_offset == k + 3
    assert split(r.records)[0] == on_disk(svc.store, cq.get_unit(k).phy, cq.get_unit(k).size)


def test_never_past_the_committed_position(tmp_path):
    store, _ = leader_store(tmp_path, 200)
    svc = open_service(store)
    try:
        # An uncommitted tail is in the log but not in the queues.
        uncommitted = store.append_leader(bodies(40, 200), term=1)
        r = read_messages(svc, "T", 0, 0, max_msgs=1000, max_bytes=1 << 30)
        assert r.next_begin_offset == r.max_offset == 50 and r.message_count == 50
        assert max(r.phy_offsets) < svc.engine.pos <= uncommitted[0][1]
        # A queue claiming units beyond a committed bound (damage) is cut there.
        cq = svc.engine.cqs.get("T", 0)
        bound = cq.get_unit(20).phy
        r = read_messages(svc, "T", 0, 15, max_msgs=100, committed_pos=bound)
        assert r.queue_offsets == list(range(15, 20)) and r.next_begin_offset == 20
        r = read_messages(svc, "T", 0, 20, committed_pos=bound)
        assert (r.status, r.next_begin_offset, r.records) == (S.OFFSET_FOUND_NULL, 20, b"")
        # A unit whose size disagrees with the record there is an error, not garbage.
        u = cq.get_unit(3)
        cq.fds.pwrite(cq._path(0), struct.pack(">qiq", u.phy, u.size + 1, u.tags_code), 3 * 20)
        with pytest.raises(InconsistentStateError):
            read_messages(svc, "T", 0, 0, max_msgs=10)
    finally:
        svc.close()
        store.close()


def test_message_at_and_query_by_key(tmp_path):
    store, _ = leader_store(tmp_path, 300)
    svc = open_service(store)
    try:
        cq = svc.engine.cqs.get("U", 1)
        u = cq.get_unit(5)
        rec = message_at(svc, u.phy)
        assert rec == on_disk(store, u.phy, u.size) and len(rec) == u.size
        assert message_at(svc.engine, u.phy) == rec
        for bad in (u.phy + 1, u.phy - 48, u.phy + 48, 0):
            with pytest.raises(MessageNotFoundError, match="not the start of a message record"):
                message_at(svc, bad)
        with pytest.raises(MessageNotFoundError, match="beyond the committed position"):
            message_at(svc, store.end_pos + 100)
        [(idx, pos)] = store.append_leader(bodies(1, 300), term=1)
        with pytest.raises(MessageNotFoundError, match="beyond the committed position"):
            message_at(svc, pos + 48)  # written, not committed
        store.set_committed(idx)
        assert M.decode(message_at(svc, pos + 48)).physical_offset == pos + 48
        # QUERY_MESSAGE: exact keys and the index's hash.
        res = query_by_key(svc, "T", "order12")
        assert res.phy_offsets == [store.pos_of(12) + 48]
        assert res.records == message_at(svc, res.phy_offsets[0])
        assert query_by_key(svc, "U", "order12").records == b""
        assert len(query_by_key(svc, "T", "k3").phy_offsets) == len(
            [i for i in range(300) if i % 17 == 3 and i % 2 == 0])
        assert res.index_last_update_phy_offset > 0 and res.index_last_update_timestamp > 0
    finally:
        svc.close()
        store.close()


def test_query_by_key_drops_hash_collisions(tmp_path):
    store = open_store(tmp_path)
    table = QueueOffsetTable()
    store.add_append_hook(table.append_hook)
    # "Aa" and "BB" share String.hashCode, so "Q#Aa" and "Q#BB" share an index slot.
    placed = store.append_leader([M.encode(M.MessageRecord(topic="Q", body=b"x", properties={"KEYS": k}))
                                  for k in ("Aa", "BB", "Aa")], term=1)
    store.set_committed(store.end_index)
    svc = open_service(store)
    try:
        want = [placed[2][1] + 48, placed[0][1] + 48]  # newest first
        assert query_by_key(svc, "Q", "Aa").phy_offsets == want
        assert len(query_by_key(svc, "Q", "Aa", exact=False).phy_offsets) == 3
        assert query_by_key(svc, "Q", "BB").phy_offsets == [placed[1][1] + 48]
    finally:
        svc.close()
        store.close()
