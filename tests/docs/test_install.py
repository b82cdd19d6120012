# README "Installing on Debian 12 (systemd)", followed as written: the
# block marked `<!-- install -->` runs under bash, then the units it
# installed are "started" the way `systemctl enable --now` would start
# them, then the block marked `<!-- install-check -->` must pass against
# the group they formed.
#
# All in a temporary root standing in for `/`: every absolute /opt/, /etc/
# and /var/ path of the blocks, the units and the installed configs is
# rewritten under it (REWRITES), and the host's /etc and /opt are never
# touched.  What this machine does not allow is replaced, and said here:
# - `apt-get`, `chown` and `systemctl` are recorded, not run (bash
#   functions); the recorded `systemctl enable --now` names the units
#   started below.
# - `systemd-sysusers` runs for real with --root=<root>: the user lands in
#   <root>/etc/passwd, never the host's.
# - `pip install` runs for real in the venv the documented `python3 -m venv`
#   made, building the package (and its C helpers) from a copy of the
#   checkout, but offline: --no-index, with the dependencies taken from
#   the development venv (what `make setup` fetched) through a .pth file.
# - The services run as the current user, not User=ledgermq, and systemd's
#   part is done here: StateDirectory/LogsDirectory/ConfigurationDirectory
#   created under the root, %i substituted, ExecStartPre run (and required
#   to exit 0) before ExecStart, KillSignal sent at the end (a clean stop
#   is exit 0).  The samples' fixed ports are replaced by free ones, since
#   other tests share this machine.
# - `systemd-analyze verify` checks the installed units with their
#   ExecStart paths pointing into the root (so the executables exist).
# Slow: creating the venv and building the package take most of its ~40 s
# (real processes: pip, gcc, a name server and three brokers).
import configparser
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
import trio

from broker.namesrv.client import NamesrvClient
from broker.remoting.client import open_remoting_client
from broker.remoting.errors import RemotingError
from tests.helpers import REPO_ROOT
from tests.helpers.waiting import wait_until
from tools.localcluster import free_ports

pytestmark = pytest.mark.slow

README = (REPO_ROOT / "README.md").read_text()
SCRIPTS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]

# The absolute paths the documented steps write to, moved under the root.
ABSOLUTE = re.compile(r"(?<![\w.$/-])/(opt|etc|var)/")
# What a clean Debian 12 system has before the steps run.
DEBIAN_LAYOUT = ("etc/systemd/system", "opt", "var/lib", "var/log")
# The one step whose command changes: pip, offline (see the header).
REWRITES = [("/opt/ledgermq/bin/pip install", "offline_pip install")]

PREAMBLE = r"""
set -euo pipefail
record() { printf '%s\n' "$*" >> "$ROOT/recorded"; }
apt-get() { record apt-get "$@"; }
chown() { record chown "$@"; }
systemctl() { record systemctl "$@"; }
systemd-sysusers() { command systemd-sysusers --root="$ROOT" "$@"; }
install() {  # and a config landing under the root names the root's paths, as the steps' own paths do
    command install "$@"
    [ -d "$ROOT/etc/ledgermq" ] || return 0
    find "$ROOT/etc/ledgermq" -name '*.conf' -exec sed -E -i "s#(^|[= ;,])/(opt|etc|var)/#\\1$ROOT/\\2/#g" {} +
}
offline_pip() {
    local site
    site=$("$ROOT/opt/ledgermq/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    printf '%s\n' "$DEPS" > "$site/zz-ledgermq-test-deps.pth"
    PYTHONPATH="$DEPS" "$ROOT/opt/ledgermq/bin/pip" "$1" -q --no-index --no-build-isolation "${@:2}"
}
"""


def marked_block(mark: str) -> str:
    blocks = re.findall(rf"^<!-- {mark} -->\n```sh\n(.*?)^```$", README, re.S | re.M)
    assert len(blocks) == 1, f"README has {len(blocks)} blocks marked <!-- {mark} -->"
    return blocks[0]


def rooted(text: str) -> str:
    for old, new in REWRITES:
        text = text.replace(old, new)
    return ABSOLUTE.sub(r"$ROOT/\1/", text)


def dev_dependencies(into: Path) -> Path:
    """The development venv's packages (not ledgermq itself, not pip), as
    symlinks in one folder: what the offline pip resolves against."""
    into.mkdir()
    for lib in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for entry in Path(lib).iterdir():
            name = entry.name
            if (name.startswith(("ledgermq", "__editable__", "pip", "_distutils_hack", "distutils-precedence"))
                    or name.endswith(".pth") or (into / name).exists()):
                continue
            (into / name).symlink_to(entry)
    return into


def checkout_copy(dest: Path) -> Path:
    """The checkout's files (tracked and untracked, not ignored), so pip's
    in-tree build writes nowhere in the working tree."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO_ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = REPO_ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def unit(path: Path) -> configparser.ConfigParser:
    u = configparser.ConfigParser(strict=False, interpolation=None)
    u.optionxform = str
    u.read(path)
    return u


def in_root(root: Path, text: str) -> str:
    return ABSOLUTE.sub(lambda m: f"{root}/{m.group(1)}/", text)


def move_ports(root: Path) -> dict[int, int]:
    """Every port of the installed configs replaced by a free one (the same
    old port -> the same new one in every file); returns the mapping."""
    confs = sorted((root / "etc" / "ledgermq").rglob("*.conf"))
    old: set[int] = set()
    for conf in confs:
        for key, value in re.findall(r"^(\w+)\s*=\s*(.*)$", conf.read_text(), re.M):
            if key in ("listenPort", "metricsPromExporterPort"):
                old.add(int(value))
            elif key in ("namesrvAddr", "dLegerPeers"):
                old.update(int(p) for p in re.findall(r":(\d+)", value))
    mapping = dict(zip(sorted(old), free_ports(len(old)), strict=True))

    def move(m: re.Match) -> str:
        key, value = m.group(1), m.group(2)
        if key in ("listenPort", "metricsPromExporterPort"):
            value = str(mapping[int(value)])
        elif key in ("namesrvAddr", "dLegerPeers"):
            value = re.sub(r":(\d+)", lambda p: f":{mapping[int(p.group(1))]}", value)
        return f"{key} = {value}"

    for conf in confs:
        conf.write_text(re.sub(r"^(\w+)\s*=\s*(.*)$", move, conf.read_text(), flags=re.M))
    return mapping


async def first_line(proc: trio.Process, timeout: float, log: Path) -> str:
    buf = b""
    with trio.fail_after(timeout):
        while b"\n" not in buf:
            data = await proc.stdout.receive_some(4096)
            assert data, f"exited before serving: {buf!r}; stderr: {log.read_text()[-3000:]}"
            buf += data
    return buf.split(b"\n", 1)[0].decode()


async def test_readme_install_steps_then_the_units_start_a_group(tmp_path):
    if shutil.which("systemd-sysusers") is None or shutil.which("gcc") is None:
        pytest.skip("needs systemd-sysusers and gcc (Debian: systemd, gcc)")
    root = tmp_path / "root"
    for folder in DEBIAN_LAYOUT:
        (root / folder).mkdir(parents=True)
    src = checkout_copy(tmp_path / "src")
    env = {**os.environ, "ROOT": str(root), "DEPS": str(dev_dependencies(tmp_path / "deps")),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    env.pop("VIRTUAL_ENV", None)
    # python3 is the machine's, not the development venv's
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not p.startswith(str(Path(sys.prefix))))

    # 1. The install block, as written (rewritten under the root).
    script = PREAMBLE + rooted(marked_block("install"))
    r = await trio.run_process(["bash", "-c", script], cwd=str(src), env=env, capture_stdout=True,
                               capture_stderr=True, check=False)
    assert r.returncode == 0, (r.stdout.decode(), r.stderr.decode())
    recorded = (root / "recorded").read_text().splitlines()
    enable = [line.split()[3:] for line in recorded if line.startswith("systemctl enable --now ")]
    assert len(enable) == 1 and "systemctl daemon-reload" in recorded, recorded
    services = enable[0]
    assert services[0] == "ledgermq-namesrv" and len(services) == 4, services

    # What the steps left: the user (sysusers.d), the console scripts in the venv, a secret the group can read.
    passwd = (root / "etc" / "passwd").read_text()
    assert re.search(r"^ledgermq:x:\d+:\d+:[^:]*:/var/lib/ledgermq:/usr/sbin/nologin$", passwd, re.M), passwd
    assert re.search(r"^ledgermq:x:\d+:", (root / "etc" / "group").read_text(), re.M)
    for name in SCRIPTS:
        assert os.access(root / "opt" / "ledgermq" / "bin" / name, os.X_OK), name
    secret = root / "etc" / "ledgermq" / "peer.secret"
    assert secret.stat().st_mode & 0o777 == 0o640 and "chown root:ledgermq " + str(secret) in recorded

    # 2. systemd-analyze on the installed units, ExecStart pointing into the root.
    units = root / "etc" / "systemd" / "system"
    analyze = shutil.which("systemd-analyze")
    if analyze is not None:
        checked = tmp_path / "verify"
        checked.mkdir()
        for path in units.glob("ledgermq-*.service"):
            (checked / path.name).write_text(re.sub(r"(?<![\w/])/opt/", f"{root}/opt/", path.read_text()))
        r = await trio.run_process([analyze, "verify", *map(str, sorted(checked.iterdir()))], capture_stdout=True,
                                   capture_stderr=True, check=False)
        out = (r.stdout + r.stderr).decode().strip()
        assert r.returncode == 0 and out == "", out

    # 3. systemctl enable --now, done here: directories, %i, ExecStartPre, then ExecStart.
    plans = []
    for service in services:
        name, _, instance = service.partition("@")
        u = unit(units / (f"{name}@.service" if instance else f"{name}.service"))["Service"]
        assert u["User"] == "ledgermq" and u["KillSignal"] == "SIGTERM", service
        for key, base in (("StateDirectory", "var/lib"), ("LogsDirectory", "var/log"),
                          ("ConfigurationDirectory", "etc")):
            for d in u.get(key, "").split():
                (root / base / d).mkdir(parents=True, exist_ok=True)
        writable = [f"/var/lib/{d}/" for d in u.get("StateDirectory", "").split()] + \
                   [f"/var/log/{d}/" for d in u.get("LogsDirectory", "").split()]
        pre = [line for line in u.get("ExecStartPre", "").splitlines() if line.strip()]
        plans.append((service, instance, pre, u["ExecStart"], writable))

    # ProtectSystem=strict: each config writes only under the unit's State/Logs directories.
    for service, instance, _, start, writable in plans:
        conf = start.split()[-1].replace("%i", instance)
        for key, value in re.findall(r"^(storePathRootDir|storePathCommitLog|logDir)\s*=\s*(.*)$",
                                     Path(in_root(root, conf)).read_text(), re.M):
            assert any(value.startswith(in_root(root, w)) for w in writable), (service, key, value, writable)
    ports = move_ports(root)

    procs: list[tuple[str, trio.Process]] = []
    logs = tmp_path / "logs"
    logs.mkdir()

    async def start_unit(service: str, instance: str, pre: list[str], start: str) -> None:
        for line in pre:
            argv = in_root(root, line.replace("%i", instance)).split()
            r = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False, env=env)
            assert r.returncode == 0, (service, argv, r.stderr.decode())
        argv = in_root(root, start.replace("%i", instance)).split()
        with open(logs / f"{service}.err", "wb") as err:
            proc = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, stderr=err, env=env)
        procs.append((service, proc))
        line = await first_line(proc, 30, logs / f"{service}.err")
        if instance:
            assert json.loads(line)["selfId"] == instance, line
        else:
            assert "The Name Server boot success" in line, line

    try:
        # As systemd does: the name server first (the brokers are After= it), then the brokers side by side.
        await start_unit(*plans[0][:4])
        async with trio.open_nursery() as nursery:
            for plan in plans[1:]:
                nursery.start_soon(start_unit, *plan[:4])

        # The group answers: a master and both slaves registered, then the check block as written.
        ns_addr = f"127.0.0.1:{ports[9876]}"
        async with open_remoting_client() as remoting:
            async def registered():
                try:
                    brokers, _ = await NamesrvClient(remoting, (ns_addr,)).get_cluster_info()
                except RemotingError:
                    return None
                ids = {i for data in brokers.values() for i in data.broker_addrs}
                return 0 in ids and len(ids) == 3

            await wait_until(registered, 30, "a master and two slaves registered at the name server")
        check = rooted(marked_block("install-check")).replace("127.0.0.1:9876", ns_addr)
        r = await trio.run_process(["bash", "-c", PREAMBLE + check], env=env, capture_stdout=True,
                                   capture_stderr=True, check=False)
        out = r.stdout.decode()
        assert r.returncode == 0, (out, r.stderr.decode())
        assert out.count("RaftNode00") >= 3 and "SEND_OK" in out and "BODY: hello from systemd" in out, out
    finally:
        # KillSignal=SIGTERM, the brokers first (the units' After= order, reversed).
        for _, proc in reversed(procs):
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                with trio.move_on_after(30):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
    for service, proc in procs:
        assert proc.returncode == 0, (service, proc.returncode, (logs / f"{service}.err").read_text()[-2000:])
