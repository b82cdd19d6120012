# The client library's pure parts: average allocation (Java's
# AllocateMessageQueueAveragely), ProcessQueue's commit offset and flow
# control, message validation, record decoding into MessageExt, response
# code translation, route-derived queue lists; and a producer whose name
# server is unreachable failing with a typed error within its timeout.
import zlib

import pytest
import trio
import trio.testing

from broker.client import (
    BrokerUnavailableError,
    ClientError,
    ConnectionFailedError,
    InvalidArgumentError,
    InvalidMessageError,
    Message,
    MessageIllegalError,
    MessageQueue,
    NoRouteError,
    SendFailedError,
    TopicNotExistError,
    allocate_averagely,
    open_producer,
    open_push_consumer,
)
from broker.client.errors import NotSupportedError, check_response, from_remoting
from broker.client.instance import TopicRoute
from broker.client.model import decode_records, filter_by_tags, subscription
from broker.client.rebalance import ProcessQueue
from broker.namesrv.routes import BrokerData, QueueData, TopicRouteData
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RemotingConnectError, RemotingTimeoutError
from consumequeue import record as M
from tools.localcluster import free_ports


def qs(n, topic="T", broker="b"):
    return [MessageQueue(topic, broker, i) for i in range(n)]


def test_allocate_averagely_matches_java():
    cids = ["c0", "c1", "c2"]
    # 8 queues over 3 clients: 3, 3, 2, contiguous, in sorted order
    assert [[q.queue_id for q in allocate_averagely(c, qs(8), cids)] for c in cids] == \
        [[0, 1, 2], [3, 4, 5], [6, 7]]
    # more clients than queues: one each, the rest idle
    five = [f"c{i}" for i in range(5)]
    assert [[q.queue_id for q in allocate_averagely(c, qs(3), five)] for c in five] == [[0], [1], [2], [], []]
    # unsorted inputs give the same answer; an unknown client gets nothing
    assert allocate_averagely("c1", list(reversed(qs(8))), ["c2", "c0", "c1"]) == qs(8)[3:6]
    assert allocate_averagely("zz", qs(8), cids) == []
    assert allocate_averagely("c0", [], cids) == []
    for n in range(0, 13):
        for k in range(1, 6):
            ids = [f"id{i}" for i in range(k)]
            parts = [allocate_averagely(c, qs(n), ids) for c in ids]
            flat = [q for p in parts for q in p]
            assert sorted(flat) == qs(n) and len(flat) == len(set(flat))  # a partition
            assert max(map(len, parts)) - min(map(len, parts)) <= 1


class _Ext:
    def __init__(self, offset):
        self.queue_offset = offset


async def test_process_queue_commit_offset_and_flow_control():
    pq = ProcessQueue(MessageQueue("T", "b", 0), next_offset=10)
    assert pq.commit_offset == 10
    msgs = [_Ext(o) for o in range(10, 15)]
    pq.add(msgs)
    pq.next_offset = 15
    pq.remove([msgs[1], msgs[2]])  # done out of order: the oldest unfinished one bounds the commit
    assert pq.commit_offset == 10
    pq.remove([msgs[0]])
    assert pq.commit_offset == 13
    pq.remove(msgs[3:])
    assert pq.commit_offset == 15 and pq.in_flight == 0
    more = [_Ext(o) for o in range(15, 19)]
    pq.add(more)
    woke = []

    async def puller():
        await pq.wait_below(3)
        woke.append(pq.in_flight)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(puller)
        await trio.testing.wait_all_tasks_blocked()
        assert woke == []  # 4 in flight: parked
        pq.remove(more[:1])
        await trio.testing.wait_all_tasks_blocked()
        assert woke == []  # still 3
        pq.remove(more[1:2])
    assert woke == [2]


def test_message_validation():
    Message("T", b"x").check()
    with pytest.raises(InvalidMessageError, match="characters"):
        Message("bad topic", b"x").check()
    with pytest.raises(InvalidMessageError, match="empty"):
        Message("T", b"").check()
    with pytest.raises(InvalidMessageError, match="over the 8 limit"):
        Message("T", b"123456789").check(max_size=8)
    with pytest.raises(InvalidMessageError, match="reserved"):
        Message("T", b"x", properties={"TAGS": "a"}).check()
    with pytest.raises(InvalidMessageError, match="delay_level"):
        Message("T", b"x", delay_level=-1).check()
    assert Message("T", b"x", delay_level=3).wire_properties(None) == {"DELAY": "3"}
    m = Message("T", b"x", tags="A", keys="k1 k2", properties={"p": 1})
    assert m.keys == ("k1", "k2")
    assert m.wire_properties("U1") == {"p": "1", "TAGS": "A", "KEYS": "k1 k2", "UNIQ_KEY": "U1"}


def test_decode_records_and_tag_filter():
    mq = MessageQueue("%RETRY%g", "b", 0)
    plain = M.MessageRecord(topic="%RETRY%g", body=b"hello", queue_offset=7, physical_offset=1234,
                            properties={"TAGS": "A", "UNIQ_KEY": "ABC", "RETRY_TOPIC": "Orig", "KEYS": "k1 k2"})
    packed = M.MessageRecord(topic="%RETRY%g", body=zlib.compress(b"big" * 100), sysflag=M.COMPRESSED_FLAG,
                             queue_offset=8, properties={"TAGS": "B"})
    msgs = decode_records(M.encode(plain) + M.encode(packed), mq)
    assert [m.body for m in msgs] == [b"hello", b"big" * 100]
    a, b = msgs
    assert (a.topic, a.tags, a.keys, a.msg_id, a.queue_offset, a.commitlog_offset) == \
        ("Orig", "A", ["k1", "k2"], "ABC", 7, 1234)
    assert b.msg_id == b.offset_msg_id and len(b.offset_msg_id) == 32 and b.topic == "%RETRY%g"
    assert filter_by_tags(msgs, subscription("A || C")) == [a]
    assert filter_by_tags(msgs, subscription("*")) == msgs
    with pytest.raises(InvalidMessageError, match="undecodable"):
        decode_records(M.encode(plain)[:-3], mq)


def test_response_codes_become_typed_errors():
    req = RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2)
    ok = req.make_response(ResponseCode.SUCCESS)
    assert check_response(ok, "a:1") is ok
    for code, cls, retriable in [(ResponseCode.SERVICE_NOT_AVAILABLE, BrokerUnavailableError, True),
                                 (ResponseCode.TOPIC_NOT_EXIST, TopicNotExistError, True),
                                 (ResponseCode.MESSAGE_ILLEGAL, MessageIllegalError, False),
                                 (ResponseCode.REQUEST_CODE_NOT_SUPPORTED, NotSupportedError, False)]:
        with pytest.raises(cls) as info:
            check_response(req.make_response(code, "why"), "a:1", RequestCode.SEND_MESSAGE_V2)
        assert info.value.retriable is retriable and isinstance(info.value, ClientError)
        assert "why" in str(info.value) and "a:1" in str(info.value)
    assert isinstance(from_remoting(RemotingConnectError("a:1", "refused")), ConnectionFailedError)
    timeout = from_remoting(RemotingTimeoutError("a:1", 10, 3.0))
    assert isinstance(timeout, ConnectionFailedError) and timeout.retriable


def test_route_queue_lists():
    data = TopicRouteData(
        (QueueData(broker_name="b2", read_queue_nums=2, write_queue_nums=2, perm=6),
         QueueData(broker_name="b1", read_queue_nums=3, write_queue_nums=3, perm=6),
         QueueData(broker_name="b3", read_queue_nums=2, write_queue_nums=2, perm=4)),
        (BrokerData(cluster="c", broker_name="b1", broker_addrs={0: "m1:1", 1: "s1:1"}),
         BrokerData(cluster="c", broker_name="b2", broker_addrs={2: "s2:1"}),
         BrokerData(cluster="c", broker_name="b3", broker_addrs={0: "m3:1"})))
    route = TopicRoute.build("T", data, 1)
    # writable: b1 only (b2 has no master now, b3 is read-only); readable: all, sorted
    assert route.write_queues == tuple(qs(3, broker="b1"))
    assert route.read_queues == tuple(sorted(qs(3, broker="b1") + qs(2, broker="b2") + qs(2, broker="b3")))
    assert (route.addr("b1"), route.addr("b1", 1), route.addr("b2"), route.addr("b2", 0)) == \
        ("m1:1", "s1:1", "s2:1", "s2:1")
    assert route.all_addrs(masters_only=True) == {"m1:1", "m3:1"}


async def test_unreachable_name_server_fails_with_typed_error():
    port = free_ports(1)[0]
    async with open_producer("p", namesrv_addr=f"127.0.0.1:{port}", timeout=0.5) as producer:
        with trio.fail_after(5):
            with pytest.raises(SendFailedError) as info:
                await producer.send(Message("T", b"x"), timeout=0.5)
    assert isinstance(info.value.last, NoRouteError)
    assert "T" in str(info.value)
    for bad_addr in ("", "nohost", "127.0.0.1:99999"):
        with pytest.raises(InvalidArgumentError, match="namesrv_addr"):
            async with open_producer("p", namesrv_addr=bad_addr):
                pass

    async def handler(msgs):
        raise AssertionError("nothing to consume")
    for bad, match in [(dict(handler=None), "handler"), (dict(handler=handler, consume_from="nonsense"), "nonsense"),
                       (dict(handler=handler, consume_concurrency=0), "consume_concurrency")]:
        with pytest.raises(InvalidArgumentError, match=match):
            async with open_push_consumer("g", namesrv_addr=f"127.0.0.1:{port}", subscriptions={"T": "*"}, **bad):
                pass


async def test_producer_says_why_it_has_no_route():
    # A name server that is not there: the error says "Connection refused"
    # and names the address, once, not "no route" three times (issue 17).
    import socket

    from broker.client import Message, SendFailedError, open_producer
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with open_producer("p_dead_ns", namesrv_addr=f"127.0.0.1:{port}", timeout=0.5) as producer:
        with pytest.raises(SendFailedError) as info:
            await producer.send(Message("Nowhere", b"x"), timeout=0.5)
    text = str(info.value)
    assert f"connect to 127.0.0.1:{port} failed" in text and "Connection refused" in text, text
    assert text.count("Connection refused") == 1 and "(x3)" in text, text
    assert info.value.errors[-1].reason.startswith("no route at the name servers; the name servers could not be asked")


def test_every_client_exception_is_exported():
    import inspect

    import broker.client as client
    from broker.client import errors
    defined = {name for name, obj in vars(errors).items()
               if inspect.isclass(obj) and issubclass(obj, Exception) and obj.__module__ == errors.__name__}
    assert defined <= set(client.__all__), defined - set(client.__all__)
    assert all(getattr(client, name) is getattr(errors, name) for name in defined)
