# A 3-broker group (tools/brokercluster.py, real processes) for tests that run
# on asyncio as well as trio: the harness itself is trio code, so it runs in
# a thread of its own (an anyio blocking portal on trio) and the test talks
# to it through that thread.  kill() is a plain signal; the waits go through
# a worker thread so the test's own event loop keeps running meanwhile.
import contextlib
import functools

import anyio
import anyio.from_thread

from tools.brokercluster import open_broker_cluster

FEATURE_CONF = {
    "enablePropertyFilter": "true",
    "transactionTimeOut": "1500",
    "transactionCheckInterval": "2000",
    "defaultTopicQueueNums": "4",
}


class ThreadCluster:
    def __init__(self, portal, cluster) -> None:
        self.portal = portal
        self.cluster = cluster

    @property
    def namesrv_addr(self) -> str:
        return self.cluster.namesrv_addr

    def kill(self, node: str) -> None:
        self.cluster.kill(node)

    def call(self, fn, *args, **kw):
        """fn (a coroutine function of the harness) in the harness thread, blocking."""
        return self.portal.call(functools.partial(fn, *args, **kw))

    async def acall(self, fn, *args, **kw):
        return await anyio.to_thread.run_sync(functools.partial(self.call, fn, *args, **kw))

    async def wait_master(self, **kw) -> str:
        return await self.acall(self.cluster.wait_master, **kw)

    async def start_broker(self, node: str) -> None:
        await self.acall(self.cluster.start_broker, node)


@contextlib.contextmanager
def thread_cluster(root, **conf):
    with anyio.from_thread.start_blocking_portal("trio") as portal:
        with portal.wrap_async_context_manager(open_broker_cluster(root, extra_conf={**FEATURE_CONF, **conf})) as c:
            tc = ThreadCluster(portal, c)
            tc.call(c.wait_master)
            yield tc
