# A name server and a 3-broker DLedger group as real processes with
# everything of issue 16 on: aclEnable with plain_acl.yml, the name server
# taking route writes only from the brokers' credentials, TLS (permissive,
# so the stock C++ client, which has no TLS, still connects in plaintext
# while ours and mqadmin use TLS), a DLedger peer secret, and tight limits.
# Checked from outside: the permission table with our client, mqadmin with
# --accessKey/--secretKey (and env vars), the stock client with
# set_session_credentials (tests/broker/compat/test_stock_acl.py), a fake broker registration, a reload of the
# changed file (a whitelisted address), oversized frames and a flood.
# Slow: a name server and a 3-broker group as real processes with TLS and ACL,
#   plus mqadmin subprocesses.
import json
import struct
import sys

import pytest
import trio

from broker.acl.signing import Credentials
from broker.client import AccessDeniedError, Message, SendFailedError, SendStatus, open_producer, open_pull_consumer
from broker.client.model import PullStatus
from broker.namesrv.client import NamesrvClient
from broker.namesrv.routes import BrokerRegistration, DataVersion
from broker.remoting.client import open_remoting_client
from broker.remoting.codec import encode_command
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import ResponseError
from broker.remoting.tls import ClientTls
from tests.broker.remoting.helpers import read_until_eof
from tests.broker.remoting.tls_helpers import make_tls_files
from tests.helpers import REPO_ROOT
from tools.brokercluster import open_broker_cluster
from tools.mqadmin.adminapi import MQAdmin, RequestFailedError

pytestmark = pytest.mark.slow

PLAIN_ACL = """\
globalWhiteRemoteAddresses: {white}
accounts:
  - accessKey: producer1
    secretKey: producer-secret
    topicPerms: [Orders=PUB, Audit=SUB]
  - accessKey: consumer1
    secretKey: consumer-secret
    topicPerms: [Orders=SUB]
    groupPerms: [OrderConsumers=SUB, Blocked=DENY]
  - accessKey: admin001
    secretKey: admin-secret
    admin: true
"""
PRODUCER = Credentials("producer1", "producer-secret")
CONSUMER = Credentials("consumer1", "consumer-secret")
ADMIN = Credentials("admin001", "admin-secret")
BROKERS = Credentials("cluster-brokers", "brokers-secret-0123")
MQADMIN = [sys.executable, "-m", "tools.mqadmin"]


def secure_cluster(tmp_path):
    files = make_tls_files(tmp_path / "tls")
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(PLAIN_ACL.format(white="[]"))
    tls_server = {"tls.server.mode": "permissive", "tls.server.certPath": files.cert, "tls.server.keyPath": files.key}
    broker_conf = {
        "aclEnable": "true", "aclFile": str(acl_file),
        "brokerAccessKey": BROKERS.access_key, "brokerSecretKey": BROKERS.secret_key,
        **tls_server, "tls.enable": "true", "tls.client.trustCertPath": files.ca,
        "dLegerPeerSecret": "a group secret of some length",
        "serverMaxInFlightRequests": 64, "frameMaxLength": 4 * 1024 * 1024 + 64 * 1024,
    }
    namesrv_conf = {"aclEnable": "true", "brokerAccessKey": BROKERS.access_key,
                    "brokerSecretKey": BROKERS.secret_key, **tls_server}
    tls = ClientTls.create(files.ca)
    cluster = open_broker_cluster(tmp_path / "cluster", extra_conf=broker_conf, namesrv_conf=namesrv_conf,
                                  client_options={"tls": tls})
    return cluster, files, acl_file, tls


async def refusal(fn) -> str:
    """The AclException remark of a call expected to be refused."""
    try:
        await fn()
    except SendFailedError as e:
        assert isinstance(e.last, AccessDeniedError), e
        return e.last.remark
    except AccessDeniedError as e:
        return e.remark
    except RequestFailedError as e:
        return e.remark
    raise AssertionError("not refused")


async def test_acl_tls_and_name_server_on_a_secure_group(tmp_path):
    cluster_cm, files, acl_file, tls = secure_cluster(tmp_path)
    async with cluster_cm as cluster:
        master = await cluster.wait_master()
        ns, addr = cluster.namesrv_addr, cluster.addr(master)
        # The brokers registered (signed with their credentials, over TLS).
        assert set((await cluster.broker_ids()).values()) == {p.addr for p in cluster.brokers.values()}

        # --- admin codes: only the admin account ------------------------------------
        async with open_remoting_client(rpc_hook=ADMIN, tls=tls) as rc:
            admin = MQAdmin(rc, ns)
            for topic in ("Orders", "Audit"):
                await admin.create_topic(addr, topic, 4, 4, 6, False)
            status = await admin.dledger_status(addr)
            assert status["selfId"] == master
        async with open_remoting_client(rpc_hook=PRODUCER, tls=tls) as rc:
            producer_admin = MQAdmin(rc, ns)
            assert "Need admin permission for request code=17, but accessKey=producer1" in await refusal(
                lambda: producer_admin.create_topic(addr, "Sneaky", 4, 4, 6, False))
            assert "Need admin permission for request code=9100" in await refusal(
                lambda: producer_admin.dledger_status(addr))
            assert "request code=9101" in await refusal(lambda: producer_admin.transfer_leadership(addr, "n1"))

        # --- the permission table with our client (TLS) --------------------------------
        async with open_producer("PG", namesrv_addr=ns, credentials=PRODUCER, tls=tls) as p:
            with trio.fail_after(20):
                while True:  # wait for the route of Orders
                    try:
                        r = await p.send(Message("Orders", b"order-1"))
                        break
                    except SendFailedError as e:
                        if isinstance(e.last, AccessDeniedError):
                            raise
                        await trio.sleep(0.2)
            assert r.status is SendStatus.SEND_OK
            assert "No default permission for topic:Audit" in await refusal(
                lambda: p.send(Message("Audit", b"no")))
        async with open_producer("PG", namesrv_addr=ns, credentials=CONSUMER, tls=tls) as p:
            assert "No default permission for topic:Orders" in await refusal(lambda: p.send(Message("Orders", b"x")))
        for creds, reason in ((None, "No accessKey is configured"),
                              (("producer1", "wrong-secret"), "Check signature failed for accessKey=producer1"),
                              (("stranger1", "whatever-secret"), "No acl config for stranger1")):
            async with open_producer("PG", namesrv_addr=ns, credentials=creds, tls=tls) as p:
                assert reason in await refusal(lambda: p.send(Message("Orders", b"x")))

        async with open_pull_consumer("OrderConsumers", namesrv_addr=ns, credentials=CONSUMER, tls=tls) as c:
            found = []
            for mq in await c.fetch_queues("Orders"):
                res = await c.pull(mq, 0)
                if res.status is PullStatus.FOUND:
                    found += [m.body for m in res.messages]
            assert found == [b"order-1"]
        async with open_pull_consumer("Blocked", namesrv_addr=ns, credentials=CONSUMER, tls=tls) as c:
            mq = (await c.fetch_queues("Orders"))[0]
            assert "No default permission for group:Blocked" in await refusal(lambda: c.pull(mq, 0))

        # --- mqadmin: flags, env vars, refusals as one line ------------------------------
        base = [*MQADMIN, "topicStatus", "-t", "Orders", "-n", ns, "--json", "--tls", "--tlsTrustCertPath", files.ca]
        ok = await trio.run_process([*base, "--accessKey", "admin001", "--secretKey", "admin-secret"],
                                    capture_stdout=True, capture_stderr=True, check=False, cwd=str(REPO_ROOT))
        assert ok.returncode == 0, ok.stderr.decode()
        assert sum(q["maxOffset"] for q in json.loads(ok.stdout)["queues"]) == 1
        env_ok = await trio.run_process(base, capture_stdout=True, capture_stderr=True, check=False,
                                        cwd=str(REPO_ROOT), env={**__import__("os").environ,
                                                                 "ROCKETMQ_ACCESS_KEY": "admin001",
                                                                 "ROCKETMQ_SECRET_KEY": "admin-secret"})
        assert env_ok.returncode == 0, env_ok.stderr.decode()
        denied = await trio.run_process(base, capture_stdout=True, capture_stderr=True, check=False,
                                        cwd=str(REPO_ROOT))
        err = denied.stderr.decode()
        assert denied.returncode == 3 and "No accessKey is configured" in err and "Traceback" not in err

        # --- the name server refuses a fake broker ---------------------------------------
        before = await cluster.broker_ids()
        fake = BrokerRegistration(cluster_name=cluster.cluster_name, broker_name=cluster.broker_name,
                                  broker_addr="127.0.0.1:1", broker_id=0, topic_configs={},
                                  data_version=DataVersion(10**9, 10**9, 0))
        for hook in (None, Credentials("cluster-brokers", "not-the-secret"), PRODUCER):
            async with open_remoting_client(rpc_hook=hook, tls=tls) as rc:
                results = await NamesrvClient(rc, ns).register_broker(fake)
                [result] = results.values()
                assert isinstance(result, ResponseError) and "AclException" in result.remark, result
                results = await NamesrvClient(rc, ns).unregister_broker(
                    cluster.cluster_name, addr, cluster.broker_name, 0)
                assert isinstance(next(iter(results.values())), ResponseError)
        assert await cluster.broker_ids() == before  # the route was not hijacked, nor the master removed

        # --- reload: a whitelisted address, then the rule taken back ------------------------
        async def unsigned_runtime_info(target) -> RemotingCommand:
            async with open_remoting_client(tls=tls) as rc:
                return await rc.invoke(target, RemotingCommand.create_request(RequestCode.GET_BROKER_RUNTIME_INFO))

        assert (await unsigned_runtime_info(addr)).code == ResponseCode.SYSTEM_ERROR
        acl_file.write_text(PLAIN_ACL.format(white='["127.0.0.1"]'))
        with trio.fail_after(15):
            for node in cluster.brokers:
                while (await unsigned_runtime_info(cluster.addr(node))).code != ResponseCode.SUCCESS:
                    await trio.sleep(0.1)
        # A bad edit: the rules in force stay.  The broker says so in its log
        # once it has read the file, and only then is the check meaningful.
        node = cluster.node_of(addr)

        def kept_rules() -> int:
            return cluster.log_tail(node, 1 << 20).count("the rules loaded before stay in force")
        kept_before = kept_rules()
        acl_file.write_text("accounts: [{accessKey: x}]\n")
        with trio.fail_after(15):
            while kept_rules() == kept_before:
                await trio.sleep(0.1)
        assert (await unsigned_runtime_info(addr)).code == ResponseCode.SUCCESS
        acl_file.write_text(PLAIN_ACL.format(white="[]"))
        with trio.fail_after(15):
            while (await unsigned_runtime_info(addr)).code != ResponseCode.SYSTEM_ERROR:
                await trio.sleep(0.1)
        assert "ACL" in cluster.log_tail(master, 20000) and "stay in force" in cluster.log_tail(master, 20000)

        # --- hostile clients against the broker -------------------------------------------
        # An oversized frame (the header claims 1 GiB) closes only its connection.
        raw = await trio.open_tcp_stream("127.0.0.1", int(addr.rpartition(":")[2]))
        header = b'{"code":28,"opaque":5}'
        await raw.send_all(struct.pack(">ii", 1 << 30, len(header)) + header)
        [answer] = await read_until_eof(raw)
        assert answer.code == ResponseCode.SYSTEM_ERROR and "exceeds the maximum" in answer.remark
        # A flood of requests on one connection: answered, the excess SYSTEM_BUSY.
        flood = await trio.open_tcp_stream("127.0.0.1", int(addr.rpartition(":")[2]))
        frames = b"".join(encode_command(ADMIN.sign(RemotingCommand(RequestCode.GET_BROKER_RUNTIME_INFO,
                                                                    opaque=i + 1))) for i in range(600))
        await flood.send_all(frames)
        codes = await read_codes(flood, 600)
        assert codes.get(ResponseCode.SYSTEM_BUSY, 0) > 0 and codes.get(ResponseCode.SUCCESS, 0) > 0
        await flood.aclose()
        async with open_remoting_client(rpc_hook=ADMIN, tls=tls) as rc:  # others are still served
            assert (await MQAdmin(rc, ns).runtime_info(addr))


async def read_codes(stream, n) -> dict:
    from broker.remoting.codec import NEED_DATA, CommandDecoder
    dec, codes, got = CommandDecoder(), {}, 0
    with trio.fail_after(30):
        while got < n:
            cmd = dec.next_command()
            if cmd is NEED_DATA:
                dec.receive_data(await stream.receive_some(65536))
                continue
            codes[cmd.code] = codes.get(cmd.code, 0) + 1
            got += 1
    return codes


def test_secrets_never_leave_in_the_broker_config(tmp_path):
    # GET_BROKER_CONFIG answers any client the ACL lets in: no secret in it.
    from broker.config import BrokerConfig
    from broker.processors.admin_clients import broker_config_properties

    cfg, _ = BrokerConfig.from_dict({
        "dLegerGroup": "g", "dLegerPeers": "n0-127.0.0.1:1", "dLegerSelfId": "n0", "aclEnable": "true",
        "aclFile": str(tmp_path / "plain_acl.yml"), "brokerAccessKey": "cluster-brokers",
        "brokerSecretKey": "brokers-secret-0123", "dLegerPeerSecret": "a group secret of some length"})
    text = repr(broker_config_properties(cfg)) + repr(cfg)
    assert "brokers-secret-0123" not in text and "a group secret of some length" not in text
    assert broker_config_properties(cfg)["aclEnable"] == "true"
