# Migrated stores served by a 3-node group in one process (issue 29): each
# node is a full BrokerStore as run_broker_store composes it (real stores
# under tmp_path, MemoryNetwork, trio MockClock; tests/broker/store/
# test_gate.py's Group), upgraded by `migrate apply` or by the broker on
# start.
#   * the first leader's import of the old config tables goes through the
#     append hook: its records carry PHYSICALOFFSET = entry pos + 48 and
#     their queue's next offsets, so `verifyStore --cq` is clean on every
#     node after the import and after messages sent on top of it.
import trio

from broker.metadata.records import CONSUMER_OFFSET_TOPIC, TOPIC_CONFIG_TOPIC
from consumequeue import record as M
from consumequeue.reader import read_messages
from tests.broker.store.test_gate import IDS, SEG, Group
from tests.helpers.legacy_fixtures import build_master_slave_store
from tests.tools.migrate.checks import verify_store_cq


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
