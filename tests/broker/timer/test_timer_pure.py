# Timer messages, the pure parts (broker/store/timer.py, the timer.done op
# and TimerProgress in broker/metadata): the send rewrite and its refusals,
# the recall handle, the leader's due-time index, the replicated progress
# (done ranges, replay idempotent, snapshot file).
import os
import random

import pytest

from broker.config import BrokerConfig
from broker.metadata import snapshot
from broker.metadata.records import MetadataRecordError, TimerDone, decode_op, encode_op
from broker.metadata.tables import MetadataState, TimerProgress
from broker.store.timer import (
    TIMER_TOPIC,
    DueIndex,
    RecallHandle,
    TimerMessageError,
    from_timer,
    timer_key,
    to_timer,
)
from consumequeue import record as M

HOST = M.HostAddr("10.0.0.9", 10911)
NOW = 1_700_000_000_000


def cfg(**extra) -> BrokerConfig:
    base = {"brokerName": "bk", "dLegerGroup": "bk", "dLegerSelfId": "n0", "dLegerPeers": "n0-127.0.0.1:40911",
            "storePathRootDir": "/tmp/timer-pure/x", **extra}
    return BrokerConfig.from_dict(base)[0]


def msg(**props) -> M.MessageRecord:
    return M.MessageRecord(topic="T", body=b"b", queue_id=3, flag=7, reconsume_times=1,
                           properties={"TAGS": "x", "UNIQ_KEY": "U1", **props})


def test_rewrite_to_the_timer_topic_and_back():
    c = cfg()
    assert (c.timer_max_delay_sec, c.timer_precision_ms) == (3 * 86400, 10)
    parked = to_timer(msg(TIMER_DELIVER_MS=str(NOW + 5001)), NOW, c)
    assert (parked.topic, parked.queue_id) == (TIMER_TOPIC, 0)
    assert parked.properties["TIMER_OUT_MS"] == str(NOW + 5010)  # rounded up: never early
    assert (parked.properties["REAL_TOPIC"], parked.properties["REAL_QID"]) == ("T", "3")
    assert parked.properties["TIMER_DELIVER_MS"] == str(NOW + 5001)
    # the relative forms, in upstream's order of precedence
    assert to_timer(msg(TIMER_DELAY_SEC="3"), NOW, c).properties["TIMER_OUT_MS"] == str(NOW + 3000)
    assert to_timer(msg(TIMER_DELAY_MS="1234"), NOW, c).properties["TIMER_OUT_MS"] == str(NOW + 1240)
    assert to_timer(msg(TIMER_DELAY_SEC="1", TIMER_DELIVER_MS=str(NOW + 9000)), NOW, c) \
        .properties["TIMER_OUT_MS"] == str(NOW + 1000)
    back = from_timer(parked, store_timestamp=NOW + 5011, store_host=HOST)
    assert (back.topic, back.queue_id, back.body, back.flag, back.reconsume_times) == ("T", 3, b"b", 7, 1)
    assert "REAL_TOPIC" not in back.properties and back.properties["TIMER_DEQUEUE_MS"] == str(NOW + 5011)
    assert back.uniq_key == "U1" and back.tags == "x" and back.store_host == HOST
    # a rewritten one is not rewritten again
    assert to_timer(parked, NOW, c) is parked


def test_what_stays_as_it_is_and_what_is_refused():
    c = cfg(timerMaxDelaySec="60")
    plain = msg()
    assert to_timer(plain, NOW, c) is plain
    # due now or before: delivered at once (stored to its own topic)
    for when in (NOW, NOW - 1000, 0):
        rec = msg(TIMER_DELIVER_MS=str(when))
        assert to_timer(rec, NOW, c) is rec
    # a delete marker for the past is illegal
    with pytest.raises(TimerMessageError):
        to_timer(msg(TIMER_DELIVER_MS=str(NOW - 1), TIMER_DEL_UNIQKEY="U0"), NOW, c)
    # beyond the horizon, and values Long.parseLong refuses: upstream's wording
    for props in ({"TIMER_DELIVER_MS": str(NOW + 60_001)}, {"TIMER_DELAY_SEC": "61"}, {"TIMER_DELAY_MS": "soon"},
                  {"TIMER_DELIVER_MS": " 5"}, {"TIMER_DELIVER_MS": ""}, {"TIMER_DELAY_SEC": str(1 << 70)}):
        with pytest.raises(TimerMessageError, match="timer message illegal, the delay time should not be bigger "
                                                    "than the max delay 60000ms"):
            to_timer(msg(**props), NOW, c)
    assert to_timer(msg(TIMER_DELIVER_MS=str(NOW + 60_000)), NOW, c).topic == TIMER_TOPIC  # the edge is in
    # DELAY wins: the TIMER_ properties are dropped (HookUtils.checkIfTimerMessage)
    delayed = to_timer(msg(DELAY="2", TIMER_DELAY_SEC="5"), NOW, c)
    assert delayed.topic == "T" and "TIMER_DELAY_SEC" not in delayed.properties and delayed.properties["DELAY"] == "2"
    # halves wait for their commit (END_TRANSACTION rewrites then)
    half = M.MessageRecord(topic="T", properties={"TIMER_DELAY_SEC": "5"}, sysflag=M.TRANSACTION_PREPARED_TYPE)
    assert to_timer(half, NOW, c) is half


def test_recall_handle_round_trip_and_the_send_answer_key():
    h = RecallHandle(topic="T", broker_name="bk", timestamp=str(NOW + 10), message_id="U1")
    text = h.encode()
    assert RecallHandle.decode(text) == h and RecallHandle.decode(text.rstrip("=")) == h
    import base64
    assert base64.urlsafe_b64decode(text) == f"v1 T bk {NOW + 10} U1".encode()
    for bad in ("", "!!!", base64.urlsafe_b64encode(b"v2 T bk 1 U").decode(),
                base64.urlsafe_b64encode(b"v1 T bk").decode(), "A" * 5000):
        with pytest.raises(ValueError, match="recall handle is invalid"):
            RecallHandle.decode(bad)
    parked = to_timer(msg(TIMER_DELIVER_MS=str(NOW + 100)), NOW, cfg())
    key = timer_key("U1", parked, "bk")
    assert key == "U1" and RecallHandle.decode(key.recall_handle) == RecallHandle(topic="T", broker_name="bk",
                                                                                  timestamp=str(NOW + 100),
                                                                                  message_id="U1")
    assert not hasattr(timer_key("U1", msg(), "bk"), "recall_handle")


def test_due_index_orders_by_time_and_forgets_removed_units():
    idx = DueIndex()
    rng = random.Random(5)
    dues = {u: rng.randrange(0, 10_000) for u in range(500)}
    for u, d in dues.items():
        idx.add(u, d, f"K{u}", u * 100)
    assert len(idx) == 500 and idx.head_due() == min(dues.values())
    for u in range(0, 500, 3):
        idx.remove(u)
    assert idx.find("K3") == [] and idx.find("K4") == [4]
    got = []
    while (batch := idx.pop_due(5_000, 7)):
        assert len(batch) <= 7
        got += batch
    assert [due for _, due, _, _ in got] == sorted(due for _, due, _, _ in got)
    want = sorted((d, u) for u, d in dues.items() if u % 3 and d <= 5_000)
    assert [(due, u) for u, due, _, _ in got] == want
    assert all(idx.find(f"K{u}") == [] for u, *_ in got)
    assert idx.head_due() == min(d for u, d in dues.items() if u % 3 and d > 5_000)
    # a unit put back after a failed append is due again
    u, due, key, phy = got[0]
    idx.add(u, due, key, phy)
    assert idx.pop_due(5_000, 10) == [got[0]]
    # one key stored twice (a producer's retry): both are found
    idx.add(9001, 1, "TWICE", 1)
    idx.add(9002, 2, "TWICE", 2)
    assert idx.find("TWICE") == [9001, 9002]
    idx.remove(9001)
    assert idx.find("TWICE") == [9002]


def test_progress_ranges_and_replay():
    p = TimerProgress()
    rng = random.Random(7)
    order = list(range(200))
    rng.shuffle(order)
    done = set()
    for k, o in enumerate(order):
        p.mark([o], [o], k, NOW)
        done.add(o)
        assert all(p.is_done(x) == (x in done) for x in range(205))
        assert p.low == min(set(range(201)) - done)
        # ranges: sorted, disjoint, not touching each other nor low
        assert all(a < b for a, b in p.done) and all(p.done[i][1] < p.done[i + 1][0] for i in range(len(p.done) - 1))
        assert not p.done or p.done[0][0] > p.low
        assert p.pending_between(0, 200) == 200 - len(done)
    assert (p.low, p.done, p.last_batch, p.last_index) == (200, [], (order[-1],), 199)
    # marking again (a replay) changes nothing but the last batch's bookkeeping
    before = p.to_json()
    p.mark([3, 150], [], 300, NOW)
    assert (p.low, p.done) == (200, []) and p.last_batch == () and before["low"] == 200
    assert TimerProgress.from_json(p.to_json()) == p


def test_timer_done_op_and_snapshot_file(tmp_path):
    op = TimerDone((5, 9), (5,))
    rec = M.decode(encode_op(op, timestamp_ms=NOW))
    assert decode_op(rec) == op and rec.tags == "timer.done"
    for body in (b'{"v":1,"op":"timer.done","offsets":[-1]}', b'{"v":1,"op":"timer.done","offsets":"5"}',
                 b'{"v":1,"op":"timer.done","offsets":[true]}'):
        with pytest.raises(MetadataRecordError):
            decode_op(M.MessageRecord(topic=rec.topic, body=body))
    state = MetadataState(applied_index=12)
    state.apply(op, 12, NOW)
    state.apply(TimerDone((0, 1, 2, 3, 4, 7)), 13, NOW)
    assert (state.timer.low, state.timer.done) == (6, [[7, 8], [9, 10]])
    snapshot.write_snapshot(str(tmp_path), state)
    loaded = snapshot.load_snapshot(str(tmp_path))
    assert loaded.problems == () and loaded.state == state
    # a snapshot from before the file existed keeps its index
    os.unlink(tmp_path / "config" / snapshot.TIMER_FILE)
    loaded = snapshot.load_snapshot(str(tmp_path))
    assert loaded.state.applied_index == 13 and loaded.state.timer == TimerProgress()


def test_client_message_with_a_delivery_time():
    from broker.client import Message
    from broker.client.errors import InvalidMessageError
    m = Message("T", b"b", deliver_at_ms=NOW)
    m.check()
    assert m.wire_properties("U")["TIMER_DELIVER_MS"] == str(NOW)
    assert "TIMER_DELIVER_MS" not in Message("T", b"b").wire_properties("U")
    for bad in (-1, True, 1.5, "1"):
        with pytest.raises(InvalidMessageError, match="deliver_at_ms"):
            Message("T", b"b", deliver_at_ms=bad).check()
