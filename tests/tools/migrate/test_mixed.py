# Issue 20: one master-slave store migrated on different paths -- n0 with
# `mqadmin migrate apply` (defaults), n1 and n2 by the broker's upgrade on
# start with the default mappedFileSizeCommitLog (1 GiB), the old files in
# 64 KiB segments -- all choose the same divided offset (the old files' own
# rule), form one group, and serve old and new messages to a consumer group
# that resumes from its imported offsets.  A replica migrated from a copy
# that ends in an earlier segment (another divided offset) is refused at
# the peer handshake with both values named, while the other two serve;
# `migrate check`, `dledgerStatus` and `compareReplicas` show it.  apply
# names the first DLedger data file the one the broker creates (the
# divided offset rounded down to 1 GiB: 00000000000000000000), and every
# node, stopped, verifies clean (`verifyStore --cq`).
# Slow: migrated stores served by real 3-broker groups.
import json
import os
import sys

import pytest
import trio
from click.testing import CliRunner

from broker.client import Message, SendStatus, open_producer, open_push_consumer
from tests.helpers import REPO_ROOT
from tests.helpers.legacy_fixtures import build_master_slave_store
from tests.tools.migrate.checks import verify_store_cq, wait_group_settled
from tools.brokercluster import open_broker_cluster
from tools.mqadmin import cli

pytestmark = pytest.mark.slow

SEG = 64 * 1024
PER_QUEUE = 80  # 640 records end at ~174 KB: in the third old segment
DIVIDED = 3 * SEG
ROOT = str(REPO_ROOT)


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


async def mqj(cluster, *args, expect=0):
    r = await trio.run_process([sys.executable, "-m", "tools.mqadmin", *args, "-n", cluster.namesrv_addr, "--json"],
                               capture_stdout=True, capture_stderr=True, check=False, cwd=ROOT)
    assert r.returncode == expect, (args, r.returncode, r.stdout, r.stderr)
    return json.loads(r.stdout)


def marker(root, node):
    with open(os.path.join(root, f"dledger-{node}", "ledgermq-divided.json")) as f:
        return json.load(f)


async def wait_writable(cluster, exclude=frozenset()):
    """The master, once it accepts sends (old tables imported)."""
    node = await cluster.wait_master(timeout=60, exclude=exclude, settled=False)
    return node


async def test_apply_and_upgrade_on_start_agree_and_serve(tmp_path):
    roots = {n: tmp_path / n for n in ("n0", "n1", "n2")}
    fx = {n: build_master_slave_store(r, segment_size=SEG, per_queue=PER_QUEUE) for n, r in roots.items()}
    assert 2 * SEG < fx["n0"].end < DIVIDED
    res = run("migrate", "apply", "--store", roots["n0"], "--self-id", "n0", "--json")
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output)
    assert plan["dividedOffset"] == DIVIDED and plan["legacySegmentSize"] == SEG
    assert any("mappedFileSizeCommitLog 1073741824 differs from the old files' segment size 65536" in w
               for w in plan["warnings"])
    first = os.path.join(roots["n0"], "dledger-n0", "data", "0" * 20)  # 196608 rounded down to 1 GiB
    assert plan["firstDataFile"] == first and any(first in a for a in plan["actions"]), plan
    assert f"{DIVIDED:020d}" not in json.dumps(plan)

    async with open_broker_cluster(tmp_path) as cluster:  # default mappedFileSizeCommitLog
        await wait_writable(cluster)
        for n in ("n0", "n1", "n2"):
            m = marker(roots[n], n)
            assert (m["dividedOffset"], m["legacyEnd"], m["legacySegmentSize"]) == (DIVIDED, fx["n0"].end, SEG)
        status = await mqj(cluster, "dledgerStatus", "-b", "broker-a")
        assert {n["selfId"]: n["identity"]["origin"] for n in status["nodes"]} == {
            "n0": str(DIVIDED), "n1": str(DIVIDED), "n2": str(DIVIDED)}
        assert all(n["problem"] is None for n in status["nodes"]), status

        ns = cluster.namesrv_addr
        sent = []
        async with open_producer("pg_new", namesrv_addr=ns) as producer:
            for q in range(4):
                for i in range(5):
                    body = f"new-{q}-{i}".encode()
                    r = await producer.send(Message("TopicA", body), selector=lambda qs, m, q=q: qs[q])
                    assert r.status is SendStatus.SEND_OK and r.queue_offset == PER_QUEUE + i
                    sent.append(body)
        # GroupA's imported offsets: half of every queue (the fixture's).
        want = sorted([m.body for m in fx["n0"].messages if m.topic == "TopicA" and m.queue_offset >= PER_QUEUE // 2]
                      + sent)
        got = []

        async def handler(msgs):
            got.extend(m.body for m in msgs)
            if set(want) <= set(got):
                done.set()
        done = trio.Event()
        async with open_push_consumer("GroupA", namesrv_addr=ns, subscriptions={"TopicA": "*"}, handler=handler):
            # Every wanted message, the new ones last in each queue: a re-read
            # below the imported offsets (queues are pulled in order) is in
            # `got` before them.
            with trio.fail_after(30):
                await done.wait()
        assert sorted(got) == want
        cmp = await mqj(cluster, "compareReplicas", "-c", "broker-a")
        assert cmp["consistent"] and cmp["identityMismatches"] == []
        await wait_group_settled(cluster, list(cluster.brokers))
        await cluster.stop_all()
    for n, r in roots.items():
        assert os.listdir(r / f"dledger-{n}" / "data") == ["0" * 20]  # the file apply named
        verify_store_cq(r, n)

    report = run("migrate", "check", "--store", roots["n0"], "--replica", roots["n1"], "--replica", roots["n2"],
                 "--json")
    rep = json.loads(report.output)
    assert not [p for p in rep["problems"] if "divided" in p or "segment" in p], rep["problems"]
    assert [s["migrated"][0]["dividedOffset"] for s in rep["stores"]] == [DIVIDED] * 3


async def test_replica_with_another_divided_offset_is_refused_while_two_serve(tmp_path):
    roots = {n: tmp_path / n for n in ("n0", "n1", "n2")}
    fx = build_master_slave_store(roots["n0"], segment_size=SEG, per_queue=PER_QUEUE)
    build_master_slave_store(roots["n1"], segment_size=SEG, per_queue=PER_QUEUE)
    short = build_master_slave_store(roots["n2"], segment_size=SEG, per_queue=PER_QUEUE, limit=300)
    assert short.end < 2 * SEG  # not aligned: n2's old log ends one segment earlier
    async with open_broker_cluster(tmp_path) as cluster:  # every node upgrades on start
        master = await wait_writable(cluster)
        assert master in ("n0", "n1")
        assert marker(roots["n2"], "n2")["dividedOffset"] == 2 * SEG
        async with open_producer("pg_new", namesrv_addr=cluster.namesrv_addr) as producer:
            for i in range(10):
                assert (await producer.send(Message("TopicA", b"two serve %d" % i))).status is SendStatus.SEND_OK
        reason = f"origin {2 * SEG} at n2, {DIVIDED} at n"
        status = await mqj(cluster, "dledgerStatus", "-b", "broker-a")
        by_id = {n["selfId"]: n for n in status["nodes"]}
        assert reason in (by_id["n2"]["problem"] or ""), by_id["n2"]
        assert by_id["n2"]["committedIndex"] == -1  # nothing replicated into it
        assert all(not v["connected"] for v in by_id["n2"]["links"].values())
        assert by_id[master]["links"]["n2"]["connected"] is False
        assert "log identity differs" in by_id[master]["links"]["n2"]["lastError"]
        cmp = await mqj(cluster, "compareReplicas", "-c", "broker-a", expect=1)
        assert not cmp["consistent"]
        assert any(f"origin differs: {DIVIDED} at n0, {DIVIDED} at n1, {2 * SEG} at n2" == m
                   for m in cmp["identityMismatches"]), cmp
        assert "log identity differs" in cluster.log_tail("n2")
        await wait_group_settled(cluster, sorted({master, "n0", "n1"}))
        await cluster.stop_all()
    for n, r in roots.items():  # n2 too: its old part, nothing replicated
        verify_store_cq(r, n)
    rep = json.loads(run("migrate", "check", "--store", roots["n0"], "--replica", roots["n1"],
                         "--replica", roots["n2"], "--json").output)
    assert any(p.startswith("migrated divided offsets differ") for p in rep["problems"]), rep["problems"]
    assert fx.end > short.end
