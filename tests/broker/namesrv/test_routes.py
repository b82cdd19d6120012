# Tests of broker/namesrv/routes.py without I/O: registration, routes and
# cluster info in standard JSON, the DLedger id rules (leader change,
# stale registrations of a deposed leader, restarted followers), removal by
# address (unregister, expiry at the exact deadline, connection close), and
# topic deletion.
from broker.common.values import DataVersion, TopicConfig
from broker.namesrv.routes import BrokerData, BrokerRegistration, RouteInfoManager, TopicRouteData
from broker.remoting.header import encode_json

A, B, C = "10.0.0.1:10911", "10.0.0.2:10911", "10.0.0.3:10911"
TOPICS = {"T": TopicConfig("T", 4, 4, 6), "U": TopicConfig("U", 2, 2, 4, topic_sys_flag=1)}


def reg(addr, broker_id, term=0, topics=TOPICS, name="b", cluster="c", **kw):
    return BrokerRegistration(cluster, name, addr, broker_id, ha_server_addr=addr.replace("10911", "10912"),
                              topic_configs=topics, data_version=DataVersion(1, term, 1000), **kw)


def addrs(rm: RouteInfoManager, name="b"):
    return rm.broker_addr_table[name].broker_addrs


def test_master_registration_makes_topics_routable():
    rm = RouteInfoManager()
    assert rm.topic_route("T") is None
    assert rm.register_broker(reg(A, 0), now=0).accepted
    route = rm.topic_route("T")
    assert encode_json(route.to_json()) == (
        b'{"brokerDatas":[{"brokerAddrs":{"0":"10.0.0.1:10911"},"brokerName":"b","cluster":"c",'
        b'"enableActingMaster":false}],"filterServerTable":{},"queueDatas":[{"brokerName":"b","perm":6,'
        b'"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}')
    assert rm.topic_list() == ["T", "U"]
    assert rm.cluster_info() == {
        "brokerAddrTable": {"b": {"brokerAddrs": {"0": A}, "brokerName": "b", "cluster": "c",
                                  "enableActingMaster": False}},
        "clusterAddrTable": {"c": ["b"]}}
    assert TopicRouteData.from_json(route.to_json()) == route


def test_slaves_learn_the_master_and_do_not_publish_topics():
    rm = RouteInfoManager()
    result = rm.register_broker(reg(B, 1, topics={"OnlyOnSlave": TopicConfig("OnlyOnSlave")}), now=0)
    assert result.accepted and result.master_addr is None
    assert rm.topic_route("OnlyOnSlave") is None  # slaves never carry queue data
    rm.register_broker(reg(A, 0), now=0)
    result = rm.register_broker(reg(B, 1), now=1)
    assert (result.master_addr, result.ha_server_addr) == (A, "10.0.0.1:10912")
    assert rm.topic_route("T").broker_datas[0].broker_addrs == {0: A, 1: B}


def test_two_brokers_in_two_clusters():
    rm = RouteInfoManager()
    rm.register_broker(reg(A, 0, name="b1", cluster="c1"), now=0)
    rm.register_broker(reg(B, 0, name="b2", cluster="c2", topics={"T": TopicConfig("T", 8, 8, 6)}), now=0)
    route = rm.topic_route("T")
    assert [q.broker_name for q in route.queue_datas] == ["b1", "b2"]
    assert [q.read_queue_nums for q in route.queue_datas] == [4, 8]
    assert rm.cluster_info()["clusterAddrTable"] == {"c1": ["b1"], "c2": ["b2"]}
    assert rm.topic_route("U").broker_datas[0].broker_name == "b1"


def test_dledger_leader_change():
    rm = RouteInfoManager()
    rm.register_broker(reg(A, 0, term=1), now=0)
    rm.register_broker(reg(B, 1, term=1), now=0)
    rm.register_broker(reg(C, 2, term=1), now=0)
    # B wins the election of term 2 and registers as master: its id-1
    # entry goes, id 0 is B.
    assert rm.register_broker(reg(B, 0, term=2), now=1).accepted
    assert addrs(rm) == {0: B, 2: C}
    # A's periodic registration sent before it learnt of term 2 arrives late:
    # ignored, it must not take id 0 back.
    stale = rm.register_broker(reg(A, 0, term=1), now=2)
    assert not stale.accepted and "stateVersion 2 > 1" in stale.reason
    assert addrs(rm) == {0: B, 2: C}
    # A steps down and registers as a follower.
    result = rm.register_broker(reg(A, 1, term=2), now=3)
    assert result.accepted and result.master_addr == B
    assert addrs(rm) == {0: B, 1: A, 2: C}
    assert rm.topic_route("T").broker_datas[0].master_addr == B


def test_same_address_with_a_new_id_replaces_the_old_one():
    rm = RouteInfoManager()
    rm.register_broker(reg(A, 0), now=0)
    rm.register_broker(reg(C, 2), now=0)
    rm.register_broker(reg(C, 3), now=1)  # a restarted follower with another id
    assert addrs(rm) == {0: A, 3: C}
    # A follower claiming id 0 with the same stateVersion (stock brokers all
    # send 0) is taken as the new master, as upstream does.
    rm.register_broker(reg(C, 0), now=2)
    assert addrs(rm) == {0: C}


def test_unregister_is_by_address():
    rm = RouteInfoManager()
    rm.register_broker(reg(A, 0, term=1), now=0)
    rm.register_broker(reg(B, 0, term=2), now=1)  # B took over; A is still live
    assert addrs(rm) == {0: B}
    # Removing the deposed A must not remove B from id 0.
    assert rm.unregister_broker("c", A, "b")
    assert addrs(rm) == {0: B} and rm.topic_route("T") is not None
    assert not rm.unregister_broker("c", A, "b")  # nothing left to remove
    # The last address gone: the broker name, the cluster and its topics go.
    assert rm.unregister_broker("c", B, "b")
    assert rm.broker_addr_table == {} and rm.cluster_addr_table == {} and rm.topic_list() == []


def test_expiry_at_the_deadline_and_per_broker_timeouts():
    rm = RouteInfoManager(default_timeout=120)
    rm.register_broker(reg(A, 0), now=10)
    rm.register_broker(reg(B, 1, heartbeat_timeout=30.0), now=10)
    assert rm.next_deadline() == 40
    assert rm.expire(39.9) == []
    [gone] = rm.expire(40)
    assert gone.broker_addr == B and addrs(rm) == {0: A}
    rm.register_broker(reg(A, 0), now=100)  # re-registration moves the deadline
    assert rm.next_deadline() == 220 and rm.expire(219) == []
    assert [i.broker_addr for i in rm.expire(220)] == [A]
    assert rm.next_deadline() is None and rm.topic_list() == []


def test_connection_close_removes_what_registered_over_it():
    rm = RouteInfoManager()
    conn1, conn2 = object(), object()
    rm.register_broker(reg(A, 0), now=0, conn=conn1)
    rm.register_broker(reg(B, 1), now=0, conn=conn1)
    rm.register_broker(reg(C, 2), now=0, conn=conn2)
    rm.register_broker(reg(B, 1), now=1, conn=conn2)  # B re-registered over another connection
    assert [i.broker_addr for i in rm.connection_closed(conn1)] == [A]
    assert addrs(rm) == {1: B, 2: C}
    assert rm.connection_closed(conn1) == []


def test_delete_topic_whole_or_per_cluster():
    rm = RouteInfoManager()
    rm.register_broker(reg(A, 0, name="b1", cluster="c1"), now=0)
    rm.register_broker(reg(B, 0, name="b2", cluster="c2"), now=0)
    assert rm.delete_topic("T", "c1")
    assert [q.broker_name for q in rm.topic_route("T").queue_datas] == ["b2"]
    assert not rm.delete_topic("T", "nope")
    assert rm.delete_topic("U")
    assert rm.topic_list() == ["T"] and not rm.delete_topic("U")
    # Upstream default: a master's next registration brings it back.
    rm.register_broker(reg(A, 0, name="b1", cluster="c1"), now=1)
    assert rm.topic_list() == ["T", "U"]


def test_topic_changes_and_removal_with_registration():
    rm = RouteInfoManager(delete_topic_with_broker_registration=True)
    rm.register_broker(reg(A, 0), now=0)
    rm.register_broker(reg(A, 0, topics={"T": TopicConfig("T", 8, 8, 6)}), now=1)
    assert rm.topic_list() == ["T"]
    assert rm.topic_route("T").queue_datas[0].read_queue_nums == 8
    keep = RouteInfoManager()
    keep.register_broker(reg(A, 0), now=0)
    keep.register_broker(reg(A, 0, topics={}), now=1)
    assert keep.topic_list() == ["T", "U"]


def test_route_json_parsing_tolerates_4x_names():
    route = TopicRouteData.from_json({
        "brokerDatas": [{"brokerAddrs": {"0": A, "1": B}, "brokerName": "b", "cluster": "c"}],
        "queueDatas": [{"brokerName": "b", "perm": 6, "readQueueNums": 4, "writeQueueNums": 4,
                        "topicSynFlag": 3}]})
    assert route.queue_datas[0].topic_sys_flag == 3
    assert route.broker_datas[0] == BrokerData(cluster="c", broker_name="b", broker_addrs={0: A, 1: B})


def test_wipe_write_perm_drains_a_group_until_add_write_perm_even_across_failover():
    rm = RouteInfoManager()
    rm.register_broker(reg(A, 0, name="a"), now=0)
    rm.register_broker(reg(B, 0, name="b"), now=0)
    perms = lambda: {q.broker_name: q.perm for q in rm.topic_route("T").queue_datas}  # noqa: E731
    assert rm.set_write_perm("b", False) == 2                 # wipeTopicCount: T and U
    assert perms() == {"a": 6, "b": 4}
    assert {q.broker_name: q.perm for q in rm.topic_route("U").queue_datas} == {"a": 4, "b": 4}
    rm.register_broker(reg(C, 0, term=2, name="b"), now=1)    # the group's new master registers
    assert perms() == {"a": 6, "b": 4}                        # still drained
    assert rm.set_write_perm("b", True) == 2
    assert perms() == {"a": 6, "b": 6}
    rm.register_broker(reg(C, 0, term=2, name="b"), now=2)
    assert {q.broker_name: q.perm for q in rm.topic_route("U").queue_datas} == {"a": 4, "b": 4}  # its own perm
