# Owns the pull consumer (Java's DefaultMQPullConsumer): the application
# picks queues and offsets itself and the library does the requests.
#
#   async with open_pull_consumer("cg", namesrv_addr=ns) as pc:
#       for mq in await pc.fetch_queues("T"):
#           res = await pc.pull(mq, await pc.fetch_offset(mq) or 0)
#           ...; await pc.update_offset(mq, res.next_begin_offset)
#
# It registers the group by HEART_BEAT as CONSUME_ACTIVELY (brokers list
# it, like Java), without subscriptions: each pull carries its own
# expression (the SUBSCRIPTION flag).
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from broker.client.consumer_api import ConsumerApi
from broker.client.errors import BrokerUnavailableError, ClientClosedError, ConnectionFailedError
from broker.client.instance import ClientInstance, open_client_instance
from broker.client.model import MessageQueue, PullResult, subscription
from broker.common.values import ConsumeFromWhere


class PullConsumer:
    def __init__(self, instance: ClientInstance, group: str) -> None:
        self.instance = instance
        self.group = group
        self.api = ConsumerApi(instance, group)
        self.closed = False

    def consumer_data(self) -> dict:
        return {"groupName": self.group, "consumeType": "CONSUME_ACTIVELY", "messageModel": "CLUSTERING",
                "consumeFromWhere": ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET.name, "subscriptionDataSet": [],
                "unitMode": False}

    def _check(self) -> None:
        if self.closed:
            raise ClientClosedError("the pull consumer is closed")

    async def fetch_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues (sorted); registers with its brokers."""
        self._check()
        queues = await self.api.queues(topic)
        await self.instance.heartbeat_all()
        return queues

    async def pull(self, mq: MessageQueue, offset: int, max_nums: int = 32, sub_expression: str = "*",
                   timeout: float = 10.0, block: float = 0.0) -> PullResult:
        """Pull up to max_nums messages from `offset`.  With `block` > 0 the
        broker holds the request up to that many seconds when there is no
        message yet (pullBlockIfNotFound); `timeout` covers the whole call."""
        self._check()
        suspend_ms = int(block * 1000)
        timeout = max(timeout, block + 5.0) if suspend_ms else timeout
        sub = subscription(sub_expression)
        try:
            return await self.api.pull(mq, offset, sub, max_nums=max_nums, suspend_ms=suspend_ms, timeout=timeout)
        except (ConnectionFailedError, BrokerUnavailableError):
            # A stale route (the node is gone): refresh it and try once more.
            route = self.instance.cached_route(mq.topic)
            await self.instance.refresh_route(mq.topic, route.version if route is not None else None)
            return await self.api.pull(mq, offset, sub, max_nums=max_nums, suspend_ms=suspend_ms, timeout=timeout)

    async def update_offset(self, mq: MessageQueue, offset: int) -> None:
        """Commit the group's offset of mq (on the master)."""
        self._check()
        await self.api.update_offset(mq, offset)

    async def fetch_offset(self, mq: MessageQueue) -> int:
        """The group's committed offset of mq, -1 if it has none (Java's
        fetchConsumeOffset)."""
        self._check()
        offset = await self.api.query_offset(mq)
        return -1 if offset is None else offset

    async def max_offset(self, mq: MessageQueue) -> int:
        return await self.api.max_offset(mq)

    async def min_offset(self, mq: MessageQueue) -> int:
        return await self.api.min_offset(mq)

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return await self.api.search_offset(mq, timestamp_ms)


@asynccontextmanager
async def open_pull_consumer(group: str, *, namesrv_addr, timeout: float = 3.0, credentials=None,
                             tls=None) -> AsyncIterator[PullConsumer]:
    async with open_client_instance(namesrv_addr, timeout=timeout, credentials=credentials,
                                    tls=tls) as (instance, _nursery):
        consumer = PullConsumer(instance, group)
        instance.consumers[group] = consumer.consumer_data
        try:
            yield consumer
        finally:
            consumer.closed = True
