# The metadata tables as pure state machines (broker/metadata/tables.py,
# records.py, fastjson.py): the record codec, determinism, offsets that
# only move back through a reset op, the replay-idempotence that snapshots
# rely on, and fastjson's unquoted integer keys.
import random

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from broker.common.permissions import PERM_READ, PERM_WRITE
from broker.common.values import InvalidMetadataError, TopicConfig
from broker.metadata import fastjson
from broker.metadata.records import (
    CONSUMER_OFFSET_TOPIC,
    INTERNAL_TOPICS,
    SUBSCRIPTION_GROUP_TOPIC,
    TOPIC_CONFIG_TOPIC,
    GroupDelete,
    GroupUpsert,
    MetadataRecordError,
    OffsetCommit,
    OffsetDelete,
    OffsetReset,
    TopicDelete,
    TopicUpsert,
    decode_op,
    encode_op,
    is_internal_topic,
    parse_op,
)
from broker.metadata.tables import MetadataState, SubscriptionGroupConfig
from consumequeue.record import decode

TOPICS = ["TopicA", "TopicB", "%RETRY%g1"]
GROUPS = ["g1", "g2"]


def random_op(rng: random.Random):
    kind = rng.randrange(8)
    topic, group = rng.choice(TOPICS), rng.choice(GROUPS)
    if kind == 0:
        return TopicUpsert(TopicConfig(topic, rng.randint(1, 8), rng.randint(1, 8), rng.choice([2, 4, 6]),
                                       attributes={"+message.type": rng.choice(["NORMAL", "FIFO"])}))
    if kind == 1:
        return TopicDelete(topic, rng.random() < 0.5)
    if kind == 2:
        return GroupUpsert(SubscriptionGroupConfig(group, retry_max_times=rng.randint(0, 16)))
    if kind == 3:
        return GroupDelete(group, rng.random() < 0.5)
    if kind == 4:
        return OffsetReset({f"{topic}@{group}": {rng.randrange(4): rng.randrange(100)}})
    if kind == 5:
        return OffsetDelete((f"{topic}@{group}",))
    return OffsetCommit({f"{t}@{g}": {q: rng.randrange(1000) for q in range(rng.randrange(1, 4))}
                         for t in rng.sample(TOPICS, 2) for g in GROUPS})


def replay(ops, state=None, start=0):
    state = state or MetadataState()
    for i, op in enumerate(ops):
        if i >= start:
            state.apply(op, i, 1_700_000_000_000 + i)
    return state


def test_record_codec_round_trip_through_message_records():
    ops = [TopicUpsert(TopicConfig("TopicA", 4, 4, PERM_READ | PERM_WRITE, order=True, attributes={"a": "b"})),
           TopicDelete("TopicA"), GroupUpsert(SubscriptionGroupConfig("g1", consume_enable=False)),
           GroupDelete("g1", clean_offsets=False), OffsetCommit({"TopicA@g1": {0: 5, 3: 7}}),
           OffsetReset({"TopicA@g1": {0: 0}}), OffsetDelete(("TopicA@g1",))]
    for op in ops:
        raw = encode_op(op, timestamp_ms=123)
        rec = decode(raw, check_crc=True)
        assert rec.topic in INTERNAL_TOPICS and rec.topic == op.TOPIC
        assert rec.tags == op.OP and rec.store_timestamp == 123
        assert decode_op(rec) == op
    assert decode(encode_op(ops[0], timestamp_ms=1)).keys == ["TopicA"]
    assert is_internal_topic(CONSUMER_OFFSET_TOPIC) and not is_internal_topic("TopicA")


def test_bad_records_raise_typed_errors():
    with pytest.raises(MetadataRecordError, match="belongs on"):
        parse_op(SUBSCRIPTION_GROUP_TOPIC, b'{"v":1,"op":"topic.delete","topic":"T"}')
    with pytest.raises(MetadataRecordError, match="unknown op"):
        parse_op(TOPIC_CONFIG_TOPIC, b'{"v":1,"op":"topic.rename"}')
    with pytest.raises(MetadataRecordError, match="version"):
        parse_op(TOPIC_CONFIG_TOPIC, b'{"v":2,"op":"topic.delete","topic":"T"}')
    with pytest.raises(MetadataRecordError, match="not JSON"):
        parse_op(TOPIC_CONFIG_TOPIC, b"\xff{")
    with pytest.raises(MetadataRecordError, match="perm"):
        parse_op(TOPIC_CONFIG_TOPIC, b'{"v":1,"op":"topic.upsert","topicConfig":{"topicName":"T","perm":16}}')
    with pytest.raises(MetadataRecordError, match="topic@group"):
        parse_op(CONSUMER_OFFSET_TOPIC, b'{"v":1,"op":"offset.commit","offsetTable":{"nogroup":{"0":1}}}')
    with pytest.raises(MetadataRecordError, match="cleanOffsets|clean_offsets"):
        parse_op(TOPIC_CONFIG_TOPIC, b'{"v":1,"op":"topic.delete","topic":"T","cleanOffsets":"no"}')
    with pytest.raises(MetadataRecordError, match="bad offset"):
        parse_op(CONSUMER_OFFSET_TOPIC, b'{"v":1,"op":"offset.commit","offsetTable":{"T@g":{"0":-1}}}')


def test_config_validation_follows_rocketmq_rules():
    with pytest.raises(InvalidMetadataError):
        TopicConfig("bad topic")  # space is outside [%|a-zA-Z0-9_-]
    with pytest.raises(InvalidMetadataError):
        TopicConfig("T" * 128)
    TopicConfig("%RETRY%" + "g" * 200)  # retry topics may reach 255
    with pytest.raises(InvalidMetadataError):
        TopicConfig("T", topic_filter_type="ANY")
    with pytest.raises(InvalidMetadataError):
        TopicConfig("T", read_queue_nums=-1)
    with pytest.raises(InvalidMetadataError):
        SubscriptionGroupConfig("g", consume_enable="yes")
    # JSON round trip keeps fields of newer RocketMQ versions.
    obj = {"groupName": "g", "consumeEnable": False, "groupRetryPolicy": {"type": "CUSTOMIZED"}}
    cfg = SubscriptionGroupConfig.from_json(obj)
    assert not cfg.consume_enable and cfg.to_json()["groupRetryPolicy"] == {"type": "CUSTOMIZED"}


def test_apply_is_deterministic():
    rng = random.Random(7)
    ops = [random_op(rng) for _ in range(400)]
    a, b = replay(ops), replay(list(ops))
    assert a == b and a.applied_index == 399
    assert a.topics.data_version.counter == max(i for i, op in enumerate(ops) if op.TOPIC == TOPIC_CONFIG_TOPIC)
    # A different history gives different tables (the comparison can fail).
    assert replay(ops[:-1] + [OffsetCommit({"TopicA@g1": {9: 99999}})]) != a


def test_offsets_never_move_back_except_through_reset():
    s = MetadataState()
    s.apply(OffsetCommit({"T@g": {0: 100, 1: 50}}), 0, 0)
    s.apply(OffsetCommit({"T@g": {0: 40, 1: 60}}), 1, 0)  # a stale commit of queue 0
    assert s.offsets.table_of("T", "g") == {0: 100, 1: 60}
    s.apply(OffsetReset({"T@g": {0: 10}}), 2, 0)  # resetOffsetByTime
    assert s.offsets.query("T", "g", 0) == 10 and s.offsets.query("T", "g", 1) == 60
    s.apply(OffsetCommit({"T@g": {0: 11}}), 3, 0)
    assert s.offsets.query("T", "g", 0) == 11
    s.apply(TopicDelete("T", clean_offsets=True), 4, 0)
    assert s.offsets.query("T", "g", 0) is None


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(1, 120), data=st.data())
def test_replaying_a_suffix_over_a_newer_state_is_idempotent(seed, n, data):
    """What lets a snapshot's three files come from different indexes:
    replaying from k over the state at m >= k gives the state at n."""
    rng = random.Random(seed)
    ops = [random_op(rng) for _ in range(n)]
    k = data.draw(st.integers(0, n - 1))
    m = data.draw(st.integers(k, n - 1))
    newer = replay(ops[:m + 1])
    assert replay(ops, newer, start=k) == replay(ops)


def test_fastjson_reads_unquoted_integer_keys_and_writes_standard_json():
    text = '{"offsetTable":{"TopicA@g1":{0:123,1:456,-1:7},"%RETRY%g1@g1":{0:0}},"dataVersion":{"counter":3}}'
    obj = fastjson.loads(text)
    assert obj["offsetTable"]["TopicA@g1"] == {"0": 123, "1": 456, "-1": 7}
    assert fastjson.loads(' { brokerAddrs : { 0 : "a:1" } , "x" : [1, 2.5, true, null, "s\\u00e9"] } ') == \
        {"brokerAddrs": {"0": "a:1"}, "x": [1, 2.5, True, None, "s\u00e9"]}
    assert fastjson.loads(b'{"a":{"0":1}}') == {"a": {"0": 1}}
    out = fastjson.dumps({"offsetTable": {"T@g": {0: 1, 1: 2}}})
    assert '"0": 1' in out and fastjson.loads(out) == {"offsetTable": {"T@g": {"0": 1, "1": 2}}}
    for bad in ('{0:1', '{"a" 1}', '{a-b:1}', '[1 2]', '{"a":1} x'):
        with pytest.raises(fastjson.FastjsonError):
            fastjson.loads(bad)
