# Owns mqadmin's name server commands for draining a broker group, as
# RocketMQ 4.x has them: wipeWritePerm (WIPE_WRITE_PERM_OF_BROKER, 205) and
# addWritePerm (ADD_WRITE_PERM_OF_BROKER, 327), sent to every name server
# of -n one by one, as the stock tool does.  Producers stop choosing the
# group's queues at their next route refresh, consumers keep reading them,
# and consumerProgress shows when the group's backlog reached zero.  The
# wipe stays in force across the group's failovers until addWritePerm
# (broker/namesrv/routes.py), but only in the memory of the name servers
# that got it.
import click

from broker.namesrv.client import parse_namesrv_addrs
from tools.mqadmin.adminapi import AdminError, MQAdmin
from tools.mqadmin.online import online
from tools.mqadmin.render import Output


async def _each_namesrv(admin: MQAdmin, out: Output, broker_name: str, wipe: bool) -> int:
    results, failed = {}, {}
    for ns in parse_namesrv_addrs(admin.namesrv_addr):
        try:
            results[ns] = await admin.namesrv_write_perm(ns, broker_name, wipe)
        except AdminError as e:
            failed[ns] = str(e)
    verb = "wipe" if wipe else "add"
    if out.as_json:
        out.json({"brokerName": broker_name, "action": f"{verb}WritePerm", "topicCounts": results, "failed": failed})
    else:
        for ns, count in results.items():
            out.line(f"{verb} write perm of broker[{broker_name}] in name server[{ns}] OK, {count}")
        for ns, err in failed.items():
            out.line(f"{verb} write perm of broker[{broker_name}] in name server[{ns}] Failed: {err}")
    return 3 if failed else 0


@click.command("wipeWritePerm", epilog="""\b
Examples:
  mqadmin wipeWritePerm -b broker-b -n '127.0.0.1:9876;127.0.0.1:9877'""")
@click.option("-b", "--brokerName", "broker_name", required=True, metavar="NAME", help="the broker group")
@online
async def wipe_write_perm(admin: MQAdmin, out: Output, broker_name):
    """Stop producers from sending to a broker group (drain it)."""
    return await _each_namesrv(admin, out, broker_name, wipe=True)


@click.command("addWritePerm", epilog="""\b
Examples:
  mqadmin addWritePerm -b broker-b""")
@click.option("-b", "--brokerName", "broker_name", required=True, metavar="NAME", help="the broker group")
@online
async def add_write_perm(admin: MQAdmin, out: Output, broker_name):
    """Give a drained broker group its write permission back."""
    return await _each_namesrv(admin, out, broker_name, wipe=False)


def register(group: click.Group) -> None:
    for cmd in (wipe_write_perm, add_write_perm):
        group.add_command(cmd)
