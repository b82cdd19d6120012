# mqproxy against clients that misbehave, over TLS: the proxy serves gRPC
# with a certificate from a throwaway CA (trustme, tls.server.mode=enforcing),
# budgets are small (one held receive, two streams per connection), and each
# abuse gets its clear Status while the proxy serves on.
import concurrent.futures
import threading
import types

import grpc
import pytest
import trustme

from broker.proxy import pb
from tests.broker.proxy.proxy_helpers import metadata, proxy_env
from tests.broker.proxy.test_protocol import receive, receive_request, send_request, settings_command
from tests.helpers.waiting import wait_until_sync

S = pb.service
D = pb.definition


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("proxy-tls")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_pem.write_to_path(str(root / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(root / "cert.pem"))
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    with proxy_env(root, topics=("Orders", "Quiet"), maxHeldReceives="1", **{
            "tls.server.mode": "enforcing", "tls.server.certPath": str(root / "cert.pem"),
            "tls.server.keyPath": str(root / "key.pem")}) as e:
        creds = grpc.ssl_channel_credentials(root_certificates=(root / "ca.pem").read_bytes())
        channel = grpc.secure_channel(e.endpoint, creds)
        try:
            yield types.SimpleNamespace(stub=pb.service_grpc.MessagingServiceStub(channel), proxy=e.proxy,
                                        plain=pb.service_grpc.MessagingServiceStub(e.channel))
        finally:
            channel.close()


def test_tls_serves_and_plaintext_is_refused(env):
    r = env.stub.SendMessage(send_request("Orders"), metadata=metadata(), timeout=10)
    assert r.status.code == pb.Code.OK, r.status
    with pytest.raises(grpc.RpcError) as e:
        env.plain.SendMessage(send_request("Orders"), metadata=metadata(), timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_held_receives_have_a_budget(env):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(receive, env, receive_request("Quiet", "QuietGroup", poll_s=2))
        wait_until_sync(lambda: env.proxy.service.receives.locked(), 10, "the first receive held by the proxy")
        st, msgs = receive(env, receive_request("Quiet", "QuietGroup2", poll_s=5))
        assert st.code == pb.Code.TOO_MANY_REQUESTS and not msgs, st
        first, _ = held.result(30)
        assert first.code == pb.Code.MESSAGE_NOT_FOUND  # the held one is answered when its poll ends
    st, _ = receive(env, receive_request("Quiet", "QuietGroup2", poll_s=0.2))
    assert st.code == pb.Code.MESSAGE_NOT_FOUND  # the budget is given back


def test_telemetry_abuse(env):
    md = [(k, v) for k, v in metadata() if k != "x-mq-client-id"]
    call = env.stub.Telemetry(iter([settings_command(D.ClientType.PRODUCER, ["Orders"])]), metadata=md, timeout=10)
    (reply,) = list(call)
    assert reply.status.code == pb.Code.CLIENT_ID_REQUIRED
    # A stream of garbage commands and settings for a topic that does not
    # exist: each settings answered, the rest ignored, the stream ends cleanly.
    cmds = [S.TelemetryCommand(thread_stack_trace=S.ThreadStackTrace(nonce="x")) for _ in range(50)]
    cmds.append(settings_command(D.ClientType.PRODUCER, ["bad topic!"]))
    cmds.append(settings_command(D.ClientType.CLIENT_TYPE_UNSPECIFIED))
    replies = list(env.stub.Telemetry(iter(cmds), metadata=metadata(client_id="abuser"), timeout=10))
    assert [r.status.code for r in replies] == [pb.Code.ILLEGAL_TOPIC, pb.Code.UNRECOGNIZED_CLIENT_TYPE]
    assert "abuser" not in env.proxy.service.sessions  # an ended stream leaves no session
    # Many clients hammering at once: every answer is a Status, the proxy serves on.
    errors, lock = [], threading.Lock()

    def hammer(i):
        try:
            req = S.SendMessageRequest()
            m = req.messages.add()
            m.topic.name = "Orders" if i % 2 else "x" * 300
            m.body = b"y" * (i % 7)
            m.system_properties.message_id = f"01{i:032X}"
            r = env.stub.SendMessage(req, metadata=metadata(), timeout=10)
            assert r.status.code in (pb.Code.OK, pb.Code.ILLEGAL_TOPIC, pb.Code.MESSAGE_BODY_EMPTY), r.status
        except BaseException as e:  # noqa: BLE001 - collected and reported below
            with lock:
                errors.append(repr(e))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(hammer, range(64)))
    assert not errors, errors[:3]
    assert env.stub.SendMessage(send_request("Orders"), metadata=metadata(), timeout=10).status.code == pb.Code.OK


def test_unknown_topics_leave_nothing_behind(env):
    inst = env.proxy.service.inst
    before = len(inst.topics())
    req = S.QueryRouteRequest()
    for i in range(200):
        req.topic.name = f"NoSuchTopic{i}"
        assert env.stub.QueryRoute(req, metadata=metadata(), timeout=10).status.code == pb.Code.TOPIC_NOT_FOUND
    assert len(inst.topics()) == before
