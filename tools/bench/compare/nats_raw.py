# Owns the raw NATS load generators of the comparison: one plain asyncio TCP
# connection speaking the NATS text protocol, pipelining JetStream publishes
# (`PUB subject _INBOX.lmq.N 1024` + a SUB on the inbox for the PubAcks) and
# pulling a backlog (`$JS.API.CONSUMER.MSG.NEXT` with batch 256).  It is the
# NATS counterpart of tools/bench/broker.py's raw pipelined SEND_MESSAGE_V2:
# no client library, no object per message beyond the PUB header bytes and
# no future per message, so the load generator is cheap next to the servers.
# A new connection per phase: a phase stopped by its time cap may leave acks
# in flight, and they must not count in the next one.
import asyncio
import json
import time

from tools.bench.compare.common import BODY, latency_result, rate

INBOX = b"_INBOX.lmq."
_CONNECT = (b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true,'
            b'"protocol":1,"name":"lmq-bench-raw"}\r\n')


class ProtocolError(Exception):
    pass


class RawNats:
    """Use `async with await RawNats.connect(port) as c:`.  The parser keeps
    counters instead of building messages: `msgs` (MSG frames), `errors`
    (MSG payloads carrying a JetStream API error, when acks are expected),
    `statuses` (HMSG frames: 404/408/503 status replies), `pongs`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.buf = bytearray()
        self.msgs = self.errors = self.statuses = self.pongs = 0
        self.check_errors = True  # PubAck payloads: look for {"error": ...}
        self.last_status = b""

    @classmethod
    async def connect(cls, port: int, subscribe: bytes = INBOX + b"*") -> "RawNats":
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        c = cls(reader, writer)
        info = await reader.readline()
        if not info.startswith(b"INFO "):
            writer.close()
            raise ProtocolError(f"unexpected greeting {info[:80]!r}")
        # The PING's PONG proves CONNECT and SUB were processed before any PUB.
        writer.write(_CONNECT + b"SUB " + subscribe + b" 1\r\nPING\r\n")
        while c.pongs == 0:
            await c.fill()
        return c

    async def __aenter__(self) -> "RawNats":
        return self

    async def __aexit__(self, *exc) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass

    async def fill(self) -> None:
        """Read what the server sent and parse every complete frame."""
        data = await self.reader.read(1 << 17)
        if not data:
            raise ConnectionError("NATS server closed the connection")
        self.buf += data
        self._parse()

    def _parse(self) -> None:
        buf, pos, end = self.buf, 0, len(self.buf)
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            op = buf[pos:pos + 4]
            if op == b"MSG ":
                size = int(buf[buf.rfind(b" ", pos, eol) + 1:eol])
                stop = eol + 2 + size
                if stop + 2 > end:
                    break  # payload not all here yet
                if self.check_errors and buf.find(b'"error"', eol + 2, stop) >= 0:
                    self.errors += 1
                else:
                    self.msgs += 1
                pos = stop + 2
            elif op == b"HMSG":
                total = int(buf[buf.rfind(b" ", pos, eol) + 1:eol])
                stop = eol + 2 + total
                if stop + 2 > end:
                    break
                self.statuses += 1
                self.last_status = bytes(buf[eol + 2:min(stop, eol + 40)])
                pos = stop + 2
            elif op == b"PING":
                self.writer.write(b"PONG\r\n")
                pos = eol + 2
            elif op == b"PONG":
                self.pongs += 1
                pos = eol + 2
            elif op == b"-ERR":
                raise ProtocolError(bytes(buf[pos:eol]).decode("utf-8", "replace"))
            else:  # +OK, INFO (cluster topology updates)
                pos = eol + 2
        del buf[:pos]

    # --- publishing ---------------------------------------------------------------

    def _pubs(self, subject: bytes, first: int, n: int, body: bytes = BODY) -> bytes:
        tail = b" %d\r\n" % len(body) + body + b"\r\n"
        head = b"PUB " + subject + b" " + INBOX
        return b"".join(head + b"%d" % i + tail for i in range(first, first + n))

    async def publish_one_at_a_time(self, subject: bytes, count: int, cap: float) -> dict:
        lat: list[float] = []
        try:
            async with asyncio.timeout(cap):
                for i in range(count):
                    replies, failed = self.msgs + self.errors + self.statuses, self.errors + self.statuses
                    t0 = time.perf_counter()
                    self.writer.write(self._pubs(subject, i, 1))
                    while self.msgs + self.errors + self.statuses == replies:
                        await self.fill()
                    if self.errors + self.statuses == failed:
                        lat.append(time.perf_counter() - t0)
        except TimeoutError:
            pass
        return latency_result(lat, {"errors": self.errors + self.statuses})

    async def publish_windowed(self, subject: bytes, count: int, in_flight: int, cap: float,
                               burst: int = 1) -> dict:
        """Keep `in_flight` messages outstanding, written `burst` at a time
        (one write per burst); a burst is done when `burst` more replies are
        in.  burst=1 is a plain window."""
        bursts = max(1, in_flight // burst)
        sent = 0

        def top_up(done: int) -> None:
            nonlocal sent
            outstanding = -(-sent // burst) - done // burst  # bursts written, not yet answered
            n = min((bursts - outstanding) * burst, count - sent)
            if n > 0:
                self.writer.write(self._pubs(subject, sent, n))
                sent += n

        t0 = time.perf_counter()
        top_up(0)
        try:
            async with asyncio.timeout(cap):
                while (done := self.msgs + self.errors + self.statuses) < count:
                    await self.fill()
                    top_up(self.msgs + self.errors + self.statuses)
                    await self.writer.drain()
        except TimeoutError:
            pass
        elapsed = time.perf_counter() - t0
        return {"count": self.msgs, "errors": self.errors + self.statuses, "seconds": round(elapsed, 3),
                "mps": rate(self.msgs, elapsed)}

    # --- pulling ----------------------------------------------------------------------

    async def pull_all(self, stream: str, consumer: str, expected: int, cap: float, batch: int = 256,
                       outstanding: int = 2) -> dict:
        """Fetch batches from a pull consumer until `expected` messages came,
        keeping `outstanding` pull requests open so the server never waits
        for the next one."""
        self.check_errors = False  # these payloads are the messages themselves
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}".encode()
        req = json.dumps({"batch": batch, "expires": int(5e9)}).encode()
        frame = b"PUB " + subject + b" " + INBOX + b"pull " + b"%d\r\n" % len(req) + req + b"\r\n"
        requested = 0
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(cap):
                while self.msgs < expected:
                    # open requests: written, minus those answered by a full batch or a status reply
                    # (expired, no messages); never more than the rest of the backlog needs
                    open_requests = requested - self.msgs // batch - self.statuses
                    want = min(outstanding, -(-(expected - self.msgs) // batch)) - open_requests
                    if want > 0:
                        self.writer.write(frame * want)
                        requested += want
                    await self.fill()
        except TimeoutError:
            pass
        elapsed = time.perf_counter() - t0
        return {"count": self.msgs, "expected": expected, "seconds": round(elapsed, 3),
                "mps": rate(self.msgs, elapsed)}
