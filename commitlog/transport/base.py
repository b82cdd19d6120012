# Owns what the TCP and in-memory transports share: the tuning knobs, the
# statistics the admin port shows, the reconnect backoff rule and the
# Transport protocol the node shell programs against.  Both transports move
# opaque bytes between peer ids; neither knows what a Raft message is.
import random
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Protocol

import attrs
import trio

from commitlog.transport.framing import DEFAULT_MAX_FRAME_SIZE


def _positive(inst, attribute, value) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value!r}")


@attrs.frozen
class TransportConfig:
    """Send semantics: send() never blocks.  Each peer has a bounded queue
    (send_queue_messages AND send_queue_bytes; a message is always accepted
    into an empty queue so any frame up to max_frame_size can travel).  When
    the queue is full send() drops the NEW message, counts it in
    dropped_full and returns False -- the caller learns synchronously that the
    message was not queued (Raft retransmits on its own timers).  Messages
    queued longer than max_queue_age (peer down, link stalled) are discarded
    unsent and counted in dropped_stale: a Raft message that old is useless
    and flushing a backlog of them after a reconnect only delays fresh ones."""

    max_frame_size: int = attrs.field(default=DEFAULT_MAX_FRAME_SIZE, validator=_positive)
    send_queue_messages: int = attrs.field(default=1024, validator=_positive)
    send_queue_bytes: int = attrs.field(default=64 * 1024 * 1024, validator=_positive)
    max_queue_age: float = attrs.field(default=2.0, validator=_positive)
    # Received messages waiting for receive(); when full, readers stop
    # reading and TCP flow control pushes back on the senders.
    recv_queue_messages: int = attrs.field(default=1024, validator=_positive)
    # One send_all() carries queued frames up to this many bytes; payloads
    # above join_limit are written on their own instead of being copied into
    # the joined buffer.
    write_batch_bytes: int = attrs.field(default=1024 * 1024, validator=_positive)
    join_limit: int = attrs.field(default=64 * 1024, validator=_positive)
    recv_chunk_bytes: int = attrs.field(default=256 * 1024, validator=_positive)
    connect_timeout: float = attrs.field(default=1.0, validator=_positive)
    handshake_timeout: float = attrs.field(default=1.0, validator=_positive)
    # Budgets against strangers (handshake.py): before the handshake
    # completes a frame (HELLO, HELLO_OK, AUTH, REJECT) carries at most
    # handshake_max_frame_size bytes, on both ends; at most max_handshakes
    # inbound connections are in their handshake at once, and
    # max_handshakes_per_address from one address (the rest are closed at
    # once).  Established connections are one per member pair.
    handshake_max_frame_size: int = attrs.field(default=8 * 1024, validator=_positive)
    max_handshakes: int = attrs.field(default=64, validator=_positive)
    max_handshakes_per_address: int = attrs.field(default=16, validator=_positive)
    # After the handshake (recvbudget.py): bytes of DATA frames begun and
    # not finished, across all connections (a reader waits for room before
    # it reads on a frame that does not fit, and TCP pushes back on its
    # sender; at least max_frame_size, so that any allowed frame fits), and
    # how long one such frame may take to arrive before its connection is
    # closed.
    recv_budget_bytes: int = attrs.field(
        default=attrs.Factory(lambda self: self.max_frame_size, takes_self=True), validator=_positive)
    frame_read_timeout: float = attrs.field(default=30.0, validator=_positive)
    # Reconnect delay: min(backoff_max, backoff_initial * 2**attempt) scaled by
    # a uniform [0.5, 1) jitter so peers restarted together do not redial in
    # lockstep.  A connection that lived backoff_reset_after seconds resets
    # the attempt count; one that dies right after its handshake does not, so
    # a peer that keeps dropping us is not redialled in a tight loop.
    backoff_initial: float = attrs.field(default=0.05, validator=_positive)
    backoff_max: float = attrs.field(default=1.0, validator=_positive)
    backoff_reset_after: float = attrs.field(default=1.0, validator=_positive)

    def __attrs_post_init__(self) -> None:
        if self.max_frame_size > 0xFFFFFFFF:
            raise ValueError("max_frame_size must fit the u32 length field")
        if self.backoff_initial > self.backoff_max:
            raise ValueError("backoff_initial must be <= backoff_max")
        if self.recv_budget_bytes < self.max_frame_size:
            raise ValueError("recv_budget_bytes must be >= max_frame_size (a frame of any allowed size must fit)")


def backoff_delay(cfg: TransportConfig, attempt: int, rng: random.Random) -> float:
    """Seconds to wait before reconnect attempt number `attempt` (0-based)."""
    base = min(cfg.backoff_max, cfg.backoff_initial * 2.0 ** min(attempt, 62))
    return base * rng.uniform(0.5, 1.0)


@attrs.frozen(kw_only=True)
class PeerStats:
    """One peer's counters as seen from this node.  Bytes count payloads
    only (not the 8-byte frame headers).  `writes` is the number of
    send_all() calls (TCP only), so sent_frames / writes is the batching
    factor.  dropped_fault, duplicated and reordered are injected by the
    memory transport and stay 0 on TCP."""

    peer_id: str
    connected: bool = False
    queued_messages: int = 0
    queued_bytes: int = 0
    sent_frames: int = 0
    sent_bytes: int = 0
    writes: int = 0
    received_frames: int = 0
    received_bytes: int = 0
    connects: int = 0
    disconnects: int = 0
    dropped_full: int = 0
    dropped_stale: int = 0
    dropped_fault: int = 0
    duplicated: int = 0
    reordered: int = 0
    bad_frames: int = 0
    failures: int = 0  # connections ended by an unexpected error (logged with its traceback)
    last_error: str | None = None

    @property
    def reconnects(self) -> int:
        return max(0, self.connects - 1)


@attrs.frozen(kw_only=True)
class TransportStats:
    self_id: str
    peers: dict[str, PeerStats]
    # Inbound connections closed before or at the handshake: garbage, wrong
    # group, unknown peer id, wrong dialing direction, handshake timeout,
    # a failed proof, an oversized handshake frame.
    rejected_connections: int = 0
    # Inbound connections closed at once because max_handshakes (or the
    # per-address cap) were under way.
    capped_connections: int = 0
    # Connections (inbound or dialled) ended by an unexpected error, each
    # logged with its traceback; the transport itself keeps running.
    failed_connections: int = 0
    handshakes: int = 0          # inbound handshakes under way now
    unfinished_bytes: int = 0    # recv_budget_bytes taken now by frames being read
    budget_waits: int = 0        # times a reader waited for room in recv_budget_bytes


@attrs.define
class Counters:
    """The mutable twin of PeerStats that the transports update in place."""

    sent_frames: int = 0
    sent_bytes: int = 0
    writes: int = 0
    received_frames: int = 0
    received_bytes: int = 0
    connects: int = 0
    disconnects: int = 0
    dropped_full: int = 0
    dropped_stale: int = 0
    dropped_fault: int = 0
    duplicated: int = 0
    reordered: int = 0
    bad_frames: int = 0
    failures: int = 0
    last_error: str | None = None

    def snapshot(self, peer_id: str, *, connected: bool, queued_messages: int = 0,
                 queued_bytes: int = 0) -> PeerStats:
        return PeerStats(peer_id=peer_id, connected=connected, queued_messages=queued_messages,
                         queued_bytes=queued_bytes,
                         **attrs.asdict(self))


# The consumer of received messages when it takes them directly (set_sink).
Sink = Callable[[str, bytes], "trio.Event | None"]


class Transport(Protocol):
    """What the node shell needs from a transport (TCP or in-memory)."""

    self_id: str
    group: str
    # What the handshake compares (handshake.py); {} where nothing is compared.
    identity: dict[str, str]

    def send(self, peer_id: str, payload: bytes) -> bool:
        """Queue `payload` for `peer_id` without blocking (a tuple of bytes-like
        pieces is one payload, their concatenation, which the transport may
        write piece by piece instead of joining).  True if queued
        (delivery is still not guaranteed), False if dropped because the
        peer's queue is full or the transport is closed.  Raises
        UnknownPeerError for an id that is not a peer, FrameError for a
        payload above max_frame_size."""

    async def receive(self) -> tuple[str, bytes]:
        """The next (sender id, payload).  Raises trio.EndOfChannel once the
        transport has shut down."""

    def incoming(self) -> AsyncIterator[tuple[str, bytes]]:
        """receive() as an async iterator that ends when the transport does."""

    def set_sink(self, sink: "Sink") -> None:
        """From now on hand every received message to sink(src, payload),
        called by the task that read it, instead of queueing it for
        receive(): one hop less between the wire and its consumer.  The
        sink returns None, or an Event the reader waits for before it reads
        on (the consumer's backlog is full: TCP flow control then pushes
        back on the sender).  Messages already queued go to the sink at once
        (ignoring what it returns: they were read already)."""

    def connected_peers(self) -> frozenset[str]: ...

    async def wait_connected(self, peers: Iterable[str] | None = None) -> None:
        """Return once every peer in `peers` (default: all) is connected."""

    async def wait_state(self, predicate: Callable[[TransportStats], bool]) -> TransportStats:
        """Wait until predicate(stats()) holds, re-checked on connectivity
        changes only (connect, disconnect, failed dial, partition...)."""

    def stats(self) -> TransportStats: ...
