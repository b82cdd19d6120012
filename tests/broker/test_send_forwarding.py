# A master that handed its leadership over hands on the sends it still
# receives (broker/processors/forward.py), on real processes: what a
# producer whose route is stale (it asks the name server every 30 s) sees
# during and right after `mqadmin leadershipTransfer` is SEND_OK, for single sends,
# batches and a pipelined burst, stored by the new master (its address in
# the offset msgId, found there by a pull); a node that was never master
# refuses at once, naming the master; a request already handed on once is
# never handed on again; and once sendForwardWindowMillis has passed the
# old master refuses like any slave.  ledgermq_send_forward_total counts
# what was handed on.
# Slow: a real 3-broker group, leadership transfers and the forwarding window.
import json

import attrs
import pytest
import trio

from broker.client import MessageQueue, PullStatus, open_pull_consumer
from broker.common.msgid import parse_offset_msg_id
from broker.remoting.codes import FORWARDED_WRITE, RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from consumequeue import batch as batches
from tests.broker.compat.test_stock_broker import v2_send
from tests.broker.test_metrics import PROM, scrape, value
from tests.helpers.cli import mqadmin
from tools.brokercluster import open_broker_cluster

pytestmark = pytest.mark.slow

TOPIC = "HandedOn"
WINDOW_S = 6.0


def batch_send(topic: str, bodies: list[str], queue_id: int) -> RemotingCommand:
    items = [batches.BatchItem(b.encode(), {"KEYS": b}) for b in bodies]
    fields = {"a": "own_producer", "b": topic, "c": "TBW102", "d": 4, "e": queue_id, "f": 0,
              "g": "1700000000000", "h": 0, "i": "", "j": 0, "k": False, "m": True}
    return RemotingCommand.create_request(RequestCode.SEND_BATCH_MESSAGE, fields, body=batches.encode_batch(items))


async def test_a_deposed_master_hands_sends_on_until_its_window_ends(tmp_path):
    conf = {"sendForwardWindowMillis": str(int(WINDOW_S * 1000)), "sendForwardHoldMillis": "1000", **PROM}
    async with open_broker_cluster(tmp_path, extra_conf=conf) as cluster:
        old = await cluster.wait_master()
        ns, rc = cluster.namesrv_addr, cluster.remoting
        old_addr = cluster.addr(old)
        r = await rc.invoke(old_addr, v2_send(TOPIC, "before", 0), 10)  # auto-creates the topic
        assert r.code == ResponseCode.SUCCESS, r.remark
        target, bystander = sorted(n for n in cluster.brokers if n != old)

        # A producer that keeps sending to the master through the transfer:
        # held while the transfer is under way, then handed on.
        through: list = []
        stop = trio.Event()

        async def keep_sending():
            i = 0
            while not stop.is_set():
                r = await rc.invoke(old_addr, v2_send(TOPIC, f"through-{i}", i % 4), 10)
                through.append((r.code, r.remark))
                i += 1
        async with trio.open_nursery() as producer:
            producer.start_soon(keep_sending)
            out = json.loads(await mqadmin("leadershipTransfer", "-b", "broker-a", "-t", target, "--json", ns=ns))
            stop.set()
        assert len(through) > 10 and all(code == ResponseCode.SUCCESS for code, _ in through), \
            [t for t in through if t[0] != ResponseCode.SUCCESS][:3]
        # it returned once the name server routes to the new master
        assert out["changed"] and out["namesrvMaster"] == cluster.addr(target)
        deposed_at = trio.current_time()
        metrics_url = cluster.brokers[old].info["metrics"]
        forwarded_before = value(await scrape(metrics_url), "ledgermq_send_forward_total", outcome="forwarded")
        assert forwarded_before >= 1  # some of the sends above were handed on

        # A producer with the old route: every send is stored, by the new master.
        r = await rc.invoke(old_addr, v2_send(TOPIC, "handed-on", 1), 10)
        assert r.code == ResponseCode.SUCCESS, r.remark
        host, _ = parse_offset_msg_id(r.ext_fields["msgId"])
        assert f"{host.ip}:{host.port}" == cluster.addr(target)
        first_offset = int(r.ext_fields["queueOffset"])

        answers: dict = {}

        async def send(i):
            answers[i] = await rc.invoke(old_addr, v2_send(TOPIC, f"burst-{i}", 2), 10)
        async with trio.open_nursery() as burst:
            for i in range(40):
                burst.start_soon(send, i)
        assert all(a.code == ResponseCode.SUCCESS for a in answers.values()), \
            {i: a.remark for i, a in answers.items() if a.code != ResponseCode.SUCCESS}
        assert len({a.ext_fields["queueOffset"] for a in answers.values()}) == 40

        r = await rc.invoke(old_addr, batch_send(TOPIC, ["batch-0", "batch-1", "batch-2"], 3), 10)
        assert r.code == ResponseCode.SUCCESS and len(r.ext_fields["msgId"].split(",")) == 3, r.remark

        async with open_pull_consumer("handed_on_reader", namesrv_addr=ns) as pc:
            res = await pc.pull(MessageQueue(TOPIC, "broker-a", 1), first_offset, max_nums=1, block=10)
            assert res.status is PullStatus.FOUND and res.messages[0].body == b"handed-on"

        # The operator sees it: 1 + 40 + 1 requests handed on, none held now.
        samples = await scrape(metrics_url)
        assert value(samples, "ledgermq_send_forward_total", outcome="forwarded") == forwarded_before + 42
        assert value(samples, "ledgermq_send_forward_held") == 0

        # A node that was never master refuses at once and names the master.
        t0 = trio.current_time()
        r = await rc.invoke(cluster.addr(bystander), v2_send(TOPIC, "to-a-slave", 0), 10)
        assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE and cluster.addr(target) in r.remark
        assert trio.current_time() - t0 < 1.0

        # A request marked as handed on already is held (sendForwardHoldMillis), never handed on again.
        marked = attrs.evolve(v2_send(TOPIC, "twice", 0), flag=FORWARDED_WRITE)
        r = await rc.invoke(old_addr, marked, 10)
        assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE, r.remark
        assert trio.current_time() - deposed_at < WINDOW_S  # still inside the window: the flag decided

        # Past the window the old master is a slave like the others.
        await trio.sleep_until(deposed_at + WINDOW_S + 0.5)
        r = await rc.invoke(old_addr, v2_send(TOPIC, "too-late", 0), 10)
        assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE and cluster.addr(target) in r.remark
