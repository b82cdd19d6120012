# The membership values (commitlog/raft/membership.py): single-server
# changes and what each refuses, the CONFIG_CHANGE entry body (never taken
# for a RocketMQ message), and MembershipLog's truncation, reset, lookup,
# compaction and "whom to replicate to" rules.
import pytest

from commitlog.entry import make_entry
from commitlog.raft.membership import (
    BODY_PREFIX,
    ChangeKind,
    ConfChange,
    ConfigEntry,
    Membership,
    MembershipChangeError,
    MembershipLog,
    is_config_entry,
)

BASE = Membership(("n0", "n1", "n2"), (), {"n0": "h:1", "n1": "h:2", "n2": "h:3"})


def test_single_server_changes():
    m = BASE.apply(ConfChange(ChangeKind.ADD_LEARNER, "n3", "h:4"))
    assert (m.voters, m.learners, m.address_map["n3"]) == (("n0", "n1", "n2"), ("n3",), "h:4")
    m = m.apply(ConfChange(ChangeKind.PROMOTE, "n3"))
    assert (m.voters, m.learners) == (("n0", "n1", "n2", "n3"), ())
    m = m.apply(ConfChange(ChangeKind.REMOVE, "n0"))
    assert (m.voters, "n0" in m.address_map) == (("n1", "n2", "n3"), False)


@pytest.mark.parametrize("change, why", [
    (ConfChange(ChangeKind.ADD_LEARNER, "n1", "h:9"), "already a voter"),
    (ConfChange(ChangeKind.ADD_LEARNER, "n3", None), "needs its peer address"),
    (ConfChange(ChangeKind.ADD_LEARNER, "n3", "h:2"), "belongs to n1"),
    (ConfChange(ChangeKind.PROMOTE, "n1"), "a voter already"),
    (ConfChange(ChangeKind.PROMOTE, "n7"), "not a member"),
    (ConfChange(ChangeKind.REMOVE, "n7"), "not a member"),
])
def test_invalid_changes(change, why):
    with pytest.raises(MembershipChangeError, match=why) as e:
        BASE.apply(change)
    assert e.value.code == "INVALID" and not e.value.retryable


def test_the_last_voter_stays():
    with pytest.raises(MembershipChangeError, match="last voter"):
        Membership(("n0",)).apply(ConfChange(ChangeKind.REMOVE, "n0"))


def test_entry_body_round_trips_and_is_no_rocketmq_message():
    m = BASE.apply(ConfChange(ChangeKind.ADD_LEARNER, "n3", "h:4"))
    body = m.encode()
    assert body.startswith(BODY_PREFIX) and Membership.decode(body) == m
    assert body[4:8] not in (bytes.fromhex("DAA320A7"), bytes.fromhex("DAA320AB"))   # message magic at +4
    assert is_config_entry(make_entry(body, index=0, term=1, pos=0, prev_chain_crc=0, magic=3).encode())
    assert not is_config_entry(make_entry(body, index=0, term=1, pos=0, prev_chain_crc=0, magic=1).encode())
    with pytest.raises(ValueError):
        Membership.decode(b"LMQCONF1{")


def test_membership_log_truncation_reset_lookup_and_compaction():
    add = BASE.apply(ConfChange(ChangeKind.ADD_LEARNER, "n3", "h:4"))
    promo = add.apply(ConfChange(ChangeKind.PROMOTE, "n3"))
    log = MembershipLog([ConfigEntry(-1, 0, BASE)])
    log.append(10, 1, add)
    log.append(20, 2, promo)
    assert log.latest == promo and log.at(15).membership == add and log.at(5).membership == BASE
    assert log.next_index_from(11) == 20 and log.next_index_from(21) is None
    assert log.truncate(20) and log.latest == add                # back to the previous one
    assert not log.truncate(30)
    log.put(20, 3, promo)
    log.put(20, 3, promo)                                        # a retransmit replaces
    assert [e.index for e in log.entries] == [-1, 10, 20]
    with pytest.raises(ValueError):
        log.append(20, 3, promo)
    assert log.compact(15) and [e.index for e in log.entries] == [10, 20]    # the last one below the floor stays
    log.reset(ConfigEntry(40, 3, promo))
    assert log.snapshot() == (ConfigEntry(40, 3, promo),)


def test_a_removed_member_is_replicated_to_until_its_removal_commits():
    removed = BASE.apply(ConfChange(ChangeKind.REMOVE, "n2"))
    log = MembershipLog([ConfigEntry(-1, 0, BASE), ConfigEntry(10, 1, removed)])
    assert log.members_since(9) == {"n0", "n1", "n2"}
    assert log.members_since(10) == {"n0", "n1"}
