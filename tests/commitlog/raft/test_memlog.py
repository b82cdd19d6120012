# MemLog, the in-memory RaftLog: real encoded DLedger entries with CRCs and
# running positions, batch reads bounded by bytes and count, follower appends
# checked like the disk store checks them, truncation, reset and retention
# with the boundary entry kept answerable.
import pytest

from commitlog.entry import HEADER_SIZE, MAGIC_NOOP, chain_crc, iter_batch
from commitlog.errors import AppendRejectedError, IndexBelowBeginError, IndexBeyondEndError
from commitlog.raft.memlog import MemLog
from commitlog.raft.roles.follower import batch_tail
from native.hashing import crc32
from tests.commitlog.raft.helpers import log_with_terms


def test_empty_log_is_dledger_style_like_the_disk_store():
    log = MemLog()
    assert (log.begin_index, log.end_index, log.end_term) == (-1, -1, -1)
    with pytest.raises(IndexBeyondEndError):
        log.term_at(0)
    with pytest.raises(IndexBelowBeginError):
        log.term_at(-1)              # the core answers for the virtual entry -1 itself
    log.append_leader([b"a"], 1, 1)
    assert (log.begin_index, log.end_index) == (0, 0)


def test_leader_append_writes_real_entries_with_crcs_and_positions():
    log = MemLog()
    assert log.append_leader([b"ab", b"cde"], 3, 1) == [(0, 0), (1, 48 + 2)]
    assert log.append_leader([b""], 4, MAGIC_NOOP) == [(2, 48 + 2 + 48 + 3)]
    prev = 0
    for i in range(3):
        e = log.entry(i)
        assert e.index == i and e.pos == log.pos_at(i)
        assert e.body_crc == crc32(e.body)
        prev = chain_crc(prev, e.body_crc, i, e.term)
        assert e.chain_crc == prev == log.chain_crc_at(i)
    assert log.entry(2).magic == MAGIC_NOOP and log.end_term == 4
    assert [log.term_at(i) for i in range(3)] == [3, 3, 4]
    assert log.first_index_of_term(4) == 2 and log.first_index_of_term(9) == -1
    with pytest.raises(AppendRejectedError):
        log.append_leader([b"x"], 2, 1)   # terms never go back


def test_read_batch_is_bounded_by_bytes_and_count():
    log = log_with_terms([1, 1, 2, 2, 2, 3], body=b"0123456789")   # 48 + 11 bytes each
    size = HEADER_SIZE + 11
    b = log.read_batch(1, 10 * size, 3)
    assert (b.first_index, b.count, b.term_runs) == (1, 3, ((1, 1), (2, 2)))
    assert [e.index for e in iter_batch(b)] == [1, 2, 3]
    b = log.read_batch(0, 2 * size, 100)
    assert b.count == 2 and len(b.raw) == 2 * size
    b = log.read_batch(0, 1, 100)             # one entry even if bigger than max_bytes
    assert b.count == 1
    b = log.read_batch(4, 1 << 20, 100)
    assert (b.count, b.term_runs) == (2, ((4, 2), (5, 3)))


def test_follower_append_copies_bytes_and_checks_continuity():
    leader = log_with_terms([1, 1, 2, 2, 3])
    follower = MemLog()
    follower.append_follower(leader.read_batch(0, 1 << 20, 3))
    follower.append_follower(leader.read_batch(3, 1 << 20, 10))
    assert follower.read_batch(0, 1 << 20, 10).raw == leader.read_batch(0, 1 << 20, 10).raw
    assert follower.chain_crc_at(4) == leader.chain_crc_at(4)
    other = log_with_terms([1, 1, 2, 2, 3, 3], body=b"y")
    with pytest.raises(AppendRejectedError, match="starts at"):
        follower.append_follower(other.read_batch(3, 1 << 20, 10))
    with pytest.raises(AppendRejectedError, match="chainCrc"):
        follower.append_follower(batch_tail(other.read_batch(4, 1 << 20, 10), 5))


def test_follower_append_rejects_tampered_bytes():
    leader = log_with_terms([1, 1, 2])
    batch = leader.read_batch(0, 1 << 20, 10)
    raw = bytearray(batch.raw)
    raw[-1] ^= 1
    with pytest.raises(AppendRejectedError, match="bodyCrc"):
        MemLog().append_follower(type(batch)(batch.first_index, batch.count, batch.term_runs, bytes(raw)))
    with pytest.raises(AppendRejectedError, match="term runs"):
        MemLog().append_follower(type(batch)(0, 3, ((0, 1),), batch.raw))


def test_truncate_refuses_committed_entries():
    log = log_with_terms([1, 1, 2, 2])
    log.set_committed(1)
    with pytest.raises(AppendRejectedError):
        log.truncate_from(1)
    log.truncate_from(2)
    assert (log.end_index, log.end_term) == (1, 1)
    log.append_leader([b"z"], 5, 1)
    assert log.term_at(2) == 5 and log.pos_at(2) == 2 * (HEADER_SIZE + 2)


@pytest.mark.parametrize("keep_boundary", [False, True])
def test_retention_keeps_positions_and_maybe_the_boundary(keep_boundary):
    log = log_with_terms([1, 1, 2, 2, 3, 3])
    crc2, pos3 = log.chain_crc_at(2), log.pos_at(3)
    with pytest.raises(ValueError):
        log.delete_before(3)                  # not committed yet
    log.set_committed(4)
    log.delete_before(3, keep_boundary=keep_boundary)
    assert (log.begin_index, log.end_index) == (3, 5)
    if keep_boundary:
        assert log.term_at(2) == 2 and log.chain_crc_at(2) == crc2
    else:
        with pytest.raises(IndexBelowBeginError):
            log.term_at(2)
    assert log.pos_at(3) == pos3 and log.first_index_of_term(2) == 3
    with pytest.raises(IndexBelowBeginError):
        log.read_batch(2, 1 << 20, 10)
    log.append_leader([b"more"], 3, 1)
    assert log.entry(6).pos == log.pos_at(5) + HEADER_SIZE + 2


def test_reset_restarts_at_a_boundary():
    leader = log_with_terms([1, 1, 2, 2, 3, 3])
    leader.set_committed(5)
    leader.delete_before(4, keep_boundary=True)
    follower = log_with_terms([1, 9, 9])
    follower.reset_to(4, leader.pos_at(4), leader.term_at(3), leader.chain_crc_at(3))
    assert (follower.begin_index, follower.end_index, follower.committed_index) == (4, 3, 3)
    assert follower.end_term == 2     # the boundary's term
    assert follower.term_at(3) == 2 and follower.chain_crc_at(3) == leader.chain_crc_at(3)
    follower.append_follower(leader.read_batch(4, 1 << 20, 10))
    assert follower.chain_crc_at(5) == leader.chain_crc_at(5)
