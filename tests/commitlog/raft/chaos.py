# Owns the randomized fault schedule the many-seed simulation runs: load
# from a client, and at random moments crashes/restarts (with writes kept and
# messages lost), partitions, isolation of the leader, retention on a
# random node, leadership transfers, changing loss/duplication/reordering.
# Then it heals everything and demands quiescence with identical logs and
# every acknowledged append present (checked by Cluster.check_final).
import random

import attrs

from tests.commitlog.raft.sim import SIM_CONFIG, Cluster

MAX_PENDING = 200


def run_chaos(seed: int, *, chaos_ticks: int = 1200, settle_limit: int = 4000) -> Cluster:
    rng = random.Random(seed ^ 0x5EED)
    size = rng.choice((3, 3, 5))
    ids = tuple(f"n{i}" for i in range(size))
    config = attrs.evolve(
        SIM_CONFIG,
        pre_vote=rng.random() < 0.75,
        check_quorum=rng.random() < 0.75,
        preferred_leader=ids[0] if rng.random() < 0.25 else None,
        max_batch_count=rng.choice((2, 4, 16, 64)),
        max_inflight_pushes=rng.choice((1, 4, 16)))
    c = Cluster(ids, seed, config=config)
    net = c.net
    net.drop_rate = rng.choice((0.0, 0.02, 0.1))
    net.dup_rate = rng.choice((0.0, 0.02, 0.1))
    net.max_delay = rng.choice((1, 2, 5))
    c.crash_mid_ready = rng.choice((0.0, 0.0, 0.001))
    load = rng.choice((0.1, 0.4, 0.8))
    event_rate = rng.choice((0.003, 0.01))
    for _ in range(chaos_ticks):
        lead = c.leader()
        # the shell refuses appends beyond its pending limit (PendingFullError)
        if rng.random() < load and lead is not None and lead.core.status().uncommitted < MAX_PENDING:
            c.propose(rng.randint(1, 4))
        if rng.random() < event_rate:
            _random_event(c, rng)
        c.step_all()
    # heal
    net.heal()
    net.drop_rate = net.dup_rate = 0.0
    c.crash_mid_ready = 0.0
    for n in c.nodes.values():
        if n.core is None:
            c.start(n.node_id)
    c.run_until(c.quiescent, settle_limit, "quiescence after healing")
    start = c.proposals
    c.run_until(lambda: c.propose(1), 200, "a proposal accepted")
    c.run_until(lambda: max(c.acked, default=-1) >= 0 and len(c.acked) > 0 and c.quiescent()
                and c.leader().log.committed_index >= max(c.acked), settle_limit, "final commit")
    assert c.proposals > start
    c.check_final()
    return c


def _random_event(c: Cluster, rng: random.Random) -> None:
    ids = list(c.ids)
    lead = c.leader()
    kind = rng.choice(("crash", "restart", "partition", "isolate_leader", "heal", "retention",
                       "transfer", "lossy"))
    if kind == "crash":
        c.crash(rng.choice(ids))
    elif kind == "restart":
        nid = rng.choice(ids)
        c.restart(nid)
    elif kind == "partition":
        rng.shuffle(ids)
        cut = rng.randint(1, len(ids) - 1)
        c.net.partition(set(ids[:cut]), set(ids[cut:]))
    elif kind == "isolate_leader" and lead is not None:
        c.net.isolate(lead.node_id, ids)
    elif kind == "heal":
        c.net.heal()
        for n in c.nodes.values():
            if n.core is None:
                c.start(n.node_id)
    elif kind == "retention":
        n = c.nodes[rng.choice(ids)]
        keep = rng.randint(0, 30)
        target = n.log.committed_index + 1 - keep
        if target > n.log.begin_index:
            n.log.delete_before(target, keep_boundary=rng.random() < 0.5)
    elif kind == "transfer" and lead is not None:
        target = rng.choice([i for i in ids if i != lead.node_id])
        try:
            lead.core.transfer_leadership(target)
        except Exception:
            pass
        c.drain(lead)
    elif kind == "lossy":
        c.net.drop_rate = rng.choice((0.0, 0.05, 0.2))
        c.net.dup_rate = rng.choice((0.0, 0.05))
        c.net.max_delay = rng.choice((1, 3, 8))
