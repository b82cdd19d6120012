# GET_ALL_PRODUCER_INFO 328 (broker/processors/admin_clients.py) over the
# client registry fed by real HEART_BEAT requests on fake connections.
# Oracle: RocketMQ 5's ProducerTableInfo as fastjson writes it --
# {"data": {group: [ProducerInfo]}}, a ProducerInfo's fields clientId,
# language (the enum's name), lastUpdateTimestamp, remoteIP (Java's
# InetSocketAddress.toString(), "/ip:port"), version, in name order.
# Checked: the exact body, expired and closed connections left out, the
# bound (count and bytes) with its remark and totals, the ACL rule.
import json

from broker.acl.table import Kind, rule_for
from broker.processors import admin_clients
from broker.processors.admin_clients import ClientsAdminProcessor, producer_table
from broker.processors.client_manager import ClientManager
from broker.processors.clients import ClientProcessor
from broker.remoting.codes import LanguageCode, RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from tests.broker.processors.test_clients_offsets import FakeConn


def producer_heartbeat(client_id: str, *groups: str, language=LanguageCode.JAVA, version=453) -> RemotingCommand:
    data = {"clientID": client_id, "consumerDataSet": [], "producerDataSet": [{"groupName": g} for g in groups],
            "heartbeatFingerprint": 0, "withoutSub": False}
    return RemotingCommand.create_request(RequestCode.HEART_BEAT, body=json.dumps(data).encode(), language=language,
                                          version=version, opaque=3)


def admin(mgr: ClientManager) -> ClientsAdminProcessor:
    # GET_ALL_PRODUCER_INFO reads the client registry only.
    return ClientsAdminProcessor(config=None, gate=None, metadata=None, queues=None, replica=None, clients=mgr)


async def ask(mgr: ClientManager) -> RemotingCommand:
    resp = await admin(mgr)(None, RemotingCommand.create_request(RequestCode.GET_ALL_PRODUCER_INFO, opaque=7))
    assert (resp.code, resp.opaque, resp.is_response) == (ResponseCode.SUCCESS, 7, True), resp.remark
    return resp


async def test_the_body_is_rocketmqs_producer_table_info():
    now = [1_700_000_000_123]
    mgr = ClientManager(clock_ms=lambda: now[0])
    hb = ClientProcessor(mgr)
    java, go, gone = FakeConn("127.0.0.1:50001"), FakeConn("10.0.0.7:50002"), FakeConn("127.0.0.1:50003")
    assert (await hb(java, producer_heartbeat("10.0.0.1@4711", "OrderProducers", "TxProducers"))).code == 0
    now[0] += 5
    assert (await hb(go, producer_heartbeat("10.0.0.7@go", "OrderProducers", language=LanguageCode.GO,
                                            version=399))).code == 0
    await hb(gone, producer_heartbeat("gone@1", "GoneProducers"))
    gone.closed = True  # a closed connection is not listed (nor its group, with nobody left in it)

    resp = await ask(mgr)
    assert resp.body == (
        b'{"data":{"OrderProducers":['
        b'{"clientId":"10.0.0.1@4711","language":"JAVA","lastUpdateTimestamp":1700000000123,'
        b'"remoteIP":"/127.0.0.1:50001","version":453},'
        b'{"clientId":"10.0.0.7@go","language":"GO","lastUpdateTimestamp":1700000000128,'
        b'"remoteIP":"/10.0.0.7:50002","version":399}],'
        b'"TxProducers":[{"clientId":"10.0.0.1@4711","language":"JAVA","lastUpdateTimestamp":1700000000123,'
        b'"remoteIP":"/127.0.0.1:50001","version":453}]}}')
    assert resp.remark is None
    assert (resp.ext_fields["groupTotal"], resp.ext_fields["producerTotal"]) == ("2", "3")

    now[0] += mgr.expired_ms + 1  # the heartbeats expired: nothing listed, still an answer
    resp = await ask(mgr)
    assert json.loads(resp.body) == {"data": {}} and resp.ext_fields["producerTotal"] == "0"


async def test_the_answer_is_bounded_and_says_so():
    mgr = ClientManager()
    hb = ClientProcessor(mgr)
    n = admin_clients.MAX_PRODUCERS_LISTED + 7
    for i in range(n):
        await hb(FakeConn(f"127.0.0.1:{i}"), producer_heartbeat(f"c{i:05d}", f"G{i % 3}"))
    resp = await ask(mgr)
    data = json.loads(resp.body)["data"]
    assert sum(len(v) for v in data.values()) == admin_clients.MAX_PRODUCERS_LISTED
    assert sorted(data) == ["G0", "G1", "G2"]  # groups by name, the last one cut short
    assert len(data["G2"]) < len(data["G1"]) == len(data["G0"]) == (n + 2) // 3
    assert (resp.ext_fields["groupTotal"], resp.ext_fields["producerTotal"]) == ("3", str(n))
    assert resp.remark.startswith(f"{admin_clients.MAX_PRODUCERS_LISTED} of {n} producers listed (3 of 3 groups)")
    assert len(resp.body) <= admin_clients.MAX_PRODUCER_TABLE_BYTES

    # Long client ids (a heartbeat says what it likes): the bytes bound stops the listing first.
    big = ClientManager()
    hb = ClientProcessor(big)
    for i in range(40):
        await hb(FakeConn(f"127.0.0.1:{i}"), producer_heartbeat(f"{i:02d}" + "x" * 30_000, "Big", f"Other{i}"))
    data, listed, total, groups = producer_table(big)
    body = json.dumps({"data": data}, separators=(",", ":")).encode()
    assert 0 < listed < total == 80 and groups == 41
    assert admin_clients.MAX_PRODUCER_TABLE_BYTES - 31_000 < len(body) <= admin_clients.MAX_PRODUCER_TABLE_BYTES
    # and the exact count bound, group boundaries included
    data, listed, _, _ = producer_table(big, limit=41, max_bytes=1 << 30)
    assert listed == 41 and len(data["Big"]) == 40 and list(data) == ["Big", "Other0"]


def test_the_acl_rule_is_admin_only_without_header_fields():
    rule = rule_for(RequestCode.GET_ALL_PRODUCER_INFO)
    assert rule.kind is Kind.ADMIN and rule.fields == {}
    assert RequestCode.GET_ALL_PRODUCER_INFO == 328
    assert RequestCode.GET_ALL_PRODUCER_INFO in ClientsAdminProcessor.CODES
