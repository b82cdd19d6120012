# Pure-core election tests: Raft §5.2 (election safety, randomized timeouts),
# DLedger's vote rules as a table (one row per reject reason), pre-vote,
# check-quorum, persistence before answering, the NOOP of a new leader and
# the Ready/advance contract.
import random

import attrs
import pytest

from commitlog.entry import MAGIC_NOOP
from commitlog.errors import NotLeaderError, RaftContractError
from commitlog.raft.core import RaftCore
from commitlog.raft.memlog import MemLog
from commitlog.raft.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    PushRequest,
    PushResponse,
    PushType,
    ResponseCode,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from commitlog.raft.state import HardState, Role
from tests.commitlog.raft.helpers import FAST, Solo, log_with_terms


def votes_in(msgs):
    return [m for m in msgs if isinstance(m, VoteResponse)]


# --- DLedger vote rules, one row per reason -------------------------------

def follow_leader(s: Solo, leader="b"):
    s.step(HeartbeatRequest(leader, "a", s.core.term, -1))


VOTE_TABLE = [
    # (case, log terms, hard state, setup, request kwargs, expected, voter term after)
    ("unknown candidate", [], HardState(1), None,
     dict(src="z", term=2, last_index=-1, last_term=-1), VoteResult.REJECT_UNKNOWN_LEADER, 1),
    ("candidate is the voter", [], HardState(1), None,
     dict(src="a", term=2, last_index=-1, last_term=-1), VoteResult.REJECT_UNEXPECTED_LEADER, 1),
    ("request term below voter term", [], HardState(5), None,
     dict(src="b", term=4, last_index=9, last_term=4), VoteResult.REJECT_EXPIRED_VOTE_TERM, 5),
    ("voter follows a live leader (lease)", [], HardState(5), follow_leader,
     dict(src="c", term=6, last_index=9, last_term=5), VoteResult.REJECT_ALREADY_HAS_LEADER, 5),
    ("voted this term and knows the leader", [], HardState(5, "b"), "no-lease-leader",
     dict(src="c", term=5, last_index=9, last_term=5), VoteResult.REJECT_ALREADY_HAS_LEADER, 5),
    ("already voted for another", [], HardState(5, "b"), None,
     dict(src="c", term=5, last_index=9, last_term=5), VoteResult.REJECT_ALREADY_VOTED, 5),
    ("request term below ledger end term", [1, 5], HardState(2), None,
     dict(src="b", term=3, last_index=9, last_term=5), VoteResult.REJECT_TERM_SMALL_THAN_LEDGER, 2),
    ("candidate ledger end term older (§5.4.1)", [1, 3], HardState(3), None,
     dict(src="b", term=6, last_index=9, last_term=2), VoteResult.REJECT_EXPIRED_LEDGER_TERM, 6),
    ("same ledger end term, shorter (§5.4.1)", [1, 1, 1], HardState(3), None,
     dict(src="b", term=6, last_index=1, last_term=1), VoteResult.REJECT_SMALL_LEDGER_END_INDEX, 6),
    ("up to date, new term", [1, 1, 1], HardState(3), None,
     dict(src="b", term=4, last_index=2, last_term=1), VoteResult.ACCEPT, 4),
    ("up to date, same term, vote repeated", [1], HardState(4, "b"), None,
     dict(src="b", term=4, last_index=0, last_term=1), VoteResult.ACCEPT, 4),
]


# Every row as a vote and as a pre-vote, except the repeated same-term grant:
# a pre-vote always proposes a term above the candidate's own.
VOTE_CASES = [pytest.param(*row, pre_vote, id=f"{row[0]} ({'pre-vote' if pre_vote else 'vote'})")
              for row in VOTE_TABLE for pre_vote in (False, True)
              if not (pre_vote and row[0] == "up to date, same term, vote repeated")]


@pytest.mark.parametrize("case,terms,hard,setup,req,expected,term_after,pre_vote", VOTE_CASES)
def test_dledger_vote_rules(case, terms, hard, setup, req, expected, term_after, pre_vote):
    config = FAST
    if setup == "no-lease-leader":
        config = attrs.evolve(FAST, check_quorum=False)
    s = Solo(log=log_with_terms(terms), hard=hard, config=config)
    if setup == "no-lease-leader":
        follow_leader(s)
    elif setup is not None:
        setup(s)
    out = s.step(VoteRequest(dst="a", pre_vote=pre_vote, **req))
    (resp,) = votes_in(out)
    assert resp.result is expected
    assert resp.pre_vote is pre_vote
    if pre_vote:
        # A pre-vote changes nothing on the voter, whatever the answer.
        assert (s.core.term, s.core.voted_for) == (hard.term, hard.voted_for)
        assert resp.term == (req["term"] if expected is VoteResult.ACCEPT else hard.term)
    else:
        assert s.core.term == term_after == resp.term
        assert s.hard.term == term_after
        if expected is VoteResult.ACCEPT:
            assert s.core.voted_for == s.hard.voted_for == req["src"]


def test_5_2_vote_is_persisted_in_the_ready_that_carries_the_grant():
    s = Solo(hard=HardState(1))
    s.core.step(VoteRequest("b", "a", 2, -1, -1))
    rd = s.core.ready()
    assert rd.hard_state == HardState(2, "b")
    assert [m.result for m in rd.messages] == [VoteResult.ACCEPT]
    assert rd.must_persist        # the shell writes currterm before sending the grant
    s.core.advance(rd)


def test_5_2_election_safety_one_vote_per_term():
    s = Solo(hard=HardState(1))
    assert votes_in(s.step(VoteRequest("b", "a", 2, -1, -1)))[0].granted
    second = votes_in(s.step(VoteRequest("c", "a", 2, 5, 1)))[0]
    assert second.result is VoteResult.REJECT_ALREADY_VOTED and s.core.voted_for == "b"
    # after a restart from the persisted hard state, still no second vote
    s2 = Solo(log=s.log, hard=s.hard)
    assert votes_in(s2.step(VoteRequest("c", "a", 2, 5, 1)))[0].result is VoteResult.REJECT_ALREADY_VOTED


def test_5_2_election_timeouts_are_randomized_per_node():
    timeouts = set()
    for seed in range(20):
        s = Solo(seed=seed)
        timeouts.add(s.core.election_timeout)
        assert FAST.election_timeout_min <= s.core.election_timeout < FAST.election_timeout_max
    assert len(timeouts) > 3
    # the first campaign starts exactly when the drawn timeout expires
    s = Solo(seed=3)
    timeout = s.core.election_timeout
    out = s.tick(timeout - 1)
    assert s.core.role is Role.FOLLOWER and not out
    out = s.tick()
    assert s.core.role is Role.PRE_CANDIDATE
    assert {(m.dst, m.term, m.pre_vote) for m in out} == {("b", 1, True), ("c", 1, True)}


def test_pre_vote_keeps_an_isolated_node_term_unchanged():
    s = Solo(hard=HardState(7))
    out = s.tick(FAST.election_timeout_max * 10)      # campaigns again and again, nobody answers
    requests = [m for m in out if isinstance(m, VoteRequest)]
    assert len(requests) >= 10 and all(m.pre_vote and m.term == 8 for m in requests)
    assert s.core.term == s.hard.term == 7


def test_pre_vote_quorum_then_real_election_and_noop():
    s = Solo(log=log_with_terms([1, 1]), hard=HardState(1))
    out = s.make_leader()
    assert s.core.role is Role.LEADER and s.core.term == 2 and s.hard == HardState(2, "a")
    noop = s.log.entry(2)
    assert (noop.magic, noop.term, noop.body) == (MAGIC_NOOP, 2, b"")
    (noop_write,) = [r.leader_append for r in s.readies if r.leader_append is not None]
    assert (noop_write.first_index, noop_write.magic, noop_write.term) == (2, MAGIC_NOOP, 2)
    # every follower gets a COMPARE of the leader's last entry before the NOOP
    compares = [m for m in out if isinstance(m, PushRequest)]
    assert {(m.dst, m.type, m.prev_index, m.prev_term) for m in compares} == {
        ("b", PushType.COMPARE, 1, 1), ("c", PushType.COMPARE, 1, 1)}


def test_pre_vote_rejected_by_a_quorum_returns_to_follower():
    s = Solo(hard=HardState(3))
    out = s.tick_until(lambda: s.core.role is Role.PRE_CANDIDATE)
    for req in (m for m in out if isinstance(m, VoteRequest)):
        s.step(VoteResponse(req.dst, "a", 3, VoteResult.REJECT_ALREADY_HAS_LEADER, pre_vote=True))
    assert s.core.role is Role.FOLLOWER and s.core.term == 3


def test_rejoining_node_does_not_bump_the_term_of_a_working_cluster():
    """A node back from a partition campaigns with a pre-vote; followers
    that hear their leader refuse it and nobody's term moves."""
    s = Solo(hard=HardState(4))
    follow_leader(s)
    resp = votes_in(s.step(VoteRequest("c", "a", 9, 100, 4, pre_vote=True)))[0]
    assert resp.result is VoteResult.REJECT_ALREADY_HAS_LEADER and s.core.term == 4
    # even a real vote with a higher term is refused while the lease holds
    resp = votes_in(s.step(VoteRequest("c", "a", 9, 100, 4)))[0]
    assert resp.result is VoteResult.REJECT_ALREADY_HAS_LEADER and s.core.term == 4
    # a leadership-transfer election bypasses the lease
    resp = votes_in(s.step(VoteRequest("c", "a", 9, 100, 4, transfer=True)))[0]
    assert resp.granted and s.core.term == 9


def test_check_quorum_leader_steps_down_without_bumping_its_term():
    s = Solo()
    s.make_leader()
    term = s.core.term
    # only "b" answers: with "a" that is a quorum of 3, leadership holds
    for _ in range(3 * FAST.election_timeout_min):
        s.tick()
        s.step(HeartbeatResponse("b", "a", term, ResponseCode.SUCCESS))
    assert s.core.role is Role.LEADER
    # nobody answers: within two check windows (one election timeout each)
    # the leader steps down
    s.tick()
    assert s.core.role is Role.LEADER
    s.tick(2 * FAST.election_timeout_min - 1)
    assert s.core.role is Role.FOLLOWER and s.core.leader_id is None
    assert s.core.term == s.hard.term == term
    with pytest.raises(NotLeaderError):
        s.core.propose([b"x"])


def test_candidate_and_leader_yield_to_higher_terms_and_current_leaders():
    s = Solo(hard=HardState(2))
    s.tick_until(lambda: s.core.role is Role.PRE_CANDIDATE)
    s.step(HeartbeatRequest("b", "a", 2, -1))            # this term's leader exists
    assert (s.core.role, s.core.leader_id, s.core.term) == (Role.FOLLOWER, "b", 2)
    s = Solo()
    s.make_leader()
    out = s.step(PushResponse("b", "a", 9, PushType.COMPARE, 1, ResponseCode.EXPIRED_TERM))
    assert (s.core.role, s.core.term, s.hard.term) == (Role.FOLLOWER, 9, 9)
    assert s.readies[-1].soft_state.role is Role.FOLLOWER and not out


def test_stale_leader_is_told_the_newer_term():
    s = Solo(hard=HardState(5))
    out = s.step(PushRequest("b", "a", 3, PushType.APPEND, 1, 0, -1, -1))
    assert [(type(m), m.code, m.term) for m in out] == [(PushResponse, ResponseCode.EXPIRED_TERM, 5)]
    out = s.step(HeartbeatRequest("b", "a", 4, -1))
    assert [(type(m), m.code, m.term) for m in out] == [(HeartbeatResponse, ResponseCode.EXPIRED_TERM, 5)]


def test_single_node_group_elects_itself_and_commits_alone():
    s = Solo(voters=("a",))
    s.tick_until(lambda: s.core.role is Role.LEADER)
    first = s.core.propose([b"p", b"q"])
    s.drain()
    assert s.core.commit_index == first + 1 == s.log.committed_index


def test_contract_is_enforced():
    core = RaftCore("a", ("a", "b", "c"), MemLog(), rng=random.Random(1), config=FAST)
    core.step(VoteRequest("b", "a", 3, -1, -1))
    with pytest.raises(RaftContractError, match="writes wait"):
        core.tick()                       # the vote must be persisted first
    rd = core.ready()
    with pytest.raises(RaftContractError, match="outstanding"):
        core.step(HeartbeatRequest("b", "a", 3, -1))
    with pytest.raises(RaftContractError):
        core.ready()
    with pytest.raises(RaftContractError):
        core.advance(attrs.evolve(rd))
    core.advance(rd)
    assert not core.has_ready()
    core.tick()
    with pytest.raises(RaftContractError, match="for c"):
        core.step(HeartbeatRequest("b", "c", 3, -1))
    with pytest.raises(ValueError):
        RaftCore("x", ("a", "b"), MemLog(), rng=random.Random(1))


def test_messages_only_may_accumulate_between_drains():
    s = Solo()
    s.make_leader()
    core = s.core
    for _ in range(FAST.heartbeat_ticks * 2):
        core.tick()                       # heartbeats only: no writes, allowed
    rd = core.ready()
    assert sum(isinstance(m, HeartbeatRequest) for m in rd.messages) == 4
    core.advance(rd)


def test_status_for_the_admin_port():
    s = Solo(log=log_with_terms([1]), hard=HardState(1))
    s.make_leader()
    s.tick(3)
    st = s.core.status()
    assert (st.role, st.term, st.leader_id, st.end_index, st.tick) == (Role.LEADER, 2, "a", 1, 3)
    assert {p.peer_id: p.state for p in st.peers} == {"b": "probe", "c": "probe"}
    assert st.uncommitted == 2 and st.transferring_to is None
    s.step(PushResponse("b", "a", 2, PushType.COMPARE, 1, ResponseCode.SUCCESS, 0, 0, 0))
    st = s.core.status()
    peer_b = next(p for p in st.peers if p.peer_id == "b")
    assert (peer_b.state, peer_b.match_index, peer_b.next_index, peer_b.last_ack_tick) == ("replicate", 0, 2, 3)
    assert peer_b.inflight_pushes == 1     # the NOOP is on its way
    s.step(PushResponse("b", "a", 2, PushType.APPEND, 2, ResponseCode.SUCCESS, 1, 0, 1))
    st = s.core.status()
    assert st.commit_index == 1 and st.uncommitted == 0
