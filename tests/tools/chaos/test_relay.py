# The nemesis' fault-injecting TCP relay (tools/chaos/relay.py) on its own,
# over loopback: it forwards both ways, a cut resets the connections it
# carries and black-holes new ones until the link heals, and a slowed link
# delays every chunk.
import random

import trio

from tools.chaos.relay import RelayMesh


async def echo_server(nursery) -> int:
    async def handle(stream):
        try:
            while data := await stream.receive_some(65536):
                await stream.send_all(data)
        except trio.BrokenResourceError:
            pass
    listeners = await nursery.start(trio.serve_tcp, handle, 0)
    return listeners[0].socket.getsockname()[1]


async def roundtrip(port: int, data: bytes, timeout: float = 2.0) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        with trio.fail_after(timeout):
            await stream.send_all(data)
            got = b""
            while len(got) < len(data):
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                got += chunk
            return got
    finally:
        await trio.aclose_forcefully(stream)


async def test_forward_cut_blackhole_heal_and_slow():
    async with trio.open_nursery() as nursery:
        target = await echo_server(nursery)
        mesh = await nursery.start(RelayMesh(random.Random(1)).run)
        link = await mesh.add("a>b", ("127.0.0.1", target))
        assert await roundtrip(link.port, b"hello") == b"hello"

        # A cut resets a connection in flight ...
        stream = await trio.open_tcp_stream("127.0.0.1", link.port)
        await stream.send_all(b"x")
        assert await stream.receive_some(10) == b"x"
        link.set_cut(True)
        with trio.fail_after(2):
            try:
                assert await stream.receive_some(10) == b""
            except trio.BrokenResourceError:
                pass  # reset
        await trio.aclose_forcefully(stream)
        assert link.resets == 1
        # ... and new connections get nothing through until it heals.
        with trio.move_on_after(0.5) as blocked:
            await roundtrip(link.port, b"lost", timeout=10)
        assert blocked.cancelled_caught
        assert mesh.between("a", "b") == [link]
        mesh.heal()
        assert await roundtrip(link.port, b"again") == b"again"

        link.set_slow(delay=0.2)
        t0 = trio.current_time()
        assert await roundtrip(link.port, b"slow") == b"slow"
        assert trio.current_time() - t0 >= 0.4  # one delay each way
        nursery.cancel_scope.cancel()
