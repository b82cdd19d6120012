# Owns the hand-over of writes a broker of the group cannot store itself right
# now: a master that just stepped down (a transfer, a lost election), a leader
# still catching up or in the middle of a transfer.  Clients learn the new master from the name server
# seconds later (a Java client polls every 30 s), and RocketMQ clients retry
# a refused send to the same broker group within milliseconds, so without
# this a planned transfer failed sends that an unplanned crash did not.
#
# Rules it keeps:
#   - Only within `sendForwardWindowMillis` after this broker was last the
#     writable master (or while it is the leader: catching up, transferring).
#     Outside it a slave refuses writes as it always did.
#   - A write waits (parked on the gate's generation and the commit
#     watermark, no polling) at most `sendForwardHoldMillis` for a master it
#     can reach: this node writable again (it is then served here), or a
#     known leader whose broker address the replicated metadata announces
#     (the request is then sent there unchanged and its answer relayed).
#   - A handed-on request carries FORWARDED_WRITE: the receiving broker may
#     hold it but never hands it on again (no loops between two brokers
#     that each think the other leads).  A client that sets the bit itself
#     only loses the hand-over.
#   - At most `sendForwardMaxInFlight` writes are held or being handed on at
#     once; past it, and past the hold time, the write is refused as without it.
#   - The request goes over a connection of its own client, with the
#     original signature and body: the master authorizes it (ACL) and stores
#     it exactly as if the producer had sent it (its storeHost in the msgId,
#     so ids stay valid after this node leaves).  The record's bornHost is
#     then this broker's address (the one thing that differs).
#   - Only requests that never reached the log are handed on (the caller's
#     refusal says so: not leader, transferring); an append already written
#     waits in the replica for Raft to decide it, and is never sent twice.
import logging
import typing
from collections import Counter

import attrs
import trio

from broker.config import LiveConfig
from broker.remoting.client import RemotingClient
from broker.remoting.codes import FORWARDED_WRITE
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RemotingError
from broker.store.gate import RoleGate
from commitlog.errors import LeaderTransferringError, NotLeaderError
from commitlog.ratelog import LogBudget
from commitlog.replica import ReplicaNode

log = logging.getLogger("ledgermq.forward")

# Refusals whose request is known never to have reached the log (the
# replica fails a written append only with TermChangedError, QuorumTimeoutError
# or on shutdown; none of those is handed on: it may still commit).
UNSTORED = (NotLeaderError, LeaderTransferringError)

Serve = typing.Callable[[], typing.Awaitable[RemotingCommand]]


@attrs.define(eq=False)
class WriteForwarder:
    config: LiveConfig
    gate: RoleGate
    replica: ReplicaNode
    client: RemotingClient | None = None  # the composition root sets it (a nursery owns its connections)
    held: int = 0  # writes held or being handed on now
    stats: Counter = attrs.Factory(Counter)  # outcome -> count (forwarded, served_here, refused_*, ...)
    _log_budget: LogBudget = attrs.Factory(lambda: LogBudget(lines=5, window=10.0))

    # --- the broker's view -----------------------------------------------------

    @property
    def window(self) -> float:
        return self.config.current.send_forward_window_ms / 1000

    def in_window(self) -> bool:
        """Whether a write this node cannot store may still be handed on."""
        if self.window <= 0:
            return False
        if self.replica.is_leader or self.gate.writable:
            return True
        return trio.current_time() < self.gate.closed_at + self.window

    def eligible(self, request, exc: BaseException) -> bool:
        return (isinstance(exc, UNSTORED) and not request.flag & FORWARDED_WRITE and self.client is not None
                and self.in_window())

    # --- the one entry point ---------------------------------------------------

    async def take_over(self, request: RemotingCommand, serve_here: Serve) -> RemotingCommand | None:
        """The answer to `request`, which this node could not store: served
        here once this node is the writable master again, or the master's
        answer to it; None when neither happens within the hold time (the
        caller then refuses it as before)."""
        cfg = self.config.current
        if self.held >= cfg.send_forward_max_in_flight:
            self.stats["refused_budget"] += 1
            return None
        self.held += 1
        try:
            return await self._take_over(request, serve_here, trio.current_time() + cfg.send_forward_hold_ms / 1000)
        finally:
            self.held -= 1

    async def _take_over(self, request, serve_here: Serve, deadline: float) -> RemotingCommand | None:
        forwarded = bool(request.flag & FORWARDED_WRITE)
        while True:
            if self.gate.writable and self.replica.is_leader and self.replica.transferring_to is None:
                self.stats["served_here"] += 1
                return await serve_here()
            target = None if forwarded else self._master_addr()
            if target is not None:
                return await self._forward(target, request, deadline)
            if not self._may_learn_master():
                self.stats["refused_no_master"] += 1
                return None
            if trio.current_time() >= deadline:
                self.stats["refused_hold_timeout"] += 1
                leader = self.replica.core.leader_id
                self._log_budget.log(log, logging.WARNING, trio.current_time(),
                                     "held a send (code %d) %d ms for a master and found none (leader %s, its "
                                     "broker address %s); refused", request.code,
                                     self.config.current.send_forward_hold_ms, leader or "unknown",
                                     self.gate.leader_broker_addr(leader) or "unknown")
                return None
            generation, commit = self.gate.generation.value, self.replica.committed.value
            with trio.move_on_at(deadline):
                async with trio.open_nursery() as waits:  # whichever changes first
                    async def changed(mark, seen):
                        await mark.wait_changed(seen)
                        waits.cancel_scope.cancel()
                    waits.start_soon(changed, self.gate.generation, generation)
                    waits.start_soon(changed, self.replica.committed, commit)

    def _may_learn_master(self) -> bool:
        """Whether waiting can make a master reachable: a member of the
        group may yet learn the leader (the next election, the log that
        announces its broker address); a node removed from the group
        learns nothing more, so its sends are refused at once (the
        refusal sends the client to the name server)."""
        core = self.replica.core
        latest = core.membership.latest
        return latest.empty or latest.is_member(self.replica.node_id)

    def _master_addr(self) -> str | None:
        """The current leader's broker address, when it is another node."""
        leader = self.replica.core.leader_id
        if not leader or leader == self.replica.node_id:
            return None
        addr = self.gate.leader_broker_addr(leader)
        return addr if addr and addr != self.gate.own_broker_addr else None

    async def _forward(self, target: str, request: RemotingCommand, deadline: float) -> RemotingCommand | None:
        timeout = max(0.5, deadline - trio.current_time()) + 3.0  # the master's own send time on top
        outgoing = request.as_request(0, request.is_oneway)
        outgoing = RemotingCommand.trusted(outgoing.code, outgoing.language, outgoing.version, 0,
                                           outgoing.flag | FORWARDED_WRITE, outgoing.remark,
                                           outgoing.ext_fields, outgoing.body, outgoing.serialize_type)
        try:
            if request.is_oneway:
                await self.client.invoke_oneway(target, outgoing, timeout)
                self.stats["forwarded"] += 1
                return None
            answer = await self.client.invoke(target, outgoing, timeout)
        except RemotingError as exc:
            self.stats["forward_failed"] += 1
            self._log_budget.log(log, logging.WARNING, trio.current_time(),
                                 "could not hand a write (code %d) on to the master at %s: %s", request.code, target,
                                 exc)
            return None
        self.stats["forwarded"] += 1
        return answer.as_response_to(request)
