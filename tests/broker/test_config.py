# BrokerConfig from broker.conf text: RocketMQ defaults, the embedded
# ReplicationConfig, unknown keys as warnings, clear errors, and the
# DLedger-mode brokerId rule (spec §6.1).
import pytest

from broker.config import BrokerConfig, broker_id_for, follower_broker_ids, load_broker_config
from commitlog.config import ConfigError, FlushDiskType
from commitlog.raft.state import Role

BASE = """\
brokerClusterName = RaftCluster
brokerName=RaftNode00
listenPort=30911
namesrvAddr=127.0.0.1:9876;10.0.0.2:9876
storePathRootDir=/tmp/rmqstore/node00
enableDLegerCommitLog=true
dLegerGroup=RaftNode00
dLegerPeers=n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913
dLegerSelfId=n0
sendMessageThreadPoolNums=16
brokerIP1=10.1.2.3
"""


def test_sample_dledger_conf(tmp_path):
    path = tmp_path / "broker-n0.conf"
    path.write_text(BASE + "flushDiskType=SYNC_FLUSH\nfileReservedTime=48\ndeleteWhen=03\n")
    cfg, warnings = load_broker_config(path)
    assert warnings == []
    assert (cfg.broker_cluster_name, cfg.broker_name, cfg.listen_port) == ("RaftCluster", "RaftNode00", 30911)
    assert cfg.namesrv_addr == ("127.0.0.1:9876", "10.0.0.2:9876")
    assert cfg.broker_addr == "10.1.2.3:30911"
    assert cfg.store_host.packed == bytes([10, 1, 2, 3]) + (30911).to_bytes(4, "big")
    assert cfg.self_id == "n0" and cfg.replication.peer_ids == ("n0", "n1", "n2")
    assert cfg.store_path_root_dir == "/tmp/rmqstore/node00"
    assert cfg.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert (cfg.file_reserved_time_hours, cfg.delete_when) == (48, (3,))
    # RocketMQ's defaults for what the file leaves out
    assert cfg.auto_create_topic_enable is True
    assert cfg.default_topic_queue_nums == 8
    assert cfg.max_message_size == 4 * 1024 * 1024
    assert cfg.register_name_server_period_ms == 30000


def test_mixed_value_types_from_dict():
    cfg, _ = BrokerConfig.from_dict({"dLegerGroup": "g", "dLegerPeers": "n0-127.0.0.1:1", "dLegerSelfId": "n0",
                                     "listenPort": 10912, "autoCreateTopicEnable": False,
                                     "defaultTopicQueueNums": "4", "brokerIP1": "127.0.0.1"})
    assert (cfg.listen_port, cfg.auto_create_topic_enable, cfg.default_topic_queue_nums) == (10912, False, 4)


def test_unknown_keys_warn_and_typos_get_a_hint():
    cfg, warnings = BrokerConfig.from_properties(BASE + "maxMesageSize=1024\nfrobnicate=1\nlistenPort=30912\n")
    assert cfg.listen_port == 30912 and cfg.max_message_size == 4 * 1024 * 1024
    text = "\n".join(warnings)
    assert "frobnicate" in text
    assert "listenPort set again" in text
    assert "maxMesageSize" in text


@pytest.mark.parametrize("line, key", [
    ("listenPort=http", "listenPort"),
    ("listenPort=70000", "listenPort"),
    ("autoCreateTopicEnable=yes", "autoCreateTopicEnable"),
    ("brokerIP1=broker.example.com", "brokerIP1"),
    ("namesrvAddr=localhost", "namesrvAddr"),
    ("dLegerSelfId=n9", "dLegerSelfId"),
])
def test_bad_values_name_the_key(line, key):
    with pytest.raises(ConfigError) as info:
        BrokerConfig.from_properties(BASE + line + "\n")
    assert info.value.key == key
    assert key in str(info.value)


def test_missing_dledger_keys_is_an_error():
    with pytest.raises(ConfigError, match="dLegerGroup"):
        BrokerConfig.from_properties("brokerName=b\nlistenPort=10911\n")


def test_configured_broker_id_is_ignored_with_a_warning():
    cfg, warnings = BrokerConfig.from_properties(BASE + "brokerId=3\n")
    assert any("brokerId=3 ignored" in w for w in warnings)
    assert cfg.broker_id_for(Role.FOLLOWER) == 1


def test_broker_id_rule():
    assert broker_id_for(Role.LEADER, "n1") == 0
    assert broker_id_for(Role.FOLLOWER, "n0") == 1
    assert broker_id_for(Role.CANDIDATE, "n1") == 2
    assert broker_id_for(Role.FOLLOWER, "n-1") == 1  # would be 0: RocketMQ uses 1
    with pytest.raises(ConfigError):
        broker_id_for(Role.FOLLOWER, "leader")
    # Ids that would collide or be unparseable fall back to positions, for all.
    assert follower_broker_ids(("n0", "n1", "n2")) == {"n0": 1, "n1": 2, "n2": 3}
    assert follower_broker_ids(("a1", "b1", "c2")) == {"a1": 1, "b1": 2, "c2": 3}
    assert follower_broker_ids(("n-1", "n0")) == {"n-1": 1, "n0": 2}
    cfg, warnings = BrokerConfig.from_properties(
        BASE.replace("n0-", "a1-").replace("n1-", "b1-").replace("dLegerSelfId=n0", "dLegerSelfId=b1"))
    assert any("position in dLegerPeers" in w for w in warnings)
    assert cfg.broker_id_for(Role.FOLLOWER) == 2 and cfg.broker_id_for(Role.LEADER) == 0
