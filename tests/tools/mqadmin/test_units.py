# mqadmin's pure parts and its error paths that need no cluster: the
# MessageQueue-keyed map parser against broker.processors.admin's encoder, the
# first-divergence binary search of compareReplicas, timestamps, the TPS
# meter, the broker config rendering, aligned table output, and the
# one-line errors / exit codes for bad flags and an unreachable name server.
import json
import os
import subprocess
import sys

import pytest

from broker.config import BrokerConfig
from broker.processors.admin import TpsMeter, encode_mq_map
from broker.processors.admin_clients import broker_config_properties, properties_text
from commitlog.config import iter_properties
from tests.helpers import REPO_ROOT
from tools.mqadmin.adminapi import decode_records, parse_mq_map
from tools.mqadmin.dledger_cmds import first_divergence
from tools.mqadmin.online import parse_timestamp

MQADMIN = [sys.executable, "-m", "tools.mqadmin"]
ROOT = str(REPO_ROOT)


def run(*args, env=None):
    return subprocess.run([*MQADMIN, *args], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={**os.environ, **(env or {})})


def test_parse_mq_map_reads_what_the_broker_writes():
    table = {("T", "broker-a", q): {"minOffset": q, "maxOffset": 10 * q, "lastUpdateTimestamp": 7} for q in range(3)}
    assert parse_mq_map(encode_mq_map(table)) == table
    offsets = {("T", "b", 0): 5, ("T", "b", 1): 0}
    assert parse_mq_map(encode_mq_map(offsets, {"consumeTps": 0.0})) == offsets
    assert parse_mq_map(b'{"offsetTable":{}}') == {}
    assert parse_mq_map(b"{}") == {}


async def test_first_divergence_finds_the_first_differing_index():
    for first in (3, 4, 50, 99, 100):
        calls = []

        async def differs(i, first=first, calls=calls):
            calls.append(i)
            return i >= first
        assert await first_divergence(3, 100, differs) == first
        assert len(calls) <= 9  # a binary search, not a scan
    async def never(i):
        return False
    assert await first_divergence(0, 100, never) is None
    assert await first_divergence(5, 4, never) is None


def test_timestamps_and_tps_meter():
    assert parse_timestamp("1700000000000") == 1700000000000
    assert parse_timestamp("-1") == -1
    a = parse_timestamp("2026-01-02#03:04:05:006")
    assert a == parse_timestamp("2026-01-02#03:04:05") + 6
    m = TpsMeter()
    assert m.tps(10) == 0.0
    for t in range(20):
        m.sample(float(t), t * 100)
    assert m.tps(10) == pytest.approx(100.0)


def test_broker_config_properties_round_trip():
    cfg, _ = BrokerConfig.from_dict({"brokerName": "b1", "dLegerGroup": "g", "dLegerSelfId": "n0",
                                     "dLegerPeers": "n0-127.0.0.1:1;n1-127.0.0.1:2", "brokerIP1": "127.0.0.1"})
    props = broker_config_properties(cfg)
    assert props["brokerName"] == "b1" and props["dLegerPeers"] == "n0-127.0.0.1:1;n1-127.0.0.1:2"
    parsed = {k: v for _, k, v in iter_properties(properties_text(props))}
    assert parsed == props
    again, _ = BrokerConfig.from_dict({k: v for k, v in parsed.items() if v})
    assert again.replication.peers == cfg.replication.peers and again.broker_name == "b1"


def test_decode_records_stops_at_garbage():
    from consumequeue import record as M
    recs = [M.MessageRecord("T", f"b{i}".encode(), {"KEYS": f"k{i}"}, queue_offset=i) for i in range(3)]
    body = b"".join(M.encode(r) for r in recs)
    out = decode_records(body + b"\x00\x00")
    assert [r.body for r in out] == [b"b0", b"b1", b"b2"] and out[2].keys == ["k2"]


def test_errors_are_one_line_with_exit_codes():
    # Unreachable name server: exit 3, one line, no traceback.
    for cmd in (["clusterList"], ["topicList", "--json"], ["consumerProgress", "-g", "G"]):
        r = run(*cmd, "-n", "127.0.0.1:1")
        assert r.returncode == 3, (cmd, r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("mqadmin: error:"), r.stderr
        assert "Traceback" not in r.stderr and r.stdout == ""
    # wipeWritePerm reports each name server it could not reach.
    r = run("wipeWritePerm", "-b", "broker-b", "-n", "127.0.0.1:1;127.0.0.1:2")
    assert r.returncode == 3 and r.stdout.count("Failed") == 2 and "Traceback" not in r.stderr, r
    # NAMESRV_ADDR is the default for -n.
    r = run("topicList", env={"NAMESRV_ADDR": "127.0.0.1:1"})
    assert r.returncode == 3 and "127.0.0.1:1" in r.stderr
    # No name server at all, bad flags, bad values: usage errors (2).
    env = {k: v for k, v in os.environ.items() if k != "NAMESRV_ADDR"}
    r = subprocess.run([*MQADMIN, "clusterList"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert r.returncode == 2 and "NAMESRV_ADDR" in r.stderr
    for bad in (["updateTopic", "-n", "127.0.0.1:1", "-t", "T", "-c", "C", "-r", "many"],
                ["updateTopic", "-n", "127.0.0.1:1", "-t", "T"],  # neither -b nor -c
                ["resetOffsetByTime", "-n", "127.0.0.1:1", "-g", "G", "-t", "T", "-s", "yesterday"],
                ["topicStatus", "--no-such-flag"], ["noSuchCommand"],
                ["addDLedgerPeer", "-n", "127.0.0.1:1", "-b", "broker-a", "--peer", "n3"],   # no address
                ["wipeWritePerm", "-n", "127.0.0.1:1"]):                                       # no -b
        r = run(*bad)
        assert r.returncode == 2, (bad, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and "Error" in r.stderr


def test_help_has_examples_for_every_online_command():
    from tools.mqadmin import cli
    online = ["clusterList", "brokerStatus", "getBrokerConfig", "updateBrokerConfig", "topicList", "updateTopic",
              "deleteTopic", "topicRoute", "topicStatus", "consumerProgress", "consumerConnection",
              "producerConnection", "resetOffsetByTime", "updateSubGroup", "deleteSubGroup", "queryMsgById",
              "queryMsgByKey", "queryMsgByUniqueKey", "queryMsgByOffset", "printMsg", "sendMessage",
              "consumeMessage", "dledgerStatus", "leadershipTransfer", "compareReplicas", "wipeWritePerm",
              "addWritePerm", "addDLedgerPeer", "promoteDLedgerPeer", "removeDLedgerPeer"]
    for name in online:
        cmd = cli.commands[name]
        assert "Examples:" in (cmd.epilog or ""), name
        assert any("-n" in p.opts for p in cmd.params) and any("--json" in p.opts for p in cmd.params), name
    r = run("consumerProgress", "--help")
    assert r.returncode == 0 and "-g, --groupName" in r.stdout and "Examples:" in r.stdout
    r = run(env={"_MQADMIN_COMPLETE": "bash_source"})
    assert r.returncode == 0 and "_mqadmin_completion" in r.stdout


def test_table_output_is_aligned_and_uncut_in_a_pipe():
    code = ("from tools.mqadmin.render import Output\n"
            "Output().table(['#A', '#LongerName'], [['x' * 300, 1], ['y', None]])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    lines = r.stdout.splitlines()
    assert [line.split() for line in lines] == [["#A", "#LongerName"], ["x" * 300, "1"], ["y", "-"]]
    assert lines[0].index("#LongerName") == lines[1].index("1") == lines[2].index("-")
    assert "\x1b[" not in r.stdout  # no colour outside a terminal
    assert json.loads(json.dumps({"ok": True}))


async def test_compare_replicas_finds_an_injected_divergence():
    """compareReplicas end to end against in-process fake brokers and name
    server (a real divergence cannot be made on a live group: recovery
    refuses a store whose chain CRCs do not verify).  Replica n2 diverges
    from index 37 on; the command must name exactly that index."""
    import trio

    from broker.remoting.codes import RequestCode, ResponseCode
    from broker.remoting.server import RequestDispatcher, serve_remoting

    DIVERGE_AT, COMMITTED = 37, 100
    servers = {}

    def broker(self_id, role, crc):
        async def handle(conn, cmd):
            if cmd.code == RequestCode.LEDGERMQ_DLEDGER_STATUS:
                st = {"selfId": self_id, "group": "g", "brokerName": "g", "brokerAddr": servers[self_id].address,
                      "brokerId": 0 if role == "leader" else 1, "role": role, "term": 3, "leader": "n0",
                      "ledgerBeginIndex": 0, "ledgerEndIndex": COMMITTED, "committedIndex": COMMITTED, "peers": {}}
                return cmd.make_response(ResponseCode.SUCCESS, body=json.dumps(st).encode())
            index = int(cmd.ext_fields["index"])
            return cmd.make_response(ResponseCode.SUCCESS, ext_fields={"chainCrc": crc(index), "index": index})
        return handle

    async def namesrv(conn, cmd):
        addrs = {str(i): servers[f"n{i}"].address for i in range(3)}
        body = {"brokerAddrTable": {"g": {"cluster": "C", "brokerName": "g", "brokerAddrs": addrs}},
                "clusterAddrTable": {"C": ["g"]}}
        return cmd.make_response(ResponseCode.SUCCESS, body=json.dumps(body).encode())

    good = lambda i: (i * 7919) & 0xFFFFFFFF  # noqa: E731
    bad = lambda i: good(i) if i < DIVERGE_AT else good(i) ^ 1  # noqa: E731
    async with trio.open_nursery() as nursery:
        for self_id, role, crc in (("n0", "leader", good), ("n1", "follower", good), ("n2", "follower", bad)):
            servers[self_id] = await nursery.start(serve_remoting, RequestDispatcher(broker(self_id, role, crc)),
                                                   "127.0.0.1", 0)
        ns = await nursery.start(serve_remoting, RequestDispatcher(namesrv), "127.0.0.1", 0)
        r = await trio.run_process([*MQADMIN, "compareReplicas", "-c", "g", "--json", "-n", ns.address],
                                   capture_stdout=True, capture_stderr=True, check=False, cwd=ROOT)
        assert r.returncode == 1, r.stderr
        result = json.loads(r.stdout)
        assert not result["consistent"] and result["comparedIndex"] == COMMITTED
        assert {x["selfId"]: x["firstDivergentIndex"] for x in result["replicas"]} == \
            {"n0": None, "n1": None, "n2": DIVERGE_AT}
        r = await trio.run_process([*MQADMIN, "compareReplicas", "-c", "g", "-n", ns.address],
                                   capture_stdout=True, capture_stderr=True, check=False, cwd=ROOT)
        assert r.returncode == 1 and f"DIVERGENCE: n2 from index {DIVERGE_AT}" in r.stdout.decode()
        nursery.cancel_scope.cancel()
