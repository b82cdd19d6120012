# Tests of RemotingClient on real TCP: one shared connection per address,
# clean errors (connect refused, timeout, connection lost, unencodable
# request), a late response after a timeout, redialing after the server
# went away and came back on the same port, and the ROCKETMQ override --
# on trio, as the broker and mqadmin run it.  The same client on asyncio and
# trio alike, and its hostile-input bounds: tests/broker/client/test_transport.py.
import socket

import pytest
import trio

from broker.remoting.client import open_remoting_client, parse_addr
from broker.remoting.codes import SerializeType
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import (
    LocalProtocolError,
    RemotingConnectError,
    RemotingConnectionLostError,
    RemotingTimeoutError,
)
from broker.remoting.server import serve_remoting
from tests.broker.remoting.helpers import ECHO, ONEWAY_SINK, SLOW, EchoService

HANG_UP = 1010


async def start(nursery, handler, port=0):
    return await nursery.start(lambda task_status: serve_remoting(
        handler, "127.0.0.1", port, task_status=task_status))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_parse_addr():
    assert parse_addr("127.0.0.1:9876") == ("127.0.0.1", 9876)
    assert parse_addr("broker-a.example:10911") == ("broker-a.example", 10911)
    assert parse_addr("[::1]:9876") == ("::1", 9876)
    for bad in ("127.0.0.1", ":9876", "h:0", "h:65536", "h:x1", "[::1]9876", ""):
        with pytest.raises(ValueError):
            parse_addr(bad)


async def test_connect_refused_and_bad_address():
    async with open_remoting_client() as client:
        addr = f"127.0.0.1:{free_port()}"
        with pytest.raises(RemotingConnectError) as e:
            await client.invoke(addr, RemotingCommand(ECHO))
        assert e.value.addr == addr
        with pytest.raises(RemotingConnectError, match="bad address"):
            await client.invoke("nonsense", RemotingCommand(ECHO))


async def test_concurrent_callers_share_one_connection(nursery):
    svc = EchoService()
    server = await start(nursery, svc.dispatcher)
    async with open_remoting_client() as client:
        got = {}

        async def call(i):
            got[i] = (await client.invoke(server.address, RemotingCommand(ECHO, body=b"%d" % i))).body

        async with trio.open_nursery() as n:
            for i in range(50):
                n.start_soon(call, i)
        assert got == {i: b"%d" % i for i in range(50)}
        assert client.dials == 1 and server.accepted == 1


async def test_timeout_then_late_response_is_dropped(nursery):
    svc = EchoService()
    server = await start(nursery, svc.dispatcher)
    async with open_remoting_client() as client:
        with pytest.raises(RemotingTimeoutError) as e:
            await client.invoke(server.address, RemotingCommand(SLOW), timeout=0.2)
        assert e.value.code == SLOW and e.value.timeout == 0.2
        conn = client.cached(server.address)
        assert conn is not None and conn.in_flight_responses == 0
        svc.release.set()  # the response now arrives for nobody
        resp = await client.invoke(server.address, RemotingCommand(ECHO, body=b"next"))
        assert resp.body == b"next" and client.cached(server.address) is conn


async def test_connection_lost_with_request_in_flight_then_redial(nursery):
    svc = EchoService()

    async def hang_up(conn, cmd):
        conn.close("test hangs up")
        await trio.sleep_forever()

    svc.dispatcher.register(HANG_UP, hang_up)
    server = await start(nursery, svc.dispatcher)
    async with open_remoting_client() as client:
        with pytest.raises(RemotingConnectionLostError):
            await client.invoke(server.address, RemotingCommand(HANG_UP), timeout=5)
        resp = await client.invoke(server.address, RemotingCommand(ECHO, body=b"again"))
        assert resp.body == b"again" and client.dials == 2


async def test_reconnects_after_the_server_comes_back(nursery):
    svc = EchoService()
    async with open_remoting_client() as client:
        async with trio.open_nursery() as first:
            server = await start(first, svc.dispatcher)
            port, addr = server.port, server.address
            assert (await client.invoke(addr, RemotingCommand(ECHO, body=b"1"))).body == b"1"
            conn = client.cached(addr)
            first.cancel_scope.cancel()
        with trio.fail_after(5):
            await conn.wait_closed()  # the client noticed the server went away
        assert client.cached(addr) is None
        with pytest.raises(RemotingConnectError):
            await client.invoke(addr, RemotingCommand(ECHO))
        await start(nursery, svc.dispatcher, port=port)
        assert (await client.invoke(addr, RemotingCommand(ECHO, body=b"2"))).body == b"2"
        assert client.dials == 2


async def test_unencodable_request_fails_locally_and_keeps_the_connection(nursery):
    svc = EchoService()
    server = await start(nursery, svc.dispatcher)
    async with open_remoting_client(max_frame_size=1024) as client:
        await client.invoke(server.address, RemotingCommand(ECHO))
        with pytest.raises(LocalProtocolError, match="exceeds the maximum of 1024"):
            await client.invoke(server.address, RemotingCommand(ECHO, body=b"x" * 2000))
        assert (await client.invoke(server.address, RemotingCommand(ECHO, body=b"ok"))).body == b"ok"
        assert client.dials == 1


async def test_rocketmq_serialization_override(nursery):
    svc = EchoService()
    seen = []

    async def record(conn, cmd):
        seen.append(cmd.serialize_type)
        return await svc.echo(conn, cmd)

    svc.dispatcher.register(ECHO, record)
    server = await start(nursery, svc.dispatcher)
    async with open_remoting_client(serialize_type=SerializeType.ROCKETMQ) as client:
        resp = await client.invoke(server.address, RemotingCommand(ECHO, ext_fields={"a": "b"}))
        assert resp.serialize_type == SerializeType.ROCKETMQ and resp.ext_fields == {"a": "b"}
        assert seen == [SerializeType.ROCKETMQ]


async def test_oneway_and_closed_client(nursery):
    svc = EchoService()
    server = await start(nursery, svc.dispatcher)
    async with open_remoting_client() as client:
        await client.invoke_oneway(server.address, RemotingCommand(ONEWAY_SINK, body=b"x"))
        with trio.fail_after(5):
            await svc.oneway_seen.wait()
        assert svc.oneways[0].is_oneway
        client.close()
        with pytest.raises(RemotingConnectError, match="closed"):
            await client.invoke(server.address, RemotingCommand(ECHO))
