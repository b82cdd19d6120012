# `mqadmin producer -b ADDR` (GET_ALL_PRODUCER_INFO) and the console's list
# of producer groups (tools/dashboard/ops.producer_groups), against one
# in-process broker over TCP on 127.0.0.1: a name server and a one-member
# DLedger broker (serve_broker), two producers of the client library in
# two groups that have each sent a message (a send heartbeats first).
# mqadmin runs as a subprocess without -n, as RocketMQ's command does;
# its lines are RocketMQ's ProducerSubCommand's, checked field by field
# against what the broker's client registry holds.
import json
import os
import re
import sys
from contextlib import asynccontextmanager

import trio

from broker.client import Message, open_producer
from broker.common.values import TopicConfig
from broker.config import BrokerConfig
from broker.namesrv.service import NamesrvConfig, serve_namesrv
from broker.remoting.client import open_remoting_client
from broker.remoting.codes import CURRENT_VERSION
from broker.server import serve_broker
from tests.helpers import REPO_ROOT
from tools.dashboard import ops
from tools.localcluster import free_ports
from tools.mqadmin.adminapi import MQAdmin

TOPIC = "ProducerListT"
GROUPS = ("OrderProducers", "AuditProducers")
LINE = re.compile(r"^producer group \((?P<group>[^)]+)\) instance : clientId=(?P<clientId>[^,]+),"
                  r"remoteIP=(?P<remoteIP>[^,]+), language=(?P<language>\w+), version=(?P<version>\d+), "
                  r"lastUpdateTimestamp=(?P<ts>\d+)$")


@asynccontextmanager
async def one_broker(tmp_path):
    ns_port, peer_port = free_ports(2)
    async with trio.open_nursery() as nursery:
        ns = await nursery.start(serve_namesrv, NamesrvConfig(listen_port=ns_port, bind_address="127.0.0.1"))
        cfg, _ = BrokerConfig.from_dict({
            "brokerName": "prodb", "brokerIP1": "127.0.0.1", "listenPort": "0", "dLegerGroup": "prodb",
            "dLegerPeers": f"n0-127.0.0.1:{peer_port}", "dLegerSelfId": "n0", "storePathRootDir": str(tmp_path / "n0"),
            "flushDiskType": "ASYNC_FLUSH", "namesrvAddr": f"127.0.0.1:{ns_port}", "registerNameServerPeriod": "10000"})
        broker = await nursery.start(lambda task_status: serve_broker(cfg, bind_host="127.0.0.1",
                                                                      task_status=task_status))
        await broker.gate.wait_writable(timeout=20)
        await broker.metadata.update_topic(TopicConfig(TOPIC, 1, 1, 6))

        def known(routes) -> bool:
            r = routes.topic_route(TOPIC)
            return r is not None and any(b.master_addr == broker.broker_addr for b in r.broker_datas)
        with trio.fail_after(20):
            await ns.wait_until(known)
        yield broker, f"127.0.0.1:{ns_port}"
        nursery.cancel_scope.cancel()


async def mqadmin(*args) -> str:
    env = {k: v for k, v in os.environ.items() if k != "NAMESRV_ADDR"}
    r = await trio.run_process([sys.executable, "-m", "tools.mqadmin", *args], capture_stdout=True,
                               capture_stderr=True, check=False, cwd=str(REPO_ROOT), env=env)
    assert r.returncode == 0 and not r.stderr, (args, r.returncode, r.stdout, r.stderr)
    return r.stdout.decode()


async def test_mqadmin_producer_and_the_consoles_producer_groups(tmp_path):
    async with one_broker(tmp_path) as (broker, ns_addr):
        async with open_producer(GROUPS[0], namesrv_addr=ns_addr) as p0, \
                open_producer(GROUPS[1], namesrv_addr=ns_addr) as p1:
            for p in (p0, p1):
                await p.send(Message(TOPIC, b"hello"))
            registry = broker.clients
            expected = {}  # (group, clientId) -> (remoteIP, language, version), as the broker holds them
            for g in GROUPS:
                for ch in registry.producer_channels(g):
                    expected[(g, ch.client_id)] = (f"/{ch.conn.remote_address}", ch.language.name, ch.version)
            assert {g for g, _ in expected} == set(GROUPS)

            out = await mqadmin("producer", "-b", broker.broker_addr)
            rows = [LINE.match(line) for line in out.splitlines()]
            assert all(rows), out
            got = {(m["group"], m["clientId"]): (m["remoteIP"], m["language"], int(m["version"])) for m in rows}
            assert got == expected
            assert all(v[0].startswith("/127.0.0.1:") and v[1:] == ("PYTHON", CURRENT_VERSION) for v in got.values())
            assert [m["group"] for m in rows] == sorted(m["group"] for m in rows)  # groups in name order

            doc = json.loads(await mqadmin("producer", "-b", broker.broker_addr, "--json"))
            assert doc["broker"] == broker.broker_addr and doc["remark"] is None
            assert (doc["groupTotal"], doc["producerTotal"]) == (2, len(expected))
            assert {(g, p["clientId"]) for g, ps in doc["data"].items() for p in ps} == set(expected)

            # The console's producer page: every group of every master, no name needed.
            async with open_remoting_client() as rc:
                listed = await ops.producer_groups(MQAdmin(rc, ns_addr, timeout=5))
            assert listed["errors"] == {} and listed["notes"] == {}
            assert [g["group"] for g in listed["groups"]] == sorted(GROUPS)
            for g in listed["groups"]:
                for c in g["connections"]:
                    remote_ip, language, version = expected[(g["group"], c["clientId"])]
                    assert (c["clientAddr"], c["language"], c["version"]) == (remote_ip[1:], language, version)
                    assert c["versionDesc"] == ops.version_desc(CURRENT_VERSION)
                    assert c["brokers"] == [broker.broker_addr]
