# Owns the receive budget of established peer connections: the bytes of
# DATA frames begun and not finished, over all connections, stay within
# TransportConfig.recv_budget_bytes, and each such frame must be finished
# within frame_read_timeout.  A frame is charged its announced length once
# its header is in and its payload is not; a reader whose frame does not
# fit waits for room before it reads on (TCP then pushes back on its
# sender), and the charge is given back once the frame is whole or its
# connection is gone.  After the handshake a frame may be as large as
# max_frame_size, and a member of a group without a secret may be a
# stranger too: this is what bounds what it holds.
import attrs
import trio

from commitlog.transport.errors import FrameError
from commitlog.transport.framing import NEED_DATA, FrameDecoder


@attrs.define(eq=False)
class RecvBudget:
    """Bytes of DATA frames begun and not finished, over all connections."""

    limit: int
    used: int = 0
    waits: int = 0   # times a reader waited for room
    _freed: trio.Event = attrs.Factory(trio.Event)

    async def take(self, n: int) -> None:
        while self.used + n > self.limit:
            self.waits += 1
            await self._freed.wait()
        self.used += n

    def give(self, n: int) -> None:
        self.used -= n
        freed, self._freed = self._freed, trio.Event()
        freed.set()

    async def finish_frame(self, stream: trio.SocketStream, decoder: FrameDecoder, chunk: int, timeout: float):
        """Read `chunk` bytes at a time until the decoder holds a whole
        frame (or the stream ended).  A frame whose payload is not all in
        takes its length out of the budget before more is read, and gives
        it back once it is whole or its connection is gone; it must be
        finished within `timeout` seconds (FrameError)."""
        taken = 0
        deadline = 0.0
        try:
            while (frame := decoder.next_frame()) is NEED_DATA:
                if not taken and (need := decoder.pending_length):
                    await self.take(need)
                    taken = need
                    deadline = trio.current_time() + timeout
                if not taken:  # between frames: a connection may idle
                    decoder.receive_data(await stream.receive_some(chunk))
                    continue
                with trio.move_on_at(deadline):
                    decoder.receive_data(await stream.receive_some(chunk))
                    continue
                raise FrameError(f"a frame of {taken} bytes not finished within {timeout} s")
            return frame
        finally:
            if taken:
                self.give(taken)
