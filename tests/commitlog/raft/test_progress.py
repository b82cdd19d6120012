# Unit tests of the leader's per-follower progress record (progress.py) with
# no RaftCore: a MemLog, a MembershipLog and a config make the view; the
# record's answers are the pushes it returns.  (The record in a whole group
# is covered by test_core_replication.py and the simulations.)
import pytest

from commitlog.entry import MAGIC_CONFIG_CHANGE
from commitlog.raft.memlog import MemLog
from commitlog.raft.membership import Membership, MembershipLog
from commitlog.raft.messages import UNKNOWN_TERM, PushResponse, PushType, ResponseCode
from commitlog.raft.progress import PeerState, Progress, ReplicationView
from commitlog.raft.state import PeerStatus, RaftConfig

CFG = RaftConfig(heartbeat_ticks=2, election_timeout_min=10, election_timeout_max=20, push_timeout_ticks=8,
                 max_batch_bytes=1 << 20, max_batch_count=4, max_inflight_pushes=2)
TERM = 3


def log_with_terms(terms) -> MemLog:
    log = MemLog()
    for i, t in enumerate(terms):
        log.append_leader([b"x" + str(i).encode()], t, 1)
    return log


def view(log, *, commit=-1, now=0, config=CFG, membership=None) -> ReplicationView:
    return ReplicationView("a", TERM, commit, now, log,
                           membership or MembershipLog.bootstrap(("a", "b", "c")), config)


def answer(push, code=ResponseCode.SUCCESS, match=None, begin=0, end=None, conflict_term=-1, conflict_index=-1):
    """The follower's response to `push` (match defaults to what it covers)."""
    if match is None:
        match = push.batch.last_index if push.batch is not None else push.prev_index
    if code is not ResponseCode.SUCCESS:
        match = -1
    return PushResponse("b", "a", TERM, push.type, push.seq, code, match, begin,
                        match if end is None else end, conflict_term, conflict_index)


def kinds(pushes):
    return [(p.type, p.prev_index, p.batch.first_index if p.batch else None,
             p.batch.last_index if p.batch else None) for p in pushes]


def matched_at(log, index, v=None) -> tuple[Progress, list]:
    """A record whose COMPARE at `index` succeeded: what it sent next."""
    v = v or view(log)
    pr = Progress.start("b", log.end_index)
    (compare,) = pr.probe(v, index)
    return pr, pr.on_response(v, answer(compare, end=index))


# --- probe -------------------------------------------------------------------

def test_a_new_follower_is_probed_with_a_compare_of_the_leaders_last_entry():
    log = log_with_terms([1, 1, 2, 3])
    pr = Progress.start("b", log.end_index)
    (push,) = pr.probe(view(log, commit=1, now=5), log.end_index)
    assert (push.src, push.dst, push.term, push.type, push.seq, push.commit_index) == \
           ("a", "b", TERM, PushType.COMPARE, 1, 1)
    assert (push.prev_index, push.prev_term, push.prev_chain_crc) == (3, 3, log.chain_crc_at(3))
    assert push.batch is None
    assert (pr.state, pr.probe_index, pr.epoch, pr.waiting_since, pr.last_push_tick) == (PeerState.PROBE, 3, 1, 5, 5)
    assert pr.status() == PeerStatus("b", "probe", -1, 4, 0, 0, -1)


def test_a_probe_at_or_below_the_match_replicates_from_the_match_instead():
    log = log_with_terms([1] * 6)
    pr = Progress.start("b", log.end_index)
    pr.match_index = 3
    pushes = pr.probe(view(log), 2)
    assert pr.state is PeerState.REPLICATE
    assert kinds(pushes) == [(PushType.APPEND, 3, 4, 5)]


def test_the_record_never_writes_the_log_nor_keeps_the_view():
    log = log_with_terms([1, 2, 2])
    before = (log.begin_index, log.end_index, log.committed_index)
    pr, _ = matched_at(log, 0)
    assert (log.begin_index, log.end_index, log.committed_index) == before
    assert not any(isinstance(getattr(pr, a.name), (MemLog, ReplicationView))
                   for a in Progress.__attrs_attrs__)


# --- replicate: the window ---------------------------------------------------

def test_a_match_streams_appends_cut_by_batch_count_inside_the_push_window():
    log = log_with_terms([1] * 20)
    v = view(log)
    pr, pushes = matched_at(log, 1, v)
    # max_batch_count 4, max_inflight_pushes 2: two batches, then the window is full
    assert kinds(pushes) == [(PushType.APPEND, 1, 2, 5), (PushType.APPEND, 5, 6, 9)]
    assert [p.prev_term for p in pushes] == [1, 1]
    assert pr.state is PeerState.REPLICATE and pr.next_index == 10 and len(pr.inflight) == 2
    assert pr.inflight_bytes == sum(len(p.batch.raw) for p in pushes)
    assert pr.pump(v) == []                                  # full: nothing more until an answer
    more = pr.on_response(v, answer(pushes[0]))              # frees one slot
    assert pr.match_index == 5 and kinds(more) == [(PushType.APPEND, 9, 10, 13)]
    assert pr.inflight_bytes == len(pushes[1].batch.raw) + len(more[0].batch.raw)


def test_the_byte_window_stops_the_stream_before_the_push_window_does():
    log = log_with_terms([1] * 20)
    one = len(log.read_batch(0, 1 << 20, 1).raw)
    cfg = RaftConfig(heartbeat_ticks=2, election_timeout_min=10, election_timeout_max=20, push_timeout_ticks=8,
                     max_batch_bytes=1 << 20, max_batch_count=2, max_inflight_pushes=10,
                     max_inflight_bytes=3 * one)
    _, pushes = matched_at(log, 1, view(log, config=cfg))
    # 2 entries (2*one bytes) in flight < 3*one: one more; then 4*one >= 3*one stops it
    assert kinds(pushes) == [(PushType.APPEND, 1, 2, 3), (PushType.APPEND, 3, 4, 5)]


def test_a_configuration_entry_travels_in_a_batch_of_its_own():
    log = log_with_terms([1] * 3)
    m = MembershipLog.bootstrap(("a", "b", "c"))
    joined = Membership(("a", "b", "c"), ("d",), {"d": "127.0.0.1:1"})
    log.append_leader([joined.encode()], 2, MAGIC_CONFIG_CHANGE)          # entry 3
    m.append(3, 2, joined)
    for i in range(4, 8):
        log.append_leader([b"y"], 2, 1)
    cfg = RaftConfig(heartbeat_ticks=2, election_timeout_min=10, election_timeout_max=20, push_timeout_ticks=8,
                     max_batch_count=4, max_inflight_pushes=8)
    _, pushes = matched_at(log, 0, view(log, config=cfg, membership=m))
    assert kinds(pushes) == [(PushType.APPEND, 0, 1, 2), (PushType.APPEND, 2, 3, 3), (PushType.APPEND, 3, 4, 7)]


def test_successes_of_any_age_raise_the_match_failures_of_an_older_round_are_ignored():
    log = log_with_terms([1] * 12)
    v = view(log)
    pr, (first, second) = matched_at(log, 1, v)
    pr.tick(view(log, now=CFG.push_timeout_ticks))           # timeout: a new round from the match
    epoch = pr.epoch
    assert epoch > second.seq
    assert pr.on_response(v, answer(second, ResponseCode.INCONSISTENT_STATE, end=1)) == []   # stale failure
    assert pr.state is PeerState.REPLICATE and pr.epoch == epoch
    pr.on_response(v, answer(second))                        # stale success: still true in this term
    assert pr.match_index == second.batch.last_index


def test_an_ack_of_an_older_round_refills_a_window_it_emptied():
    log = log_with_terms([1] * 12)
    v = view(log)
    pr, (first, second) = matched_at(log, 1, v)
    resent = pr.tick(view(log, now=CFG.push_timeout_ticks))  # resends from match + 1 = 2: the window is full again
    assert kinds(resent) == [(PushType.APPEND, 1, 2, 5), (PushType.APPEND, 5, 6, 9)]
    more = pr.on_response(v, answer(second))                 # old round, acknowledges both resent batches
    assert kinds(more) == [(PushType.APPEND, 9, 10, 11)]
    assert [entry[1] for entry in pr.inflight] == [11]


# --- failures and the probe -------------------------------------------------

def test_a_gap_reprobes_at_the_followers_end():
    log = log_with_terms([1] * 10)
    v = view(log)
    pr = Progress.start("b", log.end_index)
    (compare,) = pr.probe(v, 9)
    (again,) = pr.on_response(v, answer(compare, ResponseCode.INCONSISTENT_STATE, end=4))
    assert (again.type, again.prev_index, again.prev_term) == (PushType.COMPARE, 4, 1)
    assert again.seq == compare.seq + 1 and pr.epoch == again.seq


def test_a_term_conflict_skips_the_followers_whole_term_but_not_below_its_begin():
    log = log_with_terms([1, 1, 1, 2, 2, 3, 3])
    v = view(log)
    pr = Progress.start("b", log.end_index)
    (compare,) = pr.probe(v, 6)
    (again,) = pr.on_response(v, answer(compare, ResponseCode.INCONSISTENT_STATE, end=6,
                                        conflict_term=2, conflict_index=3))
    assert again.prev_index == 2
    (third,) = pr.on_response(v, answer(again, ResponseCode.INCONSISTENT_STATE, begin=2, end=6,
                                        conflict_term=1, conflict_index=0))
    assert third.prev_index == 1                             # the follower's begin - 1, not -1


def test_a_failed_commit_push_changes_nothing():
    log = log_with_terms([1] * 4)
    pr, _ = matched_at(log, 3)
    state = (pr.state, pr.epoch, pr.next_seq)
    (commit,) = pr.tick(view(log, commit=3, now=1))          # idle and behind on the commit: COMMIT alone
    assert commit.type is PushType.COMMIT and commit.commit_index == 3 and pr.sent_commit == 3
    assert pr.on_response(view(log), answer(commit, ResponseCode.INCONSISTENT_STATE)) == []
    assert (pr.state, pr.epoch) == state[:2]


def test_a_caught_up_follower_with_a_longer_tail_gets_a_truncate():
    log = log_with_terms([1, 1, 1])
    v = view(log)
    pr = Progress.start("b", log.end_index)
    (compare,) = pr.probe(v, 2)
    (truncate,) = pr.on_response(v, answer(compare, end=5))  # the follower holds 3..5 no leader sent
    assert (truncate.type, truncate.prev_index, truncate.prev_term, truncate.batch) == (PushType.TRUNCATE, 2, 1, None)
    assert pr.state is PeerState.TRUNCATE
    assert pr.on_response(v, answer(truncate, end=2)) == [] and pr.state is PeerState.REPLICATE


def test_a_match_below_the_leaders_end_appends_rather_than_truncates():
    log = log_with_terms([1] * 6)
    v = view(log)
    pr = Progress.start("b", log.end_index)
    (compare,) = pr.probe(v, 2)
    pushes = pr.on_response(v, answer(compare, end=4))
    assert [p.type for p in pushes] == [PushType.APPEND] and pushes[0].prev_index == 2


# --- time ----------------------------------------------------------------------

def test_an_unanswered_probe_is_resent_after_the_push_timeout():
    log = log_with_terms([1] * 3)
    pr = Progress.start("b", log.end_index)
    (compare,) = pr.probe(view(log, now=10), 2)
    assert pr.tick(view(log, now=10 + CFG.push_timeout_ticks - 1)) == []
    (again,) = pr.tick(view(log, now=10 + CFG.push_timeout_ticks))
    assert (again.type, again.prev_index, again.seq) == (PushType.COMPARE, 2, compare.seq + 1)


def test_an_unanswered_append_resends_from_the_match():
    log = log_with_terms([1] * 12)
    pr, pushes = matched_at(log, 1)
    pr.on_response(view(log), answer(pushes[0]))
    assert pr.tick(view(log, now=CFG.push_timeout_ticks - 1)) == []
    resent = pr.tick(view(log, now=CFG.push_timeout_ticks))
    assert kinds(resent)[0][:3] == (PushType.APPEND, 5, 6)


def test_heard_marks_the_follower_active():
    pr = Progress.start("b", 5)
    pr.heard(42)
    assert pr.recent_active and pr.last_ack_tick == 42


# --- behind the leader's retention ---------------------------------------------

@pytest.mark.parametrize("keep_boundary", [True, False])
def test_a_follower_behind_retention_is_reset_with_the_configuration_in_force(keep_boundary):
    log = log_with_terms([1] * 10)
    log.set_committed(9)
    log.delete_before(5, keep_boundary=keep_boundary)
    v = view(log, commit=9)
    pr = Progress.start("b", log.end_index)
    (compare,) = pr.probe(v, 9)
    (reset,) = pr.on_response(v, answer(compare, ResponseCode.INCONSISTENT_STATE, end=2))
    boundary = 4 if keep_boundary else 5
    assert (reset.type, reset.prev_index, reset.batch.first_index) == (PushType.TRUNCATE, boundary, boundary + 1)
    assert reset.prev_term == 1 and reset.config_index == -1 and reset.config
    assert pr.state is PeerState.RESET
    more = pr.on_response(v, answer(reset))
    last = reset.batch.last_index
    assert pr.state is PeerState.REPLICATE and pr.match_index == last
    assert kinds(more) == ([(PushType.APPEND, last, last + 1, 9)] if last < 9 else [])


def test_a_reset_with_nothing_after_the_boundary_asks_the_leader_for_an_entry():
    log = log_with_terms([1] * 5)
    log.set_committed(4)
    log.delete_before(5, keep_boundary=True)                 # everything deleted; the boundary is 4
    pr = Progress.start("b", log.end_index)
    v = view(log, commit=4)
    (compare,) = pr.probe(v, 4)
    assert compare.prev_term == 1                            # the boundary's term is remembered
    assert pr.on_response(v, answer(compare, ResponseCode.INCONSISTENT_STATE, end=1)) == []
    assert pr.state is PeerState.RESET and pr.needs_entry


def test_an_entry_retention_deleted_is_vouched_for_by_a_follower_that_acknowledged_it():
    log = log_with_terms([1] * 10)
    log.set_committed(9)
    log.delete_before(8)                                     # 0..7 gone, the boundary 7 forgotten
    v = view(log, commit=9)
    pr = Progress.start("b", log.end_index)
    pr.match_index = 7                                       # acknowledged in this term before the deletion
    (append,) = pr.probe(v, 7)
    assert (append.type, append.prev_index, append.prev_term) == (PushType.APPEND, 7, UNKNOWN_TERM)
    assert (append.batch.first_index, append.batch.last_index) == (8, 9)
    fresh = Progress.start("b", log.end_index)               # never acknowledged: only the boundary is asked
    (compare,) = fresh.probe(v, 7)
    assert (compare.type, compare.prev_index, compare.prev_term) == (PushType.COMPARE, 7, UNKNOWN_TERM)
    (reset,) = fresh.probe(v, 6)                             # below the boundary: cannot compare there
    assert (reset.type, reset.prev_index, reset.batch.first_index) == (PushType.TRUNCATE, 8, 9)
