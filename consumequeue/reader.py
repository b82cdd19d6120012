# Owns the broker's read path over consume queues and the commitlog:
#   read_messages  PULL_MESSAGE (DefaultMessageStore.getMessage): consume queue
#                  units read in one pread, filtered by tag hash, then the
#                  records sliced out of the mapped commitlog and joined into
#                  ONE bytes object -- the pull response body, each record
#                  exactly TOTALSIZE bytes and unchanged;
#   query_by_key   QUERY_MESSAGE: index lookup + the records it points at;
#   message_at     VIEW_MESSAGE_BY_ID: the one record starting at a position.
#
# Visibility: consume queues only hold committed units, and every read is
# also bounded by a committed position -- the dispatch position for pulls
# (dispatched implies committed), the store's committed entry end for
# message_at -- so an uncommitted tail a new leader may truncate is never
# returned, whatever a damaged queue says.
#
# A store migrated from master-slave reads through a LayeredSource: below
# the divided offset the records are plain (no DLedger entry around them),
# and the log begins at the old commitlog's first segment while it exists.
#
# Status semantics follow RocketMQ's GetMessageStatus (spec §8.5 maps them to
# pull response codes; pull_response_code() here does the mapping), including
# nextBeginOffset corrections: a pull below the queue's min offset moves to
# it, one at max offset stays, one beyond it moves to max (or 0 when the
# queue still starts at 0), a pull over units whose messages retention
# deleted skips the rest of that commitlog segment.  A slave broker without
# offsetCheckInSlave passes correct_offsets=False: its corrections keep the
# request offset, as RocketMQ's nextOffsetCorrection does.
import enum
import struct
from collections.abc import Callable

import attrs

from commitlog.entry import HEADER, HEADER_SIZE, MAGIC_NORMAL
from consumequeue.cq import BLANK_SIZE, CQ_UNIT_SIZE
from consumequeue.errors import InconsistentStateError, MessageNotFoundError
from consumequeue.record import MAGIC_V1, MAGIC_V2, POS_PHYSICALOFFSET, decode
from native.dispatch import MODE_DLEDGER, UNIT

DEFAULT_MAX_MSGS = 32  # the push consumer's pullBatchSize
DEFAULT_MAX_BYTES = 256 << 10  # maxTransferBytesOnMessageInMemory
MAX_FILTER_UNITS = 16000 // CQ_UNIT_SIZE  # getMessage scans at least 16000 bytes of units
MAX_QUERY_NUM = 64  # maxMsgsNumBatch
_HEAD = struct.Struct(">ii")  # TOTALSIZE, MAGIC


class GetMessageStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


# Response codes (spec §8.6) and the pull mapping (spec §8.5).
SUCCESS, PULL_NOT_FOUND, PULL_RETRY_IMMEDIATELY, PULL_OFFSET_MOVED = 0, 19, 20, 21


def pull_response_code(status: GetMessageStatus, request_offset: int) -> int:
    S = GetMessageStatus
    if status is S.FOUND:
        return SUCCESS
    if status in (S.NO_MATCHED_MESSAGE, S.MESSAGE_WAS_REMOVING):
        return PULL_RETRY_IMMEDIATELY
    if status in (S.NO_MESSAGE_IN_QUEUE, S.NO_MATCHED_LOGIC_QUEUE):
        return PULL_OFFSET_MOVED if request_offset != 0 else PULL_NOT_FOUND
    if status in (S.OFFSET_FOUND_NULL, S.OFFSET_OVERFLOW_ONE):
        return PULL_NOT_FOUND  # with SUSPEND the broker holds the request
    return PULL_OFFSET_MOVED  # OFFSET_OVERFLOW_BADLY, OFFSET_TOO_SMALL


@attrs.frozen(kw_only=True)
class PullResult:
    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    records: bytes = b""  # the stored records, concatenated
    queue_offsets: list[int] = attrs.Factory(list)  # one per record
    phy_offsets: list[int] = attrs.Factory(list)

    @property
    def message_count(self) -> int:
        return len(self.phy_offsets)


@attrs.frozen(kw_only=True)
class QueryMessageResult:
    records: bytes
    phy_offsets: list[int]
    index_last_update_timestamp: int
    index_last_update_phy_offset: int


def _s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def _parts(target):
    """(engine, store or None) of a ConsumeQueueService or a DispatchEngine."""
    engine = getattr(target, "engine", target)
    return engine, getattr(target, "store", None)


def _begin(engine, store) -> int:
    legacy_present = getattr(engine.source, "legacy_present", None)
    if legacy_present is not None and legacy_present():
        # A store migrated from master-slave: the old commitlog's first
        # segment comes first (consumequeue.source.LayeredSource).
        return engine.source.begin_pos
    if store is not None:
        from consumequeue.service import begin_position
        return begin_position(store)
    engine.source.refresh()
    return engine.source.begin_pos or 0


class _LogWindow:
    """Slices of the mapped commitlog below a committed bound; one view per
    run of records in the same segment."""

    def __init__(self, source, begin: int, bound: int):
        self.source, self.begin, self.bound = source, begin, bound
        self.views: list[memoryview] = []
        self.cur: memoryview | None = None
        self.start = self.end = 0

    def slice(self, phy: int, size: int) -> memoryview | None:
        """Bytes [phy, phy + size), or None when retention deleted them.
        The caller has checked phy + size <= bound."""
        if phy < self.begin:
            return None
        if self.cur is None or phy < self.start or phy + size > self.end:
            try:
                view = self.source.view(phy, self.bound)
            except KeyError:
                return None
            self.views.append(view)
            self.cur, self.start, self.end = view, phy, phy + len(view)
            if phy + size > self.end:
                raise InconsistentStateError(f"record at commitlog position {phy} of {size} bytes runs past "
                                             f"its segment's end {self.end}")
        return self.cur[phy - self.start:phy - self.start + size]

    def record(self, phy: int, size: int) -> memoryview | None:
        piece = self.slice(phy, size)
        if piece is not None and (len(piece) < 8 or _HEAD.unpack_from(piece)[0] != size):
            piece.release()
            raise InconsistentStateError(f"a consume queue unit says {size} bytes at commitlog position {phy}, "
                                         f"the record there does not")
        return piece

    def close(self) -> None:
        for v in self.views:
            v.release()
        self.views.clear()
        self.cur = None


def _join(pieces: list[memoryview]) -> bytes:
    out = b"".join(pieces)
    for p in pieces:
        p.release()
    return out


def read_messages(target, topic: str, queue_id: int, offset: int, max_msgs: int = DEFAULT_MAX_MSGS,
                  max_bytes: int = DEFAULT_MAX_BYTES, tag_codes: set[int] | None = None, *,
                  correct_offsets: bool = True, committed_pos: int | None = None,
                  accept: Callable[[memoryview], bool] | None = None) -> PullResult:
    """GetMessage for one queue from logical `offset`: at most `max_msgs`
    records and, after the first, at most `max_bytes` in total; only units
    whose tagsCode (as a Java int) is in `tag_codes` (None: every unit), and
    with `accept`, only records it accepts (isMatchedByCommitLog: the
    broker's SQL92 property filter, given the stored record's bytes).
    `committed_pos` may only lower the bound (the dispatch position)."""
    engine, store = _parts(target)
    S = GetMessageStatus

    def fix(new: int) -> int:
        return new if correct_offsets else offset

    cq = engine.cqs.get(topic, queue_id)
    if cq is None:
        return PullResult(status=S.NO_MATCHED_LOGIC_QUEUE, next_begin_offset=fix(0), min_offset=0, max_offset=0)
    lo, hi = cq.min_offset, cq.max_offset
    if hi == 0:
        return PullResult(status=S.NO_MESSAGE_IN_QUEUE, next_begin_offset=fix(0), min_offset=lo, max_offset=hi)
    if offset < lo:
        return PullResult(status=S.OFFSET_TOO_SMALL, next_begin_offset=fix(lo), min_offset=lo, max_offset=hi)
    if offset == hi:
        return PullResult(status=S.OFFSET_OVERFLOW_ONE, next_begin_offset=fix(offset), min_offset=lo, max_offset=hi)
    if offset > hi:
        return PullResult(status=S.OFFSET_OVERFLOW_BADLY, next_begin_offset=fix(lo if lo == 0 else hi), min_offset=lo,
                          max_offset=hi)

    # getIndexBuffer: the units from `offset` to the end of its file.
    per_file = cq.file_size // CQ_UNIT_SIZE
    file_first = offset - offset % per_file
    raw = b""
    if file_first * CQ_UNIT_SIZE in cq.starts:
        raw = cq.read_raw(offset, min(max(MAX_FILTER_UNITS, max_msgs), file_first + per_file - offset, hi - offset))
    if not raw:
        return PullResult(status=S.OFFSET_FOUND_NULL, next_begin_offset=fix(file_first + per_file), min_offset=lo,
                          max_offset=hi)

    bound = engine.pos if committed_pos is None else min(committed_pos, engine.pos)
    codes = None if tag_codes is None else {_s32(c) for c in tag_codes}
    window = _LogWindow(engine.source, _begin(engine, store), bound)
    seg_size = engine.source.segment_size
    status = S.NO_MATCHED_MESSAGE
    pieces: list[memoryview] = []
    q_offsets: list[int] = []
    phys: list[int] = []
    total = 0
    skip_below = -1  # nextPhyFileStartOffset: the rest of a deleted segment
    i = -1
    try:
        for i, (phy, size, tags) in enumerate(UNIT.iter_unpack(raw)):
            if phy < skip_below:
                continue
            if pieces and (len(pieces) >= max_msgs or total + size > max_bytes):
                break
            if size == BLANK_SIZE and phy == 0 and tags == 0:
                continue  # a filler unit (fillPreBlank / an offset hole): nothing to send
            if phy + size > bound:
                break  # not committed (a damaged queue): never sent
            if codes is not None and _s32(tags) not in codes:
                if not pieces:
                    status = S.NO_MATCHED_MESSAGE
                continue
            piece = window.record(phy, size)
            if piece is None:
                if not pieces:
                    status = S.MESSAGE_WAS_REMOVING
                skip_below = phy - phy % seg_size + seg_size if seg_size else phy + 1
                continue
            if accept is not None and not accept(piece):
                piece.release()
                if not pieces:
                    status = S.NO_MATCHED_MESSAGE
                continue
            pieces.append(piece)
            q_offsets.append(offset + i)
            phys.append(phy)
            total += size
            status = S.FOUND
            skip_below = -1
        else:
            i += 1
        records = _join(pieces)
    finally:
        for p in pieces:
            p.release()
        window.close()
    if i == 0 and status is S.NO_MATCHED_MESSAGE:
        # The very first unit is beyond the committed bound: nothing moved.
        return PullResult(status=S.OFFSET_FOUND_NULL, next_begin_offset=offset, min_offset=lo, max_offset=hi)
    return PullResult(status=status, next_begin_offset=offset + i, min_offset=lo, max_offset=hi, records=records,
                      queue_offsets=q_offsets, phy_offsets=phys)


def _committed_end(engine, store) -> int:
    if store is None:
        return engine.pos
    from consumequeue.service import positions
    return positions(store).committed_pos


def _check_record_start(source, window: _LogWindow, phy: int) -> int:
    """TOTALSIZE of the record starting at `phy`, or MessageNotFoundError."""
    if phy + 8 > window.bound:
        raise MessageNotFoundError(phy, f"beyond the committed position {window.bound}")
    head = window.slice(phy, 8)
    if head is None:
        raise MessageNotFoundError(phy, "below the first commitlog position (deleted by retention)")
    size, magic = _HEAD.unpack_from(head)
    head.release()
    if magic not in (MAGIC_V1, MAGIC_V2) or size < 8:
        raise MessageNotFoundError(phy, "not the start of a message record")
    mode_at = getattr(source, "mode_at", None)
    if (source.mode if mode_at is None else mode_at(phy)) == MODE_DLEDGER:
        # The record is an entry body: a NORMAL entry at phy - 48 holding exactly it.
        if phy - HEADER_SIZE < window.begin:
            raise MessageNotFoundError(phy, "not the start of a message record")
        try:
            start = source.segment_start(phy - HEADER_SIZE)
        except KeyError:
            start = None
        if start != source.segment_start(phy):
            raise MessageNotFoundError(phy, "not the start of a message record")
        hdr = HEADER.unpack(source.read(phy - HEADER_SIZE, HEADER_SIZE))
        magic_e, esize, pos, body_size = hdr[0], hdr[1], hdr[4], hdr[8]
        if magic_e != MAGIC_NORMAL or pos != phy - HEADER_SIZE or body_size != size or esize != size + HEADER_SIZE:
            raise MessageNotFoundError(phy, "not the start of a message record")
    if phy + size > window.bound:
        raise MessageNotFoundError(phy, f"the record ends beyond the committed position {window.bound}")
    return size


def _read_record(engine, window: _LogWindow, phy: int) -> bytes:
    size = _check_record_start(engine.source, window, phy)
    piece = window.slice(phy, size)
    try:
        if int.from_bytes(piece[POS_PHYSICALOFFSET:POS_PHYSICALOFFSET + 8], "big", signed=True) != phy:
            raise MessageNotFoundError(phy, "the record there names another PHYSICALOFFSET")
        return bytes(piece)
    finally:
        piece.release()


def message_at(target, phy: int, *, committed_pos: int | None = None) -> bytes:
    """VIEW_MESSAGE_BY_ID: the committed record starting at commitlog
    position `phy` (the offset inside an offsetMsgId).  MessageNotFoundError
    when `phy` is deleted, beyond the committed position, or not where a
    record starts (in a DLedger log: the body of a NORMAL entry at phy - 48)."""
    engine, store = _parts(target)
    bound = _committed_end(engine, store)
    if committed_pos is not None:
        bound = min(bound, committed_pos)
    window = _LogWindow(engine.source, _begin(engine, store), bound)
    try:
        return _read_record(engine, window, phy)
    finally:
        window.close()


def query_by_key(target, topic: str, key: str, max_num: int = MAX_QUERY_NUM, begin_timestamp: int = 0,
                 end_timestamp: int = (1 << 63) - 1, *, exact: bool = True) -> QueryMessageResult:
    """QUERY_MESSAGE: the records the index finds for `key` in `topic`
    stored within [begin, end] ms, newest index file first.  The index
    keeps hashes only; with `exact` (default) records whose topic or keys
    (KEYS tokens, UNIQ_KEY) differ are dropped here instead of by the
    client.  Records deleted by retention or beyond the committed position
    are left out."""
    engine, store = _parts(target)
    res = engine.query_by_key(topic, key, max_num, begin_timestamp, end_timestamp)
    window = _LogWindow(engine.source, _begin(engine, store), _committed_end(engine, store))
    records: list[bytes] = []
    phys: list[int] = []
    try:
        for phy in res.phy_offsets:
            try:
                rec = _read_record(engine, window, phy)
            except MessageNotFoundError:
                continue
            if exact:
                msg = decode(rec)
                if msg.topic != topic or (key not in msg.keys and key != msg.uniq_key):
                    continue
            records.append(rec)
            phys.append(phy)
    finally:
        window.close()
    return QueryMessageResult(records=b"".join(records), phy_offsets=phys,
                              index_last_update_timestamp=res.index_last_update_timestamp,
                              index_last_update_phy_offset=res.index_last_update_phy_offset)
