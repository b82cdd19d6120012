# The peer transport's budgets against strangers (handshake.py,
# recvbudget.py, TransportConfig), on 127.0.0.1: a handshake frame (HELLO,
# AUTH, HELLO_OK) larger than handshake_max_frame_size is refused from its
# header, with or without a secret and on both ends; inbound handshakes are
# capped in total and per address (the rest closed at once, the slots free
# again once those connections end); after the handshake, frames begun and
# not finished share recv_budget_bytes (a frame that does not fit waits,
# then arrives) and must be finished within frame_read_timeout; and an
# exception in a connection's reader closes that connection only.
import functools
import os
import random

import pytest
import trio
import trio.testing

from commitlog.transport import TransportConfig, serve_peer_transport
from commitlog.transport.framing import (
    CLOSED,
    HEADER,
    MAGIC,
    NEED_DATA,
    VERSION,
    FrameDecoder,
    FrameKind,
    Hello,
    PeerAuth,
    decode_hello,
    encode_frame,
)
from tests.commitlog.transport.test_tcp import HOST, bind, deadline

GROUP = "G"
SECRET = "correct horse battery staple"
MIB = 1 << 20


def header(kind: FrameKind, length: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, kind, length)


async def acceptor(nursery, cfg=TransportConfig(), auth=None, ids=("n0", "n1", "n2"), me="n2"):
    """One transport (`me`, the highest id: it only accepts) and its port."""
    listeners, ports = await bind(1)
    peers = {i: (HOST, 1) for i in ids}
    peers[me] = (HOST, ports[0])
    t = await nursery.start(functools.partial(serve_peer_transport, cfg, me, peers, group=GROUP,
                                              listeners=listeners[0], rng=random.Random(0), auth=auth))
    return t, ports[0]


async def connect(port, source=HOST):
    """A TCP connection to `port` from the loopback address `source`."""
    sock = trio.socket.socket()
    await sock.bind((source, 0))
    await sock.connect((HOST, port))
    return trio.SocketStream(sock)


async def frames_until_closed(stream) -> list:
    decoder, out = FrameDecoder(), []
    with trio.fail_after(5):
        while True:
            while (frame := decoder.next_frame()) is NEED_DATA:
                try:
                    data = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    data = b""
                decoder.receive_data(data)
            if frame is CLOSED:
                return out
            out.append(frame)


async def as_member(port, claim="n0", me="n2", trailer=b""):
    stream = await trio.open_tcp_stream(HOST, port)
    await stream.send_all(encode_frame(Hello(GROUP, claim, me).encode(), FrameKind.HELLO) + trailer)
    return stream


# --- before the handshake ---------------------------------------------------------------


@pytest.mark.parametrize("secret", [False, True], ids=["no-secret", "secret"])
@deadline
async def test_an_oversized_hello_is_refused_from_its_header(nursery, secret):
    t, port = await acceptor(nursery, auth=PeerAuth(SECRET, GROUP) if secret else None)
    stream = await trio.open_tcp_stream(HOST, port)
    await stream.send_all(header(FrameKind.HELLO, 60 * MIB) + b"x" * 4096)   # and nothing more
    reply = await frames_until_closed(stream)   # answered now, not after 60 MiB
    assert [f.kind for f in reply] == [FrameKind.REJECT]
    assert b"frame length 62914560 exceeds the maximum of 8192" in reply[0].payload
    assert t.stats().rejected_connections == 1 and t.stats().handshakes == 0


@deadline
async def test_an_oversized_auth_is_refused_before_it_is_read(nursery):
    t, port = await acceptor(nursery, auth=PeerAuth(SECRET, GROUP))
    stream = await trio.open_tcp_stream(HOST, port)
    hello = Hello(GROUP, "n0", "n2", nonce=os.urandom(16).hex())
    await stream.send_all(encode_frame(hello.encode(), FrameKind.HELLO)
                          + header(FrameKind.AUTH, 60 * MIB) + b"0" * 4096)
    reply = await frames_until_closed(stream)
    assert [f.kind for f in reply] == [FrameKind.HELLO_OK, FrameKind.REJECT]
    assert decode_hello(reply[0].payload).proof  # challenged...
    assert b"exceeds the maximum of 8192" in reply[1].payload   # ...and refused at the header
    assert t.stats().rejected_connections == 1 and not t.connected_peers()


@deadline
async def test_the_dialer_refuses_an_oversized_answer(nursery):
    async def impostor(stream):  # whoever listens at n1's address
        async with stream:
            await stream.receive_some(4096)
            await stream.send_all(header(FrameKind.HELLO_OK, 60 * MIB) + b"y" * 65536)
            await trio.sleep_forever()

    listeners, ports = await bind(2)
    await nursery.start(trio.serve_listeners, impostor, listeners[1])
    peers = {"n0": (HOST, ports[0]), "n1": (HOST, ports[1])}
    n0 = await nursery.start(functools.partial(serve_peer_transport, TransportConfig(), "n0", peers, group=GROUP,
                                               listeners=listeners[0], rng=random.Random(0)))
    st = await n0.wait_state(lambda s: "exceeds the maximum of 8192" in (s.peers["n1"].last_error or ""))
    assert st.peers["n1"].connects == 0


@deadline
async def test_handshakes_are_capped_in_total_and_per_address(nursery):
    cfg = TransportConfig(max_handshakes=4, max_handshakes_per_address=2, handshake_timeout=10.0)
    t, port = await acceptor(nursery, cfg)
    idle = [await connect(port, "127.0.0.1"), await connect(port, "127.0.0.1")]   # say nothing
    await t.wait_state(lambda s: s.handshakes == 2)
    third = await connect(port, "127.0.0.1")
    with trio.fail_after(2):            # closed at once, not after the 10 s handshake timeout
        assert await frames_until_closed(third) == []
    assert t.stats().capped_connections == 1
    idle += [await connect(port, "127.0.0.2"), await connect(port, "127.0.0.2")]
    await t.wait_state(lambda s: s.handshakes == 4)
    with trio.fail_after(2):            # the total is full, whatever the address
        assert await frames_until_closed(await connect(port, "127.0.0.3")) == []
    assert t.stats().capped_connections == 2
    for stream in idle:
        await stream.aclose()
    await t.wait_state(lambda s: s.handshakes == 0)
    member = await as_member(port)      # slots free again: a member gets in
    await t.wait_state(lambda s: s.peers["n0"].connected)
    await member.send_all(encode_frame(b"in"))
    assert await t.receive() == ("n0", b"in")


# --- after the handshake ------------------------------------------------------------------


@deadline
async def test_frames_being_read_share_one_budget(nursery):
    cfg = TransportConfig(max_frame_size=MIB, recv_chunk_bytes=64 * 1024)   # recv_budget_bytes = 1 MiB
    t, port = await acceptor(nursery, cfg)
    assert cfg.recv_budget_bytes == MIB
    first = b"A" * (800 * 1024)
    second = b"B" * (600 * 1024)
    # Each frame begins in the HELLO's segment, so the handshake read its
    # start: once connected, the reader needs nothing more from the kernel
    # to take (or wait for) its budget, and waits on trio alone.
    a = await as_member(port, "n0", trailer=header(FrameKind.DATA, len(first)) + first[:1000])
    await t.wait_state(lambda s: s.peers["n0"].connected)
    await trio.testing.wait_all_tasks_blocked()
    st = t.stats()
    assert (st.unfinished_bytes, st.budget_waits) == (len(first), 0)
    b = await as_member(port, "n1", trailer=header(FrameKind.DATA, len(second)) + second[:1000])
    await t.wait_state(lambda s: s.peers["n1"].connected)
    await trio.testing.wait_all_tasks_blocked()   # n1's frame does not fit beside n0's: it waits for room
    st = t.stats()
    assert (st.unfinished_bytes, st.budget_waits) == (len(first), 1)
    nursery.start_soon(b.send_all, second[1000:])
    await a.send_all(first[1000:])
    assert await t.receive() == ("n0", first)
    assert await t.receive() == ("n1", second)
    assert t.stats().unfinished_bytes == 0   # given back before the frame was handed over


@deadline
async def test_a_frame_not_finished_in_time_closes_its_connection_and_frees_its_budget(nursery):
    cfg = TransportConfig(frame_read_timeout=0.3)
    t, port = await acceptor(nursery, cfg)
    stream = await as_member(port, trailer=encode_frame(b"whole") + header(FrameKind.DATA, 500_000) + b"z" * 10)
    assert await t.receive() == ("n0", b"whole")
    st = await t.wait_state(lambda s: s.peers["n0"].disconnects >= 1)
    assert "a frame of 500000 bytes not finished within 0.3 s" in st.peers["n0"].last_error
    assert st.peers["n0"].bad_frames == 1 and st.unfinished_bytes == 0
    await stream.aclose()


@deadline
async def test_an_exception_in_the_reader_closes_only_that_connection(nursery, caplog):
    t, port = await acceptor(nursery)
    got = []
    again_taken = trio.Event()

    def sink(src, payload):
        if payload == b"boom":
            raise RuntimeError("the consumer cannot take this")
        got.append((src, payload))
        if payload == b"again":
            again_taken.set()

    t.set_sink(sink)
    one = await as_member(port, "n0", trailer=encode_frame(b"fine") + encode_frame(b"boom") + encode_frame(b"lost"))
    two = await as_member(port, "n1", trailer=encode_frame(b"other"))
    st = await t.wait_state(lambda s: s.peers["n0"].disconnects >= 1 and s.peers["n1"].connected)
    assert "unexpected RuntimeError: the consumer cannot take this" in st.peers["n0"].last_error
    assert st.failed_connections == 1 and st.peers["n0"].failures == 1
    assert any("RuntimeError" in r.message and r.exc_info for r in caplog.records)
    again = await as_member(port, "n0", trailer=encode_frame(b"again"))
    await t.wait_state(lambda s: s.peers["n0"].connected)
    await again_taken.wait()   # n0's next connection delivers
    assert got.count(("n0", b"fine")) == 1 and ("n0", b"lost") not in got and ("n1", b"other") in got
    for s in (one, two, again):
        await s.aclose()
