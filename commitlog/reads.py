# Owns the read side of SegmentedStore (mixed into it): index-unit lookups,
# get, read_batch for replication, and the term/position queries Raft needs.
# Reads go through the read-only mmaps of the segments; nothing here writes.
# Every entry that leaves is checked first (header against its index unit,
# CRCs when present), so a corrupt entry raises CorruptStoreError instead of
# being served -- except the entries of the leader's last append, which
# read_batch ships from the bytes that append sealed and wrote (_fresh).
import bisect

from commitlog.entry import HEADER, HEADER_SIZE, INDEX_UNIT, Entry, EntryBatch, EntryHeader
from commitlog.entry import INDEX_UNIT_SIZE as UNIT
from commitlog.errors import CorruptStoreError, IndexBelowBeginError, IndexBeyondEndError
from native.entries import (
    F_BATCH,
    F_CHECK_CRC,
    PROBLEM,
    R_ROLL,
    S_CONSUMED,
    S_DETAIL,
    S_EXPECTED,
    S_NEXT_INDEX,
    S_POS,
    S_SEG_END,
    new_state,
    reason_text,
    scan_entries,
)
from native.hashing import crc32


class StoreReads:
    """Reads of a SegmentedStore; uses its data/index segment lists, its
    _begin/_end/_base state, _seg_end() and _check_open()."""

    def _check_index(self, index: int) -> None:
        self._check_open()
        if index < 0 or (self._begin >= 0 and index < self._begin):
            raise IndexBelowBeginError(index, max(self._begin, 0))
        if index > self._end:
            raise IndexBeyondEndError(index, self._end)

    def _unit(self, index: int) -> tuple[int, int, int, int, int]:
        """(magic, pos, size, index, term) of a readable index."""
        off = index * UNIT
        seg = self.index.find(off)
        if seg is None:
            raise CorruptStoreError(self.index.directory, off, f"no index segment holds entry {index}")
        view = seg.view()
        if off - seg.start + UNIT > len(view):
            raise CorruptStoreError(seg.path, off - seg.start, f"index file too short for entry {index}")
        unit = INDEX_UNIT.unpack_from(view, off - seg.start)
        if unit[3] != index:
            raise CorruptStoreError(seg.path, off - seg.start, f"index unit for entry {index} holds index {unit[3]}")
        return unit

    def pos_of(self, index: int) -> int:
        self._check_index(index)
        return self._unit(index)[1]

    def _boundary(self, index: int) -> tuple[int, int] | None:
        """(term, chainCrc) when `index` is the boundary entry just below
        the log: the virtual entry -1 of a log that starts at 0 (-1, 0), or
        begin_index - 1 as recorded by reset_to, retention or a truncation
        of every entry (the ledgermq-base record).  None otherwise."""
        if index == -1 and self._begin <= 0:
            return -1, 0
        base = self._base
        if base is not None and index == base.index - 1:
            return base.prev_term, base.prev_chain_crc
        return None

    def term_at(self, index: int) -> int:
        """Term of entry `index`, or of the boundary entry begin_index - 1."""
        boundary = self._boundary(index)
        if boundary is not None:
            return boundary[0]
        self._check_index(index)
        return self._unit(index)[4]

    def chain_crc_at(self, index: int) -> int:
        """chainCrc of entry `index`, or of the boundary entry begin_index - 1."""
        boundary = self._boundary(index)
        if boundary is not None:
            return boundary[1]
        return self._header(index)[0].chain_crc

    def _header(self, index: int):
        self._check_index(index)
        magic, pos, size, _, term = self._unit(index)
        seg = self.data.find(pos)
        if seg is None:
            raise CorruptStoreError(self.data.directory, pos, f"no data segment holds entry {index}")
        view = seg.view()
        at = pos - seg.start
        if at + size > len(view) or size < HEADER_SIZE:
            raise CorruptStoreError(seg.path, at, f"entry {index} ({size} bytes) runs past the end of the file")
        h = EntryHeader(*HEADER.unpack_from(view, at))
        if (h.magic, h.size, h.index, h.term, h.pos) != (magic, size, index, term, pos):
            raise CorruptStoreError(seg.path, at, f"entry {index} disagrees with its index unit")
        if h.body_size != size - HEADER_SIZE:
            # Zeroed header bytes can also zero both CRC fields, which makes
            # the entry read as a stock one without checks: the body size is
            # what still tells (the recovery fuzzer served a zeroed body).
            raise CorruptStoreError(seg.path, at, f"entry {index}: body size {h.body_size} does not match "
                                                  f"its entry size {size}")
        return h, view, at, seg

    def get(self, index: int) -> Entry:
        """The entry at `index`; its body is a zero-copy view into the
        segment (valid while the entry exists; committed entries never
        change).  The body CRC is verified when present."""
        h, view, at, seg = self._header(index)
        body = view[at + HEADER_SIZE:at + h.size]
        if h.has_crc and crc32(body) != h.body_crc:
            raise CorruptStoreError(seg.path, at, f"entry {index}: bodyCrc mismatch")
        return Entry(h.magic, h.index, h.term, h.pos, body, h.chain_crc, h.body_crc, h.channel)

    def _bisect_last(self, lo: int, hi: int, pred) -> int:
        """Largest i in [lo, hi] with pred(i), given pred(lo) and pred
        monotone (true then false)."""
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if pred(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def read_batch(self, first_index: int, max_bytes: int, max_count: int) -> EntryBatch:
        """Entries from first_index for replication: at most max_count, at
        most max_bytes of entry bytes (but at least one entry), never past
        end_index.  The bytes are copied and verified before they leave;
        asked again for the same range (the next follower), the same batch
        is handed out without copying or verifying again."""
        self._check_index(first_index)
        key = (first_index, max_bytes, max_count, self._end)
        cached = self._last_batch
        if cached is not None and cached[0] == key:
            return cached[1]
        if self._fresh is not None:
            batch = self._fresh_batch(first_index, max_bytes, max_count)
            if batch is not None:
                self._last_batch = (key, batch)
                return batch
        pieces, i = self._pieces(first_index, max_bytes, max_count)
        raw = b"".join(pieces)
        count = i - first_index
        self._verify_batch(raw, first_index, count)
        batch = EntryBatch(first_index, count, self._term_runs(first_index, i - 1), raw)
        self._last_batch = (key, batch)
        return batch

    def read_views(self, first_index: int, max_bytes: int, max_count: int) -> tuple[list[memoryview], int]:
        """read_batch's entries as views of the segment maps, one per
        segment (no copy), and their count -- NOT checked: for a reader of
        entries this store wrote itself, sealed as leader or verified as
        follower (the metadata applier), never for replication."""
        self._check_index(first_index)
        if self._fresh is not None:
            batch = self._fresh_batch(first_index, max_bytes, max_count)
            if batch is not None:
                return [batch.raw], batch.count
        pieces, i = self._pieces(first_index, max_bytes, max_count)
        return pieces, i - first_index

    def _pieces(self, first_index: int, max_bytes: int, max_count: int) -> tuple[list, int]:
        """The entries read_batch takes from first_index, as one view per
        segment, and the index after the last."""
        last = min(self._end, first_index + max(1, max_count) - 1)
        pieces, taken, i = [], 0, first_index
        while i <= last:
            pos = self._unit(i)[1]
            seg = self.data.find(pos)
            j = self._bisect_last(i, last, lambda m: self._unit(m)[1] < seg.end)

            def fits(m, pos=pos, budget=max_bytes - taken):
                u = self._unit(m)
                return u[1] + u[2] - pos <= budget

            if not fits(i):
                if taken:
                    break
                k = i
            else:
                k = self._bisect_last(i, j, fits)
            u = self._unit(k)
            pieces.append(seg.view()[pos - seg.start:u[1] + u[2] - seg.start])
            taken += u[1] + u[2] - pos
            i = k + 1
            if k < j:
                break
        return pieces, i

    def _fresh_batch(self, first_index: int, max_bytes: int, max_count: int) -> EntryBatch | None:
        """read_batch from the last leader append's own bytes (_fresh), when
        first_index is one of its entries: as many of them as the limits
        allow, up to the end of the segment the first lies in (a filler is
        never shipped), as a view of those bytes -- no copy, no read back,
        no CRC check of what this process has just sealed.  None otherwise."""
        first, positions, lens, start, out, term = self._fresh
        k0 = first_index - first
        if not 0 <= k0 < len(positions):
            return None
        p0 = positions[k0]
        last = min(len(positions), k0 + max(1, max_count)) - 1
        # the last entry before the segment's end, and the last starting within the byte budget
        last = min(last, bisect.bisect_left(positions, self._seg_end(p0), k0, last + 1) - 1,
                   bisect.bisect_left(positions, p0 + max_bytes, k0, last + 1) - 1)
        if last > k0 and positions[last] + HEADER_SIZE + lens[last] > p0 + max_bytes:
            last -= 1  # (entries lie back to back: the one before ends where this one starts)
        end = positions[last] + HEADER_SIZE + lens[last]
        return EntryBatch(first_index, last - k0 + 1, ((first_index, term),),
                          memoryview(out)[p0 - start:end - start])

    def _verify_batch(self, raw: bytes, first: int, count: int) -> None:
        pos = self._unit(first)[1]
        chain_known = first - 1 >= max(self._begin, 0) or self._boundary(first - 1) is not None
        st = new_state(next_index=first, pos=pos, seg_end=self._seg_end(pos), seg_size=self.data.seg_size,
                       prev_chain=self.chain_crc_at(first - 1) if chain_known else 0, chain_known=chain_known)
        off = 0
        while True:
            r = scan_entries(memoryview(raw)[off:], F_BATCH | F_CHECK_CRC, count, st, None)
            off += st[S_CONSUMED]
            if r != R_ROLL:
                break
            st[S_POS], st[S_SEG_END] = st[S_SEG_END], st[S_SEG_END] + self.data.seg_size
        if r >= PROBLEM or off != len(raw):
            seg = self.data.find(st[S_POS])
            where = seg.path if seg else self.data.directory
            raise CorruptStoreError(where, st[S_POS] - (seg.start if seg else 0),
                                    f"entry {st[S_NEXT_INDEX]}: " + reason_text(r, st[S_DETAIL], st[S_EXPECTED]))

    def _term_runs(self, lo: int, hi: int) -> tuple[tuple[int, int], ...]:
        runs = []
        while lo <= hi:
            term = self._unit(lo)[4]
            runs.append((lo, term))
            lo = self._bisect_last(lo, hi, lambda m, t=term: self._unit(m)[4] == t) + 1
        return tuple(runs)

    def first_index_of_term(self, term: int) -> int:
        """The first index whose entry has `term`, or -1 when no entry has it
        (binary search: terms never decrease along the log)."""
        if self._end < max(self._begin, 0):
            return -1
        lo, hi = max(self._begin, 0), self._end
        while lo < hi:
            mid = (lo + hi) // 2
            if self._unit(mid)[4] >= term:
                hi = mid
            else:
                lo = mid + 1
        return lo if self._unit(lo)[4] == term else -1
