# Peer messages a node must survive (commitlog/admission.py, the replica
# shell's containment), live over TCP on 127.0.0.1: a group WITHOUT a peer
# secret, two of its three members running (n1, n2; quorum 2), and a
# stranger who completes the handshake as the absent n0 (no secret, so the
# handshake is all it takes) and sends what used to end the process or move
# the group's term: a heartbeat addressed to another node, terms near and
# past 2^62, an APPEND without entries.  The node keeps running, keeps its
# term and leader, counts each drop, answers the stranger's next honest
# message, and the group goes on committing.  And, on the in-memory rig,
# a message the core raises on is dropped and the node goes on.
import os

import pytest
import trio

from commitlog.config import ReplicationConfig
from commitlog.errors import RaftSafetyError
from commitlog.node import serve_node
from commitlog.raft import wire
from commitlog.raft.core import RaftCore
from commitlog.raft.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    PushRequest,
    PushType,
    ResponseCode,
    VoteRequest,
)
from commitlog.transport.framing import CLOSED, NEED_DATA, FrameDecoder, FrameKind, Hello, encode_frame
from tests.commitlog.replicated_helpers import Cluster, body

IDS = ("n0", "n1", "n2")
RUNNING = ("n1", "n2")


async def start_without_n0(nursery, root):
    """n1 and n2 of the group n0..n2 (no secret, loopback), a leader
    elected and one entry committed on both."""
    bound = {i: await trio.open_tcp_listeners(0, host="127.0.0.1") for i in IDS}
    ports = {i: ls[0].socket.getsockname()[1] for i, ls in bound.items()}
    peers = ";".join(f"{i}-127.0.0.1:{ports[i]}" for i in IDS)
    nodes = {}
    for k, i in enumerate(RUNNING):
        cfg, _ = ReplicationConfig.from_dict({"dLegerGroup": "lmq", "dLegerPeers": peers, "dLegerSelfId": i,
                                              "storePathRootDir": os.path.join(root, i)})
        assert cfg.peer_auth() is None
        nodes[i] = await nursery.start(lambda task_status, cfg=cfg, k=k, i=i: serve_node(
            cfg, admin_port=None, listeners=bound[i], seed=k, task_status=task_status))
    with trio.fail_after(15):
        for n in nodes.values():   # an elected leader's first entry (its NOOP) committed on both
            await n.replica.committed.wait_for(0)
    leader = next(i for i, n in nodes.items() if n.replica.is_leader)
    await committed_everywhere(nodes, await nodes[leader].replica.append([b"before the stranger"]))
    return nodes, ports, leader


async def committed_everywhere(nodes, placed):
    for n in nodes.values():
        await n.replica.committed.wait_for(placed[-1][0], timeout=10)


def snapshot(nodes):
    return {i: (n.replica.core.term, n.replica.core.leader_id) for i, n in nodes.items()}


class Stranger:
    """A connection to `target` that passed the handshake as member `claim`."""

    def __init__(self, stream, claim, target):
        self.stream, self.claim, self.target = stream, claim, target
        self.decoder = FrameDecoder()

    @classmethod
    async def connect(cls, port, claim, target):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        self = cls(stream, claim, target)
        await stream.send_all(encode_frame(Hello("lmq", claim, target).encode(), FrameKind.HELLO))
        frame = await self.frame()
        assert frame is not CLOSED and frame.kind == FrameKind.HELLO_OK, frame
        return self

    async def frame(self):
        while (frame := self.decoder.next_frame()) is NEED_DATA:
            self.decoder.receive_data(await self.stream.receive_some(65536))
        return frame

    async def send(self, *msgs):
        await self.stream.send_all(b"".join(encode_frame(wire.encode(m)) for m in msgs))

    async def answer_to_stale_heartbeat(self) -> HeartbeatResponse:
        """Send a heartbeat of term 0 -- stale, so answered EXPIRED_TERM with
        the node's term -- and return that answer: proof that everything
        sent before it was read and handled (the node takes a connection's
        messages in order).  The target's own traffic to `claim` (it
        believes n0 is back) is skipped."""
        await self.send(HeartbeatRequest(self.claim, self.target, 0, -1))
        with trio.fail_after(10):
            while True:
                frame = await self.frame()
                assert frame is not CLOSED, "the node closed the connection"
                msg = wire.decode(frame.payload)
                if isinstance(msg, HeartbeatResponse):
                    return msg


async def test_a_misaddressed_heartbeat_is_dropped_and_counted(tmp_path):
    async with trio.open_nursery() as nursery:
        nodes, ports, leader = await start_without_n0(nursery, str(tmp_path))
        target = nodes[leader].replica
        before = snapshot(nodes)
        term = before[leader][0]
        stranger = await Stranger.connect(ports[leader], "n0", leader)   # n0 dials n1 and n2: a valid claim
        await stranger.send(
            HeartbeatRequest("n0", "f2", term, 0),                  # ended the process: "message for f2 stepped into"
            HeartbeatRequest("n1" if leader != "n1" else "n2", leader, term + 1, 0),   # another member's name
            PushRequest("n0", leader, term, PushType.APPEND, 1, 0, -1, -1),           # APPEND without entries
        )
        reply = await stranger.answer_to_stale_heartbeat()
        assert (reply.src, reply.dst, reply.term, reply.code) == (leader, "n0", term, ResponseCode.EXPIRED_TERM)
        assert target.stats["peer_messages_refused"] == 3
        assert target.stats["peer_messages_failed"] == 0
        assert snapshot(nodes) == before
        await committed_everywhere(nodes, await target.append([b"after the stranger"]))
        assert snapshot(nodes) == before
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("huge", [4_600_000_000_000_000_000, 2 ** 62, 2 ** 63 - 1])
async def test_huge_terms_are_refused(tmp_path, huge):
    async with trio.open_nursery() as nursery:
        nodes, ports, leader = await start_without_n0(nursery, str(tmp_path))
        follower = next(i for i in RUNNING if i != leader)
        before = snapshot(nodes)
        term = before[leader][0]
        stranger = await Stranger.connect(ports[follower], "n0", follower)
        await stranger.send(
            HeartbeatRequest("n0", follower, huge, 0),
            VoteRequest("n0", follower, huge, 10 ** 6, huge - 1, pre_vote=False, transfer=True),
            PushRequest("n0", follower, huge, PushType.TRUNCATE, 1, 0, 0, 1),
        )
        reply = await stranger.answer_to_stale_heartbeat()
        assert reply.term == term
        assert nodes[follower].replica.stats["peer_messages_refused"] == 3
        assert snapshot(nodes) == before
        await committed_everywhere(nodes, await nodes[leader].replica.append([b"after the stranger"]))
        assert max(t for t, _ in snapshot(nodes).values()) == term
        nursery.cancel_scope.cancel()


async def test_a_message_the_core_raises_on_is_dropped_and_the_node_goes_on(tmp_path, monkeypatch):
    """Whatever admission misses: a core that raises on one heartbeat (as
    it would on a forged push cutting committed entries) loses that
    message, not the process; it is rebuilt from its files and follows on."""
    step = RaftCore.step
    failed = []
    raised = trio.Event()

    def faulty_step(core, msg):
        if not failed and isinstance(msg, HeartbeatRequest) and core.node_id == "n2":
            failed.append(msg)
            raised.set()
            raise RaftSafetyError("injected: this heartbeat breaks the core")
        return step(core, msg)

    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        await cluster.start()
        leader = await cluster.wait_leader(exclude={"n2"})
        indexes = await cluster.append_many(leader, "before", 20)
        await cluster.wait_committed(indexes[-1])
        monkeypatch.setattr(RaftCore, "step", faulty_step)
        with trio.fail_after(10):
            await raised.wait()   # the shell handled it before this task runs again: no checkpoint between
        n2 = cluster["n2"].node
        assert n2.stats["peer_messages_failed"] == 1 and n2.refused is None  # not a push: no fence
        indexes = await cluster.append_many(leader, "after", 20)
        await cluster.wait_committed(indexes[-1])
        assert n2.core.leader_id == leader.node_id and n2.core.term == leader.node.core.term
        assert n2.read_committed(indexes[-1], 1)[0].body == body("after", 19)
        nursery.cancel_scope.cancel()
