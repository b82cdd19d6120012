# The stock C++ client (PyPI rocketmq==0.4.4 = rocketmq-client-cpp 1.0.1)
# against our name server: the producer must fetch its route from
# serve_namesrv (a GET_ROUTEINFO_BY_TOPIC from a CPP client, counted by
# NameServer.request_counts) and send to the broker address in that route.
# The broker is a stub (stub_broker.py) that records what the client sends
# and answers SUCCESS; the recorded SEND_MESSAGE is checked field by field
# with our HeaderReader and against the golden capture in
# golden/send_message_cpp_1.0.1.json (LEDGERMQ_COMPAT_REGEN=1 rewrites it).
import json
import os
from pathlib import Path

import pytest
import trio

from broker.common.values import DataVersion, TopicConfig
from broker.namesrv.client import NamesrvClient
from broker.namesrv.routes import BrokerRegistration
from broker.namesrv.service import NamesrvConfig, serve_namesrv
from broker.remoting.client import open_remoting_client
from broker.remoting.codes import RPC_ONEWAY, LanguageCode, RequestCode, SerializeType
from broker.remoting.header import HeaderReader
from tests.broker.compat.stock_client import run_script
from tests.broker.compat.stub_broker import parse_properties, send_header_v1, serve_stub_broker

TOPIC = "TopicTest"
GOLDEN = Path(__file__).parent / "golden" / "send_message_cpp_1.0.1.json"
ROUTE = (RequestCode.GET_ROUTEINFO_BY_TOPIC, "CPP")
# Values that change from run to run, replaced in the golden capture.
VOLATILE = {"Signature": "<hmac>", "bornTimestamp": "<millis>", "queueId": "<queue>"}


class Cluster:
    """Our name server, a stub broker registered in it for TOPIC (the
    registration connection stays open, or the route would vanish), and
    the route requests the name server answered."""

    def __init__(self, ns, stub, remoting):
        self.ns, self.stub, self.remoting = ns, stub, remoting
        self.route_requests = []
        get_route = ns.dispatcher._processors[RequestCode.GET_ROUTEINFO_BY_TOPIC]

        async def recording(conn, cmd):
            resp = await get_route(conn, cmd)
            self.route_requests.append((cmd, resp))
            return resp
        ns.dispatcher.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, recording)

    async def produce(self, *args, timeout=60):
        run = await trio.to_thread.run_sync(lambda: run_script("produce.py", [self.ns.address, *args],
                                                               timeout=timeout))
        return run.result


@pytest.fixture
async def cluster(nursery, stock_client):
    ns = await nursery.start(serve_namesrv, NamesrvConfig(listen_port=0, bind_address="127.0.0.1"))
    stub = await nursery.start(serve_stub_broker)
    async with open_remoting_client() as remoting:
        reg = BrokerRegistration("DefaultCluster", "RaftNode00", stub.address, 0, ha_server_addr="",
                                 topic_configs={TOPIC: TopicConfig(TOPIC, 4, 4, 6)},
                                 data_version=DataVersion(1, 1, 1700000000000))
        results = await NamesrvClient(remoting, ns.address).register_broker(reg)
        assert all(r.accepted for r in results.values())
        yield Cluster(ns, stub, remoting)


def golden_form(cmd) -> dict:
    fields = {k: VOLATILE.get(k, v) for k, v in cmd.ext_fields.items()}
    props = parse_properties(fields["properties"])
    props["UNIQ_KEY"] = "<uniq>"
    fields["properties"] = props
    return {"code": cmd.code, "language": cmd.language.name, "version": cmd.version, "flag": cmd.flag,
            "serialize_type": int(cmd.serialize_type), "remark": cmd.remark, "ext_fields": fields,
            "body": cmd.body.decode()}


async def test_stock_producer_gets_route_from_our_namesrv_and_sends(cluster):
    result = await cluster.produce(TOPIC, 3, "--shutdown")
    ns, stub = cluster.ns, cluster.stub

    # The route came from our name server, asked for by the C++ client.
    assert ns.request_counts[ROUTE] >= 1
    req, resp = next((c, r) for c, r in cluster.route_requests if c.ext_fields.get("topic") == TOPIC)
    assert (req.language, req.serialize_type, resp.code) == (LanguageCode.CPP, SerializeType.JSON, 0)
    assert json.loads(resp.body)["brokerDatas"][0]["brokerAddrs"] == {"0": stub.address}

    # The client sent the three messages to the broker of that route...
    assert [s.code for s in stub.sends] == [RequestCode.SEND_MESSAGE] * 3, result
    for i, (cmd, sent) in enumerate(zip(stub.sends, result["sent"])):
        h = HeaderReader(send_header_v1(cmd))
        assert h.str("producerGroup") == "compat_producer" and h.str("topic") == TOPIC
        assert h.str("defaultTopic") == "TBW102" and h.int("defaultTopicQueueNums") == 4
        assert 0 <= h.int("queueId") < 4
        assert (h.int("sysFlag"), h.int("flag"), h.int("reconsumeTimes")) == (0, 0, 0)
        assert h.long("bornTimestamp") > 1_600_000_000_000
        assert h.bool("unitMode") is False and h.bool("batch") is False  # sent as "0", not "false"
        props = parse_properties(h.str("properties"))
        assert props["TAGS"] == "TagA" and props["WAIT"] == "true"
        assert cmd.body == f"hello-{i}".encode()
        # ...and took our SUCCESS: SEND_OK, reporting the UNIQ_KEY as the id
        # (client-compat #10), not the offset msgId the broker answered.
        assert sent == {"status": "OK", "msg_id": props["UNIQ_KEY"], "offset": sent["offset"]}
    # Queues are chosen round-robin.
    assert len({HeaderReader(c.ext_fields).int("queueId") for c in stub.sends}) == 3

    # A clean producer shutdown unregisters at the broker, expecting a reply.
    unregister = [c for c in stub.requests if c.code == RequestCode.UNREGISTER_CLIENT]
    assert len(unregister) == 1 and not unregister[0].is_oneway
    h = HeaderReader(unregister[0].ext_fields)
    assert h.str("producerGroup") == "compat_producer" and h.str("consumerGroup") == ""
    assert h.str("clientID")

    captured = golden_form(stub.sends[0])
    if os.environ.get("LEDGERMQ_COMPAT_REGEN"):
        GOLDEN.write_text(json.dumps(captured, indent=2, sort_keys=True) + "\n")
    assert captured == json.loads(GOLDEN.read_text())


async def test_stock_producer_oneway(cluster):
    # rocketmq-client-cpp 1.0.1's send_oneway does NOT set the oneway flag
    # (flag 0, like a sync send) and ignores the reply: a broker must answer
    # every send that is not flagged oneway (client-compat #8 applies to
    # SEND_MESSAGE too).
    result = await cluster.produce(TOPIC, 2, "--mode", "oneway")
    assert result["ok"] == 2
    with trio.fail_after(10):
        while len(cluster.stub.sends) < 2:
            await trio.sleep(0.05)
    assert [(c.code, c.flag & RPC_ONEWAY) for c in cluster.stub.sends] == [(RequestCode.SEND_MESSAGE, 0)] * 2
    # Oneway (and async) sends are pipelined without waiting for replies, so
    # neither RocketMQ nor we promise their order (ordered messages need sync
    # sends); the server starts pipelined requests concurrently.
    assert sorted(c.body for c in cluster.stub.sends) == [b"hello-0", b"hello-1"]
    assert cluster.ns.request_counts[ROUTE] >= 1


async def test_stock_producer_unknown_topic_fails_without_sending(cluster):
    # client-compat #12: TOPIC_NOT_EXIST from the name server is final.
    result = await cluster.produce("NoSuchTopic", 1)
    assert result["ok"] == 0 and "No route info of this topic: NoSuchTopic" in result["sent"][0]["error"]
    asked = [c.ext_fields["topic"] for c, r in cluster.route_requests if r.code == 17]
    assert "NoSuchTopic" in asked
    assert cluster.stub.sends == []
