# Owns the README's table of metric names, generated from the catalogue the
# broker's collector builds its families from (broker/telemetry/catalog.py),
# so the list cannot drift from what a scrape shows:
#
#   metrics:begin/end   every family a broker serves (type, labels, which
#                       nodes export it, whose name it is), then the
#                       rocketmq-exporter and RocketMQ 5 names that are not
#                       served and why
#
#   python -m tools.metrics_table            print the table (markdown)
#   python -m tools.metrics_table --write    rewrite it in README.md, between
#                                            its begin / end markers
# tests/broker/telemetry/test_metrics_table.py fails when README.md is not up
# to date.
import os
import sys

import click

from broker.telemetry import catalog as C
from tools.cli import CONTEXT, run_command

BEGIN, END = "<!-- metrics:begin (python -m tools.metrics_table --write) -->", "<!-- metrics:end -->"


def _labels(spec: C.Spec) -> str:
    for common in (C.RUNTIME, C.RMQ5, C.BASE):
        if spec.labels[:len(common)] == common:
            rest = spec.labels[len(common):]
            head = {C.BASE: "(base)", C.RMQ5: "(rmq5)", C.RUNTIME: "(runtime)"}[common]
            return " ".join([head, *(f"`{label}`" for label in rest)])
    return " ".join(f"`{label}`" for label in spec.labels)


def _md(text: str) -> str:
    return text.replace("|", "/").replace("<", "&lt;").replace(">", "&gt;")


def table() -> str:
    served_exporter = C.served_names(C.EXPORTER)
    exporter_total = len(served_exporter) + len(C.EXPORTER_NOT_SERVED)
    served_rmq5 = C.served_names(C.ROCKETMQ5)
    rmq5_total = len(served_rmq5) + len(C.ROCKETMQ5_NOT_SERVED)
    out = [
        f"Served: {len(C.SERVED)} families; of rocketmq-exporter's {exporter_total} names {len(served_exporter)}, "
        f"of RocketMQ 5's {rmq5_total} {len(served_rmq5)}. Labels: (base) is `cluster` `broker`; (rmq5) is "
        "`cluster` `node_type` (broker) `node_id` (the brokerName) `broker`; (runtime) is the exporter's "
        "`cluster` `brokerIP` `brokerHost` `des` `boottime` `broker_version`, plus `broker`. Nodes: *master* "
        "means only the writable master exports it (the group's data), *node* every member (what that node "
        "did or has).",
        "",
        "| Metric | Type | Labels | Nodes | Name from | What |",
        "|---|---|---|---|---|---|",
    ]
    for spec in C.SERVED:
        out.append(f"| `{spec.name}` | {spec.kind} | {_labels(spec)} | {spec.scope} | {spec.origin} | "
                   f"{_md(spec.doc)} |")
    for prefix, what in C.FOREIGN_PREFIXES:
        out.append(f"| `{prefix}*` | | | node | ledgermq | {what} |")
    out += ["", f"Not served, of rocketmq-exporter's names ({len(C.EXPORTER_NOT_SERVED)}):", ""]
    out += [f"- `{name}`: {_md(why)}" for name, why in sorted(C.EXPORTER_NOT_SERVED.items())]
    out += ["", f"Not served, of RocketMQ 5's names ({len(C.ROCKETMQ5_NOT_SERVED)}):", ""]
    out += [f"- `{name}`: {_md(why)}" for name, why in sorted(C.ROCKETMQ5_NOT_SERVED.items())]
    return "\n".join(out)


def rewrite(readme: str) -> str:
    """README text with the part between the markers replaced by table()."""
    head, sep, rest = readme.partition(BEGIN)
    if not sep:
        raise ValueError(f"README.md has no {BEGIN!r}")
    _, sep, tail = rest.partition(END)
    if not sep:
        raise ValueError(f"README.md has no {END!r}")
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


@click.command(context_settings=CONTEXT)
@click.option("--write", is_flag=True, help="update README.md in place")
def command(write: bool) -> int:
    """Print the README's table of metric names (markdown), or rewrite it in
    README.md between its begin/end markers."""
    if not write:
        print(table())
        return 0
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
    with open(path, encoding="utf-8") as f:
        readme = f.read()
    new = rewrite(readme)
    if new != readme:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
    return 0


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.metrics_table")


if __name__ == "__main__":
    sys.exit(main())
