# Owns offline verification of the message layer of a store (mqadmin
# verifyStore's message checks and its --cq option):
#  * every message record inside a committed entry is well formed, its
#    BODYCRC verifies and its PHYSICALOFFSET is the entry pos + 48;
#  * (cq) every consume queue unit equals what dispatching the log would
#    write, each queue's offsets are contiguous in log order, no queue holds
#    units beyond the messages in the log, and the index ends inside the
#    committed log.
# The scan runs the native scanner over the committed range (the same code
# dispatch uses), so a clean verify means "a rebuild would change nothing".
import os

import attrs

from consumequeue.cq import CQ_UNIT_SIZE, ConsumeQueueStore
from consumequeue.errors import InconsistentStateError
from consumequeue.indexfile import IndexService
from consumequeue.record import DEFAULT_DELAY_LEVELS_MS
from consumequeue.source import CommitlogSource
from native.dispatch import (
    BAD_TEXT,
    ERR_TEXT,
    REC_BAD,
    REC_CRC_BAD,
    REC_PHY_MISMATCH,
    SCAN_CHECK_CRC,
    STOP_BLANK,
    STOP_CORRUPT,
    STOP_END,
    STOP_FULL,
    STOP_NAMES,
    UNIT,
    default_backend,
)

MAX_PROBLEMS = 200


@attrs.frozen(kw_only=True)
class LogSpan:
    """Where an offline store's log begins and its committed part ends."""

    data_dir: str
    data_segment_size: int
    begin_pos: int
    committed_index: int  # clamped to the last entry
    committed_pos: int  # just after it
    last_index: int


def offline_span(store_dir: str) -> LogSpan:
    """Read-only: walk the store (commitlog.scan, natively) for the first
    entry, the last entry and the committed one.  The committed index comes
    from DLedger's checkpoint, clamped to the log as recovery does."""
    from commitlog.entry import INDEX_UNIT
    from commitlog.metafiles import read_checkpoint
    from commitlog.scan import StoreReader

    _, committed = read_checkpoint(store_dir)
    begin = last = None
    committed_end = None
    with StoreReader.open(store_dir) as reader:
        seg_size = reader.data.seg_size
        for chunk in reader.chunks():
            if begin is None:
                begin = INDEX_UNIT.unpack_from(chunk.units, 0)[1]
            first, n = chunk.first_index, chunk.count
            last = INDEX_UNIT.unpack_from(chunk.units, (n - 1) * 32)
            if first <= committed < first + n:
                _, pos, size, _, _ = INDEX_UNIT.unpack_from(chunk.units, (committed - first) * 32)
                committed_end = pos + size
    if begin is None:
        return LogSpan(data_dir=os.path.join(store_dir, "data"), data_segment_size=seg_size, begin_pos=0,
                       committed_index=-1, committed_pos=0, last_index=-1)
    if committed_end is None:  # beyond the log (or -1): clamp
        if committed >= 0:
            committed, committed_end = last[3], last[1] + last[2]
        else:
            committed_end = begin
    return LogSpan(data_dir=os.path.join(store_dir, "data"), data_segment_size=seg_size, begin_pos=begin,
                   committed_index=committed, committed_pos=committed_end, last_index=last[3])


@attrs.frozen
class Problem:
    where: str  # "commitlog@<pos>", "consumequeue/<topic>/<qid>@<offset>", "index/<file>"
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


@attrs.define
class VerifyReport:
    messages: int = 0
    entries: int = 0
    units_checked: int = 0
    queues: int = 0
    problems: list[Problem] = attrs.field(factory=list)
    truncated: bool = False  # more problems than MAX_PROBLEMS

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, where: str, reason: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(Problem(where, reason))
        else:
            self.truncated = True

    def to_json(self) -> dict:
        return {"ok": self.ok, "messages": self.messages, "entries": self.entries,
                "unitsChecked": self.units_checked, "queues": self.queues,
                "problems": [str(p) for p in self.problems], "truncated": self.truncated}


def verify(source: CommitlogSource, begin_pos: int, end_pos: int, *, root: str | None = None,
           check_cq: bool = False, cq_file_size: int | None = None, index_slot_num: int | None = None,
           index_num: int | None = None, backend=None, progress=None) -> VerifyReport:
    """Check the messages in [begin_pos, end_pos) and, with check_cq, the
    consume queues and index under `root`."""
    be = backend or default_backend()
    rep = VerifyReport()
    cqs = None
    if check_cq:
        kw = {"file_size": cq_file_size} if cq_file_size else {}
        cqs = ConsumeQueueStore(root, backend=be, readonly=True, **kw).load()
        for p in cqs.problems():
            rep.add("consumequeue", p)
    expect_next: dict[tuple[str, int], int] = {}
    recs = be.new_records(8192)
    pos = begin_pos
    try:
        while pos < end_pos:
            try:
                seg_end = source.segment_end(pos)
            except KeyError:
                rep.add(f"commitlog@{pos}", "no segment holds this position")
                break
            view = source.view(pos, min(end_pos, seg_end))
            try:
                mode = source.mode_at(pos) if hasattr(source, "mode_at") else source.mode  # a migrated store
                res = be.scan(view, pos, recs, mode=mode, options=SCAN_CHECK_CRC, delay_levels=DEFAULT_DELAY_LEVELS_MS)
                _check_records(rep, res, view)
                if cqs is not None:
                    _check_units(rep, cqs, res, view, be, expect_next)
            finally:
                view.release()
            rep.messages += res.n
            rep.entries += res.entries
            pos += res.consumed
            if res.stop == STOP_BLANK or (res.stop == STOP_END and pos == seg_end):
                pos = seg_end
            elif res.stop == STOP_CORRUPT:
                rep.add(f"commitlog@{pos}", ERR_TEXT.get(res.err_code, str(res.err_code)))
                break
            elif res.stop not in (STOP_END, STOP_FULL):
                rep.add(f"commitlog@{pos}", f"scan stopped: {STOP_NAMES[res.stop]}")
                break
            if progress:
                progress(pos - begin_pos, end_pos - begin_pos)
        if cqs is not None:
            _check_queue_ends(rep, cqs, expect_next)
            _check_index(rep, root, end_pos, index_slot_num, index_num)
    finally:
        if cqs is not None:
            cqs.close()
    return rep


def _check_records(rep: VerifyReport, res, view) -> None:
    if not res.n:
        return
    # Fast path: the flags column (int32 #15 of each 24-int record) all zero.
    flags = memoryview(res.raw()).cast("i")[15::24].tobytes()
    if flags.count(0) == len(flags):
        return
    for i in range(res.n):
        r = res.record(i)
        if r.flags & REC_BAD:
            rep.add(f"commitlog@{r.phy_offset}", f"entry {r.entry_index}: malformed message: "
                    f"{BAD_TEXT.get(r.bad_reason, r.bad_reason)}")
        if r.flags & REC_CRC_BAD:
            rep.add(f"commitlog@{r.phy_offset}", f"entry {r.entry_index}: message BODYCRC mismatch")
        if r.flags & REC_PHY_MISMATCH:
            rep.add(f"commitlog@{r.phy_offset}", f"entry {r.entry_index}: PHYSICALOFFSET differs "
                    "from the record's position")


def _check_units(rep: VerifyReport, cqs: ConsumeQueueStore, res, view, be, expect_next) -> None:
    g = be.group(view, res)
    for gi in range(g.ngroups):
        a, b = g.starts[gi], g.starts[gi + 1]
        idxs = be.order_slice(g, a, b)
        first = res.record(idxs[0])
        topic = first.topic(view)
        key = (topic, first.queue_id)
        where = f"consumequeue/{topic}/{first.queue_id}"
        units, run = be.cq_pack(res, g, a, b)
        offsets = [res.record(i).queue_offset for i in idxs] if run != b - a else \
            list(range(first.queue_offset, first.queue_offset + b - a))
        nxt = expect_next.get(key)
        if nxt is not None and offsets[0] != nxt:
            rep.add(f"{where}@{offsets[0]}", f"queue offset {offsets[0]} follows {nxt - 1} in log order")
        for o, p in zip(offsets, offsets[1:]):
            if p != o + 1:
                rep.add(f"{where}@{p}", f"queue offset {p} follows {o} in log order")
        expect_next[key] = offsets[-1] + 1
        cq = cqs.get(topic, first.queue_id)
        if cq is None:
            rep.add(where, f"missing (the log has messages for it at offset {offsets[0]})")
            continue
        rep.units_checked += len(offsets)
        if run == b - a and offsets[0] >= cq.min_offset and offsets[-1] < cq.max_offset:
            if cq.read_raw(offsets[0], len(offsets)) == units:
                continue
        for k, o in enumerate(offsets):  # slow path: say which unit differs
            want = units[k * CQ_UNIT_SIZE:(k + 1) * CQ_UNIT_SIZE]
            if not cq.min_offset <= o < cq.max_offset:
                rep.add(f"{where}@{o}", f"unit missing (queue holds [{cq.min_offset}, {cq.max_offset}))")
                continue
            got = cq.read_raw(o, 1)
            if len(got) < CQ_UNIT_SIZE:
                rep.add(f"{where}@{o}", "unit missing (its file is missing)")
            elif got != want:
                rep.add(f"{where}@{o}", f"unit {UNIT.unpack(got)} != expected {UNIT.unpack(want)}")


def _check_queue_ends(rep: VerifyReport, cqs: ConsumeQueueStore, expect_next) -> None:
    rep.queues = len(cqs.queues)
    for (topic, qid), cq in cqs.queues.items():
        want = expect_next.get((topic, qid))
        where = f"consumequeue/{topic}/{qid}"
        if want is None:
            if cq.is_placeholder:
                continue  # numbering kept across a log reset (ConsumeQueue.rebase)
            rep.add(where, f"holds units [{cq.min_offset}, {cq.max_offset}) but the log has no "
                    "message for it")
        elif cq.max_offset != want:
            rep.add(where, f"ends at offset {cq.max_offset}, the log's messages end at {want}")


def _check_index(rep: VerifyReport, root: str, end_pos: int, slot_num, index_num) -> None:
    kw = {}
    if slot_num:
        kw["slot_num"] = slot_num
    if index_num:
        kw["index_num"] = index_num
    try:
        svc = IndexService(root, readonly=True, **kw).load()
    except InconsistentStateError as exc:  # a file of the wrong size or with a damaged header
        rep.add("index", exc.reason)
        return
    try:
        for f in svc.files:
            h = f.header
            if h.end_phy_offset >= end_pos and h.index_count > 1:
                rep.add(f"index/{f.name}", f"endPhyOffset {h.end_phy_offset} is beyond the committed "
                        f"log end {end_pos}")
            if not 1 <= h.index_count <= f.index_num:
                rep.add(f"index/{f.name}", f"indexCount {h.index_count} out of range")
    finally:
        svc.close()
