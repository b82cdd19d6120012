# Owns the peer-to-peer message transport of the Raft group: opaque bytes
# between peer ids, over TCP (tcp.py, with the handshake in handshake.py,
# the receive budget in recvbudget.py and the sans-IO framing in
# framing.py) or over a simulated network with fault injection (memory.py).
# Both expose the base.Transport API, so the node shell and the simulation
# tests drive Raft the same way.
from commitlog.transport.base import PeerStats, Transport, TransportConfig, TransportStats, backoff_delay
from commitlog.transport.errors import FrameError, HandshakeError, TransportError, UnknownPeerError
from commitlog.transport.framing import (
                                      CLOSED,
                                      DEFAULT_MAX_FRAME_SIZE,
                                      NEED_DATA,
                                      Frame,
                                      FrameDecoder,
                                      FrameKind,
                                      Hello,
                                      encode_frame,
)
from commitlog.transport.memory import LinkFaults, MemoryNetwork, MemoryTransport
from commitlog.transport.tcp import PeerTransport, open_peer_transport, serve_peer_transport

__all__ = [
    "CLOSED", "DEFAULT_MAX_FRAME_SIZE", "NEED_DATA", "Frame", "FrameDecoder", "FrameError",
    "FrameKind", "HandshakeError", "Hello", "LinkFaults", "MemoryNetwork", "MemoryTransport",
    "PeerStats", "PeerTransport", "Transport", "TransportConfig", "TransportError",
    "TransportStats", "UnknownPeerError", "backoff_delay", "encode_frame", "open_peer_transport",
    "serve_peer_transport",
]
