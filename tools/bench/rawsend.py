# Owns the cheap raw load generator of ledgermq's send path: pipelined
# SEND_MESSAGE_V2 (or SEND_BATCH_MESSAGE) frames on one TCP connection, each
# kind of frame encoded once with a fixed-width opaque that is patched per
# request, answers read in bulk and matched by opaque with two regular
# expressions -- a few microseconds of Python per message, where the
# remoting client costs ~70.  A benchmark's generator shares the machine
# with the brokers: when it is expensive it, not the broker, sets the rate.
import re
import time

import trio

from broker.remoting.codec import encode_command
from broker.remoting.command import RemotingCommand

_OPAQUE_BASE = 1_000_000_000  # 10 digits up to 2**31 - 1: a fixed width to patch in place
_CODE = re.compile(rb'"code":(-?\d+)')
_OPAQUE = re.compile(rb'"opaque":(\d+)')


class FrameTemplate:
    """One request encoded once; frame(opaque) patches its opaque."""

    def __init__(self, cmd: RemotingCommand) -> None:
        frame = encode_command(cmd.as_request(_OPAQUE_BASE))
        marker = b'"opaque":%d' % _OPAQUE_BASE
        at = frame.index(marker) + len(b'"opaque":')
        self._head, self._tail = frame[:at], frame[at + 10:]

    def frame(self, opaque: int) -> bytes:
        return b"".join((self._head, b"%010d" % opaque, self._tail))


async def run_window(address: str, templates: list[FrameTemplate], *, count: int, window: int,
                     seconds: float, per_request: int = 1) -> dict:
    """Keep `window` requests in flight on one connection until `count`
    messages (requests x per_request) are answered or `seconds` pass.
    Returns count (messages answered SUCCESS), errors (by response code),
    seconds, and the latencies (s) of every answered request."""
    host, _, port = address.rpartition(":")
    stream = await trio.open_tcp_stream(host.strip("[]"), int(port))
    sent_at: dict[int, float] = {}
    latencies: list[float] = []
    errors: dict[int, int] = {}
    state = {"next": _OPAQUE_BASE, "ok": 0, "requested": 0}
    requests = -(-count // per_request)
    done = trio.Event()
    wake = trio.Event()

    def frames(n: int) -> bytes:
        out = []
        now = time.perf_counter()
        for _ in range(n):
            opaque = state["next"]
            state["next"] += 1
            sent_at[opaque] = now
            out.append(templates[opaque % len(templates)].frame(opaque))
        state["requested"] += n
        return b"".join(out)

    async def writer() -> None:
        nonlocal wake
        while not done.is_set():
            room = min(window - len(sent_at), requests - state["requested"])
            if room > 0:
                await stream.send_all(frames(room))
            else:
                await wake.wait()
                wake = trio.Event()

    async def reader() -> None:
        buf = bytearray()
        while state["ok"] + sum(errors.values()) < requests:
            data = await stream.receive_some(1 << 18)
            if not data:
                raise ConnectionError("the broker closed the connection")
            buf += data
            off, now = 0, time.perf_counter()
            while len(buf) - off >= 8:
                length = int.from_bytes(buf[off:off + 4], "big")
                if len(buf) - off < 4 + length:
                    break
                header_len = int.from_bytes(buf[off + 5:off + 8], "big")
                header = bytes(buf[off + 8:off + 8 + header_len])
                opaque = int(_OPAQUE.search(header).group(1))
                code = int(_CODE.search(header).group(1))
                started = sent_at.pop(opaque, None)
                if started is not None:
                    latencies.append(now - started)
                    if code == 0:
                        state["ok"] += 1
                    else:
                        errors[code] = errors.get(code, 0) + 1
                off += 4 + length
            del buf[:off]
            wake.set()
        done.set()
        wake.set()

    t0 = time.perf_counter()
    try:
        with trio.move_on_after(seconds):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer)
                nursery.start_soon(reader)
    finally:
        await trio.aclose_forcefully(stream)
    elapsed = time.perf_counter() - t0
    return {"count": state["ok"] * per_request, "errors": errors, "seconds": elapsed, "latencies": latencies}
