# The producer's latency fault tolerance (broker/client/latency.py) without
# I/O: failures and slow answers avoid a group for a while, a new master or
# the time running out ends it, every group avoided still leaves one to use.
from broker.client.latency import LatencyFaultTolerance
from broker.client.model import MessageQueue

QUEUES = [MessageQueue("T", b, q) for b in ("a", "b") for q in range(2)]
MASTERS = {"a": "10.0.0.1:10911", "b": "10.0.0.2:10911"}


def names(queues):
    return sorted({q.broker_name for q in queues})


def test_a_failed_group_is_avoided_until_its_isolation_ends():
    f = LatencyFaultTolerance(isolation=2.0)
    f.record("a", 0.0, True, now=10.0, master=MASTERS["a"])
    assert names(f.choose(QUEUES, 10.5, MASTERS.get)) == ["b"]
    assert names(f.choose(QUEUES, 12.0, MASTERS.get)) == ["a", "b"]


def test_a_new_master_ends_the_avoidance_at_once():
    f = LatencyFaultTolerance()
    f.record("a", 0.0, True, now=0.0, master=MASTERS["a"])
    moved = {**MASTERS, "a": "10.0.0.3:10911"}                  # the failover finished
    assert names(f.choose(QUEUES, 0.1, moved.get)) == ["a", "b"]


def test_slow_answers_avoid_a_group_by_their_latency():
    f = LatencyFaultTolerance()
    f.record("b", 0.02, False, now=0.0, master=MASTERS["b"])
    assert names(f.choose(QUEUES, 0.0, MASTERS.get)) == ["a", "b"]
    f.record("b", 1.2, False, now=0.0, master=MASTERS["b"])      # >= 1 s: 2 s away
    assert names(f.choose(QUEUES, 1.9, MASTERS.get)) == ["a"]
    assert names(f.choose(QUEUES, 2.0, MASTERS.get)) == ["a", "b"]
    f.record("b", 0.01, False, now=3.0, master=MASTERS["b"])     # a fast answer clears it
    assert "b" not in f.items


def test_with_every_group_avoided_the_soonest_one_is_used():
    f = LatencyFaultTolerance(isolation=2.0)
    f.record("a", 0.0, True, now=1.0, master=MASTERS["a"])
    f.record("b", 0.0, True, now=0.0, master=MASTERS["b"])
    assert names(f.choose(QUEUES, 1.5, MASTERS.get)) == ["b"]


def test_disabled_it_changes_nothing():
    f = LatencyFaultTolerance(enabled=False)
    f.record("a", 0.0, True, now=0.0, master=MASTERS["a"])
    assert f.choose(QUEUES, 0.0, MASTERS.get) == QUEUES
