# MetadataService and its applier on a real SegmentedStore in tmp_path
# (64 KiB segments, so logs roll over several files): only internal-topic
# records are applied, offset commits are coalesced, a restart from a
# snapshot plus the log tail equals a replay from scratch, torn and mixed
# snapshot files are handled, fastjson files are read, and the retention
# floor is enforced.
import os
import shutil

import pytest
import trio
import trio.testing

from broker.common.values import InvalidMetadataError, TopicConfig
from broker.metadata import snapshot
from broker.metadata.applier import MetadataApplier, MetadataGapError, find_hits
from broker.metadata.records import TOPIC_CONFIG_TOPIC, OffsetCommit, TopicUpsert, encode_op
from broker.metadata.service import MetadataConfig, MetadataService
from broker.metadata.tables import MetadataState, SubscriptionGroupConfig
from commitlog.errors import NotLeaderError
from commitlog.watermark import Watermark
from native.dispatch import NATIVE, PYTHON
from native.hashing import java_hash_str
from tests.broker.metadata.helpers import LocalNode, collision_topic, config_files, open_store, replay_from_scratch

FAST = MetadataConfig(offset_flush_interval_ms=50, snapshot_interval_s=3600)


async def fill(svc: MetadataService, node: LocalNode, rounds: int, start: int = 0) -> None:
    """Metadata changes interleaved with foreign traffic."""
    for r in range(start, start + rounds):
        await svc.update_topic(TopicConfig("TopicA", 4, 4, attributes={"round": str(r)}))
        node.append_foreign(r)
        await svc.update_group(SubscriptionGroupConfig(f"g{r % 3}", retry_max_times=r % 17))
        for k in range(3):
            node.append_foreign(r * 3 + k)
        await svc.commit_offsets([("TopicA", f"g{r % 3}", q, r * 10 + q) for q in range(4)])
        if r % 7 == 3:
            await svc.reset_offsets("TopicA", "g0", {0: r})
        if r % 11 == 5:
            await svc.delete_topic("TopicB")
            await svc.update_topic(TopicConfig("TopicB", 2, 2))


async def test_applier_applies_only_internal_records_across_segments(tmp_path):
    assert java_hash_str(collision_topic(TOPIC_CONFIG_TOPIC)) == java_hash_str(TOPIC_CONFIG_TOPIC)
    store = open_store(tmp_path)
    node = LocalNode(store)
    expected = MetadataState()
    for i in range(600):
        node.append_foreign(i)
        if i % 20 == 0:
            op = (TopicUpsert(TopicConfig("TopicA", 1 + i // 20 % 8, 4)) if i % 40
                  else OffsetCommit({"TopicA@g": {i % 4: i}}))
            [(index, _)] = await node.append([encode_op(op, timestamp_ms=1000 + i)])
            expected.apply(op, index, 1000 + i)
    expected.applied_index = store.committed_index
    assert len(store.data.segments) >= 4  # the batches cross segment rolls
    native = replay_from_scratch(store)
    assert native.state == expected and native.state.topics.get("TopicA").read_queue_nums == 1 + 580 // 20 % 8
    assert native.stats["ops"] == 30
    python = replay_from_scratch(store, PYTHON)
    assert python.state == expected
    if NATIVE is not None:
        # Small read batches: every chunk boundary is exercised.
        small = MetadataApplier(store, Watermark(store.committed_index), max_batch_entries=7)
        small.apply_available()
        assert small.state == expected
    store.close()


def test_find_hits_only_takes_aligned_hashes():
    import struct
    needle = struct.pack("=i", java_hash_str(TOPIC_CONFIG_TOPIC))
    # The needle at byte 2 straddles records 0 and 1 (not a topic hash);
    # those at bytes 8 and 16 are records 2 and 4.
    col = b"\0\0" + needle + b"\0\0" + needle + b"\0\0\0\0" + needle
    assert find_hits(col) == [2, 4]


async def test_service_writes_coalesce_offsets_and_read_your_writes(tmp_path, autojump_clock):
    store = open_store(tmp_path)
    node = LocalNode(store)
    svc = MetadataService.open(node, store, str(tmp_path), FAST)
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        index = await svc.update_topic(TopicConfig("TopicA", 8, 8))
        assert svc.topic_config("TopicA").write_queue_nums == 8 and svc.applied_index >= index
        with pytest.raises(InvalidMetadataError):
            await svc.update_topic(TopicConfig(TOPIC_CONFIG_TOPIC))
        before = node.appends
        indexes = []

        async def consumer(c):
            indexes.append(await svc.commit_offsets([("TopicA", "g", c % 8, 100 + c)]))

        async with trio.open_nursery() as consumers:
            for c in range(64):
                consumers.start_soon(consumer, c)
        # 64 commits in one flush window: one append, one record.
        assert node.appends - before == 1 and len(set(indexes)) == 1
        assert svc.offset_table("TopicA", "g") == {q: 156 + q for q in range(8)}
        # Staged-but-unflushed commits are visible to queries on the leader.
        svc.stage_offsets([("TopicA", "g", 0, 500)])
        assert svc.query_offset("TopicA", "g", 0) == 500
        assert svc.query_offset("TopicA", "g", 0, include_staged=False) == 156
        # A reset drops staged commits of its queues: the stale 500 never lands.
        await svc.reset_offsets("TopicA", "g", {0: 3})
        await svc.flush_offsets()
        assert svc.query_offset("TopicA", "g", 0) == 3
        with pytest.raises(InvalidMetadataError):
            await svc.reset_offsets("TopicA", "g", {0: -5})
        with pytest.raises(InvalidMetadataError):
            await svc.commit_offset("TopicA", "g@x", 0, 1)
        node.is_leader = False
        with pytest.raises(NotLeaderError):
            await svc.commit_offset("TopicA", "g", 0, 9)
        nursery.cancel_scope.cancel()
    store.close()


async def test_restart_from_snapshot_plus_tail_equals_replay_from_scratch(tmp_path, autojump_clock):
    store = open_store(tmp_path)
    node = LocalNode(store)
    svc = MetadataService.open(node, store, str(tmp_path), FAST)
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        await fill(svc, node, 20)
        mid = await svc.write_snapshot()
        saved = tmp_path / "saved-config"
        shutil.copytree(tmp_path / "config", saved)
        await fill(svc, node, 20, start=20)
        nursery.cancel_scope.cancel()  # clean close writes a final snapshot
    final_state = svc.state
    assert svc.persisted_index == store.committed_index
    store.close()

    # Clean restart: the final snapshot alone is the state.
    store = open_store(tmp_path)
    node = LocalNode(store)
    reopened = MetadataService.open(node, store, str(tmp_path), FAST)
    assert reopened.state == final_state
    # Crash after the mid snapshot: the files are the old ones; the tail is
    # replayed on start.
    shutil.rmtree(tmp_path / "config")
    shutil.copytree(saved, tmp_path / "config")
    svc = MetadataService.open(node, store, str(tmp_path), FAST)
    assert svc.applied_index == mid < store.committed_index
    assert svc.min_retained_index() == mid + 1
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        await svc.wait_applied(store.committed_index)
        assert svc.state == final_state == replay_from_scratch(store).state
        assert svc.state.offsets.query("TopicA", "g0", 0) == 390
        nursery.cancel_scope.cancel()
    assert svc.persisted_index == store.committed_index
    store.close()


async def test_mixed_snapshot_files_and_torn_tmp_are_repaired_by_replay(tmp_path, autojump_clock):
    store = open_store(tmp_path)
    node = LocalNode(store)
    svc = MetadataService.open(node, store, str(tmp_path), FAST)
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        await fill(svc, node, 10)
        await svc.write_snapshot()
        old = config_files(tmp_path)
        await fill(svc, node, 10, start=10)
        await svc.write_snapshot()
        nursery.cancel_scope.cancel()
    truth = svc.state
    store.close()
    cfg = tmp_path / "config"
    # A crash between the renames: consumerOffset.json is from the old
    # snapshot, the others from the new one; and a torn topics.json.tmp.
    (cfg / "consumerOffset.json").write_bytes(old["consumerOffset.json"])
    (cfg / "topics.json.tmp").write_bytes(b'{"topicConfigTable":{"TopicA":{"topicName":"Top')
    loaded = snapshot.load_snapshot(str(tmp_path))
    assert not (cfg / "topics.json.tmp").exists() and loaded.problems == ()
    assert loaded.state.applied_index == snapshot.load_snapshot(str(tmp_path)).file_indexes["consumerOffset.json"]
    assert loaded.state.applied_index < truth.applied_index
    store = open_store(tmp_path)
    node = LocalNode(store)
    svc = MetadataService.open(node, store, str(tmp_path), FAST)
    svc.applier.apply_available()
    assert svc.state == truth
    store.close()
    # A file torn in place (not by us) is reported and rebuilt from the log.
    (cfg / "topics.json").write_bytes(b'{"topicConfigTable":{')
    loaded = snapshot.load_snapshot(str(tmp_path))
    assert loaded.problems and loaded.state.applied_index == -1
    store = open_store(tmp_path)
    svc = MetadataService.open(LocalNode(store), store, str(tmp_path), FAST)
    svc.applier.apply_available()
    assert svc.state == truth
    store.close()


def test_stock_rocketmq_files_with_unquoted_keys_are_imported(tmp_path):
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "consumerOffset.json").write_text(
        '{\n\t"offsetTable":{\n\t\t"TopicA@g1":{0:123,1:456},\n\t\t"%RETRY%g1@g1":{0:7}\n\t}\n}')
    (cfg / "topics.json").write_text(
        '{"dataVersion":{"counter":5,"stateVersion":0,"timestamp":1700000000000},"topicConfigTable":'
        '{"TopicA":{"order":false,"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG",'
        '"topicName":"TopicA","topicSysFlag":0,"writeQueueNums":4,"topicMessageType":"NORMAL"}}}')
    loaded = snapshot.load_snapshot(str(tmp_path))
    s = loaded.state
    assert loaded.problems == () and s.applied_index == -1
    assert s.offsets.table_of("TopicA", "g1") == {0: 123, 1: 456}
    assert s.offsets.query("%RETRY%g1", "g1", 0) == 7
    assert s.topics.get("TopicA").perm == 6 and s.topics.data_version.counter == 5
    # Written back as standard JSON that keeps unknown fields.
    files = snapshot.render(s)
    assert b'"0": 123' in files["consumerOffset.json"] and b'"topicMessageType": "NORMAL"' in files["topics.json"]


async def test_retention_floor_and_gap_detection(tmp_path, autojump_clock):
    store = open_store(tmp_path)
    node = LocalNode(store)
    svc = MetadataService.open(node, store, str(tmp_path), FAST)
    assert svc.min_retained_index() == 0  # no snapshot: keep everything
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        await fill(svc, node, 40)
        index = await svc.write_snapshot()
        assert svc.min_retained_index() == index + 1 == store.committed_index + 1
        nursery.cancel_scope.cancel()
    truth = svc.state
    # Retention deletes head segments (it may: all are below the floor).
    deleted = store.delete_expired(now_ms=2**62, disk_used_ratio=1.0)
    assert deleted and store.begin_index > 0
    assert store.begin_index <= svc.min_retained_index()
    store.close()
    store = open_store(tmp_path)
    svc = MetadataService.open(LocalNode(store), store, str(tmp_path), FAST)
    assert svc.state == truth
    # Without the snapshot the log no longer reaches back: a typed error,
    # never silently partial tables.
    shutil.rmtree(tmp_path / "config")
    with pytest.raises(MetadataGapError) as err:
        MetadataService.open(LocalNode(store), store, str(tmp_path), FAST)
    assert err.value.begin_index == store.begin_index
    applier = MetadataApplier(store, Watermark(store.committed_index))
    with pytest.raises(MetadataGapError):
        applier.apply_available()
    # The running applier stops and fails waiters; install() resumes it.
    async with trio.open_nursery() as nursery:
        await nursery.start(applier.run)
        with pytest.raises(MetadataGapError):
            await applier.wait_applied(store.committed_index)
        applier.install(truth)
        assert await applier.wait_applied(store.committed_index) == store.committed_index
        nursery.cancel_scope.cancel()
    assert not os.path.exists(tmp_path / "config")
    store.close()


async def test_offsets_of_a_flush_in_flight_stay_visible(tmp_path, autojump_clock):
    """While a flush's append waits for its quorum, the offsets it carries
    were already acknowledged to consumers: queries must not read back the
    older applied value meanwhile (a consumer taking over would re-read)."""
    store = open_store(tmp_path)
    node = LocalNode(store)
    svc = MetadataService.open(node, store, str(tmp_path), FAST)
    release = trio.Event()
    real_append = node.append

    async def slow_append(bodies):
        # Placed in the log at once, like ReplicaNode (call order is log
        # order); committed only when the quorum ack, held back, arrives.
        placed = node.store.append_leader(list(bodies), node.term)
        await release.wait()
        return node._commit(placed)

    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        await svc.update_topic(TopicConfig("TopicB", 4, 4))
        await svc.commit_offsets([("TopicB", "g", 0, 10)])
        node.append = slow_append
        svc.stage_offsets([("TopicB", "g", 0, 20), ("TopicB", "g", 1, 7)])
        nursery.start_soon(svc.flush_offsets)
        await trio.testing.wait_all_tasks_blocked()
        assert svc.query_offset("TopicB", "g", 0, include_staged=False) == 10  # not applied yet
        assert svc.query_offset("TopicB", "g", 0) == 20 and svc.query_offset("TopicB", "g", 1) == 7
        # a reset issued while the flush is in flight lands after it in the
        # log, so it wins (its append commits both)
        node.append = real_append
        nursery.start_soon(svc.reset_offsets, "TopicB", "g", {1: 2})
        await trio.testing.wait_all_tasks_blocked()
        release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert svc.query_offset("TopicB", "g", 0) == 20
        assert svc.query_offset("TopicB", "g", 1) == 2
        nursery.cancel_scope.cancel()
    store.close()
