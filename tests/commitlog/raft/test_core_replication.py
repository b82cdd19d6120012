# Pure-core replication tests: the leader's per-follower dispatcher (probe
# with conflict hints, pipelined APPEND batches bounded by bytes and count,
# the in-flight window, out-of-order and stale responses by sequence number,
# retransmission, idle COMMIT pushes, heartbeats) and the retention reset of
# a follower the leader's log no longer covers.
import attrs
import pytest

from commitlog.entry import MAGIC_NOOP
from commitlog.raft.messages import HeartbeatRequest, PushRequest, PushResponse, PushType, ResponseCode
from commitlog.raft.state import HardState, Role
from tests.commitlog.raft.helpers import FAST, Solo, log_with_terms
from tests.commitlog.raft.test_core_log import exchange


def pushes(msgs, dst="b", type_=None):
    return [m for m in msgs if isinstance(m, PushRequest) and m.dst == dst and (type_ is None or m.type is type_)]


def ack(leader: Solo, req: PushRequest, match=None, code=ResponseCode.SUCCESS):
    match = req.batch.last_index if match is None else match
    return leader.step(PushResponse(req.dst, leader.core.node_id, req.term, req.type, req.seq, code,
                                    match, 0, match))


def replicating_leader(config=FAST):
    """Leader 'a' of term 1 over an empty log, both followers replicating."""
    a = Solo("a", config=config)
    out = a.make_leader()
    for peer in ("b", "c"):
        (noop,) = pushes(out, peer)
        assert (noop.type, noop.batch.first_index) == (PushType.APPEND, 0)
    return a, out


def test_appends_are_batched_by_count_and_bytes_inside_a_bounded_window():
    a, out = replicating_leader()
    a.core.propose([b"x" * 100] * 60)
    out = a.drain()
    sent = pushes(out, "b")
    assert len(sent) == FAST.max_inflight_pushes - 1           # the NOOP push is still in flight
    assert all(m.batch.count <= FAST.max_batch_count for m in sent)
    assert [m.batch.first_index for m in sent] == [1, 1 + sent[0].batch.count]
    assert a.core.status().peers[0].inflight_pushes == FAST.max_inflight_pushes
    big = attrs.evolve(FAST, max_batch_bytes=3 * 148)     # 3 entries of 48 + 100 bytes
    a2, _ = replicating_leader(big)
    a2.core.propose([b"x" * 100] * 10)
    assert [m.batch.count for m in pushes(a2.drain(), "b")] == [3, 3]
    tiny = attrs.evolve(FAST, max_inflight_bytes=300, max_inflight_pushes=10)
    a3, _ = replicating_leader(tiny)
    a3.core.propose([b"x" * 100] * 40)
    assert len(pushes(a3.drain(), "b")) == 1     # NOOP (48 B) + one 8-entry batch crosses 300 B


def test_out_of_order_acks_move_the_window_by_sequence():
    a, out = replicating_leader()
    (noop,) = pushes(out, "b")
    a.core.propose([b"m"] * 20)
    first, second = pushes(a.drain(), "b")
    # the last push is acknowledged first: everything before it is implied
    out = ack(a, second)
    st = a.core.status().peers[0]
    assert st.match_index == second.batch.last_index and st.inflight_pushes == 1   # the next batch
    assert [m.batch.first_index for m in pushes(out, "b")] == [second.batch.last_index + 1]
    # the late acks of the earlier pushes change nothing
    assert ack(a, first) == [] and ack(a, noop) == []
    assert a.core.status().peers[0].match_index == second.batch.last_index


def test_stale_failures_are_ignored_and_current_ones_reprobe():
    a, out = replicating_leader()
    a.core.propose([b"m"] * 20)
    first, second = pushes(a.drain(), "b")
    # the first push failed (follower lost the NOOP?): a new round starts
    gap = PushResponse("b", "a", 1, PushType.APPEND, first.seq, ResponseCode.INCONSISTENT_STATE, -1, 0, -1)
    out = a.step(gap)
    (retry,) = [m for m in pushes(out, "b")][:1]
    assert (retry.type, retry.prev_index) == (PushType.APPEND, -1)    # -1 is known to match: resend all
    # the failure of the second, older push is stale now
    stale = attrs.evolve(gap, seq=second.seq)
    assert a.step(stale) == []


def test_unanswered_pushes_are_retransmitted_from_the_match_point():
    a, out = replicating_leader()
    ack(a, pushes(out, "b")[0])
    a.core.propose([b"m"] * 5)
    (lost,) = pushes(a.drain(), "b")
    out = a.tick(FAST.push_timeout_ticks)
    again = pushes(out, "b", PushType.APPEND)
    assert again and again[0].prev_index == 0 and again[0].batch == lost.batch and again[0].seq > lost.seq


def test_commit_travels_on_appends_commit_pushes_and_heartbeats():
    a, out = replicating_leader()
    ack(a, pushes(out, "b")[0])
    assert a.core.commit_index == 0
    a.core.propose([b"m"])
    (nxt,) = pushes(a.drain(), "b")
    assert nxt.commit_index == 0                          # piggybacked
    ack(a, nxt)
    assert a.core.commit_index == 1
    out = a.tick()
    commits = pushes(out, "b", PushType.COMMIT)
    assert [m.commit_index for m in commits] == [1]       # idle: standalone COMMIT push
    out = a.tick(FAST.heartbeat_ticks)
    hbs = [m for m in out if isinstance(m, HeartbeatRequest) and m.dst == "b"]
    assert hbs and all(m.commit_index == 1 for m in hbs)
    assert not pushes(out, "b", PushType.COMMIT)          # sent once, not every tick


def test_probe_skips_a_whole_conflicting_term_per_round_trip():
    a = Solo("a", log=log_with_terms([1, 1, 1, 4, 4, 4, 5, 5]), hard=HardState(5))
    b = Solo("b", log=log_with_terms([1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3]), hard=HardState(5))
    out = a.make_leader()
    seen = []
    exchange({"a": a, "b": b}, out, drop=lambda m: m.dst == "c" or (seen.append(m) and False))
    compares = [m.prev_index for m in seen if isinstance(m, PushRequest) and m.type is PushType.COMPARE]
    assert compares == [7, 6, 2]           # end; below b's term-3 run; below b's term-2 run
    assert [b.log.term_at(i) for i in range(b.log.end_index + 1)] == [1, 1, 1, 4, 4, 4, 5, 5, 6]
    assert b.log.chain_crc_at(8) == a.log.chain_crc_at(8)
    # b was longer, but its divergent tail is replaced by APPEND at the first
    # term conflict, never cut by a TRUNCATE below the leader's end (see the
    # next test for why).
    assert not [m for m in seen if isinstance(m, PushRequest) and m.type is PushType.TRUNCATE]
    assert a.core.commit_index == 8


def test_a_restarted_follower_keeps_matching_entries_it_acknowledged_before():
    """Regression (found by the membership chaos runs): the follower's
    `matched` is volatile.  A leader that saw a COMPARE succeed below a
    follower's end used to send TRUNCATE there; a follower restarted in
    between (matched forgotten, its last entry of an older term) cut entries
    it had acknowledged to this very leader -- which may already have
    counted them for a commit -- and the leader, whose match index stayed
    above the cut, never sent them again."""
    terms = [1, 1, 1, 2, 2]
    a = Solo("a", log=log_with_terms(terms), hard=HardState(2))
    b = Solo("b", log=log_with_terms(terms), hard=HardState(2))
    a.make_leader()                                   # term 3, NOOP at 5
    lead = a.core.leader_role
    for m in lead.progress["b"].probe(lead.view(), 2):  # e.g. after a stale failure response
        a.core.send(m)
    (compare,) = pushes(a.drain(), "b", PushType.COMPARE)
    (answer,) = [m for m in b.step(compare) if isinstance(m, PushResponse)]
    assert answer.code is ResponseCode.SUCCESS and answer.end_index == 4
    nxt = pushes(a.step(answer), "b")
    assert [m.type for m in nxt] == [PushType.APPEND] and nxt[0].prev_index == 2
    b.step(nxt[0])
    assert [b.log.term_at(i) for i in range(b.log.end_index + 1)] == [1, 1, 1, 2, 2, 3]


def test_a_divergent_tail_longer_than_the_leaders_log_is_replaced():
    a = Solo("a", log=log_with_terms([1, 1, 1]), hard=HardState(2))
    b = Solo("b", log=log_with_terms([1, 1, 1, 2, 2, 2]), hard=HardState(2))
    out = a.make_leader()                             # term 3, NOOP at 3
    seen = []
    exchange({"a": a, "b": b}, out, drop=lambda m: m.dst == "c" or (seen.append(m) and False))
    assert [b.log.term_at(i) for i in range(b.log.end_index + 1)] == [1, 1, 1, 3]
    assert a.core.commit_index == 3


@pytest.mark.parametrize("keep_boundary", [True, False])
def test_follower_behind_retention_is_reset_to_the_leader_begin(keep_boundary):
    """DLedger resets the follower to the leader's ledgerBeginIndex; when the
    leader's store forgot the entry before it (deleted with its segment),
    the first retained entry becomes the boundary instead."""
    a = Solo("a", log=log_with_terms([1] * 30), hard=HardState(1), committed=29)
    a.log.set_committed(29)
    boundary = 19 if keep_boundary else 20
    boundary_crc = a.log.chain_crc_at(boundary)
    a.log.delete_before(20, keep_boundary=keep_boundary)
    b = Solo("b", log=log_with_terms([1] * 6), hard=HardState(1), committed=5)
    out = a.make_leader()
    exchange({"a": a, "b": b}, out, drop=lambda m: m.dst == "c")
    exchange({"a": a, "b": b}, a.tick(), drop=lambda m: m.dst == "c")    # idle COMMIT push
    resets = [rd.reset_to for rd in b.readies if rd.reset_to is not None]
    assert len(resets) == 1
    r = resets[0]
    assert (r.begin_index, r.begin_pos, r.prev_term, r.prev_chain_crc) == (
        boundary + 1, a.log.pos_at(boundary + 1), 1, boundary_crc)
    assert (b.log.begin_index, b.log.end_index) == (boundary + 1, a.log.end_index)
    assert b.log.chain_crc_at(b.log.end_index) == a.log.chain_crc_at(a.log.end_index)
    assert b.core.commit_index == a.core.commit_index == a.log.end_index


def test_retention_during_streaming_switches_the_follower_to_a_reset():
    a, out = replicating_leader()
    c = Solo("c")
    net = {"a": a, "c": c}
    exchange(net, out, drop=lambda m: m.dst == "b")          # "b" hears nothing from here on
    for _ in range(5):
        a.core.propose([b"m"] * 8)
        exchange(net, a.drain(), drop=lambda m: m.dst == "b")
    assert a.core.commit_index == a.log.end_index == 40 == c.log.end_index
    a.log.delete_before(35)
    out = a.tick(FAST.push_timeout_ticks)       # b's pushes time out; its next batch is gone
    (reset,) = pushes(out, "b", PushType.TRUNCATE)
    assert reset.batch.first_index == 36 and reset.prev_index == 35     # the boundary 34 is forgotten


def test_leader_never_counts_an_unpersisted_self_append():
    a, out = replicating_leader()
    for peer in ("b", "c"):
        ack(a, pushes(out, peer)[0])
    a.core.propose([b"m"])
    rd = a.core.ready()
    assert rd.committed_index is None and a.core.commit_index == 0
    a.log.append_leader(rd.leader_append.bodies, rd.leader_append.term, rd.leader_append.magic)
    a.core.advance(rd)
    assert a.core.role is Role.LEADER and a.core.commit_index == 0   # needs a follower too


def test_retention_between_compare_and_truncate_resets_instead():
    """The match point was found, but retention deleted it before the
    follower's tail could be truncated: reset the follower instead."""
    leader_log = log_with_terms([1] * 30)
    leader_log.set_committed(29)
    a = Solo("a", log=leader_log, hard=HardState(2), committed=29)
    b = Solo("b", log=log_with_terms([1] * 11 + [2] * 10), hard=HardState(2))

    def retention_when_matched(m):
        if isinstance(m, PushResponse) and m.type is PushType.COMPARE and m.code is ResponseCode.SUCCESS:
            a.log.delete_before(15)
        return m.dst == "c"
    exchange({"a": a, "b": b}, a.make_leader(), drop=retention_when_matched)
    assert [rd.reset_to.begin_index for rd in b.readies if rd.reset_to is not None] == [16]
    assert b.log.chain_crc_at(b.log.end_index) == a.log.chain_crc_at(a.log.end_index)


def test_a_leader_with_nothing_to_reset_from_appends_a_noop():
    """Retention left the leader nothing after its boundary (an idle group):
    the follower it must reset gets the entry it needs from a NOOP."""
    a, out = replicating_leader()
    c = Solo("c")
    net = {"a": a, "c": c}
    exchange(net, out, drop=lambda m: m.dst == "b")
    a.core.propose([b"m"] * 5)
    exchange(net, a.drain(), drop=lambda m: m.dst == "b")
    assert a.core.commit_index == 5
    a.log.delete_before(6)                     # everything, boundary forgotten
    b = Solo("b")
    net["b"] = b
    exchange(net, a.tick(FAST.push_timeout_ticks))   # b's pushes time out; the reset needs an entry
    assert a.log.end_index == 6 and a.log.entry(6).magic == MAGIC_NOOP
    # 6 is the only entry left, and the boundary must precede what is sent:
    # one more NOOP, then the reset (boundary 6, committed via c) goes out
    exchange(net, a.tick(FAST.push_timeout_ticks))
    assert a.log.end_index == 7 and a.log.entry(7).magic == MAGIC_NOOP
    exchange(net, a.tick(FAST.push_timeout_ticks))
    assert (b.log.begin_index, b.log.end_index) == (7, 7) and b.log.term_at(6) == 1
    a.core.propose([b"n"] * 3)
    exchange(net, a.drain())
    exchange(net, a.tick())
    assert b.log.chain_crc_at(10) == a.log.chain_crc_at(10) and b.core.commit_index == 10


def test_a_stale_ack_that_empties_the_window_keeps_the_stream_going():
    """Regression (found by the membership chaos runs): an acknowledgement
    of a push older than the current round raises the match index and may
    empty the window; the leader's progress record used to wait for an
    answer that the network had lost, and nothing was ever sent again."""
    a, out = replicating_leader(attrs.evolve(FAST, max_inflight_pushes=1))
    ack(a, pushes(out, "b")[0])
    a.core.propose([b"m"] * 20)
    (first,) = pushes(a.drain(), "b")
    out = a.tick(FAST.push_timeout_ticks)                       # no answer: resent in a new round
    (again,) = pushes(out, "b", PushType.APPEND)
    assert again.seq > first.seq and again.batch == first.batch
    nxt = pushes(ack(a, first), "b", PushType.APPEND)           # the old push's ack; the resend's is lost
    assert nxt and nxt[0].prev_index == first.batch.last_index
