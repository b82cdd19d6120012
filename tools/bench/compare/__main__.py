# Owns the command line of the ledgermq-vs-NATS JetStream comparison and
# the order of the rounds:
#
#   python -m tools.bench.compare [--rounds N] [--quick] [--json] [--chart PATH] [--out DIR]
#
# Each round measures both systems, one after the other and never both
# running at once (each side starts its clusters in a fresh temp dir and
# stops them before returning); the order alternates between rounds so a
# machine that warms up or gets busier does not favour one side.  The
# ledgermq side runs under trio, the NATS side under asyncio (nats-py).
# Progress goes to stderr, so `--json` leaves one JSON object on stdout.
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
import types

import attrs
import click
import trio

from tools.bench.compare import ledgermq_side, nats_side, report
from tools.bench.compare.common import workload
from tools.cli import CONTEXT, run_command


def run_side(side: str, w) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"lmq-compare-{side}-") as root:
        if side == "ledgermq":
            return trio.run(ledgermq_side.run_round, root, w)
        return asyncio.run(nats_side.run_round(root, w))


@click.command(context_settings=CONTEXT)
@click.option("--rounds", type=click.IntRange(1), default=None, help="alternating rounds (default 3; 1 with --quick)")
@click.option("--quick", is_flag=True, help="smoke test: 1 round, a few hundred messages per row")
@click.option("--json", is_flag=True, help="print one JSON object with every figure")
@click.option("--chart", default=None, help="PNG path (default compare.png in --out or the current dir)")
@click.option("--out", default=None, help="directory for the chart and compare.json")
def command(**kw) -> int:
    """ledgermq vs NATS JetStream, 3 replicas each, on 127.0.0.1."""
    args = types.SimpleNamespace(**kw)
    # SIGTERM unwinds like Ctrl-C, so every cluster's finally stops what it started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    rounds_n = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    w = workload(args.quick)
    out_dir = args.out or "."
    os.makedirs(out_dir, exist_ok=True)
    chart_path = args.chart or os.path.join(out_dir, "compare.png")

    rounds = []
    t_start = time.perf_counter()
    for i in range(rounds_n):
        order = ["ledgermq", "nats"] if i % 2 == 0 else ["nats", "ledgermq"]
        rec: dict = {"round": i + 1, "order": order}
        for side in order:
            t0 = time.perf_counter()
            print(f"round {i + 1}/{rounds_n}: {side} ...", file=sys.stderr, flush=True)
            rec[side] = run_side(side, w)
            print(f"round {i + 1}/{rounds_n}: {side} done in {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)
        rounds.append(rec)

    summary = report.summarize(rounds)
    result = {
        "config": {"rounds": rounds_n, "quick": args.quick, "workload": attrs.asdict(w),
                   "message_bytes": 1024, "replicas": 3, "host": "127.0.0.1",
                   "ledgermq": "name server + 3 mqbroker (DLedger), ASYNC_FLUSH; fsync rows SYNC_FLUSH",
                   "nats": "3 nats-server, stream R3 file storage; fsync rows sync_interval: always",
                   "seconds": round(time.perf_counter() - t_start, 1)},
        "rows": summary,
        "rss_mb": report.peak_rss(rounds),
        "rounds": rounds,
    }
    report.chart(summary, chart_path, f"ledgermq vs NATS JetStream, 3 replicas, 1 KiB messages, "
                                      f"{rounds_n} round(s): medians, min-max bars")
    result["chart"] = os.path.abspath(chart_path)
    if args.out:
        with open(os.path.join(args.out, "compare.json"), "w") as f:
            json.dump(result, f, indent=1)
    if args.json:
        print(json.dumps(result))
    else:
        report.print_report(result)
    return 0


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.bench.compare")


if __name__ == "__main__":
    sys.exit(main())
