# Tests of the running name server over real TCP on 127.0.0.1: a broker
# registering with two name servers, route / cluster info / topic list /
# delete / unregister as stock clients see them (standard JSON, quoted "0"
# keys, C++-style headers), clear errors for compressed or corrupt
# registrations, removal when the registration connection closes, expiry of
# a silent broker (real short timers, and MockClock for the 120 s default),
# and periodic re-registration keeping a broker alive.
import json

import pytest
import trio

from broker.common.values import DataVersion, TopicConfig
from broker.namesrv.client import NamesrvClient, run_broker_registration
from broker.namesrv.protocol import COMPRESSED_UNSUPPORTED, registration_request
from broker.namesrv.routes import BrokerRegistration
from broker.namesrv.service import NameServer, NamesrvConfig, serve_namesrv
from broker.remoting.client import open_remoting_client
from broker.remoting.codes import LanguageCode, RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import ResponseError

MASTER = "127.0.0.1:10911"
FOLLOWER = "127.0.0.1:10921"


def registration(addr=MASTER, broker_id=0, term=1, timeout=None, topics=("TopicTest",)):
    return BrokerRegistration("DefaultCluster", "RaftNode00", addr, broker_id, ha_server_addr="",
                              topic_configs={t: TopicConfig(t, 4, 4, 6) for t in topics},
                              data_version=DataVersion(1, term, 1700000000000), heartbeat_timeout=timeout)


async def start_namesrv(nursery, **kw) -> NameServer:
    return await nursery.start(serve_namesrv, NamesrvConfig(listen_port=0, bind_address="127.0.0.1", **kw))


def broker_known(addr):
    return lambda routes: any(addr in bd.broker_addrs.values() for bd in routes.broker_addr_table.values())


async def test_broker_registers_with_every_name_server_and_clients_read_routes(nursery):
    ns1, ns2 = await start_namesrv(nursery), await start_namesrv(nursery)
    async with open_remoting_client() as remoting:
        api = NamesrvClient(remoting, f"{ns1.address};{ns2.address}")
        results = await api.register_broker(registration())
        assert all(r.accepted for r in results.values()) and len(results) == 2
        results = await api.register_broker(registration(FOLLOWER, 1))
        assert {r.master_addr for r in results.values()} == {MASTER}
        for ns in (ns1, ns2):
            only = NamesrvClient(remoting, ns.address)
            route = await only.get_route("TopicTest")
            assert route.broker_datas[0].broker_addrs == {0: MASTER, 1: FOLLOWER}
            assert await only.get_topic_list() == ["TopicTest"]
            brokers, clusters = await only.get_cluster_info()
            assert clusters == {"DefaultCluster": ["RaftNode00"]}
            assert brokers["RaftNode00"].master_addr == MASTER
        assert await api.get_route("Nope") is None
        await api.delete_topic("TopicTest")
        assert await api.get_route("TopicTest") is None and await api.get_topic_list() == []
        await api.register_broker(registration())  # the master's next registration restores it
        assert await api.get_route("TopicTest") is not None
        await api.unregister_broker("DefaultCluster", MASTER, "RaftNode00", 0)
        await api.unregister_broker("DefaultCluster", FOLLOWER, "RaftNode00", 1)
        assert await api.get_route("TopicTest") is None
        assert await api.get_cluster_info() == ({}, {})


async def test_stock_client_route_request(nursery):
    # What rocketmq-client-cpp sends: CPP/version 63, no
    # serializeTypeCurrentRPC, AccessKey/OnsChannel/Signature; the answer is
    # standard JSON with the broker ids quoted.
    ns = await start_namesrv(nursery)
    async with open_remoting_client() as remoting:
        await NamesrvClient(remoting, ns.address).register_broker(registration())
        req = RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, language=LanguageCode.CPP, version=63,
                              ext_fields={"topic": "TopicTest", "AccessKey": "", "OnsChannel": "ALIYUN",
                                          "Signature": ""})
        resp = await remoting.invoke(ns.address, req)
        assert resp.code == ResponseCode.SUCCESS
        assert b'"brokerAddrs":{"0":"127.0.0.1:10911"}' in resp.body
        route = json.loads(resp.body)
        assert route["queueDatas"] == [{"brokerName": "RaftNode00", "perm": 6, "readQueueNums": 4,
                                        "topicSysFlag": 0, "writeQueueNums": 4}]
        missing = await remoting.invoke(ns.address, RemotingCommand(105, ext_fields={"topic": "Nope"}))
        assert missing.code == ResponseCode.TOPIC_NOT_EXIST == 17
        assert missing.remark == "No topic route info in name server for the topic: Nope"
        info = await remoting.invoke(ns.address, RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO))
        assert json.loads(info.body)["brokerAddrTable"]["RaftNode00"]["brokerAddrs"] == {"0": MASTER}
        topics = await remoting.invoke(ns.address, RemotingCommand(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
        assert json.loads(topics.body) == {"topicList": ["TopicTest"]}


async def test_bad_registrations_are_refused_clearly(nursery):
    ns = await start_namesrv(nursery)
    good = registration_request(registration())
    async with open_remoting_client() as remoting:
        async def send(fields=None, body=None):
            cmd = RemotingCommand(good.code, ext_fields={**good.ext_fields, **(fields or {})},
                                  body=good.body if body is None else body)
            return await remoting.invoke(ns.address, cmd)

        resp = await send({"compressed": "true", "bodyCrc32": "0"}, b"\x78\x9c garbage")
        assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, COMPRESSED_UNSUPPORTED)
        resp = await send({"bodyCrc32": "12345"})
        assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, "crc32 not match")
        resp = await send({"bodyCrc32": "0"}, b"{not json")
        assert resp.code == ResponseCode.SYSTEM_ERROR and "RegisterBrokerBody is not valid JSON" in resp.remark
        resp = await send({"bodyCrc32": "0"}, b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":5}}}')
        assert resp.code == ResponseCode.SYSTEM_ERROR and "bad RegisterBrokerBody" in resp.remark
        resp = await remoting.invoke(ns.address, RemotingCommand(RequestCode.REGISTER_BROKER,
                                                                 ext_fields={"brokerAddr": MASTER}))
        assert resp.code == ResponseCode.SYSTEM_ERROR and "<clusterName> is null" in resp.remark
        assert ns.routes.broker_addr_table == {}
        assert (await send()).code == ResponseCode.SUCCESS  # the same connection still works
        resp = await remoting.invoke(ns.address, RemotingCommand(RequestCode.PULL_MESSAGE))
        assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


async def test_broker_connection_close_removes_it_at_once(nursery):
    ns = await start_namesrv(nursery)  # default timeout: 120 s
    async with open_remoting_client() as remoting:
        await NamesrvClient(remoting, ns.address).register_broker(registration())
        assert broker_known(MASTER)(ns.routes)
    with trio.fail_after(5):
        await ns.wait_until(lambda routes: not broker_known(MASTER)(routes))
    assert ns.routes.topic_list() == []


async def test_silent_broker_expires_after_its_heartbeat_timeout(nursery):
    ns = await start_namesrv(nursery)
    async with open_remoting_client() as remoting:
        api = NamesrvClient(remoting, ns.address)
        start = trio.current_time()
        await api.register_broker(registration(timeout=0.3))
        await api.register_broker(registration(FOLLOWER, 1, timeout=30))
        with trio.fail_after(5):
            await ns.wait_until(lambda routes: not broker_known(MASTER)(routes))
        assert trio.current_time() - start >= 0.3
        # The connection is still open: expiry, not a close, removed it.
        assert remoting.cached(ns.address) is not None
        # As upstream: the broker name keeps its queues while a follower is
        # left; the route simply has no master until a new one registers.
        route = await api.get_route("TopicTest")
        assert route.broker_datas[0].broker_addrs == {1: FOLLOWER}


async def test_periodic_registration_keeps_a_broker_alive(nursery):
    ns = await start_namesrv(nursery)
    async with open_remoting_client() as remoting:
        api = NamesrvClient(remoting, ns.address)
        async with trio.open_nursery() as inner:
            registrar = await inner.start(run_broker_registration, api,
                                          lambda: registration(timeout=0.5), 0.05)
            assert registrar.rounds == 1 and registrar.last_results[ns.address].accepted
            # Well past the 0.5 s timeout, the broker is still there.
            with trio.move_on_after(1.5) as waited:
                await ns.wait_until(lambda routes: not broker_known(MASTER)(routes))
            assert waited.cancelled_caught and registrar.rounds >= 5
            inner.cancel_scope.cancel()
        with trio.fail_after(5):  # registrations stopped: it expires
            await ns.wait_until(lambda routes: not broker_known(MASTER)(routes))


async def test_registration_failures_are_reported_per_name_server(nursery):
    ns = await start_namesrv(nursery)
    async with open_remoting_client() as remoting:
        api = NamesrvClient(remoting, [ns.address, "127.0.0.1:1"], timeout=2)
        results = await api.register_broker(registration())
        assert results[ns.address].accepted
        assert not hasattr(results["127.0.0.1:1"], "accepted")  # a RemotingConnectError
        # Reads fall through to the name server that answers.
        reads = NamesrvClient(remoting, ["127.0.0.1:1", ns.address], timeout=2)
        assert await reads.get_topic_list() == ["TopicTest"]


async def test_topic_list_can_be_disabled(nursery):
    ns = await start_namesrv(nursery, enable_all_topic_list=False)
    async with open_remoting_client() as remoting:
        with pytest.raises(ResponseError, match="disable"):
            await NamesrvClient(remoting, ns.address).get_topic_list()


async def test_expiry_timer_with_the_default_timeout(autojump_clock):
    # The expiry task sleeps until the earliest deadline (no polling): with
    # MockClock the 120 s default passes instantly.
    ns = NameServer(NamesrvConfig())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ns.expire_brokers)
        ns.routes.register_broker(registration(), trio.current_time())
        ns._notify()
        start = trio.current_time()
        await trio.sleep(119.9)
        assert broker_known(MASTER)(ns.routes)
        await ns.wait_until(lambda routes: not broker_known(MASTER)(routes))
        assert trio.current_time() - start == pytest.approx(120)
        nursery.cancel_scope.cancel()
