# Helpers of the feature tests (orderly, transactions, broadcasting, SQL92):
# waiting in whichever event loop the test runs on, and the order checks.
from broker.client.consumer_api import ConsumerApi
from tests.helpers.waiting import wait_until


async def wait_group_caught_up(observer, group: str, queues, timeout: float = 20.0) -> None:
    """Until `group`'s committed offset of every queue is the queue's max
    offset (read through `observer`, a pull consumer): the group consumed
    everything it was going to -- the barrier before checking that
    something did NOT arrive.  On either event loop."""
    offsets = ConsumerApi(observer.instance, group)
    want = {mq: await observer.max_offset(mq) for mq in queues}

    async def caught_up():
        return {mq: await offsets.query_offset(mq) for mq in queues} == want
    await wait_until(caught_up, timeout, f"{group} committed every queue's max offset {want}", interval=0.1)


def order_problems(seqs: list[int], n: int) -> list[str]:
    """What is wrong with one key's consumed sequence numbers: each must be
    the next one, or a step back (a redelivery from an earlier committed
    offset, at least once), never a skip; and all n must arrive."""
    problems = []
    prev = -1
    for s in seqs:
        if s > prev + 1:
            problems.append(f"{s} after {prev}: skipped ahead")
        prev = s
    missing = set(range(n)) - set(seqs)
    if missing:
        problems.append(f"missing {sorted(missing)[:10]}")
    return problems
