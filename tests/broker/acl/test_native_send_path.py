# The native C send path (SendRun, broker/processors/send_native.py) skips
# the per-request header decoding the ACL needs to check a signature, so the
# broker turns it off when aclEnable.  Checked on a one-member group served
# in process: with ACL off the pipelined SEND_MESSAGE_V2s of one write reach
# admission as SendRuns (the C path is on by default); with ACL on none do,
# and unsigned, wrongly signed and tampered sends -- one by one and
# pipelined -- are refused with RocketMQ's remark and store nothing, while a
# correctly signed burst is stored from queue offset 0.  (The ACL check
# would also refuse a SendRun's sends -- each decodes its header -- but a
# broker enforcing ACL must not depend on that: the C path stays off.)
import attrs
import pytest
import trio

from broker.acl.signing import Credentials
from broker.config import BrokerConfig
from broker.remoting.client import open_remoting_client
from broker.remoting.codec import NEED_DATA, CommandDecoder, RawSend, SendRun, encode_command
from broker.remoting.codes import ResponseCode
from broker.remoting.command import RemotingCommand
from broker.server import serve_broker
from native import sendpath
from tests.broker.test_server import TOPIC, send_request
from tools.localcluster import free_ports

pytestmark = pytest.mark.slow

PRODUCER = Credentials("producer1", "producer-secret")
PLAIN_ACL = f"accounts: [{{accessKey: producer1, secretKey: producer-secret, topicPerms: [{TOPIC}=PUB]}}]\n"


def broker_config(tmp_path, acl: bool) -> BrokerConfig:
    conf = {"brokerName": "solo", "brokerIP1": "127.0.0.1", "listenPort": "0", "dLegerGroup": "solo",
            "dLegerPeers": f"n0-127.0.0.1:{free_ports(1)[0]}", "dLegerSelfId": "n0",
            "storePathRootDir": str(tmp_path / "n0")}
    if acl:
        (tmp_path / "plain_acl.yml").write_text(PLAIN_ACL)
        conf |= {"aclEnable": "true", "aclFile": str(tmp_path / "plain_acl.yml")}
    cfg, _ = BrokerConfig.from_dict(conf)
    return cfg


async def burst(port: int, cmds: list[RemotingCommand]) -> list[RemotingCommand]:
    """Send every request in one write (one read at the broker: the burst
    path) and read the answers, in order of opaque."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"".join(encode_command(c) for c in cmds))
        dec, out = CommandDecoder(), []
        with trio.fail_after(30):
            while len(out) < len(cmds):
                cmd = dec.next_command()
                if cmd is NEED_DATA:
                    dec.receive_data(await stream.receive_some(65536))
                else:
                    out.append(cmd)
    return sorted(out, key=lambda c: c.opaque)


def numbered(cmds: list[RemotingCommand]) -> list[RemotingCommand]:
    return [attrs.evolve(cmd, opaque=i + 1) for i, cmd in enumerate(cmds)]


async def solo_broker(nursery, cfg):
    broker = await nursery.start(lambda task_status: serve_broker(cfg, bind_host="127.0.0.1",
                                                                  task_status=task_status))
    await broker.gate.wait_writable(timeout=20)
    seen: list[type] = []  # what admission is handed: SendRun (C path) or RemotingCommand
    split = broker.guard.split_burst

    def spy(conn, cmds):
        seen.extend(type(c) for c in cmds)
        return split(conn, cmds)
    broker.guard.split_burst = spy
    return broker, seen


@pytest.mark.skipif(not sendpath.AVAILABLE, reason="the native extension is not built (make native)")
async def test_without_acl_sends_take_the_native_path(tmp_path, nursery):
    broker, seen = await solo_broker(nursery, broker_config(tmp_path, acl=False))
    answers = await burst(broker.server.port, numbered([send_request(i) for i in range(8)]))
    assert [a.code for a in answers] == [ResponseCode.SUCCESS] * 8, [a.remark for a in answers]
    assert SendRun in seen  # the C path is on by default
    assert broker.acl is None


async def test_with_acl_unsigned_or_wrongly_signed_sends_are_refused(tmp_path, nursery):
    broker, seen = await solo_broker(nursery, broker_config(tmp_path, acl=True))
    port, addr = broker.server.port, broker.broker_addr
    denied = "org.apache.rocketmq.acl.common.AclException: "

    # One by one (the client's own connection).
    async with open_remoting_client() as rc:
        resp = await rc.invoke(addr, send_request(0), 5)
        assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, denied + "No accessKey is configured")
    async with open_remoting_client(rpc_hook=Credentials("producer1", "wrong-secret")) as rc:
        resp = await rc.invoke(addr, send_request(0), 5)
        assert resp.code == ResponseCode.SYSTEM_ERROR
        assert "Check signature failed for accessKey=producer1" in resp.remark

    # Pipelined, as the C path would have taken them.
    unsigned = await burst(port, numbered([send_request(i) for i in range(6)]))
    assert {(a.code, a.remark) for a in unsigned} == {(ResponseCode.SYSTEM_ERROR,
                                                        denied + "No accessKey is configured")}
    wrong = await burst(port, numbered([Credentials("producer1", "wrong-secret").sign(send_request(i))
                                        for i in range(6)]))
    assert all(a.code == ResponseCode.SYSTEM_ERROR and "Check signature failed" in a.remark for a in wrong)
    # Signed, then the body changed on the way.
    tampered = [attrs.evolve(PRODUCER.sign(send_request(i)), body=b"forged") for i in range(6)]
    answers = await burst(port, numbered(tampered))
    assert all(a.code == ResponseCode.SYSTEM_ERROR and "Check signature failed" in a.remark for a in answers)

    # Signed right: stored, from offset 0 -- none of the refused ones was.
    ok = await burst(port, numbered([PRODUCER.sign(send_request(i, queue_id=0)) for i in range(6)]))
    assert [a.code for a in ok] == [ResponseCode.SUCCESS] * 6, [a.remark for a in ok]
    assert sorted(int(a.ext_fields["queueOffset"]) for a in ok) == list(range(6))
    assert seen and SendRun not in seen and RawSend not in seen  # with ACL the C path never took a send
    assert broker.acl.refused >= 2 + 18
