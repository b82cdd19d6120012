# Tests of the remoting server on real TCP (127.0.0.1, port 0): dispatch,
# oneway, handler errors, pipelining and out-of-order responses on one
# connection, answering in the request's serialization, pushing requests to
# a connected client, and malformed frames (garbage, lying lengths, huge
# lengths, bad JSON) that close only their own connection while another
# client keeps being served.
import json
import struct

import pytest
import trio

from broker.remoting.client import open_remoting_client
from broker.remoting.codec import encode_command
from broker.remoting.codes import RequestCode, ResponseCode, SerializeType
from broker.remoting.command import RemotingCommand
from broker.remoting.server import serve_remoting
from tests.broker.remoting.helpers import ECHO, FAIL, ONEWAY_SINK, REFUSE, SLOW, EchoService, raw_invoke, read_until_eof


async def start(nursery, service: EchoService, **kw):
    return await nursery.start(lambda task_status: serve_remoting(
        service.dispatcher, "127.0.0.1", 0, task_status=task_status, **kw))


async def test_request_response_and_unknown_code(nursery):
    svc = EchoService()
    server = await start(nursery, svc)
    assert server.port > 0 and server.address == f"127.0.0.1:{server.port}"
    async with open_remoting_client() as client:
        req = RemotingCommand.create_request(ECHO, {"topic": "T", "n": 3}, b"payload")
        resp = await client.invoke(server.address, req)
        assert resp.is_response and resp.code == ResponseCode.SUCCESS
        assert resp.ext_fields == {"topic": "T", "n": "3"} and resp.body == b"payload"
        resp = await client.invoke(server.address, RemotingCommand.create_request(RequestCode.PULL_MESSAGE))
        assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert resp.remark == " request type 11 not supported"
        assert client.dials == 1


async def test_handler_errors_answer_and_keep_the_connection(nursery):
    svc = EchoService()
    server = await start(nursery, svc)
    async with open_remoting_client() as client:
        resp = await client.invoke(server.address, RemotingCommand(FAIL))
        assert resp.code == ResponseCode.SYSTEM_ERROR and resp.remark == "ValueError: handler exploded"
        resp = await client.invoke(server.address, RemotingCommand(REFUSE))
        assert (resp.code, resp.remark) == (ResponseCode.NO_PERMISSION, "not for you")
        resp = await client.invoke(server.address, RemotingCommand(ECHO, body=b"still here"))
        assert resp.body == b"still here"
        assert client.dials == 1 and server.accepted == 1


async def test_oneway_gets_no_response(nursery):
    svc = EchoService()
    server = await start(nursery, svc)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    oneway = RemotingCommand(ONEWAY_SINK, opaque=5, body=b"fire").as_request(5, oneway=True)
    # A oneway request, then a normal one: the only response is the second's.
    await stream.send_all(encode_command(oneway))
    resp = await raw_invoke(stream, RemotingCommand(ECHO, opaque=6))
    assert resp.opaque == 6
    with trio.fail_after(5):
        await svc.oneway_seen.wait()
    assert svc.oneways[0].body == b"fire"
    await stream.send_eof()
    assert await read_until_eof(stream) == []  # nothing was answered to the oneway
    await stream.aclose()


async def test_pipelined_requests_complete_out_of_order(nursery):
    # A long-poll style request is held while later requests on the same
    # connection are answered.
    svc = EchoService()
    server = await start(nursery, svc)
    async with open_remoting_client() as client:
        results = {}

        async def slow():
            results["slow"] = await client.invoke(server.address, RemotingCommand(SLOW), timeout=10)

        async with trio.open_nursery() as inner:
            inner.start_soon(slow)
            await svc.slow_started.wait()
            for i in range(20):
                resp = await client.invoke(server.address, RemotingCommand(ECHO, ext_fields={"i": i}))
                assert resp.ext_fields == {"i": str(i)}
            assert "slow" not in results
            svc.release.set()
        assert results["slow"].body == b"slow done"
        assert client.dials == 1


async def test_raw_pipelining_in_one_write(nursery):
    svc = EchoService()
    server = await start(nursery, svc)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(b"".join(encode_command(RemotingCommand(ECHO, opaque=n, body=bytes([n])))
                                   for n in range(1, 6)))
    await stream.send_eof()
    got = await read_until_eof(stream)
    assert sorted((c.opaque, c.body) for c in got) == [(n, bytes([n])) for n in range(1, 6)]
    await stream.aclose()


@pytest.mark.parametrize("stype", list(SerializeType))
async def test_answers_in_the_serialization_of_the_request(nursery, stype):
    svc = EchoService()
    server = await start(nursery, svc)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    req = RemotingCommand(ECHO, opaque=3, ext_fields={"k": "v"}, serialize_type=stype)
    resp = await raw_invoke(stream, req)
    assert resp.serialize_type == stype and resp.ext_fields == {"k": "v"} and resp.opaque == 3
    await stream.aclose()


async def test_requests_in_flight_at_eof_finish_within_the_grace(nursery):
    # A client sends a oneway commit and closes at once: it is still applied.
    svc = EchoService()
    applied = trio.Event()

    async def slow_commit(conn, cmd):
        await trio.sleep(0.1)
        applied.set()

    svc.dispatcher.register(ONEWAY_SINK, slow_commit)
    server = await start(nursery, svc)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(encode_command(RemotingCommand(ONEWAY_SINK).as_request(1, oneway=True)))
    await stream.aclose()
    with trio.fail_after(5):
        await applied.wait()


async def test_handlers_that_outlive_the_grace_are_cancelled(nursery):
    svc = EchoService()  # SLOW waits for svc.release, which never comes
    server = await start(nursery, svc)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(encode_command(RemotingCommand(SLOW, opaque=1)))
    with trio.fail_after(5):
        await svc.slow_started.wait()
    [conn] = server.connections
    assert conn.eof_grace == 1.0
    start_time = trio.current_time()
    await stream.aclose()
    with trio.fail_after(5):
        await conn.wait_closed()
    assert 0.9 <= trio.current_time() - start_time < 4 and server.connections == set()


async def test_server_pushes_requests_to_a_connected_client(nursery):
    svc = EchoService()
    server = await start(nursery, svc)
    pushed = []
    two_pushed = trio.Event()

    async def client_handler(conn, cmd):
        pushed.append(cmd)
        if len(pushed) == 2:
            two_pushed.set()
        return cmd.make_response(body=b"client says hi")

    async with open_remoting_client(handler=client_handler) as client:
        await client.invoke(server.address, RemotingCommand(ECHO))
        [server_side] = svc.connections
        resp = await server_side.invoke(RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                                        ext_fields={"consumerGroup": "g"}), timeout=5)
        assert resp.body == b"client says hi" and resp.is_response
        await server_side.send_request_oneway(RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED))
        # The oneway push is handled; its handler's return value is dropped.
        resp = await client.invoke(server.address, RemotingCommand(ECHO, body=b"after"))
        assert resp.body == b"after"
        with trio.fail_after(5):
            await two_pushed.wait()
        assert pushed[0].ext_fields == {"consumerGroup": "g"} and pushed[1].is_oneway


async def test_client_without_handler_answers_not_supported(nursery):
    svc = EchoService()
    server = await start(nursery, svc)
    async with open_remoting_client() as client:
        await client.invoke(server.address, RemotingCommand(ECHO))
        [server_side] = svc.connections
        resp = await server_side.invoke(RemotingCommand(RequestCode.CHECK_TRANSACTION_STATE), timeout=5)
        assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


# --- malformed frames: only that connection closes ----------------------------------------

GARBAGE = {
    "random bytes": bytes(range(7, 250, 3)) * 3,
    "length below 4": struct.pack(">ii", 2, 0),
    "header longer than frame": struct.pack(">ii", 10, 500) + b"x" * 10,
    "unknown serialize type": struct.pack(">ii", 8, (9 << 24) | 4) + b"abcd",
    "bad JSON": struct.pack(">ii", 13, 9) + b"{not json",
    "huge length, no header": struct.pack(">ii", 0x7FFFFFFF, 0x00FFFFFF),
}


async def _check_isolated(server, bad_bytes: bytes, expect_error_opaque: int | None):
    good_stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    assert (await raw_invoke(good_stream, RemotingCommand(ECHO, opaque=1, body=b"a"))).body == b"a"
    bad = await trio.open_tcp_stream("127.0.0.1", server.port)
    await bad.send_all(bad_bytes)
    got = await read_until_eof(bad)  # the server closes the bad connection
    if expect_error_opaque is None:
        assert got == []
    else:
        [err] = got
        assert err.code == ResponseCode.SYSTEM_ERROR and err.opaque == expect_error_opaque
        assert err.remark.startswith("malformed frame")
    await bad.aclose()
    # The other connection is untouched, and new connections are served.
    assert (await raw_invoke(good_stream, RemotingCommand(ECHO, opaque=2, body=b"b"))).body == b"b"
    async with open_remoting_client() as client:
        assert (await client.invoke(server.address, RemotingCommand(ECHO, body=b"c"))).body == b"c"
    await good_stream.aclose()


@pytest.mark.parametrize("name", list(GARBAGE))
async def test_malformed_frame_closes_only_its_connection(nursery, name):
    server = await start(nursery, EchoService())
    await _check_isolated(server, GARBAGE[name], None)


async def test_bad_header_with_readable_opaque_gets_an_error_response(nursery):
    server = await start(nursery, EchoService())
    header = json.dumps({"code": "not a number", "opaque": 99}).encode()
    await _check_isolated(server, struct.pack(">ii", 4 + len(header), len(header)) + header, 99)


@pytest.mark.parametrize("stype", list(SerializeType))
async def test_oversized_frame_gets_an_error_response(nursery, stype):
    server = await start(nursery, EchoService(), max_frame_size=4096)
    big = encode_command(RemotingCommand(ECHO, opaque=1234, body=b"x" * 10000, serialize_type=stype))
    # Only part of the body is sent: the server must not wait for the rest.
    await _check_isolated(server, big[:3000], 1234)


async def test_a_valid_frame_after_garbage_is_not_served(nursery):
    # The stream has no frame boundaries left after a bad frame.
    svc = EchoService()
    server = await start(nursery, svc)
    bad = await trio.open_tcp_stream("127.0.0.1", server.port)
    await bad.send_all(GARBAGE["bad JSON"] + encode_command(RemotingCommand(ONEWAY_SINK).as_request(1, True)))
    assert await read_until_eof(bad) == []
    assert svc.oneways == []
    await bad.aclose()
