# The Python producer and push consumer across a kill -9 of the DLedger
# leader (the master) in a real 3-broker group: sends keep succeeding after
# an immediate route refresh (seconds, not the 30 s route poll), and every
# acknowledged message is consumed afterwards.
# Slow: a real 3-broker group, a kill -9 of its master and the election after
#   it.
import time

import pytest
import trio

from broker.client import (
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    SendFailedError,
    open_producer,
    open_pull_consumer,
    open_push_consumer,
)
from broker.client.consumer_api import ConsumerApi
from tests.broker.client.helpers import wait_committed
from tools.brokercluster import open_broker_cluster

pytestmark = pytest.mark.slow


async def test_producer_and_consumer_fail_over_without_losing_acknowledged_messages(tmp_path):
    topic, group = "Failover", "fo_consumer"
    async with open_broker_cluster(tmp_path) as cluster:
        master = await cluster.wait_master()
        ns = cluster.namesrv_addr
        acked: dict[bytes, str] = {}  # body -> msg id
        ack_times: list[float] = []
        failures: list[SendFailedError] = []
        killed_at: list[float] = []
        after_kill = trio.Event()
        got: set[bytes] = set()
        progress = trio.Event()

        async def handler(msgs):
            got.update(m.body for m in msgs)
            progress.set()
            return ConsumeStatus.CONSUME_SUCCESS

        # A send's own deadline is generous (the machine is shared and an election can be slow);
        # the failover time itself is measured and bounded below.
        async with open_producer("fo_producer", namesrv_addr=ns, send_timeout=10) as producer, \
                open_pull_consumer("fo_observer", namesrv_addr=ns) as observer:
            await producer.send(Message(topic, b"create", tags="F"))
            queues = await observer.fetch_queues(topic)
            async with open_push_consumer(group, namesrv_addr=ns, subscriptions={topic: "*"}, handler=handler,
                                          consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                                          persist_interval=0.5) as consumer:
                async def sender(k: int):
                    i = 0
                    while not after_kill.is_set():
                        body = f"s{k}-{i}".encode()
                        i += 1
                        started = time.monotonic()
                        try:
                            r = await producer.send(Message(topic, body, tags="F"))
                        except SendFailedError as e:
                            failures.append(e)
                            continue
                        acked[body] = r.msg_id
                        ack_times.append((started, time.monotonic()))
                        if killed_at and sum(t0 > killed_at[0] for t0, _ in ack_times) >= 60:
                            after_kill.set()

                async with trio.open_nursery() as nursery:
                    for k in range(3):
                        nursery.start_soon(sender, k)
                    with trio.fail_after(10):
                        while len(acked) < 60:
                            await trio.sleep(0.05)
                    cluster.kill(master)
                    killed_at.append(time.monotonic())
                    await cluster.wait_dead(master)
                    with trio.fail_after(30):
                        await after_kill.wait()

                # failover: from the kill to the first acknowledgement of a send started after it
                failover = min(t1 for t0, t1 in ack_times if t0 > killed_at[0]) - killed_at[0]
                print(f"failover: first send after kill -9 acknowledged after {failover:.2f} s; {len(acked)} acked, "
                      f"{len(failures)} sends failed")
                assert failover < 8.0, failover
                assert not failures, [str(f) for f in failures]
                # the consumer carried on through the failover: everything acknowledged arrives
                with trio.fail_after(30):
                    while not set(acked) <= got:
                        progress = trio.Event()
                        await progress.wait()
                    # and whatever else was stored (a send whose answer was lost is retried, so a
                    # body may be stored twice): everything, before the consumer closes
                    stored = sum([await observer.max_offset(mq) for mq in queues])
                    while consumer.consumed < stored:
                        progress = trio.Event()
                        await progress.wait()
            new_master = await cluster.wait_master(exclude={master})
            assert new_master != master
            # its offsets were committed on the new master when it closed
            await wait_committed(ConsumerApi(observer.instance, group), observer, queues)
