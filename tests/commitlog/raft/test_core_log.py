# Pure-core log tests: Raft §5.3 (log matching: consistency check, first
# conflict found by bisection, divergent tail truncated, duplicates
# harmless), §5.4.1 (election restriction), §5.4.2 (commit only through an
# entry of the current term, Figure 8), and the follower-side rules that keep
# acknowledged entries safe from stale TRUNCATEs.
import collections

import pytest

from commitlog.entry import EntryBatch
from commitlog.errors import RaftSafetyError
from commitlog.raft.messages import PushRequest, PushResponse, PushType, ResponseCode, VoteRequest
from commitlog.raft.roles.follower import FollowerRole, batch_tail
from commitlog.raft.state import HardState, Role
from tests.commitlog.raft.helpers import Solo, log_with_terms


def push(log, prev, count, *, term, commit=-1, seq=1, type_=PushType.APPEND, src="b", dst="a"):
    batch = log.read_batch(prev + 1, 1 << 20, count) if count else None
    prev_term, prev_crc = (log.term_at(prev), log.chain_crc_at(prev)) if prev >= 0 else (-1, 0)
    return PushRequest(src, dst, term, type_, seq, commit, prev, prev_term, prev_crc, batch)


def only(msgs, cls=PushResponse):
    (m,) = [m for m in msgs if isinstance(m, cls)]
    return m


def exchange(nodes: dict, msgs, drop=lambda m: False, limit=10_000):
    """Deliver messages FIFO between Solo nodes until the network is empty."""
    queue = collections.deque(msgs)
    delivered = 0
    while queue:
        m = queue.popleft()
        if m.dst in nodes and not drop(m):
            queue.extend(nodes[m.dst].step(m))
        delivered += 1
        assert delivered < limit, "message storm"
    return delivered


# --- §5.3 log matching -----------------------------------------------------

def test_5_3_append_continuing_the_log_is_written_verbatim_without_a_loop():
    leader_log = log_with_terms([1, 1, 2, 2, 2])
    f = Solo(log=log_with_terms([1, 1]), hard=HardState(2))
    out = f.step(push(leader_log, 1, 3, term=2, commit=3))
    rd = f.readies[0]
    assert rd.follower_append == leader_log.read_batch(2, 1 << 20, 3)   # the same object contents, untouched
    assert rd.truncate_from is None
    resp = only(out)
    assert (resp.code, resp.match_index, resp.end_index) == (ResponseCode.SUCCESS, 4, 4)
    assert f.core.commit_index == 3 == f.log.committed_index
    assert f.log.chain_crc_at(4) == leader_log.chain_crc_at(4)


def test_5_3_consistency_check_refuses_a_gap_and_a_term_mismatch():
    leader_log = log_with_terms([1, 1, 2, 2, 3, 3])
    f = Solo(log=log_with_terms([1, 1, 2]), hard=HardState(3))
    resp = only(f.step(push(leader_log, 4, 1, term=3)))
    assert (resp.code, resp.end_index, resp.conflict_term) == (ResponseCode.INCONSISTENT_STATE, 2, -1)
    f2 = Solo(log=log_with_terms([1, 1, 1, 1]), hard=HardState(3))
    resp = only(f2.step(push(leader_log, 3, 1, term=3)))
    # prev 3 has term 1 here, 2 on the leader: hint = first index of term 1
    assert (resp.code, resp.conflict_term, resp.conflict_index) == (ResponseCode.INCONSISTENT_STATE, 1, 0)
    assert f.log.end_index == 2 and f2.log.end_index == 3     # nothing written


@pytest.mark.parametrize("follower_terms,conflict", [
    ([1, 1, 2, 2, 2, 2, 2], 4),        # longer divergent tail of term 2
    ([1, 1, 2, 2, 4], 4),              # one divergent entry
    ([1, 1, 2, 2, 4, 4, 4, 4, 4], 4),  # divergent tail longer than the batch
])
def test_5_3_first_conflict_is_found_and_the_tail_replaced(follower_terms, conflict):
    leader_log = log_with_terms([1, 1, 2, 2, 5, 5, 5])
    f = Solo(log=log_with_terms(follower_terms), hard=HardState(5))
    calls = []
    term_at = f.log.term_at
    f.log.term_at = lambda i: calls.append(i) or term_at(i)
    out = f.step(push(leader_log, 1, 6, term=5))
    lookups = len(calls)
    rd = f.readies[0]
    assert rd.truncate_from == conflict
    assert rd.follower_append.first_index == conflict and rd.follower_append.last_index == 6
    assert only(out).match_index == 6
    assert [f.log.term_at(i) for i in range(7)] == [1, 1, 2, 2, 5, 5, 5]
    assert f.log.end_index == 6 and f.log.chain_crc_at(6) == leader_log.chain_crc_at(6)
    assert lookups <= 7                   # bisection, not a scan


def test_5_3_duplicated_and_overlapping_appends_are_harmless():
    leader_log = log_with_terms([1, 1, 2, 2, 2, 2])
    f = Solo(log=log_with_terms([1, 1, 2, 2]), hard=HardState(2))
    resp = only(f.step(push(leader_log, 0, 3, term=2, seq=5)))     # entirely held
    assert (resp.match_index, resp.end_index, resp.seq) == (3, 3, 5)
    assert not f.readies or f.readies[-1].follower_append is None
    resp = only(f.step(push(leader_log, 1, 4, term=2)))            # 2..5 overlaps 2..3
    assert f.readies[-1].follower_append.first_index == 4 and f.readies[-1].follower_append.count == 2
    assert resp.match_index == 5 and f.log.end_index == 5


def test_batch_tail_slices_bytes_and_term_runs():
    log = log_with_terms([1, 1, 2, 2, 3])
    b = log.read_batch(0, 1 << 20, 10)
    for k in range(1, 5):
        tail = batch_tail(b, k)
        assert tail == log.read_batch(k, 1 << 20, 10)
    assert batch_tail(b, 0) is b
    with pytest.raises(ValueError):
        batch_tail(b, 5)


def test_stale_truncate_never_drops_acknowledged_or_current_term_entries():
    leader_log = log_with_terms([1, 1, 3, 3, 3])
    f = Solo(log=log_with_terms([1, 1, 2, 2]), hard=HardState(3))
    # COMPARE at 1 matches; the follower has more: TRUNCATE after 1
    assert only(f.step(push(leader_log, 1, 0, term=3, type_=PushType.COMPARE))).end_index == 3
    assert only(f.step(push(leader_log, 1, 0, term=3, type_=PushType.TRUNCATE))).end_index == 1
    assert f.log.end_index == 1
    only(f.step(push(leader_log, 1, 3, term=3)))                    # acknowledged up to 4
    # the same TRUNCATE again (duplicated by the network): nothing happens
    resp = only(f.step(push(leader_log, 1, 0, term=3, type_=PushType.TRUNCATE)))
    assert f.log.end_index == 4 and resp.end_index == 4
    # even after a restart (acknowledgements forgotten), a log ending in the
    # current term equals this leader's: nothing is dropped
    f2 = Solo(log=f.log, hard=HardState(3))
    only(f2.step(push(leader_log, 1, 0, term=3, type_=PushType.TRUNCATE)))
    assert f2.log.end_index == 4


def test_truncating_committed_entries_is_refused_loudly():
    f = Solo(log=log_with_terms([1, 1, 2]), hard=HardState(4), committed=2)
    bogus = log_with_terms([1, 1, 3])
    with pytest.raises(RaftSafetyError):
        f.step(push(bogus, 1, 1, term=4))


def test_follower_commit_never_passes_what_matches_the_leader():
    leader_log = log_with_terms([1, 1, 2, 2])
    f = Solo(log=log_with_terms([1, 1, 1, 1, 1]), hard=HardState(2))
    f.step(push(leader_log, 0, 1, term=2, commit=3))
    assert f.core.commit_index == 1          # leader committed 3, but only 0..1 are known to match
    f.step(PushRequest("b", "a", 2, PushType.COMMIT, 2, 3))
    assert f.core.commit_index == 1
    f.step(push(leader_log, 1, 2, term=2, commit=3))
    assert f.core.commit_index == 3 and f.log.term_at(3) == 2


# --- §5.4.1 election restriction --------------------------------------------

def test_5_4_1_a_candidate_with_a_stale_log_cannot_win():
    stale = Solo("a", log=log_with_terms([1, 1]), hard=HardState(2))
    voters = {n: Solo(n, log=log_with_terms([1, 1, 2]), hard=HardState(2)) for n in ("b", "c")}
    stale.core.campaign()
    msgs = stale.drain()
    exchange({"a": stale, **voters}, msgs)
    assert stale.core.role is not Role.LEADER
    # the up-to-date node wins
    b = voters["b"]
    b.core.campaign()
    exchange({"a": stale, **voters}, b.drain())
    assert b.core.role is Role.LEADER


# --- §5.4.2 commit only through the current term ----------------------------

def test_5_4_2_entries_of_earlier_terms_commit_only_through_a_current_term_entry():
    """Figure 8: a leader of term 4 holding an uncommitted term-2 entry
    replicated on a majority must not commit it by counting replicas; it
    commits once its own NOOP (term 4) reaches a majority."""
    a = Solo("a", log=log_with_terms([1, 2]), hard=HardState(3))
    out = a.make_leader()
    assert a.core.term == 4 and a.log.end_index == 2 and a.log.term_at(2) == 4   # NOOP at 2
    compare_b = next(m for m in out if isinstance(m, PushRequest) and m.dst == "b")
    assert (compare_b.prev_index, compare_b.prev_term) == (1, 2)
    # b holds [1, 2] too: match 1 gives a majority for index 1 (a and b) ...
    a.step(PushResponse("b", "a", 4, PushType.COMPARE, compare_b.seq, ResponseCode.SUCCESS, 1, 0, 1))
    assert a.core.commit_index == -1          # ... but term 2 != 4: not committed
    append = [m for m in a.readies[-1].messages if isinstance(m, PushRequest)]
    assert [(m.type, m.batch.first_index, m.batch.last_term) for m in append] == [(PushType.APPEND, 2, 4)]
    a.step(PushResponse("b", "a", 4, PushType.APPEND, append[0].seq, ResponseCode.SUCCESS, 2, 0, 2))
    assert a.core.commit_index == 2 == a.log.committed_index     # NOOP and, through it, the term-2 entry


def test_leader_sends_only_persisted_entries():
    a = Solo("a")
    a.make_leader()
    for peer in ("b", "c"):
        a.step(PushResponse(peer, "a", 1, PushType.APPEND, 1, ResponseCode.SUCCESS, 0, 0, 0))
    a.core.propose([b"m1", b"m2"])
    rd = a.core.ready()
    assert rd.leader_append.first_index == 1 and rd.leader_append.bodies == [b"m1", b"m2"]
    assert not any(isinstance(m, PushRequest) and m.batch is not None for m in rd.messages)
    a.log.append_leader(rd.leader_append.bodies, rd.leader_append.term, rd.leader_append.magic)
    a.core.advance(rd)
    rd = a.core.ready()
    appends = [m for m in rd.messages if isinstance(m, PushRequest)]
    assert {(m.dst, m.batch.first_index, m.batch.last_index) for m in appends} == {("b", 1, 2), ("c", 1, 2)}
    assert appends[0].batch.raw == a.log.read_batch(1, 1 << 20, 10).raw
    a.core.advance(rd)


def test_follower_role_swaps_fresh_state_on_each_role_change():
    s = Solo(hard=HardState(2))
    first = s.core._role
    assert isinstance(first, FollowerRole)
    s.step(VoteRequest("b", "a", 3, -1, -1))
    assert s.core._role is not first and isinstance(s.core._role, FollowerRole)


def test_entry_batch_term_runs_drive_matching_not_entry_objects():
    # A batch whose bytes are not looked at for matching: only the term runs are.
    leader_log = log_with_terms([1, 2, 2, 2])
    b = leader_log.read_batch(1, 1 << 20, 10)
    assert isinstance(b, EntryBatch) and b.term_runs == ((1, 2),)
    f = Solo(log=log_with_terms([1, 2, 2]), hard=HardState(2))
    resp = only(f.step(PushRequest("b", "a", 2, PushType.APPEND, 1, -1, 0, 1, 0, b)))
    assert f.readies[-1].follower_append.first_index == 3 and resp.match_index == 3


# --- §5.3 as a property: any follower log, any APPEND window ----------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st

from commitlog.raft.memlog import MemLog  # noqa: E402


def build(terms):
    """Entry bodies depend only on (index, term), so equal (index, term)
    means equal bytes -- as Raft's log matching guarantees for real logs."""
    log = MemLog()
    for i, t in enumerate(terms):
        log.append_leader([f"{i}:{t}".encode()], t, 1)
    return log


def ascending(draw, lo, count, step):
    out, t = [], lo
    for _ in range(count):
        t += draw(st.sampled_from((0, 0, step)))
        out.append(t)
    return out


@st.composite
def diverged_logs(draw):
    prefix = ascending(draw, 1, draw(st.integers(0, 6)), 1)
    base = (prefix[-1] if prefix else 1) + 1
    base += base % 2                                     # leader suffix: even terms, follower: odd
    leader = prefix + ascending(draw, base, draw(st.integers(1, 8)), 2)
    follower = prefix + ascending(draw, base + 1, draw(st.integers(0, 8)), 2)
    prev = draw(st.integers(-1, len(leader) - 2))
    count = draw(st.integers(1, len(leader) - 1 - prev))
    return leader, follower, prev, count


@settings(max_examples=300, deadline=None)
@given(diverged_logs())
def test_5_3_log_matching_property_for_any_append(case):
    leader_terms, follower_terms, prev, count = case
    leader, follower = build(leader_terms), build(follower_terms)
    term = max(leader_terms + follower_terms) + 1
    f = Solo(log=follower, hard=HardState(term))
    resp = only(f.step(push(leader, prev, count, term=term)))
    last = prev + count
    prev_matches = prev == -1 or (prev < len(follower_terms) and follower_terms[prev] == leader_terms[prev])
    if not prev_matches:
        assert resp.code is ResponseCode.INCONSISTENT_STATE
        assert [follower.term_at(i) for i in range(follower.end_index + 1)] == follower_terms
        return
    assert (resp.code, resp.match_index) == (ResponseCode.SUCCESS, last)
    got = [follower.term_at(i) for i in range(follower.end_index + 1)]
    conflict = next((i for i in range(prev + 1, last + 1)
                     if i >= len(follower_terms) or follower_terms[i] != leader_terms[i]), None)
    if conflict is None:          # all held already: nothing may be dropped
        assert got == follower_terms
    else:
        assert got == leader_terms[:last + 1]
        assert f.readies[0].truncate_from in (None, conflict)
    assert follower.chain_crc_at(last) == leader.chain_crc_at(last)


def test_5_3_first_conflict_in_a_long_overlap_takes_logarithmic_lookups():
    leader_log = log_with_terms([1] * 705 + [4] * 1300)
    f = Solo(log=log_with_terms([1] * 705 + [3] * 1300), hard=HardState(4))
    calls = []
    term_at = f.log.term_at
    f.log.term_at = lambda i: calls.append(i) or term_at(i)
    f.core.step(PushRequest("b", "a", 4, PushType.APPEND, 1, -1, 4, 1, 0, leader_log.read_batch(5, 1 << 30, 2000)))
    assert len(calls) <= 16                       # ~log2(2000) + the prev/last checks, not 700
    assert f.core.ready().truncate_from == 705


def test_follower_vouches_for_a_prev_the_leader_deleted_only_when_it_knows_it():
    from commitlog.raft.messages import UNKNOWN_TERM
    leader_log = log_with_terms([1] * 16)
    f = Solo(log=log_with_terms([1] * 13), hard=HardState(2), committed=10)
    batch = leader_log.read_batch(11, 1 << 20, 5)
    # prev 10 is committed here: equal to the leader's whatever its term
    resp = only(f.step(PushRequest("b", "a", 2, PushType.APPEND, 1, 15, 10, UNKNOWN_TERM, 0, batch)))
    assert (resp.code, resp.match_index) == (ResponseCode.SUCCESS, 15)
    g = Solo(log=log_with_terms([1] * 13), hard=HardState(2), committed=10)
    batch = leader_log.read_batch(13, 1 << 20, 3)
    # prev 12 is neither committed nor acknowledged here: cannot vouch
    resp = only(g.step(PushRequest("b", "a", 2, PushType.APPEND, 1, 15, 12, UNKNOWN_TERM, 0, batch)))
    assert (resp.code, resp.conflict_term) == (ResponseCode.INCONSISTENT_STATE, 1)
    assert g.log.end_index == 12
    # once it acknowledged 12 in this term, it can
    g.step(PushRequest("b", "a", 2, PushType.COMPARE, 2, 10, 12, 1, 0))
    resp = only(g.step(PushRequest("b", "a", 2, PushType.APPEND, 3, 15, 12, UNKNOWN_TERM, 0, batch)))
    assert (resp.code, resp.match_index) == (ResponseCode.SUCCESS, 15)
