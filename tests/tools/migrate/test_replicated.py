# Migrated stores served by a 3-node group in one process (issue 29): each
# node is a full BrokerStore as run_broker_store composes it (real stores
# under tmp_path, MemoryNetwork, trio MockClock; tests/broker/store/
# test_gate.py's Group), upgraded by `migrate apply` or by the broker on
# start.
#   * the first leader's import of the old config tables goes through the
#     append hook: its records carry PHYSICALOFFSET = entry pos + 48 and
#     their queue's next offsets, so `verifyStore --cq` is clean on every
#     node after the import and after messages sent on top of it;
#   * old stores without an IndexFile (one of them cut by `migrate align`):
#     apply rebuilds the index from the old commitlog and says so, a key
#     lookup finds old keys on every node as soon as it runs, and the three
#     nodes' index files are identical, names included.
import os
import shutil

import trio
from click.testing import CliRunner

from broker.metadata.records import CONSUMER_OFFSET_TOPIC, TOPIC_CONFIG_TOPIC
from consumequeue import record as M
from consumequeue.indexfile import time_name
from consumequeue.reader import query_by_key, read_messages
from tests.broker.store.test_gate import IDS, SEG, Group
from tests.helpers.legacy_fixtures import BASE_TS, build_master_slave_store
from tests.tools.migrate.checks import index_digests, verify_store_cq
from tools.mqadmin import cli


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _offsets(records: bytes):
    off = 0
    while off < len(records):
        yield off
        off += int.from_bytes(records[off:off + 4], "big")


async def stop_all(g: Group) -> None:
    for m in g.alive():
        await m.stop()


async def test_import_records_are_stamped_and_every_node_verifies_clean(tmp_path, autojump_clock):
    for nid in IDS:  # three copies of one old store; every node upgrades on start
        build_master_slave_store(tmp_path / nid, segment_size=SEG)
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery)
        await g.start()
        leader = await g.wait_leader()  # writable: the old tables are imported
        meta = leader.bs.metadata
        assert meta.state.offsets.table_of("TopicA", "GroupA") == {q: 10 for q in range(4)}
        # The import's records are stamped like any other: each consume
        # queue unit points at a record naming its own position and offset.
        cq = leader.bs.cq
        await cq.dispatcher.dispatched.wait_for(leader.bs.store.end_index)
        for topic in (CONSUMER_OFFSET_TOPIC, TOPIC_CONFIG_TOPIC):
            got = read_messages(cq, topic, 0, 0, 64)
            assert len(got.queue_offsets) >= 2 and got.queue_offsets == list(range(len(got.queue_offsets)))
            recs = [M.decode(got.records, off) for off in _offsets(got.records)]
            assert [(r.physical_offset, r.queue_offset) for r in recs] == list(zip(got.phy_offsets,
                                                                                 got.queue_offsets))
        placed = await leader.bs.replica.append([M.MessageRecord(topic="TopicA", queue_id=1, body=b"new %d" % i)
                                                 .encode() for i in range(3)])
        assert len(placed) == 3
        await g.settle()
        await stop_all(g)
        nursery.cancel_scope.cancel()
    for nid in IDS:
        out = verify_store_cq(tmp_path / nid, nid)
        assert out["consumeQueues"]["messages"] > 160  # the old records, the import and the new ones


async def test_apply_rebuilds_a_missing_index_the_same_on_every_node(tmp_path, autojump_clock):
    roots = {nid: tmp_path / nid for nid in IDS}
    master = build_master_slave_store(roots["n0"], segment_size=SEG)
    build_master_slave_store(roots["n1"], segment_size=SEG)
    build_master_slave_store(roots["n2"], segment_size=SEG, limit=len(master.messages) - 20)  # lagging
    for r in roots.values():  # the old brokers ran with messageIndexEnable=false
        shutil.rmtree(r / "index")
    stores = ["--store", roots["n0"], "--replica", roots["n1"], "--replica", roots["n2"]]
    res = run("migrate", "align", *stores)
    assert res.exit_code == 0 and any("cut" in line for line in res.output.splitlines()), res.output
    res = run("migrate", "apply", "--store", roots["n0"], "--self-id", "n0", "--segment-size", SEG)
    assert res.exit_code == 0, res.output
    assert "rebuild the index from the old commitlog" in res.output and "no IndexFile" in res.output
    assert "old consume queues and index are complete" not in res.output
    assert "rebuilt the index" in res.output, res.output
    assert os.listdir(roots["n0"] / "index")
    old = [master.messages[i] for i in (0, 77, len(master.messages) - 1)]
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery)
        await g.start()  # n1 and n2 upgrade on start
        await g.wait_leader()
        for nid in IDS:  # a key lookup works at once on every node
            cq = g[nid].bs.cq
            for m in old:
                assert query_by_key(cq, m.topic, m.keys).phy_offsets == [m.phy], (nid, m)
                assert query_by_key(cq, m.topic, m.uniq_key).phy_offsets == [m.phy], (nid, m)
        await g.settle()
        await stop_all(g)
        nursery.cancel_scope.cancel()
    digests = {nid: index_digests(r) for nid, r in roots.items()}
    assert digests["n0"] == digests["n1"] == digests["n2"], digests
    assert list(digests["n0"]) == [time_name(BASE_TS)]  # named by the first old message, not the clock
    for nid in IDS:
        verify_store_cq(roots[nid], nid)
