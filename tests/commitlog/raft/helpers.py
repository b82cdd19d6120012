# Owns the small harness the pure-core tests use: one RaftCore over a MemLog
# driven by hand (the shell's drain loop, recording every Ready), and builders
# for logs with a given term per index.
import random

from commitlog.raft.core import RaftCore
from commitlog.raft.memlog import MemLog
from commitlog.raft.messages import VoteRequest, VoteResponse, VoteResult
from commitlog.raft.state import HardState, RaftConfig, Role

FAST = RaftConfig(heartbeat_ticks=2, election_timeout_min=10, election_timeout_max=20,
                  push_timeout_ticks=8, max_batch_bytes=4096, max_batch_count=8, max_inflight_pushes=3)


def log_with_terms(terms, body=b"x") -> MemLog:
    """A log whose entry i has term terms[i] (bodies distinguish entries)."""
    log = MemLog()
    for i, t in enumerate(terms):
        log.append_leader([body + str(i).encode()], t, 1)
    return log


class Solo:
    """One replica and its log; drain() acts as the shell."""

    def __init__(self, node_id="a", voters=("a", "b", "c"), log=None, *, config=FAST,
                 hard=HardState(), committed=-1, seed=0):
        self.log = log if log is not None else MemLog()
        self.hard = hard
        self.readies = []
        self.core = RaftCore(node_id, voters, self.log, rng=random.Random(seed), config=config,
                             hard_state=hard, committed_index=committed)

    def drain(self) -> list:
        out = []
        core, log = self.core, self.log
        while core.has_ready():
            rd = core.ready()
            self.readies.append(rd)
            if rd.hard_state is not None:
                self.hard = rd.hard_state
            if rd.reset_to is not None:
                r = rd.reset_to
                log.reset_to(r.begin_index, r.begin_pos, r.prev_term, r.prev_chain_crc)
            if rd.truncate_from is not None:
                log.truncate_from(rd.truncate_from)
            if rd.leader_append is not None:
                la = rd.leader_append
                log.append_leader(la.bodies, la.term, la.magic)
            if rd.follower_append is not None:
                log.append_follower(rd.follower_append)
            if rd.committed_index is not None:
                log.set_committed(rd.committed_index)
            out.extend(rd.messages)
            core.advance(rd)
        return out

    def step(self, msg) -> list:
        self.core.step(msg)
        return self.drain()

    def tick(self, n=1) -> list:
        out = []
        for _ in range(n):
            self.core.tick()
            out.extend(self.drain())
        return out

    def tick_until(self, cond, limit=500) -> list:
        out = []
        for _ in range(limit):
            out.extend(self.tick())
            if cond():
                return out
        raise AssertionError("condition not reached")

    def make_leader(self) -> list:
        """Campaign and grant every vote asked for: the node leads the next
        term.  Returns the messages of the first leader Ready(s)."""
        core = self.core
        core.campaign()
        out = self.drain()
        for _ in range(2):          # pre-vote round, then the real one
            requests = [m for m in out if isinstance(m, VoteRequest)]
            out = []
            for req in requests:
                out += self.step(VoteResponse(req.dst, core.node_id, req.term, VoteResult.ACCEPT,
                                              pre_vote=req.pre_vote))
            if core.role is Role.LEADER:
                return out
        raise AssertionError(f"not leader: {core.role}")
