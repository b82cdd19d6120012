# Owns how one pytest process takes its share of the tests when
# tests/run_suite.py runs each half of the suite (the tests marked slow,
# and the quick ones) as shards side by side (a pytest plugin:
# `-p tests.sharding --shard I/N --shard-kind slow|quick`).  Every shard collects the same
# tests and splits them the same way, so the shards never overlap and
# together run every selected test:
#   * whole files, so that a module's fixtures (a cluster for the module)
#     start once, and whole TOGETHER folders for a package's fixtures;
#   * balanced by each file's seconds in the last run (--shard-known, a JSON
#     map file -> seconds that run_suite keeps per half), else that half's
#     seed below (SEED, QUICK_SEED), else its default: longest first, each
#     to the shard with the least so far;
#   * with --shard-times PATH, the shard writes how long each of its tests
#     took (setup + call + teardown) and which failed there, for
#     run_suite's report and its next split.
import json
from collections import defaultdict
from pathlib import Path

import pytest

# Seconds per file of the slow tests, from the last recorded `make test`
# (the 15 slowest) and runs of single files; only for a tree with no
# recorded run yet.
SEED = {
    "tests/broker/compat/test_planned_operations.py": 110.0,
    "tests/broker/compat/test_stock_broker.py": 85.0,
    "tests/tools/pipeline/test_pipeline_cluster.py": 85.0,
    "tests/tools/chaos/test_nemesis.py": 60.0,
    "tests/tools/mqadmin/test_online.py": 50.0,
    "tests/broker/compat/test_stock_features.py": 48.0,
    "tests/broker/test_multi_group.py": 40.0,
    "tests/tools/migrate/test_mixed.py": 31.0,
    "tests/tools/test_bench_compare.py": 28.0,
    "tests/commitlog/test_cluster_chaos.py": 21.0,
    "tests/broker/store/test_disk_full.py": 15.0,
    "tests/broker/client/test_client_groups.py": 13.0,
    "tests/broker/client/test_client_roundtrip.py": 13.0,
    "tests/broker/store/test_schedule.py": 12.0,
    "tests/tools/test_cli_errors.py": 27.0,
    "tests/broker/client/test_send_async.py": 16.0,
    "tests/broker/test_send_forwarding.py": 16.5,
    "tests/tools/dashboard/test_browser.py": 12.5,
    "tests/tools/chaos/test_live_fuzz.py": 12.5,
    "tests/commitlog/test_cluster_processes.py": 12.0,
    "tests/broker/test_send_failover.py": 11.0,
    "tests/tools/test_brokercluster.py": 10.0,
    "tests/broker/client/test_client_failover.py": 9.0,
    "tests/broker/namesrv/test_cli.py": 6.0,
}
DEFAULT = 8.0

# The same for the tests not marked slow: seconds of each file's quick
# tests (those of 2 s or more), measured in one process under nice beside
# other work; the other 104 files took 0.5 s on average (QUICK_DEFAULT).
QUICK_SEED: dict[str, float] = {
    "tests/tools/pipeline/test_pipeline_incremental.py": 62.3,
    "tests/commitlog/raft/test_sim_seeds.py": 58.2,
    "tests/tools/pipeline/test_pipeline_cli.py": 43.9,
    "tests/broker/processors/test_send_native.py": 20.6,
    "tests/tools/pipeline/test_pipeline_legacy.py": 13.8,
    "tests/tools/mqadmin/test_units.py": 13.7,
    "tests/tools/pipeline/test_pipeline_jobs.py": 13.5,
    "tests/test_sharding.py": 13.1,
    "tests/broker/pop/test_pop_broker.py": 12.9,
    "tests/broker/proxy/test_protocol.py": 11.9,
    "tests/tools/migrate/test_offline.py": 9.5,
    "tests/commitlog/test_fuzz_recovery.py": 8.5,
    "tests/broker/timer/test_timer_tcp.py": 8.0,
    "tests/broker/remoting/test_hostile.py": 7.4,
    "tests/commitlog/test_admission.py": 7.1,
    "tests/consumequeue/test_fuzz_cq.py": 6.8,
    "tests/tools/pipeline/test_pipeline_stage.py": 6.4,
    "tests/broker/timer/test_timer_group.py": 5.9,
    "tests/broker/processors/test_pull.py": 5.9,
    "tests/broker/remoting/test_codec.py": 5.6,
    "tests/test_hygiene.py": 5.1,
    "tests/broker/client/test_transport.py": 5.0,
    "tests/tools/chaos/test_hostile_decoders.py": 4.9,
    "tests/tools/chaos/test_fuzz_decoders.py": 4.7,
    "tests/test_cli_hygiene.py": 4.1,
    "tests/consumequeue/test_dispatch.py": 4.0,
    "tests/broker/acl/test_bypasses.py": 3.9,
    "tests/tools/mqadmin/test_cq.py": 3.6,
    "tests/tools/migrate/test_replicated.py": 3.5,
    "tests/native/test_dispatch.py": 3.4,
    "tests/broker/proxy/test_hostile.py": 3.3,
    "tests/consumequeue/test_record.py": 3.2,
    "tests/tools/test_console_scripts.py": 3.2,
    "tests/commitlog/test_store_basic.py": 3.1,
    "tests/broker/store/test_transaction.py": 3.1,
    "tests/tools/mqadmin/test_store.py": 3.0,
    "tests/test_dead_code.py": 2.6,
    "tests/commitlog/raft/test_sim_membership.py": 2.6,
    "tests/broker/store/test_gate.py": 2.4,
    "tests/commitlog/test_hostile_peers.py": 2.4,
    "tests/commitlog/test_recovery.py": 2.4,
    "tests/broker/namesrv/test_service.py": 2.3,
}
QUICK_DEFAULT = 0.5
SEEDS = {"slow": (SEED, DEFAULT), "quick": (QUICK_SEED, QUICK_DEFAULT)}


def pytest_addoption(parser):
    group = parser.getgroup("ledgermq shards")
    group.addoption("--shard", default=None, metavar="I/N", help="run the I-th (0-based) of N shards of the tests")
    group.addoption("--shard-kind", default="slow", choices=sorted(SEEDS),
                    help="which half's seed weights to use for files with no recorded time")
    group.addoption("--shard-known", default=None, metavar="PATH", help="JSON file -> seconds of the last run")
    group.addoption("--shard-times", default=None, metavar="PATH", help="write this shard's test durations here")


def _file(item) -> str:
    return item.nodeid.split("::", 1)[0]


# Folders whose files go to one shard together: they share a package-scoped
# fixture that is costly to start twice (the pipeline's SparkSession, a JVM
# of 5-10 s start that runs local[2] jobs).
TOGETHER = ("tests/tools/pipeline/",)


def _unit(f: str) -> str:
    return next((d for d in TOGETHER if f.startswith(d)), f)


def split(files: list[str], weights: dict[str, float], n: int) -> dict[str, int]:
    """file -> shard: whole units (a file, or a TOGETHER folder's files),
    longest first, each to the least loaded shard (ties by name and index,
    so every shard computes the same split)."""
    units: dict[str, list[str]] = defaultdict(list)
    for f in files:
        units[_unit(f)].append(f)
    weight = {u: sum(weights[f] for f in fs) for u, fs in units.items()}
    load = [0.0] * n
    owner = {}
    for u in sorted(units, key=lambda u: (-weight[u], u)):
        k = min(range(n), key=lambda k: (load[k], k))
        owner.update(dict.fromkeys(units[u], k))
        load[k] += weight[u]
    return owner


def _known(path: str | None) -> dict[str, float]:
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float))} if isinstance(data, dict) else {}


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(config, items):
    spec = config.getoption("--shard")
    if not spec:
        return
    try:
        i, n = (int(x) for x in spec.split("/"))
        assert 0 <= i < n
    except (ValueError, AssertionError):
        raise pytest.UsageError(f"--shard wants I/N with 0 <= I < N, not {spec!r}") from None
    files = list(dict.fromkeys(_file(it) for it in items))
    known = _known(config.getoption("--shard-known"))
    seed, default = SEEDS[config.getoption("--shard-kind")]
    owner = split(files, {f: known.get(f, seed.get(f, default)) for f in files}, n)
    keep = [it for it in items if owner[_file(it)] == i]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[it for it in items if owner[_file(it)] != i])
        items[:] = keep


class _Times:
    """{"seconds": {nodeid: setup + call + teardown}, "failed": [nodeid]}:
    a test that failed often failed fast, so its time says nothing about
    the next run's (run_suite keeps no time for its file)."""
    def __init__(self, path: str) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)
        self.failed: set[str] = set()

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] += report.duration
        if report.failed:
            self.failed.add(report.nodeid)

    def pytest_sessionfinish(self, session):
        Path(self.path).write_text(json.dumps({"seconds": self.seconds, "failed": sorted(self.failed)}))


def pytest_configure(config):
    path = config.getoption("--shard-times")
    if path:
        config.pluginmanager.register(_Times(path), "ledgermq-shard-times")
