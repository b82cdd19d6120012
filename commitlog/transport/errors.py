# Owns the typed errors of the peer transport.  A FrameError or HandshakeError
# is about one connection: the transport logs it, closes that connection and
# keeps running, so none of these ever escape a running transport's tasks.
# UnknownPeerError is a caller bug (sending to an id that is not a peer) and is
# raised straight out of send().  CONNECTION_ERRORS is what a dying
# connection raises (these and the network's own errors).
import attrs
import trio

from commitlog.errors import CommitLogError


class TransportError(CommitLogError):
    """Base of every error the transport raises on purpose."""


class FrameError(TransportError):
    """Bytes on a connection that are not a well-formed frame (bad magic,
    unsupported version, unknown kind, oversized length, truncated stream,
    malformed handshake payload).  The connection cannot be resynchronised:
    a length-prefixed stream has no frame boundaries to hunt for, so the only
    recovery is to close it."""


class HandshakeError(TransportError):
    """The peer at the other end is not who this node expects (wrong group,
    unknown id, wrong dialing direction) or rejected this node."""


@attrs.define(str=False)
class UnknownPeerError(TransportError):
    peer_id: str
    known: tuple[str, ...]

    def __str__(self) -> str:
        return f"unknown peer {self.peer_id!r} (peers: {', '.join(self.known) or 'none'})"


# What a dying connection raises.  Anything else (a bug, or bytes nothing
# expected) ends that connection too, logged with its traceback.
CONNECTION_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError,
                     FrameError, HandshakeError, trio.TooSlowError)
