# Owns mqadmin's membership commands (ledgermq's own; DLedger has no working
# membership change): addDLedgerPeer (a new node joins a group as a learner),
# promoteDLedgerPeer (the learner becomes a voter once caught up) and
# removeDLedgerPeer (one voter or learner leaves; the leader hands over its
# leadership first).  Each is one single-server change sent to the group's
# leader (LEDGERMQ_CHANGE_MEMBERSHIP), answered once the configuration entry
# is committed; the leader waits out what passes with time (a learner
# catching up, the previous change committing).
#
# Replacing n0 of group broker-a by a fresh node n3 (README, "Replacing a
# node"):
#   mqadmin addDLedgerPeer -b broker-a --peer n3-10.0.0.4:40911
#   (start n3 with dLegerJoin=true and dLegerPeers listing the group and n3)
#   mqadmin promoteDLedgerPeer -b broker-a -p n3
#   mqadmin removeDLedgerPeer -b broker-a -p n0
#   (stop n0)
import click
import trio

from broker.remoting.codes import ResponseCode
from commitlog.config import ConfigError, parse_peers
from tools.mqadmin.adminapi import AdminError, MQAdmin, NotFoundError, RequestFailedError
from tools.mqadmin.dledger_cmds import dledger_statuses, group_nodes
from tools.mqadmin.online import online
from tools.mqadmin.render import Output

DEFAULT_WAIT_S = 60.0


async def _group(admin: MQAdmin, group: str) -> tuple[dict[str, dict], str, dict]:
    """(selfId -> status with brokerAddr, leader's broker address, leader's status)."""
    statuses = await dledger_statuses(admin, await group_nodes(admin, group, None))
    live = {s["selfId"]: {**s, "brokerAddr": a} for a, s in statuses.items() if isinstance(s, dict)}
    leader = next((s for s in live.values() if s.get("role") == "leader"), None)
    if leader is None:
        raise AdminError(f"group {group} has no leader right now; try again after the election")
    return live, leader["brokerAddr"], leader


def _report(out: Output, group: str, what: str, answer: dict, note: str | None = None) -> None:
    result = {"group": group, "change": what, **answer}
    if out.as_json:
        out.json(result)
        return
    out.line(f"{what} in {group}: committed at entry {answer['configIndex']}; voters "
             f"{','.join(answer['voters'])}, learners {','.join(answer['learners']) or '-'}")
    if note:
        out.line(note)


@click.command("addDLedgerPeer", epilog="""\b
The new node is started with dLegerJoin=true (its dLegerPeers lists the
group's peers and itself); it catches up from the leader's log.
Examples:
  mqadmin addDLedgerPeer -b broker-a --peer n3-127.0.0.1:40914""")
@click.option("-b", "--brokerName", "group", required=True, metavar="GROUP", help="the broker group")
@click.option("--peer", required=True, metavar="ID-HOST:PORT", help="the new peer, as in dLegerPeers")
@click.option("--wait", type=float, default=DEFAULT_WAIT_S, show_default=True, help="seconds to wait for the commit")
@online
async def add_peer(admin: MQAdmin, out: Output, group, peer, wait):
    """Add a node to a group as a learner: it receives the log, does not vote."""
    try:
        (p,) = parse_peers(peer, "--peer")
    except (ConfigError, ValueError) as e:
        raise click.BadParameter(str(e), param_hint="--peer") from None
    _, leader_addr, _ = await _group(admin, group)
    answer = await admin.change_membership(leader_addr, "addLearner", p.peer_id, p.address, timeout=wait)
    _report(out, group, f"added {p.peer_id} ({p.address}) as a learner", answer)


@click.command("promoteDLedgerPeer", epilog="""\b
Waits (up to --wait) until the learner has caught up with the leader.
Examples:
  mqadmin promoteDLedgerPeer -b broker-a -p n3""")
@click.option("-b", "--brokerName", "group", required=True, metavar="GROUP", help="the broker group")
@click.option("-p", "--peer", "peer_id", required=True, metavar="ID", help="the learner's dLegerSelfId")
@click.option("--wait", type=float, default=DEFAULT_WAIT_S, show_default=True,
              help="seconds to wait for the catch-up and the commit")
@online
async def promote_peer(admin: MQAdmin, out: Output, group, peer_id, wait):
    """Make a caught-up learner a voter."""
    _, leader_addr, _ = await _group(admin, group)
    answer = await admin.change_membership(leader_addr, "promote", peer_id, timeout=wait)
    _report(out, group, f"promoted {peer_id} to voter", answer)


@click.command("removeDLedgerPeer", epilog="""\b
Removing the leader hands its leadership to a caught-up voter first.  Stop
the removed node afterwards.
Examples:
  mqadmin removeDLedgerPeer -b broker-a -p n0""")
@click.option("-b", "--brokerName", "group", required=True, metavar="GROUP", help="the broker group")
@click.option("-p", "--peer", "peer_id", required=True, metavar="ID", help="the member's dLegerSelfId")
@click.option("--wait", type=float, default=DEFAULT_WAIT_S, show_default=True, help="seconds to wait for the commit")
@online
async def remove_peer(admin: MQAdmin, out: Output, group, peer_id, wait):
    """Remove a voter or learner from a group (one server at a time)."""
    live, leader_addr, leader = await _group(admin, group)
    voters, learners = leader.get("voters") or [], leader.get("learners") or []
    if peer_id not in voters and peer_id not in learners:
        raise NotFoundError(f"{peer_id} is not a member of group {group} (voters {', '.join(voters)}; "
                            f"learners {', '.join(learners) or '-'})")
    if leader["selfId"] == peer_id:
        peers = leader.get("peers") or {}
        candidates = sorted((peers.get(v, {}).get("lag", 1 << 62), v) for v in voters
                            if v != peer_id and v in live)
        if not candidates:
            raise AdminError(f"{peer_id} leads {group} and no other voter answers; cannot hand over")
        target = candidates[0][1]
        await admin.transfer_leadership(leader_addr, target)
        if not out.as_json:
            out.line(f"leadership of {group} handed from {peer_id} to {target}")
        answer = await _on_new_leader(admin, group, peer_id, wait)
    else:
        answer = await admin.change_membership(leader_addr, "remove", peer_id, timeout=wait)
    _report(out, group, f"removed {peer_id}", answer, note=f"stop {peer_id} now: it is no longer a member")


async def _on_new_leader(admin: MQAdmin, group: str, peer_id: str, wait: float) -> dict:
    """The removal, once the group has its new leader.  The handover is
    answered when the old leader steps down, which can be before the
    target has won its election (it answers "not leader" meanwhile): find
    the leader again and retry, for up to `wait` seconds."""
    deadline = trio.current_time() + wait
    while True:
        leader = None
        try:
            _, leader_addr, leader = await _group(admin, group)
        except AdminError:  # no leader right now: the election is still on
            if trio.current_time() >= deadline:
                raise
        if leader is not None:
            if leader["selfId"] == peer_id:
                raise AdminError(f"{peer_id} leads {group} again; the handover did not hold")
            try:
                return await admin.change_membership(leader_addr, "remove", peer_id,
                                                     timeout=max(1.0, deadline - trio.current_time()))
            except RequestFailedError as e:
                if e.code != ResponseCode.SERVICE_NOT_AVAILABLE or trio.current_time() >= deadline:
                    raise
        await trio.sleep(0.2)  # pacing between tries against another process; no event to wait on


def register(group: click.Group) -> None:
    for cmd in (add_peer, promote_peer, remove_peer):
        group.add_command(cmd)
