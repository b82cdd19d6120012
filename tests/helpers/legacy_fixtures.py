# Owns the master-slave fixture stores the migration tests (and the Spark
# pipeline's) build: a plain RocketMQ store written with the project's
# codecs as a stock broker leaves it after a clean shutdown --
#
#   commitlog/<20-digit>      records back to back, BLANK at segment ends
#   consumequeue/T/Q/<20>     20-byte units (the dispatch engine, plain mode)
#   index/<yyyyMMdd...>       IndexFile (KEYS and UNIQ_KEY of every message)
#   checkpoint                stock (no ledgermq extension)
#   config/topics.json, subscriptionGroup.json, consumerOffset.json,
#          delayOffset.json   fastjson-style (unquoted integer map keys)
#
# Messages are deterministic: message i goes to topics[i % T], queue
# (i // T) % Q, with tags "tag<i % 3>", keys "k-<topic>-<queue>-<n>" (n its
# queue offset) and a body that names it, so two builds with the same
# arguments are byte-identical.  `limit` writes only the first records (a
# lagging slave); `diverge_at`/`diverge_tag` change the bodies from that
# record on (a slave that took other writes after a split brain).
import os

import attrs

from consumequeue import record as M
from consumequeue.plainlog import (
    PlainCommitlogWriter,
    dispatch_plain,
    plain_engine,
    write_fastjson,
    write_stock_checkpoint,
)

BASE_TS = 1_700_000_000_000
STORE_HOST = M.HostAddr("127.0.0.1", 10911)
BORN_HOST = M.HostAddr("127.0.0.1", 50000)


@attrs.frozen
class FixtureMessage:
    topic: str
    queue_id: int
    queue_offset: int
    phy: int
    size: int
    tags: str
    keys: str
    uniq_key: str
    body: bytes


@attrs.frozen
class FixtureStore:
    root: str
    segment_size: int
    messages: list  # FixtureMessage, in log order
    end: int  # the write position (just after the last record)
    consumer_offsets: dict  # "topic@group" -> {queue: offset}
    topics: tuple
    queues: int

    def of_queue(self, topic: str, queue_id: int) -> list:
        return [m for m in self.messages if m.topic == topic and m.queue_id == queue_id]

    @property
    def commitlog_dir(self) -> str:
        return os.path.join(self.root, "commitlog")


def fixture_records(count: int, topics, queues: int, *, diverge_at: int | None = None,
                    diverge_tag: str = "x", body_size: int = 60):
    """(MessageRecord, tags, keys, uniq) for message 0..count-1 (queue offsets 0)."""
    out = []
    for i in range(count):
        topic = topics[i % len(topics)]
        qid = (i // len(topics)) % queues
        tag = diverge_tag if diverge_at is not None and i >= diverge_at else ""
        n = i // (len(topics) * queues)  # its queue offset (round-robin over queues)
        keys = f"k-{topic}-{qid}-{n}"
        uniq = f"{i:08X}{tag.encode().hex().upper():0>8}".ljust(32, "0")
        body = f"msg {i} {topic}/{qid}#{n}{tag} ".encode()
        body = (body * (1 + body_size // len(body)))[:max(body_size, len(body))] + (b"" if i % 7 else b"!" * 300)
        props = {M.PROPERTY_TAGS: f"tag{i % 3}", M.PROPERTY_KEYS: keys, M.PROPERTY_UNIQ_KEY: uniq}
        rec = M.MessageRecord(topic=topic, body=body, properties=props, queue_id=qid,
                              born_timestamp=BASE_TS + i, store_timestamp=BASE_TS + i,
                              born_host=BORN_HOST, store_host=STORE_HOST)
        out.append((rec, f"tag{i % 3}", keys, uniq))
    return out


def build_master_slave_store(root, *, topics=("TopicA", "TopicB"), queues: int = 4, per_queue: int = 20,
                             segment_size: int = 8192, limit: int | None = None,
                             diverge_at: int | None = None, diverge_tag: str = "x",
                             groups=("GroupA", "GroupB"), consumer_offsets: dict | None = None,
                             body_size: int = 60, with_cq: bool = True, with_config: bool = True,
                             mtime: float | None = None) -> FixtureStore:
    """Write a stock-looking master-slave store under `root` (see the module
    comment); `per_queue` messages for each of topics x queues.  Consumer
    offsets default to: each group consumed half of every queue of every
    topic."""
    root = str(root)
    os.makedirs(root, exist_ok=True)
    topics = tuple(topics)
    total = len(topics) * queues * per_queue
    recs = fixture_records(total, topics, queues, diverge_at=diverge_at, diverge_tag=diverge_tag,
                           body_size=body_size)
    if limit is not None:
        recs = recs[:limit]
    writer = PlainCommitlogWriter(root, segment_size)
    next_offset: dict = {}
    placed = []
    try:
        for rec, tags, keys, uniq in recs:
            raw = bytearray(M.encode(rec))
            q = next_offset.get((rec.topic, rec.queue_id), 0)
            next_offset[(rec.topic, rec.queue_id)] = q + 1
            M.set_queue_offset(raw, q)
            pos = writer.append(raw)
            placed.append(FixtureMessage(rec.topic, rec.queue_id, q, pos, len(raw), tags, keys, uniq, rec.body))
    finally:
        writer.close()
    end = writer.pos
    last_ts = BASE_TS + len(recs) - 1 if recs else 0
    if with_cq:
        engine = plain_engine(root, segment_size=segment_size)
        try:
            dispatch_plain(engine, 0, end)
        finally:
            engine.close()
            engine.source.close()
    write_stock_checkpoint(root, last_ts, last_ts, last_ts)
    if consumer_offsets is None:
        consumer_offsets = {f"{t}@{g}": {q: per_queue // 2 for q in range(queues)}
                            for t in topics for g in groups}
    if with_config:
        cdir = os.path.join(root, "config")
        write_fastjson(os.path.join(cdir, "topics.json"), {
            "dataVersion": {"counter": len(topics), "timestamp": BASE_TS},
            "topicConfigTable": {t: {"order": False, "perm": 6, "readQueueNums": queues, "topicFilterType":
                                     "SINGLE_TAG", "topicName": t, "topicSysFlag": 0, "writeQueueNums": queues}
                                 for t in topics}})
        write_fastjson(os.path.join(cdir, "subscriptionGroup.json"), {
            "dataVersion": {"counter": len(groups), "timestamp": BASE_TS},
            "subscriptionGroupTable": {g: {"brokerId": 0, "consumeBroadcastEnable": True, "consumeEnable": True,
                                           "consumeFromMinEnable": True, "groupName": g, "retryMaxTimes": 16,
                                           "retryQueueNums": 1, "whichBrokerWhenConsumeSlowly": 1}
                                       for g in groups}})
        write_fastjson(os.path.join(cdir, "consumerOffset.json"), {"offsetTable": consumer_offsets})
        write_fastjson(os.path.join(cdir, "delayOffset.json"), {"offsetTable": {}})
    if mtime is not None:
        for name in os.listdir(os.path.join(root, "commitlog")):
            os.utime(os.path.join(root, "commitlog", name), (mtime, mtime))
    return FixtureStore(root, segment_size, placed, end, consumer_offsets, topics, queues)


def file_digests(root, subdirs=("commitlog", "config")) -> dict:
    """md5 of every file under the given subdirectories of `root` (to show
    that migration leaves the old files byte-identical)."""
    import hashlib
    out = {}
    for sub in subdirs:
        base = os.path.join(str(root), sub)
        for dirpath, _, names in os.walk(base):
            for n in names:
                p = os.path.join(dirpath, n)
                with open(p, "rb") as f:
                    out[os.path.relpath(p, str(root))] = hashlib.md5(f.read()).hexdigest()
    return out
