# What an operator deploys from the repository: the sample configs
# (conf/dledger/broker-n*.conf, conf/namesrv.conf) load without a warning
# and form one group, whose members authenticate each other with the peer
# secret file the samples name; the systemd units start the console scripts with
# those configs (and systemd itself accepts the files); the package carries
# its license, classifiers and py.typed markers; the README's table of
# request codes is the one the code generates.
import configparser
import shutil
import subprocess
import tomllib

from broker.config import load_broker_config
from broker.namesrv.service import load_namesrv_config
from tests.helpers import REPO_ROOT
from tools import codes_table

CONF = REPO_ROOT / "conf"
UNITS = REPO_ROOT / "deploy" / "systemd"


SECRET_FILE = "/etc/ledgermq/peer.secret"


def installed(sample: str, tmp_path) -> str:
    """The sample as installed: its peer secret file created (here under
    tmp_path, where the sample names /etc/ledgermq/peer.secret)."""
    text = (CONF / "dledger" / sample).read_text()
    assert f"dLegerPeerSecretFile = {SECRET_FILE}\n" in text, f"{sample} carries no peer secret"
    secret = tmp_path / "peer.secret"
    if not secret.exists():
        secret.write_text("c2FtcGxlLXNlY3JldC1mb3ItdGhlLXRlc3Q=\n")
    path = tmp_path / sample
    path.write_text(text.replace(SECRET_FILE, str(secret)))
    return str(path)


def test_sample_dledger_group_loads_cleanly_and_is_one_group(tmp_path):
    cfgs = []
    for i in range(3):
        cfg, warnings = load_broker_config(installed(f"broker-n{i}.conf", tmp_path))
        assert warnings == [], (i, warnings)
        assert cfg.replication.peer_auth() is not None, i   # the group authenticates its peers
        cfgs.append(cfg)
    assert [c.self_id for c in cfgs] == ["n0", "n1", "n2"]
    assert len({c.replication.peers for c in cfgs}) == 1 and len({c.broker_name for c in cfgs}) == 1
    assert set(cfgs[0].replication.peer_ids) == {"n0", "n1", "n2"}
    for attr in ("listen_port", "store_path_root_dir", "log_dir"):
        assert len({getattr(c, attr) for c in cfgs}) == 3, attr  # the nodes may share a machine
    assert len({c.metrics.prom_port for c in cfgs}) == 3 and all(c.metrics.enabled for c in cfgs)
    ns, warnings = load_namesrv_config(str(CONF / "namesrv.conf"))
    assert warnings == [] and ns.listen_port == 9876 and ns.metrics.enabled
    assert all(c.namesrv_addr == (f"127.0.0.1:{ns.listen_port}",) for c in cfgs)


def _unit(name: str) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(UNITS / name)
    return unit


def test_systemd_units_run_the_commands_on_the_sample_configs():
    ns = _unit("ledgermq-namesrv.service")
    assert ns["Service"]["ExecStart"].split() == ["/opt/ledgermq/bin/mqnamesrv", "-c", "/etc/ledgermq/namesrv.conf"]
    broker = _unit("ledgermq-broker@.service")
    start = broker["Service"]["ExecStart"].split()
    assert start == ["/opt/ledgermq/bin/mqbroker", "-c", "/etc/ledgermq/dledger/broker-%i.conf"]
    assert broker["Service"]["ExecStartPre"].split()[1:3] == ["--check-config", "--strict"]
    assert "ledgermq-namesrv.service" in broker["Unit"]["After"]
    for i in range(3):  # each instance name has its sample
        assert (CONF / "dledger" / start[2].rsplit("/", 1)[1].replace("%i", f"n{i}")).exists()
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"mqnamesrv", "mqbroker", "mqadmin", "mqbench"} <= set(scripts)
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        return  # the content checks above still ran
    for unit in ("ledgermq-namesrv.service", "ledgermq-broker@.service"):
        r = subprocess.run([analyze, "verify", str(UNITS / unit)], capture_output=True, text=True, timeout=60)
        problems = [line for line in (r.stdout + r.stderr).splitlines()
                    if line.strip() and "is not executable" not in line]  # not installed on this machine
        assert problems == [], problems


def test_package_metadata():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert (REPO_ROOT / "LICENSE").read_text().split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "Typing :: Typed" in project["classifiers"] and project["urls"]
    assert any(d.startswith("prometheus-client") for d in project["dependencies"])
    for package in ("broker", "commitlog", "consumequeue", "native", "tools"):
        assert (REPO_ROOT / package / "py.typed").exists(), package


def test_readme_request_code_table_is_generated():
    readme = (REPO_ROOT / "README.md").read_text()
    assert codes_table.rewrite(readme) == readme, "run: python -m tools.codes_table --write"
    table = codes_table.table()
    for line in ("| 315 | VIEW_BROKER_STATS_DATA | answered |", "| 300 | QUERY_TOPIC_CONSUME_BY_WHO | answered |",
                 "| 201 | GET_ALL_SUBSCRIPTIONGROUP_CONFIG | answered |",
                 "| 224 | GET_TOPICS_BY_CLUSTER | refused | answered |",
                 "| 307 | GET_CONSUMER_RUNNING_INFO | answered | refused | answered |",
                 "| 37 | END_TRANSACTION | answered | refused | - |", "| 41 | LOCK_BATCH_MQ | answered | refused | - |",
                 "| 46 | CHECK_CLIENT_CONFIG | answered | refused | - |",
                 "| 39 | CHECK_TRANSACTION_STATE | refused | refused | answered |"):
        assert line in table, line
