# Throughput benchmark of the Raft core (not a test): a 3-node group in one
# process, messages delivered immediately (optionally through wire.py), the
# leader proposing batches of bodies as fast as the window allows.  Prints
# committed entries per second, split into the whole run and the share of
# time spent in the core (the rest is MemLog encoding/verifying entries,
# which the disk store does natively).
#   .venv/bin/python -m tests.commitlog.raft.bench_core [entries] [batch] [body_bytes] [--wire]
import collections
import random
import sys
import time

from commitlog.raft import wire
from commitlog.raft.core import RaftCore
from commitlog.raft.memlog import MemLog
from commitlog.raft.state import RaftConfig, Role


def run(entries=200_000, batch=256, body_bytes=100, use_wire=False):
    ids = ("a", "b", "c")
    cfg = RaftConfig(max_batch_bytes=1 << 20, max_batch_count=1024, max_inflight_pushes=16)
    logs = {i: MemLog() for i in ids}
    cores = {i: RaftCore(i, ids, logs[i], rng=random.Random(i), config=cfg) for i in ids}
    queue = collections.deque()
    log_time = 0.0

    def drain(core):
        nonlocal log_time
        log = logs[core.node_id]
        while core.has_ready():
            rd = core.ready()
            t = time.perf_counter()
            if rd.truncate_from is not None:
                log.truncate_from(rd.truncate_from)
            if rd.leader_append is not None:
                la = rd.leader_append
                log.append_leader(la.bodies, la.term, la.magic)
            if rd.follower_append is not None:
                log.append_follower(rd.follower_append)
            if rd.committed_index is not None:
                log.set_committed(rd.committed_index)
            log_time += time.perf_counter() - t
            for m in rd.messages:
                queue.append(wire.encode(m) if use_wire else m)
            core.advance(rd)

    def pump_network():
        while queue:
            m = queue.popleft()
            m = wire.decode(m) if use_wire else m
            cores[m.dst].step(m)
            drain(cores[m.dst])

    cores["a"].campaign()
    drain(cores["a"])
    pump_network()
    leader = cores["a"]
    assert leader.role is Role.LEADER
    body = b"b" * body_bytes
    bodies = [body] * batch
    start = time.perf_counter()
    log_time = 0.0
    proposed = 0
    while proposed < entries:
        if leader.status().uncommitted < 4 * batch:
            leader.propose(bodies)
            proposed += batch
            drain(leader)
        pump_network()
    while leader.commit_index < leader.log.end_index or any(
            logs[i].committed_index < leader.log.end_index for i in ids):
        leader.tick()
        drain(leader)
        pump_network()
    wall = time.perf_counter() - start
    core_time = wall - log_time
    print(f"{proposed} entries of {body_bytes} B in batches of {batch}{' via wire' if use_wire else ''}: "
          f"{proposed / wall:,.0f}/s overall, core-only {proposed / core_time:,.0f}/s "
          f"(log writes {log_time / wall:.0%} of the time)")
    for i in ids:
        assert logs[i].chain_crc_at(logs[i].end_index) == logs["a"].chain_crc_at(logs["a"].end_index)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    run(*(int(a) for a in args), use_wire="--wire" in sys.argv)
