# Transactional messages on a 3-node in-memory group (trio MockClock, store
# timestamps on the virtual clock): a PREPARED send lands on the half topic
# only; END_TRANSACTION commit delivers it to its topic once (a second
# commit stores nothing), rollback never delivers; the check service asks a
# connected producer of the group once transactionTimeOut passed, re-puts
# the half with its check count, discards it after transactionCheckMax, and
# -- after the leader stops -- the new leader resumes checking from the
# replicated progress.  The pure rewrites are checked too.
import attrs
import trio
import trio.testing

from broker.common.msgid import parse_offset_msg_id
from broker.config import LiveConfig
from broker.processors.client_manager import ClientManager
from broker.processors.end_transaction import EndTransactionProcessor, TransactionCheckBack
from broker.processors.send import SendProcessor
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.store.transaction import (
    HALF_TOPIC,
    OP_TOPIC,
    OpIndex,
    as_checked,
    from_half,
    renewed,
    to_half,
)
from consumequeue import record as M
from tests.broker.processors.test_send import BORN, v2
from tests.broker.store.test_gate import Group
from tests.broker.store.test_schedule import records_of, vclock, wait_count
from tests.helpers.store_services import transaction_service

HOST = M.HostAddr("10.0.0.9", 10911)
TX = {"TRAN_MSG": "true", "PGROUP": "txg", "TAGS": "T"}


def test_pure_rewrites():
    rec = M.MessageRecord(topic="Orders", body=b"b", queue_id=3, properties={**TX, "UNIQ_KEY": "U"},
                          sysflag=M.TRANSACTION_PREPARED_TYPE | M.COMPRESSED_FLAG, store_timestamp=10)
    half = to_half(rec)
    assert (half.topic, half.queue_id, half.sysflag) == (HALF_TOPIC, 0, M.COMPRESSED_FLAG)
    assert half.properties["REAL_TOPIC"] == "Orders" and half.properties["REAL_QID"] == "3"
    half = attrs.evolve(half, queue_offset=5, physical_offset=1000)
    real = from_half(half, store_timestamp=20, store_host=HOST)
    assert (real.topic, real.queue_id, real.body) == ("Orders", 3, b"b")
    assert real.sysflag == M.COMPRESSED_FLAG | M.TRANSACTION_COMMIT_TYPE and real.prepared_transaction_offset == 1000
    assert "REAL_TOPIC" not in real.properties and real.properties["TRAN_PREPARED_QUEUE_OFFSET"] == "5"
    copy = renewed(renewed(half, 30), 40)
    assert copy.properties["TRANSACTION_CHECK_TIMES"] == "2" and copy.store_timestamp == 40
    assert (as_checked(half).topic, as_checked(half).queue_id) == ("Orders", 3)
    ops = OpIndex()
    ops.add(0, 4, "A")
    ops.add(1, 9, "B")
    assert ops.resolved(4, None) and ops.resolved(100, "B") and not ops.resolved(5, "C")
    assert ops.commit_offset(5) == 1 and not ops.resolved(4, "A")


@attrs.define(eq=False)
class ProducerConn:
    """A producer's connection as the client registry keeps it; records the
    CHECK_TRANSACTION_STATE requests the broker pushes."""

    remote_address: str = "10.0.0.1:5555"
    attributes: dict = attrs.Factory(dict)
    closed: bool = False
    checks: list = attrs.Factory(list)
    arrived: trio.Event = attrs.Factory(trio.Event)

    async def send_request_oneway(self, cmd, timeout=None):
        self.checks.append(cmd)
        self.arrived.set()
        self.arrived = trio.Event()


def register_producer(clients: ClientManager, conn, cid="p1", group="txg"):
    clients.heartbeat(conn, RemotingCommand.create_request(RequestCode.HEART_BEAT),
                      {"clientID": cid, "producerDataSet": [{"groupName": group}]})


def wire(m, clients):
    cfg = m.cfg
    send = SendProcessor(LiveConfig(cfg), m.bs.replica, m.bs.gate, m.bs.metadata, m.bs.store, clock_ms=vclock)
    service = transaction_service(m.bs, cfg, TransactionCheckBack(clients=clients), clock_ms=vclock)
    end = EndTransactionProcessor(send=send, service=service, cq=m.bs.cq)
    return send, service, end


def end_request(resp_fields: dict, state: int, group="txg", **extra) -> RemotingCommand:
    _host, phy = parse_offset_msg_id(resp_fields["msgId"])
    return RemotingCommand.create_request(RequestCode.END_TRANSACTION, {
        "producerGroup": group, "tranStateTableOffset": resp_fields["queueOffset"], "commitLogOffset": str(phy),
        "commitOrRollback": str(state), "fromTransactionCheck": "false", "msgId": resp_fields["transactionId"],
        "transactionId": resp_fields["transactionId"], **extra})


async def half_send(send, body: bytes, topic="TxT", queue_id=1):
    resp = await send.process(v2(topic=topic, body=body, queue_id=queue_id, props=M.properties_to_string(TX),
                                 sys_flag=M.TRANSACTION_PREPARED_TYPE), BORN)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return resp.ext_fields


async def test_commit_rollback_and_check_back(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery, transactionTimeOut="2000", transactionCheckInterval="3000",
                  transactionCheckMax="2")
        await g.start()
        leader = await g.wait_leader()
        clients = ClientManager(clock_ms=vclock)
        send, service, end = wire(leader, clients)
        await nursery.start(service.run)
        conn = ProducerConn()
        register_producer(clients, conn)

        committed = await half_send(send, b"commit-me")
        rolled = await half_send(send, b"roll-me-back")
        unknown = await half_send(send, b"ask-me")
        await g.settle()
        assert [r.body for r in records_of(leader, HALF_TOPIC, 0)] == [b"commit-me", b"roll-me-back", b"ask-me"]
        assert records_of(leader, "TxT", 1) == []  # never visible before a commit

        assert (await end.process(end_request(committed, M.TRANSACTION_COMMIT_TYPE))).code == ResponseCode.SUCCESS
        assert (await end.process(end_request(rolled, M.TRANSACTION_ROLLBACK_TYPE))).code == ResponseCode.SUCCESS
        # a second commit (e.g. a check's answer after the producer's own) stores nothing
        assert (await end.process(end_request(committed, M.TRANSACTION_COMMIT_TYPE))).code == ResponseCode.SUCCESS
        wrong = await end.process(end_request(unknown, M.TRANSACTION_COMMIT_TYPE, group="other"))
        assert (wrong.code, wrong.remark) == (ResponseCode.SYSTEM_ERROR, "The producer group wrong")
        got = await wait_count(leader, "TxT", 1, 1)
        assert [r.body for r in got] == [b"commit-me"] and got[0].transaction_type == M.TRANSACTION_COMMIT_TYPE
        assert len(await wait_count(leader, OP_TOPIC, 0, 2)) == 2

        # the third is neither: checked back after transactionTimeOut (2 s) ...
        t0 = trio.current_time()
        await conn.arrived.wait()
        assert 1.5 <= trio.current_time() - t0 <= 2.5
        check = conn.checks[0]
        assert check.code == RequestCode.CHECK_TRANSACTION_STATE
        assert check.ext_fields["transactionId"] == unknown["transactionId"]
        asked = M.decode(check.body)
        assert (asked.topic, asked.queue_id, asked.body) == ("TxT", 1, b"ask-me")
        assert asked.properties["TRANSACTION_CHECK_TIMES"] == "1"
        # ... naming the re-put copy, which the answer resolves
        copy = {"msgId": check.ext_fields["offsetMsgId"], "queueOffset": check.ext_fields["tranStateTableOffset"],
                "transactionId": check.ext_fields["transactionId"]}
        assert int(copy["queueOffset"]) == 3
        assert (await end.process(end_request(copy, M.TRANSACTION_COMMIT_TYPE))).code == ResponseCode.SUCCESS
        got = await wait_count(leader, "TxT", 1, 2)
        assert [r.body for r in got] == [b"commit-me", b"ask-me"]
        await trio.sleep(10)
        assert len(conn.checks) == 1  # resolved: never asked again
        assert [r.body for r in records_of(leader, "TxT", 1)] == [b"commit-me", b"ask-me"]
        assert service.checks_sent == 1 and service.discarded == 0

        # nobody answers: checked transactionCheckMax (2) times, 3 s apart, then discarded
        await half_send(send, b"forgotten")
        await conn.arrived.wait()
        t1 = trio.current_time()
        await conn.arrived.wait()
        assert 2.5 <= trio.current_time() - t1 <= 3.5
        await trio.sleep(10)
        assert len(conn.checks) == 3 and service.discarded == 1
        assert b"forgotten" not in [r.body for r in records_of(leader, "TxT", 1)]
        nursery.cancel_scope.cancel()


async def test_new_leader_resumes_checking(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        g = Group(tmp_path, nursery, transactionTimeOut="3000", transactionCheckInterval="3000")
        await g.start()
        leader = await g.wait_leader()
        wired = {}
        for m in g.alive():
            clients = ClientManager(clock_ms=vclock)
            conn = ProducerConn()
            register_producer(clients, conn, cid=f"p-{m.nid}")
            send, service, end = wire(m, clients)
            await nursery.start(service.run)
            wired[m.nid] = (send, service, end, conn)
        send, service, end, conn = wired[leader.nid]
        first = await half_send(send, b"one")
        await half_send(send, b"two")
        await conn.arrived.wait()  # both due together: checked by this leader
        while len(conn.checks) < 2:
            await conn.arrived.wait()
        await end.process(end_request(first, M.TRANSACTION_ROLLBACK_TYPE))  # the original: resolves its copy too
        await g.settle()
        old = leader
        await old.stop()
        await trio.testing.wait_all_tasks_blocked()
        assert not wired[old.nid][1].active
        leader = await g.wait_leader(exclude=(old.nid,))
        _send, service, end, conn = wired[leader.nid]
        while not conn.checks:  # (the election may take long enough on the virtual clock for a check)
            await conn.arrived.wait()
        asked = [M.decode(c.body) for c in conn.checks]
        assert {a.body for a in asked} == {b"two"}  # "one" was rolled back; "two" is checked again ...
        assert [a.properties["TRANSACTION_CHECK_TIMES"] for a in asked] == [str(2 + i) for i in range(len(asked))]
        fields = {"msgId": conn.checks[0].ext_fields["offsetMsgId"],
                  "queueOffset": conn.checks[0].ext_fields["tranStateTableOffset"],
                  "transactionId": conn.checks[0].ext_fields["transactionId"]}
        assert (await end.process(end_request(fields, M.TRANSACTION_COMMIT_TYPE))).code == ResponseCode.SUCCESS
        got = await wait_count(leader, "TxT", 1, 1)
        assert [r.body for r in got] == [b"two"]
        nursery.cancel_scope.cancel()
