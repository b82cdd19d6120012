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
import struct
from array import array

import attrs

from commitlog.entry import MAGIC_NORMAL
from consumequeue.record import POS_PHYSICALOFFSET, POS_QUEUEOFFSET
from native.dispatch import MODE_DLEDGER, REC, REC_BAD, REC_NO_CQ, STOP_BLANK, STOP_END, STOP_FULL, default_backend
from native.dispatch_layout import Backend

log = logging.getLogger(__name__)

_I64 = struct.Struct(">q")


@attrs.define
class QueueOffsetTable:
    _next: dict[tuple[str, int], int] = attrs.field(factory=dict)
    assigned: int = 0  # offsets handed out since the last rebuild
    _backend: Backend = attrs.field(factory=default_backend)
    _names: dict[bytes, str] = attrs.field(factory=dict)  # topic bytes -> str, for the hook
    _recs: object = None  # the hook's scan records, grown to the largest append
    _recs_cap: int = 0

    def _stamp_grouped(self, view, base: int, res, first_index: int, stamps: array) -> None:
        be = self._backend
        g = be.group(view, res)
        firsts = array("q", bytes(8 * g.ngroups))
        names, assign, recs = self._names, self.assign, self._recs
        starts, order, topic_queue = g.starts, g.order, be.topic_queue
        for k in range(g.ngroups):
            toff, tlen, queue_id = topic_queue(recs, order[starts[k]])
            raw = bytes(view[toff:toff + tlen])
            topic = names.get(raw)
            if topic is None:
                topic = names[raw] = raw.decode("utf-8", "replace")
            firsts[k] = assign(topic, queue_id, starts[k + 1] - starts[k])
        be.stamp_offsets(view, base, res, g, firsts, first_index, stamps)

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

    def append_hook(self, batch) -> array:
        """The commitlog append hook (store.add_append_hook(table.append_hook)):
        one native scan of the batch's records, grouped by queue; each
        queue's offsets are taken from the table once per group and
        written into the records (QUEUEOFFSET, and PHYSICALOFFSET) by the
        backend.  Returns each entry's queue offset (-1 where an entry holds
        no message record), which the store hands to the appender (no
        read-back).  A scan that found a malformed record takes the record
        by record path, which skips it."""
        n = len(batch.lens)
        stamps = array("q", [-1]) * n
        if batch.magic != MAGIC_NORMAL or n == 0:
            return stamps
        if self._recs_cap < n:
            self._recs_cap = max(n, 256)
            self._recs = self._backend.new_records(self._recs_cap)
        out, start, first, positions = batch.out, batch.start, batch.first_index, batch.positions
        names, assign = self._names, self.assign
        pack = _I64.pack_into
        done = 0  # entries scanned so far
        while done < n:
            base = positions[done]
            view = out[base - start:]
            res = self._backend.scan(view, base, self._recs, mode=MODE_DLEDGER, expect_index=first + done)
            if res.bad == 0:
                self._stamp_grouped(view, base, res, first, stamps)
                done += res.entries
                if res.stop not in (STOP_END, STOP_FULL, STOP_BLANK):
                    break
                continue
            for rec in REC.iter_unpack(res.raw()):
                index, _, phy, _, _, _, _, qid, _, flags, toff, tlen = rec[:12]
                if flags & REC_BAD:
                    log.error("entry %d: malformed message record; not assigning a queue offset", index)
                    continue
                if flags & REC_NO_CQ:  # transaction PREPARED / ROLLBACK: consumes no offset
                    queue_offset = 0
                else:
                    raw = bytes(view[toff:toff + tlen])
                    topic = names.get(raw)
                    if topic is None:
                        topic = names[raw] = raw.decode("utf-8", "replace")
                    queue_offset = assign(topic, qid)
                at = phy - start
                pack(out, at + POS_QUEUEOFFSET, queue_offset)
                pack(out, at + POS_PHYSICALOFFSET, phy)
                stamps[index - first] = queue_offset
            done += res.entries
            if res.stop not in (STOP_END, STOP_FULL, STOP_BLANK):
                break  # (the store's own layout: not expected) the rest stays unstamped
        return stamps
