# A bounded chaos run against three real node processes on 127.0.0.1:
# clients append numbered bodies through the admin port while a seeded
# nemesis kills -9 and SIGSTOPs leaders and followers (one node at a time, so
# a majority can always make progress) and restarts the dead.  Then the
# group is healed and the recorded history is checked: every acknowledged
# append on every node at its index, no index acknowledged twice, identical
# committed histories and chain CRCs, one agreed leader and term, terms never
# going back, no two leaders of one term, progress actually made, and a
# clean offline verifyStore of every node's files.
#
#   LEDGERMQ_CHAOS_SECONDS=120  run longer (default: about 25 s in total)
#   LEDGERMQ_CHAOS_SEED=1234    replay a seed (printed in every failure)
#
# pytest -s prints a summary with how long each leader loss took to heal.
# The fast tests at the end feed the history checks broken histories, so a
# check that could never fail cannot hide behind a green chaos run.
import os
import random

import pytest
import trio

from commitlog.scan import verify_store
from tests.commitlog import chaos_helpers as chaos
from tests.helpers.waiting import wait_until
from tools.localcluster import LocalCluster

SMALL_SEGMENTS = {"mappedFileSizeCommitLog": 256 * 1024, "mappedFileSizeForEntryIndex": 32 * 1024}

BUDGET = float(os.environ.get("LEDGERMQ_CHAOS_SECONDS", "25"))
# Of the budget, start-up, healing and the checks get this much; the rest
# is chaos.
RESERVE = 6.0
CLIENTS = 3
# Floors that keep the test from passing vacuously.  An idle 2-core machine
# acknowledges tens of thousands of appends in the chaos phase and a loaded
# one thousands.  The nemesis keeps going past its time until it injected
# MIN_FAULTS faults, so falling short means faults could not be aimed (no
# leader to find), not that the machine was slow.
MIN_ACKED = 500
MIN_FAULTS = 4
# Heal-time bounds: generous, since a loaded machine slows elections and
# catch-up (these time out a stuck run; they are not what is asserted).
CONVERGE_TIMEOUT = 30.0


@pytest.mark.slow
async def test_chaos_kill_and_pause_lose_no_acknowledged_append(tmp_path):
    """Slow: three real node processes under a seeded nemesis, 25 s in all (LEDGERMQ_CHAOS_SECONDS)."""
    seed = int(os.environ.get("LEDGERMQ_CHAOS_SEED") or random.SystemRandom().randrange(1 << 32))
    chaos_seconds = max(6.0, BUDGET - RESERVE)
    cluster = LocalCluster(str(tmp_path), extra_conf=SMALL_SEGMENTS, log_level="INFO")
    run = chaos.ChaosRun(seed, trio.current_time())
    print(f"\nchaos seed {seed} (replay with LEDGERMQ_CHAOS_SEED={seed}), {chaos_seconds:.0f}s of faults, "
          f"node logs in {tmp_path}")
    try:
        with trio.fail_after(chaos_seconds + 120):
            summary = await _run(cluster, run, chaos_seconds)
    except BaseException as exc:
        if not isinstance(exc, Exception):
            raise
        raise AssertionError(
            f"chaos run failed with seed {seed} (replay: LEDGERMQ_CHAOS_SEED={seed}); node logs in {tmp_path}\n"
            f"nemesis timeline:\n{run.timeline()}\nerror: {exc!r}") from exc
    finally:
        for nid in list(run.down):
            if run.down[nid] == "paused":
                cluster.resume(nid)  # a stopped process would ignore stop_all's SIGTERM
        await cluster.stop_all()
    print(summary)
    # After a clean stop every node's files must pass the offline verifier.
    for nid in sorted(cluster.nodes):
        report = verify_store(os.path.join(str(tmp_path), nid, f"dledger-{nid}"))
        assert not report.problems, (f"seed {seed}: verifyStore found problems in {nid}: "
                                     f"{[p.as_dict() for p in report.problems[:5]]}")


async def _run(cluster: LocalCluster, run: chaos.ChaosRun, chaos_seconds: float) -> str:
    rng = random.Random(run.seed)
    await cluster.start()
    run.t0 = trio.current_time()
    stop_clients, stop_samplers = trio.Event(), trio.Event()
    async with trio.open_nursery() as samplers:
        for nid in sorted(cluster.nodes):
            samplers.start_soon(chaos.sampler, cluster, run, nid, stop_samplers)
        async with trio.open_nursery() as nursery:
            for k in range(CLIENTS):
                nursery.start_soon(chaos.client, cluster, run, f"c{k}", random.Random(rng.random()), stop_clients)
            first = await chaos.current_leader(cluster, run, timeout=15)
            assert first is not None, "no leader elected at start-up"
            await chaos.nemesis(cluster, run, rng, until=trio.current_time() + chaos_seconds,
                                min_faults=MIN_FAULTS)
            await chaos.heal(cluster, run)
            # Let the healed group serve the clients for a moment: progress
            # after the last fault is part of what is checked.
            healed_at = trio.current_time()
            await wait_until(lambda: sum(a.at > healed_at for a in run.acks) >= 10 * CLIENTS, CONVERGE_TIMEOUT,
                             "acknowledgements after the heal", interval=0.05)
            stop_clients.set()
        # (the nursery waited for the clients' last calls, so every ack is in)
        last = max(a.index for a in run.acks)
        sts = await chaos.wait_converged(cluster, last, CONVERGE_TIMEOUT)
        stop_samplers.set()
    common = min(st["committedIndex"] for st in sts.values())

    problems = list(run.problems)
    problems += chaos.check_acks_unique(run.acks)
    logs = {nid: await chaos.read_committed_log(cluster, nid, common) for nid in sorted(cluster.nodes)}
    problems += chaos.check_logs(run.acks, logs)
    chains = {nid: (await cluster.call(nid, {"op": "chain", "index": common}))["chainCrc"] for nid in cluster.nodes}
    if len(set(chains.values())) != 1:
        problems.append(f"chain CRCs differ at committed index {common}: {chains}")
    problems += chaos.check_samples(run)

    faults = [d for d in run.disruptions if d.kind != "restart"]
    kinds = {d.kind for d in faults}
    if len(run.acks) < MIN_ACKED:
        problems.append(f"only {len(run.acks)} appends acknowledged (need {MIN_ACKED})")
    if len(faults) < MIN_FAULTS:
        problems.append(f"only {len(faults)} faults injected (need {MIN_FAULTS}); skipped {run.skipped_actions}")
    if not {"kill_leader", "pause_leader"} <= kinds:
        problems.append(f"the run never killed and paused a leader: {sorted(kinds)}")
    failovers = chaos.failover_times(run)
    unhealed = [f.disruption for f in failovers if f.served_after is None]
    if unhealed:
        problems.append(f"no append acknowledged after {[(d.kind, run.rel(d.at)) for d in unhealed]}")

    summary = _summary(run, sts, common, failovers, chaos_seconds)
    assert not problems, "\n".join(problems) + "\n" + summary
    return summary


def _summary(run, sts, common, failovers, chaos_seconds) -> str:
    faults = [d for d in run.disruptions if d.kind != "restart"]
    counts = {k: sum(1 for d in faults if d.kind == k) for k in chaos.FAULTS}
    leader = next(iter(sts.values()))
    lines = [
        f"chaos summary (seed {run.seed}, {chaos_seconds:.0f}s of faults, "
        f"{trio.current_time() - run.t0:.1f}s since start-up):",
        f"  acknowledged appends: {len(run.acks)}; committed index {common} on all nodes; "
        f"final leader {leader['leader']} in term {leader['term']}",
        f"  faults: {len(faults)} {counts}; restarts: {sum(1 for d in run.disruptions if d.kind == 'restart')}; "
        f"skipped (no leader to aim at): {run.skipped_actions}",
        f"  client errors: {dict(run.client_errors)}",
        "  leader losses (from the fault):",
    ]
    def ms(t):
        return "-" if t is None else f"{t * 1000:.0f} ms"

    for f in failovers:
        d = f.disruption
        paused = f", paused {d.ended - d.at:.2f}s" if d.kind == "pause_leader" and d.ended else ""
        stepped = (f", woke and gave up term {d.term} in {ms(d.stepped_down_after)}"
                   if d.stepped_down_after is not None else "")
        lines.append(f"    {run.rel(d.at):7.2f}s {d.kind:<13} {d.node} (term {d.term}): newer leader seen "
                     f"after {ms(f.elected_after)}, first ack after {ms(f.served_after)}{paused}{stepped}")
    served = sorted(f.served_after for f in failovers if f.served_after is not None)
    if served:
        lines.append(f"  first ack after a leader loss: min {ms(served[0])}, "
                     f"median {ms(served[len(served) // 2])}, max {ms(served[-1])}")
    lines.append("  nemesis timeline:")
    lines.append(run.timeline())
    return "\n".join(lines)


# --- the history checks themselves must be able to fail (fast, no processes)

def _ack(index, body, node="n0"):
    return chaos.Ack(index, body, 0.0, node, "c0")


def test_double_ack_of_an_index_is_reported():
    assert chaos.check_acks_unique([_ack(5, b"a"), _ack(6, b"b")]) == []
    problems = chaos.check_acks_unique([_ack(5, b"a", "n0"), _ack(5, b"b", "n1")])
    assert len(problems) == 1 and "index 5 acknowledged twice" in problems[0]
    assert "acknowledged at 5 and 7" in chaos.check_acks_unique([_ack(5, b"a"), _ack(7, b"a")])[0]


def test_lost_divergent_or_duplicated_entries_are_reported():
    good = {0: (1, b""), 1: (1, b"a"), 2: (1, b"b")}
    acks = [_ack(1, b"a"), _ack(2, b"b")]
    assert chaos.check_logs(acks, {"n0": good, "n1": dict(good)}) == []
    lost = {0: (1, b""), 1: (1, b"a"), 2: (2, b"x")}
    problems = chaos.check_logs(acks, {"n0": good, "n1": lost})
    assert any("n1 lacks 1 acknowledged" in p for p in problems)
    assert any("different histories, first difference at index 2" in p for p in problems)
    dup = {0: (1, b""), 1: (1, b"a"), 2: (1, b"b"), 3: (2, b"a")}
    assert any("committed at 1 and 3" in p for p in chaos.check_logs(acks, {"n0": dup}))


def test_term_regression_and_two_leaders_of_a_term_are_reported():
    run = chaos.ChaosRun(seed=1, t0=0.0)
    run.samples["n0"] = [chaos.Sample(1.0, 100, 3, "leader", "n0", 10), chaos.Sample(2.0, 100, 2, "follower", None, 9)]
    run.samples["n1"] = [chaos.Sample(1.5, 101, 3, "leader", "n1", 10),
                         chaos.Sample(2.5, 102, 3, "follower", "n1", 4)]  # restart: committed may drop
    problems = chaos.check_samples(run)
    assert any("n0: term went back from 3 to 2" in p for p in problems)
    assert any("n0: committedIndex went back from 10 to 9" in p for p in problems)
    assert any("term 3 had two leaders" in p for p in problems)
    assert not any(p.startswith("n1:") for p in problems)


def test_failover_is_measured_from_the_fault_to_the_first_ack_elsewhere():
    run = chaos.ChaosRun(seed=1, t0=0.0)
    run.disruptions = [chaos.Disruption("kill_leader", "n0", 10.0, term=4),
                       chaos.Disruption("pause_leader", "n1", 20.0, term=5, ended=22.0)]
    run.acks = [chaos.Ack(1, b"a", 10.2, "n0", "c0"),   # the dead leader's in-flight reply: not service
                chaos.Ack(2, b"b", 10.7, "n1", "c0"),
                chaos.Ack(3, b"c", 22.5, "n1", "c0")]    # the paused leader, awake again
    run.samples["n1"] = [chaos.Sample(10.6, 1, 5, "leader", "n1", 1)]
    f_kill, f_pause = chaos.failover_times(run)
    assert f_kill.served_after == pytest.approx(0.7) and f_kill.elected_after == pytest.approx(0.6)
    assert f_pause.served_after == pytest.approx(2.5) and f_pause.elected_after is None
