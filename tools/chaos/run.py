# Owns one nemesis run end to end, and its command line:
#
#   python -m tools.chaos.run [--seed S] [--cycles N | --seconds T] [--nodes 3|5]
#                             [--kinds kill,pause,...] [--stock-python PATH] [--dir DIR] [--json]
#
# It starts the relays, a name server and the broker group (cluster.py),
# creates the topic, starts the workload (workload.py), lets the nemesis
# (nemesis.py) cycle through faults, heals, waits for a quiet group, runs
# the checker online (checker.py), stops the group and checks the stores
# offline.  It prints one summary and exits 0 only on a clean verdict; the
# seed is printed first and with every failure, and replays the run's
# choices.
import json
import os
import random
import sys
import tempfile

import attrs
import click
import trio

from broker.remoting.client import open_remoting_client
from tools.chaos.checker import Verdict, check_offline, check_online
from tools.chaos.cluster import ChaosCluster, faketime_library
from tools.chaos.nemesis import KINDS, Nemesis
from tools.chaos.relay import RelayMesh
from tools.chaos.workload import QUEUES, TOPIC, History, Workload, new_admin
from tools.cli import CONTEXT, run_command
from tools.mqadmin.adminapi import AdminError

# Small segments so a run crosses several files; 1 s election timeouts stay the defaults.
BROKER_CONF = {"mappedFileSizeCommitLog": 4 * 1024 * 1024, "mappedFileSizeForEntryIndex": 320 * 1024}


@attrs.define
class RunOptions:
    root: str
    seed: int
    cycles: int | None = 10
    seconds: float | None = None
    nodes: int = 3
    kinds: tuple[str, ...] = KINDS
    stock_python: str | None = None
    senders: int = 8
    hold: tuple[float, float] = (2.0, 4.0)
    quiet: tuple[float, float] = (1.0, 3.0)
    settle: float = 90.0


def default_kinds() -> tuple[str, ...]:
    """Every kind; clock jumps only where libfaketime is installed."""
    return tuple(k for k in KINDS if k != "clock" or faketime_library() is not None)


async def create_topic(admin, cluster: ChaosCluster) -> None:
    with trio.fail_after(60):
        while True:
            master = await cluster.wait_master(timeout=60)
            try:
                await admin.create_topic(cluster.addr(master), TOPIC, QUEUES, QUEUES, 6, False)
                break
            except AdminError:
                await trio.sleep(0.2)
        while await cluster.namesrv_client().get_route(TOPIC) is None:
            await trio.sleep(0.05)


def say(msg: str) -> None:
    print(f"[chaos] {msg}", file=sys.stderr, flush=True)


async def run_chaos(opts: RunOptions, *, sampler=None, on_cycle=None) -> tuple[Verdict, History, Nemesis]:
    """One run; `sampler(cluster, history, nemesis)` runs alongside (soak)."""
    rng = random.Random(opts.seed)
    verdict = Verdict()
    async with open_remoting_client() as rc, trio.open_nursery() as outer:
        mesh = await outer.start(RelayMesh(random.Random(rng.random())).run)
        cluster = ChaosCluster(opts.root, size=opts.nodes, extra_conf=BROKER_CONF, mesh=mesh, remoting=rc,
                               clock_faults="clock" in opts.kinds)
        try:
            await cluster.start()
            admin = new_admin(rc, cluster.namesrv_addr)
            await create_topic(admin, cluster)
            history = History(trio.current_time())
            nemesis = Nemesis(cluster, random.Random(rng.random()), kinds=opts.kinds, hold=opts.hold,
                              quiet=opts.quiet)
            workload = Workload(cluster.namesrv_addr, history, senders=opts.senders)
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(workload.produce, stop)
                nursery.start_soon(workload.push_consume, stop)
                nursery.start_soon(workload.pull_consume, stop)
                if opts.stock_python:
                    nursery.start_soon(workload.produce_stock, opts.stock_python, stop)
                if sampler is not None:  # samples through the checks too; ends with `outer`
                    outer.start_soon(sampler, cluster, history, nemesis)

                async def cycle(n, fault):
                    if n % 5 == 0:  # metadata created under faults too
                        master = await cluster.master()
                        if master is not None:
                            await workload.create_metadata(admin, cluster.addr(master), n)
                    if on_cycle is not None:
                        on_cycle(n, fault)

                deadline = trio.current_time() + opts.seconds if opts.seconds else None
                await trio.sleep(1.0)
                await nemesis.run(opts.cycles, deadline, cycle)
                # Healed: every node back, then a quiet period with the load still on.
                say("nemesis done; restarting dead nodes, quiet period")
                for node in cluster.node_ids():
                    if not cluster.brokers[node].alive:
                        await cluster.start_broker(node)
                await trio.sleep(3.0)
                stop.set()
            verdict.cycles = len(nemesis.faults)
            say("waiting for the push consumer group to catch up")
            await wait_consumers(workload, history, opts.settle)
            say("checking the running group")
            await check_online(cluster, admin, history, nemesis.faults, verdict, settle=opts.settle)
            say("stopping the group; checking the stores offline")
            await cluster.stop_all()
            check_offline(cluster, verdict)
        except BaseException:
            for name in [*cluster.brokers, *(p.name for p in cluster.namesrvs)]:
                print(cluster.log_tail(name, 2000), file=sys.stderr)
            raise
        finally:
            with trio.CancelScope(shield=True):
                for proc in [*cluster.brokers.values(), *cluster.namesrvs]:
                    if proc.alive:
                        proc.process.kill()
                        await proc.process.wait()
            outer.cancel_scope.cancel()
    return verdict, history, nemesis


async def wait_consumers(workload: Workload, history: History, timeout: float) -> None:
    """Restart the push consumer until it has every acknowledged message and
    the retried ones came back (or timeout): the group resumes from its
    committed offsets, which is part of what is checked."""
    from tools.chaos.workload import RETRY_MARK

    def done() -> bool:
        for s in history.sends:
            if s.outcome == "ok":
                n = history.push_deliveries[s.body]
                if n == 0 or (s.body.endswith(RETRY_MARK) and n < 2):
                    return False
        return True

    with trio.move_on_after(timeout):
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(workload.push_consume, stop)
            while not done():
                await trio.sleep(0.5)
            stop.set()


def _kinds(ctx, param, value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    kinds = tuple(k for k in value.split(",") if k)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise click.BadParameter(f"unknown kind {','.join(unknown) or repr(value)} (known: {','.join(KINDS)})")
    return kinds


@click.command(context_settings=CONTEXT)
@click.option("--seed", type=int, default=None, help="the nemesis's seed (default: a random one, printed)")
@click.option("--cycles", type=int, default=10, show_default=True, help="fault cycles to run")
@click.option("--seconds", type=float, default=None, help="run the nemesis this long instead of --cycles")
@click.option("--nodes", type=click.Choice(["3", "5"]), default="3", show_default=True, help="members of the group")
@click.option("--kinds", default=None, callback=_kinds, help=f"comma-separated subset of {','.join(KINDS)}")
@click.option("--stock-python", envvar="LEDGERMQ_COMPAT_PYTHON", show_envvar=True,
              help="python of a venv with rocketmq==0.4.4: adds the stock C++ producer")
@click.option("--dir", "root", default=None, help="where the group's stores go (default: a temporary directory)")
@click.option("--json", "as_json", is_flag=True, help="also print the verdict as one JSON object")
def command(seed: int | None, cycles: int, seconds: float | None, nodes: str, kinds: tuple[str, ...] | None,
            stock_python: str | None, root: str | None, as_json: bool) -> int:
    """ledgermq nemesis run."""
    seed = seed if seed is not None else random.SystemRandom().randrange(2 ** 32)
    kinds = kinds or default_kinds()
    root = os.path.abspath(root or tempfile.mkdtemp(prefix="ledgermq-chaos-"))
    print(f"seed {seed}  nodes {nodes}  kinds {','.join(kinds)}  dir {root}", flush=True)
    opts = RunOptions(root, seed, None if seconds else cycles, seconds, int(nodes), kinds, stock_python)
    verdict, _history, nemesis = trio.run(
        lambda: run_chaos(opts, on_cycle=lambda n, f: print(f"  cycle {n}: {f.what}", flush=True)))
    if as_json:
        print(json.dumps(verdict.as_dict(), default=str))
    print(verdict.summary())
    if not verdict.ok:
        print(f"replay with: python -m tools.chaos.run --seed {seed} --nodes {nodes} "
              f"--kinds {','.join(kinds)} " + (f"--seconds {seconds}" if seconds else f"--cycles {cycles}"))
    return 0 if verdict.ok else 1


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.chaos.run")


if __name__ == "__main__":
    sys.exit(main())
