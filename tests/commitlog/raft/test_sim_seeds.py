# The many-seed chaos simulation (tests/commitlog/raft/chaos.py) and proof that its
# invariant checks can fail: each known-bad mutation of the core (or of the
# shell's persist-before-send order) must be caught.
#
# LEDGERMQ_SIM_SEEDS (default 250, 35-55 s on one core of this machine) sets
# how many seeds run; LEDGERMQ_SIM_SEED_BASE moves the window to explore new
# seeds.  (400 seeds took 90 s of the suite's 20 minutes; every known-bad
# mutation below is caught within the first 80.)
import os

import attrs
import pytest

from commitlog.errors import AppendRejectedError, RaftSafetyError
from commitlog.raft.core import RaftCore
from commitlog.raft.messages import VoteResult
from commitlog.raft.quorum import quorum_match_index
from commitlog.raft.roles.follower import FollowerRole
from commitlog.raft.roles.leader import LeaderRole
from tests.commitlog.raft.chaos import run_chaos
from tests.commitlog.raft.sim import SIM_CONFIG, Cluster, InvariantError
from tests.commitlog.raft.test_sim_scenarios import IDS5, figure_8

SEEDS = int(os.environ.get("LEDGERMQ_SIM_SEEDS", "250"))
BASE = int(os.environ.get("LEDGERMQ_SIM_SEED_BASE", "0"))
CHUNK = 25


@pytest.mark.parametrize("first", range(BASE, BASE + SEEDS, CHUNK),
                         ids=lambda s: f"seeds{s}-{min(s + CHUNK, BASE + SEEDS) - 1}")
def test_chaos_seeds(first):
    for seed in range(first, min(first + CHUNK, BASE + SEEDS)):
        try:
            run_chaos(seed)
        except Exception as e:
            raise AssertionError(f"seed {seed} failed (rerun: run_chaos({seed}))") from e


# --- the checks are live: known bugs are caught ------------------------------

CAUGHT = (InvariantError, RaftSafetyError, AppendRejectedError)


def first_caught(limit=80):
    for seed in range(limit):
        try:
            run_chaos(seed)
        except CAUGHT:
            return seed
    return None


def test_checks_catch_votes_that_ignore_the_election_restriction(monkeypatch):
    decide = RaftCore.vote_decision

    def careless(self, m):
        result = decide(self, m)
        stale_log = (VoteResult.REJECT_EXPIRED_LEDGER_TERM, VoteResult.REJECT_SMALL_LEDGER_END_INDEX)
        return VoteResult.ACCEPT if result in stale_log else result
    monkeypatch.setattr(RaftCore, "vote_decision", careless)
    assert first_caught() is not None


def test_checks_catch_a_follower_committing_beyond_its_match(monkeypatch):
    monkeypatch.setattr(FollowerRole, "_commit",
                        lambda self, c: self.node.set_commit(min(c, self.node.log.end_index)))
    assert first_caught() is not None


def test_checks_catch_a_shell_that_sends_before_persisting(monkeypatch):
    apply = Cluster.apply

    def send_first(self, n, rd):
        for m in rd.messages:
            self.net.send(m)
        if self.rng.random() < 0.05:
            self.crash(n.node_id)           # the promised writes never happen
            return
        return apply(self, n, attrs.evolve(rd, messages=()))
    monkeypatch.setattr(Cluster, "apply", send_first)
    assert first_caught() is not None


def test_checks_catch_committing_an_old_term_entry_by_counting(monkeypatch):
    def count_replicas(self):
        node = self.node
        index = quorum_match_index([pr.match_index for pr in self.progress.values()] + [node.log.end_index])
        node.set_commit(index)         # no "entry of the current term" check
    monkeypatch.setattr(LeaderRole, "maybe_commit", count_replicas)
    with pytest.raises(CAUGHT) as caught:
        figure_8(Cluster(IDS5, 8, config=attrs.evolve(SIM_CONFIG, check_quorum=False, max_batch_count=1)),
                 assert_not_committed=False)
    assert "entry 1" in str(caught.value) or "truncat" in str(caught.value)
