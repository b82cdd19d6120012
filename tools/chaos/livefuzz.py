# Owns the live fuzz run: hostile inputs (tools/chaos/hostile.py, plus the
# byte mutations of tools/chaos/fuzz.py) against the ports of a running
# group for a fixed time or number of frames, then the verdict.
#
#   python -m tools.chaos.fuzz --minutes N [--seed S] [--dir DIR] [--rss-limit-mib 256] [--json]
#   python -m tools.chaos.fuzz --live --seconds 20 | --live --frames 2000
#   python -m tools.chaos.fuzz --minutes N --attach NAMESRV_ADDR [--broker-name broker-a]
#
# Without --attach it starts a name server and a 3-broker group
# (tools/brokercluster.py) under --dir (a temporary directory by default),
# with a peer secret unless --insecure-peers.  Every port gets its own
# stream of inputs, each on a new connection that is then ended from our
# side: the master's and a follower's remoting ports (requests of every
# kind with fields changed in type, length and nesting), the name server's
# (routes, registrations under fuzz names), and a follower's DLedger peer
# port (HELLO, AUTH and Raft messages; past the handshake only with
# --insecure-peers, where a stranger may by design forge Raft traffic).
# Each stream starts with the crafted inputs (hostile.*_seeds).
# Inputs that decode to a request any client may legitimately make without
# ACL and that would change the group under test (hostile.harmful) are
# skipped and counted.  Meanwhile a producer sends to a topic of its own.
#
# The report: inputs (frames) and connections per port and how each
# connection ended; every process alive (same pid) and its peak RSS; the
# producer's acknowledged sends all stored; the replicas' chain CRC equal at
# the common committed index; and, for a group it started, verifyStore --cq
# on every node and the committed entries byte for byte after stopping it
# (tools/chaos/checker.py check_offline).  Exit status 1 if a process
# died, an RSS passed the limit, the group stopped taking sends, or the
# stores differ.  --attach runs the online checks only and finds the pids
# of the ports it was given from /proc (best effort).
import json
import os
import random
import signal
import tempfile
import time

import attrs
import trio

from broker.remoting.codec import CLOSED, NEED_DATA, CommandDecoder
from broker.remoting.errors import RemoteProtocolError, RemotingError
from tools.chaos import hostile

CLOSE_TIMEOUT = 10.0  # a connection neither answered-and-closed nor closed by then is "hung"
PARALLEL = 3  # connections in flight per port
HEALTH_TOPIC = "FuzzHealth"
HEALTH_QUEUES = 2
PEER_SECRET = "ledgermq-live-fuzz"


@attrs.define
class Port:
    name: str
    kind: str  # remoting, namesrv, peer
    host: str
    port: int
    process: str  # the process listening on it
    frames: int = 0
    connections: int = 0
    bytes: int = 0
    skipped: int = 0  # harmful by design (see hostile.harmful): not sent
    ended: dict[str, int] = attrs.Factory(dict)  # how connections ended

    def count(self, how: str) -> None:
        self.ended[how] = self.ended.get(how, 0) + 1


@attrs.define
class Proc:
    name: str
    pid: int | None
    alive: bool = True
    rss_peak: int = 0
    anon_peak: int = 0
    store_root: str | None = None
    fds_first: int | None = None  # open descriptors other than store files, just before the fuzzing and after it
    fds_last: int | None = None

    def note_fds(self, attr: str) -> None:
        from tools.chaos.soak import proc_stats
        got = proc_stats(self.pid, self.store_root) if self.pid is not None else None
        if got is not None:
            setattr(self, attr, got[1] - got[3])


@attrs.define
class LiveReport:
    seed: int
    seconds: float = 0.0
    ports: list[Port] = attrs.Factory(list)
    procs: dict[str, Proc] = attrs.Factory(dict)
    rss_limit: int = 256 * 2 ** 20
    sends_ok: int = 0
    sends_failed: int = 0
    stored: int | None = None  # acknowledged sends found in the log (None: not checked)
    committed: int | None = None
    chain_crcs: dict[str, int] = attrs.Factory(dict)
    problems: list[str] = attrs.Factory(list)
    fuzzing_done: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def judge(self) -> None:
        for p in self.procs.values():
            if not p.alive:
                self.problems.append(f"{p.name} (pid {p.pid}) died")
            if p.rss_peak > self.rss_limit:
                self.problems.append(f"{p.name}: RSS peaked at {p.rss_peak / 2 ** 20:.0f} MiB, over "
                                     f"{self.rss_limit / 2 ** 20:.0f} MiB")
        if self.stored is not None and self.stored < self.sends_ok:
            self.problems.append(f"{self.sends_ok - self.stored} acknowledged sends are not in the log")

    def text(self) -> str:
        lines = [f"live fuzz, seed {self.seed}: {self.seconds:.0f} s"]
        for p in self.ports:
            ended = ", ".join(f"{k} {v:,}" for k, v in sorted(p.ended.items()))
            lines.append(f"  {p.name:<26} {p.frames:>8,} frames  {p.connections:>7,} connections  "
                         f"{p.bytes / 2 ** 20:7.1f} MiB  ({ended}; {p.skipped:,} skipped as harmful by design)")
        lines.append(f"  frames sent: {sum(p.frames for p in self.ports):,}")
        for p in self.procs.values():
            state = "alive" if p.alive else "DEAD"
            lines.append(f"  {p.name:<10} pid {p.pid}  {state}  RSS peak {p.rss_peak / 2 ** 20:.0f} MiB "
                         f"(anonymous {p.anon_peak / 2 ** 20:.0f} MiB), descriptors but store files {p.fds_first} -> "
                         f"{p.fds_last}")
        stored = "not checked" if self.stored is None else f"{self.stored:,} of them stored"
        lines.append(f"  producer: {self.sends_ok:,} sends acknowledged, {self.sends_failed:,} failed; {stored}")
        if self.committed is not None:
            same = len(set(self.chain_crcs.values())) == 1
            lines.append(f"  replicas: chain CRC at committed index {self.committed} "
                         f"{'identical' if same else 'DIFFERS'} on {len(self.chain_crcs)} nodes")
        lines.append("  verdict: " + ("ok" if self.ok else "FAILED: " + "; ".join(self.problems)))
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return attrs.asdict(self) | {"ok": self.ok}


# --- one connection ------------------------------------------------------------------------------

async def send_one(port: Port, data: bytes) -> str:
    """Send `data` on a new connection, end our side, read until the peer
    closes.  Returns how it ended."""
    got = 0
    with trio.move_on_after(CLOSE_TIMEOUT):
        try:
            stream = await trio.open_tcp_stream(port.host, port.port)
        except OSError:
            return "refused"
        try:
            try:
                await stream.send_all(data)
                await stream.send_eof()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return "closed early"
            while True:
                try:
                    chunk = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    return "reset" if not got else "answered+reset"
                if not chunk:
                    return "answered+closed" if got else "closed"
                got += len(chunk)
        finally:
            await trio.aclose_forcefully(stream)
    return "hung"


def remoting_commands(data: bytes) -> list:
    """What the server's decoder makes of `data` (up to its first error)."""
    dec = CommandDecoder()
    dec.receive_data(data)  # (b"" would be the end of the stream: CLOSED)
    out = []
    try:
        while (cmd := dec.next_command()) is not NEED_DATA and cmd is not CLOSED:
            out.append(cmd)
    except RemoteProtocolError:
        pass
    return out


class Inputs:
    """One port's stream: its seeds first, then generated inputs, a third
    of them byte-mutated; (frames, bytes) each."""

    def __init__(self, port: Port, rng: random.Random, seeds: list[bytes], make, protected: frozenset[str]):
        self.port, self.rng, self.make, self.protected = port, rng, make, protected
        self.pending = list(seeds)
        self.recent: list[bytes] = [s for s in seeds if len(s) < 65536][:8]
        self.opaque = 1000

    def next(self) -> tuple[bytes, int]:
        while True:
            if self.pending:
                data, frames = self.pending.pop(0), 1
            else:
                frames = self.rng.choice((1, 1, 1, 2, 4))
                parts = [self.make(self.rng, self._opaque()) for _ in range(frames)]
                data = b"".join(parts)
                if self.rng.random() < 0.33:
                    data = hostile.mutate(self.rng, data, self.recent)
                if len(data) < 65536:  # the splice partners of later mutations
                    if len(self.recent) < 8:
                        self.recent.append(data)
                    else:
                        self.recent[self.rng.randrange(8)] = data
            if self.port.kind != "peer" and any(hostile.harmful(c, self.protected) for c in remoting_commands(data)):
                self.port.skipped += 1
                continue
            return data, frames

    def _opaque(self) -> int:
        self.opaque += 1
        return self.opaque


async def hammer(port: Port, inputs: Inputs, deadline: float, frames_budget: int | None) -> None:
    async def worker():
        while trio.current_time() < deadline and (frames_budget is None or port.frames < frames_budget):
            data, frames = inputs.next()
            port.frames += frames
            port.connections += 1
            port.bytes += len(data)
            port.count(await send_one(port, data))

    async with trio.open_nursery() as nursery:
        for _ in range(PARALLEL):
            nursery.start_soon(worker)


# --- the processes ---------------------------------------------------------------------------------

def proc_rss(pid: int) -> tuple[int, int, int] | None:
    """(RSS, anonymous RSS, open descriptors), None if the process is gone."""
    from tools.chaos.soak import proc_stats
    stats = proc_stats(pid)
    return None if stats is None else (stats[0], stats[2], stats[1])


SELF_RSS_LIMIT = 2 * 2 ** 30  # the fuzzer's own: past it the run stops (a bug here, not in the group)


async def sample(procs: dict[str, Proc], alive_fn, stop: trio.Event, interval: float = 0.2) -> None:
    while True:
        own = proc_rss(os.getpid())
        if own is not None and own[0] > SELF_RSS_LIMIT:
            raise RuntimeError(f"the fuzzer itself holds {own[0] / 2 ** 20:.0f} MiB: stopping")
        for p in procs.values():
            if p.pid is None or not p.alive:
                continue
            got = proc_rss(p.pid)
            if got is None or not alive_fn(p):
                p.alive = False
                continue
            p.rss_peak, p.anon_peak = max(p.rss_peak, got[0]), max(p.anon_peak, got[1])
        if stop.is_set():
            return
        with trio.move_on_after(interval):
            await stop.wait()


def pid_listening_on(port: int) -> int | None:
    """The pid of the process with a TCP socket listening on `port` (from
    /proc; None if not found or not ours to read)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(cols[9])
        except OSError:
            continue
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return int(pid)
        except OSError:
            continue
    return None


# --- the health producer ------------------------------------------------------------------------

async def produce(namesrv_addr: str, report: LiveReport, acked: list[tuple[int, bytes]], stop: trio.Event,
                  acked_before: trio.Event, acked_after: trio.Event) -> None:
    """Sends to HEALTH_TOPIC every 0.2 s until `stop`; sets `acked_before`
    on the first acknowledgement, `acked_after` on the first once
    report.fuzzing_done."""
    import broker.client as client
    async with client.open_producer("fuzz_health_pg", namesrv_addr=namesrv_addr) as producer:
        i = 0
        while not stop.is_set():
            body = f"health {report.seed} {i}".encode()
            i += 1
            try:
                r = await producer.send(client.Message(HEALTH_TOPIC, body))
            except Exception:  # noqa: BLE001 - any failure of a send is counted, the run goes on
                report.sends_failed += 1
            else:
                if r.status == client.SendStatus.SEND_OK:
                    report.sends_ok += 1
                    acked.append((r.queue.queue_id, body))
                    acked_before.set()
                    if report.fuzzing_done:
                        acked_after.set()
                else:
                    report.sends_failed += 1
            with trio.move_on_after(0.2):
                await stop.wait()


# --- the run ----------------------------------------------------------------------------------------

@attrs.define
class Group:
    """What the run needs to know of the group under test."""
    namesrv_addr: str
    master: str
    brokers: dict[str, str]  # node -> remoting addr
    peers: dict[str, str]  # node -> DLedger addr
    group: str
    protected: frozenset[str]
    procs: dict[str, Proc]


def _split(addr: str) -> tuple[str, int]:
    host, port = addr.rsplit(":", 1)
    return host, int(port)


def plan(g: Group, secure: bool) -> list[tuple[Port, list[bytes], object]]:
    follower = next(n for n in sorted(g.brokers) if n != g.master)
    ids = sorted(g.peers)
    ports = []
    for name, node, kind in ((f"remoting {g.master} (master)", g.master, "remoting"),
                             (f"remoting {follower} (follower)", follower, "remoting")):
        ports.append((Port(name, kind, *_split(g.brokers[node]), node), hostile.remoting_seeds(),
                      lambda rng, op: hostile.remoting_frame(rng, op)))
    ns_host, ns_port = _split(g.namesrv_addr.split(";")[0])
    ports.append((Port("namesrv", "namesrv", ns_host, ns_port, "namesrv0"), hostile.remoting_seeds(namesrv=True),
                  lambda rng, op: hostile.remoting_frame(rng, op, namesrv=True)))
    # A follower that lower ids dial (the acceptor of their connections), so a HELLO can pass.
    peer_target = max(n for n in g.brokers if n != g.master)
    label = "peer {} ({})".format(peer_target, "secret" if secure else "no secret")
    ports.append((Port(label, "peer", *_split(g.peers[peer_target]), peer_target),
                  hostile.peer_seeds(g.group, ids, peer_target),
                  lambda rng, op: hostile.peer_stream(rng, g.group, ids, peer_target)))
    return ports


async def fuzz_group(g: Group, report: LiveReport, seconds: float | None, frames: int | None, alive_fn,
                     admin, secure: bool) -> None:
    """Hammer every port while the producer runs; then the online checks."""
    acked: list[tuple[int, bytes]] = []
    report.procs = g.procs
    stop_sampling, stop_producing = trio.Event(), trio.Event()
    rng = random.Random(report.seed)
    acked_before, acked_after = trio.Event(), trio.Event()  # the first send acknowledged before/after
    async with trio.open_nursery() as outer:
        outer.start_soon(sample, g.procs, alive_fn, stop_sampling)
        async with trio.open_nursery() as work:
            work.start_soon(produce, g.namesrv_addr, report, acked, stop_producing, acked_before, acked_after)
            with trio.move_on_after(30):
                await acked_before.wait()
            if not acked_before.is_set():
                report.problems.append("no send acknowledged within 30 s before the fuzzing")
            for p in g.procs.values():
                p.note_fds("fds_first")
            t0 = trio.current_time()
            deadline = t0 + (seconds if seconds is not None else 10 ** 9)
            async with trio.open_nursery() as nursery:
                for port, seeds, make in plan(g, secure):
                    report.ports.append(port)
                    inputs = Inputs(port, random.Random(rng.randrange(2 ** 63)), seeds, make, g.protected)
                    nursery.start_soon(hammer, port, inputs, deadline, frames)
            report.seconds = trio.current_time() - t0
            report.fuzzing_done = True
            # The group must still take sends after it.
            with trio.move_on_after(30):
                await acked_after.wait()
            for p in g.procs.values():
                p.note_fds("fds_last")
            stop_producing.set()
        if not acked_after.is_set():
            report.problems.append("no send acknowledged within 30 s after the fuzzing")
        stop_sampling.set()
    master_addr = await current_master(admin, g) or g.brokers[g.master]
    try:
        held = await read_bodies(admin, master_addr, HEALTH_TOPIC, HEALTH_QUEUES, len(acked) + 1000)
        report.stored = sum(1 for _q, body in acked if body in held)
    except RemotingError as e:
        report.problems.append(f"could not read {HEALTH_TOPIC} back from the master: {e}")


async def read_bodies(admin, addr: str, topic: str, queues: int, most: int) -> set[bytes]:
    """The bodies stored in every queue of `topic`, from offset 0 (at most
    `most` records a queue: a pull that does not advance ends the read)."""
    held: set[bytes] = set()
    for qid in range(queues):
        offset, n = 0, 0
        while n < most:
            nxt, _lo, hi, recs = await admin.pull(addr, "fuzz_health_cg", topic, qid, offset, 32)
            held.update(bytes(r.body) for r in recs)
            n += len(recs)
            if nxt >= hi or nxt <= offset:
                break
            offset = nxt
    return held


async def current_master(admin, g: Group) -> str | None:
    from broker.namesrv.client import NamesrvClient
    try:
        brokers, _ = await NamesrvClient(admin.remoting, g.namesrv_addr.split(";")).get_cluster_info()
    except RemotingError:
        return None
    data = brokers.get(g.group)
    return data.broker_addrs.get(0) if data is not None else None


async def chain_crcs(admin, report: LiveReport, brokers: dict[str, str]) -> None:
    infos = {n: await admin.runtime_info(a) for n, a in brokers.items()}
    report.committed = min(int(i.get("dledgerCommittedIndex", -1)) for i in infos.values())
    if report.committed >= 0:
        report.chain_crcs = {n: await admin.chain_crc(a, report.committed) for n, a in brokers.items()}
        if len(set(report.chain_crcs.values())) != 1:
            report.problems.append(f"chain CRC at committed index {report.committed} differs: {report.chain_crcs}")


async def run_started(root: str, report: LiveReport, seconds: float | None, frames: int | None,
                      secure: bool) -> None:
    from tools.brokercluster import open_broker_cluster
    from tools.chaos.checker import Verdict, check_offline
    from tools.mqadmin.adminapi import MQAdmin
    from tools.quickstart import wait_caught_up
    extra = {"dLegerPeerSecret": PEER_SECRET} if secure else {"dLegerPeerInsecure": "true"}
    async with open_broker_cluster(root, extra_conf=extra) as cluster:
        master = await cluster.wait_master()
        admin = MQAdmin(cluster.remoting, cluster.namesrv_addr)
        with trio.fail_after(60):
            while True:  # an election right after start-up may move the master: create where it is then
                try:
                    await admin.create_topic(cluster.addr(master), HEALTH_TOPIC, HEALTH_QUEUES, HEALTH_QUEUES, 6,
                                             False)
                    break
                except RemotingError:
                    await trio.sleep(0.2)
                    master = await cluster.wait_master()
        procs = {ns.name: Proc(ns.name, ns.pid) for ns in cluster.namesrvs}
        procs.update({n: Proc(n, p.pid, store_root=cluster.store_root(n)) for n, p in cluster.brokers.items()})
        managed = {**{ns.name: ns for ns in cluster.namesrvs}, **cluster.brokers}
        g = Group(cluster.namesrv_addr, master, {n: cluster.addr(n) for n in cluster.brokers}, dict(cluster.peers),
                  cluster.broker_name, frozenset({cluster.broker_name, cluster.cluster_name, HEALTH_TOPIC,
                                                  *(cluster.addr(n) for n in cluster.brokers)}), procs)
        await fuzz_group(g, report, seconds, frames,
                         lambda p: managed[p.name].alive and managed[p.name].pid == p.pid, admin, secure)
        if all(p.alive for p in procs.values()):
            await wait_caught_up(cluster, 60)
            await chain_crcs(admin, report, g.brokers)
            verdict = Verdict(replicas={n: {"committed": report.committed} for n in cluster.brokers})
            await cluster.stop_all()
            check_offline(_Nodes(cluster.root, sorted(cluster.brokers)), verdict)
            report.problems += verdict.problems


@attrs.define
class _Nodes:
    """What check_offline reads of a cluster."""
    root: str
    nodes: list[str]

    def node_ids(self) -> list[str]:
        return self.nodes


async def run_attached(namesrv_addr: str, broker_name: str | None, report: LiveReport, seconds: float | None,
                       frames: int | None) -> None:
    from broker.namesrv.client import NamesrvClient
    from broker.remoting.client import open_remoting_client
    from tools.mqadmin.adminapi import MQAdmin
    async with open_remoting_client() as rc:
        admin = MQAdmin(rc, namesrv_addr)
        brokers, clusters = await NamesrvClient(rc, namesrv_addr.split(";")).get_cluster_info()
        name = broker_name or sorted(brokers)[0]
        data = brokers[name]
        by_addr, peers, roots = {}, {}, {}
        for _bid, addr in sorted(data.broker_addrs.items()):
            conf = await admin.broker_config(addr)
            node = conf.get("dLegerSelfId") or addr
            by_addr[node] = addr
            roots[node] = conf.get("storePathRootDir")
            for item in (conf.get("dLegerPeers") or "").split(";"):
                if "-" in item:
                    pid_, paddr = item.split("-", 1)
                    peers[pid_] = paddr
        secure = bool(conf.get("dLegerPeerSecret") or conf.get("dLegerPeerSecretFile"))
        master = next((n for n, a in by_addr.items() if a == data.broker_addrs.get(0)), sorted(by_addr)[0])
        procs = {"namesrv0": Proc("namesrv0", pid_listening_on(_split(namesrv_addr.split(";")[0])[1]))}
        for n, a in by_addr.items():
            procs[n] = Proc(n, pid_listening_on(_split(a)[1]), store_root=roots.get(n))
        g = Group(namesrv_addr, master, by_addr, peers, name,
                  frozenset({name, data.cluster, HEALTH_TOPIC, *by_addr.values()}), procs)
        try:
            await admin.create_topic(data.broker_addrs.get(0) or by_addr[master], HEALTH_TOPIC, HEALTH_QUEUES,
                                     HEALTH_QUEUES, 6, False)
        except RemotingError as e:
            report.problems.append(f"could not create {HEALTH_TOPIC}: {e}")
            return
        await fuzz_group(g, report, seconds, frames, lambda p: os.path.exists(f"/proc/{p.pid}"), admin, secure)
        await chain_crcs(admin, report, by_addr)


def run_live(args) -> int:
    """The command line's live run (see the top of this file)."""
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2 ** 32)
    report = LiveReport(seed, rss_limit=args.rss_limit_mib * 2 ** 20)
    seconds = args.minutes * 60 if args.minutes is not None else args.seconds
    if seconds is None and args.frames is None:
        seconds = 60.0
    print(f"seed {seed}", flush=True)

    async def main():
        if args.attach:
            await run_attached(args.attach, args.broker_name, report, seconds, args.frames)
        else:
            root = args.dir or tempfile.mkdtemp(prefix="ledgermq-livefuzz-")
            print(f"group under {root}", flush=True)
            await run_started(root, report, seconds, args.frames, not args.insecure_peers)

    t0 = time.monotonic()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # so a started group is stopped, not orphaned
    trio.run(main)
    report.judge()
    if args.json:
        print(json.dumps(report.as_dict(), indent=1, default=str))
    else:
        print(report.text())
        print(f"(wall time {time.monotonic() - t0:.0f} s)")
    return 0 if report.ok else 1
