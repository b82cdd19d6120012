# The POP tests' in-process test bed: a name server and a one-member DLedger
# broker (serve_broker) on trio in this process, over TCP on 127.0.0.1,
# with a producer and a PopClient of the Python library (broker.client).
from contextlib import asynccontextmanager

import attrs
import trio

from broker.client import Message, open_pop_client, open_producer
from broker.common.values import TopicConfig
from broker.config import BrokerConfig
from broker.metadata.tables import SubscriptionGroupConfig
from broker.namesrv.service import NamesrvConfig, serve_namesrv
from broker.server import serve_broker
from tools.localcluster import free_ports


@attrs.define
class PopBed:
    namesrv: str
    broker: object
    producer: object
    pc: object

    @property
    def addr(self) -> str:
        return self.broker.broker_addr

    @property
    def pop(self):
        return self.broker.processors.pop

    @property
    def revive(self):
        return self.broker.processors.pop_revive

    async def send(self, topic: str, n: int, *, queue_id: int | None = None, tag: str | None = None,
                   prefix: str = "m") -> list:
        """n messages (to one queue when queue_id is given); their SendResults,
        once the consume queues hold them (SEND_OK means committed; dispatch
        follows a moment later, and a pop without a poll time would miss it)."""
        sel = None if queue_id is None else (lambda mqs, _m: next(q for q in mqs if q.queue_id == queue_id))
        results = [await self.producer.send(Message(topic, f"{prefix}{i}".encode(), tags=tag), selector=sel)
                   for i in range(n)]
        store = self.broker.store
        await store.cq.dispatcher.dispatched.wait_for(store.replica.committed.value, timeout=10)
        return results

    async def create_topic(self, topic: str, queues: int = 4) -> None:
        await self.broker.metadata.update_topic(TopicConfig(topic, queues, queues, 6))

    async def create_group(self, group: str, retry_max_times: int = 16) -> None:
        await self.broker.metadata.update_group(SubscriptionGroupConfig(group, retry_max_times=retry_max_times))


@asynccontextmanager
async def pop_bed(tmp_path, topics=("PopT",), queues: int = 4, ports: tuple[int, int] | None = None, **conf):
    """`ports` (name server, DLedger peer): the same store restarted."""
    ns_port, peer_port = ports or free_ports(2)
    async with trio.open_nursery() as nursery:
        ns = await nursery.start(serve_namesrv, NamesrvConfig(listen_port=ns_port, bind_address="127.0.0.1"))
        cfg, _ = BrokerConfig.from_dict({
            "brokerName": "popb", "brokerIP1": "127.0.0.1", "listenPort": "0", "dLegerGroup": "popb",
            "dLegerPeers": f"n0-127.0.0.1:{peer_port}", "dLegerSelfId": "n0", "storePathRootDir": str(tmp_path / "n0"),
            "flushDiskType": "ASYNC_FLUSH", "namesrvAddr": f"127.0.0.1:{ns_port}", "registerNameServerPeriod": "10000",
            **{k: str(v) for k, v in conf.items()}})
        broker = await nursery.start(lambda task_status: serve_broker(cfg, bind_host="127.0.0.1",
                                                                      task_status=task_status))
        await broker.gate.wait_writable(timeout=20)
        for t in topics:
            if broker.metadata.topic_config(t) is None:
                await broker.metadata.update_topic(TopicConfig(t, queues, queues, 6))

        def known(routes) -> bool:
            return all((r := routes.topic_route(t)) is not None and
                       any(b.master_addr == broker.broker_addr for b in r.broker_datas) for t in topics)
        with trio.fail_after(20):
            await ns.wait_until(known)
        ns_addr = f"127.0.0.1:{ns_port}"
        async with open_producer("pop_pg", namesrv_addr=ns_addr) as producer, open_pop_client(ns_addr) as pc:
            yield PopBed(ns_addr, broker, producer, pc)
        nursery.cancel_scope.cancel()
