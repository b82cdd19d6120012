# Authenticated DLedger peers (dLegerPeerSecret: framing.PeerAuth + the
# handshake in handshake.py).  On the transport: members with the secret connect,
# a node with another secret or none is refused on both ends.  On three
# real nodes (serve_node over TCP): a stranger who knows the group name and
# the member ids dials a follower's peer port, claims to be a member and
# sends vote requests, heartbeats and pushes at higher terms -- and the
# group's term, leader and log do not move.  The same attack on a group
# without a secret does move the term, so the attack itself is real.
import os
import random

import pytest
import trio
import trio.testing

from commitlog.config import ConfigError, ReplicationConfig
from commitlog.node import serve_node
from commitlog.raft import wire
from commitlog.raft.messages import HeartbeatRequest, PushRequest, PushType, VoteRequest
from commitlog.transport import serve_peer_transport
from commitlog.transport.framing import (
    CLOSED,
    NEED_DATA,
    FrameDecoder,
    FrameKind,
    Hello,
    PeerAuth,
    decode_hello,
    encode_frame,
)
from tests.commitlog.transport.test_tcp import FAST, Node, bind
from tests.helpers.waiting import wait_until

SECRET = "correct horse battery staple"
IDS = ("n0", "n1", "n2")


# --- the transport ---------------------------------------------------------------------


class AuthNode(Node):
    def __init__(self, nursery, node_id, peers, auth):
        super().__init__(nursery, node_id, peers, FAST)
        self.auth = auth

    async def start(self, listeners=None):
        self.scope, self.done = trio.CancelScope(), trio.Event()

        async def runner(task_status):
            try:
                with self.scope:
                    await serve_peer_transport(self.cfg, self.id, self.peers, group="G", listeners=listeners,
                                               rng=random.Random(self.id), auth=self.auth, task_status=task_status)
            finally:
                self.done.set()
        self.t = await self.nursery.start(runner)
        return self.t


async def pair(nursery, auth0, auth1):
    listeners, ports = await bind(2)
    peers = {"n0": ("127.0.0.1", ports[0]), "n1": ("127.0.0.1", ports[1])}
    a = AuthNode(nursery, "n0", peers, auth0)
    b = AuthNode(nursery, "n1", peers, auth1)
    await a.start(listeners[0])
    await b.start(listeners[1])
    return a.t, b.t


async def test_members_with_the_secret_connect_and_talk(nursery):
    t0, t1 = await pair(nursery, PeerAuth(SECRET, "G"), PeerAuth(SECRET, "G"))
    with trio.fail_after(10):
        await t0.wait_connected()
        await t1.wait_connected()
    t0.send("n1", b"hello")
    with trio.fail_after(5):
        assert await t1.receive() == ("n0", b"hello")


@pytest.mark.parametrize("auth0, auth1, dialer_error, acceptor_rejects", [
    (PeerAuth("another secret, not ours", "G"), PeerAuth(SECRET, "G"), "does not hold", True),
    (PeerAuth(SECRET, "G"), PeerAuth("another secret, not ours", "G"), "does not hold", False),
    (PeerAuth(SECRET, "other-group"), PeerAuth(SECRET, "G"), "does not hold", True),  # keyed per group
    (None, PeerAuth(SECRET, "G"), "peer authentication required", True),
    (PeerAuth(SECRET, "G"), None, "sent no proof", False),
], ids=["dialer-wrong-secret", "acceptor-wrong-secret", "same-secret-other-group", "dialer-without",
        "acceptor-without"])
async def test_a_node_without_the_secret_never_connects(nursery, auth0, auth1, dialer_error, acceptor_rejects):
    t0, t1 = await pair(nursery, auth0, auth1)
    with trio.fail_after(10):
        await t0.wait_state(lambda st: dialer_error in (st.peers["n1"].last_error or ""))
        if acceptor_rejects:
            await t1.wait_state(lambda st: st.rejected_connections >= 1)
    await trio.testing.wait_all_tasks_blocked()  # both sides done with that attempt
    assert not t0.connected_peers() and not t1.connected_peers()


def test_secret_config_keys(tmp_path):
    base = {"dLegerGroup": "g", "dLegerPeers": "n0-127.0.0.1:1", "dLegerSelfId": "n0"}
    cfg, _ = ReplicationConfig.from_dict({**base, "dLegerPeerSecret": SECRET})
    assert cfg.peer_auth() is not None and SECRET not in repr(cfg)
    assert ReplicationConfig.from_dict(base)[0].peer_auth() is None
    (tmp_path / "secret").write_text(SECRET + "\n")
    cfg, _ = ReplicationConfig.from_dict({**base, "dLegerPeerSecretFile": str(tmp_path / "secret")})
    assert cfg.peer_secret == SECRET
    with pytest.raises(ConfigError, match="at least 16"):
        ReplicationConfig.from_dict({**base, "dLegerPeerSecret": "short"})
    with pytest.raises(ConfigError, match="cannot read"):
        ReplicationConfig.from_dict({**base, "dLegerPeerSecretFile": str(tmp_path / "missing")})


# --- three nodes and a stranger ------------------------------------------------------------


async def start_group(nursery, root, secret: str | None):
    bound = {i: await trio.open_tcp_listeners(0, host="127.0.0.1") for i in IDS}
    ports = {i: ls[0].socket.getsockname()[1] for i, ls in bound.items()}
    peers = ";".join(f"{i}-127.0.0.1:{ports[i]}" for i in IDS)
    nodes = {}
    for k, i in enumerate(IDS):
        props = {"dLegerGroup": "lmq", "dLegerPeers": peers, "dLegerSelfId": i,
                 "storePathRootDir": os.path.join(root, i)}
        if secret:
            props["dLegerPeerSecret"] = secret
        cfg, _ = ReplicationConfig.from_dict(props)
        nodes[i] = await nursery.start(lambda task_status, cfg=cfg, k=k, i=i: serve_node(
            cfg, admin_port=None, listeners=bound[i], seed=k, task_status=task_status))
    with trio.fail_after(15):
        while not any(n.replica.is_leader for n in nodes.values()):
            await trio.sleep(0.02)
    leader = next(i for i, n in nodes.items() if n.replica.is_leader)
    # Something in the log, committed everywhere.
    placed = await nodes[leader].replica.append([b"before the stranger"] * 5)
    for n in nodes.values():
        await n.replica.committed.wait_for(placed[-1][0], timeout=10)
    return nodes, ports, leader


async def read_frame(stream, decoder):
    with trio.fail_after(3):
        while (frame := decoder.next_frame()) is NEED_DATA:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                data = b""
            decoder.receive_data(data)
    return frame


async def stranger_attack(port: int, target: str, claim: str, term: int, end: int) -> list[str]:
    """Dial `target` claiming to be member `claim`, try to authenticate with
    a made-up proof, then send what would depose the leader and rewrite the
    log.  Returns what the target answered (frame kinds)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    decoder = FrameDecoder()
    seen = []
    await stream.send_all(encode_frame(Hello("lmq", claim, target, nonce=os.urandom(16).hex()).encode(),
                                       FrameKind.HELLO))
    frame = await read_frame(stream, decoder)
    seen.append("CLOSED" if frame is CLOSED else frame.kind.name)
    if frame is not CLOSED and frame.kind == FrameKind.HELLO_OK and decode_hello(frame.payload).proof:
        await stream.send_all(encode_frame(b"0" * 64, FrameKind.AUTH))  # no secret, so a guess
    attack = [
        VoteRequest(claim, target, term + 5, end + 100, term + 4, pre_vote=False, transfer=True),
        HeartbeatRequest(claim, target, term + 6, commit_index=end + 100),
        PushRequest(claim, target, term + 7, PushType.TRUNCATE, seq=1, commit_index=0, prev_index=0,
                    prev_term=term + 7),
    ]
    try:
        for msg in attack:
            await stream.send_all(encode_frame(wire.encode(msg)))
        while True:
            frame = await read_frame(stream, decoder)
            if frame is CLOSED:
                break
            seen.append(frame.kind.name)
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
        pass
    await stream.aclose()
    return seen


def snapshot(nodes):
    return {i: (n.replica.core.term, n.replica.core.leader_id, n.replica.status()["ledgerEndIndex"],
                n.replica.status()["committedIndex"]) for i, n in nodes.items()}


async def test_a_stranger_cannot_move_term_leader_or_log(tmp_path):
    async with trio.open_nursery() as nursery:
        nodes, ports, leader = await start_group(nursery, str(tmp_path), SECRET)
        before = snapshot(nodes)
        term, end = before[leader][0], before[leader][2]
        follower = next(i for i in IDS if i != leader and i != "n0")  # "n0" dials it: a valid claim
        seen = await stranger_attack(ports[follower], follower, "n0", term, end)
        assert seen[0] == "HELLO_OK" and "DATA" not in seen  # challenged, never talked to as a member
        # What the stranger sent was stepped or dropped by the time the
        # follower turned it away, and every task has run since: a moved term,
        # leader or log shows in the snapshot now.
        await wait_until(lambda: nodes[follower].transport.rejected_connections >= 1, 10,
                         "the follower turning the stranger away")
        await trio.testing.wait_all_tasks_blocked()
        assert snapshot(nodes) == before
        assert nodes[follower].transport.rejected_connections >= 1
        # The group still works: the members' own connections were never displaced.
        placed = await nodes[leader].replica.append([b"after the stranger"])
        for n in nodes.values():
            await n.replica.committed.wait_for(placed[-1][0], timeout=10)
        nursery.cancel_scope.cancel()


async def test_without_a_secret_the_same_attack_works(tmp_path):
    async with trio.open_nursery() as nursery:
        nodes, ports, leader = await start_group(nursery, str(tmp_path), None)
        before = snapshot(nodes)
        term, end = before[leader][0], before[leader][2]
        follower = next(i for i in IDS if i != leader and i != "n0")
        await stranger_attack(ports[follower], follower, "n0", term, end)
        with trio.fail_after(5):
            while nodes[follower].replica.core.term <= term:
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()


def test_proofs_bind_role_ids_and_nonces():
    auth = PeerAuth(SECRET, "G")
    nd, na = PeerAuth.new_nonce(), PeerAuth.new_nonce()
    p = auth.proof("dialer", "n0", "n1", nd, na)
    assert auth.verify(p, "dialer", "n0", "n1", nd, na)
    assert not auth.verify(p, "acceptor", "n0", "n1", nd, na)
    assert not auth.verify(p, "dialer", "n0", "n2", nd, na)
    assert not auth.verify(p, "dialer", "n0", "n1", na, nd)
    assert not auth.verify(p, "dialer", "n0", "n1", "short", na)
    assert SECRET not in repr(auth)
