# Owns what a connection's reads leave buffered: its decoder (codec.
# CommandDecoder) and the bytes of unfinished frames it holds, which stay
#   * within the connection's own cap (max_unfinished): a read never takes
#     more than room() allows, and an unfinished frame that fills the cap
#     ends the connection (the caller's to do when room() <= 0);
#   * counted in the server's FrameBudget (streams.py): what the decoder
#     will hold is reported before the bytes read are buffered (report; the
#     budget may shed this connection or older ones), and what it still
#     holds once it has given out every whole frame (settle);
#   * no longer in memory than they must: a decoder that passed whole
#     frames is replaced by one holding only the unfinished tail, so the
#     buffer under those frames is freed now rather than at the peer's next
#     read (which an idle or hostile peer need never send); a shed
#     connection's decoder is dropped at once (drop), a closed one's too
#     (close).
# The framing's rules are codec.py's; whom to shed is FrameBudget's.
from broker.remoting.codec import CommandDecoder
from broker.remoting.streams import FrameBudget

RECV_CHUNK = 252 * 1024  # (under streams.MMAP_THRESHOLD: read buffers come from the heap, cheaply)
# A decoder that passed more than this since its last read is replaced by
# one holding only the unfinished tail (its old buffer is freed at once).
RELEASE_AFTER = 4096


class FrameIntake:
    """One connection's decoder and the unfinished frames it holds.  The
    budget knows those bytes by `holder` (the connection), and sheds it
    through holder.shed(reason), which calls drop()."""

    def __init__(self, holder: object, max_frame_size: int, raw_sends: bool = False,
                 max_unfinished: int | None = None, budget: FrameBudget | None = None) -> None:
        self.decoder: CommandDecoder | None = CommandDecoder(max_frame_size, raw_sends=raw_sends)
        self._holder = holder
        self._max_frame_size = max_frame_size
        self._raw_sends = raw_sends
        self._max_unfinished = max_unfinished
        self._budget = budget
        self._fed = 0  # bytes in the decoder's buffer: what it kept plus what it was fed since

    def settle(self, data: bytes, buffered: int, decoded: bool) -> None:
        """The decoder has given out every whole frame and holds `buffered`
        bytes of an unfinished one (`data`: the last read; decoded: a frame
        ended since the read before): free the buffer under the frames it
        passed, report what it holds."""
        if self._fed - buffered > RELEASE_AFTER:
            self._release_passed(data, buffered)
        if self._budget is not None:  # (between frames: nothing; what a small read left is slack)
            self._budget.update(self._holder, self._fed if buffered else 0, decoded)

    def room(self, buffered: int) -> int:
        """How many bytes the next read may take, with `buffered` bytes of an
        unfinished frame held: RECV_CHUNK, or what is left of max_unfinished
        (0 or less: the unfinished frame fills it)."""
        if self._max_unfinished is None:
            return RECV_CHUNK
        return min(RECV_CHUNK, self._max_unfinished - buffered)

    def report(self, data: bytes, buffered: int) -> bool:
        """Before `data` is buffered after the `buffered` bytes held: tell
        the budget, which may shed the holder (or older ones).  False when
        there is no budget to tell (or nothing was read)."""
        if self._budget is None or not data:
            return False
        self._budget.update(self._holder, buffered + len(data), buffered == 0)
        return True

    def receive(self, data: bytes, buffered: int) -> None:
        """Buffer `data` after the `buffered` bytes held."""
        self.decoder.receive_data(data)
        self._fed = buffered + len(data)

    def drop(self) -> None:
        """Forget what the decoder holds (the budget shed its connection):
        the read loop, cancelled, never looks at it again."""
        self.decoder = CommandDecoder(self._max_frame_size)
        self._fed = 0

    def close(self) -> None:
        """The connection is over: nothing held any more, and the decoder's
        buffer goes now, not with the last reference to the connection."""
        if self._budget is not None:
            self._budget.update(self._holder, 0, False)
        self.decoder = None

    def _release_passed(self, data: bytes, buffered: int) -> None:
        """Replace the decoder with one holding only the unfinished tail:
        the last `buffered` bytes, all of them in `data` (the frame that was
        open before the read ended in it)."""
        decoder = CommandDecoder(self._max_frame_size, raw_sends=self._raw_sends)
        if buffered:
            decoder.receive_data(data[len(data) - buffered:])
        self.decoder = decoder
        self._fed = buffered
