# Issue 27's ACL bypasses, each tried against a real broker (a one-member
# DLedger group served in this process, aclEnable with a plain_acl.yml,
# requests over TCP on 127.0.0.1) by an account that holds only its own
# topic and group, and each shown to do no harm now:
#
#   LEDGERMQ_CHANGE_MEMBERSHIP 9103 (and the other replication codes, and
#   GET_BROKER_RUNTIME_INFO 28): admin only, the membership unchanged;
#   VIEW_MESSAGE_BY_ID 33 / CONSUMER_SEND_MSG_BACK 36 with another topic's
#   commitlog offset: refused without naming that topic, nothing copied
#   into the caller's %RETRY% topic (its own message passes: the control);
#   a HEART_BEAT claiming another producer group: CHECK_TRANSACTION_STATE
#   still goes only to the producer allowed to see the half (and a group
#   DENY'd by name cannot be claimed at all);
#   LOCK_BATCH_MQ on another group's queues: refused, the group's own
#   consumer still gets them;
#   captured signed requests replayed with bytes moved between fields, into
#   an added field or out of the body: refused, nothing stored.
#
# The same broker also serves the Python client and MQAdmin signed (every
# field they send is in its code's schema), in test_our_clients_under_acl.
import json

import attrs
import trio

from broker.acl.signing import Credentials
from broker.client import Message, open_producer, open_pull_consumer
from broker.client.model import PullStatus
from broker.common.msgid import parse_offset_msg_id
from broker.config import BrokerConfig
from broker.namesrv.service import NamesrvConfig, NameServer, serve_namesrv
from broker.remoting.client import open_remoting_client
from broker.remoting.codes import RequestCode as C
from broker.remoting.codes import ResponseCode
from broker.remoting.command import RemotingCommand
from broker.server import serve_broker
from consumequeue import record as M
from tools.localcluster import free_ports
from tools.mqadmin.adminapi import MQAdmin

PLAIN_ACL = """\
accounts:
  - accessKey: owner001
    secretKey: owner-secret
    topicPerms: [Orders=PUB|SUB, Secret=PUB|SUB]
    groupPerms: [OrderlyGroup=SUB, PushGroup=SUB]
  - accessKey: mallory1
    secretKey: mallory-secret
    topicPerms: [Mine=PUB|SUB]
    groupPerms: [MineGroup=SUB, TxBlocked=DENY]
  - accessKey: admin001
    secretKey: admin-secret
    admin: true
"""
OWNER = Credentials("owner001", "owner-secret")
MALLORY = Credentials("mallory1", "mallory-secret")
ADMIN = Credentials("admin001", "admin-secret")
ACL_EXCEPTION = "org.apache.rocketmq.acl.common.AclException: "


@attrs.define
class Env:
    broker: object
    addr: str
    namesrv: str | None = None
    ns: NameServer | None = None  # the name server at `namesrv`, served in this process


async def start(nursery, tmp_path, *, namesrv: bool = False, **conf) -> Env:
    (tmp_path / "plain_acl.yml").write_text(PLAIN_ACL)
    ns_port, peer_port = free_ports(2)
    base = {"brokerName": "solo", "brokerIP1": "127.0.0.1", "listenPort": "0", "dLegerGroup": "solo",
            "dLegerPeers": f"n0-127.0.0.1:{peer_port}", "dLegerSelfId": "n0",
            "storePathRootDir": str(tmp_path / "n0"), "aclEnable": "true",
            "aclFile": str(tmp_path / "plain_acl.yml"), "flushDiskType": "ASYNC_FLUSH"}
    ns = None
    if namesrv:
        base |= {"namesrvAddr": f"127.0.0.1:{ns_port}", "registerNameServerPeriod": "10000"}
        ns = await nursery.start(serve_namesrv, NamesrvConfig(listen_port=ns_port, bind_address="127.0.0.1"))
    cfg, _ = BrokerConfig.from_dict({**base, **{k: str(v) for k, v in conf.items()}})
    broker = await nursery.start(lambda task_status: serve_broker(cfg, bind_host="127.0.0.1",
                                                                  task_status=task_status))
    await broker.gate.wait_writable(timeout=20)
    return Env(broker, broker.broker_addr, f"127.0.0.1:{ns_port}" if namesrv else None, ns)


async def routed(env: Env, topic: str) -> None:
    """Wait until the name server routes `topic` to this broker as master:
    a registration carrying the topic was accepted, so clients find it."""
    def known(routes) -> bool:
        route = routes.topic_route(topic)
        return route is not None and any(b.master_addr == env.addr for b in route.broker_datas)
    with trio.fail_after(20):
        await env.ns.wait_until(known)


def send(group: str, topic: str, body: bytes, *, props: dict | None = None, sysflag: int = 0,
         queue: int = 0) -> RemotingCommand:
    properties = M.properties_to_string({"UNIQ_KEY": body.hex().upper()[:32].ljust(32, "0"), **(props or {})})
    return RemotingCommand.create_request(C.SEND_MESSAGE_V2, {
        "a": group, "b": topic, "c": "TBW102", "d": 4, "e": queue, "f": sysflag, "g": 1700000000000, "h": 0,
        "i": properties, "j": 0, "k": False, "m": False}, body=body)


def refused(resp: RemotingCommand, reason: str) -> bool:
    return resp.code == ResponseCode.SYSTEM_ERROR and resp.remark == ACL_EXCEPTION + reason


async def stored_at(rc, addr: str, cmd: RemotingCommand) -> int:
    """Send `cmd` (a SEND) and return the commitlog offset it was stored at."""
    resp = await rc.invoke(addr, cmd, 5)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return parse_offset_msg_id(resp.ext_fields["msgId"])[1]


def queue_max(broker, topic: str) -> int:
    cqs = broker.store.cq.engine.cqs
    return sum(cq.max_offset for q in range(8) if (cq := cqs.get(topic, q)) is not None)


async def test_replication_and_broker_wide_codes_need_an_admin(tmp_path, nursery):
    env = await start(nursery, tmp_path)
    replica = env.broker.replica
    before = (list(replica.core.voters), replica.status()["learners"])
    async with open_remoting_client(rpc_hook=MALLORY) as rc:
        for code, fields in ((C.LEDGERMQ_CHANGE_MEMBERSHIP, {"change": "addLearner", "peerId": "evil",
                                                             "peerAddr": "127.0.0.1:1"}),
                             (C.LEDGERMQ_CHANGE_MEMBERSHIP, {"change": "remove", "peerId": "n0"}),
                             (C.LEDGERMQ_DLEDGER_STATUS, {}), (C.LEDGERMQ_TRANSFER_LEADERSHIP, {"targetId": "n0"}),
                             (C.LEDGERMQ_CHAIN_CRC, {"index": 1}), (C.GET_BROKER_RUNTIME_INFO, {}),
                             (C.GET_ALL_TOPIC_CONFIG, {}), (C.GET_BROKER_CONFIG, {})):
            resp = await rc.invoke(env.addr, RemotingCommand.create_request(code, fields), 5)
            assert refused(resp, f"Need admin permission for request code={code}, but accessKey=mallory1 is not"), \
                (code, resp.remark)
    assert (list(replica.core.voters), replica.status()["learners"]) == before == (["n0"], [])
    async with open_remoting_client(rpc_hook=ADMIN) as rc:  # the control: an admin is answered
        resp = await rc.invoke(env.addr, RemotingCommand.create_request(C.LEDGERMQ_DLEDGER_STATUS), 5)
        assert resp.code == ResponseCode.SUCCESS and json.loads(resp.body)["selfId"] == "n0"


async def test_a_message_behind_an_offset_needs_sub_on_its_topic(tmp_path, nursery):
    env = await start(nursery, tmp_path)
    async with open_remoting_client(rpc_hook=OWNER) as owner, open_remoting_client(rpc_hook=MALLORY) as mallory:
        secret = await stored_at(owner, env.addr, send("pg", "Secret", b"the-secret"))
        mine = await stored_at(mallory, env.addr, send("pg", "Mine", b"my-own"))
        reason = f"No default permission for the message at offset {secret}"

        view = await mallory.invoke(env.addr, RemotingCommand.create_request(C.VIEW_MESSAGE_BY_ID,
                                                                             {"offset": secret}), 5)
        assert refused(view, reason) and b"the-secret" not in view.body
        # An offset where no message starts is refused in the same words:
        # probing offsets tells the caller nothing.
        probe = await mallory.invoke(env.addr, RemotingCommand.create_request(C.VIEW_MESSAGE_BY_ID,
                                                                              {"offset": secret + 1}), 5)
        assert refused(probe, f"No default permission for the message at offset {secret + 1}")
        own = await mallory.invoke(env.addr, RemotingCommand.create_request(C.VIEW_MESSAGE_BY_ID, {"offset": mine}), 5)
        assert own.code == ResponseCode.SUCCESS and M.decode(own.body).body == b"my-own"

        def send_back(offset):
            return RemotingCommand.create_request(C.CONSUMER_SEND_MSG_BACK, {
                "offset": offset, "group": "MineGroup", "delayLevel": 0, "originMsgId": "x", "originTopic": "Mine",
                "unitMode": False, "maxReconsumeTimes": 16})
        copied = await mallory.invoke(env.addr, send_back(secret), 5)
        assert refused(copied, reason)
        assert env.broker.metadata.topic_config("%RETRY%MineGroup") is None  # the processor never ran
        assert queue_max(env.broker, "SCHEDULE_TOPIC_XXXX") == 0
        ok = await mallory.invoke(env.addr, send_back(mine), 5)  # the control: its own message goes back
        assert ok.code == ResponseCode.SUCCESS, ok.remark
        assert env.broker.metadata.topic_config("%RETRY%MineGroup") is not None


async def test_a_claimed_producer_group_is_not_sent_anyone_elses_check_back(tmp_path, nursery):
    env = await start(nursery, tmp_path, transactionTimeOut=100, transactionCheckInterval=100,
                      transactionCheckMax=50)
    checks = {"owner": [], "mallory": []}
    three = trio.Event()

    def recorder(name):
        async def handler(conn, cmd):
            if cmd.code == C.CHECK_TRANSACTION_STATE:
                checks[name].append(M.decode(cmd.body).body)
                if len(checks["owner"]) >= 3:
                    three.set()
            return None  # oneway: no answer; the half stays unresolved and is checked again
        return handler

    def heartbeat(group: str, client: str) -> RemotingCommand:
        return RemotingCommand.create_request(C.HEART_BEAT, body=json.dumps({
            "clientID": client, "producerDataSet": [{"groupName": group}], "consumerDataSet": []}).encode())

    async with open_remoting_client(rpc_hook=OWNER, handler=recorder("owner")) as owner, \
            open_remoting_client(rpc_hook=MALLORY, handler=recorder("mallory")) as mallory:
        assert (await owner.invoke(env.addr, heartbeat("TxGroup", "owner@1"), 5)).code == ResponseCode.SUCCESS
        # Any account may name a producer group (accounts that only produce
        # have no group rules) ...
        assert (await mallory.invoke(env.addr, heartbeat("TxGroup", "mallory@1"), 5)).code == ResponseCode.SUCCESS
        # ... except one its rules DENY by name.
        denied = await mallory.invoke(env.addr, heartbeat("TxBlocked", "mallory@1"), 5)
        assert refused(denied, "No default permission for group:TxBlocked")
        assert sorted(env.broker.clients.producer_ids("TxGroup")) == ["mallory@1", "owner@1"]
        half = send("TxGroup", "Orders", b"half-body", sysflag=M.TRANSACTION_PREPARED_TYPE,
                    props={"TRAN_MSG": "true", "PGROUP": "TxGroup"})
        await stored_at(owner, env.addr, half)
        # Check-backs rotate among the group's producers: before, every
        # second one went to mallory.  Now only the owner may see the half.
        with trio.fail_after(20):
            await three.wait()
    assert checks["owner"][:3] == [b"half-body"] * 3
    assert checks["mallory"] == []


async def test_locks_need_sub_on_the_group(tmp_path, nursery):
    env = await start(nursery, tmp_path)

    def lock(client: str) -> RemotingCommand:
        return RemotingCommand.create_request(C.LOCK_BATCH_MQ, body=json.dumps({
            "consumerGroup": "OrderlyGroup", "clientId": client,
            "mqSet": [{"topic": "Orders", "brokerName": "solo", "queueId": q} for q in range(2)]}).encode())

    async with open_remoting_client(rpc_hook=MALLORY) as mallory, open_remoting_client(rpc_hook=OWNER) as owner:
        taken = await mallory.invoke(env.addr, lock("mallory@1"), 5)
        assert refused(taken, "No default permission for group:OrderlyGroup")
        unlock = RemotingCommand.create_request(C.UNLOCK_BATCH_MQ, body=json.dumps({
            "consumerGroup": "OrderlyGroup", "clientId": "owner@1", "mqSet": []}).encode())
        assert refused(await mallory.invoke(env.addr, unlock, 5), "No default permission for group:OrderlyGroup")
        got = await owner.invoke(env.addr, lock("owner@1"), 5)
        assert got.code == ResponseCode.SUCCESS
        assert sorted(m["queueId"] for m in json.loads(got.body)["lockOKMQSet"]) == [0, 1]


def shifted(cmd: RemotingCommand, **fields) -> RemotingCommand:
    """`cmd` with its signature kept and fields changed (None: removed) or
    bytes moved out of the body (body=...)."""
    body = fields.pop("body", cmd.body)
    ext = {k: v for k, v in {**cmd.ext_fields, **fields}.items() if v is not None}
    return attrs.evolve(cmd, ext_fields=ext, body=body)


async def test_captured_requests_cannot_be_reshaped(tmp_path, nursery):
    env = await start(nursery, tmp_path)
    async with open_remoting_client() as wire:  # sends what it is given, signed or not
        captured = OWNER.sign(send("pg", "Orders", b"PAYLOAD-part2"))
        assert (await wire.invoke(env.addr, captured, 5)).code == ResponseCode.SUCCESS
        stored = queue_max(env.broker, "Orders")
        # Each variant below has the same signed content as `captured`
        # (values in key order, then the body): ACL 1.0 alone accepts them.
        variants = {
            "body into m": (shifted(captured, m="false" + "PAYLOAD-", body=b"part2"),
                            "field m='falsePAYLOAD-' of request code=310 is not a bool"),
            "body into an added n": (shifted(captured, n="PAYLOAD-", body=b"part2"),
                                     "field n='PAYLOAD-' of request code=310 is not a broker name"),
            "body into an added ns": (shifted(captured, ns="PAYLOAD-", body=b"part2"),
                                      "field ns='PAYLOAD-' of request code=310 is not a empty"),
            "an added empty field": (shifted(captured, zz=""), "request code=310 has no field 'zz'"),
            "group into topic": (shifted(captured, a="p", b="gOrders"), None),  # see below
        }
        for name, (cmd, reason) in variants.items():
            resp = await wire.invoke(env.addr, cmd, 5)
            if reason is None:
                # a/b are both names: ACL 1.0 cannot tell "pg"+"Orders" from
                # "p"+"gOrders"; the signer's account must then hold PUB on
                # the new topic, which it does not.
                assert refused(resp, "No default permission for topic:gOrders"), (name, resp.remark)
            else:
                assert refused(resp, reason), (name, resp.remark)
        assert queue_max(env.broker, "Orders") == stored  # nothing else was stored
        # An admin's signed request with a/b moved (the replay): a
        # code without fields a and b refuses them whatever they hold.
        admin = ADMIN.sign(RemotingCommand.create_request(C.DELETE_TOPIC_IN_BROKER, {"topic": "Orders"}))
        moved = shifted(admin, topic=None, a="Ord", b="ers")
        assert refused(await wire.invoke(env.addr, moved, 5), "request code=215 has no field 'a'")
        assert env.broker.metadata.topic_config("Orders") is not None


async def test_our_clients_under_acl(tmp_path, nursery):
    """Every field the Python client and MQAdmin send is in its code's
    schema: they work signed, end to end."""
    env = await start(nursery, tmp_path, namesrv=True)
    async with open_remoting_client(rpc_hook=ADMIN) as rc:
        admin = MQAdmin(rc, env.namesrv)
        await admin.create_topic(env.addr, "Orders", 2, 2, 6, False)
        await admin.update_sub_group(env.addr, {"groupName": "OrderlyGroup", "consumeEnable": True})
        await routed(env, "Orders")
        async with open_producer("pg", namesrv_addr=env.namesrv, credentials=OWNER) as p:
            sent = await p.send(Message("Orders", b"order-1", keys=["k1"]))
        async with open_pull_consumer("OrderlyGroup", namesrv_addr=env.namesrv, credentials=OWNER) as c:
            got = []
            queues = await c.fetch_queues("Orders")
            for mq in queues:
                res = await c.pull(mq, 0)
                await c.max_offset(mq), await c.min_offset(mq), await c.search_offset(mq, 0)
                if res.status is PullStatus.FOUND:
                    got += res.messages
                    await c.update_offset(mq, res.next_begin_offset)
                    assert await c.fetch_offset(mq) == res.next_begin_offset
                    await c.api.send_back(res.messages[0])
            assert [m.body for m in got] == [b"order-1"]
            assert await c.api.lock_batch(queues) == set(queues)
            await c.api.unlock_batch(queues)
            assert len(await c.api.consumer_ids("Orders")) == 1
        phy = parse_offset_msg_id(sent.offset_msg_id)[1]
        assert (await admin.view_message(env.addr, phy)).body == b"order-1"
        assert [r.body for r in await admin.query_message(env.addr, "Orders", "k1")] == [b"order-1"]
        assert [r.body for r in await admin.query_message(env.addr, "Orders", sent.msg_id, unique=True)] \
            == [b"order-1"]
        assert await admin.topic_stats(env.addr, "Orders")
        assert await admin.consume_stats(env.addr, "OrderlyGroup", "Orders")
        assert await admin.consume_by_who(env.addr, "Orders") == ["OrderlyGroup"]
        await admin.reset_offset(env.addr, "Orders", "OrderlyGroup", 0, True)
        assert (await admin.runtime_info(env.addr))
        assert (await admin.dledger_status(env.addr))["selfId"] == "n0"
        assert await admin.chain_crc(env.addr, 1) is not None
        await admin.delete_sub_group(env.addr, "OrderlyGroup", True)
        assert env.broker.acl.refused == 0
