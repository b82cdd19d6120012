# Shared by the remoting tests: an echo-style dispatcher, and a raw-socket
# peer that reads frames until the server closes the connection.
import trio

from broker.remoting.codec import CLOSED, NEED_DATA, CommandDecoder, encode_command
from broker.remoting.codes import ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RequestError
from broker.remoting.server import RequestDispatcher

ECHO = 1001
FAIL = 1002
SLOW = 1003
REFUSE = 1004
ONEWAY_SINK = 1005


class EchoService:
    """ECHO answers with the request's fields and body; FAIL raises; SLOW
    waits for `release`; REFUSE raises RequestError; ONEWAY_SINK records."""

    def __init__(self) -> None:
        self.release = trio.Event()
        self.slow_started = trio.Event()
        self.oneways: list[RemotingCommand] = []
        self.oneway_seen = trio.Event()
        self.connections = []
        self.dispatcher = RequestDispatcher()
        for code, fn in ((ECHO, self.echo), (FAIL, self.fail), (SLOW, self.slow),
                         (REFUSE, self.refuse), (ONEWAY_SINK, self.sink)):
            self.dispatcher.register(code, fn)

    async def echo(self, conn, cmd):
        if conn not in self.connections:
            self.connections.append(conn)
        return cmd.make_response(ResponseCode.SUCCESS, cmd.remark, ext_fields=cmd.ext_fields, body=cmd.body)

    async def fail(self, conn, cmd):
        raise ValueError("handler exploded")

    async def slow(self, conn, cmd):
        self.slow_started.set()
        await self.release.wait()
        return cmd.make_response(body=b"slow done")

    async def refuse(self, conn, cmd):
        raise RequestError(ResponseCode.NO_PERMISSION, "not for you")

    async def sink(self, conn, cmd):
        self.oneways.append(cmd)
        self.oneway_seen.set()
        return cmd.make_response(body=b"must not be sent for oneway requests")


async def read_until_eof(stream: trio.SocketStream, timeout: float = 5.0) -> list[RemotingCommand]:
    """Every command the peer sends until it closes (fails the test if it
    does not close within `timeout`)."""
    dec = CommandDecoder()
    out = []
    with trio.fail_after(timeout):
        while True:
            cmd = dec.next_command()
            if cmd is CLOSED:
                return out
            if cmd is NEED_DATA:
                try:
                    data = await stream.receive_some(65536)
                except trio.BrokenResourceError:  # reset instead of FIN
                    return out
                dec.receive_data(data)
                continue
            out.append(cmd)


async def raw_invoke(stream: trio.SocketStream, cmd: RemotingCommand, timeout: float = 5.0) -> RemotingCommand:
    await stream.send_all(encode_command(cmd))
    dec = CommandDecoder()
    with trio.fail_after(timeout):
        while (got := dec.next_command()) is NEED_DATA:
            dec.receive_data(await stream.receive_some(65536))
    assert got is not CLOSED
    return got
