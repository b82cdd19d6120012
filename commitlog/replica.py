# Owns the trio shell around the pure Raft core: one driver task feeds the core
# its inputs (ticks, peer messages, proposals, admin commands), carries out
# every Ready against the log and the hard-state file, and only then publishes
# the effects (messages to peers, the committed watermark, append results).
# Client appends are group-committed: everything queued while the driver was
# busy becomes one propose() and one log write (a proposal that finds the
# driver idle under async flush is carried out in submit() itself).
# Peer messages are decoded and admitted first (inbox.py, admission.py);
# faults (a Ready that cannot be carried out) are replica_faults.py's.
#
# Durability: in "sync" policy the log is fdatasync'ed once per driver round,
# BEFORE any message of that round leaves and before the committed watermark
# moves; in "async" policy a background flusher syncs every few ms (DLedger's
# ASYNC_FLUSH).  Nothing a peer or a client learns runs ahead of what this node
# has written.
#
# Append results: a caller parks on its own slotted request, or gives an
# on_done callback the resolving task calls; the driver releases every
# committed request in one sweep, the ticker fails expired ones
# (QuorumTimeoutError) once per tick.  An append already written when this
# leader steps down keeps its waiter and Raft decides it: committed once the
# next leader's commit index covers it in the term it was written in (Log
# Matching), TermChangedError if a truncation or reset removes it, a timeout
# past its deadline.  Proposals not yet in the log fail with NotLeaderError
# (the broker may hand them on); a written append never does.
#
# Membership (raft/membership.py): a Ready that changes the configuration
# history is persisted first (the ledgermq-members file), then the transport's
# peer set and `membership` follow; change_membership() returns once the
# change commits in its term.  Round tracing (roundtrace.py): off, one None test.
import collections
import errno
import logging
from typing import Callable, Mapping, Protocol, Sequence

import attrs
import trio

from commitlog import roundtrace as _rt
from commitlog.appends import AppendRequest, RefusedLeader
from commitlog.entry import iter_batch
from commitlog.errors import (
    AppendRejectedError,
    CommitLogError,
    DiskFullError,
    IndexBeyondEndError,
    NotLeaderError,
    PendingFullError,
    QuorumTimeoutError,
    TermChangedError,
)
from commitlog.inbox import PeerInbox
from commitlog.raft import wire
from commitlog.raft.core import RaftCore
from commitlog.raft.logapi import RaftLog
from commitlog.raft.membership import ConfChange, ConfigEntry, MembershipChangeError
from commitlog.raft.state import HardState, Ready, Role, SoftState
from commitlog.ratelog import LogBudget
from commitlog.replica_faults import FaultRecovery
from commitlog.replica_results import AppendResults
from commitlog.transport.base import Sink
from commitlog.watermark import Watermark

log = logging.getLogger("ledgermq.replica")

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
STALL_TICKS = 5  # a ticker this many ticks late was stalled: the missed ticks are dropped (_ticker)


class ReplicaLog(RaftLog, Protocol):
    """The log a ReplicaNode writes: the core's RaftLog and its flush policy
    (commitlog.store.SegmentedStore; MemLog in tests)."""

    @property
    def sync_flush(self) -> bool: ...

    async def flush_async(self) -> None: ...


class ReplicaTransport(Protocol):
    """What a ReplicaNode uses of its transport (commitlog.transport: TCP or
    memory)."""

    def send(self, peer_id: str, payload: bytes) -> bool: ...

    def set_sink(self, sink: Sink) -> None: ...

    def set_peers(self, peers: Mapping[str, tuple[str, int] | None]) -> None: ...


@attrs.define(eq=False, kw_only=True)
class ReplicaNode(FaultRecovery, AppendResults):
    """Drives one RaftCore.  Construct, then `await nursery.start(node.run)`."""

    core: RaftCore
    log: ReplicaLog
    transport: ReplicaTransport
    persist_hard_state: Callable[[HardState], None]
    peer_addresses: dict[str, str] = attrs.Factory(dict)
    tick_seconds: float = 0.01
    max_pending: int = 10000
    max_wait_ack_ms: int = 2500
    # Called with the new SoftState whenever role/term/leader change (the
    # broker switches master/slave on it).
    on_role_change: Callable[[SoftState], None] | None = None
    # Called right after the log was reset to a later begin (this follower
    # fell behind the leader's retention), so state derived from the log
    # (consume queues, index) is rebased before anything new is dispatched.
    on_log_reset: Callable[[], object] | None = None
    # Asked before a Ready's writes; raises DiskFullError when the disk
    # cannot take them (the broker's disk reserve), handled like ENOSPC.
    space_check: Callable[[], None] | None = None
    # Writes the configuration history (ledgermq-members) before the log
    # changes in the same Ready; None keeps it in memory only (tests).
    persist_membership: Callable[[tuple], None] | None = None
    # Advanced (by one) after every change of the configuration or of the
    # peers replicated to; the broker follows it for brokerId and status.
    membership: Watermark = attrs.Factory(lambda: Watermark(0))

    committed: Watermark = attrs.Factory(Watermark)
    soft_state: SoftState | None = attrs.field(default=None, init=False)
    _wakeup: trio.Event = attrs.Factory(trio.Event)
    _idle: bool = False  # the driver is parked between rounds (submit() may run one inline)
    _role_changed: trio.Event = attrs.Factory(trio.Event)
    inbox: PeerInbox = attrs.field(init=False)  # peer messages admitted, not yet taken by the driver
    _ticks_due: int = 0
    _proposals: list[AppendRequest] = attrs.Factory(list)
    _commands: list = attrs.Factory(list)
    # Requests with assigned indexes, oldest first, waiting for commit.
    _waiting: collections.deque = attrs.Factory(collections.deque)
    _pending_entries: int = 0
    _outbox: list = attrs.Factory(list)
    _wrote: bool = False
    _new_commit: int | None = None
    # Set after every driver round that saw a tick or a peer message (what
    # can clear a refusal that passes with time; change_membership waits on it).
    _round: trio.Event = attrs.Factory(trio.Event)
    refused: RefusedLeader | None = None
    out_of_space: DiskFullError | None = None  # the last write that found no space (None once one succeeds)
    stats: collections.Counter = attrs.Factory(collections.Counter)
    _durable_hard: HardState | None = None
    _no_space_logged: float | None = None
    _log_budget: LogBudget = attrs.Factory(LogBudget)  # lines about what peers sent
    # trio time a message of the current term last arrived from each peer:
    # a leader's evidence, in real time, that it still leads (a leader that
    # was SIGSTOPped or cut off has not run its check-quorum ticks yet).
    _peer_heard: dict = attrs.Factory(dict)

    def __attrs_post_init__(self) -> None:
        self.committed.advance(self.core.commit_index)
        self.soft_state = self.core.soft_state()
        self._durable_hard = HardState(self.core.term, self.core.voted_for)  # as loaded from disk
        self.inbox = PeerInbox(core=lambda: self.core, wake=self._peer_spoke, stats=self.stats,
                               log_budget=self._log_budget)

    # ------------------------------------------------------------------
    # public API
    # ------------------------------------------------------------------

    @property
    def node_id(self) -> str:
        return self.core.node_id

    @property
    def is_leader(self) -> bool:
        return self.core.role is Role.LEADER

    @property
    def transferring_to(self) -> str | None:
        """The target of the leadership transfer this leader is making
        (it refuses appends meanwhile), or None."""
        role = self.core.leader_role
        return role.transfer_target if role is not None else None

    def has_quorum_contact(self, within: float) -> bool:
        """Leader, and heard from a quorum (itself included) within the last
        `within` seconds of real time.  Decisions that would be wrong if
        another leader had taken over (e.g. telling a consumer its offset
        is illegal) ask this rather than the role alone."""
        if not self.is_leader:
            return False
        since = trio.current_time() - within
        heard = sum(1 for t in self._peer_heard.values() if t >= since)
        return heard + 1 >= self.core.quorum

    def leader_error(self) -> NotLeaderError:
        leader = self.core.leader_id if self.core.leader_id != self.node_id else None
        return NotLeaderError(leader, self.peer_addresses.get(leader) if leader else None)

    async def append(self, bodies: Sequence[bytes]) -> list[tuple[int, int]]:
        """Append one entry per body on the leader and return [(index, pos)]
        once they are committed on a quorum.  Raises NotLeaderError (with the
        leader hint), PendingFullError (backpressure), QuorumTimeoutError
        (not committed within max_wait_ack_ms, checked every tick; the
        entries may still commit later) or TermChangedError (leadership
        changed first)."""
        if not bodies:
            return []
        return (await self.wait(self.submit(bodies))).result

    def submit(self, bodies: Sequence[bytes], on_done: Callable[[AppendRequest], None] | None = None) \
            -> AppendRequest:
        """The synchronous half of append(): queue the entries for the next
        driver round, or run that round here when the driver is idle (see
        the module comment), so requests submitted one after another are
        appended in that order; return the request to wait() on, or give
        it `on_done` (may be called before this returns).  Raises
        NotLeaderError or PendingFullError at once."""
        n = len(bodies)
        if self.core.role is not Role.LEADER:
            raise self.leader_error()
        if self._pending_entries + n > self.max_pending:
            self.stats["pending_full"] += 1
            raise PendingFullError(self._pending_entries, self.max_pending)
        req = AppendRequest(bodies, trio.current_time() + self.max_wait_ack_ms / 1000, on_done=on_done)
        self._pending_entries += n
        self._proposals.append(req)
        if _rt.TRACER is not None:  # tools/bench/round.py
            _rt.TRACER.mark("submitted")
        if self._idle and not self._wakeup.is_set() and not self.log.sync_flush:
            self._idle = False
            try:
                self._propose()
                self._send_and_commit(may_yield=False)
            finally:
                self._idle = True
        else:
            self._wakeup.set()
        return req

    async def wait(self, req: AppendRequest) -> AppendRequest:
        """Park until `req` is committed (or failed: its error is raised);
        returns it, with `result` and `stamped`.  One waiter per request."""
        if not req.done:
            req.task = trio.lowlevel.current_task()

            def abort(_raise_cancel):
                # The waiter was cancelled while parked: forget it.  Its
                # entries may still be written and committed; nobody is told.
                if not req.done:
                    req.done, req.task = True, None
                    self._pending_entries -= len(req.bodies)
                return trio.lowlevel.Abort.SUCCEEDED

            await trio.lowlevel.wait_task_rescheduled(abort)
        if _rt.TRACER is not None:
            _rt.TRACER.mark("woken")
        if req.error is not None:
            raise req.error
        return req

    async def call(self, fn: Callable[[RaftCore], object]):
        """Run fn(core) inside the driver (between rounds, where the core
        accepts inputs) and return its result; used for admin commands such
        as leadership transfer."""
        done = trio.Event()
        box: list = []

        def command():
            try:
                box.append((True, fn(self.core)))
            except Exception as exc:  # handed back to the caller
                box.append((False, exc))
            done.set()

        self._commands.append(command)
        self._wake()
        await done.wait()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    async def transfer_leadership(self, target: str, timeout: float = 3.0) -> None:
        """Hand leadership to `target` (caught up first, then TimeoutNow) and
        wait until this node is no longer leader.  Raises NotLeaderError,
        the core's transfer errors, or trio.TooSlowError."""
        await self.call(lambda core: core.transfer_leadership(target))
        with trio.fail_after(timeout):
            while self.is_leader:
                await self._role_changed.wait()

    async def change_membership(self, change: ConfChange, timeout: float = 10.0) -> ConfigEntry:
        """Leader only: make one single-server change and return its
        configuration entry once it is committed in the term it was
        proposed.  Refusals that pass with time (MembershipChangeError
        .retryable: the learner still catching up, the previous change or
        this leader's NOOP not committed yet, a transfer under way) are
        retried after each driver round until `timeout`, then raised; other
        refusals, NotLeaderError and TermChangedError (leadership moved
        before the entry committed: it may or may not survive) at once.
        QuorumTimeoutError if it is not committed in time."""
        deadline = trio.current_time() + timeout
        while True:
            round_done = self._round
            try:
                index, term = await self.call(lambda core: (core.propose_conf_change(change), core.term))
                break
            except MembershipChangeError as e:
                if not e.retryable or trio.current_time() >= deadline:
                    raise
            with trio.move_on_at(deadline):
                await round_done.wait()
        try:
            await self.committed.wait_for(index, timeout=max(0.0, deadline - trio.current_time()))
        except trio.TooSlowError:
            raise QuorumTimeoutError(index, int(timeout * 1000)) from None
        entry = self.core.membership.at(index)
        if entry.index != index or entry.term != term:
            raise TermChangedError(term, self.core.term)
        log.info("%s: membership change %s committed at %d: %s", self.node_id, change.describe(), index,
                 entry.membership.describe())
        return entry

    def read_committed(self, first_index: int, max_count: int, max_bytes: int = 4 << 20) -> list:
        """Decoded entries from first_index on, never beyond the committed
        index (what consumers and replica comparisons may see)."""
        last = min(self.committed.value, first_index + max_count - 1)
        if last < first_index:
            return []
        batch = self.log.read_batch(first_index, max_bytes, last - first_index + 1)
        return list(iter_batch(batch))

    def chain_crc_at(self, index: int) -> int:
        if index > self.committed.value:
            raise IndexBeyondEndError(index, self.committed.value)
        return self.log.chain_crc_at(index)

    def status(self) -> dict:
        st = self.core.status()
        out = {
            "node": st.node_id, "role": st.role.value, "term": st.term, "leader": st.leader_id,
            "leaderAddr": self.peer_addresses.get(st.leader_id) if st.leader_id else None,
            "votedFor": st.voted_for, "committedIndex": st.commit_index,
            "ledgerBeginIndex": st.begin_index, "ledgerEndIndex": st.end_index,
            "uncommitted": st.uncommitted, "transferringTo": st.transferring_to,
            "pendingAppends": self._pending_entries,
            "voters": list(st.voters), "learners": list(st.learners), "configIndex": st.config_index,
            "configCommitted": st.config_index <= st.commit_index,
            "refusedLeader": self.refused.to_json() if self.refused else None,
            "peers": {p.peer_id: {"state": p.state, "matchIndex": p.match_index, "nextIndex": p.next_index,
                                  "lag": max(0, st.end_index - p.match_index),
                                  "inflightPushes": p.inflight_pushes,
                                  "lastAckMsAgo": None if p.last_ack_tick < 0
                                  else round((st.tick - p.last_ack_tick) * self.tick_seconds * 1000)}
                      for p in st.peers},
            "stats": dict(self.stats),
        }
        return out

    # ------------------------------------------------------------------
    # the service
    # ------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        # Received messages go straight from the transport's reader tasks
        # into the driver's inbox (no queue and task in between: an append
        # and its acks each cross one task switch less).
        self.transport.set_sink(self.inbox.deliver)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._ticker)
            task_status.started(self)
            try:
                await self._driver()
            finally:
                # Stopping: nothing more will be written, but what was may
                # still commit elsewhere (fate unknown: TermChangedError).
                self._fail_proposals(self.leader_error())
                self._fail_all(TermChangedError(self.core.term, self.core.term))

    def _wake(self) -> None:
        self._wakeup.set()

    async def _ticker(self) -> None:
        # A timer, not polling: the core's clock advances once per tick, and
        # appends past their deadline fail (one sweep per tick instead of a
        # cancel scope per append; here rather than in the driver so a driver
        # stuck in a slow fdatasync still times its callers out).
        # Ticks missed while the process could not run (stopped, starved, a
        # paused VM) are dropped, as a Go time.Ticker drops them for etcd's
        # raft: replayed on waking, they would time a follower out before
        # the heartbeats that arrived meanwhile were read, and every member
        # of a group stalled together would call an election for nothing.
        # A leader that really died is still noticed within the election
        # timeout of the followers' own, running, clocks.  Lateness of a few
        # ticks (a busy event loop) is caught up, so the clock keeps time
        # under ordinary load.
        next_at = trio.current_time()
        late_limit = STALL_TICKS * self.tick_seconds
        while True:
            next_at += self.tick_seconds
            await trio.sleep_until(next_at)
            now = trio.current_time()
            if now - next_at > late_limit:
                self.stats["ticks_dropped"] += int((now - next_at) / self.tick_seconds)
                next_at = now
            self._ticks_due += 1
            self._wake()
            self._expire(trio.current_time())

    async def _driver(self) -> None:
        # self.core, not a local: _refuse_leader may replace it.
        while True:
            self._idle = True
            try:
                await self._wakeup.wait()
            finally:
                self._idle = False
            self._wakeup = trio.Event()
            outside = bool(self._ticks_due or self.inbox)  # time passed or a peer spoke
            while self._ticks_due:
                self._ticks_due -= 1
                self.core.tick()
                self._take_ready()
            self._step_inbox()
            commands, self._commands = self._commands, []
            for command in commands:
                command()
                self._take_ready()
            if self._proposals:
                self._propose()
            await self._publish()
            if outside:
                done, self._round = self._round, trio.Event()
                done.set()

    def _step_inbox(self) -> None:
        now = trio.current_time()
        for msg in self.inbox.take():
            if msg.term == self.core.term:
                self._peer_heard[msg.src] = now
            if self.refused is not None and msg.src == self.refused.leader:
                if msg.term <= self.refused.term:
                    continue  # fenced: see replica_faults.py
                self.refused = None
            if _rt.TRACER is not None:
                _rt.TRACER.stepped(msg)
            try:
                self.core.step(msg)
            except Exception as exc:
                self._step_failed(msg, exc)
                continue
            self._take_ready()

    def _peer_spoke(self) -> None:
        """The inbox's wake-up.  With the driver idle, nothing else queued
        and the async flush policy, the round runs here, in the reader's
        step (a follower acknowledges a push, a leader commits and answers
        on an acknowledgement, without a task switch); else the driver's."""
        if not (self._idle and not self._wakeup.is_set() and not self.log.sync_flush):
            self._wakeup.set()
            return
        self._idle = False
        try:
            self._step_inbox()
            self._send_and_commit(may_yield=False)
            done, self._round = self._round, trio.Event()
            done.set()
        finally:
            self._idle = True

    def _propose(self) -> None:
        reqs = [r for r in self._proposals if not r.done]
        self._proposals = []
        if not reqs:
            return
        if not self.is_leader:
            exc = self.leader_error()
            for r in reqs:
                self._resolve(r, exc)
            return
        bodies = reqs[0].bodies if len(reqs) == 1 else [b for r in reqs for b in r.bodies]
        try:
            first = self.core.propose(bodies)
        except CommitLogError as exc:  # transferring leadership, etc.
            for r in reqs:
                self._resolve(r, exc)
            return
        for r in reqs:
            r.term, r.first_index = self.core.term, first
            first += len(r.bodies)
            self._waiting.append(r)
        self._take_ready()

    def _take_ready(self) -> None:
        """Carry out every available Ready's writes now (the core needs them
        before its next input); collect its messages and commit for _publish."""
        try:
            self._carry_out_ready()
        except DiskFullError as exc:
            self._no_space(exc)
            return
        except OSError as exc:
            if exc.errno not in _NO_SPACE:
                raise
            self._no_space(exc)

    def _carry_out_ready(self) -> None:
        core, logw = self.core, self.log
        while core.has_ready():
            rd: Ready = core.ready()
            writes = rd.hard_state is not None or rd.leader_append is not None or rd.follower_append is not None
            if writes and self.space_check is not None:
                self.space_check()
            if rd.hard_state is not None:
                self.persist_hard_state(rd.hard_state)  # fsync'ed, atomic
                self._durable_hard = rd.hard_state
            if rd.membership is not None:
                self._membership_ready(rd.membership)
            if rd.reset_to is not None:
                r = rd.reset_to
                self._fail_written_from(0, "log reset")
                logw.reset_to(r.begin_index, r.begin_pos, r.prev_term, r.prev_chain_crc)
                if self.on_log_reset is not None:
                    self.on_log_reset()
                self._wrote = True
            if rd.truncate_from is not None:
                self._fail_written_from(rd.truncate_from, "truncated")
                logw.truncate_from(rd.truncate_from)
                self._wrote = True
            if rd.leader_append is not None:
                la = rd.leader_append
                placed, stamps = logw.append_stamped(la.bodies, la.term, la.magic)
                self._assign_positions(la.first_index, placed, stamps)
                self._wrote = True
                if _rt.TRACER is not None:
                    _rt.TRACER.mark("appended", la.first_index + len(la.bodies) - 1)
            if rd.follower_append is not None:
                try:
                    logw.append_follower(rd.follower_append)
                except AppendRejectedError as exc:
                    self._refuse_leader(exc)
                    return
                self._wrote = True
                if _rt.TRACER is not None:
                    batch = rd.follower_append
                    _rt.TRACER.mark("written", batch.first_index + batch.count - 1)
            if writes:
                self.out_of_space = None  # this Ready's writes found room
            if rd.committed_index is not None:
                self._new_commit = rd.committed_index
            if rd.soft_state is not None:
                self._on_soft_state(rd.soft_state)
            self._outbox.extend(rd.messages)
            core.advance(rd)

    def _membership_ready(self, history: tuple) -> None:
        """Persist the configuration history (before the log changes) and
        point the transport at the configuration's members."""
        if self.persist_membership is not None:
            self.persist_membership(history)
        self.sync_peers()
        self.membership.advance(self.membership.value + 1)

    def sync_peers(self) -> None:
        """The transport's peers := the members the core replicates to or
        hears from (a joining node that knows no configuration yet keeps
        the peers of its dLegerPeers, whose leader will reach it)."""
        core = self.core
        self.peer_addresses.update(core.member_addresses())
        if not core.membership.latest.empty:
            self.transport.set_peers({p: _host_port(self.peer_addresses.get(p)) for p in core.peers})

    async def _publish(self) -> None:
        if self._wrote and self.log.sync_flush:
            # fdatasync off the event loop; the driver waits, inputs queue up
            # and become the next round's group commit.
            await self.log.flush_async()
        if self._send_and_commit(may_yield=True):
            # Let the transport's writers put this round's pushes on the
            # wire before hundreds of released callers run (trio runs a
            # batch of woken tasks in either order).
            await trio.lowlevel.cancel_shielded_checkpoint()
            self._release(self.committed.value)

    def _send_and_commit(self, may_yield: bool) -> bool:
        """After this round's writes are durable (per policy): its messages
        first (the next commit's critical path), then the commit and the
        release of what it covers -- unless the caller may yield and there
        are messages out and tasks to wake: then True, nothing released."""
        self._wrote = False
        outbox, self._outbox = self._outbox, []
        send = self.transport.send
        tracer = _rt.TRACER
        for msg in outbox:
            if tracer is not None:
                tracer.sending(msg)
            if not send(msg.dst, wire.encode_scatter(msg)):
                self.stats["send_dropped"] += 1
        if self._new_commit is not None:
            commit, self._new_commit = self._new_commit, None
            self.log.set_committed(commit)
            self.committed.advance(commit)
            if tracer is not None:
                tracer.mark("committed", commit)
            if self._waiting and self._waiting[0].last_index <= commit:
                if outbox and may_yield and self._waiting[0].task is not None:
                    return True
                self._release(self.committed.value)
        return False

    def _on_soft_state(self, ss: SoftState) -> None:
        old, self.soft_state = self.soft_state, ss
        event, self._role_changed = self._role_changed, trio.Event()
        event.set()
        if old is not None and ss.role is not Role.LEADER and old.role is Role.LEADER:
            # Proposals not yet in the log never will be from here: NotLeaderError
            # (the broker may hand them to the new leader).  Entries already
            # written keep their waiters (module comment, "Leader changes").
            self._fail_proposals(self.leader_error())
        log.info("%s: %s in term %d (leader %s)", self.node_id, ss.role.value, ss.term, ss.leader_id)
        if self.on_role_change is not None:
            self.on_role_change(ss)


def _host_port(addr: str | None) -> tuple[str, int] | None:
    """"host:port" (or "[v6]:port") as the TCP transport takes it."""
    if not addr or ":" not in addr:
        return None
    host, _, port = addr.rpartition(":")
    return (host.strip("[]"), int(port)) if port.isdigit() else None

