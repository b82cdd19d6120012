# POP's pure parts: the receipt codec (ExtraInfoUtil's layout byte for
# byte), the batch-ack bit set, the replicated state machine (ops through
# their record codec, replay from any earlier point, the snapshot), and
# the POP codes on the wire (JSON headers carry them, a ROCKETMQ binary
# header cannot).
import base64
import json

import pytest

from broker.metadata import snapshot
from broker.metadata.pop import (
    ORDER_REVIVE_QID,
    PopAckOp,
    PopChangeOp,
    PopCheckpoint,
    PopCheckpointOp,
    PopReviveOp,
    PopTable,
)
from broker.metadata.records import MetadataRecordError, encode_op, parse_op
from broker.metadata.tables import MetadataState
from broker.processors.pop import parse_batch_ack
from broker.processors.pop_receipt import (
    Receipt,
    ReceiptError,
    decode_bitset,
    offset_info,
    parse_receipt,
    pop_retry_topic,
    real_topic,
    topic_type,
)
from broker.remoting.codec import decode_header, encode_header
from broker.remoting.codes import RequestCode, SerializeType
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import LocalProtocolError, RequestError
from consumequeue import record as M

# --- receipts ------------------------------------------------------------------------


def test_receipt_layout_is_extra_info_util_s():
    r = Receipt(ck_queue_offset=100, pop_time=1700000000000, invisible_time=30000, revive_qid=0, topic_type="0",
                broker_name="broker-a", queue_id=3, queue_offset=105)
    assert str(r) == "100 1700000000000 30000 0 0 broker-a 3 105"
    assert parse_receipt(str(r)) == r
    # the proxy's receipt_handle: the commitlog offset appended, kept
    proxied = parse_receipt(str(r) + " 98765")
    assert proxied.commit_log_offset == 98765 and str(proxied) == str(r) + " 98765"
    assert parse_receipt("0 1 2 999 1 b 0 0").order


@pytest.mark.parametrize("bad", [
    "", "1 2 3", "1 2 3 4 0 b 6", "1 2 3 4 0 b 6 7 8 9", "1 2 3 4 5 b 6 7", "-1 2 3 4 0 b 6 7",
    "1 2 3 4 0 b 6 x", "1 2 3 99999999999 0 b 6 7", "1 2 3 4 0  6 7", "01 2 3 4 0 b 6 7",
    "1 2 3 4 0 b 6 99999999999999999999", "1 2 3 4 0 b 6 7 " + "9" * 2000, None, 5,
])
def test_an_invalid_receipt_is_refused(bad):
    with pytest.raises(ReceiptError, match="invalid receipt"):
        parse_receipt(bad)


def test_topic_types_and_retry_topics_are_key_builder_s():
    assert pop_retry_topic("T", "G") == "%RETRY%G_T"
    assert topic_type("T") == "0" and topic_type("%RETRY%G_T") == "1" and topic_type("%RETRY%G+T") == "2"
    assert real_topic("T", "G", "0") == "T" and real_topic("T", "G", "1") == "%RETRY%G_T"
    assert real_topic("T", "G", "2") == "%RETRY%G+T"
    assert offset_info([("0", 1, 5), ("1", 0, [7, 8])]) == "0 1 5;1 0 7,8"


def test_batch_ack_bit_sets_are_java_bitset_bytes():
    # BitSet {0, 1, 9}.toByteArray() = [0x03, 0x02]
    assert decode_bitset(bytes([0x03, 0x02])) == [0, 1, 9]
    body = json.dumps({"brokerName": "b", "acks": [{"c": "G", "t": "T", "r": "0", "so": 10, "q": 1, "rq": 0,
                                                    "pt": 5, "it": 6, "b": base64.b64encode(b"\x05").decode()}]})
    (ack,) = parse_batch_ack(body.encode())
    assert (ack.group, ack.topic, ack.queue_id, ack.offsets) == ("G", "T", 1, [10, 12])
    for bad in ('{"acks": 5}', '{"acks": [1]}', '{"acks": [{"c": "G"}]}',
                json.dumps({"acks": [{"c": "G", "t": "T", "so": 1, "q": 0, "rq": 0, "pt": 1, "it": 1, "b": "!!"}]}),
                json.dumps({"acks": [{}] * 2000})):
        with pytest.raises(RequestError):
            parse_batch_ack(bad.encode())
    with pytest.raises(ReceiptError):
        decode_bitset(b"\xff" * 5000)


# --- the state machine -----------------------------------------------------------------


def ck(start=10, offsets=(10, 11, 12), pop_time=1000, invisible=500, order=False, nxt=None, topic="T", attempts=0):
    return PopCheckpoint(group="G", topic=topic, queue_id=0, start_offset=start, pop_time=pop_time,
                         invisible_time=invisible, offsets=tuple(offsets),
                         next_offset=nxt if nxt is not None else offsets[-1] + 1, order=order,
                         revive_qid=ORDER_REVIVE_QID if order else 0, attempts=attempts)


def ack(topic, start, pop_time, offsets, order=False) -> PopAckOp:
    """An ack of group G's queue 0 of `topic`."""
    return PopAckOp(group="G", topic=topic, queue_id=0, start_offset=start, pop_time=pop_time, offsets=offsets,
                    order=order)


def change(topic, start, pop_time, offset, new_pop_time, invisible, revive_qid=0, order=False) -> PopChangeOp:
    return PopChangeOp(group="G", topic=topic, queue_id=0, start_offset=start, pop_time=pop_time, offset=offset,
                       new_pop_time=new_pop_time, invisible_time=invisible, revive_qid=revive_qid, order=order)


def revive(topic, start, pop_time) -> PopReviveOp:
    return PopReviveOp(group="G", topic=topic, queue_id=0, start_offset=start, pop_time=pop_time)


def through_log(state: MetadataState, ops) -> MetadataState:
    """Apply ops as the applier does: each through its record bytes."""
    for op in ops:
        rec = M.decode(encode_op(op, timestamp_ms=1))
        state.apply(parse_op(rec.topic, rec.body), state.applied_index + 1, 1)
    return state


def test_pop_ack_change_revive():
    s = through_log(MetadataState(), [PopCheckpointOp(ck())])
    assert s.offsets.query("T", "G", 0) == 13  # an ordinary pop moves the offset at once
    assert s.pop.in_flight("G", "T", 0) == 3
    through_log(s, [ack("T", 10, 1000, (11,))])
    (c,) = s.pop.cks.values()
    assert c.unacked == [10, 12] and s.pop.in_flight("G", "T", 0) == 2
    # change: offset 12 leaves the checkpoint for one of its own
    through_log(s, [change("T", 10, 1000, 12, 1200, 9000)])
    assert sorted(s.pop.cks) == [("G", "T", 0, 10, 1000), ("G", "T", 0, 12, 1200)]
    assert s.pop.cks[("G", "T", 0, 12, 1200)].deadline == 10200
    assert s.pop.expired(1500, 10) == [s.pop.cks[("G", "T", 0, 10, 1000)]]
    through_log(s, [revive("T", 10, 1000), ack("T", 12, 1200, (12,))])
    assert not s.pop.cks and not s.pop.inflight
    # a late ack of a revived checkpoint changes nothing
    before = repr(s.pop)
    through_log(s, [ack("T", 10, 1000, (10,))])
    assert repr(s.pop) == before


def test_order_checkpoints_block_their_queue_and_move_the_offset_on_ack():
    s = through_log(MetadataState(), [PopCheckpointOp(ck(start=0, offsets=(0, 1, 2), order=True))])
    assert s.offsets.query("T", "G", 0) is None  # an order pop moves no offset
    assert s.pop.blocked("G", "T", 0, 1499) and not s.pop.blocked("G", "T", 0, 1500)
    through_log(s, [ack("T", 0, 1000, (0,), True)])
    assert s.offsets.query("T", "G", 0) == 1 and s.pop.blocked("G", "T", 0, 1000)
    # an ack naming another pop of the queue (another popTime) is stale
    through_log(s, [ack("T", 0, 999, (1, 2), True)])
    assert s.pop.blocked("G", "T", 0, 1000)
    through_log(s, [change("T", 0, 1000, 1, 1400, 1000, ORDER_REVIVE_QID, True)])
    assert s.pop.order_ck("G", "T", 0).deadline == 2400
    through_log(s, [ack("T", 0, 1000, (1, 2), True)])
    assert s.offsets.query("T", "G", 0) == 3 and not s.pop.blocked("G", "T", 0, 1000)


def test_replay_from_any_earlier_index_gives_the_same_state():
    ops = [PopCheckpointOp(ck()), PopCheckpointOp(ck(start=13, offsets=(13, 14), pop_time=1100)),
           ack("T", 10, 1000, (10,)), change("T", 10, 1000, 11, 1300, 700),
           PopCheckpointOp(ck(start=0, offsets=(0, 1), order=True, topic="O")),
           ack("O", 0, 1000, (0,), True), revive("T", 13, 1100),
           ack("T", 10, 1000, (12,))]
    full = through_log(MetadataState(), ops)
    for cut in range(len(ops)):
        prefix = through_log(MetadataState(), ops[:cut + 1])
        # the snapshot taken after `cut`, then everything from an earlier point
        loaded = _roundtrip(prefix)
        loaded.applied_index = -1
        through_log(loaded, ops[max(cut - 2, 0):])
        assert loaded.pop == full.pop, cut
        assert loaded.offsets.offsets == full.offsets.offsets, cut


def _roundtrip(state: MetadataState) -> MetadataState:
    files = snapshot.render(state)
    obj = json.loads(files[snapshot.OFFSETS_FILE])
    out = MetadataState()
    out.pop = PopTable.from_json(obj[snapshot.POP_FIELD])
    out.offsets.offsets = {k: {int(q): o for q, o in v.items()} for k, v in obj["offsetTable"].items()}
    return out


def test_the_snapshot_carries_the_checkpoints(tmp_path):
    s = through_log(MetadataState(), [PopCheckpointOp(ck()), ack("T", 10, 1000, (11,)),
                                      PopCheckpointOp(ck(start=0, offsets=(0,), order=True, topic="O"))])
    snapshot.write_snapshot(str(tmp_path), s)
    loaded = snapshot.load_snapshot(str(tmp_path)).state
    assert loaded.pop == s.pop and loaded.pop.in_flight("G", "T", 0) == 2


@pytest.mark.parametrize("body", [
    {"op": "pop.ck", "group": "G", "topic": "T", "queueId": 0, "startOffset": 0, "nextOffset": 1, "popTime": 1,
     "invisibleTime": 1, "offsets": list(range(2000))},
    {"op": "pop.ack", "group": "G", "topic": "T", "queueId": -1, "startOffset": 0, "popTime": 1, "offsets": [0]},
    {"op": "pop.ack", "group": "G", "topic": "T", "queueId": 0, "startOffset": 0, "popTime": 1, "offsets": [True]},
    {"op": "pop.revive", "group": "", "topic": "T", "queueId": 0, "startOffset": 0, "popTime": 1},
    {"op": "pop.change", "group": "G", "topic": "T", "queueId": 0, "startOffset": 0, "popTime": 1, "offset": 0,
     "newPopTime": 2, "invisibleTime": "x"},
])
def test_a_bad_pop_record_stops_the_applier(body):
    with pytest.raises(MetadataRecordError):
        parse_op("rmq_sys_LEDGERMQ_CONSUMER_OFFSET", json.dumps({"v": 1, **body}).encode())


# --- the codes on the wire -------------------------------------------------------------


def test_pop_codes_travel_in_json_headers_only():
    cmd = RemotingCommand.create_request(RequestCode.POP_MESSAGE, {"topic": "T"}, opaque=3)
    back = decode_header(SerializeType.JSON, encode_header(cmd))
    assert back.code == RequestCode.POP_MESSAGE == 200050 and back.ext_fields["topic"] == "T"
    binary = RemotingCommand.create_request(RequestCode.ACK_MESSAGE, {}, serialize_type=SerializeType.ROCKETMQ)
    with pytest.raises(LocalProtocolError, match="i16 code"):
        encode_header(binary)
