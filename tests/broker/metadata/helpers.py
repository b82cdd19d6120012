# Shared rig of the metadata tests (no tests here): a single-node stand-in
# for ReplicaNode over a real SegmentedStore (appends commit at once), small
# segments so a few hundred entries roll over several files, and helpers
# that fill a log with the traffic the applier must skip.
import os

import trio

from broker.metadata.applier import MetadataApplier
from broker.metadata.records import TOPIC_CONFIG_TOPIC
from commitlog.entry import MAGIC_NOOP
from commitlog.errors import NotLeaderError
from commitlog.store import SegmentedStore, StoreConfig
from commitlog.watermark import Watermark
from consumequeue.record import MessageRecord, encode

DATA_SEG = 64 * 1024
INDEX_SEG = 4 * 1024


def open_store(root, **kw) -> SegmentedStore:
    return SegmentedStore.open(StoreConfig(root=str(root), self_id="n0", data_segment_size=DATA_SEG,
                                           index_segment_size=INDEX_SEG, **kw))


def collision_topic(name: str) -> str:
    """Another valid topic with the same Java hash: ("r","m") -> ("s","N")
    keeps 31*a + b, so the hash filter matches and the name check must not."""
    a, b = name[0], name[1]
    return chr(ord(a) + 1) + chr(ord(b) - 31) + name[2:]


class LocalNode:
    """ReplicaNode's face (append, committed, is_leader, leader_error) for a
    single store: every append is committed immediately."""

    def __init__(self, store: SegmentedStore, term: int = 1):
        self.store = store
        self.term = term
        self.is_leader = True
        self.committed = Watermark(store.committed_index)
        self.appends = 0

    def leader_error(self) -> NotLeaderError:
        return NotLeaderError(None, None)

    def _commit(self, placed):
        self.store.set_committed(placed[-1][0])
        self.committed.advance(placed[-1][0])
        return placed

    async def append(self, bodies):
        if not self.is_leader:
            raise self.leader_error()
        self.appends += 1
        placed = self._commit(self.store.append_leader(list(bodies), self.term))
        await trio.lowlevel.checkpoint()
        return placed

    def append_noop(self):
        return self._commit(self.store.append_leader([b""], self.term, MAGIC_NOOP))

    def append_foreign(self, i: int):
        """Traffic the applier must skip: user messages, non-message bodies,
        a topic colliding with an internal topic's hash (carrying a valid
        op body, which must NOT be applied) and NOOPs."""
        kind = i % 5
        if kind == 0:
            return self.append_noop()
        if kind == 1:
            body = b"not a message record " * 10
        elif kind == 2:
            body = encode(MessageRecord(topic=collision_topic(TOPIC_CONFIG_TOPIC),
                                        body=b'{"v":1,"op":"topic.delete","topic":"TopicA","cleanOffsets":true}'))
        else:
            body = encode(MessageRecord(topic="TopicA", body=b"x" * 900, queue_id=i % 4,
                                        properties={"TAGS": "t", "KEYS": f"k{i}"}))
        return self._commit(self.store.append_leader([body], self.term))


def replay_from_scratch(store, backend=None) -> MetadataApplier:
    """A fresh applier over the whole committed log (the reference state)."""
    kw = {} if backend is None else {"backend": backend}
    applier = MetadataApplier(store, Watermark(store.committed_index), **kw)
    applier.apply_available()
    return applier


def config_files(root) -> dict[str, bytes]:
    d = os.path.join(str(root), "config")
    out = {}
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            out[name] = f.read()
    return out
