# Owns the soak: a nemesis run (run.py) held for minutes under sustained
# load, sampled every few seconds, then judged by the checker.
#
#   python -m tools.chaos.soak --minutes 30 [--seed S] [--nodes 3|5] [--out DIR]
#
# Every `--interval` seconds it samples: SEND_OKs per second, the p50/p99
# latency of the sends that ended in the interval, and the RSS and open file
# descriptors of every broker and name server process (from /proc).  It
# writes DIR/soak.json (samples, faults, verdict) and DIR/soak.png
# (matplotlib: throughput, latency and RSS over time with every fault
# marked; optional: without it one line says the chart was skipped, and
# neither the verdict nor the exit status depends on it), prints the
# checker's summary with peak RSS and descriptors per node, and exits 0
# only when the verdict is clean and the heap (anonymous
# RSS) and the descriptors other than store files stayed bounded (the last
# fifth of the run may not exceed the first fifth's peak by more than
# GROWTH_LIMIT).  Total RSS also counts mapped store pages, and the store
# keeps a descriptor per segment and index file: both grow with the data
# kept (until retention deletes it) and are reported, not judged.
import json
import os
import random
import sys
import tempfile

import attrs
import click
import trio

from tools.chaos.run import RunOptions, default_kinds, run_chaos
from tools.cli import CONTEXT, run_command

GROWTH_LIMIT = 1.5   # RSS/fds at the end vs the early peak (after warm-up)


def proc_stats(pid: int, store_root: str | None = None) -> tuple[int, int, int, int] | None:
    """(RSS bytes, open fds, anonymous RSS bytes, fds open on files under
    store_root) of a live process, None if it is gone.  RSS includes the
    pages of mapped store files (segments, index files), which grow with the
    data read through the maps; the anonymous part is the heap."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = {line.split(":")[0]: line.split()[1] for line in f if line.startswith(("VmRSS:", "RssAnon:"))}
        fd_dir = f"/proc/{pid}/fd"
        fds = os.listdir(fd_dir)
        store = 0
        if store_root:
            prefix = os.path.realpath(store_root) + os.sep
            for fd in fds:
                try:
                    store += os.readlink(os.path.join(fd_dir, fd)).startswith(prefix)
                except OSError:
                    pass  # closed meanwhile
        return int(fields["VmRSS"]) * 1024, len(fds), int(fields["RssAnon"]) * 1024, store
    except (OSError, KeyError, ValueError):
        return None


@attrs.define
class Sample:
    t: float
    acks_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    rss: dict[str, int]
    fds: dict[str, int]
    anon: dict[str, int] = attrs.Factory(dict)
    store_fds: dict[str, int] = attrs.Factory(dict)  # of fds, those on store files

    @property
    def other_fds(self) -> dict[str, int]:
        """Descriptors other than store files (sockets, pipes, the rest)."""
        return {n: v - self.store_fds.get(n, 0) for n, v in self.fds.items()}


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def make_sampler(samples: list[Sample], interval: float):
    async def sampler(cluster, history, nemesis):
        first = 0  # sends before this index all ended before the last window
        while True:
            await trio.sleep(interval)
            now = trio.current_time()
            sends = history.sends
            while first < len(sends) and sends[first].end is not None and sends[first].end <= now - interval:
                first += 1
            window = [s for s in sends[first:] if s.outcome == "ok" and now - interval < s.end <= now]
            lat = [(s.end - s.start) * 1000 for s in window]
            rss, fds, anon, store = {}, {}, {}, {}
            for name, proc in [*cluster.brokers.items(), *((p.name, p) for p in cluster.namesrvs)]:
                root = cluster.store_root(name) if name in cluster.brokers else None
                st = proc_stats(proc.pid, root) if proc.alive else None
                if st is not None:
                    rss[name], fds[name], anon[name], store[name] = st
            samples.append(Sample(round(now - history.t0, 2), len(window) / interval, _pct(lat, 0.5),
                                  _pct(lat, 0.99), rss, fds, anon, store))
    return sampler


def bounded(samples: list[Sample], what: str) -> list[str]:
    """Nodes whose RSS (or fds) in the last fifth exceeds the first fifth's
    peak (after the first minute of warm-up) by more than GROWTH_LIMIT."""
    if len(samples) < 10:
        return []
    warm = [s for s in samples if s.t >= 60] or samples
    k = max(1, len(warm) // 5)
    early, late = warm[:k], warm[-k:]
    out = []
    nodes = {n for s in samples for n in getattr(s, what)}
    for n in sorted(nodes):
        e = max((getattr(s, what).get(n, 0) for s in early), default=0)
        tail = max((getattr(s, what).get(n, 0) for s in late), default=0)
        if e and tail > e * GROWTH_LIMIT:
            out.append(f"{n}: {what} grew from a peak of {e} early to {tail} at the end")
    return out


def chart(path: str, samples: list[Sample], faults, t0: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t / 60 for s in samples]
    fig, axes = plt.subplots(3, 1, figsize=(12, 9), sharex=True)
    axes[0].plot(t, [s.acks_per_s for s in samples], lw=0.8)
    axes[0].set_ylabel("SEND_OK / s")
    axes[1].plot(t, [s.p50_ms for s in samples], lw=0.8, label="p50")
    axes[1].plot(t, [s.p99_ms for s in samples], lw=0.8, label="p99")
    axes[1].set_ylabel("send latency ms")
    axes[1].set_yscale("log")
    axes[1].legend(loc="upper right")
    nodes = sorted({n for s in samples for n in s.rss})
    for i, n in enumerate(nodes):
        color = plt.get_cmap("tab10")(i)
        axes[2].plot(t, [s.rss.get(n, float("nan")) / 2 ** 20 for s in samples], lw=0.8, label=n, color=color)
        axes[2].plot(t, [s.anon.get(n, float("nan")) / 2 ** 20 for s in samples], lw=0.8, ls="--", color=color)
    axes[2].set_ylabel("RSS MiB (dashed: anonymous)")
    axes[2].set_xlabel("minutes")
    axes[2].legend(loc="upper left", ncol=len(nodes))
    colors = {}
    palette = plt.get_cmap("tab10")
    for f in faults:
        c = colors.setdefault(f.kind, palette(len(colors) % 10))
        for ax in axes:
            ax.axvspan((f.start - t0) / 60, ((f.healed or f.start) - t0) / 60, color=c, alpha=0.15, lw=0)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c, alpha=0.4) for c in colors.values()]
    axes[0].legend(handles, list(colors), loc="upper right", ncol=len(colors), fontsize="small")
    fig.suptitle("ledgermq soak: nemesis faults shaded by kind")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@click.command(context_settings=CONTEXT)
@click.option("--minutes", type=float, required=True, help="how long the nemesis runs")
@click.option("--seed", type=int, default=None, help="the nemesis's seed (default: a random one, printed)")
@click.option("--nodes", type=click.Choice(["3", "5"]), default="3", show_default=True, help="members of the group")
@click.option("--interval", type=float, default=5.0, show_default=True, help="seconds between samples")
@click.option("--stock-python", envvar="LEDGERMQ_COMPAT_PYTHON", show_envvar=True,
              help="the compat venv's python: the stock C++ client sends too")
@click.option("--out", default=None, help="where soak.json, soak.png and the stores go")
def command(minutes: float, seed: int | None, nodes: str, interval: float, stock_python: str | None,
            out: str | None) -> int:
    """ledgermq soak under the nemesis."""
    seed = seed if seed is not None else random.SystemRandom().randrange(2 ** 32)
    out = os.path.abspath(out or tempfile.mkdtemp(prefix="ledgermq-soak-"))
    os.makedirs(out, exist_ok=True)
    kinds = default_kinds()
    print(f"soak: seed {seed}, {minutes} min, {nodes} nodes, kinds {','.join(kinds)}, out {out}", flush=True)
    samples: list[Sample] = []
    opts = RunOptions(os.path.join(out, "cluster"), seed, None, minutes * 60, int(nodes), kinds, stock_python)
    verdict, history, nemesis = trio.run(lambda: run_chaos(
        opts, sampler=make_sampler(samples, interval),
        on_cycle=lambda n, f: print(f"  cycle {n}: {f.what}", flush=True)))
    return report(out, seed, minutes, verdict, samples, nemesis.faults, history.t0)


def report(out: str, seed: int, minutes: float, verdict, samples: list[Sample], faults, t0: float) -> int:
    """Write soak.json and soak.png, print the summary, and return the exit
    status: 0 only when the verdict is clean and nothing grew unbounded.
    The chart is optional: without matplotlib (or if drawing fails) one
    line says it was skipped and the verdict stands."""
    growth = bounded(samples, "anon") + bounded(samples, "other_fds")
    peak_rss = {n: max(s.rss.get(n, 0) for s in samples) for s in samples for n in s.rss}
    peak_fds = {n: max(s.fds.get(n, 0) for s in samples) for s in samples for n in s.fds}
    peak_anon = {n: max(s.anon.get(n, 0) for s in samples) for s in samples for n in s.anon}
    peak_other = {n: max(s.other_fds.get(n, 0) for s in samples) for s in samples for n in s.fds}
    with open(os.path.join(out, "soak.json"), "w") as f:
        json.dump({"seed": seed, "minutes": minutes, "verdict": verdict.as_dict(),
                   "peak_rss": peak_rss, "peak_anon": peak_anon, "peak_fds": peak_fds,
                   "peak_fds_not_store": peak_other, "growth": growth,
                   "faults": [attrs.asdict(x) for x in faults],
                   "samples": [attrs.asdict(s) for s in samples]}, f, default=str)
    written = [f"{out}/soak.json"]
    try:
        chart(os.path.join(out, "soak.png"), samples, faults, t0)
        written.append(f"{out}/soak.png")
    except ImportError:
        print("chart skipped: matplotlib is not installed (pip install 'ledgermq[bench]')")
    except Exception as exc:  # noqa: BLE001 - a drawing bug must not cost the run its verdict
        print(f"chart skipped: drawing it failed: {type(exc).__name__}: {exc}")
    print(verdict.summary())
    print("peak RSS MiB: " + ", ".join(f"{n} {v / 2 ** 20:.0f}" for n, v in sorted(peak_rss.items())))
    print("peak anonymous RSS (heap) MiB: " + ", ".join(f"{n} {v / 2 ** 20:.0f}" for n, v in sorted(peak_anon.items())))
    print("peak open fds: " + ", ".join(f"{n} {v}" for n, v in sorted(peak_fds.items())))
    print("peak open fds other than store files: " + ", ".join(f"{n} {v}" for n, v in sorted(peak_other.items())))
    for g in growth:
        print(f"PROBLEM: unbounded: {g}")
    print(f"wrote {' and '.join(written)}")
    return 0 if verdict.ok and not growth else 1


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.chaos.soak")


if __name__ == "__main__":
    sys.exit(main())
