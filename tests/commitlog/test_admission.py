# What a peer message must be before the shell steps it into the Raft core
# (commitlog/admission.py): each kind of refusal on its own; and, fuzzed with
# hypothesis, that whatever admission lets through -- sent as wire bytes to
# a follower, a candidate or a leader with a real log -- the core takes
# without raising anything but its own declared refusals.  (That it refuses
# nothing an honest group sends is checked by the many-seed simulation,
# tests/commitlog/raft/sim.py, on every delivered message.)
import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commitlog.admission import MAX_INDEX, MAX_TERM, MAX_TERM_LEAP, refusal
from commitlog.entry import HEADER_SIZE, EntryBatch
from commitlog.errors import AppendRejectedError, RaftSafetyError, WireError
from commitlog.raft import wire
from commitlog.raft.membership import Membership
from commitlog.raft.memlog import MemLog
from commitlog.raft.messages import (
    UNKNOWN_TERM,
    HeartbeatRequest,
    HeartbeatResponse,
    PushRequest,
    PushResponse,
    PushType,
    ResponseCode,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from commitlog.raft.state import HardState, Role
from tests.commitlog.raft.helpers import Solo

LEADER_TERMS = (1, 1, 2, 2, 3, 3, 3, 4)   # the log a (real or forged) leader "b" ships from
TERM = 5                                  # the receiver's term


def leader_log() -> MemLog:
    log = MemLog()
    for i, t in enumerate(LEADER_TERMS):
        log.append_leader([b"entry-%d" % i], t, 1)
    return log


def batch(first: int, count: int = 2) -> EntryBatch:
    return leader_log().read_batch(first, 1 << 20, count)


def admit(msg, sender="b", term=TERM, leader_end=None):
    return refusal(msg, sender, "a", term, leader_end)


# --- one refusal at a time -------------------------------------------------------------

GOOD = [
    HeartbeatRequest("b", "a", TERM, 3),
    HeartbeatResponse("b", "a", TERM, ResponseCode.SUCCESS),
    VoteRequest("b", "a", TERM + 1, 7, 4, pre_vote=True),
    VoteResponse("b", "a", TERM, VoteResult.ACCEPT),
    TimeoutNow("b", "a", TERM),
    PushRequest("b", "a", TERM, PushType.APPEND, 9, 3, 2, 2, 0, batch(3)),
    PushRequest("b", "a", TERM, PushType.APPEND, 9, 3, 2, UNKNOWN_TERM, 0, batch(3)),
    PushRequest("b", "a", TERM, PushType.COMPARE, 1, -1, 4, 3),
    PushRequest("b", "a", TERM, PushType.COMMIT, 2, 5, -1, -1),
    PushRequest("b", "a", TERM, PushType.TRUNCATE, 3, 5, 4, 3),
    PushRequest("b", "a", TERM, PushType.TRUNCATE, 3, 5, 4, 3, 7, batch(5), 2, 1,
                Membership(("a", "b", "c")).encode()),
    PushResponse("b", "a", TERM, PushType.APPEND, 4, ResponseCode.SUCCESS, 7, 0, 7),
    HeartbeatRequest("b", "a", TERM + MAX_TERM_LEAP, 3),   # a long partition may leave a node far behind
]


@pytest.mark.parametrize("msg", GOOD, ids=lambda m: type(m).__name__)
def test_honest_messages_are_admitted(msg):
    assert admit(msg, leader_end=10) is None


def cfg_body(doc: bytes) -> bytes:
    return b"LMQCONF1" + doc


@pytest.mark.parametrize("msg, reason", [
    (HeartbeatRequest("b", "f2", TERM, 3), "addressed to 'f2'"),
    (HeartbeatRequest("c", "a", TERM, 3), "claims to be from 'c' on 'b''s connection"),
    (HeartbeatRequest("b", "a", 4_600_000_000_000_000_000, 3), "more than 2^32 above this node's term 5"),
    (HeartbeatRequest("b", "a", MAX_TERM, 3), "outside 0..2^62"),
    (HeartbeatRequest("b", "a", -1, 3), "outside 0..2^62"),
    (VoteRequest("b", "a", TERM + MAX_TERM_LEAP + 1, 7, 4), "more than 2^32 above"),
    (HeartbeatRequest("b", "a", TERM, MAX_INDEX), "commit index"),
    (HeartbeatRequest("b", "a", TERM, -2), "commit index -2"),
    (VoteRequest("b", "a", 0, -1, -1), "term 0"),
    (VoteRequest("b", "a", TERM, MAX_INDEX, 4), "last index"),
    (VoteRequest("b", "a", TERM, 7, TERM + 1), "last term"),
    (PushRequest("b", "a", TERM, PushType.APPEND, 9, 3, 2, 2), "APPEND without entries"),
    (PushRequest("b", "a", TERM, PushType.COMPARE, 9, 3, 2, 2, 0, batch(3)), "COMPARE carrying entries"),
    (PushRequest("b", "a", TERM, PushType.COMMIT, 9, 3, 2, 2, 0, batch(3)), "COMMIT carrying entries"),
    (PushRequest("b", "a", TERM, PushType.TRUNCATE, 3, 5, 4, 3, 0, None, 2, 1, b"LMQCONF1{}"),
     "TRUNCATE carrying a configuration"),
    (PushRequest("b", "a", TERM, PushType.APPEND, 9, 3, 4, 2, 0, batch(3)), "do not follow prev index 4"),
    (PushRequest("b", "a", TERM, PushType.APPEND, MAX_INDEX, 3, 2, 2, 0, batch(3)), "seq"),
    (PushRequest("b", "a", TERM, PushType.APPEND, 9, -5, 2, 2, 0, batch(3)), "commit index -5"),
    (PushRequest("b", "a", TERM, PushType.APPEND, 9, 3, 2, TERM + 1, 0, batch(3)), "prev term"),
    (PushRequest("b", "a", TERM, PushType.APPEND, 9, 3, 2, 4, 0, batch(3)), "below prev term 4"),
    (PushRequest("b", "a", 2, PushType.APPEND, 9, 3, 2, 2, 0, batch(3)), "entry terms 2..3 outside 0..2"),
    (PushRequest("b", "a", TERM, PushType.APPEND, 9, 3, MAX_INDEX - 2, 2, 0,
                 EntryBatch(MAX_INDEX - 1, 2, ((MAX_INDEX - 1, 3),), b"x" * 2 * HEADER_SIZE)), "outside 0..2^62"),
    (PushRequest("b", "a", TERM, PushType.APPEND, 9, 3, 2, 2, 0, EntryBatch(3, 1000, ((3, 3),), b"x" * 500)),
     "1000 entries in 500 bytes"),
    (PushRequest("b", "a", TERM, PushType.TRUNCATE, 3, 5, 4, 3, 7, batch(5), 5, 1,
                 Membership(("a", "b")).encode()), "configuration at 5, after the reset point 4"),
    (PushRequest("b", "a", TERM, PushType.TRUNCATE, 3, 5, 4, 3, 7, batch(5), 2, TERM + 1,
                 Membership(("a", "b")).encode()), "configuration term"),
    (PushRequest("b", "a", TERM, PushType.TRUNCATE, 3, 5, 4, 3, 7, batch(5), 2, 1, cfg_body(b"[" * 100_000)),
     "the reset's configuration: malformed"),
    (PushRequest("b", "a", TERM, PushType.TRUNCATE, 3, 5, 4, 3, 7, batch(5), 2, 1,
                 cfg_body(b'{"voters": [1, 2]}')), "malformed"),
    (PushResponse("b", "a", TERM, PushType.APPEND, 4, ResponseCode.SUCCESS, 11, 0, 11), "beyond this node's log end 10"),
    (PushResponse("b", "a", TERM, PushType.APPEND, 4, ResponseCode.SUCCESS, 7, -7, 7), "begin index -7"),
    (PushResponse("b", "a", TERM, PushType.APPEND, 4, ResponseCode.INCONSISTENT_STATE, -1, 0, 7, TERM + 3, 2),
     "conflict term"),
], ids=lambda v: v if isinstance(v, str) else type(v).__name__)
def test_refusals(msg, reason):
    got = admit(msg, leader_end=10)
    assert got is not None and reason in got, got


def test_a_lone_configuration_entry_must_decode():
    log = MemLog()
    log.append_leader([cfg_body(b'{"voters": "abc"}')], 1, 3)   # magic 3: CONFIG_CHANGE
    bad = log.read_batch(0, 1 << 20, 1)
    msg = PushRequest("b", "a", TERM, PushType.APPEND, 1, -1, -1, -1, 0, bad)
    assert "configuration entry 0: malformed" in admit(msg)
    log = MemLog()
    log.append_leader([Membership(("a", "b", "c")).encode()], 1, 3)
    assert admit(attrs.evolve(msg, batch=log.read_batch(0, 1 << 20, 1))) is None


def test_match_beyond_the_log_is_refused_only_by_a_leader_in_that_term():
    ack = PushResponse("b", "a", TERM, PushType.APPEND, 4, ResponseCode.SUCCESS, 50, 0, 50)
    assert admit(ack, leader_end=10) is not None
    assert admit(ack, leader_end=None) is None                  # not leading: the core ignores it
    assert admit(attrs.evolve(ack, term=TERM - 1), leader_end=10) is None   # a stale answer: the core drops it


# --- fuzzed: what is admitted, the core takes ---------------------------------------------

def follower(committed: int) -> Solo:
    log = leader_log()
    for _ in range(3):
        log.truncate_from(log.end_index)                    # a prefix of the leader's log
    return Solo("a", log=log, hard=HardState(TERM, None), committed=committed)


def candidate() -> Solo:
    s = follower(1)
    s.core.campaign()
    s.drain()
    return s


def leader() -> Solo:
    s = Solo("a", log=leader_log(), hard=HardState(TERM - 1, None), committed=2)
    s.make_leader()
    return s


STATES = {"follower": lambda: follower(2), "candidate": candidate, "leader": leader}

# Mostly what the receiver could believe, some of it what nobody honest sends.
terms = st.one_of(st.sampled_from([TERM, TERM + 1]), st.integers(-1, TERM + 3),
                  st.sampled_from([TERM + MAX_TERM_LEAP, MAX_TERM - 1, MAX_TERM, (1 << 63) - 1]))
indexes = st.one_of(st.integers(-1, 9), st.sampled_from([-(1 << 63), -2, 40, MAX_INDEX - 1, MAX_INDEX,
                                                         (1 << 63) - 1]))
ids = st.sampled_from(["b", "c", "a", "f2", ""])
src = st.sampled_from(["b"] * 6 + ["c", "a", "f2"])   # mostly the connection's own peer
dst = st.sampled_from(["a"] * 6 + ["b", "f2", ""])   # mostly this node


@st.composite
def batches(draw):
    first = draw(st.integers(0, len(LEADER_TERMS) - 1))
    count = draw(st.integers(1, len(LEADER_TERMS) - first))
    b = batch(first, count)
    how = draw(st.sampled_from(["real", "shifted", "garbage", "short", "runs"]))
    if how == "shifted":     # the same bytes claimed for other indexes
        delta = draw(st.sampled_from([-3, -1, 1, 2, 50]))
        b = EntryBatch(max(0, first + delta), count, tuple((max(0, i + delta), t) for i, t in b.term_runs), b.raw)
    elif how == "garbage":
        b = EntryBatch(first, count, b.term_runs, draw(st.binary(min_size=count * HEADER_SIZE,
                                                                 max_size=count * HEADER_SIZE + 64)))
    elif how == "short":
        b = EntryBatch(first, count, b.term_runs, b.raw[:draw(st.integers(0, len(b.raw)))])
    elif how == "runs":
        b = EntryBatch(first, count, ((first, draw(st.integers(0, 9))),), b.raw)
    return b


configs = st.sampled_from([b"", Membership(("a", "b", "c")).encode(), Membership(("b", "c")).encode(),
                           cfg_body(b"{}"), cfg_body(b'{"voters": ["a", "a"]}'), b"junk"])

messages = st.one_of(
    st.builds(VoteRequest, src, dst, terms, indexes, terms, st.booleans(), st.booleans()),
    st.builds(VoteResponse, src, dst, terms, st.sampled_from(VoteResult), st.booleans()),
    st.builds(HeartbeatRequest, src, dst, terms, indexes),
    st.builds(HeartbeatResponse, src, dst, terms, st.sampled_from(ResponseCode)),
    st.builds(PushRequest, src, dst, terms, st.sampled_from(PushType), indexes, indexes, indexes, terms,
              st.integers(0, 0xFFFFFFFF), st.none() | batches(), indexes, terms, configs),
    st.builds(PushResponse, src, dst, terms, st.sampled_from(PushType), indexes, st.sampled_from(ResponseCode),
              indexes, indexes, indexes, terms, indexes),
    st.builds(TimeoutNow, src, dst, terms),
)


@pytest.mark.parametrize("state", sorted(STATES))
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=st.lists(messages, min_size=1, max_size=4))
def test_what_admission_lets_through_the_core_takes(state, msgs):
    """Stepped in, drained, and the node's answers -- and those of the
    elections that follow -- still encode (no term or index past what
    the wire and DLedger's Java long carry)."""
    node = STATES[state]()
    for msg in msgs:
        try:
            msg = wire.decode(wire.encode(msg))     # what a peer can put on the wire at all
        except WireError:
            continue
        core = node.core
        if refusal(msg, "b", "a", core.term, core.log.end_index if core.role is Role.LEADER else None):
            continue
        try:
            node.core.step(msg)
        except RaftSafetyError:
            return      # the core's own refusal (a forged leader cutting committed entries): the shell drops it
        try:
            out = node.drain()
        except AppendRejectedError:
            return      # the store's refusal of entries it cannot place: the shell fences that leader
        for answer in out:
            wire.encode(answer)
    for answer in node.tick(3 * node.core.config.election_timeout_max):
        wire.encode(answer)
