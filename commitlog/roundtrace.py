# Owns the round tracer behind `python -m tools.bench.round`: with
# LEDGERMQ_ROUND_TRACE=<dir> in a process's environment, the hooks on the send
# and replication path (one guarded call per hop: remoting connection and
# guard, send_burst, replica, tcp transport) record when each hop of a round
# happened, and the process writes them to <dir>/<pid>.jsonl at a clean exit
# (SIGTERM).  It lives in the lowest layer that has hops, so the broker and
# the log share one clock and one file.
#
# Rules.  Off (the variable unset), TRACER is None and every hook costs one
# attribute load and an `is not None` test; nothing else runs.  Records are
# kept in memory (at most LIMIT; later ones dropped and counted) and written
# once, at exit, so tracing costs a round no syscall.
#
# A record is one JSON array per line: [hop, t_ns, index, peer, steps]
#   hop    the hop's name (HOPS says where each is taken);
#   t_ns   time.perf_counter_ns() (CLOCK_MONOTONIC: comparable across the
#          processes of one machine);
#   index  the log index the hop is about (-1: none);
#   peer   the other node of a push or an acknowledgement ("" otherwise);
#   steps  trio task steps run in this process so far (an Instrument).
# The same instrument writes a record per task step, per wait for IO and per
# scheduler batch (hops "task", "idle", "batch"; index: a duration in ns;
# peer: the task's name).  tools/bench/round.py cuts the master's records
# into rounds ("read" to "written") and finds the followers' hops by index.
import atexit
import json
import os
import time

import trio

__all__ = ["HOPS", "LIMIT", "TRACE_ENV", "TRACER", "RoundTracer"]

TRACE_ENV = "LEDGERMQ_ROUND_TRACE"
LIMIT = 2_000_000
_SEND_CODES = frozenset((10, 310, 320))  # SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE
# Raft messages are told apart by name and fields, not imported: the
# connection module (the client library's too) imports this one, and the
# client library must not import the Raft core (pyproject's contracts).
_APPEND, _SUCCESS = 3, 200  # commitlog.raft.messages PushType.APPEND, ResponseCode.SUCCESS

# hop -> where it is recorded
HOPS = {
    "read": "connection read loop: receive_some returned the bytes of a send request",
    "decoded": "connection read loop: the decoder handed out the send (header parsed)",
    "admitted": "guard.split_burst: the burst passed the admission checks and the in-flight limit",
    "submitted": "ReplicaNode.submit: the records were handed to the log (the bare log's round starts here)",
    "appended": "ReplicaNode: the leader's append of the Ready is written (index: its last entry)",
    "pushed": "ReplicaNode._publish: a push with entries is handed to the transport (just before the write)",
    "rx": "transport reader: the frame of a push or acknowledgement was read (time of the peer's last frame)",
    "stepped": "ReplicaNode driver: the push or acknowledgement is stepped into the Raft core",
    "written": "ReplicaNode: a follower's append of the pushed entries is written",
    "ack": "ReplicaNode._publish: an acknowledgement is handed to the transport (just before the write)",
    "committed": "ReplicaNode._publish: the commit index advanced (index: the new commit)",
    "woken": "ReplicaNode.wait: the appender's task runs again after its entries committed",
    "encoded": "send_burst finish: the burst's answers are encoded",
    "answered": "connection: the burst's answers are written to the socket",
}


class _StepCounter(trio.abc.Instrument):
    """Counts task steps, and records where the trio thread's time went:
    each task step ("task": index = its CPU time in ns, peer = the task's
    name), each wait for IO ("idle": index = its wall time) and each run of
    the scheduler between two waits ("batch": index = the thread's CPU time
    in it, task steps and the scheduler's own work together).  CPU time,
    not wall time, so another process taking the core does not count."""

    def __init__(self, tracer: "RoundTracer") -> None:
        self.tracer = tracer
        self._cpu0 = 0
        self._batch0 = time.thread_time_ns()
        self._idle0 = 0

    def before_task_step(self, task) -> None:
        self.tracer.steps += 1
        self._cpu0 = time.thread_time_ns()

    def after_task_step(self, task) -> None:
        cpu0 = self._cpu0
        self.tracer.slice("task", time.perf_counter_ns(), time.thread_time_ns() - cpu0, task.name)

    def before_io_wait(self, timeout) -> None:
        now = time.perf_counter_ns()
        self.tracer.slice("batch", now, time.thread_time_ns() - self._batch0, "")
        self._idle0 = now

    def after_io_wait(self, timeout) -> None:
        now = time.perf_counter_ns()
        self.tracer.slice("idle", self._idle0, now - self._idle0, "")
        self._batch0 = time.thread_time_ns()


class RoundTracer:
    """The records of one process (see the module comment)."""

    def __init__(self, path: str, limit: int = LIMIT) -> None:
        self.path = path
        self.limit = limit
        self.events: list[tuple] = []
        self.slices: list[tuple] = []  # ("task" | "idle" | "batch", t_ns, duration_ns, task name, steps)
        self.dropped = 0
        self.steps = 0
        self._counting = False
        self._read = (0, 0)  # (t_ns, steps) of the connection's last read
        self._rx: dict[str, tuple[int, int]] = {}  # peer -> (t_ns, steps) of its last frame

    def _record(self, hop: str, t: int, index: int = -1, peer: str = "", steps: int | None = None) -> None:
        if not self._counting:
            self._counting = True
            try:
                trio.lowlevel.add_instrument(_StepCounter(self))
            except RuntimeError:  # outside trio (a test): no step counts
                pass
        if len(self.events) >= self.limit:
            self.dropped += 1
            return
        self.events.append((hop, t, index, peer, self.steps if steps is None else steps))

    def mark(self, hop: str, index: int = -1, peer: str = "") -> None:
        self._record(hop, time.perf_counter_ns(), index, peer)

    def slice(self, kind: str, t0: int, duration: int, name: str) -> None:
        """A task step or an IO wait (_StepCounter), kept apart from the hops."""
        if len(self.slices) >= self.limit:
            self.dropped += 1
            return
        self.slices.append((kind, t0, duration, name, self.steps))

    # --- the broker's connection ------------------------------------------------

    def read(self) -> None:
        """Bytes arrived on a connection; kept until the decoder shows
        whether they hold a send (the decoder runs in the same task step)."""
        self._read = (time.perf_counter_ns(), self.steps)

    def decoded(self, cmd) -> None:
        if getattr(cmd, "code", None) in _SEND_CODES:
            t, steps = self._read
            self._record("read", t, steps=steps)
            self.mark("decoded")

    # --- the replicated log --------------------------------------------------------

    def frame_in(self, peer: str) -> None:
        self._rx[peer] = (time.perf_counter_ns(), self.steps)

    def stepped(self, msg) -> None:
        """A peer message the driver is about to step: pushes with entries
        and successful acknowledgements are recorded ("rx" with the time
        the transport read the peer's last frame, then "stepped")."""
        index = _index_of(msg)
        if index is None:
            return
        t, steps = self._rx.get(msg.src, (time.perf_counter_ns(), self.steps))
        self._record("rx", t, index, msg.src, steps)
        self.mark("stepped", index, msg.src)

    def sending(self, msg) -> None:
        """A message the driver is about to hand to the transport."""
        index = _index_of(msg)
        if index is not None:
            self.mark("pushed" if type(msg).__name__ == "PushRequest" else "ack", index, msg.dst)

    # --- output ---------------------------------------------------------------

    def write(self) -> None:
        if not self.events:
            return
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path, "w") as f:
            f.write(json.dumps({"pid": os.getpid(), "dropped": self.dropped}) + "\n")
            for e in self.events:
                f.write(json.dumps(e) + "\n")
            for e in self.slices:
                f.write(json.dumps(e) + "\n")


def _index_of(msg) -> int | None:
    """The index a push with entries (its last) or a successful
    acknowledgement of an APPEND (its match) is about; None for any other
    message (heartbeats, commit-only pushes and their answers)."""
    kind = type(msg).__name__
    if kind == "PushRequest":
        batch = msg.batch
        return batch.first_index + batch.count - 1 if batch is not None and batch.count else None
    if kind == "PushResponse" and msg.type == _APPEND and msg.code == _SUCCESS and msg.match_index >= 0:
        return msg.match_index
    return None


def _from_env() -> RoundTracer | None:
    out_dir = os.environ.get(TRACE_ENV, "").strip()
    if not out_dir:
        return None
    tracer = RoundTracer(os.path.join(out_dir, f"{os.getpid()}.jsonl"))
    atexit.register(tracer.write)
    return tracer


TRACER: RoundTracer | None = _from_env()
