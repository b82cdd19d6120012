# Owns the Raft shell's inbox of peer messages: the transport's readers hand
# each received payload to deliver() (the transport's sink), which decodes
# it, passes it through admission.py (sent by the peer the connection
# handshook with, to this node, terms and indexes in range, a sane shape)
# and queues it for the driver, which takes the whole queue once per round.
# What does not decode or is not admitted is dropped, counted in the node's
# stats (peer_messages_undecodable, peer_messages_refused) and logged at a
# bounded rate; deliver() never raises on a peer's bytes.  Once
# max_messages wait, deliver() answers with one Event for every reader, set
# when the driver takes the queue: the readers wait on it and TCP pushes
# back on the senders.
import collections
import logging
from collections.abc import Callable

import attrs
import trio

from commitlog.admission import refusal
from commitlog.raft import wire
from commitlog.raft.core import RaftCore
from commitlog.raft.state import Role
from commitlog.ratelog import LogBudget

log = logging.getLogger("ledgermq.replica")


@attrs.define(eq=False, kw_only=True)
class PeerInbox:
    """Admitted peer messages waiting for the driver, oldest first."""

    core: Callable[[], RaftCore]   # the node's core now (the shell rebuilds it after a failure)
    wake: Callable[[], None]       # wakes the driver
    stats: collections.Counter     # the node's
    log_budget: LogBudget          # the node's lines about what peers sent
    max_messages: int = 1024       # then readers wait
    _messages: list = attrs.Factory(list)
    _room: trio.Event | None = None

    def __len__(self) -> int:
        return len(self._messages)

    def deliver(self, src: str, payload: bytes) -> trio.Event | None:
        """Decode, admit (`src` is the peer the connection handshook with)
        and queue for the driver; returns an Event to wait for while the
        inbox is full.  Never raises on a peer's bytes: what does not
        decode or is not admitted is dropped, counted and logged at a
        bounded rate."""
        try:
            msg = wire.decode(payload)
        except Exception as exc:  # WireError, or anything else the bytes provoke
            self._drop("peer_messages_undecodable", "%s: dropping an undecodable message from %s: %s",
                       self.core().node_id, src, exc)
            return None
        core = self.core()
        reason = refusal(msg, src, core.node_id, core.term,
                         core.log.end_index if core.role is Role.LEADER else None)
        if reason is not None:
            self._drop("peer_messages_refused", "%s: dropping %s from %s: %s", core.node_id,
                       type(msg).__name__, src, reason)
            return None
        self._messages.append(msg)
        self.wake()
        if len(self._messages) < self.max_messages:
            return None
        if self._room is None:
            self._room = trio.Event()
        return self._room

    def take(self) -> list:
        """Every message waiting, oldest first; readers waiting for room
        read on."""
        messages, self._messages = self._messages, []
        if self._room is not None:
            self._room.set()
            self._room = None
        return messages

    def _drop(self, stat: str, msg: str, *args) -> None:
        self.stats[stat] += 1
        self.log_budget.log(log, logging.WARNING, trio.current_time(), msg, *args)
