# Owns crash recovery of a segmented store at open (spec §5.5, extended with
# ledgermq's CRCs): find the last good entry, cut a torn or corrupt tail out
# of the data and index files, rebuild index units from the data, and refuse
# to guess when damage sits in the middle of the log.
#
# Like DLedger, the scan starts at the data segment max(0, n-3) (walking back
# while a segment's first entry is bad or disagrees with its index unit, or
# while index segments below it are missing) and goes forward to the end;
# older segments were verified when they were the tail.  Every scanned entry
# is checked natively: magic, size, bodySize, channel, pos == its position,
# index and term continuity, the blank rule, CRCs when present, and equality
# of the index unit.
#
# Tail or middle?  At the first bad spot (offset P, expected index i) we ask
# whether intact log data exists after it: an entry at P + the bad header's
# size, at the end of i's index unit, at the index unit of i + 1, or at the
# start of a later data segment.  A kill -9 leaves a clean prefix of what
# was written (data before index, segment by segment), so after a crash none
# of these probes succeeds and the tail is cut.  If one succeeds, the damage
# is in the middle: open fails with CorruptStoreError naming the file and
# offset unless `repair` is set, in which case the log is cut there too.
import attrs

from commitlog.entry import INDEX_UNIT_SIZE as UNIT
from commitlog.entry import decode_header
from commitlog.errors import CorruptStoreError
from commitlog.metafiles import StoreBase, read_base, read_checkpoint, remove_base
from commitlog.segments import Segment, SegmentList, tail_is_zero
from native.entries import (
    F_CHECK_CRC,
    F_SEGMENT,
    R_BLANK,
    R_END,
    R_MAX,
    R_SHORT,
    S_COUNT,
    S_DETAIL,
    S_EXPECTED,
    S_LAST_TERM,
    S_NEXT_INDEX,
    S_POS,
    S_PREV_CHAIN,
    S_SEG_END,
    first_diff,
    new_state,
    reason_text,
    scan_entries,
)

CHUNK = 1 << 16  # entries per native scan call; bounds the unit buffer (2 MiB)
START_SEGMENTS = 3  # DLedger scans the last three data files


@attrs.define
class RecoveryReport:
    """What recovery did, for logs and tests."""

    start_file: str | None = None
    entries_scanned: int = 0
    index_units_rewritten: int = 0  # written from the first disagreeing unit of a chunk on
    cut_at: tuple[str, int, str] | None = None  # (file, offset, reason) of a cut tail
    repaired: bool = False  # the cut was a middle corruption dropped under `repair`
    deleted_files: list[str] = attrs.field(factory=list)
    extended_files: list[str] = attrs.field(factory=list)


@attrs.frozen(kw_only=True)
class RecoveredLog:
    begin_index: int
    end_index: int
    end_term: int
    end_pos: int
    end_chain_crc: int
    crc_mode: bool
    committed_index: int
    base: StoreBase | None
    report: RecoveryReport


def read_unit(index: SegmentList, i: int):
    """The 32 stored bytes of index unit i, or None when not on disk."""
    off = i * UNIT
    seg = index.find(off)
    if seg is None:
        return None
    view = seg.view()
    at = off - seg.start
    return view[at:at + UNIT] if at + UNIT <= len(view) else None


def scan_one(data: SegmentList, pos: int, expected_index: int = -1):
    """Check the single entry at absolute `pos` (following a blank filler to
    the next segment).  Returns (index unit bytes, state) or None."""
    for _ in range(2):
        seg = data.find(pos)
        if seg is None:
            return None
        st = new_state(next_index=expected_index, pos=pos, seg_end=seg.end, seg_size=data.seg_size,
                       chain_known=False)
        unit = bytearray(UNIT)
        r = scan_entries(seg.view()[pos - seg.start:], F_SEGMENT | F_CHECK_CRC, 1, st, unit)
        if r == R_MAX:
            return unit, st
        if r != R_BLANK:
            return None
        pos = seg.end
    return None


def _sync_units(index: SegmentList, first: int, units) -> int:
    """Make the index hold `units` from unit `first` on; returns how many
    units had to be (re)written."""
    rewritten, done, off = 0, 0, first * UNIT
    while done < len(units):
        at = off + done
        seg = index.find(at)
        limit = (seg.end if seg else index.aligned_start(at) + index.seg_size) - at
        piece = units[done:done + min(len(units) - done, limit)]
        stored = seg.view()[at - seg.start:at - seg.start + len(piece)] if seg else b""
        diff = first_diff(stored, piece) if len(stored) == len(piece) else 0
        if diff >= 0:
            skip = diff // UNIT * UNIT
            index.write_span(at + skip, piece[skip:], allow_gap=True)
            rewritten += (len(piece) - skip) // UNIT
        done += len(piece)
    return rewritten


def _cut(sl: SegmentList, offset: int, report: RecoveryReport) -> None:
    """Everything from `offset` on becomes zero / goes away (skipping files
    that already are, so a clean store is not rewritten)."""
    seg = sl.find(offset)
    if seg is not None and offset > seg.start:
        at = offset - seg.start
        short = seg.file_length() < seg.size
        if not tail_is_zero(seg.fd(), seg.view(), at):
            seg.zero_from(at)
        elif short:
            seg.ensure_full_size()
        if short:
            report.extended_files.append(seg.path)
        report.deleted_files += sl.remove_after(seg.end)
    else:
        report.deleted_files += sl.remove_after(sl.aligned_start(offset))


def _check_contiguous(data: SegmentList, repair: bool, report: RecoveryReport) -> None:
    segs = data.segments
    for seg in segs:
        if seg.start % data.seg_size:
            raise CorruptStoreError(seg.path, 0, f"name is not a multiple of the segment size {data.seg_size}")
    for a, b in zip(segs, segs[1:]):
        if b.start != a.end:
            if not repair:
                raise CorruptStoreError(b.path, 0, f"data segment(s) missing between {a.name} and this file")
            report.repaired = True
            report.cut_at = (b.path, 0, "data segment(s) missing before this file")
            report.deleted_files += data.remove_after(b.start)
            return


def recover(store_dir: str, data: SegmentList, index: SegmentList, *, repair: bool) -> RecoveredLog:
    report = RecoveryReport()
    cp_end, cp_committed = read_checkpoint(store_dir)
    base = read_base(store_dir)
    for seg in index.segments:  # derived data: make every index file full size
        if seg.ensure_full_size():
            report.extended_files.append(seg.path)
    _check_contiguous(data, repair, report)
    segs = data.segments
    if base is not None and segs:
        base_seg = data.aligned_start(base.pos)
        if segs[0].start < base_seg and data.find(base.pos) is not None:
            # Retention recorded this boundary and died deleting the head: finish.
            for seg in [s for s in segs if s.start < base_seg]:
                report.deleted_files.append(data.remove(seg))
        elif segs[0].start != base_seg:
            remove_base(store_dir)  # the files it described were removed by other means
            base = None
    if not segs:
        report.deleted_files += index.remove_all()
        if base is None:
            return RecoveredLog(begin_index=-1, end_index=-1, end_term=-1, end_pos=0, end_chain_crc=0, crc_mode=False,
                                committed_index=-1, base=None, report=report)
        return RecoveredLog(begin_index=base.index, end_index=base.index - 1, end_term=base.prev_term, end_pos=base.pos,
                            end_chain_crc=base.prev_chain_crc,
                            crc_mode=base.prev_chain_crc != 0, committed_index=base.index - 1, base=base, report=report)

    def start_state(k: int):
        seg = segs[k]
        if k == 0 and base is not None:
            return new_state(next_index=base.index, last_term=base.prev_term, pos=base.pos, seg_end=seg.end,
                             seg_size=data.seg_size, prev_chain=base.prev_chain_crc)
        return new_state(pos=seg.start, seg_end=seg.end, seg_size=data.seg_size, chain_known=False)

    def first_entry(k: int):
        """(index, unit) of segment k's first entry when it checks out."""
        st = start_state(k)
        unit = bytearray(UNIT)
        r = scan_entries(segs[k].view()[st[S_POS] - segs[k].start:], F_SEGMENT | F_CHECK_CRC, 1, st, unit)
        return (st[S_NEXT_INDEX] - 1, unit) if r == R_MAX else None

    def index_covers(lo: int, hi: int) -> bool:
        return all(index.find(off) is not None for off in
                   range(index.aligned_start(lo * UNIT), hi * UNIT, index.seg_size))

    # --- choose where to start scanning ---------------------------------
    k = max(0, len(segs) - START_SEGMENTS)
    while k > 0:
        first = first_entry(k)
        if first is not None and read_unit(index, first[0]) == first[1]:
            begin_first = first_entry(0)
            if begin_first is None or index_covers(begin_first[0], first[0]):
                break
            k = 0
            break
        k -= 1
    report.start_file = segs[k].path

    # --- scan forward ---------------------------------------------------
    st = start_state(k)
    units = bytearray(UNIT * CHUNK)
    bad = None  # (segment, absolute pos, reason) of the first problem
    end_pos = None
    blank_pos = None  # where the last blank filler passed starts
    while True:
        seg = segs[k]
        view = seg.view()
        while True:
            r = scan_entries(view[st[S_POS] - seg.start:], F_SEGMENT | F_CHECK_CRC, CHUNK, st, units)
            n = st[S_COUNT]
            if n:
                report.entries_scanned += n
                report.index_units_rewritten += _sync_units(index, st[S_NEXT_INDEX] - n,
                                                            memoryview(units)[:n * UNIT])
            if r != R_MAX:
                break
        if r == R_BLANK:
            blank_pos = st[S_POS]
            if k + 1 < len(segs):
                k += 1
                st[S_POS], st[S_SEG_END] = segs[k].start, segs[k].end
                continue
            end_pos = seg.end
        elif r in (R_END, R_SHORT):
            end_pos = st[S_POS]
            if k + 1 < len(segs) or r == R_END:
                bad = (seg, end_pos, "end of the log (zeros or end of file)")
        else:
            end_pos = st[S_POS]
            bad = (seg, end_pos, reason_text(r, st[S_DETAIL], st[S_EXPECTED]))
        break

    # A blank filler is written with the entry that did not fit; when that
    # entry is lost the blank goes too, so the layout continues exactly as a
    # fresh writer (and every replica) would continue it.
    if blank_pos is not None and end_pos == data.aligned_start(blank_pos) + data.seg_size:
        end_pos = blank_pos
    next_index = st[S_NEXT_INDEX]
    if bad is not None:
        seg, pos, reason = bad
        follows = _valid_data_follows(data, index, segs.index(seg), pos, next_index)
        if follows is not None and not repair:
            hint = ""
            if next_index > cp_end >= 0:
                hint = (f" (index {next_index} is beyond the last checkpoint, endIndex {cp_end}: after a"
                        " power cut in async flush mode, reopen with repair to cut the log here)")
            raise CorruptStoreError(seg.path, pos - seg.start, f"{reason}; intact entries follow at {follows}{hint}")
        if follows is not None or r not in (R_END, R_SHORT):
            report.cut_at = (seg.path, pos - seg.start, reason)
            report.repaired = follows is not None

    # --- apply the cut ------------------------------------------------------
    if next_index < 0 and base is None:
        # Not even the first entry of the store survived: start afresh.
        report.deleted_files += data.remove_all() + index.remove_all()
        return RecoveredLog(begin_index=-1, end_index=-1, end_term=-1, end_pos=0, end_chain_crc=0, crc_mode=False,
                            committed_index=-1, base=None, report=report)
    _cut(data, end_pos, report)
    end_index = next_index - 1
    _cut(index, (end_index + 1) * UNIT, report)

    # --- the other end ------------------------------------------------------
    if base is not None:
        begin_index = base.index
    else:
        first = first_entry(0)
        if first is None:
            if not repair:
                raise CorruptStoreError(segs[0].path, 0, "the first entry of the store is damaged")
            while data.segments and first_entry(0) is None:  # segs is data.segments
                report.deleted_files.append(data.remove(data.segments[0]))
            report.repaired = True
            if not data.segments:
                report.deleted_files += index.remove_all()
                return RecoveredLog(begin_index=-1, end_index=-1, end_term=-1, end_pos=0, end_chain_crc=0,
                                    crc_mode=False, committed_index=-1, base=None, report=report)
            first = first_entry(0)
        begin_index = first[0]
    for seg in list(index.segments):  # retention leftovers below the log
        if seg.end <= begin_index * UNIT:
            report.deleted_files.append(index.remove(seg))

    end_chain, crc_mode = st[S_PREV_CHAIN], False
    if end_index >= begin_index:
        unit = read_unit(index, end_index)
        pos = int.from_bytes(unit[4:12], "big")
        seg = data.find(pos)
        h = decode_header(seg.view(), pos - seg.start)
        end_chain, crc_mode = h.chain_crc, h.has_crc
    elif base is not None:
        end_chain, crc_mode = base.prev_chain_crc, base.prev_chain_crc != 0
    committed = min(cp_committed, end_index)
    if begin_index > 0:
        committed = max(committed, begin_index - 1)  # retention only drops committed entries
    return RecoveredLog(begin_index=begin_index, end_index=end_index, end_term=st[S_LAST_TERM], end_pos=end_pos,
                        end_chain_crc=end_chain, crc_mode=crc_mode,
                        committed_index=committed, base=base, report=report)


def _valid_data_follows(data: SegmentList, index: SegmentList, k: int, pos: int, bad_index: int) -> str | None:
    """Where intact log data sits after the bad spot at `pos` (segment k),
    or None when the damage is a tail."""
    segs = data.segments
    seg: Segment = segs[k]
    candidates = []
    view = seg.view()
    at = pos - seg.start
    if at + 48 <= len(view):
        size = int.from_bytes(view[at + 4:at + 8], "big", signed=True)
        if 48 <= size <= seg.end - pos:
            candidates.append((pos + size, bad_index + 1 if bad_index >= 0 else -1))
    if bad_index >= 0:
        for i in (bad_index, bad_index + 1):
            unit = read_unit(index, i)
            if unit is None or int.from_bytes(unit[16:24], "big") != i:
                continue
            upos, usize = int.from_bytes(unit[4:12], "big"), int.from_bytes(unit[12:16], "big")
            if i == bad_index and upos == pos:
                candidates.append((upos + usize, i + 1))
            elif i == bad_index + 1 and upos > pos:
                candidates.append((upos, i))
    for later in segs[k + 1:]:
        candidates.append((later.start, -1))
    for cpos, expect in candidates:
        found = scan_one(data, cpos, expect)
        if found is None:
            continue
        idx = found[1][S_NEXT_INDEX] - 1
        if bad_index < 0 or idx >= bad_index:
            where = data.find(cpos)
            return f"{where.name}+{cpos - where.start} (index {idx})"
    return None
