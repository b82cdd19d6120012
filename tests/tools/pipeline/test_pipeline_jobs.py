# The four pipeline jobs on ledgermq stores, in real Spark (local[2], one
# session for the module): rebuild writes byte-identical consume queues and
# index files to the dispatcher's, uncommitted entries excluded; export's
# Parquet rows equal a direct decode of the committed entries (compressed
# bodies decompressed, IPv6 hosts, partitions by topic and date); stats
# equal direct counts; audit finds an injected divergence at its index and
# reports none on identical replicas and on a lagging one; executors
# without the native scanner fail with a clear error, or fall back when
# allowed.
import datetime
import os
import shutil
import zlib
from collections import Counter

import pytest

from broker.common.msgid import offset_msg_id
from consumequeue import record as M
from tests.tools.pipeline.stores import SMALL_ARGS, build_store, committed_messages, digests, dispatcher_output
from tools.pipeline import audit, export, rebuild, stats
from tools.pipeline import jobcommon as J
from tools.pipeline.segscan import NativeMissingError


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """One store of 600 messages of which 560 are committed (several 64 KiB
    segments), and the dispatcher's output for it."""
    base = tmp_path_factory.mktemp("stores")
    build_store(base / "a", 600, committed=559)
    dispatcher_output(base / "a", base / "expected")
    return base


def opts(*roots, **kw):
    return J.JobOptions(tuple(str(r) for r in roots), progress=False, **kw)


def test_rebuild_is_byte_identical_to_the_dispatcher(spark, stores, tmp_path):
    expected = digests(stores / "expected")
    assert len([k for k in expected if k.startswith("cq/")]) >= 6 and "index#1" in expected
    result, code = rebuild.run(spark, opts(stores / "a", out=str(tmp_path / "out"), extra=SMALL_ARGS))
    assert code == 0
    (rep,) = result["stores"]
    assert (rep["kind"], rep["messages"], rep["committedIndex"], rep["executorBackends"]) == \
        ("dledger", 560, 559, ["native"])
    assert rep["segments"] >= 3
    assert digests(tmp_path / "out") == expected
    # Into the store root itself (the default), over stale files: the same.
    shutil.copytree(stores / "a", tmp_path / "inplace")
    os.makedirs(tmp_path / "inplace" / "consumequeue" / "Stale" / "0")
    result, _ = rebuild.run(spark, opts(tmp_path / "inplace", extra=SMALL_ARGS))
    assert result["stores"][0]["out"] == str(tmp_path / "inplace")
    assert digests(tmp_path / "inplace") == expected


def test_rebuild_refuses_a_store_in_use(spark, stores, tmp_path):
    from commitlog.store import SegmentedStore, StoreConfig
    shutil.copytree(stores / "a", tmp_path / "busy")
    store = SegmentedStore.open(StoreConfig(str(tmp_path / "busy")))  # a broker holds the lock
    try:
        with pytest.raises(ValueError, match="in use"):
            rebuild.run(spark, opts(tmp_path / "busy", extra=SMALL_ARGS))
    finally:
        store.close()


def _expected_rows(root):
    rows = {}
    for phy, m in committed_messages(root):
        body = zlib.decompress(m.body) if m.sysflag & M.COMPRESSED_FLAG else m.body
        rows[phy] = (m.topic, m.queue_id, m.queue_offset, offset_msg_id(m.store_host, phy),
                     m.properties.get("UNIQ_KEY"), m.keys, m.properties.get("TAGS"), m.properties,
                     m.born_timestamp, m.store_timestamp, str(m.born_host), str(m.store_host),
                     m.reconsume_times, m.sysflag, bool(m.sysflag & 1), body)
    return rows


def test_export_rows_equal_a_direct_decode(spark, stores, tmp_path):
    out = str(tmp_path / "parquet")
    result, code = export.run(spark, opts(stores / "a", out=out))
    expected = _expected_rows(stores / "a")
    assert code == 0 and result["rows"] == len(expected) == 560
    df = spark.read.parquet(out)
    got = {}
    for r in df.collect():
        got[r.physicalOffset] = (r.topic, r.queueId, r.queueOffset, r.offsetMsgId, r.uniqKey, list(r.keys),
                                 r.tags, dict(r.properties), r.bornTimestamp, r.storeTimestamp, r.bornHost,
                                 r.storeHost, r.reconsumeTimes, r.sysFlag, r.compressed, bytes(r.body))
        assert r.store == str(stores / "a") and r.entryIndex >= 0
        assert str(r.date) == datetime.datetime.fromtimestamp(r.storeTimestamp / 1000, datetime.timezone.utc) \
            .strftime("%Y-%m-%d")
        assert (r.compressionType, r.bodyDecompressed) == (("zlib", True) if r.compressed else (None, False))
    assert got == expected
    assert sum(1 for v in got.values() if v[14]) > 10  # compressed bodies were decompressed
    assert any(v[10].startswith("[::1]") for v in got.values())  # IPv6 born hosts
    parts = sorted(os.listdir(out))
    assert "topic=OrderTopic" in parts and "topic=PayTopic" in parts
    assert len(os.listdir(os.path.join(out, "topic=OrderTopic"))) == 2  # two UTC dates


def test_stats_equal_direct_counts(spark, stores, tmp_path):
    result, code = stats.run(spark, opts(stores / "a", out=str(tmp_path / "stats")))
    assert code == 0
    msgs = committed_messages(stores / "a")
    assert result["messages"] == len(msgs) and result["bytes"] == sum(len(m.encode()) for _, m in msgs)
    by_queue: dict = {}
    for _, m in msgs:
        by_queue.setdefault((m.topic, m.queue_id), []).append(m)
    assert {(q["topic"], q["queueId"]) for q in result["queues"]} == set(by_queue)
    for q in result["queues"]:
        ms = by_queue[(q["topic"], q["queueId"])]
        sizes = [len(m.encode()) for m in ms]
        assert q["messages"] == len(ms) and q["bytes"] == sum(sizes)
        assert (q["minSize"], q["maxSize"]) == (min(sizes), max(sizes))
        assert (q["minQueueOffset"], q["maxQueueOffset"]) == (0, len(ms) - 1)
        assert (q["firstStoreTimestamp"], q["lastStoreTimestamp"]) == \
            (min(m.store_timestamp for m in ms), max(m.store_timestamp for m in ms))
        assert q["distinctTags"] == len({m.tags for m in ms if m.tags is not None})
        assert q["distinctKeys"] == len({k for m in ms for k in m.keys})
        assert q["sizeHistogram"] == dict(Counter(stats.size_bucket(s) for s in sizes))
    for t in result["topics"]:
        ms = [m for _, m in msgs if m.topic == t["topic"]]
        assert (t["messages"], t["distinctKeys"]) == (len(ms), len({k for m in ms for k in m.keys}))
    assert os.path.exists(tmp_path / "stats" / "stats.json")
    back = spark.read.parquet(str(tmp_path / "stats" / "queues.parquet")).count()
    assert back == len(by_queue)


def test_audit_finds_the_divergence_and_nothing_else(spark, stores, tmp_path):
    base = tmp_path
    shutil.copytree(stores / "a", base / "same")
    build_store(base / "lagging", 600, committed=300)  # a follower behind: not a divergence
    build_store(base / "forked", 600, committed=559, diverge_at=400)  # another history from entry 400
    result, code = audit.run(spark, opts(stores / "a", base / "same", base / "lagging"))
    assert code == 0 and result["divergence"] is None
    assert (result["commonFirstIndex"], result["commonLastIndex"]) == (0, 300) and result["ranges"] >= 2
    result, code = audit.run(spark, opts(stores / "a", base / "same", base / "forked"))
    assert code == 1
    d = result["divergence"]
    assert d["index"] == 400 and "term" in d["reason"]
    terms = [rep["entry"]["term"] for rep in d["replicas"]]
    assert terms == [1, 1, 2]
    e = d["replicas"][2]["entry"]
    with open(e["file"], "rb") as f:
        f.seek(e["offset"] + 8)
        assert int.from_bytes(f.read(8), "big") == 400  # the entry header really is there
    audit.render(result)  # the text form names it too


def test_executors_without_the_native_scanner(spark, stores, tmp_path):
    sc = spark.sparkContext
    sc.environment["LEDGERMQ_NO_NATIVE"] = "1"  # new Python workers for these jobs
    try:
        with pytest.raises(Exception) as err:
            rebuild.run(spark, opts(stores / "a", out=str(tmp_path / "no"), extra=SMALL_ARGS))
        text = J.spark_error_text(err.value)
        assert text.startswith("NativeMissingError: executor on") and "LEDGERMQ_NO_NATIVE=1" in text
        assert NativeMissingError.__name__ in text
        result, _ = rebuild.run(spark, opts(stores / "a", out=str(tmp_path / "py"), extra=SMALL_ARGS,
                                            allow_fallback=True))
        assert result["stores"][0]["executorBackends"] == ["python"]
        assert digests(tmp_path / "py") == digests(stores / "expected")
    finally:
        del sc.environment["LEDGERMQ_NO_NATIVE"]


def test_rebuild_after_retention_and_of_an_empty_log(spark, tmp_path):
    from commitlog.store import SegmentedStore, StoreConfig
    build_store(tmp_path / "r", 400)
    store = SegmentedStore.open(StoreConfig(str(tmp_path / "r")))
    assert store.delete_expired(now_ms=1 << 60)  # every segment but the last is old
    begin = store.begin_index
    store.close()
    assert begin > 0
    dispatcher_output(tmp_path / "r", tmp_path / "expected")
    result, _ = rebuild.run(spark, opts(tmp_path / "r", out=str(tmp_path / "out"), extra=SMALL_ARGS))
    assert result["stores"][0]["messages"] == 400 - begin and result["stores"][0]["beginPos"] > 0
    assert digests(tmp_path / "out") == digests(tmp_path / "expected")
    build_store(tmp_path / "e", 0)  # nothing appended, nothing committed
    result, _ = rebuild.run(spark, opts(tmp_path / "e", out=str(tmp_path / "e-out"), extra=SMALL_ARGS))
    assert (result["stores"][0]["messages"], result["stores"][0]["segments"]) == (0, 0)
    assert digests(tmp_path / "e-out") == {}
