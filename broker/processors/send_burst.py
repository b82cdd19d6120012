# Owns the send processor's burst path: the sends one read brought from a
# connection (accept_burst runs in the connection's read loop, so bursts keep
# the connection's order).
#
# Rules.  Each message is checked and encoded on its own -- runs of plain
# SEND_MESSAGE_V2 (codec.SendRun) in C a run at a time (send_native.py), every
# other request by the general path in send.py -- and one that fails is
# answered alone.  All records go to the log as ONE append, and the log's
# driver answers them as the commit covers it (AppendRequest.on_done ->
# BurstAnswers.give; the connection writes them in one write).  Only what
# waits for something else takes a task (BurstAnswers.give_async): sends
# handed on to the master, sends to a topic to auto-create (created first,
# then served as a burst of their own).  A single send is a burst of one.
# What it needs of the general path it asks the processor for (burst_hosts,
# burst_records, REFUSALS, refusal, ...): send.py imports this module, not
# the other way round.
import functools

from broker.processors import send_native
from broker.processors.forward import UNSTORED
from broker.remoting.answers import BurstAnswers
from broker.remoting.codec import SendRun
from broker.remoting.command import RemotingCommand
from commitlog import roundtrace as _rt
from commitlog.errors import CommitLogError


def accept_burst(proc, conn, cmds: list, *, hand_on: bool = True, create_topics: bool = True):
    """The synchronous half of a burst of sends read together from one
    connection (see the module comment); returns their BurstAnswers (one
    answer per item, in order).  The requests of a SendRun the native
    path takes are checked and encoded a run at a time
    (send_native.py); every other request, and every one of a SendRun
    it does not take, is served here one by one (a SendRun's answer is
    then a list, see codec.SendRun).  A single send is a burst of one
    (SendProcessor.process).  hand_on=False: the forwarder's own retry,
    refused plainly if this node still cannot store it; create_topics:
    whether a send to a missing topic may auto-create it (once)."""
    replies: list = [None] * len(cmds)
    try:
        proc.gate.check_writable()
    except CommitLogError as exc:  # not the writable leader: all of them alike
        unstored = [(i, k, one) for i, cmd in enumerate(cmds)
                    for k, one in (enumerate(cmd.sends()) if type(cmd) is SendRun else ((None, cmd),))]
        if hand_on and _hands_on(proc, exc):
            return _handed_on(proc, conn, cmds, replies, unstored, exc)
        for i, k, one in unstored:
            _put(replies, cmds, i, k, proc.refusal(one, exc, []))
        return _answered(replies)
    born_host, born, born_v6, store_host = proc.burst_hosts(conn.remote_address)
    # (i, k, request, first record, count, queueId, uniq); k: its place in a SendRun, else None
    parts: list[tuple] = []
    records: list[bytes] = []
    slow: list[tuple[int, int | None, RemotingCommand]] = []
    runs: list[send_native.NativeRun] = []
    cluster = proc.cfg.broker_cluster_name.encode()
    props_fixed, props_uniq = send_native.props_room(cluster, proc.uniq_keys.prefix)
    rules: dict = {}

    def general(i: int, k: int | None, request: RemotingCommand) -> None:
        try:
            made = proc.burst_records(request, born_host)
        except proc.REFUSALS as exc:
            _put(replies, cmds, i, k, proc.refusal(request, exc, []))
            return
        if made is None:
            slow.append((i, k, request))  # auto-create first, or answer why not
            return
        queue_id, recs, uniq = made
        parts.append((i, k, request, len(records), len(recs), queue_id, uniq))
        records.extend(recs)

    for i, cmd in enumerate(cmds):
        if type(cmd) is not SendRun:
            general(i, None, cmd)
            continue
        lo = cmd.lo
        while lo < cmd.hi:
            run, lo = proc.native_sends.take(proc, cmd, lo, i, born_v6, rules, props_fixed, props_uniq)
            if run is not None:  # records stay in arrival order
                send_native.encode(run, records, born, store_host, proc.clock_ms(), cluster, proc.uniq_keys)
                runs.append(run)
            if lo < cmd.hi:  # this one the general path serves
                general(i, lo - cmd.lo, cmd.send(lo).command())
                lo += 1

    def settle(req, failed: Exception | None) -> bool:
        """Every answer of the appended part, now: SUCCESS when the append
        (req) committed, refusals when it failed.  False, nothing done, when
        the failure hands the sends on (the forwarder's work needs a task)."""
        if failed is None and req is not None:
            placed, stamps = req.result, req.stamped
            for i, k, request, first, count, queue_id, uniq in parts:
                _put(replies, cmds, i, k, proc.success_frame(
                    request, queue_id, placed[first:first + count],
                    stamps[first:first + count] if stamps is not None else None, uniq))
            for r in runs:
                if not send_native.answer(r, cmds[r.item], replies, placed, stamps, store_host):
                    _answer_run_slowly(proc, r, cmds[r.item], replies, placed)
        elif failed is not None and hand_on and _hands_on(proc, failed):
            return False
        elif failed is not None:
            base = req.first_index if req is not None else -1
            for i, k, request, first, count, _, _ in parts:
                _put(replies, cmds, i, k, proc.refusal(request, failed, records[first:first + count],
                                                        base + first if base >= 0 else -1))
            for r in runs:
                sends = cmds[r.item].sends()
                out = send_native.run_replies(replies, r.item, cmds[r.item])
                for j in range(r.n):
                    first = r.first + j
                    out[r.k0 + j] = proc.refusal(sends[r.k0 + j], failed, records[first:first + 1],
                                                  base + first if base >= 0 else -1)
        if _rt.TRACER is not None:  # tools/bench/round.py
            _rt.TRACER.mark("encoded")
        return True

    async def hand_on(failed: Exception) -> None:
        """Nothing of it is in the log: each send handed on, in arrival order."""
        unstored = [(i, k, request) for i, k, request, *_ in parts]
        for r in runs:
            sends = cmds[r.item].sends()
            unstored.extend((r.item, r.k0 + j, sends[r.k0 + j]) for j in range(r.n))
        unstored.sort(key=lambda t: (t[0], t[1] or 0))
        for i, k, request in unstored:
            _put(replies, cmds, i, k, await proc.unstored(request, failed, conn.remote_address))

    if records and not slow:
        # The usual burst: answered by the log's driver as the commit covers
        # it (AppendRequest.on_done), without a task of its own -- or at
        # once, if the log commits it within submit().
        answers = BurstAnswers()

        def on_done(req) -> None:
            if _rt.TRACER is not None:
                _rt.TRACER.mark("woken")
            failed = req.error
            try:
                if settle(req, failed):
                    answers.give(replies)
                    return
            except Exception as exc:  # a bug: the connection answers SYSTEM_ERROR for all
                answers.give_async(_raising(exc))
                return

            async def handed_on() -> list:
                await hand_on(failed)
                return replies
            answers.give_async(handed_on)

        try:
            # now, so bursts reach the log in arrival order
            proc.replica.submit(records, on_done=on_done)
        except CommitLogError as exc:
            if settle(None, exc):
                answers.give(replies)
            else:
                answers.give_async(functools.partial(_hand_on_then, hand_on, exc, replies))
        return answers

    req, error = None, None
    if records:
        try:
            req = proc.replica.submit(records)
        except CommitLogError as exc:
            error = exc

    async def finish() -> list:
        for i, k, request in slow:  # a topic to create first (or to refuse): then a burst of its own
            try:
                await proc.topic_for_send(request, create=create_topics)
            except proc.REFUSALS as exc:
                _put(replies, cmds, i, k, proc.refusal(request, exc, []))
                continue
            [reply] = await accept_burst(proc, conn, [request], hand_on=hand_on, create_topics=False)()
            _put(replies, cmds, i, k, reply)
        failed = error
        if req is not None:
            try:
                await proc.replica.wait(req)
            except CommitLogError as exc:
                failed = exc
        if not settle(req, failed):
            await hand_on(failed)
        return replies

    return BurstAnswers.later(finish)


async def _hand_on_then(hand_on, exc: Exception, replies: list) -> list:
    await hand_on(exc)
    return replies


def _raising(exc: Exception):
    async def finish() -> list:
        raise exc
    return finish


def _answer_run_slowly(proc, run, sends: SendRun, replies, placed) -> None:
    """A native run's answers the general way (no stamps to answer from)."""
    out = send_native.run_replies(replies, run.item, sends)
    ones = sends.sends()
    for j in range(run.n):
        first = run.first + j
        o, n = run.uniq_off[j], run.uniq_len[j]
        out[run.k0 + j] = proc.success_frame(ones[run.k0 + j].command(), run.queue_ids[j],
                                              placed[first:first + 1], None,
                                              run.records[o:o + n].decode())


def _hands_on(proc, exc: Exception) -> bool:
    """Whether refusals for `exc` go to the forwarder (any request of the
    burst stands for all: the bit it checks per request is checked again
    in proc.unstored)."""
    fwd = proc.forwarder
    return fwd is not None and isinstance(exc, UNSTORED) and fwd.in_window()


def _handed_on(proc, conn, cmds: list, replies: list, unstored: list, exc: Exception):
    """The async half of a burst none of which this node could take: each
    request handed on (or held) in arrival order, see forward.py."""
    async def finish() -> list:
        for i, k, request in unstored:
            _put(replies, cmds, i, k, await proc.unstored(request, exc, conn.remote_address))
        return replies
    return BurstAnswers.later(finish)


def _answered(replies: list) -> BurstAnswers:
    """A burst answered already in its synchronous half."""
    return BurstAnswers.now(replies)


def _put(replies: list, cmds: list, i: int, k: int | None, reply) -> None:
    """The answer to item i, or to request k of the SendRun at item i."""
    if k is None:
        replies[i] = reply
    else:
        send_native.run_replies(replies, i, cmds[i])[k] = reply
