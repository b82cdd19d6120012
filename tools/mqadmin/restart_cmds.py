# Owns `mqadmin rollingRestart`: restart every node of one broker group, one
# at a time, without failing a producer's send:
#
#   1. every node must answer and be caught up first (restarting one node
#      of a group that already misses one would lose the quorum);
#   2. followers first, the master last;
#   3. before the master goes, its leadership is handed to the most caught
#      up follower (leadershipTransfer, which waits until the name server
#      routes to the new master), then --drain-seconds pass: clients learn
#      the new master from the name server only when they next ask (a Java
#      or C++ client every 30 s) and meanwhile the old master hands on the
#      writes it still receives (broker sendForwardWindowMillis, 60 s);
#   4. the node is restarted by the operator's --restart-command (a template
#      with {selfId}, {brokerAddr}, {brokerName} and {pid}, run by sh; e.g.
#      `systemctl restart ledgermq-broker@{selfId}` with deploy/systemd),
#      which must return once the node was restarted;
#   5. the next node waits until this one answers from a new process
#      (dledgerStatus `process`), has caught up to the group's commit index
#      as of its restart, and is registered with the name server again.
#
# The broker itself is not told to exit: how a node is started belongs to
# its supervisor.  Waiting on other processes means asking them again (with
# backoff); there is no push for any of these states.
import shlex
from collections.abc import Awaitable, Callable

import attrs
import click
import trio

from tools.mqadmin.adminapi import AdminError, MQAdmin
from tools.mqadmin.dledger_cmds import wait_for_master
from tools.mqadmin.online import online
from tools.mqadmin.render import Output

Restart = Callable[[dict], Awaitable[None]]  # a node's dledgerStatus -> it was restarted


@attrs.define
class RollingRestart:
    admin: MQAdmin
    group: str
    restart: Restart
    drain_seconds: float = 35.0
    node_timeout: float = 120.0
    say: Callable[[str], None] = print
    done: list = attrs.Factory(list)  # per node: {selfId, brokerAddr, wasLeader, seconds}

    async def run(self) -> list[dict]:
        nodes = await self._healthy(self.node_timeout)
        leader = next(a for a, s in nodes.items() if s["role"] == "leader")
        order = sorted((a for a in nodes if a != leader), key=lambda a: nodes[a]["selfId"]) + [leader]
        for addr in order:
            await self._restart_one(addr)
        return self.done

    async def _restart_one(self, addr: str) -> None:
        t0 = trio.current_time()
        status = await self.admin.dledger_status(addr)
        was_leader = status["role"] == "leader"
        if was_leader:
            await self._hand_over(addr, status)
            status = await self.admin.dledger_status(addr)
        committed = max(s["committedIndex"] for s in (await self._statuses()).values())
        self.say(f"restarting {status['selfId']} ({addr})")
        await self.restart(status)
        await self._back(addr, status, committed)
        self.done.append({"selfId": status["selfId"], "brokerAddr": addr, "wasLeader": was_leader,
                          "seconds": round(trio.current_time() - t0, 1)})
        self.say(f"{status['selfId']} is back and caught up (index {committed})")

    async def _hand_over(self, addr: str, status: dict) -> None:
        peers = status.get("peers") or {}
        voters = set(status.get("voters") or peers)
        candidates = sorted((p["lag"], pid) for pid, p in peers.items() if pid in voters)
        if not candidates:
            raise AdminError(f"{status['selfId']} leads {self.group} alone: nobody to hand the leadership to")
        target = candidates[0][1]
        answer = await self.admin.transfer_leadership(addr, target)
        self.say(f"leadership of {self.group} handed from {status['selfId']} to {target} "
                 f"(term {answer.get('term', '?')})")
        target_addr = next(a for a, s in (await self._statuses()).items() if s["selfId"] == target)
        await wait_for_master(self.admin, self.group, target_addr, self.node_timeout)
        if self.drain_seconds > 0:
            self.say(f"waiting {self.drain_seconds:g} s for clients to learn the new master "
                     f"({status['selfId']} hands on what it still receives)")
            await trio.sleep(self.drain_seconds)

    async def _back(self, addr: str, before: dict, committed: int) -> None:
        """Until `addr` answers from a new process, caught up to `committed`,
        and the name server lists it again."""
        deadline = trio.current_time() + self.node_timeout
        delay, last = 0.1, "no answer yet"
        while True:
            try:
                st = await self.admin.dledger_status(addr)
                if st.get("process") == before.get("process"):
                    last = "still the old process"
                elif st["committedIndex"] < committed or st["role"] not in ("follower", "leader"):
                    last = f"{st['role']} at committed index {st['committedIndex']} (waiting for {committed})"
                elif addr not in (await self.admin.group_addrs(self.group)).values():
                    last = "not registered with the name server yet"
                else:
                    return
            except AdminError as e:
                last = str(e)
            if trio.current_time() + delay > deadline:
                raise AdminError(f"{before['selfId']} ({addr}) did not come back within {self.node_timeout:g} s: "
                                 f"{last}; the rolling restart stops here")
            await trio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _statuses(self) -> dict[str, dict]:
        out = {}
        for addr in (await self.admin.group_addrs(self.group)).values():
            try:
                out[addr] = await self.admin.dledger_status(addr)
            except AdminError:
                pass
        return out

    async def _healthy(self, timeout: float) -> dict[str, dict]:
        """Every voter of the group answers, one leads, and nobody lags."""
        deadline = trio.current_time() + timeout
        delay, why = 0.1, ""
        while True:
            nodes = await self._statuses()
            leaders = [s for s in nodes.values() if s["role"] == "leader"]
            if len(leaders) == 1:
                voters = set(leaders[0].get("voters") or ())
                seen = {s["selfId"] for s in nodes.values()}
                lagging = [pid for pid, p in (leaders[0].get("peers") or {}).items() if p["lag"] > 0
                           and pid in voters]
                if voters - seen:
                    why = f"no answer from {', '.join(sorted(voters - seen))}"
                elif lagging:
                    why = f"{', '.join(sorted(lagging))} not caught up"
                else:
                    return nodes
            else:
                why = "no single leader"
            if trio.current_time() + delay > deadline:
                raise AdminError(f"group {self.group} is not healthy enough to restart a node ({why})")
            await trio.sleep(delay)
            delay = min(delay * 2, 1.0)


def command_restart(template: str) -> Restart:
    """The --restart-command template as a Restart: run by sh, the node's
    fields filled in (shell-quoted); a non-zero exit stops the restart."""
    async def restart(status: dict) -> None:
        fields = {"selfId": status["selfId"], "brokerAddr": status["brokerAddr"],
                  "brokerName": status["brokerName"], "pid": (status.get("process") or {}).get("pid", "")}
        cmd = template.format(**{k: shlex.quote(str(v)) for k, v in fields.items()})
        r = await trio.run_process(["sh", "-c", cmd], check=False, capture_stderr=True)
        if r.returncode != 0:
            raise AdminError(f"restart command for {status['selfId']} exited {r.returncode}: "
                             f"{r.stderr.decode(errors='replace').strip()[-500:]}")
    return restart


@click.command("rollingRestart", epilog="""\b
Examples:
  mqadmin rollingRestart -b broker-a --restart-command 'systemctl restart ledgermq-broker@{selfId}'
  mqadmin rollingRestart -b broker-a --restart-command 'ssh {selfId} systemctl restart ledgermq-broker@{selfId}' \\
      --drain-seconds 40""")
@click.option("-b", "--brokerName", "group", required=True, metavar="GROUP", help="the broker group (brokerName)")
@click.option("--restart-command", "template", required=True, metavar="CMD",
              help="restarts one node and returns once it was restarted; {selfId} {brokerAddr} {brokerName} {pid}")
@click.option("--drain-seconds", type=click.FloatRange(min=0), default=35.0, show_default=True,
              help="after handing the leadership over, how long before the old master restarts "
                   "(clients ask the name server for routes every 30 s)")
@click.option("--node-timeout", type=click.FloatRange(min=1), default=120.0, show_default=True,
              help="how long one node may take to come back and catch up")
@online
async def rolling_restart(admin: MQAdmin, out: Output, group, template, drain_seconds, node_timeout):
    """Restart every node of a group one at a time, followers first, the
    master last after handing its leadership over."""
    rr = RollingRestart(admin, group, command_restart(template), drain_seconds, node_timeout,
                        say=out.note if out.as_json else out.line)
    done = await rr.run()
    if out.as_json:
        out.json({"group": group, "restarted": done})
    else:
        out.line(f"rolling restart of {group} done: " + ", ".join(d["selfId"] for d in done))


def register(group: click.Group) -> None:
    group.add_command(rolling_restart)
