# Deterministic cluster scenarios (tests/commitlog/raft/sim.py: in-memory network,
# logical clock, invariants checked on every step): dueling candidates,
# partitions of the leader, minority/majority splits, loss/duplication/
# reordering, restarts from disk, DLedger's own test scenarios, leadership
# transfer, preferred leader and the retention reset.
import attrs
import pytest

from commitlog.errors import (
    LeadershipTransferError,
    LeaderTransferringError,
    NotLeaderError,
    PendingFullError,
    QuorumTimeoutError,
)
from commitlog.raft.messages import PushRequest, TimeoutNow
from commitlog.raft.state import Role
from tests.commitlog.raft.sim import SIM_CONFIG, Cluster

IDS3 = ("n0", "n1", "n2")
IDS5 = ("n0", "n1", "n2", "n3", "n4")


def elect(c: Cluster, limit=600):
    c.run_until(lambda: c.leader() is not None, limit, "a leader")
    return c.leader()


def load(c: Cluster, ticks: int, per_tick: int = 1):
    for _ in range(ticks):
        c.propose(per_tick)
        c.step_all()


def settle(c: Cluster, limit=3000):
    c.run_until(c.quiescent, limit, "quiescence")
    c.check_final()


def terms(c: Cluster):
    return {n.node_id: n.core.term for n in c.nodes.values() if n.core is not None}


# --- elections --------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_dueling_candidates_split_the_vote_then_one_wins(seed):
    c = Cluster(IDS3, seed)
    for n in c.nodes.values():          # everybody campaigns in the same tick
        n.core.campaign()
        c.drain(n)
    c.run(3)
    assert c.leader() is None                       # three self-votes: nobody has a majority
    assert all(t == 1 for t in terms(c).values())
    lead = elect(c)
    assert lead.core.term >= 2
    load(c, 50)
    settle(c)


def test_partitioned_leader_is_replaced_and_its_uncommitted_appends_vanish():
    c = Cluster(IDS3, 11)
    old = elect(c)
    load(c, 30)
    old_term = old.core.term
    c.net.isolate(old.node_id, IDS3)
    stranded = []
    for _ in range(10):                  # the client still talks to the old leader
        first = old.core.propose([b"stranded"])
        stranded.append(first)
        c.drain(old)
        c.step_all()
    c.run_until(lambda: c.leader() is not old and c.leader() is not None, 500, "a new leader")
    new = c.leader()
    assert new.core.term == old_term + 1
    load(c, 30)
    # check-quorum: the old leader stepped down, keeping its term
    c.run_until(lambda: old.core.role is not Role.LEADER, 200, "old leader steps down")
    assert old.core.term == old_term and old.hard.term == old_term
    with pytest.raises(NotLeaderError):
        old.core.propose([b"late"])
    c.net.heal()
    settle(c)
    assert all(old.log.body_at(i) != b"stranded" for i in range(old.log.begin_index, old.log.end_index + 1))
    assert not any(i in c.acked and c.acked[i] == b"stranded" for i in stranded)


def test_minority_side_of_a_split_cannot_commit_majority_side_can():
    c = Cluster(IDS5, 5)
    lead = elect(c)
    load(c, 20)
    others = [i for i in IDS5 if i != lead.node_id]
    minority = {lead.node_id, others[0]}
    majority = set(others[1:])
    c.net.partition(minority, majority)
    frozen = lead.core.commit_index
    for _ in range(20):
        if lead.core.role is Role.LEADER:
            lead.core.propose([b"minority"])
            c.drain(lead)
        c.step_all()
    assert lead.core.commit_index == frozen        # 2 of 5 is no quorum
    c.run_until(lambda: c.leader() is not None and c.leader().node_id in majority, 600, "majority leader")
    load(c, 40)
    assert c.leader().core.commit_index > frozen
    assert c.nodes[others[0]].core.term < c.leader().core.term  # the minority never inflated terms
    c.net.heal()
    settle(c)


def test_rejoining_node_does_not_bump_the_term_of_the_cluster():
    c = Cluster(IDS3, 3)
    lead = elect(c)
    follower, other = [i for i in IDS3 if i != lead.node_id]
    # cut only the link to the leader: the node's pre-votes reach the other
    # follower, which still hears the leader and refuses them (lease)
    c.net.blocked.update({(follower, lead.node_id), (lead.node_id, follower)})
    refused = []
    c.on_ready = lambda n, rd: refused.extend(m for m in rd.messages if n.node_id == other
                                              and type(m).__name__ == "VoteResponse" and not m.granted)
    load(c, 400)                     # the cut-off node campaigns again and again
    term = lead.core.term
    assert len(refused) >= 5
    assert c.nodes[follower].core.term == term
    c.net.heal()
    settle(c)
    assert c.leader() is lead and set(terms(c).values()) == {term}


# --- faults -------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_loss_duplication_and_reordering_under_load(seed):
    c = Cluster(IDS3, 100 + seed)
    c.net.drop_rate, c.net.dup_rate, c.net.max_delay = 0.2, 0.2, 8
    load(c, 600, per_tick=2)
    assert len(c.acked) > 100
    c.net.drop_rate = c.net.dup_rate = 0
    settle(c)


@pytest.mark.parametrize("seed", range(4))
def test_restarts_from_disk_lose_nothing_acknowledged(seed):
    c = Cluster(IDS3, 200 + seed)
    c.crash_mid_ready = 0.002           # writes kept, messages of that Ready lost
    c.net.max_delay = 3
    for t in range(800):
        c.propose(2)
        if t % 97 == 0:
            c.restart(IDS3[t % 3])
        for n in c.nodes.values():
            if n.core is None:
                c.start(n.node_id)
        c.step_all()
    c.crash_mid_ready = 0
    assert sum(n.restarts for n in c.nodes.values()) > 10
    settle(c)


# --- DLedger's scenarios ------------------------------------------------------

def test_push_to_a_follower_that_joins_late():
    c = Cluster(IDS3, 21)
    c.crash("n2")
    elect(c)
    load(c, 150, per_tick=3)
    assert c.nodes["n2"].log.end_index == -1
    c.start("n2")
    settle(c)
    assert c.nodes["n2"].log.end_index >= 450


def test_network_offline_quorum_ack_timeout_then_pending_full():
    """DLedger AppendAndPushTest: followers unreachable -> an append times
    out waiting for the quorum ack (maxWaitAckTimeMs); appends keep piling up
    in flight until the pending limit refuses them.  The shell enforces both
    limits; the core must keep accepting and expose what is in flight."""
    dledger_timing = attrs.evolve(SIM_CONFIG, heartbeat_ticks=200, election_timeout_min=600,
                                  election_timeout_max=1000)  # 10 ms ticks: 2 s / 6 s (3 leaked beats)
    c = Cluster(IDS3, 31, config=dledger_timing)
    lead = elect(c, 2000)
    load(c, 5)
    settle(c)
    wait_ack_ticks, max_pending = 250, 64      # 2500 ms, maxPendingRequestsNum scaled down
    errors = []
    c.net.isolate(lead.node_id, IDS3)

    def append(body):
        core = lead.core
        if core.status().uncommitted >= max_pending:
            raise PendingFullError(core.status().uncommitted, max_pending)
        index = core.propose([body])
        c.drain(lead)
        return index

    first = append(b"first")
    for _ in range(wait_ack_ticks):
        c.step_all()
    if lead.core.commit_index < first:
        errors.append(QuorumTimeoutError(first, wait_ack_ticks * 10))
    for k in range(max_pending * 2):
        try:
            append(b"more")
        except PendingFullError as e:
            errors.append(e)
            break
        c.step_all()
    assert [type(e) for e in errors] == [QuorumTimeoutError, PendingFullError]
    assert lead.core.role is Role.LEADER and lead.core.status().uncommitted == max_pending
    c.net.heal()
    settle(c)
    assert lead.log.committed_index >= first


def test_follower_drops_every_third_push_and_still_ends_identical():
    c = Cluster(IDS3, 41)
    lead = elect(c)
    victim = next(i for i in IDS3 if i != lead.node_id)
    counter = {"n": 0}

    def every_third(m):
        if isinstance(m, PushRequest) and m.dst == victim:
            counter["n"] += 1
            return counter["n"] % 3 == 0
        return False

    c.net.filters.append(every_third)
    load(c, 400, per_tick=2)
    settle(c)
    assert counter["n"] > 300


def test_divergent_uncommitted_tail_truncated_when_leadership_moves_to_the_shorter_log():
    c = Cluster(IDS3, 51)
    old = elect(c)
    load(c, 20)
    settle(c)
    c.net.isolate(old.node_id, IDS3)
    for _ in range(10):
        old.core.propose([b"divergent"])
        c.drain(old)
    longest = old.log.end_index
    c.run_until(lambda: c.leader() not in (None, old), 600, "leader on the shorter log")
    new = c.leader()
    assert new.log.end_index < longest            # the shorter log won
    truncated = []
    c.on_ready = lambda n, rd: n is old and rd.truncate_from is not None and truncated.append(rd.truncate_from)
    c.net.heal()
    settle(c)
    assert truncated == [longest - 9]             # exactly the divergent tail, once
    assert all(old.log.body_at(i) != b"divergent" for i in range(old.log.end_index + 1))


def test_restart_of_a_follower_keeps_leader_and_term():
    c = Cluster(IDS3, 61)
    lead = elect(c)
    load(c, 30)
    term = lead.core.term
    follower = next(i for i in IDS3 if i != lead.node_id)
    c.restart(follower)
    load(c, 5 * SIM_CONFIG.election_timeout_max)
    settle(c)
    assert c.leader() is lead and set(terms(c).values()) == {term}
    assert c.nodes[follower].core.leader_id == lead.node_id


def test_both_followers_down_leader_steps_down_without_bumping_its_term():
    c = Cluster(IDS3, 71)
    lead = elect(c)
    load(c, 10)
    term = lead.core.term
    for i in IDS3:
        if i != lead.node_id:
            c.crash(i)
    c.run_until(lambda: lead.core.role is not Role.LEADER, 3 * SIM_CONFIG.election_timeout_min, "step down")
    c.run(10 * SIM_CONFIG.election_timeout_max)             # alone, it keeps pre-voting
    assert lead.core.term == lead.hard.term == term
    for i in IDS3:
        if i != lead.node_id:
            c.start(i)
    settle(c)
    assert c.leader().core.term == term + 1


# --- leadership transfer and preferred leader ---------------------------------

def test_leadership_transfer_to_a_caught_up_peer():
    c = Cluster(IDS3, 81)
    lead = elect(c)
    load(c, 30)
    settle(c)
    target = next(i for i in IDS3 if i != lead.node_id)
    lead.core.transfer_leadership(target)
    c.drain(lead)
    with pytest.raises(LeaderTransferringError):
        lead.core.propose([b"during transfer"])
    c.run_until(lambda: c.leader() is c.nodes[target], 50, "transferee leads")
    assert c.leader().core.term == lead.core.term
    load(c, 20)
    settle(c)


def test_leadership_transfer_times_out_and_the_leader_resumes():
    c = Cluster(IDS3, 91)
    lead = elect(c)
    settle(c)
    target = next(i for i in IDS3 if i != lead.node_id)
    c.net.filters.append(lambda m: isinstance(m, TimeoutNow))
    lead.core.transfer_leadership(target)
    c.drain(lead)
    c.run(SIM_CONFIG.transfer_timeout_ticks - 1)
    with pytest.raises(LeaderTransferringError):
        lead.core.propose([b"x"])
    c.run(1)
    assert c.leader() is lead and lead.core.status().transferring_to is None
    load(c, 10)
    settle(c)


def test_leadership_transfer_refused_for_unknown_or_lagging_peers():
    c = Cluster(IDS3, 93, config=attrs.evolve(SIM_CONFIG, max_transfer_lag=50))
    c.crash("n2")
    lead = elect(c)
    load(c, 100)
    with pytest.raises(LeadershipTransferError, match="FALL_BEHIND"):
        lead.core.transfer_leadership("n2")
    with pytest.raises(LeadershipTransferError, match="UNKNOWN_MEMBER"):
        lead.core.transfer_leadership("zz")
    follower = c.nodes[next(i for i in IDS3 if i not in (lead.node_id, "n2"))]
    with pytest.raises(NotLeaderError):
        follower.core.transfer_leadership(lead.node_id)


def test_preferred_leader_takes_leadership_back_once_caught_up():
    config = attrs.evolve(SIM_CONFIG, preferred_leader="n0")
    c = Cluster(IDS3, 101, config=config)
    c.crash("n0")
    first = elect(c)
    assert first.node_id != "n0"
    load(c, 100, per_tick=2)
    c.start("n0")
    c.run_until(lambda: c.leader() is c.nodes["n0"], 400, "preferred leader back")
    load(c, 20)
    settle(c)
    assert c.leader() is c.nodes["n0"]


# --- retention ------------------------------------------------------------------

@pytest.mark.parametrize("keep_boundary", [True, False])
def test_follower_behind_retention_is_reset_and_converges(keep_boundary):
    c = Cluster(IDS3, 111)
    c.crash("n2")
    lead = elect(c)
    load(c, 150, per_tick=2)
    settle_two = lambda: all(n.log.committed_index == lead.log.end_index for n in c.nodes.values() if n.core)
    c.run_until(settle_two, 500, "two nodes settled")
    for n in c.nodes.values():
        if n.core is not None:
            n.log.delete_before(250, keep_boundary=keep_boundary)
    resets = []
    c.on_ready = lambda n, rd: rd.reset_to is not None and resets.append((n.node_id, rd.reset_to.begin_index))
    c.start("n2")
    settle(c)
    begin = 250 if keep_boundary else 251
    assert resets == [("n2", begin)]
    assert c.nodes["n2"].log.begin_index == begin


# --- §5.4.2 in the cluster: Raft paper Figure 8 -------------------------------

def figure_8(c: Cluster, *, assert_not_committed: bool = True) -> None:
    """S1..S5 = n0..n4.  S1 (term 2) put index 1 on S2 only; S5 (term 3) put
    its own index 1 nowhere; now S1 leads term 4 and gets index 1 (term 2)
    onto S3 -- a majority -- while its term-4 NOOP is lost.  S1 must NOT
    count index 1 as committed: S5 can still win and overwrite it."""
    from commitlog.raft.state import HardState
    from tests.commitlog.raft.helpers import log_with_terms
    # everybody saw term 3, in which S3, S4 and S5 voted for S5
    logs = {"n0": ([1, 2], None), "n1": ([1, 2], None), "n2": ([1], "n4"), "n3": ([1], "n4"),
            "n4": ([1, 3], "n4")}
    for nid, (log_terms, vote) in logs.items():
        c.crash(nid)
        n = c.nodes[nid]
        n.log = log_with_terms(log_terms)
        n.log.set_committed(0)
        n.hard = HardState(3, vote)
    lost_noop = lambda m: (isinstance(m, PushRequest) and m.src == "n0" and m.batch is not None
                           and m.batch.last_index >= 2)
    c.net.filters.append(lost_noop)
    for nid in ("n0", "n1", "n2", "n3"):
        c.start(nid)
    c.nodes["n0"].core.campaign()
    c.drain(c.nodes["n0"])
    c.run_until(lambda: c.leader() is c.nodes["n0"], 50, "S1 leads term 4")
    assert c.leader().core.term == 4
    c.run(3 * SIM_CONFIG.push_timeout_ticks)
    assert c.nodes["n2"].log.term_at(1) == 2          # index 1 (term 2) is on a majority
    if assert_not_committed:
        assert c.nodes["n0"].core.commit_index == 0   # ... and still not committed
    c.crash("n0")
    c.net.filters.remove(lost_noop)
    c.start("n4")
    c.nodes["n4"].core.campaign()
    c.drain(c.nodes["n4"])
    c.run_until(lambda: c.leader() is c.nodes["n4"], 100, "S5 leads")
    c.start("n0")
    settle(c)
    assert all(n.log.term_at(1) == 3 for n in c.nodes.values())    # S5's entry won, legitimately


def test_5_4_2_figure_8_entry_of_an_old_term_is_not_committed_by_counting():
    figure_8(Cluster(IDS5, 8, config=attrs.evolve(SIM_CONFIG, check_quorum=False, max_batch_count=1)))
