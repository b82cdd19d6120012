# Owns what a message from a peer must be before the Raft shell steps it
# into the core (inbox.py calls refusal() on every decoded message).  The
# core trusts its inputs -- a message for another node is a contract error
# there, a push that would drop committed entries a safety error -- so
# everything a peer's bytes decide is checked here first, against the peer
# the transport handshook with and this node's own state:
#
#   * who: `src` is the connection's peer id, `dst` is this node;
#   * terms: 0 <= term < MAX_TERM, and at most MAX_TERM_LEAP above this
#     node's term (a stranger must not push the group's term to where
#     counting on overflows DLedger's Java long); every term a message
#     names (last, prev, conflict, configuration, the batch's runs) lies
#     in [-1, term] -- an honest sender never knows a later term than its
#     own;
#   * indexes, sequence numbers and counts: in [-1, MAX_INDEX), a batch's
#     last index too;
#   * shape: an APPEND carries entries, a COMPARE or COMMIT none, a
#     configuration travels only with a reset TRUNCATE; a batch continues
#     right after prev_index, holds at least a header's bytes per entry,
#     and its terms do not go below prev_term; a configuration (a reset's,
#     or a CONFIG_CHANGE entry travelling alone) decodes;
#   * a leader's own log: an acknowledgement to this node, leading in the
#     message's term, matches no more than its log holds.
#
# A refused message is dropped by the shell (counted, logged at a bounded
# rate); nothing about it reaches the core.  Pure: no I/O, no clock.
from commitlog.entry import BODY_OFFSET, HEADER_SIZE
from commitlog.raft.membership import Membership, is_config_entry
from commitlog.raft.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    Message,
    PushRequest,
    PushResponse,
    PushType,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)

MAX_TERM = 1 << 62
MAX_INDEX = 1 << 62
MAX_TERM_LEAP = 1 << 32


def refusal(msg: Message, sender: str, self_id: str, term: int, leader_end: int | None = None) -> str | None:
    """None when `msg`, read on `sender`'s connection, may be stepped into
    the core of `self_id` (now in `term`; `leader_end` is its log end
    when it leads, else None); else why not."""
    if msg.src != sender:
        return f"claims to be from {msg.src!r} on {sender!r}'s connection"
    if msg.dst != self_id:
        return f"addressed to {msg.dst!r}"
    t = msg.term
    if not 0 <= t < MAX_TERM:
        return f"term {t} outside 0..2^62"
    if t - term > MAX_TERM_LEAP:
        return f"term {t} more than 2^32 above this node's term {term}"
    check = _CHECKS.get(type(msg))
    return check(msg, term, leader_end) if check is not None else f"not a raft message: {type(msg).__name__}"


def _index(value: int, what: str) -> str | None:
    if not -1 <= value < MAX_INDEX:
        return f"{what} {value} outside -1..2^62"
    return None


def _term_of(value: int, term: int, what: str) -> str | None:
    if not -1 <= value <= term:
        return f"{what} {value} outside -1..{term} (the message's term)"
    return None


def _first(*reasons: str | None) -> str | None:
    return next((r for r in reasons if r is not None), None)


def _vote_request(m: VoteRequest, term: int, end: int | None) -> str | None:
    if m.term < 1:
        return "vote request for term 0"
    return _first(_index(m.last_index, "last index"), _term_of(m.last_term, m.term, "last term"))


def _heartbeat(m: HeartbeatRequest, term: int, end: int | None) -> str | None:
    return _index(m.commit_index, "commit index")


def _nothing(m, term: int, end: int | None) -> str | None:
    return None


def _push_response(m: PushResponse, term: int, end: int | None) -> str | None:
    reason = _first(_index(m.seq, "seq"), _index(m.match_index, "match index"),
                    _index(m.begin_index, "begin index"), _index(m.end_index, "end index"),
                    _index(m.conflict_index, "conflict index"),
                    _term_of(m.conflict_term, m.term, "conflict term"))
    if reason is None and end is not None and m.term == term and m.match_index > end:
        # This term's leader's log only grows: no follower can hold more of it.
        reason = f"acknowledges index {m.match_index}, beyond this node's log end {end}"
    return reason


def _push(m: PushRequest, term: int, end: int | None) -> str | None:
    reason = _first(_index(m.seq, "seq"), _index(m.commit_index, "commit index"),
                    _index(m.prev_index, "prev index"), _term_of(m.prev_term, m.term, "prev term"))
    if reason is not None:
        return reason
    b = m.batch
    if m.type is PushType.APPEND and b is None:
        return "APPEND without entries"
    if m.type in (PushType.COMPARE, PushType.COMMIT) and b is not None:
        return f"{m.type.name} carrying entries"
    if m.config and (m.type is not PushType.TRUNCATE or b is None):
        return f"{m.type.name} carrying a configuration"
    if b is not None:
        reason = _batch(m, b)
        if reason is not None:
            return reason
    if m.config:
        reason = _first(_index(m.config_index, "configuration index"),
                        _term_of(m.config_term, m.term, "configuration term"))
        if reason is None and m.config_index > m.prev_index:
            reason = f"configuration at {m.config_index}, after the reset point {m.prev_index}"
        return reason or _membership(m.config, "the reset's configuration")
    return None


def _batch(m: PushRequest, b) -> str | None:
    if b.first_index != m.prev_index + 1:
        return f"entries from {b.first_index} do not follow prev index {m.prev_index}"
    if not 0 <= b.first_index or b.last_index >= MAX_INDEX:
        return f"entries {b.first_index}..{b.last_index} outside 0..2^62"
    if b.count * HEADER_SIZE > len(b.raw):
        return f"{b.count} entries in {len(b.raw)} bytes"
    low, high = b.term_runs[0][1], b.term_runs[-1][1]
    if not 0 <= low or high > m.term:
        return f"entry terms {low}..{high} outside 0..{m.term} (the message's term)"
    if m.prev_term > low:
        return f"entry term {low} below prev term {m.prev_term}"
    if b.count == 1 and is_config_entry(b.raw):
        return _membership(memoryview(b.raw)[BODY_OFFSET:], f"configuration entry {b.first_index}")
    return None


def _membership(body, what: str) -> str | None:
    try:
        Membership.decode(body)
    except ValueError as e:
        return f"{what}: {e}"
    return None


_CHECKS = {
    VoteRequest: _vote_request, VoteResponse: _nothing, HeartbeatRequest: _heartbeat,
    HeartbeatResponse: _nothing, PushRequest: _push, PushResponse: _push_response, TimeoutNow: _nothing,
}
