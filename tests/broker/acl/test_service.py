# The running ACL (broker/acl/service.py) over a real file: the refusal it
# answers, reloading when the file changes (in place, by rename, with a bad
# edit that must keep the old rules), and a missing file at start.
import os

import pytest
import trio

from broker.acl.plain import Account, AclConfigError
from broker.acl.service import AclService, host_of
from broker.acl.signing import Credentials
from broker.acl.validator import BROKER_POLICY, NAMESRV_POLICY
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand

V1 = "accounts: [{accessKey: alpha001, secretKey: alpha-secret, admin: true}]\n"
V2 = "accounts: [{accessKey: beta0001, secretKey: beta-secret, admin: true}]\n"


class FakeConn:
    remote_address = "10.1.2.3:40000"
    attributes: dict = {}


def signed(ak, sk):
    return Credentials(ak, sk).sign(RemotingCommand.create_request(RequestCode.GET_BROKER_RUNTIME_INFO))


def allowed(acl, ak, sk) -> bool:
    return acl.check(FakeConn(), signed(ak, sk)) is None


async def test_refusal_is_answered_as_rocketmq_answers(tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text(V1)
    acl = AclService.load(str(path), BROKER_POLICY)
    refusal = acl.check(FakeConn(), signed("beta0001", "beta-secret"))
    assert refusal.code == ResponseCode.SYSTEM_ERROR
    assert refusal.remark == "org.apache.rocketmq.acl.common.AclException: No acl config for beta0001"
    assert acl.refused == 1
    assert allowed(acl, "alpha001", "alpha-secret")


def test_host_of():
    assert host_of("10.1.2.3:40000") == "10.1.2.3"
    assert host_of("[::1]:40000") == "::1"


def test_missing_or_bad_file_fails_the_start(tmp_path):
    with pytest.raises(AclConfigError, match="cannot read"):
        AclService.load(str(tmp_path / "nope.yml"), BROKER_POLICY)
    (tmp_path / "bad.yml").write_text("accounts: [{accessKey: x}]")
    with pytest.raises(AclConfigError, match="bad.yml"):
        AclService.load(str(tmp_path / "bad.yml"), BROKER_POLICY)


async def wait_reload(acl, reloads: int | None = None, error: bool = False):
    with trio.fail_after(10):
        while not ((reloads is not None and acl.reloads >= reloads) or (error and acl.last_error)):
            await acl.changed.wait()


async def test_reload_on_change_in_place_by_rename_and_bad_edit(tmp_path, nursery):
    path = tmp_path / "plain_acl.yml"
    path.write_text(V1)
    acl = AclService.load(str(path), BROKER_POLICY)
    await nursery.start(acl.run)
    assert allowed(acl, "alpha001", "alpha-secret") and not allowed(acl, "beta0001", "beta-secret")

    path.write_text(V2)  # edited in place
    await wait_reload(acl, 1)
    assert allowed(acl, "beta0001", "beta-secret") and not allowed(acl, "alpha001", "alpha-secret")

    tmp = tmp_path / "plain_acl.yml.tmp"  # an editor's write-then-rename
    tmp.write_text(V1)
    os.replace(tmp, path)
    await wait_reload(acl, 2)
    assert allowed(acl, "alpha001", "alpha-secret")

    path.write_text("accounts: [{accessKey: alpha001, secretKey: short}]\n")  # a bad edit
    await wait_reload(acl, error=True)
    assert "at least 7 characters" in acl.last_error
    assert acl.reloads == 2 and allowed(acl, "alpha001", "alpha-secret")  # the old rules stay

    path.unlink()  # gone: still the old rules
    await wait_reload(acl, error=True)
    assert allowed(acl, "alpha001", "alpha-secret")
    path.write_text(V2)  # back, fixed: the error clears
    await wait_reload(acl, 3)
    assert acl.last_error is None and allowed(acl, "beta0001", "beta-secret")


async def test_name_server_accounts_from_config_alone():
    acl = AclService.load(None, NAMESRV_POLICY,
                          extra=(Account(access_key="brokers", secret_key="broker-secret", admin=True),))
    reg = RemotingCommand.create_request(RequestCode.REGISTER_BROKER, {"brokerName": "b"})
    assert acl.check(FakeConn(), reg).remark.endswith("No accessKey is configured")
    assert acl.check(FakeConn(), Credentials("brokers", "broker-secret").sign(reg)) is None
    assert acl.check(FakeConn(), RemotingCommand.create_request(RequestCode.GET_ROUTEINFO_BY_TOPIC)) is None


async def test_a_connection_is_sent_a_check_back_only_if_an_account_it_signed_as_may_see_the_half(tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text("""\
globalWhiteRemoteAddresses: ["10.9.*.*"]
accounts:
  - accessKey: owner001
    secretKey: owner-secret
    topicPerms: [Orders=PUB]
  - accessKey: other001
    secretKey: other-secret
    defaultTopicPerm: SUB
    groupPerms: [TxGroup=DENY]
""")
    acl = AclService.load(str(path), BROKER_POLICY)

    class Conn:
        def __init__(self, address="10.1.2.3:40000"):
            self.remote_address, self.attributes = address, {}

    owner, other, silent, white = Conn(), Conn(), Conn(), Conn("10.9.0.1:1")
    beat = RemotingCommand.create_request(RequestCode.HEART_BEAT, body=b'{"clientID":"c"}')
    assert acl.check(owner, Credentials("owner001", "owner-secret").sign(beat)) is None
    assert acl.check(other, Credentials("other001", "other-secret").sign(beat)) is None
    assert acl.check(silent, Credentials("owner001", "wrong-secret").sign(beat)) is not None  # not recorded
    assert owner.attributes["ledgermq.acl.principals"] == {"owner001"}
    assert acl.may_check_back(owner, "TxGroup", "Orders")
    assert not acl.may_check_back(owner, "TxGroup", "Audit")
    assert not acl.may_check_back(other, "TxGroup", "Orders")  # SUB is not PUB, and it DENYs the group
    assert not acl.may_check_back(silent, "TxGroup", "Orders")
    assert acl.may_check_back(white, "TxGroup", "Orders")  # a globally whitelisted address holds everything
