# Helpers shared by the client library's cluster tests.
import trio

from broker.client.consumer_api import ConsumerApi


async def wait_committed(group_offsets: ConsumerApi, observer, queues, timeout: float = 10.0) -> None:
    """Until the group's committed offset of every queue is its max offset.
    A commit is acknowledged when the broker has staged it; a query can
    miss it while the broker is appending it to the log (a broker-side
    read-your-writes gap), so the check waits rather than reads once."""
    want = {mq: await observer.max_offset(mq) for mq in queues}
    with trio.fail_after(timeout):
        while {mq: await group_offsets.query_offset(mq) for mq in queues} != want:
            await trio.sleep(0.1)
