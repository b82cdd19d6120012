# Owns the blocking facade: the same producer and consumers for code that is
# not async.  Each object runs its client in an event loop of its own in a
# dedicated thread (an anyio blocking portal; `backend="trio"` by default,
# "asyncio" works the same) and every method is a portal call into it, so
# many application threads may share one object.  Push handlers, check
# listeners and transaction executors are plain functions; push handlers
# run in worker threads (anyio.to_thread), up to consume_concurrency at a
# time.
#
#   with BlockingProducer("pg", namesrv_addr=ns) as producer:
#       result = producer.send(Message("T", b"body"))
import functools
from collections.abc import Callable

import anyio
import anyio.from_thread

from broker.client.errors import ClientClosedError
from broker.client.model import ConsumeStatus, MessageExt
from broker.client.producer import open_producer
from broker.client.pull_consumer import open_pull_consumer
from broker.client.push_consumer import open_push_consumer
from broker.client.transaction import open_transactional_producer

DEFAULT_BACKEND = "trio"


class _Portal:
    """Enters an async context manager in its own event loop thread and
    keeps it open until close()."""

    def __init__(self, open_cm: Callable, backend: str = DEFAULT_BACKEND) -> None:
        self._loop = anyio.from_thread.start_blocking_portal(backend)
        self.portal = self._loop.__enter__()
        try:
            self._cm = self.portal.wrap_async_context_manager(open_cm())
            self.obj = self._cm.__enter__()
        except BaseException:
            self._loop.__exit__(None, None, None)
            raise
        self.closed = False

    def call(self, fn, *args, **kwargs):
        """Run fn (a coroutine function or a plain one) in the client's loop."""
        if self.closed:
            raise ClientClosedError("closed")
        return self.portal.call(functools.partial(fn, *args, **kwargs))

    call_sync = call

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self._cm.__exit__(None, None, None)
        finally:
            self._loop.__exit__(None, None, None)


class _Blocking:
    _portal: _Portal

    def close(self) -> None:
        """Stop (consumers commit their offsets) and unregister."""
        self._portal.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class BlockingProducer(_Blocking):
    def __init__(self, group: str, *, namesrv_addr, backend: str = DEFAULT_BACKEND, **options) -> None:
        self._portal = _Portal(lambda: open_producer(group, namesrv_addr=namesrv_addr, **options), backend)

    def send(self, msg, *, selector=None, timeout=None):
        return self._portal.call(self._portal.obj.send, msg, selector=selector, timeout=timeout)

    def send_oneway(self, msg, *, selector=None, timeout=None) -> None:
        self._portal.call(self._portal.obj.send_oneway, msg, selector=selector, timeout=timeout)

    def send_orderly(self, msg, sharding_key, *, timeout=None):
        return self._portal.call(self._portal.obj.send_orderly, msg, sharding_key, timeout=timeout)

    def send_batch(self, msgs, *, selector=None, timeout=None):
        return self._portal.call(self._portal.obj.send_batch, list(msgs), selector=selector, timeout=timeout)

    def send_async(self, msg, callback=None, *, selector=None, timeout=None) -> None:
        """`callback(result, error)` runs in the producer's event loop thread."""
        self._portal.call_sync(self._portal.obj.send_async, msg, callback, selector=selector, timeout=timeout)


class BlockingTransactionalProducer(_Blocking):
    """`execute(msg, arg)` and `check(msg)` are plain functions returning a
    LocalTransactionState; they run in worker threads."""

    def __init__(self, group: str, *, namesrv_addr, execute, check, backend: str = DEFAULT_BACKEND,
                 **options) -> None:
        self._portal = _Portal(lambda: open_transactional_producer(
            group, namesrv_addr=namesrv_addr, execute=execute, check=check, **options), backend)

    def send_in_transaction(self, msg, arg=None, *, timeout=None):
        return self._portal.call(self._portal.obj.send_in_transaction, msg, arg, timeout=timeout)


class BlockingPullConsumer(_Blocking):
    def __init__(self, group: str, *, namesrv_addr, backend: str = DEFAULT_BACKEND, **options) -> None:
        self._portal = _Portal(lambda: open_pull_consumer(group, namesrv_addr=namesrv_addr, **options), backend)

    def fetch_queues(self, topic: str):
        return self._portal.call(self._portal.obj.fetch_queues, topic)

    def pull(self, mq, offset: int, max_nums: int = 32, sub_expression: str = "*", timeout: float = 10.0,
             block: float = 0.0):
        return self._portal.call(self._portal.obj.pull, mq, offset, max_nums, sub_expression, timeout, block)

    def update_offset(self, mq, offset: int) -> None:
        self._portal.call(self._portal.obj.update_offset, mq, offset)

    def fetch_offset(self, mq) -> int:
        return self._portal.call(self._portal.obj.fetch_offset, mq)

    def max_offset(self, mq) -> int:
        return self._portal.call(self._portal.obj.max_offset, mq)

    def min_offset(self, mq) -> int:
        return self._portal.call(self._portal.obj.min_offset, mq)

    def search_offset(self, mq, timestamp_ms: int) -> int:
        return self._portal.call(self._portal.obj.search_offset, mq, timestamp_ms)


class BlockingPushConsumer(_Blocking):
    """`handler(msgs) -> ConsumeStatus` is a plain function, called from
    worker threads."""

    def __init__(self, group: str, *, namesrv_addr, subscriptions: dict[str, str],
                 handler: Callable[[list[MessageExt]], ConsumeStatus], backend: str = DEFAULT_BACKEND,
                 **options) -> None:
        async def in_thread(msgs):
            return await anyio.to_thread.run_sync(handler, msgs)

        self._portal = _Portal(lambda: open_push_consumer(
            group, namesrv_addr=namesrv_addr, subscriptions=subscriptions, handler=in_thread, **options), backend)

    def assigned_queues(self):
        return self._portal.call_sync(self._portal.obj.assigned_queues)

    def commit_offsets(self) -> None:
        self._portal.call(self._portal.obj.commit_offsets)


__all__ = ["BlockingProducer", "BlockingPullConsumer", "BlockingPushConsumer", "BlockingTransactionalProducer"]
