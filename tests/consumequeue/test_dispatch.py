# Dispatch against the real commitlog store: only committed entries reach
# consume queues and the index, restarts resume from the checkpoint, a kill
# -9 mid-dispatch heals to exactly what a clean rebuild writes, missing
# consume queue files trigger a rebuild, and lost commitlog segments
# truncate the queues to match.
import os
import shutil
import signal
import subprocess
import sys

import attrs
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commitlog import metafiles
from commitlog.store import SegmentedStore, StoreConfig
from commitlog.watermark import Watermark
from consumequeue import record as M
from consumequeue import dispatcher as dispatcher_mod
from consumequeue import service
from consumequeue.checkpoint import DispatchState, StoreCheckpoint
from consumequeue.dispatcher import DispatchConfig, DispatchEngine
from consumequeue.queue_offsets import QueueOffsetTable
from consumequeue.service import ConsumeQueueService
from native import dispatch as D
from tests.helpers import REPO_ROOT
from tests.helpers.resident import resident_kib
from tests.native.test_dispatch import messages

REPO = str(REPO_ROOT)
SMALL = DispatchConfig(cq_file_size=20 * 50, index_slot_num=101, index_num=300, batch_records=64)
SEG = 1 << 16


def open_store(root, seg=SEG) -> SegmentedStore:
    return SegmentedStore.open(StoreConfig(str(root), data_segment_size=seg, index_segment_size=32 * 1024))


def bodies(n, start=0, queues=4, topics=("T", "U")) -> list[bytes]:
    out = []
    for i in range(start, start + n):
        props = {"TAGS": f"tag{i % 3}", "KEYS": f"k{i % 17} order{i}", "UNIQ_KEY": f"UNIQ{i:08d}"}
        if i % 11 == 5:
            del props["UNIQ_KEY"]
        out.append(M.encode(M.MessageRecord(topic=topics[i % len(topics)], queue_id=i % queues,
                                            body=b"m" * (50 + i % 90), properties=props,
                                            store_timestamp=1_700_000_000_000 + i * 10)))
    return out


def leader_store(root, n, *, commit=True, seg=SEG):
    store = open_store(root, seg)
    table = QueueOffsetTable()
    store.add_append_hook(table.append_hook)
    for a in range(0, n, 100):
        store.append_leader(bodies(min(100, n - a), a), term=1)
    if commit:
        store.set_committed(store.end_index)
    return store, table


def tree(root) -> tuple[dict, list]:
    """Consume queue files by path, index file contents in name order."""
    cq = {}
    base = os.path.join(root, "consumequeue")
    for d, _, files in os.walk(base):
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                cq[os.path.relpath(os.path.join(d, f), base)] = fh.read()
    idx_dir = os.path.join(root, "index")
    idx = []
    if os.path.isdir(idx_dir):
        for name in sorted(os.listdir(idx_dir)):
            with open(os.path.join(idx_dir, name), "rb") as fh:
                idx.append(fh.read())
    return cq, idx


def clean_build(store, root, *, backend=None, config=SMALL):
    """A from-scratch dispatch of the store's committed log into `root`."""
    engine = DispatchEngine(str(root), service.source_for(store), config=config, backend=backend)
    p = service.positions(store)
    assert engine.open(p.begin_pos, p.committed_pos, p.committed_index).action == "fresh"
    engine.dispatch_to(p.committed_pos)
    engine.checkpoint()
    engine.close()
    return tree(str(root))


def all_units(engine):
    return {k: [(u.offset, u.phy, u.size) for u in cq.read(0, 10**6)] for k, cq in engine.cqs.queues.items()}


# --- the live dispatcher ----------------------------------------------------

async def test_dispatch_only_up_to_the_committed_index(tmp_path):
    store = open_store(tmp_path)
    wm = Watermark(store.committed_index)
    svc = ConsumeQueueService.open(store, wm, config=SMALL)
    svc.dispatcher.checkpoint_interval = 0.05
    svc.become_leader()
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        store.append_leader(bodies(40), term=1)
        await trio.testing.wait_all_tasks_blocked()
        assert svc.engine.cqs.max_offset_table() == {}  # appended, not committed: invisible
        assert svc.engine.index.query("T", "k0", 10, 0, 1 << 62).phy_offsets == []
        store.set_committed(9)
        wm.advance(9)
        await svc.dispatcher.dispatched.wait_for(9)
        await trio.testing.wait_all_tasks_blocked()
        assert svc.engine.last_index == 9
        assert sum(svc.engine.cqs.max_offset_table().values()) == 10
        wm.advance(9)  # no news: nothing happens twice
        await svc.dispatcher.dispatch_through(9)
        store.set_committed(39)
        wm.advance(39)
        await svc.dispatcher.dispatched.wait_for(39)
        units = all_units(svc.engine)
        phys = [p for us in units.values() for _, p, _ in us]
        assert len(phys) == 40 == len(set(phys))  # every committed message exactly once
        for (topic, qid), us in units.items():
            assert [o for o, _, _ in us] == list(range(len(us)))  # contiguous from 0
            for o, phy, size in us:
                rec = M.decode(svc.engine.source.read(phy, size), check_crc=True)
                assert (rec.topic, rec.queue_id, rec.queue_offset, rec.physical_offset) == (topic, qid, o, phy)
        hit = svc.engine.index.query("T", "order12", 10, 0, 1 << 62).phy_offsets
        assert hit == [store.pos_of(12) + 48]
        # Quiet now: the dispatcher checkpoints by itself after an interval.
        await svc.dispatcher.checkpointed.wait_for(39, timeout=10)
        assert (DispatchState.load(str(tmp_path)).index, StoreCheckpoint.load(str(tmp_path)).dispatched_index) == \
            (39, 39)
        nursery.cancel_scope.cancel()
    svc.close()
    store.close()
    state = os.path.join(tmp_path, "dispatch_state.json")
    assert os.path.exists(state)


def test_queries_by_key_and_by_time(tmp_path):
    store, _ = leader_store(tmp_path, 400)
    engine, _ = service.open_engine(store, config=SMALL)
    service.dispatch_committed(store, engine)
    t0 = 1_700_000_000_000  # message i was stored at t0 + 10 i
    # Queue T/0 holds messages 0, 4, 8, ...: offset k is message 4k.
    assert engine.offset_by_time("T", 0, t0 + 10 * 40) == 10
    assert engine.offset_by_time("T", 0, t0 + 10 * 41) == 11  # first stored at or after
    assert engine.offset_by_time("T", 0, t0 + 10 * 41, boundary="upper") == 10
    assert engine.offset_by_time("T", 0, 0) == 0
    assert engine.offset_by_time("T", 0, 1 << 60) == 100
    assert engine.offset_by_time("nope", 0, t0) == 0
    res = engine.query_by_key("T", "order42", 32, 0, 1 << 62)
    assert res.phy_offsets == [store.pos_of(42) + 48]
    assert engine.query_by_key("T", "UNIQ00000042", 32, 0, 1 << 62).phy_offsets == [store.pos_of(42) + 48]
    assert engine.query_by_key("U", "order42", 32, 0, 1 << 62).phy_offsets == []  # another topic
    ks = engine.query_by_key("T", "k0", 64, 0, 1 << 62).phy_offsets  # k0: i % 17 == 0, even i
    assert sorted(ks, reverse=True) == ks and len(ks) == len(range(0, 400, 34))
    # Retention: commitlog below entry 200 is gone.
    cut = store.pos_of(200) + 48
    engine.delete_expired(cut)
    cq = engine.cqs.get("T", 0)
    assert cq.min_offset == 50 and cq.read(0, 1)[0].phy >= cut
    engine.close()
    store.close()


async def test_a_follower_dispatches_commits_together_and_a_leader_at_once(tmp_path, autojump_clock):
    """A follower lets commits gather for FOLLOWER_LINGER and dispatches
    them in one round (its queues serve no one until it leads); once it
    leads, every commit is dispatched without waiting."""
    store, _table = leader_store(tmp_path, 0)  # (its hook stamps the records, as the leader did)
    wm = Watermark(store.committed_index)
    svc = ConsumeQueueService.open(store, wm, config=SMALL)
    rounds = []
    real = svc.engine.dispatch_to

    def counted(end_pos, **kw):
        rounds.append(end_pos)
        return real(end_pos, **kw)

    svc.engine.dispatch_to = counted
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        t0 = trio.current_time()
        for i in range(5):  # five commits, one after the other
            store.append_leader(bodies(1, i), term=1)
            store.set_committed(i)
            wm.advance(i)
            await trio.testing.wait_all_tasks_blocked()
        await svc.dispatcher.dispatched.wait_for(4)
        assert len(rounds) == 1 and trio.current_time() - t0 >= service.FOLLOWER_LINGER
        assert sum(svc.engine.cqs.max_offset_table().values()) == 5
        svc.become_leader()
        for i in range(5, 8):
            t1 = trio.current_time()
            store.append_leader(bodies(1, i), term=1)
            store.set_committed(i)
            wm.advance(i)
            await svc.dispatcher.dispatched.wait_for(i)
            assert trio.current_time() == t1  # no linger
        assert len(rounds) == 4
        svc.become_follower()
        assert svc.dispatcher.linger.seconds == service.FOLLOWER_LINGER
        # Stopped while a commit lingers: it is dispatched on the way out.
        store.append_leader(bodies(1, 8), term=1)
        store.set_committed(8)
        wm.advance(8)
        await trio.testing.wait_all_tasks_blocked()
        assert svc.dispatcher.dispatched.value == 7
        nursery.cancel_scope.cancel()
    assert svc.dispatcher.dispatched.value == 8 and sum(svc.engine.cqs.max_offset_table().values()) == 9
    assert DispatchState.load(str(tmp_path)).index == 8
    svc.close()
    store.close()


async def test_become_follower_stops_stamping_and_old_indexes_are_skipped(tmp_path):
    store = open_store(tmp_path)
    wm = Watermark(store.committed_index)
    svc = ConsumeQueueService.open(store, wm, config=SMALL)
    svc.become_leader()
    store.append_leader(bodies(3), term=1)
    svc.become_follower()
    placed = store.append_leader(bodies(1, 3), term=1)
    assert M.decode(store.get(placed[0][0]).body).physical_offset == 0  # not stamped
    assert M.decode(store.get(2).body).physical_offset == store.pos_of(2) + 48
    # An index below the log's first entry (retention, reset_to) is "done".
    svc.dispatcher.end_of_index = lambda i: None
    await svc.dispatcher.dispatch_through(5)
    assert svc.dispatcher.dispatched.value == 5
    svc.close()
    store.close()


def test_retention_moves_queue_min_offsets_and_restart_still_resumes(tmp_path):
    store, _ = leader_store(tmp_path, 1200)
    svc = ConsumeQueueService.open(store, Watermark(store.committed_index), config=SMALL)
    service.dispatch_committed(store, svc.engine)
    t0 = svc.engine.cqs.get("T", 0)
    files_before = len(t0.starts)
    assert store.delete_expired(now_ms=1 << 60)  # everything but the last segment is old
    begin = service.begin_position(store)
    removed_cq, _ = svc.on_retention()
    assert removed_cq > 0 and len(t0.starts) < files_before
    assert t0.min_offset > 0 and t0.read(0, 1)[0].phy >= begin
    assert t0.min_offset == min(u.offset for u in t0.read(0, 10**6) if u.phy >= begin)
    svc.close()
    engine, rep = service.open_engine(store, config=SMALL)
    assert rep.action == "resumed" and engine.cqs.get("T", 0).min_offset == t0.min_offset
    # A rebuild from the retained log: pre-blank units up to each queue's
    # first retained message, then exactly the same units.
    clean_build(store, tmp_path / "clean")
    clean = _loaded(tmp_path / "clean", store)
    assert set(clean.cqs.queues) == set(engine.cqs.queues)
    for key, cq in engine.cqs.queues.items():
        other = clean.cqs.queues[key]
        assert other.min_offset == cq.min_offset and other.max_offset == cq.max_offset
        assert other.read(0, 10**6) == cq.read(0, 10**6)
        assert other.get_unit(other.min_offset - 1).is_blank
    clean.close()
    engine.close()
    store.close()


def test_append_hook_stamps_offsets_and_skips_transactions(tmp_path):
    store = open_store(tmp_path)
    table = QueueOffsetTable()
    store.add_append_hook(table.append_hook)
    msgs = [M.encode(M.MessageRecord(topic="T", queue_id=1, body=b"a")),
            M.encode(M.MessageRecord(topic="T", queue_id=1, sysflag=M.TRANSACTION_PREPARED_TYPE)),
            b"not a message",
            M.encode(M.MessageRecord(topic="T", queue_id=1, sysflag=M.TRANSACTION_COMMIT_TYPE)),
            M.encode(M.MessageRecord(topic="T", queue_id=2))]
    placed = store.append_leader(msgs, term=1)
    recs = {i: store.get(i).body for i, _ in placed}
    assert bytes(recs[2]) == b"not a message"
    got = [(M.decode(recs[i]).queue_offset, M.decode(recs[i]).physical_offset) for i in (0, 1, 3, 4)]
    assert got == [(0, placed[0][1] + 48), (0, placed[1][1] + 48), (1, placed[3][1] + 48),
                   (0, placed[4][1] + 48)]
    assert table.next_offset("T", 1) == 2 and table.next_offset("T", 2) == 1
    store.close()


_TX = (0, M.TRANSACTION_PREPARED_TYPE, M.TRANSACTION_COMMIT_TYPE, M.TRANSACTION_ROLLBACK_TYPE)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(msgs=st.lists(st.tuples(st.sampled_from(["T", "U", "V\u00e9"]), st.integers(0, 3), st.sampled_from(_TX),
                               st.integers(0, 3000)), min_size=1, max_size=40),
       cuts=st.lists(st.integers(1, 39), max_size=2))
def test_grouped_stamping_equals_record_by_record(tmp_path_factory, msgs, cuts):
    """The hook stamps a batch a queue at a time (group, one table lookup per
    queue, the backend writes the offsets): with either backend, across
    segment ends (blank filler in the middle of a batch), the stored bytes
    and the returned stamps are what numbering each record in order gives:
    per-queue counters, 0 for PREPARED/ROLLBACK, PHYSICALOFFSET = pos + 48."""
    records = [M.encode(M.MessageRecord(topic=t, queue_id=q, sysflag=tx, body=b"b" * size))
               for t, q, tx, size in msgs]
    ends = sorted({c for c in cuts if c < len(records)})
    batches = [records[a:b] for a, b in zip([0, *ends], [*ends, len(records)])]
    expected, counters = [], {}
    for t, q, tx, _ in msgs:
        if tx in (M.TRANSACTION_PREPARED_TYPE, M.TRANSACTION_ROLLBACK_TYPE):
            expected.append(0)
        else:
            expected.append(counters.get((t, q), 0))
            counters[(t, q)] = expected[-1] + 1
    stored = {}
    for backend in [b for b in (D.NATIVE, D.PYTHON) if b is not None]:
        root = tmp_path_factory.mktemp(backend.name)
        store = open_store(root, seg=16 * 1024)
        table = QueueOffsetTable(backend=backend)
        store.add_append_hook(table.append_hook)
        stamps, placed = [], []
        for batch in batches:
            got_placed, got_stamps = store.append_stamped(batch, term=1)
            placed += got_placed
            stamps += list(got_stamps)
        assert stamps == expected
        got = [bytes(store.get(i).body) for i, _ in placed]
        for (_, pos), body, qo in zip(placed, got, expected):
            rec = M.decode(body)
            assert (rec.queue_offset, rec.physical_offset) == (qo, pos + 48)
        assert table.snapshot() == counters
        stored[backend.name] = got
        store.close()
    assert len(set(map(tuple, stored.values()))) == 1


def test_new_leader_rebuilds_offsets_from_queues_and_log_tail(tmp_path):
    store, table = leader_store(tmp_path, 200, commit=False)
    store.set_committed(120)
    engine, _ = service.open_engine(store, config=SMALL)
    service.dispatch_committed(store, engine)
    fresh = QueueOffsetTable()
    fresh.rebuild_from_consume_queues(engine.cqs)
    assert fresh.snapshot() != table.snapshot()  # the uncommitted tail is missing
    fresh.rebuild_from_consume_queues(engine.cqs, engine.source, engine.pos, store.end_pos)
    assert fresh.snapshot() == table.snapshot()
    engine.close()
    store.close()


def test_restart_resumes_from_the_checkpoint(tmp_path):
    store, _ = leader_store(tmp_path, 300, commit=False)
    store.set_committed(199)
    engine, rep = service.open_engine(store, config=SMALL)
    service.dispatch_committed(store, engine)
    engine.checkpoint()
    engine.close()
    store.set_committed(299)
    engine, rep = service.open_engine(store, config=SMALL)
    assert rep.action == "resumed" and engine.last_index == 199
    service.dispatch_committed(store, engine)
    assert engine.stats.entries == 100  # only the new entries were scanned
    engine.checkpoint()
    engine.close()
    assert tree(str(tmp_path)) == clean_build(store, tmp_path / "clean")
    store.close()


# --- crash and damage ---------------------------------------------------------

CHILD = r"""
import os, signal, sys
from consumequeue import checkpoint, files, service
from native import dispatch as D, dispatch_twin
from consumequeue.dispatcher import DispatchConfig
from consumequeue.rebuild import open_store
root, point, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg = DispatchConfig(cq_file_size=20 * 50, index_slot_num=101, index_num=300, batch_records=64)
store = open_store(root)
backend = D.PYTHON if point == "py_put_key" else None
engine, _ = service.open_engine(store, config=cfg, backend=backend)
calls = [0]
def bomb():
    calls[0] += 1
    if calls[0] == n:
        os.kill(os.getpid(), signal.SIGKILL)
def wrap(owner, name, after=False):
    real = getattr(owner, name)
    def f(*a, **k):
        if not after:
            bomb()
        r = real(*a, **k)
        if after:
            bomb()
        return r
    setattr(owner, name, f)
if point == "index":
    wrap(engine.index, "put_batch")
elif point == "index_after":  # CQ and index written past the checkpoint
    wrap(engine.index, "put_batch", after=True)
elif point == "py_put_key":  # inside an index batch: items beyond the header
    wrap(dispatch_twin, "py_put_key")  # where the twin's index_put looks it up
elif point == "cq":
    wrap(files.FdCache, "pwrite")
elif point == "state":
    wrap(checkpoint.DispatchState, "store", after=True)
end = service.positions(store).committed_pos
while engine.pos < end:
    engine.dispatch_to(end, max_bytes=6000)
    engine.checkpoint()
sys.exit(3)
"""


@pytest.mark.slow
@pytest.mark.parametrize("point,n", [("index", 9), ("index_after", 7), ("cq", 40), ("state", 3),
                                     ("py_put_key", 1000)])
def test_kill_9_mid_dispatch_then_restart_equals_clean_rebuild(tmp_path, point, n):
    """Slow: a child process killed -9 mid-dispatch, then a restart and a clean rebuild to compare."""
    store, _ = leader_store(tmp_path, 600)
    expected = clean_build(store, tmp_path / "clean")
    store.close()
    child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), point, str(n)], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    store = open_store(tmp_path)
    engine, rep = service.open_engine(store, config=SMALL)
    assert rep.action == "resumed" and 0 < engine.pos < service.positions(store).committed_pos
    service.dispatch_committed(store, engine)
    engine.checkpoint()
    engine.close()
    assert tree(str(tmp_path)) == expected
    store.close()


@pytest.mark.parametrize("damage", ["queue_dir", "one_file", "state"])
def test_missing_consume_queue_files_are_rebuilt(tmp_path, damage):
    store, _ = leader_store(tmp_path, 400)
    expected = clean_build(store, tmp_path / "clean")
    engine, _ = service.open_engine(store, config=SMALL)
    service.dispatch_committed(store, engine)
    engine.checkpoint()
    engine.close()
    if damage == "queue_dir":
        shutil.rmtree(tmp_path / "consumequeue" / "U" / "1")
    elif damage == "one_file":
        os.unlink(tmp_path / "consumequeue" / "T" / "0" / f"{1000:020d}")
    else:
        os.unlink(tmp_path / "dispatch_state.json")
    engine, rep = service.open_engine(store, config=SMALL)
    assert rep.action == "rebuilt", rep
    service.dispatch_committed(store, engine)
    engine.checkpoint()
    engine.close()
    assert tree(str(tmp_path)) == expected
    store.close()


def test_lost_last_commitlog_segments_truncate_the_queues(tmp_path):
    store, table = leader_store(tmp_path, 1200, commit=False)
    store.append_leader(bodies(20, 5000, topics=("Z",)), term=1)  # a queue that lives only at the end
    store.set_committed(store.end_index)
    engine, _ = service.open_engine(store, config=SMALL)
    service.dispatch_committed(store, engine)
    engine.checkpoint()
    engine.close()
    store.close()
    data = tmp_path / "dledger-n0" / "data"
    segs = sorted(os.listdir(data))
    assert len(segs) >= 4
    for name in segs[-2:]:
        os.unlink(data / name)
    store = open_store(tmp_path)
    assert store.end_index < 1199
    engine, rep = service.open_engine(store, config=SMALL)
    assert rep.action == "truncated", rep
    assert engine.pos == service.positions(store).committed_pos
    assert engine.cqs.get("Z", 0) is None and engine.cqs.get("T", 0) is not None
    engine.checkpoint()
    engine.close()
    assert tree(str(tmp_path)) == clean_build(store, tmp_path / "clean")
    store.close()


def test_follower_never_dispatches_its_truncated_uncommitted_tail(tmp_path):
    leader, _ = leader_store(tmp_path / "L", 100, commit=False)
    follower = open_store(tmp_path / "F")
    follower.append_follower(leader.read_batch(0, 1 << 30, 100))
    follower.set_committed(59)
    engine, _ = service.open_engine(follower, config=SMALL)
    service.dispatch_committed(follower, engine)
    before = all_units(engine)
    # A new leader holds only entries 0..59 and appends different messages.
    new_leader = open_store(tmp_path / "L2")
    new_leader.append_follower(leader.read_batch(0, 1 << 30, 60))
    new_leader.set_committed(59)
    nl_engine, _ = service.open_engine(new_leader, config=SMALL)
    service.dispatch_committed(new_leader, nl_engine)
    table = QueueOffsetTable()
    table.rebuild_from_consume_queues(nl_engine.cqs, nl_engine.source, nl_engine.pos, new_leader.end_pos)
    new_leader.add_append_hook(table.append_hook)
    new_leader.append_leader(bodies(40, 1000, topics=("T", "V")), term=2)
    follower.truncate_from(60)
    follower.append_follower(new_leader.read_batch(60, 1 << 30, 40))
    follower.set_committed(99)
    assert all_units(engine) == before  # the old tail never reached a queue
    service.dispatch_committed(follower, engine)
    engine.checkpoint()
    engine.close()
    assert tree(str(tmp_path / "F")) == clean_build(follower, tmp_path / "clean")
    clean = _loaded(tmp_path / "clean", follower)
    for cq_units in all_units(clean).values():
        assert [o for o, _, _ in cq_units] == list(range(len(cq_units)))  # contiguous across leaders
    assert ("V", 1) in clean.cqs.queues and ("T", 0) in clean.cqs.queues
    clean.close()
    for s in (leader, follower, new_leader):
        s.close()
    nl_engine.close()


def _loaded(root, store):
    e = DispatchEngine(str(root), service.source_for(store), config=SMALL)
    e.cqs.load()
    return e


# --- native and Python paths write the same files --------------------------------

@pytest.mark.skipif(D.NATIVE is None, reason="native helpers not built")
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(st.lists(messages(), min_size=1, max_size=80), st.integers(1, 40))
def test_native_and_python_dispatch_write_identical_files(tmp_path_factory, msgs, batch):
    root = tmp_path_factory.mktemp("eq")
    store = open_store(root / "store", seg=4096)
    table = QueueOffsetTable()
    store.add_append_hook(table.append_hook)
    store.append_leader([M.encode(m) for m in msgs], term=1)
    store.set_committed(store.end_index)
    cfg = DispatchConfig(cq_file_size=20 * 7, index_slot_num=5, index_num=9, batch_records=batch)
    trees = [clean_build(store, root / be.name, backend=be, config=cfg) for be in (D.NATIVE, D.PYTHON)]
    assert trees[0] == trees[1]
    store.close()


def test_restart_keeps_dispatched_messages_when_store_checkpoint_lags(tmp_path):
    # The store checkpoints its committed index every few seconds; dispatch
    # checkpoints its own progress.  After a crash the store may remember an
    # older committed index than consumers were already shown: the restart
    # must not hide those messages (dispatched implies committed).
    store, _ = leader_store(tmp_path, 300)
    engine, _ = service.open_engine(store, config=SMALL)
    service.dispatch_committed(store, engine)
    engine.checkpoint()
    before = tree(tmp_path)
    engine.close()
    store_dir, end = store.store_dir, store.end_index
    store.close()
    metafiles.write_checkpoint(store_dir, end, 120)  # what a lagging checkpoint would have said
    store = open_store(tmp_path)
    assert store.committed_index == 120
    engine, report = service.open_engine(store, config=SMALL)
    assert store.committed_index == 299  # raised to what was dispatched
    assert report.action == "resumed"
    after = tree(tmp_path)
    assert after == before and before[0]
    engine.close()
    store.close()


def _staged_build(store, root, backend, cfg, *, chunk=None):
    engine = DispatchEngine(str(root), service.source_for(store), config=cfg, backend=backend)
    p = service.positions(store)
    assert engine.open(p.begin_pos, p.committed_pos, p.committed_index).action == "fresh"
    while engine.pos < p.committed_pos:
        engine.dispatch_to(p.committed_pos, max_bytes=chunk)
    engine.checkpoint()
    engine.close()
    return tree(str(root))


@pytest.mark.skipif(D.NATIVE is None, reason="native helpers not built")
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(st.lists(st.tuples(messages(), st.sampled_from([0, 1, 1, 1, 1, 3])), min_size=6, max_size=120),
       st.integers(1, 9), st.booleans(), st.sampled_from([None, 300, 2000]))
def test_staging_across_batches_writes_what_one_put_per_run_writes(tmp_path_factory, monkeypatch, drawn,
                                                                   batch, stamped, chunk):
    # The engine stages each queue's units across scan batches; with a
    # stage limit of one byte every run goes to put_units at once (the
    # unstaged path).  Unstamped queue offsets mostly run on, but also
    # repeat and jump, within a batch and between batches.
    from consumequeue import dispatcher
    root = tmp_path_factory.mktemp("stage")
    store = open_store(root / "store", seg=4096)
    if stamped:
        store.add_append_hook(QueueOffsetTable().append_hook)
    nxt, msgs = {}, []
    for m, step in drawn:
        key = ("T" if m.topic != "主题" else m.topic, m.queue_id % 2)  # few queues, many runs each
        nxt[key] = nxt.get(key, -1) + step
        msgs.append(attrs.evolve(m, topic=key[0], queue_id=key[1], queue_offset=max(nxt[key], 0)))
    store.append_leader([M.encode(m) for m in msgs], term=1)
    store.set_committed(store.end_index)
    cfg = DispatchConfig(cq_file_size=20 * 7, index_slot_num=5, index_num=9, batch_records=batch)
    trees = []
    for limit in (1, 60, 1 << 20):
        monkeypatch.setattr(dispatcher, "STAGE_LIMIT", limit)
        for be in (D.NATIVE, D.PYTHON):
            trees.append(_staged_build(store, root / f"{be.name}-{limit}", be, cfg, chunk=chunk))
    assert all(t == trees[0] for t in trees[1:])
    store.close()


def test_index_file_creation_is_synced_by_the_checkpoint_not_inline(tmp_path, monkeypatch):
    # Dispatch runs on the event loop: a new index file's directory entry is
    # left for the checkpoint's worker-thread part, which syncs it.
    import consumequeue.dispatcher as dispatcher_mod
    import consumequeue.indexfile as indexfile_mod

    inline = []
    monkeypatch.setattr(indexfile_mod, "fsync_dir", inline.append)
    store, _ = leader_store(tmp_path, 40)
    engine, _ = service.open_engine(store, config=SMALL)
    service.dispatch_committed(store, engine)
    assert engine.index.files and inline == []
    assert engine.index.dir in engine.index.dirty_dirs
    synced = []
    monkeypatch.setattr(dispatcher_mod, "sync_paths", lambda files, dirs: synced.extend(dirs))
    engine.checkpoint()
    assert engine.index.dir in synced and engine.index.dirty_dirs == set()
    engine.close()
    store.close()


def test_dispatch_does_not_keep_what_it_read_resident(tmp_path, monkeypatch):
    """The source's maps release pages half a RELEASE_STEP behind the
    dispatch position: RSS stays bounded however much log goes by."""
    monkeypatch.setattr(dispatcher_mod, "RELEASE_STEP", 1 << 20)
    store = open_store(tmp_path / "log", seg=1 << 20)
    table = QueueOffsetTable()
    store.add_append_hook(table.append_hook)
    big = [M.encode(M.MessageRecord(topic="T", queue_id=i % 4, body=bytes([i % 251]) * 4000)) for i in range(1100)]
    for a in range(0, len(big), 50):
        store.append_leader(big[a:a + 50], term=1)
    store.set_committed(store.end_index)
    with store:
        engine = DispatchEngine(str(tmp_path / "cq"), service.source_for(store), config=SMALL)
        p = service.positions(store)
        engine.open(p.begin_pos, p.committed_pos, p.committed_index)
        engine.dispatch_to(p.committed_pos)
        assert p.committed_pos > 4 << 20
        assert resident_kib(os.path.join(store.store_dir, "data")) <= 1024
        units = all_units(engine)
        assert sum(len(v) for v in units.values()) == 1100
        # what was released still reads back (faulted in from the page cache)
        u = units["T", 0][0]
        assert M.decode(engine.source.read(u[1], u[2])).body == bytes([0]) * 4000
        engine.close()
