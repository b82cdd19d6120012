# Tests of the TCP peer transport on 127.0.0.1: a 3-node mesh exchanging
# messages both ways over one connection per pair, restarts of an acceptor
# and of a dialer, garbage and hostile handshakes, the send-queue bounds,
# stale-message expiry, write batching and big frames.
import functools
import logging
import random
import socket

import pytest
import trio
import trio.testing

from commitlog.transport import (
    FrameError,
    TransportConfig,
    UnknownPeerError,
    backoff_delay,
    open_peer_transport,
    serve_peer_transport,
)
from commitlog.transport.framing import CLOSED, NEED_DATA, FrameDecoder, FrameKind, Hello, encode_frame

HOST = "127.0.0.1"
GROUP = "RaftNode00"
FAST = TransportConfig(backoff_initial=0.01, backoff_max=0.1, handshake_timeout=1.0)
IDS = ("n0", "n1", "n2")


def deadline(fn):
    # Every test here must finish fast; a hang is a failure, not a stall.
    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        with trio.fail_after(20):
            return await fn(*args, **kwargs)
    return wrapper


async def bind(n: int):
    listeners = [await trio.open_tcp_listeners(0, host=HOST) for _ in range(n)]
    return listeners, [ls[0].socket.getsockname()[1] for ls in listeners]


class Node:
    """A transport that a test can stop and restart on the same port."""

    def __init__(self, nursery, node_id, peers, cfg=FAST, group=GROUP, identity=None):
        self.nursery, self.id, self.peers, self.cfg, self.group = nursery, node_id, peers, cfg, group
        self.identity = identity
        self.t = None

    async def start(self, listeners=None):
        self.scope, self.done = trio.CancelScope(), trio.Event()

        async def runner(task_status):
            try:
                with self.scope:
                    await serve_peer_transport(self.cfg, self.id, self.peers, group=self.group,
                                               listeners=listeners, rng=random.Random(self.id),
                                               identity=self.identity, task_status=task_status)
            finally:
                self.done.set()
        self.t = await self.nursery.start(runner)
        return self.t

    async def stop(self):
        self.scope.cancel()
        await self.done.wait()


async def mesh(nursery, ids=IDS, cfg=FAST):
    listeners, ports = await bind(len(ids))
    peers = {i: (HOST, p) for i, p in zip(ids, ports)}
    nodes = {i: Node(nursery, i, peers, cfg) for i in ids}
    for i, ls in zip(ids, listeners):
        await nodes[i].start(ls)
    for n in nodes.values():
        await n.t.wait_connected()
    return nodes, peers


async def recv_n(transport, n):
    return [await transport.receive() for _ in range(n)]


def connected_to(peer_id, connects=1):
    return lambda s: s.peers[peer_id].connected and s.peers[peer_id].connects >= connects


@deadline
async def test_three_nodes_exchange_both_ways_over_one_connection_per_pair(nursery):
    nodes, _ = await mesh(nursery)
    t = {i: n.t for i, n in nodes.items()}
    for src in IDS:
        for dst in IDS:
            if src != dst:
                for k in range(100):
                    assert t[src].send(dst, f"{src}>{dst}#{k}".encode())
    for dst in IDS:
        got = await recv_n(t[dst], 200)
        for src in IDS:
            if src != dst:
                assert [p for s, p in got if s == src] == [f"{src}>{dst}#{k}".encode() for k in range(100)]
    for a in IDS:
        assert t[a].connected_peers() == set(IDS) - {a}
        for b in IDS:
            if a < b:
                # Both ends of the pair hold the same socket pair: the lower
                # id dialed, and that one connection carries both directions.
                sa = t[a]._peers[b].conn.stream.socket
                sb = t[b]._peers[a].conn.stream.socket
                assert sa.getsockname() == sb.getpeername()
                assert sa.getpeername() == sb.getsockname() == (HOST, t[b].listen_port)
    st = t["n0"].stats().peers["n1"]
    assert (st.sent_frames, st.received_frames, st.connects, st.reconnects) == (100, 100, 1, 0)
    assert st.sent_bytes == sum(len(f"n0>n1#{k}") for k in range(100))
    assert 1 <= st.writes <= st.sent_frames
    assert t["n0"].stats().rejected_connections == 0
    with pytest.raises(UnknownPeerError):
        t["n0"].send("n7", b"x")
    with pytest.raises(UnknownPeerError):
        t["n0"].send("n0", b"to self")


@deadline
async def test_scattered_payloads_arrive_as_their_concatenation(nursery):
    """A payload given as a tuple of pieces (a push and its entries) is one
    frame whose bytes are the pieces joined, small pieces and ones above
    join_limit (written on their own) alike, in order with plain ones."""
    nodes, _ = await mesh(nursery, ids=("n0", "n1"))
    big = memoryview(bytes(range(256)) * 1200)  # > join_limit: written as is
    sent = [(b"head", big, b"tail"), b"plain", (b"a", b"", b"b"), (b"x" * 10, big[:100], b"")]
    for p in sent:
        assert nodes["n0"].t.send("n1", p)
    got = await recv_n(nodes["n1"].t, len(sent))
    assert [p for _, p in got] == [b"".join(p) if isinstance(p, tuple) else p for p in sent]
    st = nodes["n0"].t.stats().peers["n1"]
    assert st.sent_bytes == sum(len(p) for _, p in got) and nodes["n0"].t._peers["n1"].queued_bytes == 0


@deadline
async def test_frames_written_in_part_by_send_are_finished_first_by_the_writer(nursery):
    """send() writes a frame straight to the socket when nothing is queued;
    a socket without room for all of it takes part, the writer task
    finishes that frame before the ones queued behind it, and the peer
    gets every payload whole and in order."""
    nodes, _ = await mesh(nursery, ids=("n0", "n1"))
    t0 = nodes["n0"].t
    sock = t0._peers["n1"].conn.stream.socket
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # room for a part of a frame only
    sent = [bytes([k]) * (50_000 + k) for k in range(20)] + [(b"h", memoryview(b"m" * 70_000), b"t")]
    for p in sent:  # all at once, before the writer task can run
        assert t0.send("n1", p)
    assert t0._peers["n1"].rest is not None  # the first frame went out in part
    got = await recv_n(nodes["n1"].t, len(sent))
    assert [p for _, p in got] == [b"".join(p) if isinstance(p, tuple) else p for p in sent]
    assert t0._peers["n1"].rest is None and not t0._peers["n1"].queue


@pytest.mark.parametrize("victim", ["n2", "n0"])  # n2 only accepts, n0 only dials
@deadline
async def test_peer_restart_on_same_port_then_traffic_resumes(nursery, victim):
    nodes, _ = await mesh(nursery)
    others = [i for i in IDS if i != victim]
    await nodes[victim].stop()
    for o in others:
        await nodes[o].t.wait_state(lambda s: not s.peers[victim].connected)
        assert nodes[o].t.send(victim, b"queued while down from " + o.encode())
    new = await nodes[victim].start()  # binds the same port from the peer table
    await new.wait_connected()
    for o in others:
        await nodes[o].t.wait_state(connected_to(victim, connects=2))
        assert nodes[o].t.stats().peers[victim].reconnects == 1
    got = sorted(await recv_n(new, 2))
    assert got == [(o, b"queued while down from " + o.encode()) for o in others]
    for o in others:
        assert new.send(o, b"hello again")
        assert nodes[o].t.send(victim, b"welcome back")
        assert await nodes[o].t.receive() == (victim, b"hello again")
    assert sorted(await recv_n(new, 2)) == [(o, b"welcome back") for o in others]


async def read_all(stream) -> bytes:
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data


def frames_of(data: bytes):
    dec = FrameDecoder()
    dec.receive_data(data)
    dec.receive_data(b"")
    out = []
    while (f := dec.next_frame()) is not CLOSED:
        assert f is not NEED_DATA
        out.append(f)
    return out


@deadline
async def test_garbage_connection_closed_others_keep_working(nursery, caplog):
    caplog.set_level(logging.INFO, logger="commitlog.transport")
    nodes, peers = await mesh(nursery)
    raw = await trio.open_tcp_stream(*peers["n1"])
    await raw.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    reply = frames_of(await read_all(raw))  # EOF: n1 closed it
    assert [f.kind for f in reply] == [FrameKind.REJECT]
    assert b"bad frame: bad magic" in reply[0].payload
    await raw.aclose()
    assert nodes["n1"].t.stats().rejected_connections == 1
    assert any("rejected inbound connection" in r.message and "bad magic" in r.message
               and r.levelno == logging.WARNING for r in caplog.records)
    for src, dst in [("n0", "n1"), ("n2", "n1"), ("n1", "n0"), ("n1", "n2")]:
        assert nodes[src].t.send(dst, b"still fine")
        assert await nodes[dst].t.receive() == (src, b"still fine")
    assert nodes["n0"].t.stats().peers["n1"].connects == 1  # real peers were not disturbed


@pytest.mark.parametrize("trailer, reason", [
    (b"\x00" * 8, "bad frame: bad magic 0x0000"),
    (encode_frame(Hello(GROUP, "n0", "n1").encode(), FrameKind.HELLO),
     "bad frame: unexpected HELLO frame after the handshake"),
])
@deadline
async def test_bad_frame_after_handshake_closes_only_that_connection(nursery, caplog, trailer,
                                                                     reason):
    caplog.set_level(logging.INFO, logger="commitlog.transport")
    nodes, peers = await mesh(nursery)
    fake = await trio.open_tcp_stream(*peers["n1"])  # claims to be n0
    await fake.send_all(encode_frame(Hello(GROUP, "n0", "n1").encode(), FrameKind.HELLO)
                        + encode_frame(b"from the impostor") + trailer)
    reply = frames_of(await read_all(fake))
    assert [f.kind for f in reply] == [FrameKind.HELLO_OK]
    await fake.aclose()
    assert await nodes["n1"].t.receive() == ("n0", b"from the impostor")
    assert nodes["n1"].t.stats().peers["n0"].bad_frames == 1
    assert any(reason in r.message and r.levelno == logging.WARNING for r in caplog.records)
    # The impostor displaced the real n0 connection; n0 redials and recovers.
    await nodes["n0"].t.wait_state(connected_to("n1", connects=2))
    await nodes["n1"].t.wait_state(connected_to("n0", connects=3))
    assert nodes["n0"].t.send("n1", b"real n0")
    assert await nodes["n1"].t.receive() == ("n0", b"real n0")
    assert nodes["n1"].t.send("n0", b"real n1")
    assert await nodes["n0"].t.receive() == ("n1", b"real n1")


@deadline
async def test_wrong_group_rejected(nursery, caplog):
    caplog.set_level(logging.INFO, logger="commitlog.transport")
    listeners, ports = await bind(3)
    peers = {i: (HOST, p) for i, p in zip(IDS, ports)}
    n0 = await Node(nursery, "n0", peers).start(listeners[0])
    n1 = await Node(nursery, "n1", peers).start(listeners[1])
    n2 = await Node(nursery, "n2", peers, group="OtherGroup").start(listeners[2])
    for t in (n0, n1):
        st = await t.wait_state(lambda s: "wrong group" in (s.peers["n2"].last_error or ""))
        assert st.peers["n2"].last_error == (
            "rejected by n2: wrong group 'RaftNode00' (this node is in group 'OtherGroup')")
    await n0.wait_connected(["n1"])
    assert n0.connected_peers() == {"n1"} and n2.connected_peers() == set()
    assert n2.stats().rejected_connections >= 2
    assert not n0.stats().peers["n2"].connected
    assert any("wrong group" in r.message and r.levelno == logging.WARNING for r in caplog.records)


@deadline
async def test_log_identity_mismatch_refused_naming_both_values(nursery, caplog):
    # n2's log begins elsewhere (another divided offset): neither side
    # connects to it, the reason names both values, n0 and n1 go on; n2
    # restarted with the same identity connects.
    caplog.set_level(logging.INFO, logger="commitlog.transport")
    listeners, ports = await bind(3)
    peers = {i: (HOST, p) for i, p in zip(IDS, ports)}
    same = {"origin": "196608", "dataSegmentSize": "65536"}
    n0 = await Node(nursery, "n0", peers, identity=same).start(listeners[0])
    n1 = await Node(nursery, "n1", peers, identity=same).start(listeners[1])
    bad = Node(nursery, "n2", peers, identity={"origin": "1073741824", "dataSegmentSize": "65536"})
    n2 = await bad.start(listeners[2])
    for t in (n0, n1):
        st = await t.wait_state(lambda s: "identity" in (s.peers["n2"].last_error or ""))
        assert st.peers["n2"].last_error == (
            f"rejected by n2: log identity differs: origin 1073741824 at n2, 196608 at {t.self_id}")
    await n0.wait_connected(["n1"])
    assert n2.connected_peers() == set() and n2.stats().rejected_connections >= 2
    assert "log identity differs: origin 1073741824 at n2, 196608 at n0" in n2.stats().peers["n0"].last_error
    assert any("identity differs" in r.message and r.levelno == logging.ERROR for r in caplog.records)
    assert n0.send("n1", b"still here") and await n1.receive() == ("n0", b"still here")
    await bad.stop()
    bad.identity = dict(same)
    n2 = await bad.start(await trio.open_tcp_listeners(ports[2], host=HOST))
    await n2.wait_connected()


@deadline
async def test_identity_keys_only_one_side_has_are_not_compared(nursery):
    listeners, ports = await bind(3)
    peers = {i: (HOST, p) for i, p in zip(IDS, ports)}
    ts = [await Node(nursery, i, peers, identity=ident).start(ls) for i, ident, ls in
          zip(IDS, ({"origin": "0"}, None, {"origin": "0", "dataSegmentSize": "4096"}), listeners)]
    for t in ts:
        await t.wait_connected()


@pytest.mark.parametrize("hello, reason", [
    (Hello(GROUP, "n9", "n1"), "unknown peer 'n9'"),
    (Hello(GROUP, "n2", "n1"), "'n2' must not dial 'n1': the peer with the lower id dials"),
    (Hello(GROUP, "n0", "n2"), "hello addressed to 'n2' but this node is 'n1'"),
    (Hello("x", "n0", "n1"), "wrong group 'x'"),
])
@deadline
async def test_bad_handshakes_rejected_with_reason(nursery, hello, reason):
    nodes, peers = await mesh(nursery)
    raw = await trio.open_tcp_stream(*peers["n1"])
    await raw.send_all(encode_frame(hello.encode(), FrameKind.HELLO))
    reply = frames_of(await read_all(raw))
    assert [f.kind for f in reply] == [FrameKind.REJECT]
    assert reason in reply[0].payload.decode()
    assert nodes["n1"].t.stats().rejected_connections == 1
    assert nodes["n1"].t.connected_peers() == {"n0", "n2"}


@deadline
async def test_send_queue_bounds_then_exact_delivery(nursery):
    cfg = TransportConfig(send_queue_messages=5, send_queue_bytes=1000, backoff_initial=0.01,
                          backoff_max=0.05)
    ids = ("n0", "n1", "n2", "n3")
    listeners, ports = await bind(4)  # bound, not yet served: the peers are "down"
    peers = {i: (HOST, p) for i, p in zip(ids, ports)}
    n0 = await Node(nursery, "n0", peers, cfg).start(listeners[0])
    # Message-count bound.
    assert [n0.send("n1", b"c%d" % k) for k in range(7)] == [True] * 5 + [False] * 2
    # Byte bound: 400 + 400 fit in 1000, a third 400 does not, a small one does.
    assert [n0.send("n2", bytes([k]) * 400) for k in range(3)] == [True, True, False]
    assert n0.send("n2", b"small")
    # An empty queue takes one message of any size up to max_frame_size.
    assert n0.send("n3", b"x" * 5000) and not n0.send("n3", b"y")
    st = n0.stats().peers
    assert (st["n1"].dropped_full, st["n1"].queued_messages) == (2, 5)
    assert (st["n2"].dropped_full, st["n2"].queued_bytes) == (1, 805)
    assert st["n3"].dropped_full == 1
    # The peers come up: exactly what was accepted arrives, in order, and
    # the backlog leaves in one write per peer.
    n1 = await Node(nursery, "n1", peers, cfg).start(listeners[1])
    n2 = await Node(nursery, "n2", peers, cfg).start(listeners[2])
    assert await recv_n(n1, 5) == [("n0", b"c%d" % k) for k in range(5)]
    assert await recv_n(n2, 3) == [("n0", b"\x00" * 400), ("n0", b"\x01" * 400), ("n0", b"small")]
    st = n0.stats().peers
    assert (st["n1"].sent_frames, st["n1"].writes, st["n1"].queued_messages) == (5, 1, 0)
    assert (st["n2"].sent_frames, st["n2"].writes) == (3, 1)
    assert n0.send("n1", b"flows again")
    assert await n1.receive() == ("n0", b"flows again")


@deadline
async def test_stale_messages_expire_unsent(nursery):
    cfg = TransportConfig(max_queue_age=0.5, send_queue_messages=1, handshake_timeout=5.0,
                          backoff_initial=0.01, backoff_max=0.05)
    listeners, ports = await bind(2)
    peers = {"n0": (HOST, ports[0]), "n1": (HOST, ports[1])}
    n0 = await Node(nursery, "n0", peers, cfg).start(listeners[0])
    assert n0.send("n1", b"old")
    assert not n0.send("n1", b"queue full")
    await trio.sleep(0.6)  # let it age past max_queue_age
    assert n0.send("n1", b"fresh")  # the stale one made room
    n1 = await Node(nursery, "n1", peers, cfg).start(listeners[1])
    assert await n1.receive() == ("n0", b"fresh")
    st = n0.stats().peers["n1"]
    assert (st.dropped_stale, st.dropped_full, st.sent_frames) == (1, 1, 1)


@deadline
async def test_big_frames_and_oversize(nursery):
    nodes, _ = await mesh(nursery)
    t0, t1 = nodes["n0"].t, nodes["n1"].t
    big = bytes(range(256)) * (3 * 4096)  # 3 MiB
    for payload in (b"a", big, b"b", big[:70000], b"c"):
        assert t0.send("n1", payload)
    got = await recv_n(t1, 5)
    assert [p for _, p in got] == [b"a", big, b"b", big[:70000], b"c"]
    st = t0.stats().peers["n1"]
    assert (st.sent_frames, st.sent_bytes) == (5, 3 + len(big) + 70000)
    assert st.writes >= 3  # the big payloads went out on their own, uncopied
    with pytest.raises(FrameError, match="exceeds max_frame_size"):
        t0.send("n1", b"x" * (FAST.max_frame_size + 1))


@deadline
async def test_receiver_limit_smaller_than_sender_closes_connection(nursery, caplog):
    caplog.set_level(logging.INFO, logger="commitlog.transport")
    listeners, ports = await bind(2)
    peers = {"n0": (HOST, ports[0]), "n1": (HOST, ports[1])}
    n0 = await Node(nursery, "n0", peers).start(listeners[0])
    n1 = await Node(nursery, "n1", peers, TransportConfig(max_frame_size=1024)).start(listeners[1])
    await n0.wait_connected()
    assert n0.send("n1", b"z" * 2000)
    await n1.wait_state(lambda s: s.peers["n0"].bad_frames == 1)
    assert "exceeds the maximum of 1024" in n1.stats().peers["n0"].last_error
    await n0.wait_state(connected_to("n1", connects=2))  # reconnected after the close
    assert n0.send("n1", b"small is fine")
    assert await n1.receive() == ("n0", b"small is fine")


@deadline
async def test_close_ends_incoming_and_send_returns_false():
    listeners, ports = await bind(2)
    peers = {"n0": (HOST, ports[0]), "n1": (HOST, ports[1])}
    await listeners[1][0].aclose()
    async with open_peer_transport(FAST, "n0", peers, group=GROUP, listeners=listeners[0]) as t:
        assert t.send("n1", b"queued")
        assert t.peer_ids == ("n1",)
    assert t.send("n1", b"after close") is False
    assert [item async for item in t.incoming()] == []


def test_backoff_is_capped_exponential_with_jitter():
    cfg = TransportConfig(backoff_initial=0.05, backoff_max=1.0)
    rng = random.Random(1)
    delays = [backoff_delay(cfg, a, rng) for a in range(10)]
    for a, d in enumerate(delays):
        base = min(1.0, 0.05 * 2 ** a)
        assert base / 2 <= d < base
    assert delays == [backoff_delay(cfg, a, r) for r in [random.Random(1)] for a in range(10)]
    assert backoff_delay(cfg, 10_000, rng) < 1.0
    with pytest.raises(ValueError):
        TransportConfig(backoff_initial=2.0, backoff_max=1.0)
    with pytest.raises(ValueError):
        TransportConfig(send_queue_messages=0)


@pytest.mark.parametrize("reply, error", [
    (encode_frame(Hello(GROUP, "n5", "n0").encode(), FrameKind.HELLO_OK),
     "answered as Hello(group='RaftNode00', src='n5', dst='n0'"),
    (encode_frame(b"data first", FrameKind.DATA), "expected HELLO_OK from n1, got DATA"),
    (b"", "n1 closed the connection during the handshake"),
    (b"SSH-2.0-OpenSSH_9.6\r\n", "bad magic"),
])
@deadline
async def test_dialer_checks_the_acceptors_answer(nursery, reply, error):
    async def impostor(stream):  # whoever listens at n1's address
        async with stream:
            await stream.receive_some(4096)  # the HELLO
            if reply:
                await stream.send_all(reply)

    listeners, ports = await bind(2)
    await nursery.start(trio.serve_listeners, impostor, listeners[1])
    peers = {"n0": (HOST, ports[0]), "n1": (HOST, ports[1])}
    n0 = await Node(nursery, "n0", peers).start(listeners[0])
    st = await n0.wait_state(lambda s: error in (s.peers["n1"].last_error or ""))
    assert not st.peers["n1"].connected and st.peers["n1"].connects == 0
    assert n0.send("n1", b"kept for a real n1")  # the queue survives failed dials
    assert n0.stats().peers["n1"].queued_messages == 1


@deadline
async def test_silent_inbound_connection_times_out(nursery):
    nodes, peers = await mesh(nursery, cfg=TransportConfig(handshake_timeout=0.2,
                                                           backoff_initial=0.01, backoff_max=0.1))
    raw = await trio.open_tcp_stream(*peers["n2"])
    reply = frames_of(await read_all(raw))  # says nothing; n2 gives up and closes
    assert [f.kind for f in reply] == [FrameKind.REJECT]
    assert reply[0].payload == b"no handshake within 0.2 s"
    assert nodes["n2"].t.stats().rejected_connections == 1


@deadline
async def test_peers_join_and_leave_while_running():
    """set_peers (membership changes): a node the others learn about later
    is dialled by the lower ids and accepted once known; a removed one is
    disconnected and sending to it is a quiet False, not an error."""
    async with trio.open_nursery() as nursery:
        listeners, ports = await bind(3)
        peers = {i: (HOST, p) for i, p in zip(IDS, ports)}
        two = {i: peers[i] for i in ("n0", "n1")}
        n0, n1 = Node(nursery, "n0", two), Node(nursery, "n1", two)
        await n0.start(listeners[0])
        await n1.start(listeners[1])
        await n0.t.wait_connected()
        n2 = Node(nursery, "n2", peers)            # the joiner knows the group
        await n2.start(listeners[2])
        n0.t.set_peers(peers)                      # the others learn its address
        n1.t.set_peers(peers)
        for n in (n0, n1, n2):
            await n.t.wait_connected()
        assert n0.t.send("n2", b"hello")
        assert await n2.t.receive() == ("n0", b"hello")
        n0.t.set_peers({i: peers[i] for i in ("n0", "n2")})   # n1 leaves n0's configuration
        assert n0.t.send("n1", b"bye") is False
        await n1.t.wait_state(lambda st: not st.peers["n0"].connected)
        assert "n1" not in n0.t.stats().peers
        with pytest.raises(UnknownPeerError):
            n0.t.send("n9", b"?")                  # never a peer: still an error
        nursery.cancel_scope.cancel()


@deadline
async def test_a_sink_takes_messages_from_the_reader_and_can_hold_it_back():
    """set_sink: what was queued goes to the sink at once, then each message
    as its reader reads it; a sink that returns an Event stops that reader
    until the Event is set (the rest still flow, in order, afterwards)."""
    async with trio.open_nursery() as nursery:
        nodes, _ = await mesh(nursery, ids=("n0", "n1"))
        n0, n1 = nodes["n0"].t, nodes["n1"].t
        async def received(n):  # (wait_state wakes on connectivity changes only)
            while n1.stats().peers["n0"].received_frames < n:
                await trio.sleep(0.01)
        assert n0.send("n1", b"queued")
        await received(1)
        got, hold = [], trio.Event()

        def sink(src, payload):
            got.append((src, payload))
            return hold if payload == b"m1" else None
        n1.set_sink(sink)
        assert got == [("n0", b"queued")]
        for i in range(4):
            assert n0.send("n1", b"m%d" % i)
        await received(3)
        await trio.testing.wait_all_tasks_blocked()  # the reader is parked on `hold`: nothing more is taken
        assert got[1:] == [("n0", b"m0"), ("n0", b"m1")]
        hold.set()
        with trio.fail_after(5):
            while len(got) < 5:
                await trio.sleep(0.01)
        assert [p for _, p in got] == [b"queued", b"m0", b"m1", b"m2", b"m3"]
        nursery.cancel_scope.cancel()
