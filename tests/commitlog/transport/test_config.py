# Tests of commitlog/config.py: the Java-properties reader, the sample
# RocketMQ-on-DLedger broker.conf, strict peers parsing, warnings for
# unknown keys, the validation of timing and store settings, and the peer
# secret a group beyond loopback must have.
import socket

import pytest

from commitlog.config import (
    ConfigError,
    FlushDiskType,
    Peer,
    ReplicationConfig,
    format_peers,
    iter_properties,
    load_properties,
    load_replication_config,
    parse_peers,
    parse_properties,
)

# distribution/conf/dledger/broker-n0.conf from apache/rocketmq, as shipped.
SAMPLE_N0 = """\
# Licensed to the Apache Software Foundation (ASF) under one or more
# contributor license agreements.  See the NOTICE file distributed with
# this work for additional information regarding copyright ownership.
#
#  See the License for the specific language governing permissions and
#  limitations under the License.

brokerClusterName = RaftCluster
brokerName=RaftNode00
listenPort=30911
namesrvAddr=127.0.0.1:9876
storePathRootDir=/tmp/rmqstore/node00
storePathCommitLog=/tmp/rmqstore/node00/commitlog
enableDLegerCommitLog=true
dLegerGroup=RaftNode00
dLegerPeers=n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913
## must be unique
dLegerSelfId=n0
sendMessageThreadPoolNums=16
"""

BASE = {"dLegerGroup": "g", "dLegerPeers": "n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913",
        "dLegerSelfId": "n1"}


def test_sample_dledger_broker_conf(tmp_path):
    cfg, warnings = ReplicationConfig.from_properties(SAMPLE_N0)
    assert warnings == []  # broker keys are not replication's business
    assert cfg.group == "RaftNode00"
    assert cfg.self_id == "n0"
    assert cfg.peers == (Peer("n0", "127.0.0.1", 40911), Peer("n1", "127.0.0.1", 40912),
                         Peer("n2", "127.0.0.1", 40913))
    assert cfg.peer_addrs == {"n0": ("127.0.0.1", 40911), "n1": ("127.0.0.1", 40912),
                              "n2": ("127.0.0.1", 40913)}
    assert cfg.other_peer_ids == ("n1", "n2")
    assert cfg.self_peer.port == 40911
    assert cfg.store_path_root_dir == "/tmp/rmqstore/node00"
    assert cfg.data_dir == "/tmp/rmqstore/node00/dledger-n0/data"
    assert cfg.index_dir == "/tmp/rmqstore/node00/dledger-n0/index"
    assert format_peers(cfg.peers) == "n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913"
    # Defaults (spec §5.7 / §6.2 where DLedger's apply).
    assert cfg.flush_disk_type is FlushDiskType.ASYNC_FLUSH
    assert cfg.max_pending_requests == 10000
    assert cfg.max_wait_ack_time_ms == 2500
    assert cfg.mapped_file_size_commitlog == 1 << 30
    assert cfg.mapped_file_size_entry_index == 167_772_160
    assert cfg.file_reserved_hours == 73
    assert cfg.disk_space_ratio == 0.75
    assert cfg.delete_when == (4,)
    assert cfg.admin_port is None
    # Failover well under 1 s: worst-case election timeout plus a heartbeat.
    assert cfg.heartbeat_interval_ms < cfg.election_timeout_min_ms < cfg.election_timeout_max_ms
    assert cfg.election_timeout_max_ms + cfg.heartbeat_interval_ms < 1000
    path = tmp_path / "broker-n0.conf"
    path.write_text(SAMPLE_N0)
    assert load_replication_config(path) == (cfg, [])
    assert load_properties(path)["sendMessageThreadPoolNums"] == "16"


def test_all_keys_parsed(tmp_path):
    text = "\n".join([
        "dLegerGroup = grp", "dLegerPeers = a1-h1:1;a2-h2:2", "dLegerSelfId = a2",
        "storePathRootDir=/data", "storePathDLedgerCommitLog=/fast/dl",
        "flushDiskType=SYNC_FLUSH", "flushIntervalCommitLog=20", "syncFlushTimeout=900",
        "preferredLeaderId=a1", "enableBatchPush=TRUE", "heartBeatTimeIntervalMs=50",
        "minVoteIntervalMs=150", "maxVoteIntervalMs=300", "maxPendingRequestsNum=7",
        "maxWaitAckTimeMs=900", "maxPushTimeOutMs=200", "mappedFileSizeCommitLog=4096",
        "mappedFileSizeForEntryIndex=3200", "fileReservedTime=48", "deleteWhen=03;01",
        "diskMaxUsedSpaceRatio=88", "adminPort=0", "peerSendQueueSize=9",
        "peerMaxFrameSize=2048", "dLegerPeerInsecure=true", "peerMaxHandshakes=5", "peerMaxHandshakesPerAddress=2",
    ])
    cfg, warnings = ReplicationConfig.from_properties(text)
    assert warnings == []
    assert (cfg.group, cfg.self_id, cfg.peer_ids) == ("grp", "a2", ("a1", "a2"))
    assert cfg.data_dir == "/fast/dl" and cfg.index_dir == "/data/dledger-a2/index"
    assert cfg.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert (cfg.flush_interval_ms, cfg.sync_flush_timeout_ms) == (20, 900)
    assert cfg.preferred_leader_id == "a1" and cfg.enable_batch_push is True
    assert (cfg.heartbeat_interval_ms, cfg.election_timeout_min_ms,
            cfg.election_timeout_max_ms) == (50, 150, 300)
    assert (cfg.max_pending_requests, cfg.max_wait_ack_time_ms, cfg.max_push_timeout_ms) == (7, 900, 200)
    assert (cfg.mapped_file_size_commitlog, cfg.mapped_file_size_entry_index) == (4096, 3200)
    assert cfg.file_reserved_hours == 49 and cfg.delete_when == (1, 3)
    assert cfg.disk_space_ratio == 0.88 and cfg.admin_port == 0
    assert cfg.peer_insecure is True
    tc = cfg.transport_config()
    assert (tc.send_queue_messages, tc.max_frame_size) == (9, 2048)
    assert (tc.max_handshakes, tc.max_handshakes_per_address, tc.recv_budget_bytes) == (5, 2, 2048)


def test_from_dict_accepts_native_types():
    cfg, warnings = ReplicationConfig.from_dict({**BASE, "heartBeatTimeIntervalMs": 20,
                                                 "enableBatchPush": True, "adminPort": 8080})
    assert (cfg.heartbeat_interval_ms, cfg.enable_batch_push, cfg.admin_port) == (20, True, 8080)
    with pytest.raises(ConfigError, match="heartBeatTimeIntervalMs=True: expected an integer"):
        ReplicationConfig.from_dict({**BASE, "heartBeatTimeIntervalMs": True})


def test_properties_syntax():
    text = ("  # comment\n! also a comment\n\n"
            "a=1\n"
            "b : 2\n"
            "c 3\n"
            "d=one \\\n    two\\\n three\n"  # continuation drops leading blanks only
            "e=tab\\tnew\\nline \\u0041\\=x\n"
            "f\\ g=h\n"
            "i=trailing   \n"
            "# comment ending in backslash \\\n"
            "j=k\r\n"
            "l=m\r"
            "n=\n"
            "o=back\\\\\n"
            "p=q")
    props = parse_properties(text)
    assert props == {"a": "1", "b": "2", "c": "3", "d": "one twothree",
                     "e": "tab\tnew\nline A=x", "f g": "h", "i": "trailing   ", "j": "k",
                     "l": "m", "n": "", "o": "back\\", "p": "q"}
    assert [lineno for lineno, _, _ in iter_properties("x=1\n\n# c\ny=\\\n 2\nz=3")] == [1, 4, 6]
    with pytest.raises(ConfigError, match="malformed"):
        parse_properties("a=\\u12")


def test_whitespace_around_values_is_stripped():
    cfg, _ = ReplicationConfig.from_properties(
        "dLegerGroup = g  \ndLegerPeers =  n0-127.0.0.1:1 ; n1-127.0.0.1:2 ;\ndLegerSelfId=n0 \t")
    assert cfg.group == "g" and cfg.self_id == "n0" and cfg.peer_ids == ("n0", "n1")


def test_latin1_file(tmp_path):
    path = tmp_path / "b.conf"
    path.write_bytes(b"dLegerGroup=gr\xfcn\n")
    assert load_properties(path) == {"dLegerGroup": "grün"}


@pytest.mark.parametrize("peers, message", [
    ("", "no peers"),
    (";", "no peers"),
    ("n0-127.0.0.1:40911;;n1-127.0.0.1:40912", "entry 2 is empty"),
    ("n0127.0.0.1:40911", "no '-' between id and address"),
    ("-127.0.0.1:40911", "bad id ''"),
    ("n 0-127.0.0.1:40911", "bad id 'n 0'"),
    ("n0-127.0.0.1", "no ':port'"),
    ("n0-:40911", "no host"),
    ("n0-127.0.0.1:", "port '' is not in 1..65535"),
    ("n0-127.0.0.1:0", "port '0'"),
    ("n0-127.0.0.1:65536", "port '65536'"),
    ("n0-127.0.0.1:4o911", "port '4o911'"),
    ("n0-::1:40911", "IPv6 addresses need brackets"),
    ("n0-[::1:40911", "expected \\[ipv6\\]:port"),
    ("n0-bad host:40911", "bad host 'bad host'"),
    ("n0-127.0.0.1:40911;n0-127.0.0.1:40912", "peer id 'n0' appears twice"),
    ("n0-127.0.0.1:40911;n1-127.0.0.1:40911", "address 127.0.0.1:40911 appears twice"),
])
def test_bad_peers_strings(peers, message):
    with pytest.raises(ConfigError, match=message) as info:
        ReplicationConfig.from_dict({**BASE, "dLegerPeers": peers})
    assert info.value.key == "dLegerPeers"
    assert str(info.value).startswith(f"dLegerPeers={peers!r}: ")


def test_good_peer_strings():
    assert parse_peers("n0-broker-a.svc.local:40911;n1-[::1]:40912;") == (
        Peer("n0", "broker-a.svc.local", 40911), Peer("n1", "::1", 40912))
    assert Peer("n1", "::1", 40912).address == "[::1]:40912"


@pytest.mark.parametrize("override, key, message", [
    ({"dLegerSelfId": "n7"}, "dLegerSelfId", "not one of the peers in dLegerPeers \\(n0, n1, n2\\)"),
    ({"dLegerGroup": "  "}, "dLegerGroup", "must not be empty"),
    ({"preferredLeaderId": "n9"}, "preferredLeaderId", "not one of the peers"),
    ({"flushDiskType": "SOMETIMES"}, "flushDiskType", "ASYNC_FLUSH or SYNC_FLUSH"),
    ({"enableBatchPush": "yes"}, "enableBatchPush", "true or false"),
    ({"maxWaitAckTimeMs": "2.5s"}, "maxWaitAckTimeMs", "expected an integer"),
    ({"maxWaitAckTimeMs": "0"}, "maxWaitAckTimeMs", "must be in 1.."),
    ({"adminPort": "70000"}, "adminPort", "must be in 0..65535"),
    ({"deleteWhen": "25"}, "deleteWhen", "hours of the day"),
    ({"heartBeatTimeIntervalMs": "400"}, "heartBeatTimeIntervalMs/minVoteIntervalMs/maxVoteIntervalMs",
     "need 0 < heartBeatTimeIntervalMs < minVoteIntervalMs < maxVoteIntervalMs"),
    ({"minVoteIntervalMs": "600"}, "heartBeatTimeIntervalMs/minVoteIntervalMs/maxVoteIntervalMs", "need"),
    ({"mappedFileSizeForEntryIndex": "100"}, "mappedFileSizeForEntryIndex", "multiple of 32"),
    ({"mappedFileSizeCommitLog": "10"}, "mappedFileSizeCommitLog", "at least 56"),
])
def test_bad_values_name_the_key(override, key, message):
    with pytest.raises(ConfigError, match=message) as info:
        ReplicationConfig.from_dict({**BASE, **override})
    assert info.value.key == key


@pytest.mark.parametrize("missing", ["dLegerGroup", "dLegerPeers", "dLegerSelfId"])
def test_required_keys(missing):
    props = dict(BASE)
    del props[missing]
    with pytest.raises(ConfigError, match=f"^{missing}: required but not set$"):
        ReplicationConfig.from_dict(props)


def test_unknown_keys_are_warnings_never_fatal():
    cfg, warnings = ReplicationConfig.from_properties(
        "dLegerGroup=g\ndLegerPeers=n0-127.0.0.1:1\ndLegerSelfId=n0\n"
        "dLedgerSelfId=n0\nmaxHeartBeatLeak=3\nbrokerName=b\nmapedFileSizeCommitLog=8192\n"
        "dLegerGroup=g2\nenableDLegerCommitLog=false\n")
    assert cfg.group == "g2" and cfg.mapped_file_size_commitlog == 8192
    assert warnings == [
        "line 8: dLegerGroup set again (line 1); the last value wins",
        "unknown key 'dLedgerSelfId' ignored (did you mean 'dLegerSelfId'?)",
        "unknown key 'maxHeartBeatLeak' ignored",
        "mapedFileSizeCommitLog is an old spelling of mappedFileSizeCommitLog",
        "enableDLegerCommitLog=false ignored: ledgermq always keeps its commitlog in DLedger format",
    ]


def test_disk_ratio_clamped_like_rocketmq():
    cfg, warnings = ReplicationConfig.from_dict({**BASE, "diskMaxUsedSpaceRatio": "99"})
    assert cfg.disk_max_used_space_ratio == 95
    assert warnings == ["diskMaxUsedSpaceRatio=99 clamped to 95 (allowed 10..95)"]
    cfg, _ = ReplicationConfig.from_dict({**BASE, "diskMaxUsedSpaceRatio": "5"})
    assert cfg.disk_max_used_space_ratio == 10


def test_self_id_without_digits_warns():
    cfg, warnings = ReplicationConfig.from_dict(
        {"dLegerGroup": "g", "dLegerPeers": "alpha-localhost:1;beta-localhost:2", "dLegerSelfId": "alpha"})
    assert cfg.self_id == "alpha"
    assert len(warnings) == 1 and "n<digits>" in warnings[0]


def test_direct_construction_validates():
    peers = parse_peers("n0-h:1;n1-h:2")
    assert ReplicationConfig("g", peers, "n0", peer_insecure=True).election_timeout_max_ms == 600
    with pytest.raises(ConfigError, match="dLegerSelfId='x'"):
        ReplicationConfig("g", peers, "x")
    with pytest.raises(ConfigError, match="^dLegerPeerSecret: not set"):
        ReplicationConfig("g", peers, "n0")


# --- the peer secret by default ---------------------------------------------------


def own_address() -> str:
    """This machine's own address beyond loopback (the one its default
    route leaves from; no packet is sent), or a private one if it has none."""
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.1", 9))
            host = s.getsockname()[0]
        except OSError:
            host = "127.0.0.1"
    return host if not host.startswith("127.") else "10.1.2.3"


@pytest.mark.parametrize("host", ["10.0.0.5", "192.168.1.20", "broker-a.svc.local", "0.0.0.0", own_address()])
def test_peers_beyond_loopback_need_a_secret_or_an_explicit_insecure(host, tmp_path):
    peers = f"n0-{host}:40911;n1-127.0.0.1:40912"
    with pytest.raises(ConfigError) as info:
        ReplicationConfig.from_dict({**BASE, "dLegerPeers": peers, "dLegerSelfId": "n1"})
    message = str(info.value)
    assert "\n" not in message and message.startswith("dLegerPeerSecret: not set")
    assert f"{host}:40911" in message and "dLegerPeerInsecure=true" in message
    assert "127.0.0.1:40912" not in message  # only the exposed peers are named
    cfg, _ = ReplicationConfig.from_dict({**BASE, "dLegerPeers": peers, "dLegerSelfId": "n1",
                                          "dLegerPeerInsecure": "true"})
    assert cfg.peer_auth() is None and cfg.peer_insecure
    cfg, _ = ReplicationConfig.from_dict({**BASE, "dLegerPeers": peers, "dLegerSelfId": "n1",
                                          "dLegerPeerSecret": "0123456789abcdef-secret"})
    assert cfg.peer_auth() is not None
    (tmp_path / "peer.secret").write_text("0123456789abcdef-from-a-file\n")
    cfg, _ = ReplicationConfig.from_dict({**BASE, "dLegerPeers": peers, "dLegerSelfId": "n1",
                                          "dLegerPeerSecretFile": str(tmp_path / "peer.secret")})
    assert cfg.peer_auth() is not None
    with pytest.raises(ConfigError, match="dLegerPeerInsecure='maybe': expected true or false"):
        ReplicationConfig.from_dict({**BASE, "dLegerPeers": peers, "dLegerSelfId": "n1",
                                     "dLegerPeerInsecure": "maybe"})


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.4.5", "localhost", "LOCALHOST", "[::1]"])
def test_loopback_groups_run_without_a_secret(host):
    cfg, warnings = ReplicationConfig.from_dict(
        {**BASE, "dLegerPeers": f"n0-{host}:40911;n1-{host}:40912", "dLegerSelfId": "n1"})
    assert cfg.peer_auth() is None and not cfg.peer_insecure and warnings == []
