# Owns MemLog, the in-memory RaftLog (logapi.py) used by the core's tests and
# the cluster simulation.  It stores real DLedger entries encoded by
# commitlog.entry, CRCs and all, back to back with pos = running byte offset
# (no segment blanks), so batches are byte-realistic, and it checks what the
# disk store checks on a follower append (index, pos, term order, chain CRC).
# Whatever was written survives a simulated restart (the shell persists a
# Ready before it sends its messages).
#
# Its boundary behaviour is the disk store's, the weakest RaftLog allowed:
# begin_index is -1 until something is written, term_at(-1) raises, and the
# entry just below begin_index is answerable only after reset_to() (or a
# retention that was asked to keep it), so the core is tested against it.
import bisect
import struct
from array import array
from typing import Sequence

from commitlog.entry import (
    HEADER,
    HEADER_SIZE,
    MAGIC_CONFIG_CHANGE,
    OFF_CHAIN_CRC,
    OFF_POS,
    EntryBatch,
    chain_crc,
    decode_entry,
    decode_header,
    verify_crc,
)
from commitlog.errors import AppendRejectedError, IndexBelowBeginError, IndexBeyondEndError
from native.hashing import crc32

_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")


class MemLog:
    sync_flush = False  # nothing to fdatasync in memory

    def __init__(self) -> None:
        self._data = bytearray()
        self._offsets = array("q", [0])     # entry i starts at _offsets[i - begin]; last = len(_data)
        self._runs: list[tuple[int, int]] = []   # (first index, term), ascending
        self._run_starts: list[int] = []
        self._begin = 0                      # index of slot 0
        self._fresh = True                   # nothing written yet: begin_index reads -1
        self._begin_pos = 0
        self._prev_term = -1                 # boundary entry begin - 1 (kept for chaining)
        self._prev_crc = 0
        self._boundary_known = False         # ...but answered only after reset_to
        self._committed = -1

    # --- reads (RaftLog) --------------------------------------------------

    @property
    def begin_index(self) -> int:
        return -1 if self._fresh else self._begin

    @property
    def end_index(self) -> int:
        return self._begin + len(self._offsets) - 2

    @property
    def end_term(self) -> int:
        return self._runs[-1][1] if self._runs else self._prev_term

    @property
    def committed_index(self) -> int:
        return self._committed

    @property
    def next_pos(self) -> int:
        return self._begin_pos + len(self._data)

    def _slot(self, index: int) -> int:
        if index < self._begin:
            raise IndexBelowBeginError(index, self._begin)
        if index > self.end_index:
            raise IndexBeyondEndError(index, self.end_index)
        return index - self._begin

    def term_at(self, index: int) -> int:
        if index == self._begin - 1 and self._boundary_known:
            return self._prev_term
        self._slot(index)
        return self._runs[bisect.bisect_right(self._run_starts, index) - 1][1]

    def chain_crc_at(self, index: int) -> int:
        if index == self._begin - 1 and self._boundary_known:
            return self._prev_crc
        return _U32.unpack_from(self._data, self._offsets[self._slot(index)] + OFF_CHAIN_CRC)[0]

    def first_index_of_term(self, term: int) -> int:
        for start, t in self._runs:
            if t == term:
                return start
        return -1

    def read_batch(self, first_index: int, max_bytes: int, max_count: int) -> EntryBatch:
        slot = self._slot(first_index)
        offsets = self._offsets
        last_slot = min(slot + max_count, len(offsets) - 1)       # exclusive
        start = offsets[slot]
        limit = bisect.bisect_right(offsets, start + max_bytes, slot + 1, last_slot + 1) - 1
        last_slot = max(limit, slot + 1)
        last_index = self._begin + last_slot - 1
        runs = self._runs
        i = bisect.bisect_right(self._run_starts, first_index) - 1
        term_runs = [(first_index, runs[i][1])]
        for start_index, term in runs[i + 1:]:
            if start_index > last_index:
                break
            term_runs.append((start_index, term))
        return EntryBatch(first_index, last_slot - slot, tuple(term_runs), bytes(self._data[start:offsets[last_slot]]))

    # --- writes (done by the shell from a Ready) --------------------------

    def _add_run(self, index: int, term: int) -> None:
        if not self._runs or self._runs[-1][1] != term:
            self._runs.append((index, term))
            self._run_starts.append(index)

    def _last_crc(self) -> int:
        end = self.end_index
        return self._prev_crc if end < self._begin else self.chain_crc_at(end)

    def append_stamped(self, bodies: Sequence[bytes], term: int, magic: int) -> tuple[list[tuple[int, int]], None]:
        return self.append_leader(bodies, term, magic), None  # no append hooks here

    def append_leader(self, bodies: Sequence[bytes], term: int, magic: int) -> list[tuple[int, int]]:
        if term < self.end_term:
            raise AppendRejectedError(f"term {term} below ledger end term {self.end_term}")
        index, pos, prev = self.end_index + 1, self.next_pos, self._last_crc()
        self._fresh = False
        out = []
        data, offsets = self._data, self._offsets
        self._add_run(index, term)
        for body in bodies:
            bcrc = crc32(body)
            prev = chain_crc(prev, bcrc, index, term)
            data += HEADER.pack(magic, HEADER_SIZE + len(body), index, term, pos, 0, prev, bcrc, len(body))
            data += body
            out.append((index, pos))
            pos += HEADER_SIZE + len(body)
            offsets.append(len(data))
            index += 1
        return out

    def append_follower(self, batch: EntryBatch) -> None:
        """Verbatim append after checking every header continues the log
        (the checks the disk store does, so the simulation catches a core
        that ships a wrong batch)."""
        if batch.first_index != self.end_index + 1:
            raise AppendRejectedError(f"batch starts at {batch.first_index}, log ends at {self.end_index}")
        self._fresh = False
        raw = batch.raw
        index, pos, prev, crc_mode = batch.first_index, self.next_pos, self._last_crc(), True
        last_term = self.end_term
        new_offsets = []
        off = 0
        for _ in range(batch.count):
            h = decode_header(raw, off)
            if h.index != index or h.pos != pos or h.term < last_term:
                raise AppendRejectedError(f"entry {h.index}@{h.pos} term {h.term} does not continue "
                                          f"{index - 1}@{pos} term {last_term}")
            if h.term != batch.term_at(index):
                raise AppendRejectedError(f"entry {index} term {h.term} disagrees with the term runs")
            if h.magic == MAGIC_CONFIG_CHANGE and batch.count > 1:
                raise AppendRejectedError(f"configuration entry {index} inside a larger batch (they travel alone)")
            reason, crc_mode = verify_crc(h, raw[off + HEADER_SIZE:off + h.size], prev, crc_mode)
            if reason:
                raise AppendRejectedError(f"entry {index}: {reason}")
            prev, last_term = h.chain_crc, h.term
            off += h.size
            pos += h.size
            index += 1
            new_offsets.append(off)
        if off != len(raw):
            raise AppendRejectedError(f"batch has {len(raw) - off} trailing bytes")
        base = len(self._data)
        self._data += raw
        self._offsets.extend(base + o for o in new_offsets)
        for start, term in batch.term_runs:
            self._add_run(start, term)

    def truncate_from(self, index: int) -> None:
        if index <= self._committed:
            raise AppendRejectedError(f"truncate at {index} would drop committed entries (<= {self._committed})")
        if index > self.end_index:
            return
        slot = self._slot(index)
        del self._data[self._offsets[slot]:]
        del self._offsets[slot + 1:]
        i = bisect.bisect_left(self._run_starts, index)
        del self._runs[i:]
        del self._run_starts[i:]

    def reset_to(self, begin_index: int, begin_pos: int, prev_term: int, prev_chain_crc: int) -> None:
        self._data = bytearray()
        self._offsets = array("q", [0])
        self._runs, self._run_starts = [], []
        self._begin, self._begin_pos, self._fresh = begin_index, begin_pos, False
        self._prev_term, self._prev_crc, self._boundary_known = prev_term, prev_chain_crc, True
        self._committed = max(self._committed, begin_index - 1)

    def set_committed(self, index: int) -> None:
        if index > self.end_index:
            raise AppendRejectedError(f"commit {index} beyond end {self.end_index}")
        self._committed = max(self._committed, index)

    # --- retention and inspection (tests) ---------------------------------

    def delete_before(self, index: int, *, keep_boundary: bool = False) -> None:
        """Retention: drop committed entries below `index`.  Like the disk
        store, the deleted entry index - 1 is then unknown, unless
        keep_boundary (a store that remembers its term and chainCrc)."""
        if index > self._committed + 1:
            raise ValueError(f"retention may only delete committed entries (committed {self._committed})")
        if index <= self._begin:
            return
        if index > self.end_index + 1:
            raise ValueError("retention cannot delete beyond the end")
        self._prev_term, self._prev_crc = self.term_at(index - 1), self.chain_crc_at(index - 1)
        self._boundary_known = keep_boundary
        slot = index - self._begin
        cut = self._offsets[slot]
        self._begin_pos += cut
        del self._data[:cut]
        self._offsets = array("q", (o - cut for o in self._offsets[slot:]))
        keep_from = bisect.bisect_right(self._run_starts, index) - 1
        runs = [(max(s, index), t) for s, t in self._runs[keep_from:]]
        self._runs, self._run_starts = runs, [s for s, _ in runs]
        self._begin = index

    def entry(self, index: int):
        return decode_entry(self._data, self._offsets[self._slot(index)])

    def pos_at(self, index: int) -> int:
        return _I64.unpack_from(self._data, self._offsets[self._slot(index)] + OFF_POS)[0]

    def body_at(self, index: int) -> bytes:
        return self.entry(index).body
