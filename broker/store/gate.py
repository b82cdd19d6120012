# Owns the broker's role gate (RocketMQ's DLedgerRoleChangeHandler): whether
# this broker accepts writes, and the brokerId it registers under.
#
#   follower/candidate  closed; brokerId = the member's slave id (never 0)
#   leader, catching up closed; still the slave id, until (1) the ledger end as
#                       of election (earlier terms plus this term's NOOP) is
#                       committed, (2) dispatched and (3) applied by the
#                       metadata tables (MetadataService.leader_barrier); then
#                       it rebuilds the topic-queue offsets and installs the
#                       append hook (ConsumeQueueService.become_leader), runs
#                       before_open (a migrated store's one-time import) and
#                       announces brokerIP1:listenPort through the metadata
#                       unless the tables already hold it
#   leader, writable    open; brokerId 0 (master).
#
# Rules.  Losing leadership closes the gate at once (on_role_change runs in
# the replica's driver, synchronously, so no append of the new role is stamped
# by a stale offset table) and cancels a catch-up; a follower dispatches in
# pauses, which becoming leader cuts short (_hurry: the catch-up waits on
# dispatch).  A follower applies metadata at once: a deposed master hands
# writes on to the leader whose address the tables announce.  Each change bumps
# `generation` (a Watermark) so the registration re-registers promptly.  The
# gate is the one place that knows "may this broker write now": every write
# path calls check_writable() first, and it is the metadata service's
# write_gate.  Its own writes come after the hook is installed (a record
# appended without it would carry no queue offset).  NotWritableError names
# the leader's broker address from the announcements (the DLedger peer
# address only as a fallback).  A writable gate also asks the disk guard
# (diskguard.py): at diskMaxUsedSpaceRatio or out of reserve every write is
# refused with DiskFullError while reads and replication go on.
import logging
import math
from collections.abc import Awaitable, Callable

import attrs
import trio

from broker.config import broker_id_for
from broker.metadata.service import MetadataService
from broker.store.diskguard import DiskGuard
from commitlog.errors import CommitLogError, NotLeaderError
from commitlog.raft.state import Role, SoftState
from commitlog.replica import ReplicaNode
from commitlog.watermark import Watermark
from consumequeue.service import ConsumeQueueService

log = logging.getLogger("ledgermq.roles")


@attrs.define(str=False)
class NotWritableError(NotLeaderError):
    """This broker does not accept writes: not the leader, or a leader still
    catching up (leader_id is then this node, leader_addr None).
    broker_addr: the leader's broker address, when known."""

    catching_up: bool = False
    broker_addr: str | None = None

    def __str__(self) -> str:
        if self.catching_up:
            return "this broker was just elected leader and is still catching up (dispatch, metadata)"
        return f"not the DLedger leader (master); {describe_leader(self.leader_id, self.leader_addr, self.broker_addr)}"


def describe_leader(leader_id: str | None, peer_addr: str | None, broker_addr: str | None) -> str:
    """"the master is n1 at 127.0.0.1:10912" (the broker address), or the
    DLedger peer address while the broker address is not known."""
    if not leader_id:
        return "no leader is known"
    if broker_addr:
        return f"the master is {leader_id} at {broker_addr}"
    return f"the leader is {leader_id} (DLedger peer {peer_addr}; its broker address is not known yet)"


@attrs.define(eq=False)
class RoleGate:
    replica: ReplicaNode
    cq: ConsumeQueueService
    metadata: MetadataService | None = None  # None: a log without metadata (tests)
    peer_ids: tuple[str, ...] | None = None
    # Awaited after the metadata barrier and the append hook's install,
    # before writes open (a migrated store's one-time import of its old
    # config tables).
    before_open: Callable[[], Awaitable[object]] | None = None
    disk: DiskGuard | None = None  # None: no disk-space rule (tests of the role logic)

    generation: Watermark = attrs.Factory(lambda: Watermark(0))
    # trio time writes last closed on losing leadership (-inf: never); the
    # send forwarder's window starts here (broker/processors/forward.py).
    closed_at: float = attrs.field(default=-math.inf, init=False)
    role: Role = attrs.field(default=Role.FOLLOWER, init=False)
    term: int = attrs.field(default=0, init=False)
    _writable: bool = attrs.field(default=False, init=False)
    _pending_term: int | None = attrs.field(default=None, init=False)
    _catch_up: trio.CancelScope | None = attrs.field(default=None, init=False)
    _wakeup: trio.Event = attrs.Factory(trio.Event)
    _opened: trio.Event = attrs.Factory(trio.Event)

    def __attrs_post_init__(self) -> None:
        ss = self.replica.soft_state
        if ss is not None:
            self.role, self.term = ss.role, ss.term
        if self.metadata is not None:
            self.metadata.write_gate = self  # metadata writes pass this gate too

    # --- what the broker reads -------------------------------------------------

    @property
    def writable(self) -> bool:
        return self._writable

    @property
    def broker_id(self) -> int:
        return broker_id_for(Role.LEADER if self._writable else Role.FOLLOWER, self.replica.node_id, self.peer_ids)

    @property
    def catching_up(self) -> bool:
        return self.role is Role.LEADER and not self._writable

    def check_writable(self) -> None:
        """Raise NotWritableError (a NotLeaderError naming the leader) unless
        writes are accepted right now, or DiskFullError when the master's
        disk has no room for them."""
        if self._writable and self.replica.is_leader:
            if self.disk is not None:
                self.disk.check()
            return
        if self.replica.is_leader:
            raise NotWritableError(self.replica.node_id, None, catching_up=True)
        raise self.not_writable(self.replica.leader_error())

    def leader_broker_addr(self, leader_id: str | None) -> str | None:
        return self.metadata.broker_addr_of(leader_id) if self.metadata is not None else None

    def not_writable(self, err: NotLeaderError) -> NotWritableError:
        """`err` (the replica's NotLeaderError) with the leader's broker address."""
        if isinstance(err, NotWritableError):
            return err
        return NotWritableError(err.leader_id, err.leader_addr, broker_addr=self.leader_broker_addr(err.leader_id))

    @property
    def own_broker_addr(self) -> str | None:
        """brokerIP1:listenPort as the metadata records it (None if unbound)."""
        host = self.metadata.config.store_host if self.metadata is not None else None
        return str(host) if host is not None and host.port else None

    async def wait_writable(self, timeout: float = math.inf) -> None:
        """Return once the gate is open (trio.TooSlowError after timeout)."""
        with trio.fail_after(timeout):
            while not self._writable:
                await self._opened.wait()

    async def cancel_when_deposed(self, scope: trio.CancelScope, term: int) -> None:
        """Cancel `scope` the moment this node stops being the writable
        leader of `term` (the generation moves): how a leader-only service
        (delay levels, timers, transaction checks, POP revive) stops its
        term's work."""
        seen = self.generation.value
        while self.writable and self.term == term:
            seen = await self.generation.wait_changed(seen)
        scope.cancel()

    # --- role changes (called synchronously by the replica's driver) -----------

    def on_role_change(self, ss: SoftState) -> None:
        self.role, self.term = ss.role, ss.term
        if ss.role is Role.LEADER:
            self._hurry()
            if not self._writable and self._pending_term != ss.term:
                self._pending_term = ss.term
                self._wakeup.set()
            return
        self._pending_term = None
        if self._catch_up is not None:
            self._catch_up.cancel()
        if self._writable:
            self._writable = False
            self._opened = trio.Event()
            self.closed_at = trio.current_time()
            log.info("%s: lost leadership in term %d; writes closed", self.replica.node_id, ss.term)
        self.cq.become_follower()  # idempotent; the hook is gone before the next append
        self._bump()

    def close(self) -> None:
        """The broker store is stopping: no more writes, whatever the role."""
        self._pending_term = None
        if self._catch_up is not None:
            self._catch_up.cancel()
        if self._writable:
            self._writable = False
            self._opened = trio.Event()
        self.cq.become_follower()
        self._bump()

    def _hurry(self) -> None:
        """A leader dispatches every commit at once, a follower's pause cut
        short: the catch-up below waits on dispatch, and the group has no
        writable master until it ends."""
        self.cq.hurry()

    def _bump(self) -> None:
        self.generation.advance(self.generation.value + 1)

    # --- the catch-up task -------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        if self.replica.is_leader:
            self._hurry()
            if not self._writable:
                self._pending_term = self.term
        task_status.started(self)
        while True:
            if self._pending_term is None:
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                continue
            term, self._pending_term = self._pending_term, None
            with trio.CancelScope() as scope:
                self._catch_up = scope
                try:
                    await self._become_writable(term)
                finally:
                    self._catch_up = None

    async def _become_writable(self, term: int) -> None:
        store = self.cq.store
        target = store.end_index  # the ledger end as of election, NOOP included
        log.info("%s: leader of term %d; catching up to entry %d before accepting writes",
                 self.replica.node_id, term, target)
        await self.replica.committed.wait_for(target)
        await self.cq.dispatcher.dispatched.wait_for(target)
        if self.metadata is not None:
            await self.metadata.leader_barrier()
        if not (self.replica.is_leader and self.replica.core.term == term):
            return
        self.cq.become_leader()
        if self.before_open is not None:  # appends through the hook just installed
            await self.before_open()
        await self._announce(term)
        # Synchronous from here: no role change can slip in between (one
        # during the import or the announcement cancelled this task and
        # closed the hook).
        if not (self.replica.is_leader and self.replica.core.term == term):
            return
        self._writable = True
        self._opened.set()
        self._bump()
        log.info("%s: accepting writes as master (term %d)", self.replica.node_id, term)

    async def _announce(self, term: int) -> None:
        addr = self.own_broker_addr
        if addr is None or self.metadata is None:
            return
        if self.metadata.broker_addr_of(self.replica.node_id) == addr:
            return
        try:
            await self.metadata.announce_leader(self.replica.node_id, addr)
        except CommitLogError as exc:  # the gate opens anyway; followers fall back to the peer address
            log.warning("%s: could not announce broker address %s in term %d: %s", self.replica.node_id, addr,
                        term, exc)
