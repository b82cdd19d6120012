# Owns the README's tables of RocketMQ request codes, generated from the
# code itself so they cannot drift from what is served or enforced:
#
#   codes:begin/end  which codes a ledgermq broker, name server and Python
#                    client answer and which they refuse
#                    (REQUEST_CODE_NOT_SUPPORTED) -- from the broker's
#                    Processors (each processor's CODES, what it registers),
#                    the name server's dispatcher and the client's
#                    pushed-request handler -- and each code's ACL rule kind
#                    on the broker and the name server (broker/acl/table.py)
#   acl:begin/end    the ACL section's table: what each code the broker
#                    serves needs, grouped by rule (broker/acl/table.py)
#
#   python -m tools.codes_table            print the tables (markdown)
#   python -m tools.codes_table --write    rewrite them in README.md, between
#                                          their begin / end markers
# tests/tools/test_deploy.py and tests/tools/test_codes_table.py fail when
# README.md is not up to date.
import os
import sys
import types

import attrs
import click
import trio

from broker.acl.table import NS_ADMIN, NS_OPEN, RULES, Kind, rule_for
from broker.namesrv.service import NameServer, NamesrvConfig
from broker.remoting.codes import RequestCode
from broker.server import Processors
from tools.cli import CONTEXT, run_command

BEGIN, END = "<!-- codes:begin (python -m tools.codes_table --write) -->", "<!-- codes:end -->"
ACL_BEGIN, ACL_END = "<!-- acl:begin (python -m tools.codes_table --write) -->", "<!-- acl:end -->"
LEDGERMQ_OWN = range(9100, 9200)


def broker_codes() -> frozenset[int]:
    codes: set[int] = set()
    for field in attrs.fields(Processors):
        codes |= {int(c) for c in getattr(field.type, "CODES", ())}
    return frozenset(codes)


def client_codes() -> frozenset[int]:
    """What the Python client answers when a broker pushes a request to it:
    each code is put to a ClientInstance's handler (no IO: it answers from
    its own tables), and those it does not refuse are listed."""
    from broker.client.instance import ClientInstance
    from broker.remoting.codes import ResponseCode
    from broker.remoting.command import RemotingCommand

    instance = ClientInstance(None, "127.0.0.1:9876", client_id="codes-table")
    # the connection a request came on: handlers name its peer in their logs
    conn = types.SimpleNamespace(remote_address="(codes table probe)")

    async def probe() -> frozenset[int]:
        out = set()
        for code in RequestCode:
            cmd = RemotingCommand.create_request(code, {}).as_request(1)
            resp = await instance.handle_pushed(conn, cmd)
            if resp is None or resp.code != ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                out.add(int(code))
        return frozenset(out)

    return trio.run(probe)


def namesrv_codes() -> frozenset[int]:
    return NameServer(NamesrvConfig()).dispatcher.codes


def _namesrv_rule(code: int) -> str:
    return {NS_ADMIN: "admin", NS_OPEN: "open"}.get(rule_for(code).namesrv, "-")


def table() -> str:
    broker, namesrv, client = broker_codes(), namesrv_codes(), client_codes()
    lines = ["| Code | RocketMQ name | Broker | Name server | Python client | ACL: broker | ACL: name server |",
             "|---:|---|---|---|---|---|---|"]
    mark = {True: "answered", False: "refused"}
    for code in sorted(RequestCode, key=int):
        if int(code) in LEDGERMQ_OWN:
            continue
        lines.append(f"| {int(code)} | {code.name} | {mark[int(code) in broker]} | {mark[int(code) in namesrv]} | "
                     f"{'answered' if int(code) in client else '-'} | {rule_for(code).kind.value} | "
                     f"{_namesrv_rule(code)} |")
    own = [c for c in sorted(RequestCode, key=int) if int(c) in LEDGERMQ_OWN]
    lines.append("")
    lines.append("ledgermq's own codes (mqadmin's replication commands, unused by RocketMQ; ACL: "
                 + "/".join(sorted({rule_for(c).kind.value for c in own})) + "): "
                 + ", ".join(f"{int(c)} {c.name}" for c in own) + ".")
    lines.append("Any code not listed is refused with REQUEST_CODE_NOT_SUPPORTED, as RocketMQ refuses a code it "
                 "does not know.")
    return "\n".join(lines) + "\n"


def acl_table() -> str:
    """What each code the broker serves needs (README, ACL section)."""
    broker = broker_codes()
    rows: dict[str, list[int]] = {}
    for code in sorted(broker):
        rule = RULES[code]
        needs = rule.needs if rule.kind is not Kind.SIGNATURE else f"a valid signature ({rule.needs})"
        rows.setdefault(needs, []).append(code)

    def names(codes) -> str:
        return ", ".join(f"`{RequestCode(c).name}` {c}" for c in codes)

    order = {Kind.RESOURCES: 0, Kind.SIGNATURE: 1, Kind.ADMIN: 2}
    lines = ["| Request | Needs |", "|---|---|"]
    for needs, codes in sorted(rows.items(), key=lambda kv: (order[RULES[kv[1][0]].kind], kv[1][0])):
        lines.append(f"| {names(codes)} | {needs} |")
    unserved_admin = sorted(c for c, r in RULES.items() if c not in broker and r.kind is Kind.ADMIN)
    lines.append("")
    lines.append(f"Codes the broker does not serve need a valid signature and are then refused with "
                 f"REQUEST_CODE_NOT_SUPPORTED; {', '.join(map(str, unserved_admin))} need an admin account even "
                 f"so. `CHECK_TRANSACTION_STATE` 39 goes the other way: {RULES[39].needs.split('(', 1)[1][:-1]}.")
    ns_admin = sorted(c for c, r in RULES.items() if r.namesrv == NS_ADMIN)
    ns_open = sorted(c for c, r in RULES.items() if r.namesrv == NS_OPEN)
    lines.append(f"The name server checks only its route writes ({', '.join(map(str, ns_admin))}): {NS_ADMIN}; "
                 f"its reads ({', '.join(map(str, ns_open))}) are {NS_OPEN}.")
    return "\n".join(lines) + "\n"


def _between(text: str, begin: str, end: str, body: str) -> str:
    start, stop = text.index(begin) + len(begin), text.index(end)
    return text[:start] + "\n" + body + text[stop:]


def rewrite(text: str) -> str:
    return _between(_between(text, BEGIN, END, table()), ACL_BEGIN, ACL_END, acl_table())


@click.command(context_settings=CONTEXT)
@click.option("--write", is_flag=True, help="update README.md in place")
def command(write: bool) -> int:
    """Print the README's tables of request codes and ACL rules (markdown),
    or rewrite them in README.md between their begin/end markers."""
    if not write:
        sys.stdout.write(table() + "\n" + acl_table())
        return 0
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(rewrite(text))
    return 0


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.codes_table")


if __name__ == "__main__":
    sys.exit(main())
