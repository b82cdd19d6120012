# Owns both halves of a peer connection's handshake and the budgets that
# hold until it completes: the dialer's HELLO and its check of the answer,
# the acceptor's checks, peer authentication, and the caps on inbound
# handshakes under way.  tcp.py runs a connection only once dial() or
# accept() handed it back as a member's.
#
# Handshake: the dialer sends HELLO(group, src=self, dst=peer, identity); the
# acceptor checks it and answers HELLO_OK(group, src=self, dst=dialer,
# identity) or REJECT(reason) and closes.  The dialer checks HELLO_OK the same
# way.  Only then do DATA frames flow and the peer count as connected.  Nodes
# whose identities differ (framing.identity_mismatch: another log origin or
# segment size) never connect: the reason, naming both values, is logged on
# both sides and kept as the peer's last_error, and the dialer retries with
# backoff until an operator has fixed the store and restarted the node.
#
# Peer authentication: with a group secret (`auth`, framing.PeerAuth) the
# handshake is a challenge-response in both directions (HELLO with a nonce,
# HELLO_OK with the acceptor's nonce and proof, AUTH with the dialer's
# proof), and the acceptor reads nothing past it -- no vote, no append, no
# truncate -- until the dialer's proof verified.  A side without the secret
# fails the other's check, so a half-configured group shows up as a logged
# refusal on both ends rather than as an open door.
#
# Budgets (TransportConfig): until the handshake completes -- for a node
# with a secret, until the other end proved it -- a connection reads at
# most one small frame (handshake_max_frame_size) at a time, must finish
# within handshake_timeout, and holds one of max_handshakes slots (at most
# max_handshakes_per_address from one address; a connection finding them
# full is closed at once).  Refused inbound connections are counted and
# logged at a bounded rate: a stranger causes them at will.
import collections
import logging
import socket
from collections.abc import Callable, Mapping

import attrs
import trio

from commitlog.ratelog import LogBudget
from commitlog.transport.base import TransportConfig
from commitlog.transport.errors import CONNECTION_ERRORS, FrameError, HandshakeError
from commitlog.transport.framing import HEADER_SIZE as FRAME_HEADER_SIZE
from commitlog.transport.framing import (
    CLOSED,
    NEED_DATA,
    FrameDecoder,
    FrameKind,
    Hello,
    PeerAuth,
    decode_hello,
    decode_identity,
    decode_reject,
    encode_frame,
    encode_identity,
    identity_mismatch,
)

log = logging.getLogger(__name__)


class IdentityMismatch(HandshakeError):
    """The peer's log identity differs from ours (logged as an error)."""


class AuthFailed(HandshakeError):
    """The other end did not prove it holds the group's secret (logged as
    an error: a stranger, or a member configured without the secret)."""


# Refusals that mean a misconfigured pair rather than a network fault.
MISCONFIGURED = (IdentityMismatch, AuthFailed)


def peername(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"


def _set_nodelay(stream: trio.SocketStream) -> None:
    # trio already enables TCP_NODELAY on SocketStreams; set it explicitly
    # because Raft heartbeats and acks are small and latency-bound.
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _read_frame(stream: trio.SocketStream, decoder: FrameDecoder, chunk: int):
    while (frame := decoder.next_frame()) is NEED_DATA:
        decoder.receive_data(await stream.receive_some(chunk))
    return frame


async def _send_reject(stream: trio.SocketStream, reason: str) -> None:
    # Best effort: the other side may already be gone or be no peer at all.
    with trio.move_on_after(0.2):
        try:
            await stream.send_all(encode_frame(reason.encode("utf-8")[:4096], FrameKind.REJECT))
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass


@attrs.define(eq=False, kw_only=True)
class Handshake:
    """One node's side of every handshake: who it is, the identity it
    compares, the group's secret (if any), and what the inbound caps hold
    and refused.  accept() takes the transport's peer table (id -> a peer
    with .dials and .counters)."""

    cfg: TransportConfig
    self_id: str
    group: str
    identity: dict[str, str]
    auth: PeerAuth | None
    log_budget: LogBudget        # the transport's: lines strangers can cause
    notify: Callable[[], None]   # the transport's state changed (wait_state re-checks)
    rejected: int = 0            # inbound connections refused before or at the handshake
    capped: int = 0              # inbound connections closed at once, the caps being full
    under_way: collections.Counter = attrs.Factory(collections.Counter)  # remote address -> handshakes
    identity_text: str = attrs.field(
        init=False, default=attrs.Factory(lambda self: encode_identity(self.identity), takes_self=True))

    @property
    def handshakes(self) -> int:
        return sum(self.under_way.values())

    @property
    def _max_frame(self) -> int:
        return min(self.cfg.handshake_max_frame_size, self.cfg.max_frame_size)

    @property
    def _chunk(self) -> int:
        # Reads before the handshake completes take no more than one
        # handshake frame's worth at a time.
        return min(self.cfg.recv_chunk_bytes, self._max_frame + FRAME_HEADER_SIZE)

    # --- dialing -----------------------------------------------------------

    async def dial(self, peer_id: str, addr: tuple[str, int]):
        """Connect to `peer_id` at `addr` and complete the dialer's half:
        (stream, decoder now taking frames of any allowed size, remote
        address).  Raises HandshakeError (IdentityMismatch, AuthFailed),
        FrameError, OSError or trio.TooSlowError, the stream closed."""
        host, port = addr
        with trio.fail_after(self.cfg.connect_timeout):
            stream = await trio.open_tcp_stream(host, port)
        try:
            _set_nodelay(stream)
            remote = peername(stream)
            decoder = FrameDecoder(self._max_frame)
            nonce = PeerAuth.new_nonce() if self.auth is not None else ""
            hello = Hello(self.group, self.self_id, peer_id, self.identity_text, nonce=nonce)
            await stream.send_all(encode_frame(hello.encode(), FrameKind.HELLO))
            with trio.fail_after(self.cfg.handshake_timeout):
                frame = await _read_frame(stream, decoder, self._chunk)
            if frame is CLOSED:
                raise HandshakeError(f"{peer_id} closed the connection during the handshake")
            if frame.kind == FrameKind.REJECT:
                reason = decode_reject(frame.payload)
                error = (IdentityMismatch if reason.startswith("log identity differs") else
                         AuthFailed if reason.startswith("peer authentication") else HandshakeError)
                raise error(f"rejected by {peer_id}: {reason}")
            if frame.kind != FrameKind.HELLO_OK:
                raise HandshakeError(f"expected HELLO_OK from {peer_id}, got {frame.kind.name}")
            reply = decode_hello(frame.payload)
            expected = Hello(self.group, peer_id, self.self_id)
            if attrs.evolve(reply, identity="", nonce="", proof="") != expected:
                raise HandshakeError(f"{host}:{port} answered as {reply}, expected {expected}")
            if self.auth is not None:
                # The acceptor proves itself first; only a member gets our proof.
                if not reply.proof:
                    raise AuthFailed(f"peer authentication: {peer_id} sent no proof "
                                     f"(is dLegerPeerSecret set on it?)")
                if not self.auth.verify(reply.proof, "acceptor", self.self_id, peer_id, nonce, reply.nonce):
                    raise AuthFailed(f"peer authentication failed: {peer_id} at {host}:{port} does not "
                                     f"hold this group's dLegerPeerSecret")
                proof = self.auth.proof("dialer", self.self_id, peer_id, nonce, reply.nonce)
                await stream.send_all(encode_frame(proof.encode(), FrameKind.AUTH))
            mismatch = identity_mismatch(self.self_id, self.identity, peer_id, decode_identity(reply.identity))
            if mismatch is not None:
                raise IdentityMismatch(mismatch)
            decoder.max_frame_size = self.cfg.max_frame_size  # a member now: DATA frames of any allowed size
            return stream, decoder, remote
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise

    # --- accepting -----------------------------------------------------------

    async def accept(self, stream: trio.SocketStream, remote: str,
                     peers: Mapping) -> tuple[Hello, FrameDecoder] | None:
        """The acceptor's handshake inside its budgets: a slot among
        max_handshakes (and max_handshakes_per_address), small frames, the
        handshake timeout.  The dialer's Hello and the decoder (now taking
        frames of any allowed size) once it is a member, else None (the
        connection was refused, with a REJECT where one is due)."""
        cfg = self.cfg
        address = remote.rpartition(":")[0]
        under_way = self.under_way
        if sum(under_way.values()) >= cfg.max_handshakes or under_way[address] >= cfg.max_handshakes_per_address:
            self.capped += 1
            self.log_budget.log(log, logging.WARNING, trio.current_time(),
                                "%s: refused inbound connection from %s at once: %d handshakes under way, %d "
                                "from that address (caps %d, %d per address)", self.self_id, remote,
                                sum(under_way.values()), under_way[address], cfg.max_handshakes,
                                cfg.max_handshakes_per_address)
            self.notify()
            return None
        under_way[address] += 1
        self.notify()
        try:
            return await self._inbound(stream, remote, peers)
        finally:
            under_way[address] -= 1
            if not under_way[address]:
                del under_way[address]
            self.notify()

    async def _inbound(self, stream: trio.SocketStream, remote: str,
                       peers: Mapping) -> tuple[Hello, FrameDecoder] | None:
        _set_nodelay(stream)
        decoder = FrameDecoder(self._max_frame)
        try:
            with trio.fail_after(self.cfg.handshake_timeout):
                frame = await _read_frame(stream, decoder, self._chunk)
                if frame is CLOSED:
                    raise HandshakeError("closed before the handshake")
                if frame.kind != FrameKind.HELLO:
                    raise HandshakeError(f"expected HELLO, got {frame.kind.name}")
                hello = decode_hello(frame.payload)
                # With a secret, nothing the dialer claims (its log
                # identity included) is believed before it proved itself.
                reason = self._check_hello(hello, peers, identity=self.auth is None)
                if reason is None and self.auth is not None:
                    await self._authenticate(stream, decoder, hello)
                    reason = self._check_hello(hello, peers)
                if reason is not None:
                    if reason.startswith("log identity differs"):
                        peers[hello.src].counters.last_error = reason
                        raise IdentityMismatch(reason)
                    raise HandshakeError(reason)
                if self.auth is None:
                    reply = Hello(self.group, self.self_id, hello.src, self.identity_text)
                    await stream.send_all(encode_frame(reply.encode(), FrameKind.HELLO_OK))
        except CONNECTION_ERRORS as exc:
            self.rejected += 1
            if isinstance(exc, FrameError):
                reason = f"bad frame: {exc}"
            elif isinstance(exc, trio.TooSlowError):
                reason = f"no handshake within {self.cfg.handshake_timeout} s"
            else:
                reason = str(exc) or type(exc).__name__
            level = logging.ERROR if isinstance(exc, MISCONFIGURED) else logging.WARNING
            self.log_budget.log(log, level, trio.current_time(), "%s: rejected inbound connection from %s: %s",
                                self.self_id, remote, reason)
            await _send_reject(stream, reason)
            return None
        decoder.max_frame_size = self.cfg.max_frame_size  # a member now: DATA frames of any allowed size
        return hello, decoder

    def _check_hello(self, hello: Hello, peers: Mapping, identity: bool = True) -> str | None:
        if hello.group != self.group:
            return f"wrong group {hello.group!r} (this node is in group {self.group!r})"
        if hello.dst != self.self_id:
            return f"hello addressed to {hello.dst!r} but this node is {self.self_id!r}"
        if hello.src not in peers:
            return f"unknown peer {hello.src!r} (not in this node's peers)"
        if peers[hello.src].dials:  # we are the lower id: we dial it, not it us
            return (f"{hello.src!r} must not dial {self.self_id!r}: "
                    f"the peer with the lower id dials")
        if not identity:
            return None
        return identity_mismatch(self.self_id, self.identity, hello.src, decode_identity(hello.identity))

    async def _authenticate(self, stream, decoder: FrameDecoder, hello: Hello) -> None:
        """The acceptor's half of the challenge-response (HandshakeError,
        AuthFailed); runs inside the handshake timeout."""
        if not hello.nonce:
            raise AuthFailed(f"peer authentication required: {hello.src!r} sent no proof "
                             f"(is dLegerPeerSecret set on it?)")
        nonce = PeerAuth.new_nonce()
        proof = self.auth.proof("acceptor", hello.src, self.self_id, hello.nonce, nonce)
        reply = Hello(self.group, self.self_id, hello.src, self.identity_text, nonce=nonce, proof=proof)
        await stream.send_all(encode_frame(reply.encode(), FrameKind.HELLO_OK))
        frame = await _read_frame(stream, decoder, self._chunk)
        if frame is CLOSED:
            raise HandshakeError("closed during peer authentication")
        if frame.kind != FrameKind.AUTH:
            raise AuthFailed(f"peer authentication required: expected AUTH from {hello.src!r}, "
                             f"got {frame.kind.name}")
        given = frame.payload.decode("utf-8", "replace")
        if not self.auth.verify(given, "dialer", hello.src, self.self_id, hello.nonce, nonce):
            raise AuthFailed(f"peer authentication failed: the dialer claiming to be {hello.src!r} does not "
                             f"hold this group's dLegerPeerSecret")
