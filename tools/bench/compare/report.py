# Owns turning the rounds of the comparison into figures: medians with
# min-max across rounds for every row and both systems, the ratio
# ledgermq/NATS, CPU microseconds per message of every server process (by
# role: master/slaves/name server, leader/followers) and of the client,
# server RSS; printed as tables, returned as one JSON-able dict, and drawn
# as a PNG (matplotlib, Agg backend: no display needed).
import statistics

from tools.bench.compare.common import ROWS

SIDES = ("ledgermq", "nats")
LABEL = {"ledgermq": "ledgermq", "nats": "NATS"}
ROLES = {"ledgermq": ["master", "slave1", "slave2", "namesrv", "client"],
         "nats": ["leader", "follower1", "follower2", "client"]}
SERVER_ROLES = {side: [r for r in roles if r != "client"] for side, roles in ROLES.items()}
METRICS = {"mps": [("mps", "msg/s")], "latency": [("p50_ms", "p50 ms"), ("p99_ms", "p99 ms")],
           "failover": [("seconds", "s")]}


def stats(values) -> dict | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": round(statistics.median(vals), 3), "min": round(min(vals), 3), "max": round(max(vals), 3),
            "n": len(vals)}


def _figures(rounds: list[dict], side: str, row: str) -> list[dict]:
    return [r[side][row] for r in rounds if row in r.get(side, {})]


def summarize(rounds: list[dict]) -> dict:
    """row -> {"kind", "title", "what": {side: ...}, metric -> {side: stats,
    "ratio": ledgermq/NATS of the medians}, "cpu_us": {side: {role: stats}}}"""
    out = {}
    for row in ROWS:
        s: dict = {"kind": row.kind, "title": row.title, "higher_is_better": row.kind == "mps",
                   "what": {"ledgermq": row.ledgermq, "nats": row.nats}}
        for metric, _unit in METRICS[row.kind]:
            m = {side: stats(f.get(metric) for f in _figures(rounds, side, row.key)) for side in SIDES}
            a, b = m["ledgermq"], m["nats"]
            m["ratio_ledgermq_over_nats"] = round(a["median"] / b["median"], 3) if a and b and b["median"] else None
            s[metric] = m
        if row.kind != "failover":
            s["cpu_us"] = {}
            for side in SIDES:
                figs = _figures(rounds, side, row.key)
                per_role = {role: stats(f.get("cpu_us", {}).get(role) for f in figs) for role in ROLES[side]}
                per_role["servers_total"] = stats(
                    sum(f["cpu_us"][r] for r in SERVER_ROLES[side] if r in f["cpu_us"]) if f.get("cpu_us") else None
                    for f in figs)
                s["cpu_us"][side] = per_role
        else:
            s["details"] = {side: _figures(rounds, side, row.key) for side in SIDES}
        out[row.key] = s
    return out


def peak_rss(rounds: list[dict]) -> dict:
    """side -> role -> stats of each round's peak RSS (MB) over its phases."""
    out = {}
    for side in SIDES:
        per_role = {}
        for role in SERVER_ROLES[side]:
            peaks = []
            for r in rounds:
                seen = [f["rss_mb"][role] for f in r.get(side, {}).values()
                        if isinstance(f, dict) and role in f.get("rss_mb", {})]
                peaks.append(max(seen) if seen else None)
            per_role[role] = stats(peaks)
        out[side] = per_role
    return out


# --- text ---------------------------------------------------------------------------------

def _num(v: float | None, unit: str) -> str:
    if v is None:
        return "n/a"
    if unit == "msg/s":
        return f"{v:,.0f}"
    return f"{v:.3g}" if v < 10 else f"{v:.1f}"


def _cell(st: dict | None, unit: str) -> str:
    if st is None:
        return "n/a"
    if st["n"] == 1:
        return _num(st["median"], unit)
    return f"{_num(st['median'], unit)} ({_num(st['min'], unit)}-{_num(st['max'], unit)})"


def table_rows(summary: dict) -> list[tuple[str, str, str, str, str]]:
    """(workload, metric, ledgermq, NATS, ratio) strings, also used for the README."""
    lines = []
    for row in ROWS:
        s = summary[row.key]
        for i, (metric, unit) in enumerate(METRICS[row.kind]):
            m = s[metric]
            ratio = m["ratio_ledgermq_over_nats"]
            better = "higher is better" if row.kind == "mps" else "lower is better"
            lines.append((row.title if i == 0 else "", f"{unit} ({better})", _cell(m["ledgermq"], unit),
                          _cell(m["nats"], unit), f"{ratio:.3g}x" if ratio is not None else "n/a"))
    return lines


def print_report(result: dict) -> None:
    summary, rounds = result["rows"], result["rounds"]
    n = len(rounds)
    print(f"ledgermq vs NATS JetStream: 3 servers each on 127.0.0.1, 3 replicas, 1 KiB messages, {n} round(s) "
          f"alternating which system goes first; medians (min-max) across rounds")
    print("ratio = ledgermq / NATS of the medians: for msg/s below 1 means ledgermq is slower, "
          "for ms and s above 1 means ledgermq is slower\n")
    head = ("workload", "metric", "ledgermq", "NATS", "ratio")
    lines = table_rows(summary)
    widths = [max(len(x[i]) for x in [head, *lines]) for i in range(5)]
    for x in [head, *lines]:
        print("  ".join(c.ljust(widths[i]) for i, c in enumerate(x)).rstrip())

    print("\nCPU microseconds per message, medians across rounds (leader/master named per round below):")
    cols = [("ledgermq", r) for r in [*SERVER_ROLES["ledgermq"], "servers_total", "client"]] + \
           [("nats", r) for r in [*SERVER_ROLES["nats"], "servers_total", "client"]]
    head = ["workload", *(f"{'L' if s == 'ledgermq' else 'N'}:{r.replace('servers_total', 'servers')}"
                          for s, r in cols)]
    body = []
    for row in ROWS:
        if row.kind == "failover":
            continue
        cpu = summary[row.key]["cpu_us"]
        body.append([row.title, *(_num((cpu[s].get(r) or {}).get("median"), "us") for s, r in cols)])
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head))]
    for x in [head, *body]:
        print("  ".join(str(c).rjust(widths[i]) if i else str(c).ljust(widths[i]) for i, c in enumerate(x)))
    print("  (L: ledgermq, N: NATS; servers = sum over the server processes; client = this process)")

    rss = result["rss_mb"]
    print("\nserver RSS, peak over a round's phases, MB (median across rounds): " + "; ".join(
        f"{LABEL[side]} " + ", ".join(f"{role} {_num((st or {}).get('median'), 'MB')}" for role, st in roles.items())
        for side, roles in rss.items()))
    for side in SIDES:
        fo = summary["failover"]["details"][side]
        per_round = ", ".join(f"{f.get('seconds')} s (killed {f.get('killed')}, new "
                              f"{f.get('new_master', f.get('new_leader'))})" for f in fo)
        print(f"failover {LABEL[side]}: {per_round}")
    for i, r in enumerate(rounds, 1):
        print(f"round {i}: order {' then '.join(LABEL[s] for s in r['order'])}; ledgermq master "
              f"{r['ledgermq']['nodes']['master']}, NATS stream leader {r['nats']['nodes']['leader']}")
    errors = {(side, row.key): sum(r[side][row.key].get("errors", 0) for r in rounds)
              for side in SIDES for row in ROWS if row.kind != "failover"}
    if any(errors.values()):
        print("errors (summed over rounds): " + ", ".join(f"{LABEL[s]} {k} {v}" for (s, k), v in errors.items() if v))
    if result.get("chart"):
        print(f"\nchart: {result['chart']}")


# --- chart ----------------------------------------------------------------------------------

def chart(summary: dict, path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"ledgermq": "#d9534f", "nats": "#337ab7"}
    thr = [r for r in ROWS if r.kind == "mps"]
    lat = [(r, metric) for r in ROWS if r.kind == "latency" for metric, _ in METRICS["latency"]]
    fig, axes = plt.subplots(1, 3, figsize=(17, 6.5), gridspec_kw={"width_ratios": [len(thr), len(lat), 1.3]})

    def bars(ax, labels, getter) -> None:
        width = 0.4
        for k, side in enumerate(SIDES):
            med, lo, hi = [], [], []
            for item in getter:
                st = item(side)
                m = st["median"] if st else 0
                med.append(m)
                lo.append(m - st["min"] if st else 0)
                hi.append(st["max"] - m if st else 0)
            xs = [i + (k - 0.5) * width for i in range(len(labels))]
            ax.bar(xs, med, width, yerr=[lo, hi], capsize=2, color=colors[side], label=LABEL[side])
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)

    bars(axes[0], [r.title for r in thr], [lambda side, r=r: summary[r.key]["mps"][side] for r in thr])
    axes[0].set_yscale("log")
    low = [summary[r.key]["mps"][side]["min"] for r in thr for side in SIDES if summary[r.key]["mps"][side]]
    if low:  # bars on a log axis start at its bottom: put it well below the smallest one
        axes[0].set_ylim(bottom=min(low) / 4)
    axes[0].set_ylabel("messages/s (log scale, higher is better)")
    axes[0].set_title("throughput")
    axes[0].legend()
    bars(axes[1], [f"{r.title} {metric.split('_')[0]}" for r, metric in lat],
         [lambda side, r=r, metric=metric: summary[r.key][metric][side] for r, metric in lat])
    axes[1].set_yscale("log")
    axes[1].set_ylabel("ms (log scale, lower is better)")
    axes[1].set_title("latency")
    bars(axes[2], ["kill -9 leader"], [lambda side: summary["failover"]["seconds"][side]])
    axes[2].set_ylabel("s to first ack (lower is better)")
    axes[2].set_title("failover")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
