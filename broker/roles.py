# Owns the broker's role gate (RocketMQ's DLedgerRoleChangeHandler): whether
# this broker accepts writes, and the brokerId it registers under.
#
#   follower/candidate  closed; brokerId = the member's slave id (never 0)
#   leader, catching up closed; still the slave id.  The gate waits until
#                       (1) the ledger end as of election (every entry of
#                           earlier terms plus this term's NOOP) is committed,
#                       (2) dispatch has reached it (consume queues hold every
#                           committed message),
#                       (3) the metadata tables have applied it
#                           (MetadataService.leader_barrier),
#                       then rebuilds the topic-queue offset table from the
#                       consume queues and installs the append hook
#                       (ConsumeQueueService.become_leader), and only then
#   leader, writable    open; brokerId 0 (master).
#
# Losing leadership closes the gate at once: on_role_change runs inside the
# replica's driver, synchronously, so no append of the new role can be
# stamped by a stale offset table; a catch-up in progress is cancelled.
# Each change bumps `generation` (a Watermark), which the name server
# registration task waits on to re-register promptly with the new brokerId.
#
# The gate is the one place that knows "may this broker write now": every
# write path (send, metadata updates, offset commits) should call
# check_writable() first; a record appended without the hook would carry no
# queue offset.
import logging
import math

import attrs
import trio

from broker.config import broker_id_for
from commitlog.errors import NotLeaderError
from commitlog.raft.state import Role, SoftState
from commitlog.watermark import Watermark

log = logging.getLogger("ledgermq.roles")


@attrs.define(str=False)
class NotWritableError(NotLeaderError):
    """This broker does not accept writes: not the leader, or a leader still
    catching up (leader_id is then this node, leader_addr None)."""

    catching_up: bool = False

    def __str__(self) -> str:
        if self.catching_up:
            return "this broker was just elected leader and is still catching up (dispatch, metadata)"
        return super().__str__()


@attrs.define(eq=False)
class RoleGate:
    replica: object  # commitlog.replica.ReplicaNode
    cq: object  # consumequeue.service.ConsumeQueueService
    metadata: object | None = None  # broker.metadata.MetadataService
    peer_ids: tuple[str, ...] | None = None

    generation: Watermark = attrs.Factory(lambda: Watermark(0))
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
        writes are accepted right now."""
        if self._writable and self.replica.is_leader:
            return
        if self.replica.is_leader:
            raise NotWritableError(self.replica.node_id, None, catching_up=True)
        err = self.replica.leader_error()
        raise NotWritableError(err.leader_id, err.leader_addr)

    async def wait_writable(self, timeout: float = math.inf) -> None:
        """Return once the gate is open (trio.TooSlowError after timeout)."""
        with trio.fail_after(timeout):
            while not self._writable:
                await self._opened.wait()

    # --- role changes (called synchronously by the replica's driver) -----------

    def on_role_change(self, ss: SoftState) -> None:
        self.role, self.term = ss.role, ss.term
        if ss.role is Role.LEADER:
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

    def _bump(self) -> None:
        self.generation.advance(self.generation.value + 1)

    # --- the catch-up task -------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        if self.replica.is_leader and not self._writable:
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
        # Synchronous from here: no role change can slip in between.
        if not (self.replica.is_leader and self.replica.core.term == term):
            return
        self.cq.become_leader()
        self._writable = True
        self._opened.set()
        self._bump()
        log.info("%s: accepting writes as master (term %d)", self.replica.node_id, term)
