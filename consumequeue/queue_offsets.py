# Owns the leader's topic-queue offset table (RocketMQ's topicQueueTable)
# and the commitlog append hook that uses it (spec §6.3): on the leader,
# after DLedger assigned the entry's index/term/pos and before the bytes are
# CRC'd and written, the hook writes
#     QUEUEOFFSET    = the next offset of (topic, queueId)
#     PHYSICALOFFSET = entry pos + 48
# into the record, so every replica stores identical bytes.  Transaction
# PREPARED and ROLLBACK records get QUEUEOFFSET 0 and consume no offset
# (they never reach a consume queue).
#
# A new leader (or a leader whose append failed after the hook ran) calls
# rebuild(): consume queues give every queue's dispatched end, and the log
# tail after the dispatch position (committed or not, assigned by an
# earlier leader) is scanned for higher offsets.  Followers never use the
# table; they store the leader's bytes.
import logging

import attrs

from commitlog.entry import BODY_OFFSET, MAGIC_NORMAL
from consumequeue.record import (
    MAGIC_V1,
    MAGIC_V2,
    TRANSACTION_MASK,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    MessageFormatError,
    read_topic_queue,
    set_physical_offset,
    set_queue_offset,
)
from native.dispatch import REC_BAD, REC_NO_CQ, STOP_BLANK, STOP_END, STOP_FULL, default_backend

log = logging.getLogger(__name__)

_NO_OFFSET_TYPES = (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)


@attrs.define
class QueueOffsetTable:
    _next: dict[tuple[str, int], int] = attrs.field(factory=dict)
    assigned: int = 0  # offsets handed out since the last rebuild

    def next_offset(self, topic: str, queue_id: int) -> int:
        return self._next.get((topic, queue_id), 0)

    def assign(self, topic: str, queue_id: int, count: int = 1) -> int:
        """Hand out `count` consecutive offsets; returns the first."""
        key = (topic, queue_id)
        first = self._next.get(key, 0)
        self._next[key] = first + count
        self.assigned += count
        return first

    def observe(self, topic: str, queue_id: int, queue_offset: int) -> None:
        key = (topic, queue_id)
        if queue_offset + 1 > self._next.get(key, 0):
            self._next[key] = queue_offset + 1

    def snapshot(self) -> dict[tuple[str, int], int]:
        return dict(self._next)

    def rebuild_from_consume_queues(self, cqs, source=None, from_pos: int | None = None,
                                    end_pos: int | None = None, *, backend=None) -> None:
        """Every queue's next offset from the consume queues, then raised by
        each message in the log bytes [from_pos, end_pos) (the undispatched
        tail, committed or not)."""
        self._next = dict(cqs.max_offset_table())
        self.assigned = 0
        if source is not None and from_pos is not None and end_pos is not None:
            self.observe_log(source, from_pos, end_pos, backend=backend)

    rebuild = rebuild_from_consume_queues

    def observe_log(self, source, from_pos: int, end_pos: int, *, backend=None) -> int:
        """Scan commitlog bytes and observe each dispatchable record's queue
        offset.  Returns the number of records seen."""
        be = backend or default_backend()
        recs = be.new_records(4096)
        pos, seen = from_pos, 0
        while pos < end_pos:
            seg_end = source.segment_end(pos)
            view = source.view(pos, min(end_pos, seg_end))
            try:
                res = be.scan(view, pos, recs, mode=source.mode)
                for i in range(res.n):
                    r = res.record(i)
                    if not r.flags & (REC_NO_CQ | REC_BAD):
                        self.observe(r.topic(view), r.queue_id, r.queue_offset)
                seen += res.n
            finally:
                view.release()
            pos += res.consumed
            if res.stop == STOP_BLANK or (res.stop == STOP_END and pos == seg_end):
                pos = seg_end
            elif res.stop not in (STOP_END, STOP_FULL):
                log.warning("queue offset scan stopped at %d (%s)", pos, res.stop_name)
                break
        return seen

    def append_hook(self, header, body) -> None:
        """The commitlog append hook (store.add_append_hook(table.append_hook))."""
        if header.magic != MAGIC_NORMAL or len(body) < 8:
            return
        if int.from_bytes(body[4:8], "big", signed=True) not in (MAGIC_V1, MAGIC_V2):
            return  # not a message record: nothing to fill in
        try:
            if int.from_bytes(body[0:4], "big", signed=True) != len(body):
                raise MessageFormatError(f"TOTALSIZE differs from the entry body size {len(body)}")
            topic, queue_id, sysflag = read_topic_queue(body)
        except MessageFormatError as exc:
            # Stored as is; dispatch flags and skips it.
            log.error("entry %d: malformed message record (%s); not assigning a queue offset",
                      header.index, exc)
            return
        if sysflag & TRANSACTION_MASK in _NO_OFFSET_TYPES:
            queue_offset = 0
        else:
            queue_offset = self.assign(topic, queue_id)
        set_queue_offset(body, queue_offset)
        set_physical_offset(body, header.pos + BODY_OFFSET)
