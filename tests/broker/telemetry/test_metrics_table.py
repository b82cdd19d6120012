# The README's metric names come from broker/telemetry/catalog.py through
# tools/metrics_table.py (`python -m tools.metrics_table --write`); this
# fails when README.md was not rewritten after the catalogue changed.  That
# the catalogue is what a broker serves: test_catalog.py.
from broker.telemetry import catalog as C
from tests.helpers import REPO_ROOT
from tools import metrics_table


def test_readme_metric_names_are_generated():
    readme = (REPO_ROOT / "README.md").read_text()
    assert metrics_table.BEGIN in readme and metrics_table.END in readme
    assert metrics_table.rewrite(readme) == readme, "run: python -m tools.metrics_table --write"


def test_the_table_lists_every_name_once_with_its_nodes():
    table = metrics_table.table()
    for spec in C.SERVED:
        rows = [line for line in table.splitlines() if line.startswith(f"| `{spec.name}` |")]
        assert len(rows) == 1, spec.name
        assert f"| {spec.scope} | {spec.origin} |" in rows[0]
    for name in [*C.EXPORTER_NOT_SERVED, *C.ROCKETMQ5_NOT_SERVED]:
        assert f"- `{name}`: " in table
        assert name not in C.BY_NAME  # never both served and not
    # the stock alert's name and RocketMQ 5's label for the group are served
    assert "| `rocketmq_group_get_latency_by_storetime` | gauge | (base) `topic` `group` | master |" in table
    assert C.BY_NAME["rocketmq_messages_out_total"].labels[-3:] == ("consumer_group", "is_retry", "is_system")
