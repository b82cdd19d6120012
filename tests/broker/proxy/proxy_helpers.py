# The proxy's in-process test bed: a name server and a one-member DLedger
# broker served on trio in a thread of their own (an anyio blocking portal),
# mqproxy's serve_proxy on asyncio in another, and the tests on the main
# thread with grpcio's blocking stubs, all over TCP on 127.0.0.1.  ACL is on
# at both ends: the broker checks the proxy's inner (admin) account, the
# proxy checks each gRPC caller's authorization header against the same
# plain_acl.yml.
import contextlib
import datetime
import uuid
from contextlib import asynccontextmanager

import anyio
import anyio.from_thread
import attrs
import grpc
import trio

from broker.acl.signing import Credentials
from broker.remoting.client import open_remoting_client
from broker.config import BrokerConfig
from broker.namesrv.service import NamesrvConfig, serve_namesrv
from broker.proxy import auth, pb
from broker.proxy.config import ProxyConfig
from broker.proxy.server import serve_proxy
from broker.server import serve_broker
from tools.localcluster import free_ports
from tools.mqadmin.adminapi import MQAdmin

PLAIN_ACL = """\
accounts:
  - accessKey: proxyinner
    secretKey: proxy-inner-secret
    admin: true
  - accessKey: owner001
    secretKey: owner-secret
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
  - accessKey: reader01
    secretKey: reader-secret
    topicPerms: [Orders=SUB]
    groupPerms: [ReadGroup=SUB]
"""
OWNER = ("owner001", "owner-secret")
READER = ("reader01", "reader-secret")
INNER = Credentials("proxyinner", "proxy-inner-secret")


def metadata(creds: tuple[str, str] | None = OWNER, client_id: str | None = None, *,
             upper: bool = False, date: str | None = None) -> list[tuple[str, str]]:
    """The headers the official Python client sends (spec §8.9)."""
    date = date or datetime.datetime.now().strftime("%Y%m%dT%H%M%SZ")
    ak, sk = creds if creds is not None else ("", "")
    sig = auth.sign(sk, date) if creds is not None else ""
    if upper:
        sig = sig.upper()
    return [("x-mq-language", "PYTHON"), ("x-mq-protocol", "GRPC_V2"), ("x-mq-client-version", "5.1.2"),
            ("x-mq-date-time", date), ("x-mq-request-id", str(uuid.uuid4())),
            ("x-mq-client-id", client_id or f"test@{uuid.uuid4().hex[:8]}"), ("x-mq-namespace", ""),
            ("authorization", f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, Signature={sig}")]


@attrs.define
class ProxyEnv:
    namesrv: str
    broker_addr: str
    endpoint: str
    channel: grpc.Channel
    stub: object
    proxy: object
    broker: object
    trio_portal: object

    def endpoints(self):
        host, port = self.endpoint.rsplit(":", 1)
        ep = pb.definition.Endpoints(scheme=pb.definition.AddressScheme.IPv4)
        ep.addresses.add(host=host, port=int(port))
        return ep


@asynccontextmanager
async def _group(tmp_path, topics):
    (tmp_path / "plain_acl.yml").write_text(PLAIN_ACL)
    ns_port, peer_port = free_ports(2)
    async with trio.open_nursery() as nursery:
        ns = await nursery.start(serve_namesrv, NamesrvConfig(listen_port=ns_port, bind_address="127.0.0.1"))
        cfg, _ = BrokerConfig.from_dict({
            "brokerName": "solo", "brokerIP1": "127.0.0.1", "listenPort": "0", "dLegerGroup": "solo",
            "dLegerPeers": f"n0-127.0.0.1:{peer_port}", "dLegerSelfId": "n0", "storePathRootDir": str(tmp_path / "n0"),
            "aclEnable": "true", "aclFile": str(tmp_path / "plain_acl.yml"), "flushDiskType": "ASYNC_FLUSH",
            "namesrvAddr": f"127.0.0.1:{ns_port}", "registerNameServerPeriod": "10000",
            "transactionTimeOut": "1000", "transactionCheckInterval": "1000"})
        broker = await nursery.start(lambda task_status: serve_broker(cfg, bind_host="127.0.0.1",
                                                                      task_status=task_status))
        await broker.gate.wait_writable(timeout=20)
        async with open_remoting_client(rpc_hook=INNER) as rc:
            admin = MQAdmin(rc, f"127.0.0.1:{ns_port}")
            for t in topics:
                await admin.create_topic(broker.broker_addr, t, 4, 4, 6, False)

        def known(routes) -> bool:
            return all((r := routes.topic_route(t)) is not None and
                       any(b.master_addr == broker.broker_addr for b in r.broker_datas) for t in topics)
        with trio.fail_after(20):
            await ns.wait_until(known)
        yield f"127.0.0.1:{ns_port}", broker
        nursery.cancel_scope.cancel()


@contextlib.contextmanager
def proxy_env(tmp_path, topics=("Orders",), **proxy_conf):
    with anyio.from_thread.start_blocking_portal("trio") as tp:
        with tp.wrap_async_context_manager(_group(tmp_path, topics)) as (ns, broker):
            cfg = ProxyConfig.from_dict({"namesrvAddr": ns, "grpcServerPort": "0", "bindAddress": "127.0.0.1",
                                         "aclEnable": "true", "aclFile": str(tmp_path / "plain_acl.yml"),
                                         "innerAccessKey": INNER.access_key, "innerSecretKey": INNER.secret_key,
                                         **{k: str(v) for k, v in proxy_conf.items()}})
            with anyio.from_thread.start_blocking_portal("asyncio") as ap:
                future, proxy = ap.start_task(serve_proxy, cfg)
                channel = grpc.insecure_channel(proxy.endpoint)
                try:
                    yield ProxyEnv(ns, broker.broker_addr, proxy.endpoint, channel,
                                   pb.service_grpc.MessagingServiceStub(channel), proxy, broker, tp)
                finally:
                    channel.close()
                    future.cancel()
