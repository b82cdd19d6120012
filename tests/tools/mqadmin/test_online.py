# mqadmin's online commands as a subprocess against a real cluster (one
# mqnamesrv + a 3-broker DLedger group, tools/brokercluster.py), each output
# (table and --json) parsed and checked against the cluster's actual state:
# the name server's ids, what was sent, what was consumed.  Two clusters:
# one for cluster/topic/consumer/message administration, one for the
# replication commands (leadership really moves; replicas compare equal).
# Slow: two real 3-broker groups and an mqadmin subprocess per command.
import json
import sys

import pytest
import trio

from broker.remoting.codes import RequestCode
from broker.remoting.command import RemotingCommand
from tests.helpers import REPO_ROOT
from tools.brokercluster import open_broker_cluster

pytestmark = pytest.mark.slow

ROOT = str(REPO_ROOT)
MQADMIN = [sys.executable, "-m", "tools.mqadmin"]
TOPIC = "AdminTopic"


def ns(cluster) -> str:
    return cluster.namesrv_addr


async def mq(cluster, *args, expect=0) -> tuple[str, str]:
    r = await trio.run_process([*MQADMIN, *args, "-n", ns(cluster)], capture_stdout=True, capture_stderr=True,
                               check=False, cwd=ROOT)
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == expect, (args, r.returncode, out, err)
    assert "Traceback" not in err, err
    return out, err


async def mqj(cluster, *args, expect=0):
    out, _ = await mq(cluster, *args, "--json", expect=expect)
    return json.loads(out)


def table(out: str) -> list[dict]:
    """The first table of an output: header line, rows until a blank line."""
    lines = out.splitlines()
    header = lines[0].split()
    rows = []
    for line in lines[1:]:
        if not line.strip():
            break
        rows.append(dict(zip(header, line.split())))
    return rows


async def settled(cluster, check, attempts: int = 20):
    """check(master) with the same master before and after it; retried,
    because on shared cores an election can move the leadership between
    the harness's read and the command's (this is not what is tested)."""
    failure = None
    for _ in range(attempts):
        master = await cluster.wait_master()
        try:
            result = await check(master)
        except AssertionError as e:
            failure = e
        else:
            if await cluster.wait_master() == master:
                return master, result
        await trio.sleep(0.5)
    raise failure or AssertionError("the leadership kept moving")


async def wait_route(cluster, topic: str, present: bool = True) -> None:
    with trio.fail_after(20):
        while (await cluster.namesrv_client().get_route(topic) is not None) != present:
            await trio.sleep(0.1)


async def test_cluster_topic_consumer_and_message_commands(tmp_path):
    async with open_broker_cluster(tmp_path / "c", size=3) as cluster:
        # --- clusterList: every broker with name, id, address and role ---------------
        async def cluster_list(master):
            ids = await cluster.broker_ids()
            listed = await mqj(cluster, "clusterList")
            brokers = listed["brokers"]
            assert listed["missing"] == []
            assert {b["addr"]: b["brokerId"] for b in brokers} == {a: i for i, a in ids.items()}
            assert all(b["brokerName"] == "broker-a" and b["cluster"] == "LedgerCluster" for b in brokers)
            assert [b["addr"] for b in brokers if b["role"] == "MASTER"] == [cluster.addr(master)]
            assert {b["dledgerSelfId"] for b in brokers} == set(cluster.brokers)
            assert {b["leader"] for b in brokers} == {master} and len({b["term"] for b in brokers}) == 1
            rows = table((await mq(cluster, "clusterList"))[0])
            assert {r["#Addr"]: r["#Role"] for r in rows} == {b["addr"]: b["role"] for b in brokers}
            return ids
        master, ids = await settled(cluster, cluster_list)
        maddr = cluster.addr(master)

        # --- topics -------------------------------------------------------------------
        out, _ = await mq(cluster, "updateTopic", "-c", "LedgerCluster", "-t", TOPIC, "-r", "4", "-w", "4")
        assert maddr in out
        await wait_route(cluster, TOPIC)
        assert TOPIC in (await mqj(cluster, "topicList"))["topicList"]
        assert TOPIC in (await mq(cluster, "topicList"))[0].split()
        route = await mqj(cluster, "topicRoute", "-t", TOPIC)
        assert [q["writeQueueNums"] for q in route["queueDatas"]] == [4]
        assert set(route["brokerDatas"][0]["brokerAddrs"].values()) == set(ids.values())

        # --- messages -------------------------------------------------------------------
        sent = []
        for i in range(5):
            sent.append(await mqj(cluster, "sendMessage", "-t", TOPIC, "-p", f"body-{i}", "-k", f"key{i} common",
                                  "-c", "TagA", "-i", str(i % 2)))
        assert all(s["sendStatus"] == "SEND_OK" for s in sent)
        assert [(s["queueId"], s["queueOffset"]) for s in sent] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2)]
        stats = (await mqj(cluster, "topicStatus", "-t", TOPIC))["queues"]
        assert [(q["queueId"], q["minOffset"], q["maxOffset"]) for q in stats] == [(0, 0, 3), (1, 0, 2), (2, 0, 0),
                                                                                    (3, 0, 0)]
        assert [r["#MaxOffset"] for r in table((await mq(cluster, "topicStatus", "-t", TOPIC))[0])] == \
            ["3", "2", "0", "0"]

        got = (await mqj(cluster, "queryMsgById", "-i", sent[2]["offsetMsgId"]))["messages"]
        assert [(m["body"], m["msgId"], m["queueOffset"]) for m in got] == [("body-2", sent[2]["msgId"], 1)]
        by_key = (await mqj(cluster, "queryMsgByKey", "-t", TOPIC, "-k", "common"))["messages"]
        assert sorted(m["body"] for m in by_key) == [f"body-{i}" for i in range(5)]
        assert [m["body"] for m in (await mqj(cluster, "queryMsgByKey", "-t", TOPIC, "-k", "key3"))["messages"]] == \
            ["body-3"]
        uniq = (await mqj(cluster, "queryMsgByUniqueKey", "-t", TOPIC, "-i", sent[4]["msgId"]))["messages"]
        assert [m["body"] for m in uniq] == ["body-4"]
        at = (await mqj(cluster, "queryMsgByOffset", "-t", TOPIC, "-b", "broker-a", "-i", "1", "-o", "1"))["messages"]
        assert [m["body"] for m in at] == ["body-3"]
        out, _ = await mq(cluster, "queryMsgByOffset", "-t", TOPIC, "-b", "broker-a", "-i", "1", "-o", "0")
        assert "body-1" in out
        printed = (await mqj(cluster, "printMsg", "-t", TOPIC))["messages"]
        assert sorted(m["body"] for m in printed) == [f"body-{i}" for i in range(5)]
        assert len((await mq(cluster, "printMsg", "-t", TOPIC))[0].splitlines()) == 5

        # --- consuming and consumer progress ----------------------------------------------
        consumed = await mqj(cluster, "consumeMessage", "-t", TOPIC, "-g", "CG", "-c", "2")
        assert consumed["consumed"] == 2
        progress = await mqj(cluster, "consumerProgress", "-g", "CG")
        assert progress["diffTotal"] == 5 - 2
        assert sum(q["brokerOffset"] for q in progress["queues"]) == 5
        out, _ = await mq(cluster, "consumerProgress", "-g", "CG", "-t", TOPIC)
        assert "Diff Total: 3" in out and len(table(out)) == 4
        rest = await mqj(cluster, "consumeMessage", "-t", TOPIC, "-g", "CG")
        assert sorted(m["body"] for m in consumed["messages"] + rest["messages"]) == [f"body-{i}" for i in range(5)]
        assert (await mqj(cluster, "consumerProgress", "-g", "CG"))["diffTotal"] == 0

        reset = await mqj(cluster, "resetOffsetByTime", "-g", "CG", "-t", TOPIC, "-s", "0")
        assert [o["offset"] for o in reset["offsets"]] == [0, 0, 0, 0]
        assert (await mqj(cluster, "consumerProgress", "-g", "CG"))["diffTotal"] == 5
        mid = sent[3]  # reset to the store time of message 3: queue 1 back to offset 1, queue 0 to 2
        stored = (await mqj(cluster, "queryMsgById", "-i", mid["offsetMsgId"]))["messages"][0]["storeTimestamp"]
        await mq(cluster, "resetOffsetByTime", "-g", "CG", "-t", TOPIC, "-s", str(stored))
        assert (await mqj(cluster, "consumerProgress", "-g", "CG"))["diffTotal"] == 2
        await mq(cluster, "resetOffsetByTime", "-g", "CG", "-t", TOPIC, "-s", "-1")
        assert (await mqj(cluster, "consumerProgress", "-g", "CG"))["diffTotal"] == 0

        # --- connections (a client heartbeating on a kept-open connection) --------------------
        maddr = cluster.addr(await cluster.wait_master())
        hb = {"clientID": "127.0.0.1@mqadmin-test", "producerDataSet": [{"groupName": "PG"}],
              "consumerDataSet": [{"groupName": "CG", "consumeType": "CONSUME_PASSIVELY",
                                   "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                                   "subscriptionDataSet": [{"topic": TOPIC, "subString": "TagA", "tagsSet": ["TagA"],
                                                            "codeSet": [], "subVersion": 1}]}]}
        await cluster.remoting.invoke(maddr, RemotingCommand.create_request(RequestCode.HEART_BEAT,
                                                                            body=json.dumps(hb).encode()))
        conn = await mqj(cluster, "consumerConnection", "-g", "CG")
        assert [c["clientId"] for c in conn["connectionSet"]] == ["127.0.0.1@mqadmin-test"]
        assert conn["subscriptionTable"][TOPIC]["subString"] == "TagA" and conn["messageModel"] == "CLUSTERING"
        out, _ = await mq(cluster, "consumerConnection", "-g", "CG")
        assert table(out)[0]["#ClientId"] == "127.0.0.1@mqadmin-test"
        prod = await mqj(cluster, "producerConnection", "-g", "PG", "-t", TOPIC)
        assert [c["clientId"] for c in prod["connectionSet"]] == ["127.0.0.1@mqadmin-test"]
        _, err = await mq(cluster, "consumerConnection", "-g", "NobodyHere", expect=3)
        assert "not online" in err
        await mq(cluster, "producerConnection", "-g", "NobodyHere", "-t", TOPIC, expect=3)

        # --- subscription groups, broker status and config ------------------------------------
        maddr = cluster.addr(await cluster.wait_master())
        async def group_count() -> int:
            info = await mqj(cluster, "brokerStatus", "-b", maddr)
            return int(info[maddr]["subscriptionGroupCount"])
        before = await group_count()
        await mq(cluster, "updateSubGroup", "-c", "LedgerCluster", "-g", "NewGroup", "-r", "3")
        assert await group_count() == before + 1
        await mq(cluster, "deleteSubGroup", "-b", maddr, "-g", "NewGroup", "-r", "true")
        assert await group_count() == before

        # --- what the dashboards' pages call: every group's progress, topics by cluster, in/out totals
        every = await mqj(cluster, "consumerProgress")
        cg = next(g for g in every["groups"] if g["group"] == "CG")
        assert (cg["diffTotal"], cg["count"], cg["model"], cg["type"]) == (0, 1, "CLUSTERING", "CONSUME_PASSIVELY")
        assert "NewGroup" not in [g["group"] for g in every["groups"]]
        out, _ = await mq(cluster, "consumerProgress")
        assert table(out)[0]["#Group"] and "CG" in [r["#Group"] for r in table(out)]
        by_cluster = await mqj(cluster, "topicList", "-c")
        row = next(r for r in by_cluster["topics"] if r["topic"] == TOPIC)
        assert row["cluster"] == "LedgerCluster" and "CG" in row["groups"]
        assert "%RETRY%CG" in [r["topic"] for r in by_cluster["topics"]]
        assert TOPIC in (await mq(cluster, "topicList", "-c"))[0]
        more = (await mqj(cluster, "clusterList", "-m"))["brokers"]
        assert {b["addr"] for b in more} == set(ids.values())
        assert next(b for b in more if b["addr"] == maddr)["inTotalToday"] >= 5
        assert next(b for b in more if b["addr"] == maddr)["outTotalToday"] >= 0
        assert "#InTotalToday" in (await mq(cluster, "clusterList", "-m"))[0]
        # deleteSubGroup -r true removes the group's %RETRY% and %DLQ% topics too (brokers and name server)
        await mq(cluster, "deleteSubGroup", "-c", "LedgerCluster", "-g", "CG", "-r", "true")
        await wait_route(cluster, "%RETRY%CG", present=False)
        assert "%RETRY%CG" not in (await mqj(cluster, "topicList"))["topicList"]
        status = await mqj(cluster, "brokerStatus", "-c", "LedgerCluster")
        assert set(status) == set(ids.values()) and status[maddr]["dledgerRole"] == "LEADER"
        assert "brokerName" in {r["KEY"] for r in table((await mq(cluster, "brokerStatus", "-b", maddr))[0])}

        conf = await mqj(cluster, "getBrokerConfig", "-c", "LedgerCluster")
        assert {c["dLegerSelfId"] for c in conf.values()} == set(cluster.brokers)
        await mq(cluster, "updateBrokerConfig", "-c", "LedgerCluster", "-k", "maxWaitAckTimeMs", "-v", "4321")
        conf = await mqj(cluster, "getBrokerConfig", "-c", "LedgerCluster")
        assert {c["maxWaitAckTimeMs"] for c in conf.values()} == {"4321"}
        _, err = await mq(cluster, "updateBrokerConfig", "-b", maddr, "-k", "listenPort", "-v", "1", expect=3)
        assert "restart" in err
        assert (await mqj(cluster, "getBrokerConfig", "-b", maddr))[maddr]["listenPort"] == maddr.split(":")[1]

        # --- error paths: unknown topic / group, bad flags ------------------------------------------
        for args in (["topicStatus", "-t", "NoSuchTopic"], ["topicRoute", "-t", "NoSuchTopic"],
                     ["consumerProgress", "-g", "NoSuchGroup"], ["sendMessage", "-t", TOPIC, "-p", "x", "-b", "nob"],
                     ["queryMsgByUniqueKey", "-t", TOPIC, "-i", "00" * 16]):
            _, err = await mq(cluster, *args, expect=3)
            assert err.startswith("mqadmin: error:") and err.count("\n") == 1, err
        await mq(cluster, "updateTopic", "-c", "LedgerCluster", "-t", "T", "-w", "0", expect=2)
        await mq(cluster, "queryMsgById", "-i", "not-hex", expect=2)

        # --- deleteTopic ------------------------------------------------------------------------------
        await mq(cluster, "deleteTopic", "-c", "LedgerCluster", "-t", TOPIC)
        await wait_route(cluster, TOPIC, present=False)
        await mq(cluster, "topicRoute", "-t", TOPIC, expect=3)
        await mq(cluster, "deleteTopic", "-c", "LedgerCluster", "-t", TOPIC, expect=3)


async def test_replication_commands(tmp_path):
    async with open_broker_cluster(tmp_path / "r", size=3) as cluster:
        await cluster.wait_master()
        for i in range(3):
            await mqj(cluster, "sendMessage", "-t", "RepTopic", "-p", f"m{i}")

        # --- dledgerStatus: every node's role, term, ledger end, committed index -------------------
        async def status(master):
            nodes = (await mqj(cluster, "dledgerStatus"))["nodes"]
            assert {n["selfId"] for n in nodes} == set(cluster.brokers)
            assert [n["selfId"] for n in nodes if n["role"] == "leader"] == [master]
            assert {n["leader"] for n in nodes} == {master} and len({n["term"] for n in nodes}) == 1
            for n in nodes:
                assert n["brokerAddr"] == cluster.addr(n["selfId"])
                assert 0 < n["committedIndex"] <= n["ledgerEndIndex"]
            leader = next(n for n in nodes if n["role"] == "leader")
            assert set(leader["peers"]) == set(cluster.brokers) - {master}
            assert all(p["matchIndex"] <= leader["ledgerEndIndex"] for p in leader["peers"].values())
            one = (await mqj(cluster, "dledgerStatus", "-b", cluster.addr(master)))["nodes"]
            assert [n["selfId"] for n in one] == [master]
            out, _ = await mq(cluster, "dledgerStatus", "-b", "broker-a")
            assert {r["#SelfId"]: r["#Role"] for r in table(out)} == {n["selfId"]: n["role"] for n in nodes}
        master, _ = await settled(cluster, status)

        # --- compareReplicas on a healthy group ---------------------------------------------------------
        cmp = await mqj(cluster, "compareReplicas", "-c", "broker-a")
        assert cmp["consistent"] and len(cmp["replicas"]) == 3 and cmp["comparedIndex"] >= 1
        assert len({r["chainCrc"] for r in cmp["replicas"]}) == 1
        assert all(r["firstDivergentIndex"] is None for r in cmp["replicas"])
        out, _ = await mq(cluster, "compareReplicas", "-c", "broker-a")
        assert "consistent" in out

        # --- leadershipTransfer really moves the leadership -----------------------------------------------
        target = sorted(set(cluster.brokers) - {master})[0]
        res = await mqj(cluster, "leadershipTransfer", "-b", "broker-a", "-t", target)
        assert res["changed"] and res["from"] == master and res["to"] == target
        assert await cluster.wait_master(exclude={master}) == target
        async def target_leads(master):
            nodes = (await mqj(cluster, "dledgerStatus"))["nodes"]
            assert master == target and [n["selfId"] for n in nodes if n["role"] == "leader"] == [target]
        await settled(cluster, target_leads, attempts=3)
        # back, naming the peer by its broker address
        out, _ = await mq(cluster, "leadershipTransfer", "-b", "broker-a", "-t", cluster.addr(master))
        assert f"to {master}" in out
        assert await cluster.wait_master(exclude={target}) == master
        await mq(cluster, "leadershipTransfer", "-b", "broker-a", "-t", "n9", expect=3)
        await mq(cluster, "leadershipTransfer", "-b", "no-such-group", "-t", "n1", expect=3)

        # --- a follower down: the others still report and compare ---------------------------------------
        follower = sorted(set(cluster.brokers) - {master})[1]
        cluster.kill(follower)
        await cluster.wait_dead(follower)
        await cluster.wait_master()
        listed = await mqj(cluster, "clusterList")
        assert sorted(b["dledgerSelfId"] for b in listed["brokers"]) == sorted(set(cluster.brokers) - {follower})
        assert [m["dledgerSelfId"] for m in listed["missing"]] == [follower]
        rows = table((await mq(cluster, "clusterList"))[0])
        assert {r["#SelfId"]: r["#Role"] for r in rows}[follower] == "DOWN"
        await mqj(cluster, "sendMessage", "-t", "RepTopic", "-p", "after")
        cmp = await mqj(cluster, "compareReplicas", "-c", "broker-a")
        assert cmp["consistent"] and len(cmp["replicas"]) == 2
        leader = next(n for n in (await mqj(cluster, "dledgerStatus"))["nodes"] if n["role"] == "leader")
        assert leader["peers"][follower]["lag"] > 0
