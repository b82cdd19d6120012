# Owns the metadata applier: the task, on every node, that follows the
# commit watermark, reads newly committed entries from the log and applies
# the records of the internal metadata topics to the tables, publishing how
# far it got as the `applied` watermark.
#
# Finding the metadata records costs no Python work per ordinary message:
# each read (raw DLedger entries, views of the store's own maps, one per
# segment: store.read_views) goes through the native dispatch scanner once, which returns one fixed-size
# record per message with its topic's Java hash.  The hash column is cut
# out of the record array with a strided memoryview and searched for the
# three internal topics' hashes with bytes.find; only the hits (verified by
# their topic bytes, hash collisions are possible) are decoded in Python.
# NOOP entries (magic 2) and non-message bodies never produce a record.
#
# A view never holds a segment's blank filler, and a batch that did (the
# filler left out, positions jumping) would be scanned in pieces: the
# scanner reports ERR_POS at the jump and the scan restarts there with the
# entry's own position.
#
# Failure: a gap (the log no longer holds entries the tables lack, e.g. a
# follower that Raft reset past retention) or an undecodable metadata
# record stops the applier: `error` is set and the `applied` watermark is
# closed with it, so wait_applied() raises instead of serving stale tables.
# install() (a newer snapshot from elsewhere) resumes it.
import collections
import logging
import math
import struct
from typing import Protocol

import attrs
import trio

from broker.metadata.records import INTERNAL_TOPICS, MetadataRecordError, parse_op
from broker.metadata.tables import MetadataState
from commitlog.entry import OFF_POS
from commitlog.errors import CommitLogError
from commitlog.watermark import Watermark
from consumequeue.record import MessageFormatError, decode
from native.dispatch import (
    ERR_POS,
    ERR_TEXT,
    REC_BAD,
    REC_SIZE,
    STOP_CORRUPT,
    STOP_END,
    STOP_FULL,
    STOP_NAMES,
    default_backend,
)
from native.dispatch_layout import Backend
from native.hashing import java_hash_str

log = logging.getLogger("ledgermq.metadata")

_I64 = struct.Struct(">q")
_HASH_FIELD = 88 // 4  # lmq_disp_rec.topic_hash, in int32 units (REC = "=6q4i6I2i")
_REC_INTS = REC_SIZE // 4
_NEEDLES = tuple(sorted({struct.pack("=i", java_hash_str(t)) for t in INTERNAL_TOPICS}))
_TOPIC_BYTES = frozenset(t.encode() for t in INTERNAL_TOPICS)


class MetadataApplyError(Exception):
    """The applier cannot continue from the local log."""


@attrs.define(str=False)
class MetadataGapError(MetadataApplyError):
    """Entries the tables still need were deleted from (or never reached)
    this node's log: a snapshot at or past begin_index - 1 is needed."""

    next_index: int
    begin_index: int

    def __str__(self) -> str:
        return (f"metadata needs log entry {self.next_index} but the log begins at {self.begin_index} "
                f"(retention or a Raft reset went past the last metadata snapshot)")


def find_hits(col: bytes) -> list[int]:
    """Record numbers whose topic hash (column bytes, 4 per record) is an
    internal topic's, in log order."""
    hits = set()
    for needle in _NEEDLES:
        i = col.find(needle)
        while i >= 0:
            if i % 4 == 0:
                hits.add(i // 4)
                i = col.find(needle, i + 4)
            else:
                i = col.find(needle, i + 1)
    return sorted(hits)


class AppliedLog(Protocol):
    """What the applier reads of the replicated log (commitlog.store.SegmentedStore)."""

    @property
    def begin_index(self) -> int: ...

    def read_views(self, first_index: int, max_bytes: int, max_count: int) -> tuple[list[memoryview], int]: ...


@attrs.define(eq=False)
class MetadataApplier:
    """Construct with the log (read_views, begin_index), the committed
    watermark and the state to continue from (a loaded snapshot)."""

    log: AppliedLog
    committed: Watermark
    state: MetadataState = attrs.Factory(MetadataState)
    backend: Backend = attrs.Factory(default_backend)
    max_batch_entries: int = 4096
    max_batch_bytes: int = 4 << 20
    applied: Watermark = attrs.field(init=False)
    # The topic table's version (the log index of its last change): the
    # broker re-registers with the name servers when it moves, woken only
    # by topic changes rather than by every commit.
    topics_version: Watermark = attrs.field(init=False)
    error: BaseException | None = attrs.field(default=None, init=False)
    stats: collections.Counter = attrs.Factory(collections.Counter)
    _recs: object = attrs.field(init=False)
    _resumed: trio.Event = attrs.Factory(trio.Event)

    def __attrs_post_init__(self) -> None:
        self.applied = Watermark(self.state.applied_index)
        self.topics_version = Watermark(self.state.topics.data_version.counter)
        self._recs = self.backend.new_records(self.max_batch_entries)

    @property
    def applied_index(self) -> int:
        return self.state.applied_index

    # --- the synchronous core ------------------------------------------------

    def apply_available(self, max_batches: int = math.inf) -> int:
        """Apply committed entries after applied_index, up to the committed
        watermark, in at most max_batches reads; returns entries consumed.
        Raises MetadataGapError, MetadataRecordError, MetadataApplyError or
        the store's CommitLogError (corruption)."""
        done = batches = 0
        while batches < max_batches:
            first, last = self.state.applied_index + 1, self.committed.value
            if first > last:
                break
            begin = self.log.begin_index
            if begin > first:
                raise MetadataGapError(first, begin)
            count = min(last - first + 1, self.max_batch_entries)
            # Views of the log's own maps (no copy, no second CRC check: this
            # store sealed or verified these entries when it appended them).
            pieces, count = self.log.read_views(first, self.max_batch_bytes, count)
            expect = first
            for piece in pieces:
                expect = self._apply_raw(piece, expect)
            if expect != first + count:
                raise MetadataApplyError(f"read {expect - first} entries from {first}, expected {count}")
            self.stats["entries"] += count
            end = first + count - 1
            self.state.applied_index = end
            self.applied.advance(end)
            self.topics_version.advance(self.state.topics.data_version.counter)
            done += count
            batches += 1
        return done

    def _apply_raw(self, buf: memoryview, first: int) -> int:
        """Apply the entries in buf (from index `first`); returns the index
        after the last."""
        off, expect = 0, first
        while off < len(buf):
            base_pos = _I64.unpack_from(buf, off + OFF_POS)[0]
            view = buf[off:]
            res = self.backend.scan(view, base_pos, self._recs, expect_index=expect)
            if res.n:
                self._apply_records(res, view, base_pos)
            off += res.consumed
            if res.entries:
                expect = res.last_index + 1
            if res.stop == STOP_END or res.stop == STOP_FULL:
                continue
            if res.stop == STOP_CORRUPT and res.err_code == ERR_POS and res.consumed > 0:
                continue  # a segment roll inside the batch
            reason = ERR_TEXT.get(res.err_code, STOP_NAMES[res.stop])
            raise MetadataApplyError(f"scan of committed entries from {first} stopped at entry {expect}: {reason}")
        return expect

    def _apply_records(self, res, view: memoryview, base_pos: int) -> None:
        col = memoryview(res.raw()).cast("i")[_HASH_FIELD::_REC_INTS].tobytes()
        for i in find_hits(col):
            r = res.record(i)
            topic = bytes(view[r.topic_off:r.topic_off + r.topic_len])
            if topic not in _TOPIC_BYTES:
                continue  # another topic with the same hash
            if r.flags & REC_BAD:
                self.stats["bad_records"] += 1
                log.warning("entry %d: malformed record on %s skipped", r.entry_index, topic.decode())
                continue
            try:
                msg = decode(view, r.phy_offset - base_pos, limit=r.size)
            except MessageFormatError as exc:
                raise MetadataRecordError(f"entry {r.entry_index}: {exc}") from None
            try:
                op = parse_op(msg.topic, msg.body)
            except MetadataRecordError as exc:
                raise MetadataRecordError(f"entry {r.entry_index}: {exc}") from None
            self.state.apply(op, r.entry_index, msg.store_timestamp)
            self.stats["ops"] += 1

    # --- the task ---------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Follow the commit watermark until cancelled (one read batch per
        step, so a long replay does not hold the event loop)."""
        task_status.started()
        while True:
            if self.error is not None:
                await self._resumed.wait()
                continue
            await self.committed.wait_for(self.state.applied_index + 1)
            try:
                self.apply_available(max_batches=1)
            except (MetadataApplyError, MetadataRecordError, CommitLogError) as exc:
                self._fail(exc)
            await trio.lowlevel.checkpoint()

    def _fail(self, exc: BaseException) -> None:
        log.error("metadata applier stopped at index %d: %s", self.state.applied_index, exc)
        self.error = exc
        self._resumed = trio.Event()
        self.applied.close(exc)

    def install(self, state: MetadataState) -> None:
        """Adopt a newer state (a snapshot taken elsewhere, e.g. fetched
        from the leader after a gap) and resume from its index."""
        if state.applied_index < self.state.applied_index:
            raise ValueError(f"snapshot at {state.applied_index} is older than the tables "
                             f"({self.state.applied_index})")
        self.state = state
        self.error = None
        self.applied.reopen()
        self.applied.advance(state.applied_index)
        self._resumed.set()

    async def wait_applied(self, index: int, timeout: float = math.inf) -> int:
        """Return once the tables include every entry up to `index`.  Raises
        the applier's error if it stopped, trio.TooSlowError on timeout."""
        if self.error is not None:
            raise self.error
        return await self.applied.wait_for(index, timeout)
