# Owns the blocking facade: the same producer and consumers for code that is
# not async.  Each object runs its trio client in a dedicated daemon thread
# (trio.run there) and every method is a trio.from_thread.run call into it,
# so many application threads may share one object.  Push handlers are plain
# functions; they run in trio's worker threads (trio.to_thread), up to
# consume_concurrency at a time.
#
#   with BlockingProducer("pg", namesrv_addr=ns) as producer:
#       result = producer.send(Message("T", b"body"))
import functools
import threading
from collections.abc import Callable

import trio

from broker.client.errors import ClientClosedError
from broker.client.model import ConsumeStatus, MessageExt
from broker.client.producer import open_producer
from broker.client.pull_consumer import open_pull_consumer
from broker.client.push_consumer import open_push_consumer


class _TrioThread:
    """Enters an async context manager in its own trio thread and keeps it
    open until close()."""

    def __init__(self, name: str, open_cm: Callable) -> None:
        self._open_cm = open_cm
        self._ready = threading.Event()
        self._token = None
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self.obj = None
        self.closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as e:  # noqa: BLE001 - handed to the constructor's caller
            if not self._ready.is_set():
                self._error = e
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with self._open_cm() as obj:
            self.obj = obj
            self._ready.set()
            await self._stop.wait()

    def call(self, async_fn, *args, **kwargs):
        if self.closed:
            raise ClientClosedError("closed")
        return trio.from_thread.run(functools.partial(async_fn, *args, **kwargs), trio_token=self._token)

    def call_sync(self, fn, *args, **kwargs):
        if self.closed:
            raise ClientClosedError("closed")
        return trio.from_thread.run_sync(functools.partial(fn, *args, **kwargs), trio_token=self._token)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        except trio.RunFinishedError:
            pass
        self._thread.join()


class _Blocking:
    _portal: _TrioThread

    def close(self) -> None:
        """Stop (consumers commit their offsets) and unregister."""
        self._portal.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class BlockingProducer(_Blocking):
    def __init__(self, group: str, *, namesrv_addr, **options) -> None:
        self._portal = _TrioThread(f"ledgermq-producer-{group}",
                                   lambda: open_producer(group, namesrv_addr=namesrv_addr, **options))

    def send(self, msg, *, selector=None, timeout=None):
        return self._portal.call(self._portal.obj.send, msg, selector=selector, timeout=timeout)

    def send_oneway(self, msg, *, selector=None, timeout=None) -> None:
        self._portal.call(self._portal.obj.send_oneway, msg, selector=selector, timeout=timeout)

    def send_batch(self, msgs, *, selector=None, timeout=None):
        return self._portal.call(self._portal.obj.send_batch, list(msgs), selector=selector, timeout=timeout)

    def send_async(self, msg, callback=None, *, selector=None, timeout=None) -> None:
        """`callback(result, error)` runs in the producer's trio thread."""
        self._portal.call_sync(self._portal.obj.send_async, msg, callback, selector=selector, timeout=timeout)


class BlockingPullConsumer(_Blocking):
    def __init__(self, group: str, *, namesrv_addr, **options) -> None:
        self._portal = _TrioThread(f"ledgermq-pull-{group}",
                                   lambda: open_pull_consumer(group, namesrv_addr=namesrv_addr, **options))

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
                 handler: Callable[[list[MessageExt]], ConsumeStatus], **options) -> None:
        async def in_thread(msgs):
            return await trio.to_thread.run_sync(handler, msgs)

        self._portal = _TrioThread(f"ledgermq-push-{group}", lambda: open_push_consumer(
            group, namesrv_addr=namesrv_addr, subscriptions=subscriptions, handler=in_thread, **options))

    def assigned_queues(self):
        return self._portal.call_sync(self._portal.obj.assigned_queues)

    def commit_offsets(self) -> None:
        self._portal.call(self._portal.obj.commit_offsets)


__all__ = ["BlockingProducer", "BlockingPullConsumer", "BlockingPushConsumer"]
