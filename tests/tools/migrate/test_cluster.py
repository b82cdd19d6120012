# Migration end to end (issue 7): a master and two slaves (one lagging, one
# diverged) as stock master-slave stores; `migrate check` refuses, `migrate
# align --winner` aligns, check passes; n0 is upgraded with `migrate apply`,
# n1 and n2 automatically by the broker on start; then a real 3-node group
# (mqnamesrv + 3 mqbroker processes) serves them: plain PULL_MESSAGE reads
# old and new messages across the divided offset with continuous queue
# offsets, QUERY_CONSUMER_OFFSET returns the imported offsets (on the first
# master and, after kill -9, on its successor, which does not import again),
# VIEW_MESSAGE_BY_ID and QUERY_MESSAGE work on both sides of the boundary.
# Every node finds an old key (QUERY_MESSAGE) and, stopped, verifies clean
# (`verifyStore --cq`: the first leader's import records stamped like any
# other).  Finally the stopped n0 is exported to a plain store that reads
# back, and the old commitlog files are byte-identical to what align left.
# Slow: migrated stores served by a real 3-broker group, a kill -9 of its
#   master.
import json
import os

import pytest
import trio
from click.testing import CliRunner

from broker.metadata.snapshot import read_config_dir
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from consumequeue import record as M
from consumequeue.legacy_store import LegacyStore
from tests.helpers.legacy_fixtures import build_master_slave_store, file_digests
from tests.tools.migrate.checks import verify_store_cq, wait_group_settled
from tools.brokercluster import open_broker_cluster
from tools.mqadmin import cli

pytestmark = pytest.mark.slow

SEG = 8192
GROUP = "GroupA"


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def split_records(body: bytes) -> list[M.MessageRecord]:
    out, off = [], 0
    while off < len(body):
        size = int.from_bytes(body[off:off + 4], "big")
        out.append(M.decode(body[off:off + size]))
        off += size
    return out


async def call(cluster, addr, code, fields, body=b""):
    return await cluster.remoting.invoke(addr, RemotingCommand.create_request(code, fields, body=body), timeout=10)


async def pull(cluster, addr, topic, qid, offset, n=32):
    # sysFlag SUBSCRIPTION (0x4): the subscription travels in the header (no heartbeat needed)
    resp = await call(cluster, addr, RequestCode.PULL_MESSAGE, {
        "consumerGroup": GROUP, "topic": topic, "queueId": qid, "queueOffset": offset, "maxMsgNums": n,
        "sysFlag": 4, "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0,
        "expressionType": "TAG"})
    assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
    return split_records(resp.body), int(resp.ext_fields["nextBeginOffset"])


async def query_offset(cluster, addr, topic, qid, group=GROUP):
    resp = await call(cluster, addr, RequestCode.QUERY_CONSUMER_OFFSET,
                      {"consumerGroup": group, "topic": topic, "queueId": qid})
    return int(resp.ext_fields["offset"]) if resp.code == ResponseCode.SUCCESS else None


async def send(cluster, addr, topic, qid, body, keys):
    props = M.properties_to_string({"TAGS": "tagNew", "KEYS": keys})
    resp = await call(cluster, addr, RequestCode.SEND_MESSAGE, {
        "producerGroup": "pg", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
        "queueId": qid, "sysFlag": 0, "bornTimestamp": 1_800_000_000_000, "flag": 0, "properties": props}, body)
    assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
    return int(resp.ext_fields["queueOffset"])


async def master_addr(cluster, exclude=frozenset()):
    node = await cluster.wait_master(timeout=60, exclude=exclude)
    addr = cluster.addr(node)
    with trio.fail_after(30):  # writable and the old tables imported (the gate opens after the import)
        while await query_offset(cluster, addr, "TopicA", 0) is None:
            await trio.sleep(0.1)
    return node, addr


async def test_migrate_three_copies_and_serve_across_the_boundary(tmp_path):
    roots = {n: tmp_path / n for n in ("n0", "n1", "n2")}
    master = build_master_slave_store(roots["n0"], segment_size=SEG)
    total = len(master.messages)
    build_master_slave_store(roots["n1"], segment_size=SEG, limit=total - 13)
    build_master_slave_store(roots["n2"], segment_size=SEG, diverge_at=150,
                             consumer_offsets={"TopicA@GroupA": {0: 1}})
    stores = ["--store", roots["n0"], "--replica", roots["n1"], "--replica", roots["n2"]]
    res = run("migrate", "check", *stores, "--json")
    assert res.exit_code == 1 and json.loads(res.output)["reference"] is None
    res = run("migrate", "align", *stores, "--winner", roots["n0"])
    assert res.exit_code == 0, res.output
    assert run("migrate", "check", *stores).exit_code == 0
    aligned = {n: file_digests(r) for n, r in roots.items()}
    assert aligned["n1"] == aligned["n0"] == aligned["n2"]  # commitlog and config alike
    res = run("migrate", "apply", "--store", roots["n0"], "--self-id", "n0", "--json")
    assert res.exit_code == 0, res.output
    divided = json.loads(res.output)["dividedOffset"]
    assert divided == master.end - master.end % SEG + SEG

    async with open_broker_cluster(tmp_path, extra_conf={"mappedFileSizeCommitLog": SEG}) as cluster:
        node, addr = await master_addr(cluster)
        for n in ("n1", "n2"):  # upgraded by the broker itself
            assert os.path.exists(roots[n] / f"dledger-{n}" / "ledgermq-divided.json")
        # Imported consumer offsets (the fixture's: half of every queue).
        assert [await query_offset(cluster, addr, t, q) for t in ("TopicA", "TopicB") for q in range(4)] == [10] * 8
        # Old messages, then new ones continuing the same queue offsets.
        old, nxt = await pull(cluster, addr, "TopicA", 1, 0)
        assert [m.queue_offset for m in old] == list(range(20)) and nxt == 20
        assert [m.body for m in old] == [m.body for m in master.of_queue("TopicA", 1)]
        offsets = [await send(cluster, addr, "TopicA", 1, b"new %d" % i, f"newkey{i}") for i in range(5)]
        assert offsets == [20, 21, 22, 23, 24]
        across, nxt = await pull(cluster, addr, "TopicA", 1, 17)
        assert [m.queue_offset for m in across] == list(range(17, 25)) and nxt == 25
        assert all(m.physical_offset < master.end for m in across[:3])
        assert all(m.physical_offset >= divided for m in across[3:])
        assert [m.body for m in across[3:]] == [b"new %d" % i for i in range(5)]
        # By id (the offset inside an offsetMsgId) and by key, both sides.
        for m in (across[0], across[4]):
            resp = await call(cluster, addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": m.physical_offset})
            assert resp.code == ResponseCode.SUCCESS and M.decode(resp.body).body == m.body
        for key, want in ((master.of_queue("TopicA", 1)[18].keys, across[1].body), ("newkey2", b"new 2")):
            resp = await call(cluster, addr, RequestCode.QUERY_MESSAGE, {
                "topic": "TopicA", "key": key, "maxNum": 32, "beginTimestamp": 0, "endTimestamp": 1 << 62})
            assert resp.code == ResponseCode.SUCCESS, (key, resp.remark)
            assert [r.body for r in split_records(resp.body)] == [want]
        # A consumer commits past the boundary; the next master must keep
        # it (the import happens once, not again on the new leader).
        await cluster.remoting.invoke_oneway(addr, RemotingCommand.create_request(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": GROUP, "topic": "TopicA", "queueId": 1, "commitOffset": 23}))
        followers = [cluster.addr(n) for n in cluster.brokers if n != node]
        with trio.fail_after(30):  # committed through the log: the followers' tables have it
            while [await query_offset(cluster, a, "TopicA", 1) for a in followers] != [23, 23]:
                await trio.sleep(0.1)
        cluster.kill(node)
        await cluster.wait_dead(node)
        node2, addr2 = await master_addr(cluster, exclude={node})
        assert node2 != node
        assert await query_offset(cluster, addr2, "TopicA", 1) == 23
        assert await query_offset(cluster, addr2, "TopicB", 3) == 10
        again, _ = await pull(cluster, addr2, "TopicA", 1, 18)
        assert [m.queue_offset for m in again] == list(range(18, 25))
        assert await send(cluster, addr2, "TopicA", 1, b"after failover", "k-after") == 25
        await cluster.start_broker(node)
        with trio.fail_after(30):
            while len(await cluster.broker_ids()) != 3:
                await trio.sleep(0.1)
        await wait_group_settled(cluster, list(cluster.brokers))
        old_key = master.of_queue("TopicB", 2)[3]
        for n in cluster.brokers:  # every node's index, the old part included
            resp = await call(cluster, cluster.addr(n), RequestCode.QUERY_MESSAGE, {
                "topic": "TopicB", "key": old_key.keys, "maxNum": 32, "beginTimestamp": 0, "endTimestamp": 1 << 62})
            assert resp.code == ResponseCode.SUCCESS, (n, resp.remark)
            assert [r.body for r in split_records(resp.body)] == [old_key.body]
        await cluster.stop_all()
    for n, r in roots.items():
        verify_store_cq(r, n)

    # The old commitlog files are exactly what align left; config moved unchanged.
    for n, r in roots.items():
        now = file_digests(r, ("commitlog", "migration-backup/config"))
        assert {k.replace("migration-backup/", ""): v for k, v in now.items()} == aligned[n]
    # The way back: n0's committed data as a plain store, read back.
    out = tmp_path / "exported"
    res = run("migrate", "export", "--store", roots["n0"], "--to", out, "--json")
    rep = json.loads(res.output)
    assert res.exit_code == 0 and rep["problems"] == [], res.output
    assert rep["legacyRecords"] == total and rep["dledgerRecords"] >= 6
    with LegacyStore(out) as s:
        cfg = read_config_dir(out)
        assert cfg["consumerOffset"]["offsetTable"]["TopicA@GroupA"]["1"] == 23
        assert set(cfg["topics"]["topicConfigTable"]) >= {"TopicA", "TopicB"}
        q1 = [r.queue_offset for view, res in s.batches() for r in map(res.record, range(res.n))
              if r.queue_id == 1 and s.topic_of(view, r) == "TopicA"]
        assert q1 == list(range(26))
