# The console's daily pages, their pure parts: client version names, the
# masking of a broker config's secrets, the typed and bounded group config
# a request may set, the resend's property filter, and the sampler's row
# for a member the name server no longer lists (the address it last had,
# or its DLedger address when the console never saw it registered).
import attrs
import pytest

from broker.remoting.codes import V4_9_4, V5_3_3
from tools.dashboard.ops import BadInput, check_name, group_config_from, mask_config, version_desc
from tools.dashboard.sampler import Hub, Sampler
from tools.mqadmin.adminapi import BrokerAddr, UnreachableError


def test_version_names():
    assert version_desc(V4_9_4) == "V4_9_4" and version_desc(V5_3_3) == "V5_3_3"
    assert version_desc(V4_9_4 + 1) == "V4_9_5_SNAPSHOT" and version_desc(V4_9_4 + 2) == "V4_9_5"
    assert version_desc(V4_9_4 - 1) == "V4_9_4_SNAPSHOT"
    assert version_desc(17) == "#17" and version_desc("x") == "x" and version_desc(None) == "None"


def test_broker_config_secrets_are_masked():
    shown = mask_config({"brokerAccessKey": "ak-visible", "brokerSecretKey": "sk", "dLegerPeerSecret": "",
                         "somePassword": "p", "brokerName": "broker-a", "tlsServerKeyPath": "/etc/k.pem",
                         "authToken": "t", "listenPort": "10911"})
    assert shown == {"brokerAccessKey": "******", "brokerSecretKey": "******", "dLegerPeerSecret": "",
                     "somePassword": "******", "brokerName": "broker-a", "tlsServerKeyPath": "/etc/k.pem",
                     "authToken": "******", "listenPort": "10911"}


def test_group_config_is_typed_and_bounded():
    cfg = group_config_from({"group": "G1", "retryMaxTimes": "7", "consumeBroadcastEnable": "true"})
    assert cfg["groupName"] == "G1" and cfg["retryMaxTimes"] == 7 and cfg["consumeBroadcastEnable"] is True
    assert cfg["consumeEnable"] is True and cfg["retryQueueNums"] == 1
    for bad in ({"group": "G1", "retryMaxTimes": "lots"}, {"group": "G1", "retryQueueNums": 100000},
                {"group": "G1", "consumeEnable": "yes"}, {"group": "G1", "brokerId": True},
                {"group": "a b"}, {"group": "x" * 300}, {}):
        with pytest.raises(BadInput):
            group_config_from(bad)
    assert check_name("topic", "%DLQ%G-1_x") == "%DLQ%G-1_x"
    with pytest.raises(BadInput):
        check_name("topic", "../etc")


@attrs.define
class FakeAdmin:
    """Three members n0-n2 of broker-a; `registered` are the ones the name server lists."""

    registered: list
    timeout: float = 1.0

    async def brokers(self):
        return [BrokerAddr("C", "broker-a", i, f"127.0.0.1:{10911 + i}") for i in self.registered]

    async def runtime_info(self, addr):
        i = int(addr.rsplit(":", 1)[1]) - 10911
        return {"dledgerSelfId": f"n{i}", "dledgerRole": "leader" if i == 0 else "follower", "dledgerTerm": "2"}

    async def dledger_status(self, addr):
        i = int(addr.rsplit(":", 1)[1]) - 10911
        if i != 0:
            return {"selfId": f"n{i}", "role": "follower"}
        return {"selfId": "n0", "role": "leader", "peers": {"n1": {}, "n2": {}}}

    async def broker_config(self, addr):
        if addr.endswith(":10912"):
            raise UnreachableError("down")
        return {"dLegerPeers": "n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913"}


async def test_a_member_gone_from_the_name_server_keeps_its_address():
    admin = FakeAdmin([0, 1, 2])
    sampler = Sampler(admin, Hub())
    (group,) = (await sampler.sample_cluster(1000))["groups"]
    assert group["missing"] == []
    admin.registered = [0]                       # n1 and n2 expired at the name server
    (group,) = (await sampler.sample_cluster(2000))["groups"]
    assert group["missing"] == [{"selfId": "n1", "addr": "127.0.0.1:10912", "raftAddr": "127.0.0.1:40912"},
                                {"selfId": "n2", "addr": "127.0.0.1:10913", "raftAddr": "127.0.0.1:40913"}]
    fresh = Sampler(admin, Hub())                # a console started after they died: the DLedger address
    (group,) = (await fresh.sample_cluster(3000))["groups"]
    assert [(m["addr"], m["raftAddr"]) for m in group["missing"]] == [(None, "127.0.0.1:40912"),
                                                                      (None, "127.0.0.1:40913")]
