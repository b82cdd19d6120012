# Helpers shared by the client library's cluster tests.
from broker.client.consumer_api import ConsumerApi
from tests.helpers.waiting import wait_until


async def wait_committed(group_offsets: ConsumerApi, observer, queues, timeout: float = 10.0) -> None:
    """Until the group's committed offset of every queue is its max offset.
    A commit is acknowledged when the broker has staged it; a query can
    miss it while the broker is appending it to the log (a broker-side
    read-your-writes gap), so the check waits rather than reads once."""
    want = {mq: await observer.max_offset(mq) for mq in queues}

    async def committed():
        return {mq: await group_offsets.query_offset(mq) for mq in queues} == want
    await wait_until(committed, timeout, f"the group committed every queue's max offset {want}", interval=0.1)
