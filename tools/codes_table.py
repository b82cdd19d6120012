# Owns the README's table of RocketMQ request codes: which ones a ledgermq
# broker, name server and Python client answer and which they refuse
# (REQUEST_CODE_NOT_SUPPORTED), generated from the code itself -- the
# broker's Processors (each processor's CODES, what it registers), the name
# server's dispatcher, and the client's pushed-request handler -- so the
# table cannot drift from what is served.
#
#   python -m tools.codes_table            print the table (markdown)
#   python -m tools.codes_table --write    rewrite it in README.md, between
#                                          the codes:begin / codes:end markers
# tests/tools/test_codes_table.py fails when README.md is not up to date.
import argparse
import os
import sys
import types

import attrs
import trio

from broker.namesrv.service import NameServer, NamesrvConfig
from broker.remoting.codes import RequestCode
from broker.server import Processors

BEGIN, END = "<!-- codes:begin (python -m tools.codes_table --write) -->", "<!-- codes:end -->"
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


def table() -> str:
    broker, namesrv, client = broker_codes(), namesrv_codes(), client_codes()
    lines = ["| Code | RocketMQ name | Broker | Name server | Python client |", "|---:|---|---|---|---|"]
    mark = {True: "answered", False: "refused"}
    for code in sorted(RequestCode, key=int):
        if int(code) in LEDGERMQ_OWN:
            continue
        lines.append(f"| {int(code)} | {code.name} | {mark[int(code) in broker]} | {mark[int(code) in namesrv]} | "
                     f"{'answered' if int(code) in client else '-'} |")
    own = [c for c in sorted(RequestCode, key=int) if int(c) in LEDGERMQ_OWN]
    lines.append("")
    lines.append("ledgermq's own codes (mqadmin's replication commands, unused by RocketMQ): "
                 + ", ".join(f"{int(c)} {c.name}" for c in own) + ".")
    lines.append("Any code not listed is refused with REQUEST_CODE_NOT_SUPPORTED, as RocketMQ refuses a code it "
                 "does not know.")
    return "\n".join(lines) + "\n"


def rewrite(text: str) -> str:
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + table() + text[end:]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.codes_table", description=__doc__)
    p.add_argument("--write", action="store_true", help="update README.md in place")
    args = p.parse_args(argv)
    if not args.write:
        sys.stdout.write(table())
        return 0
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(rewrite(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
