# The native C send path (SendRun, broker/processors/send_native.py) with
# and without ACL, on a one-member group served in process.  Without ACL the
# pipelined SEND_MESSAGE_V2s of one write reach admission as SendRuns.  With
# ACL they do too: admission (broker/remoting/guard.py) checks each send of
# a run -- the scan's sends checked in C, broker/acl/fastpath.py, with the
# one-by-one path's verdicts (tests/broker/acl/test_native_acl.py) -- and
# hands the admitted ones on as runs, so signed sends keep the C record
# building.  Unsigned, wrongly signed and tampered sends -- one by one
# and pipelined -- are refused with the same RocketMQ remark on both paths
# and store nothing, while a correctly signed burst is stored from queue
# offset 0 by the C path; a run with refused sends in the middle is split
# around them.
import attrs
import pytest
import trio

from broker.acl.signing import Credentials
from broker.config import BrokerConfig
from broker.processors import send_native
from broker.remoting.client import open_remoting_client
from broker.remoting.codec import NEED_DATA, CommandDecoder, SendRun, encode_command
from broker.remoting.codes import ResponseCode
from broker.remoting.command import RemotingCommand
from broker.server import serve_broker
from native import sendpath
from tests.broker.test_server import TOPIC, send_request
from tools.localcluster import free_ports

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


async def test_with_acl_unsigned_or_wrongly_signed_sends_are_refused(tmp_path, nursery, monkeypatch):
    broker, seen = await solo_broker(nursery, broker_config(tmp_path, acl=True))
    port, addr = broker.server.port, broker.broker_addr
    real_encode, taken = send_native.encode, []

    def encode(run, *args):  # the records of a run the C path took
        taken.append(run.n)
        return real_encode(run, *args)
    monkeypatch.setattr(send_native, "encode", encode)
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
    assert SendRun in seen  # pipelined sends reach admission as runs with ACL too
    assert broker.acl.refused >= 2 + 18

    # Refused sends in the middle of a run: the rest of it is stored, each answer in place.
    mixed = [PRODUCER.sign(send_request(10 + i, queue_id=1)) if i % 3 else send_request(10 + i, queue_id=1)
             for i in range(9)]
    answers = await burst(port, numbered(mixed))
    assert [a.code for a in answers] == [ResponseCode.SYSTEM_ERROR if i % 3 == 0 else ResponseCode.SUCCESS
                                         for i in range(9)], [a.remark for a in answers]
    assert sorted(int(a.ext_fields["queueOffset"]) for a in answers if a.code == ResponseCode.SUCCESS) \
        == list(range(6))
    assert sum(taken) >= 6  # the C path built the signed ones' records (the topic exists by now)
