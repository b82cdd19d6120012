# Membership changes in the deterministic simulation (sim.py: invariants on
# every step, membership ones included): replacing a node (learner, catch-up,
# promotion, removal) under load, learners outside every quorum, the
# refusals that make single-server changes safe, a configuration in force on
# append and reverted on truncation, the 2015 single-server bug and its fix,
# a joining node behind the leader's retention, recovery of the history
# after crashes between the membership file and the log, and proof that the
# chaos runs' membership checks fail on known-bad cores.
import attrs
import pytest

from commitlog.errors import NotLeaderError
from commitlog.members import recover
from commitlog.raft.membership import (
    ChangeKind,
    ConfChange,
    ConfigEntry,
    Membership,
    MembershipChangeError,
    MembershipLog,
)
from commitlog.raft.memlog import MemLog
from commitlog.raft.messages import PushRequest, VoteRequest
from commitlog.raft.roles.leader import LeaderRole
from commitlog.raft.state import Role
from tests.commitlog.raft.chaos import run_chaos
from tests.commitlog.raft.sim import SIM_CONFIG, Cluster, InvariantError
from tests.commitlog.raft.test_sim_scenarios import IDS3, elect, load, settle

add = lambda nid: ConfChange(ChangeKind.ADD_LEARNER, nid, f"10.0.0.9:{4000 + int(nid[1:])}")  # noqa: E731
promote = lambda nid: ConfChange(ChangeKind.PROMOTE, nid)  # noqa: E731
remove = lambda nid: ConfChange(ChangeKind.REMOVE, nid)  # noqa: E731


def committed_change(c: Cluster, change, limit=600) -> int:
    """Propose `change` until the leader takes it, then run until it is
    committed; returns its index."""
    index = None
    for _ in range(limit):
        index = c.change(change)
        if index is not None:
            break
        c.step_all()
    assert index is not None, f"{change} never accepted\n{c.describe()}"
    c.run_until(lambda: c.leader() is not None and c.leader().core.commit_index >= index, limit,
                f"{change.describe()} committed")
    return index


def voters(c: Cluster, nid: str):
    return c.nodes[nid].core.membership.latest


@pytest.mark.parametrize("seed", range(3))
def test_replace_a_node_learner_catch_up_promote_remove_under_load(seed):
    c = Cluster(IDS3, 700 + seed)
    lead = elect(c)
    load(c, 60, per_tick=2)
    c.add_node("n3")
    committed_change(c, add("n3"))
    assert voters(c, lead.node_id).learners == ("n3",)
    c.run_until(lambda: c.nodes["n3"].log.end_index >= c.leader().log.end_index - 5, 600, "learner caught up")
    for _ in range(30):                                    # load keeps flowing through the changes
        c.propose(2)
        c.step_all()
    committed_change(c, promote("n3"))
    old = next(i for i in IDS3 if i != c.leader().node_id)
    load(c, 20)
    committed_change(c, remove(old))
    c.retire(old)
    load(c, 40)
    settle(c)
    final = c.leader().core.membership.latest
    assert set(final.voters) == set(IDS3) - {old} | {"n3"} and not final.learners
    for nid in c.members():
        assert c.nodes[nid].core.membership.latest == final


def test_learners_never_count_in_a_quorum_nor_campaign():
    c = Cluster(IDS3, 11)
    lead = elect(c)
    c.add_node("n3")
    committed_change(c, add("n3"))
    load(c, 20)
    settle(c)
    others = [i for i in IDS3 if i != lead.node_id]
    for nid in others:                          # two of three voters down: the learner's ack is not enough
        c.crash(nid)
    top = lead.log.end_index
    c.propose(1, lead)
    c.run(100)
    assert lead.core.commit_index == top
    assert c.nodes["n3"].log.end_index == top + 1     # replicated to the learner all the same
    asked = []
    c.net.filters.append(lambda m: isinstance(m, VoteRequest) and m.src == "n3" and asked.append(m))
    c.crash(lead.node_id)                             # the learner alone: it never campaigns
    c.run(400)
    learner = c.nodes["n3"].core
    assert learner.role is Role.FOLLOWER and learner.term == lead.hard.term
    assert not asked


def test_changes_are_refused_until_they_are_safe():
    c = Cluster(IDS3, 5)
    lead = elect(c)
    with pytest.raises(NotLeaderError):
        c.nodes[next(i for i in IDS3 if i != lead.node_id)].core.propose_conf_change(add("n3"))
    settle(c)
    with pytest.raises(MembershipChangeError) as e:
        lead.core.propose_conf_change(promote("n0" if lead.node_id != "n0" else "n1"))
    assert e.value.code == "INVALID"                       # a voter already
    with pytest.raises(MembershipChangeError) as e:
        lead.core.propose_conf_change(remove(lead.node_id))
    assert e.value.code == "IS_LEADER"
    c.add_node("n3")
    c.net.isolate("n3", list(c.nodes))                     # the learner hears nothing
    lead.core.propose_conf_change(add("n3"))
    c.drain(lead)
    with pytest.raises(MembershipChangeError) as e:        # one change at a time
        lead.core.propose_conf_change(remove("n0" if lead.node_id != "n0" else "n1"))
    assert e.value.code == "PENDING" and e.value.retryable
    c.run_until(lambda: lead.core.commit_index >= lead.core.membership.latest_index, 200, "learner committed")
    with pytest.raises(MembershipChangeError) as e:
        lead.core.propose_conf_change(promote("n3"))
    assert e.value.code == "FALL_BEHIND" and e.value.retryable
    c.net.heal()
    c.run_until(lambda: lead.core.leader_role.progress["n3"].match_index == lead.log.end_index, 600,
                "learner caught up")
    lead.core.propose_conf_change(promote("n3"))
    c.drain(lead)
    # A new leader must commit an entry of its term first (its NOOP).
    c.run_until(lambda: lead.core.commit_index >= lead.core.membership.latest_index, 300, "promotion committed")
    target = next(i for i in lead.core.voters if i != lead.node_id)
    lead.core.transfer_leadership(target)
    c.drain(lead)
    c.net.filters.append(lambda m: isinstance(m, PushRequest) and m.src == target)   # its NOOP cannot commit
    c.run_until(lambda: c.nodes[target].core.role is Role.LEADER, 300, "transfer")
    with pytest.raises(MembershipChangeError) as e:
        c.nodes[target].core.propose_conf_change(remove("n3"))
    assert e.value.code == "NOT_READY"
    c.net.filters.clear()
    settle(c)


def test_a_configuration_is_in_force_once_appended_and_reverted_when_truncated():
    c = Cluster(("n0", "n1", "n2", "n3", "n4"), 21)
    lead = elect(c)
    settle(c)
    others = [i for i in c.ids if i != lead.node_id]
    follower = others[0]
    # Only one follower gets the new configuration: in force on both at once.
    c.net.partition({lead.node_id, follower}, set(others[1:]))
    index = c.change(remove(others[-1]))
    c.run_until(lambda: c.nodes[follower].log.end_index >= index, 100, "config entry on the follower")
    for nid in (lead.node_id, follower):
        assert others[-1] not in c.nodes[nid].core.voters
        assert c.nodes[nid].core.commit_index < index              # in force, not committed
    # The majority side elects a leader without it; healing truncates it.
    c.run_until(lambda: any(c.nodes[i].core.role is Role.LEADER for i in others[1:]), 600, "new leader")
    load(c, 10)
    c.net.heal()
    settle(c)
    for nid in (lead.node_id, follower):
        assert others[-1] in c.nodes[nid].core.voters               # reverted with the truncation
        assert c.nodes[nid].core.membership.latest_index < index


def _bug_scenario(c: Cluster) -> None:
    """Ongaro's single-server bug (raft-dev, 2015), with promotion as the
    first change.  Voters A,B,C,D and learner E.  A promotes E; only E gets
    it; A crashes.  B leads without it and at once removes D, committing
    that with B,C (a majority of {A,B,C}).  A comes back and, counting its
    own configuration {A..E}, wins with D and E -- and overwrites what B
    committed.  Only B's NOOP committing first (by a majority of A..D, so
    D votes for B's log later) prevents it."""
    a = elect(c)
    b, cc, d = [i for i in ("n0", "n1", "n2", "n3") if i != a.node_id]
    c.add_node("n4")
    committed_change(c, add("n4"))
    load(c, 10)
    c.run_until(lambda: c.nodes["n4"].log.end_index == a.log.end_index, 600, "learner caught up")
    settle(c)
    for peer in (b, cc, d):
        c.net.blocked.add((a.node_id, peer))
    c.change(promote("n4"))
    c.run_until(lambda: c.nodes["n4"].log.end_index == a.log.end_index, 100, "promotion reaches E only")
    c.crash(a.node_id)
    c.net.isolate("n4", list(c.nodes))
    c.net.blocked.clear()
    c.net.isolate("n4", list(c.nodes))
    c.nodes[b].core.campaign()
    c.drain(c.nodes[b])
    c.run_until(lambda: c.nodes[b].core.role is Role.LEADER, 300, "B elected")
    for peer in (d, a.node_id, "n4"):
        c.net.blocked.update({(b, peer), (peer, b)})
    c.nodes[b].core.propose_conf_change(remove(d))      # raises NOT_READY with the fix
    c.drain(c.nodes[b])
    c.run_until(lambda: c.nodes[b].core.commit_index >= c.nodes[b].core.membership.latest_index, 200,
                "removal committed by B and C")
    c.net.heal()
    c.net.partition({a.node_id, d, "n4"}, {b, cc})
    c.start(a.node_id)
    c.nodes[a.node_id].core.campaign()
    c.drain(c.nodes[a.node_id])
    c.run(400)


def test_the_single_server_bug_needs_the_new_leaders_noop_committed(monkeypatch):
    config = attrs.evolve(SIM_CONFIG, pre_vote=False, check_quorum=False)
    with pytest.raises(MembershipChangeError) as e:
        _bug_scenario(Cluster(("n0", "n1", "n2", "n3"), 3, config=config))
    assert e.value.code == "NOT_READY"
    # Without the rule the simulation sees committed entries overwritten.
    orig = LeaderRole.propose_conf_change

    def eager(self, change):
        noop, self.noop_index = self.noop_index, -1
        try:
            return orig(self, change)
        finally:
            self.noop_index = noop
    monkeypatch.setattr(LeaderRole, "propose_conf_change", eager)
    monkeypatch.setattr(Cluster, "check_node", _no_proposal_rule_check(Cluster.check_node))
    with pytest.raises(InvariantError, match="committed entry|lacks committed"):
        _bug_scenario(Cluster(("n0", "n1", "n2", "n3"), 3, config=config))


def _no_proposal_rule_check(check):
    """check_node without its own NOOP rule check (the bug must show as lost data)."""
    def check_node(self, n, rd):
        if rd.leader_append is not None and rd.leader_append.magic == 3:
            rd = attrs.evolve(rd, leader_append=None)
        return check(self, n, rd)
    return check_node


@pytest.mark.parametrize("keep_boundary", [True, False])
def test_a_node_joining_behind_the_leaders_retention_gets_the_configuration_with_its_reset(keep_boundary):
    c = Cluster(IDS3, 31)
    lead = elect(c)
    load(c, 80, per_tick=2)
    settle(c)
    for n in c.nodes.values():
        n.log.delete_before(n.log.committed_index - 5, keep_boundary=keep_boundary)
    c.add_node("n3")
    committed_change(c, add("n3"))
    c.run_until(lambda: c.nodes["n3"].log.end_index == c.leader().log.end_index, 600, "joined")
    n3 = c.nodes["n3"]
    assert n3.log.begin_index > 0                    # reset to the leader's begin, not from 0
    assert n3.core.membership.latest == lead.core.membership.latest
    committed_change(c, promote("n3"))
    load(c, 20)
    settle(c)


def test_restart_recovers_the_history_the_log_holds():
    log = MemLog()
    boot = ConfigEntry(-1, 0, Membership(("a", "b", "c")))
    with_d = Membership(("a", "b", "c"), ("d",), {"d": "h:1"})
    log.append_leader([b"x"] * 3, 1, 1)
    log.append_leader([with_d.encode()], 1, 3)               # entry 3
    log.set_committed(3)
    log.append_leader([b"y"], 2, 1)
    # The file names an entry the log lost in a crash (written first): dropped.
    lost = ConfigEntry(5, 2, with_d.apply(promote("d")))
    got = recover([boot, ConfigEntry(3, 1, with_d), lost], log)
    assert got == [boot, ConfigEntry(3, 1, with_d)]
    # A truncation rewrote the file, then the crash came before the log was
    # cut: the configuration entry left in the uncommitted tail is found.
    promoted = with_d.apply(promote("d"))
    log.append_leader([promoted.encode()], 2, 3)             # entry 5
    got = recover([boot, ConfigEntry(3, 1, with_d)], log)
    assert got[-1] == ConfigEntry(5, 2, promoted)
    assert MembershipLog(got).latest == promoted


def test_crashes_between_the_membership_file_and_the_log():
    """Chaos with membership changes where a quarter of the Readies that
    rewrite the history crash before touching the log: restarts recover the
    history from the file and the log (commitlog/members.py)."""
    crashes = 0
    for seed in range(9000, 9008):
        crashes += run_chaos(seed, membership=True, crash_before_log=0.25).crashed_before_log
    assert crashes >= 4


def test_membership_checks_catch_known_bad_cores(monkeypatch):
    def caught(limit=40):
        for seed in range(limit):
            try:
                run_chaos(seed, membership=True)
            except Exception:
                return True
        return False

    with monkeypatch.context() as m:                 # learners counted for commit
        def count_all(self):
            node = self.node
            ordered = sorted([pr.match_index for pr in self.progress.values()] + [node.log.end_index],
                             reverse=True)
            index = ordered[node.quorum - 1]
            if index > node.commit_index and node.log.term_at(index) == node.term:
                node.set_commit(index)
        m.setattr(LeaderRole, "maybe_commit", count_all)
        assert caught()
    with monkeypatch.context() as m:                 # truncation keeps the dropped configuration
        from commitlog.raft.core import RaftCore

        def keep(self, index):
            self._truncate = index
        m.setattr(RaftCore, "write_truncate", keep)
        assert caught()
    with monkeypatch.context() as m:                 # two changes in flight
        def overlapping(self, change):
            return self.node.write_config_entry(self.node.membership.latest.apply(change))
        m.setattr(LeaderRole, "propose_conf_change", overlapping)
        assert caught()
