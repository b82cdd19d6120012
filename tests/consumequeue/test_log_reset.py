# Consume queues and index after a follower's log reset (store.reset_to: the
# leader no longer had the entries the follower needed).  The follower
# dispatched part of the old log, is reset to a later begin, receives the
# leader's entries from there, and ConsumeQueueService.on_log_reset brings
# its consume queues and index to exactly what a clean rebuild of its new
# log writes -- same queue offsets, pre-blank units below each queue's first
# surviving message, min offsets moved up -- except that a queue with no
# message left keeps its numbering as pre-blank units (a placeholder) until
# its next message.  Pulls below the new min offsets answer OFFSET_TOO_SMALL
# (PULL_OFFSET_MOVED to the client, with the min offset to go on from).
# The live dispatcher also notices a reset nobody reported (its position
# below the log's first) and rebases by itself.
import pytest
import trio

from commitlog.watermark import Watermark
from consumequeue import record as M
from consumequeue import service
from consumequeue.cq import CQ_UNIT_SIZE, PRE_BLANK_UNIT
from consumequeue.queue_offsets import QueueOffsetTable
from consumequeue.reader import PULL_OFFSET_MOVED, pull_response_code, read_messages
from consumequeue.reader import GetMessageStatus as S
from consumequeue.service import ConsumeQueueService
from consumequeue.verify import verify
from tests.consumequeue.test_dispatch import SMALL, bodies, clean_build, open_store, tree

SEG = 16 << 10  # ~70 messages per data segment


def leader_with(root, n_old: int, n_new: int):
    """A committed leader log: n_old messages of T/U plus a few of Z (only
    in the old part), then n_new more of T/U."""
    store = open_store(root, SEG)
    store.add_append_hook(QueueOffsetTable().append_hook)
    z = [M.encode(M.MessageRecord(topic="Z", queue_id=0, body=b"z%d" % i, properties={"KEYS": f"z{i}"}))
         for i in range(5)]
    for a in range(0, n_old, 50):
        store.append_leader(bodies(min(50, n_old - a), a), term=1)
        if a == 50:
            store.append_leader(z, term=1)
    for a in range(n_old, n_old + n_new, 50):
        store.append_leader(bodies(min(50, n_old + n_new - a), a), term=2)
    store.set_committed(store.end_index)
    return store


def replicate(leader, follower, upto: int) -> None:
    while follower.end_index < upto:
        batch = leader.read_batch(follower.end_index + 1, 64 << 10, min(100, upto - follower.end_index))
        follower.append_follower(batch)
    follower.set_committed(upto)


def reset_follower(leader, follower, k: int) -> None:
    follower.reset_to(k, leader.pos_of(k), leader.term_at(k - 1), leader.chain_crc_at(k - 1))
    replicate(leader, follower, leader.end_index)


def files(svc) -> tuple[dict, list]:
    svc.engine.cqs.write_pending()
    for f in svc.engine.index.files:
        f.write_header()
    return tree(svc.engine.root)


def check_equals_clean(svc, store, clean_root, z_max: int) -> None:
    """Identical to a clean rebuild, but for Z's placeholder."""
    cq, idx = files(svc)
    clean_cq, clean_idx = clean_build(store, clean_root, config=SMALL)
    z = {p: b for p, b in cq.items() if p.startswith("Z/")}
    assert [p for p in clean_cq if p.startswith("Z/")] == []
    assert {p: b for p, b in cq.items() if not p.startswith("Z/")} == clean_cq
    assert idx == clean_idx and idx
    (zbytes,) = z.values()
    assert zbytes == PRE_BLANK_UNIT * z_max + bytes(len(zbytes) - z_max * CQ_UNIT_SIZE)
    zq = svc.engine.cqs.get("Z", 0)
    assert zq.min_offset == zq.max_offset == z_max and zq.is_placeholder


def test_follower_reset_rebuilds_queues_and_index_like_a_clean_rebuild(tmp_path):
    leader = leader_with(tmp_path / "leader", 300, 400)
    follower = open_store(tmp_path / "follower", SEG)
    replicate(leader, follower, 150)
    svc = ConsumeQueueService.open(follower, Watermark(follower.committed_index), config=SMALL)
    service.dispatch_committed(follower, svc.engine)
    t0 = svc.engine.cqs.get("T", 0)
    old_max = t0.max_offset
    assert t0.min_offset == 0 and old_max > 0 and svc.engine.index.files

    k = 420  # the leader's log now begins here (its head went by retention)
    reset_follower(leader, follower, k)
    begin = follower.pos_of(k)
    assert svc.on_log_reset()
    assert not svc.on_log_reset()  # idempotent
    assert svc.engine.pos == begin and svc.engine.last_index == k - 1
    # Before the new entries are dispatched: every queue kept its numbering,
    # nothing is readable below it, and the index is gone.
    assert t0.min_offset == t0.max_offset == old_max and t0.is_placeholder
    assert svc.engine.index.files == []
    r = read_messages(svc, "T", 0, 3)
    assert (r.status, r.next_begin_offset) == (S.OFFSET_TOO_SMALL, old_max)
    assert read_messages(svc, "T", 0, old_max).status is S.OFFSET_OVERFLOW_ONE

    service.dispatch_committed(follower, svc.engine)
    assert svc.engine.pos == service.positions(follower).committed_pos
    check_equals_clean(svc, follower, tmp_path / "clean", 5)

    # Queue offsets are those the leader stamped; min offsets moved up to
    # the first surviving message.
    first = M.decode(follower.get(k).body)
    q = svc.engine.cqs.get(first.topic, first.queue_id)
    assert q.min_offset == first.queue_offset > old_max
    assert q.get_unit(first.queue_offset).phy == begin + 48
    assert q.get_unit(first.queue_offset - 1).is_blank
    r = read_messages(svc, first.topic, first.queue_id, 0)
    assert r.status is S.OFFSET_TOO_SMALL and r.next_begin_offset == first.queue_offset
    assert pull_response_code(r.status, 0) == PULL_OFFSET_MOVED
    r = read_messages(svc, first.topic, first.queue_id, first.queue_offset, 4)
    assert r.status is S.FOUND and r.queue_offsets[0] == first.queue_offset
    assert r.phy_offsets[0] == begin + 48
    order = first.properties["KEYS"].split()[1]
    assert svc.engine.query_by_key(first.topic, order, 8, 0, 1 << 62).phy_offsets == [begin + 48]
    assert svc.engine.query_by_key("T", "order10", 8, 0, 1 << 62).phy_offsets == []

    # verifyStore --cq: clean (Z's placeholder is not a stray queue).
    p = service.positions(follower)
    rep = verify(svc.engine.source, p.begin_pos, p.committed_pos, root=svc.engine.root, check_cq=True,
                 cq_file_size=SMALL.cq_file_size, index_slot_num=SMALL.index_slot_num,
                 index_num=SMALL.index_num)
    assert rep.problems == [] and rep.queues == len(svc.engine.cqs.queues)

    # A new leader's offset table continues every queue, Z included.
    svc.become_leader()
    assert svc.offsets.next_offset("Z", 0) == 5
    assert svc.offsets.next_offset("T", 0) == t0.max_offset
    svc.close()

    # A restart resumes; nothing changes.
    engine, rep = service.open_engine(follower, config=SMALL)
    assert rep.action == "resumed" and engine.pos == svc.engine.pos
    assert engine.cqs.get("Z", 0).is_placeholder and engine.cqs.get("Z", 0).min_offset == 5
    before = tree(engine.root)
    engine.close()
    assert tree(str(tmp_path / "follower")) == before
    follower.close()
    leader.close()


def test_reset_while_down_rebases_at_open_and_next_message_replaces_placeholder(tmp_path):
    leader = leader_with(tmp_path / "leader", 300, 400)
    follower = open_store(tmp_path / "follower", SEG)
    replicate(leader, follower, 200)
    engine, _ = service.open_engine(follower, config=SMALL)
    service.dispatch_committed(follower, engine)
    engine.checkpoint()
    engine.close()
    reset_follower(leader, follower, 350)
    engine, rep = service.open_engine(follower, config=SMALL)
    assert rep.action == "rebased" and engine.pos == follower.pos_of(350)
    service.dispatch_committed(follower, engine)
    engine.close()  # no checkpoint: the restart truncates back to the rebase
    svc = ConsumeQueueService.open(follower, Watermark(follower.committed_index), config=SMALL)
    assert svc.engine.pos == follower.pos_of(350) and svc.engine.cqs.get("T", 0).is_placeholder
    service.dispatch_committed(follower, svc.engine)
    check_equals_clean(svc, follower, tmp_path / "clean", 5)
    # Z's next message (queue offset 5, stamped by the leader) replaces the
    # placeholder with what a clean rebuild writes.
    leader.append_leader([M.encode(M.MessageRecord(topic="Z", queue_id=0, body=b"again"))], term=2)
    leader.set_committed(leader.end_index)
    replicate(leader, follower, leader.end_index)
    service.dispatch_committed(follower, svc.engine)
    zq = svc.engine.cqs.get("Z", 0)
    assert not zq.is_placeholder and (zq.min_offset, zq.max_offset) == (5, 6)
    assert files(svc) == clean_build(follower, tmp_path / "clean2", config=SMALL)
    assert zq.gaps == 0
    svc.close()
    follower.close()
    leader.close()


@pytest.mark.parametrize("told", [True, False], ids=["on_log_reset", "noticed"])
async def test_on_log_reset_with_the_dispatcher_running(tmp_path, told):
    leader = leader_with(tmp_path / "leader", 300, 400)
    follower = open_store(tmp_path / "follower", SEG)
    replicate(leader, follower, 120)
    wm = Watermark(follower.committed_index)
    svc = ConsumeQueueService.open(follower, wm, config=SMALL)
    svc.dispatcher.checkpoint_interval = 0.01
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        await svc.dispatcher.dispatched.wait_for(120, timeout=10)
        reset_follower(leader, follower, 500)
        if told:
            svc.on_log_reset()
        wm.advance(follower.committed_index)
        await svc.dispatcher.dispatched.wait_for(follower.committed_index, timeout=10)
        await svc.dispatcher.checkpointed.wait_for(follower.committed_index, timeout=10)
        nursery.cancel_scope.cancel()
    assert svc.engine.pos == service.positions(follower).committed_pos
    check_equals_clean(svc, follower, tmp_path / "clean", 5)
    svc.close()
    follower.close()
    leader.close()
