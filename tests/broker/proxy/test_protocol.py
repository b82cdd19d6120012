# mqproxy at the protocol level: grpcio's blocking stubs against one broker
# and the proxy (proxy_helpers: both in this process, each on its own loop,
# TCP on 127.0.0.1, ACL on).  Each RPC's happy path and its error cases,
# with the status codes RocketMQ's proxy answers; what the proxy relayed is
# read back from the broker over remoting (a pull consumer), so a test
# fails if the properties (UNIQ_KEY, __SHARDINGKEY, TIMER_DELIVER_MS,
# the transaction's outcome) did not reach the store.
import time

import anyio
import grpc
import pytest

from broker.client import open_pull_consumer
from broker.client.model import PullStatus
from broker.proxy import pb
from tests.broker.proxy.proxy_helpers import INNER, READER, metadata, proxy_env
from tests.helpers.waiting import wait_until_sync

S = pb.service
D = pb.definition
T = pb.MessageType
TOPICS = ("Orders", "Fifo", "Timed", "Tx", "TxCheck", "Big", "Pop", "Renew")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with proxy_env(tmp_path_factory.mktemp("proxy"), topics=TOPICS, maxMessageBodySize="65536",
                   grpcMaxInboundMessageSize="131072", autoRenewInvisibleMillis="3000") as e:
        yield e


def send_request(topic, body=b"hello", *, mid=None, mtype=T.NORMAL, group=None, deliver_ms=None, tag=None,
                 props=None):
    req = S.SendMessageRequest()
    m = req.messages.add()
    m.topic.name = topic
    m.body = body
    sp = m.system_properties
    sp.message_id = f"01{time.monotonic_ns():030X}"[:34] if mid is None else mid
    sp.message_type = mtype
    if group is not None:
        sp.message_group = group
    if deliver_ms is not None:
        sp.delivery_timestamp.FromMilliseconds(deliver_ms)
    if tag is not None:
        sp.tag = tag
    for k, v in (props or {}).items():
        m.user_properties[k] = v
    return req


def read_back(env, topic, want: int, timeout: float = 15.0):
    """Every message of `topic` once there are `want` (long polls, no sleeps)."""
    async def pull():
        async with open_pull_consumer("proxy_check", namesrv_addr=env.namesrv, credentials=INNER) as pc:
            out = []
            with anyio.fail_after(timeout):
                queues = await pc.fetch_queues(topic)
                offsets = {q: 0 for q in queues}
                while len(out) < want:
                    for q in queues:
                        res = await pc.pull(q, offsets[q], block=0.2 if len(out) < want else 0)
                        if res.status is PullStatus.FOUND:
                            out += res.messages
                        offsets[q] = res.next_begin_offset
            return out
    return env.trio_portal.call(pull)


def test_query_route(env):
    req = S.QueryRouteRequest()
    req.topic.name = "Orders"
    req.endpoints.CopyFrom(env.endpoints())
    r = env.stub.QueryRoute(req, metadata=metadata(), timeout=10)
    assert r.status.code == pb.Code.OK, r.status
    assert [q.id for q in r.message_queues] == [0, 1, 2, 3]
    for q in r.message_queues:
        assert q.permission == D.Permission.READ_WRITE and q.broker.name == "solo" and q.broker.id == 0
        assert set(q.accept_message_types) == {T.NORMAL, T.FIFO, T.DELAY, T.TRANSACTION}
        assert q.broker.endpoints == env.endpoints()  # clients come back to the proxy, never to a broker
    req.topic.name = "NoSuchTopic"
    r = env.stub.QueryRoute(req, metadata=metadata(), timeout=10)
    assert r.status.code == pb.Code.TOPIC_NOT_FOUND and "NoSuchTopic" in r.status.message
    req.topic.name = "bad topic!"
    assert env.stub.QueryRoute(req, metadata=metadata(), timeout=10).status.code == pb.Code.ILLEGAL_TOPIC


def test_query_assignment(env):
    req = S.QueryAssignmentRequest()
    req.topic.name = "Orders"
    req.group.name = "ReadGroup"
    req.endpoints.CopyFrom(env.endpoints())
    r = env.stub.QueryAssignment(req, metadata=metadata(), timeout=10)
    assert r.status.code == pb.Code.OK, r.status
    assert [(a.message_queue.broker.name, a.message_queue.id) for a in r.assignments] == [("solo", -1)]
    req.group.name = ""
    assert env.stub.QueryAssignment(req, metadata=metadata(), timeout=10).status.code == \
        pb.Code.ILLEGAL_CONSUMER_GROUP


def settings_command(client_type, topics=(), group=None):
    cmd = S.TelemetryCommand()
    st = cmd.settings
    st.client_type = client_type
    st.request_timeout.seconds = 3
    if client_type == D.ClientType.PRODUCER:
        for t in topics:
            st.publishing.topics.add(name=t)
        st.publishing.max_body_size = 128 * 1024 * 1024
    else:
        st.subscription.group.name = group or ""
        for t in topics:
            st.subscription.subscriptions.add().topic.name = t
    return cmd


def broker_consumers(env, group):
    """The group's consumer ids at the broker (read in the broker's thread)."""
    return env.trio_portal.call(env.broker.clients.consumer_ids, group)


class Telemetry:
    """A Telemetry stream kept open: commands go in through a queue."""

    def __init__(self, env, md):
        import queue
        self.q = queue.Queue()
        self.call = env.stub.Telemetry(iter(self.q.get, None), metadata=md, timeout=60)

    def send(self, cmd):
        self.q.put(cmd)
        return next(self.call)

    def next(self):
        return next(self.call)

    def close(self):
        self.q.put(None)
        self.call.cancel()


def test_settings_before_heartbeat(env):
    md = metadata(client_id="settings-client")
    hb = env.stub.Heartbeat(S.HeartbeatRequest(client_type=D.ClientType.PRODUCER), metadata=md, timeout=10)
    assert hb.status.code == pb.Code.UNRECOGNIZED_CLIENT_TYPE
    t = Telemetry(env, md)
    try:
        reply = t.send(settings_command(D.ClientType.PRODUCER, ["Orders"]))
        assert reply.status.code == pb.Code.OK and reply.HasField("settings")
        assert reply.settings.publishing.max_body_size == 65536  # the proxy's limit, not the client's 128 MiB
        assert reply.settings.backoff_policy.max_attempts == 3
        hb = env.stub.Heartbeat(S.HeartbeatRequest(client_type=D.ClientType.PRODUCER), metadata=md, timeout=10)
        assert hb.status.code == pb.Code.OK
        reply = t.send(settings_command(D.ClientType.SIMPLE_CONSUMER, ["Orders"], group="ReadGroup"))
        assert reply.status.code == pb.Code.OK
        assert reply.settings.subscription.receive_batch_size == 32
        assert reply.settings.subscription.long_polling_timeout.seconds == 20
        assert reply.settings.backoff_policy.max_attempts == 17
        # the group is declared to the broker (a POP consumer with its subscription) ...
        wait_until_sync(lambda: broker_consumers(env, "ReadGroup"), 10, "ReadGroup at the broker")
        assert "Orders" in env.trio_portal.call(lambda: dict(env.broker.clients.group("ReadGroup").subscriptions))
        bad = settings_command(D.ClientType.SIMPLE_CONSUMER, ["Orders"], group="ReadGroup")
        bad.settings.subscription.subscriptions[0].expression.type = D.FilterType.SQL
        bad.settings.subscription.subscriptions[0].expression.expression = "a >"
        assert t.send(bad).status.code == pb.Code.ILLEGAL_FILTER_EXPRESSION
        reply = t.send(settings_command(D.ClientType.SIMPLE_CONSUMER, ["Orders"], group=""))
        assert reply.status.code == pb.Code.ILLEGAL_CONSUMER_GROUP
        reply = t.send(settings_command(D.ClientType.PULL_CONSUMER, ["Orders"], group="g"))
        assert reply.status.code == pb.Code.UNRECOGNIZED_CLIENT_TYPE
    finally:
        t.close()
    # ... and leaves with its last client
    wait_until_sync(lambda: not broker_consumers(env, "ReadGroup"), 10, "ReadGroup gone from the broker")


def test_send_normal_fifo_and_timed_reach_the_store(env):
    sent = {}
    r = env.stub.SendMessage(send_request("Orders", b"n1", tag="TagA", props={"k": "v"}), metadata=metadata(),
                             timeout=10)
    assert r.status.code == pb.Code.OK, r.status
    sent[r.entries[0].message_id] = "n1"
    for i in range(6):
        r = env.stub.SendMessage(send_request("Fifo", f"f{i}".encode(), mtype=T.FIFO, group="g1"),
                                 metadata=metadata(), timeout=10)
        assert r.status.code == pb.Code.OK, r.status
    at = int(time.time() * 1000) + 3_600_000
    r = env.stub.SendMessage(send_request("Timed", b"t1", mtype=T.DELAY, deliver_ms=at), metadata=metadata(),
                             timeout=10)
    assert r.status.code == pb.Code.OK, r.status
    handle = r.entries[0].recall_handle
    assert handle
    recall = S.RecallMessageRequest(recall_handle=handle)
    recall.topic.name = "Timed"
    rr = env.stub.RecallMessage(recall, metadata=metadata(), timeout=10)
    assert rr.status.code == pb.Code.OK and rr.message_id == r.entries[0].message_id, rr
    assert env.stub.RecallMessage(recall, metadata=metadata(), timeout=10).status.code == pb.Code.BAD_REQUEST  # gone
    recall.recall_handle = "not-a-handle"
    assert env.stub.RecallMessage(recall, metadata=metadata(), timeout=10).status.code == pb.Code.BAD_REQUEST
    (m,) = read_back(env, "Orders", 1)
    assert m.body == b"n1" and m.tags == "TagA" and m.properties["k"] == "v"
    assert m.properties["UNIQ_KEY"] == next(iter(sent))  # the client's message id is the UNIQ_KEY
    fifo = read_back(env, "Fifo", 6)
    assert {x.queue_id for x in fifo} == {fifo[0].queue_id}  # one message group, one queue, in order
    assert [x.body for x in fifo] == [f"f{i}".encode() for i in range(6)]
    assert all(x.properties["__SHARDINGKEY"] == "g1" for x in fifo)


def test_send_errors(env):
    def code(req, md=None):
        return env.stub.SendMessage(req, metadata=md or metadata(), timeout=10).status.code

    assert code(send_request("NoSuchTopic")) == pb.Code.TOPIC_NOT_FOUND
    assert code(send_request("Big", b"x" * 65537)) == pb.Code.MESSAGE_BODY_TOO_LARGE
    assert code(send_request("Big", b"")) == pb.Code.MESSAGE_BODY_EMPTY
    assert code(send_request("Orders", mtype=T.FIFO)) == pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE  # no group
    assert code(send_request("Orders", mtype=T.NORMAL, group="g")) == pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    assert code(send_request("Orders", mtype=T.TRANSACTION, group="g")) == pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    assert code(send_request("Orders", mtype=T.LITE)) == pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    assert code(send_request("Orders", mtype=T.DELAY, deliver_ms=int(time.time() * 1000) + 4 * 86_400_000)) == \
        pb.Code.ILLEGAL_DELIVERY_TIME
    assert code(send_request("Orders", props={"UNIQ_KEY": "x"})) == pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY
    assert code(send_request("Orders", tag="a|b")) == pb.Code.ILLEGAL_MESSAGE_TAG
    assert code(send_request("Orders", mid="")) == pb.Code.ILLEGAL_MESSAGE_ID
    assert code(S.SendMessageRequest()) == pb.Code.BAD_REQUEST
    # Over grpcMaxInboundMessageSize the request is refused by gRPC itself, and the proxy serves on.
    with pytest.raises(grpc.RpcError) as e:
        env.stub.SendMessage(send_request("Big", b"x" * 200_000), metadata=metadata(), timeout=10)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert code(send_request("Big", b"small")) == pb.Code.OK


def test_credentials(env):
    def code(md):
        return env.stub.SendMessage(send_request("Orders"), metadata=md, timeout=10).status.code

    assert code(metadata(upper=True)) == pb.Code.OK  # hex case does not matter
    assert code(metadata(("owner001", "wrong-secret"))) == pb.Code.UNAUTHORIZED
    assert code(metadata(("nobody01", "secret"))) == pb.Code.UNAUTHORIZED
    assert code(metadata(None)) == pb.Code.UNAUTHORIZED  # empty Credential: anonymous, refused under ACL
    md = [(k, v) for k, v in metadata() if k != "authorization"]
    assert code(md) == pb.Code.UNAUTHORIZED
    md = [(k, "MQv2-HMAC-SHA1 Credential=owner001, SignedHeaders=x-mq-date-time, Signature=zz")
          if k == "authorization" else (k, v) for k, v in metadata()]
    assert code(md) == pb.Code.UNAUTHORIZED
    assert code(metadata(READER)) == pb.Code.FORBIDDEN  # reader01 holds SUB on Orders, not PUB
    req = S.QueryRouteRequest()
    req.topic.name = "Orders"
    assert env.stub.QueryRoute(req, metadata=metadata(READER), timeout=10).status.code == pb.Code.OK
    req.topic.name = "Fifo"
    assert env.stub.QueryRoute(req, metadata=metadata(READER), timeout=10).status.code == pb.Code.FORBIDDEN


def end(env, topic, tx_id, mid, resolution, source=D.TransactionSource.SOURCE_CLIENT):
    req = S.EndTransactionRequest(message_id=mid, transaction_id=tx_id, resolution=resolution, source=source)
    req.topic.name = topic
    return env.stub.EndTransaction(req, metadata=metadata(), timeout=10).status


def test_transaction_commit_and_rollback(env):
    ids = []
    for body in (b"commit-me", b"roll-me-back"):
        r = env.stub.SendMessage(send_request("Tx", body, mtype=T.TRANSACTION), metadata=metadata(), timeout=10)
        assert r.status.code == pb.Code.OK, r.status
        assert r.entries[0].transaction_id
        ids.append((r.entries[0].transaction_id, r.entries[0].message_id))
    assert end(env, "Tx", *ids[0], D.TransactionResolution.COMMIT).code == pb.Code.OK
    assert end(env, "Tx", *ids[1], D.TransactionResolution.ROLLBACK).code == pb.Code.OK
    assert end(env, "Tx", "no-such-id", "x", D.TransactionResolution.COMMIT).code == pb.Code.INVALID_TRANSACTION_ID
    assert end(env, "Tx", "", "x", D.TransactionResolution.COMMIT).code == pb.Code.INVALID_TRANSACTION_ID
    assert end(env, "Tx", "t", "x", D.TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED).code == \
        pb.Code.BAD_REQUEST
    # The committed one becomes visible; then a plain send as a barrier: the
    # rolled-back one would have to come before it.
    r = env.stub.SendMessage(send_request("Tx", b"barrier"), metadata=metadata(), timeout=10)
    assert r.status.code == pb.Code.OK
    got = read_back(env, "Tx", 2)
    assert sorted(m.body for m in got) == [b"barrier", b"commit-me"]


def test_orphaned_transaction_is_checked_through_telemetry(env):
    md = metadata(client_id="tx-producer")
    t = Telemetry(env, md)
    try:
        assert t.send(settings_command(D.ClientType.PRODUCER, ["TxCheck"])).status.code == pb.Code.OK
        r = env.stub.SendMessage(send_request("TxCheck", b"unknown-state", mtype=T.TRANSACTION), metadata=md,
                                 timeout=10)
        assert r.status.code == pb.Code.OK, r.status
        mid = r.entries[0].message_id
        # No EndTransaction: the broker checks back (transactionTimeOut 1 s),
        # the proxy pushes the check on this client's stream.
        cmd = t.next()
        assert cmd.HasField("recover_orphaned_transaction_command"), cmd
        check = cmd.recover_orphaned_transaction_command
        assert check.message.system_properties.message_id == mid and check.message.body == b"unknown-state"
        assert check.message.topic.name == "TxCheck"
        assert end(env, "TxCheck", check.transaction_id, mid, D.TransactionResolution.COMMIT,
                   D.TransactionSource.SOURCE_SERVER_CHECK).code == pb.Code.OK
        (m,) = read_back(env, "TxCheck", 1)
        assert m.body == b"unknown-state" and m.properties["UNIQ_KEY"] == mid
    finally:
        t.close()


def receive_request(topic, group="ReadGroup", *, batch=32, invisible_s=20, poll_s=None):
    req = S.ReceiveMessageRequest(batch_size=batch)
    req.group.name = group
    req.message_queue.topic.name = topic
    if invisible_s is not None:
        req.invisible_duration.seconds = invisible_s
    if poll_s is not None:
        req.long_polling_timeout.FromMilliseconds(int(poll_s * 1000))
    return req


def receive(env, req, md=None, timeout=30):
    """(status, messages) of one ReceiveMessage stream."""
    out = list(env.stub.ReceiveMessage(req, metadata=md or metadata(), timeout=timeout))
    statuses = [r.status for r in out if r.HasField("status")]
    assert len(statuses) == 1 and out[0].HasField("status"), out  # the status comes first, once
    return statuses[0], [r.message for r in out if r.HasField("message")]


def test_consumer_rpc_errors(env):
    def rcode(req, md=None):
        return receive(env, req, md)[0].code

    assert rcode(receive_request("Orders", invisible_s=None)) == pb.Code.ILLEGAL_INVISIBLE_TIME
    assert rcode(receive_request("Orders", invisible_s=1)) == pb.Code.ILLEGAL_INVISIBLE_TIME
    assert rcode(receive_request("Orders", batch=0)) == pb.Code.BAD_REQUEST
    assert rcode(receive_request("Orders", batch=33)) == pb.Code.BAD_REQUEST
    assert rcode(receive_request("Orders", poll_s=3600)) == pb.Code.ILLEGAL_POLLING_TIME
    assert rcode(receive_request("Orders", group="")) == pb.Code.ILLEGAL_CONSUMER_GROUP
    assert rcode(receive_request("NoSuchTopic")) == pb.Code.TOPIC_NOT_FOUND
    assert rcode(receive_request("Fifo"), metadata(READER)) == pb.Code.FORBIDDEN

    def ack(handle, topic="Orders", md=None):
        req = S.AckMessageRequest()
        req.group.name = "ReadGroup"
        req.topic.name = topic
        req.entries.add(message_id="m", receipt_handle=handle)
        return env.stub.AckMessage(req, metadata=md or metadata(), timeout=10).status

    now = int(time.time() * 1000)
    assert ack("bad").code == pb.Code.INVALID_RECEIPT_HANDLE
    assert ack("1 2 3 4 9 solo 0 1").code == pb.Code.INVALID_RECEIPT_HANDLE  # topicType 9
    expired = ack(f"0 {now - 120_000} 60000 0 0 solo 0 0 123")
    assert expired.code == pb.Code.INVALID_RECEIPT_HANDLE and "expired" in expired.message
    assert ack(f"0 {now} 60000 0 0 solo 0 0", md=metadata(READER), topic="Fifo").code == pb.Code.FORBIDDEN
    change = S.ChangeInvisibleDurationRequest(receipt_handle="bad", message_id="m")
    change.group.name, change.topic.name = "ReadGroup", "Orders"
    change.invisible_duration.seconds = 10
    assert env.stub.ChangeInvisibleDuration(change, metadata=metadata(), timeout=10).status.code == \
        pb.Code.INVALID_RECEIPT_HANDLE
    dlq = S.ForwardMessageToDeadLetterQueueRequest(receipt_handle=f"0 {now} 60000 0 0 solo 0 0", message_id="m")
    dlq.group.name, dlq.topic.name = "ReadGroup", "Orders"
    assert env.stub.ForwardMessageToDeadLetterQueue(dlq, metadata=metadata(), timeout=10).status.code == \
        pb.Code.INVALID_RECEIPT_HANDLE  # no commitlog offset in the handle


def test_receive_ack_and_change_invisible(env):
    group = "PopGroup"
    first, msgs = receive(env, receive_request("Pop", group, poll_s=0.5))
    if first.code == pb.Code.NOT_IMPLEMENTED:
        pytest.skip(f"the broker does not serve POP yet: {first.message}")
    assert first.code == pb.Code.MESSAGE_NOT_FOUND and not msgs
    ids = []
    for i in range(3):
        r = env.stub.SendMessage(send_request("Pop", f"p{i}".encode()), metadata=metadata(), timeout=10)
        ids.append(r.entries[0].message_id)
    got = []
    while len(got) < 3:  # long polls: each returns as soon as something is there
        st, msgs = receive(env, receive_request("Pop", group, poll_s=5))
        assert st.code in (pb.Code.OK, pb.Code.MESSAGE_NOT_FOUND), st
        got += msgs
    assert sorted(m.system_properties.message_id for m in got) == sorted(ids)
    import hashlib
    for m in got:
        assert m.system_properties.body_digest.checksum == hashlib.md5(m.body).hexdigest().upper()
        assert len(m.system_properties.receipt_handle.split(" ")) == 9
    by_body = {m.body: m for m in got}
    ack = S.AckMessageRequest()
    ack.group.name, ack.topic.name = group, "Pop"
    ack.entries.add(message_id=by_body[b"p0"].system_properties.message_id,
                    receipt_handle=by_body[b"p0"].system_properties.receipt_handle)
    assert env.stub.AckMessage(ack, metadata=metadata(), timeout=10).status.code == pb.Code.OK
    # p1 comes back at once when its invisible time is set to 0
    change = S.ChangeInvisibleDurationRequest(receipt_handle=by_body[b"p1"].system_properties.receipt_handle,
                                              message_id=by_body[b"p1"].system_properties.message_id)
    change.group.name, change.topic.name = group, "Pop"
    change.invisible_duration.seconds = 0
    r = env.stub.ChangeInvisibleDuration(change, metadata=metadata(), timeout=10)
    assert r.status.code == pb.Code.OK and r.receipt_handle
    again = []
    with_deadline = time.monotonic() + 20
    while not again and time.monotonic() < with_deadline:
        st, again = receive(env, receive_request("Pop", group, poll_s=5))
    assert [m.body for m in again] == [b"p1"]
    assert again[0].system_properties.delivery_attempt == 2
    ack = S.AckMessageRequest()
    ack.group.name, ack.topic.name = group, "Pop"
    ack.entries.add(message_id=again[0].system_properties.message_id,
                    receipt_handle=again[0].system_properties.receipt_handle)
    assert env.stub.AckMessage(ack, metadata=metadata(), timeout=10).status.code == pb.Code.OK
    # Acked for good: the broker refuses to change what was acked (the ack
    # reached the retry topic's checkpoint, not another one).
    change.receipt_handle = again[0].system_properties.receipt_handle
    change.invisible_duration.seconds = 30
    r = env.stub.ChangeInvisibleDuration(change, metadata=metadata(), timeout=10)
    assert r.status.code == pb.Code.INVALID_RECEIPT_HANDLE, r.status


def test_push_receipts_are_renewed_until_acked(env):
    """A push consumer's receive (auto_renew, no duration) is invisible for
    autoRenewInvisibleMillis (3 s here) and renewed while held: past twice
    that it has not come back; acked with the handle the client was given,
    it never does."""
    group = "RenewGroup"
    r = env.stub.SendMessage(send_request("Renew", b"held"), metadata=metadata(), timeout=10)
    assert r.status.code == pb.Code.OK
    req = receive_request("Renew", group, invisible_s=None, poll_s=5)
    req.auto_renew = True
    st, msgs = receive(env, req)
    while st.code == pb.Code.MESSAGE_NOT_FOUND:  # (long polls until the message is there)
        st, msgs = receive(env, req)
    assert st.code == pb.Code.OK and [m.body for m in msgs] == [b"held"]
    handle = msgs[0].system_properties.receipt_handle
    renewals = env.proxy.service.renewals
    wait_until_sync(lambda: renewals.held[(group, handle)].renewals >= 2, 20, "two renewals of the held message")
    st, again = receive(env, receive_request("Renew", group, poll_s=0.2))
    assert st.code == pb.Code.MESSAGE_NOT_FOUND and not again  # held past its first invisible time
    ack = S.AckMessageRequest()
    ack.group.name, ack.topic.name = group, "Renew"
    ack.entries.add(message_id=msgs[0].system_properties.message_id, receipt_handle=handle)
    assert env.stub.AckMessage(ack, metadata=metadata(), timeout=10).status.code == pb.Code.OK
    assert (group, handle) not in renewals.held
    st, again = receive(env, receive_request("Renew", group, poll_s=3.5))  # longer than an invisible time
    assert st.code == pb.Code.MESSAGE_NOT_FOUND and not again, again
