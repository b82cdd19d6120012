# Owns `python -m tools.dashboard.screenshots --out DIR` (`make
# screenshots`): a 3-broker DLedger group on loopback under a light load,
# the console, and headless Chromium writing one PNG per page -- cluster,
# topics, consumer groups, messages, replication -- then the cluster page
# again after a kill -9 of the master (failover.png).  Used for the
# README's picture; the files are not committed.
import os
import sys
import tempfile

import click
import trio

from broker.client import ConsumeFromWhere, ConsumeStatus, Message, open_producer, open_push_consumer
from broker.telemetry.commands import CauseFirstCommand
from tools.brokercluster import open_broker_cluster
from tools.dashboard.browser import BrowserUnavailable, open_browser
from tools.dashboard.serve import DashboardConfig, serve_dashboard
from tools.mqadmin.adminapi import MQAdmin

TOPIC, GROUP = "Orders", "OrderConsumers"


async def _load(producer, stop: trio.Event, per_second: int = 40) -> None:
    i = 0
    while not stop.is_set():
        await producer.send(Message(TOPIC, f'{{"order": {i}, "amount": {i * 7 % 100}}}'.encode(),
                                    keys=(f"order-{i}",), tags="paid"))
        i += 1
        with trio.move_on_after(1 / per_second):
            await stop.wait()


async def take(out: str, root: str) -> list[str]:
    os.makedirs(out, exist_ok=True)
    written = []
    async with open_broker_cluster(root, size=3) as cluster, trio.open_nursery() as nursery:
        master = await cluster.wait_master()
        ns = cluster.namesrv_addr
        for addr in (await MQAdmin(cluster.remoting, ns).masters()).values():
            await MQAdmin(cluster.remoting, ns).create_topic(addr, TOPIC, 4, 4, 6, False)
        url = await nursery.start(serve_dashboard, DashboardConfig(ns, port=0, period_s=1.0))
        stop = trio.Event()

        async def handler(msgs):
            return ConsumeStatus.CONSUME_SUCCESS

        async with open_producer("screenshot_producer", namesrv_addr=ns) as producer, open_browser() as browser:
            with trio.fail_after(30):
                while await cluster.namesrv_client().get_route(TOPIC) is None:
                    await trio.sleep(0.5)
            nursery.start_soon(_load, producer, stop)
            async with open_push_consumer(GROUP, namesrv_addr=ns, subscriptions={TOPIC: "*"}, handler=handler,
                                          consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET):
                await trio.sleep(8)
            await trio.sleep(6)  # the group's lag grows while its consumer is gone

            async def shot(name: str, hash_: str, prepare=None):
                def fn(p):
                    p.goto(f"{url}/#{hash_}")
                    p.wait_for_function("() => document.getElementById('status').textContent.startsWith('live')")
                    if prepare:
                        prepare(p)
                    p.wait_for_timeout(1500)
                    path = os.path.join(out, f"{name}.png")
                    p.screenshot(path=path, full_page=True)
                    return path
                written.append(await browser.run(fn))

            await shot("cluster", "cluster")
            await shot("topics", "topics")
            await shot("consumers", "consumers",
                       lambda p: p.click(f'#consumers-table tr[data-group="{GROUP}"] td:first-child'))

            def search(p):
                p.fill("#msg-topic", TOPIC)
                p.fill("#msg-key", "order-3")
                p.click("#msg-search")
                p.wait_for_selector(".message pre.body")
            await shot("messages", "messages", search)

            def compare(p):
                p.click("#repl-run")
                p.wait_for_selector("#repl-result table")
            await shot("replication", "replication", compare)

            def failover(p):
                p.goto(f"{url}/#cluster")
                p.wait_for_function("() => document.querySelectorAll('.term-change').length > 0", timeout=60_000)
                p.wait_for_timeout(3000)
                path = os.path.join(out, "failover.png")
                p.screenshot(path=path, full_page=True)
                return path
            cluster.kill(master)
            written.append(await browser.run(failover))
            stop.set()
        nursery.cancel_scope.cancel()
    return written


@click.command(cls=CauseFirstCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", default="results/dashboard", show_default=True, help="folder for the PNG files")
def main(out: str) -> None:
    """Screenshots of each page of the web console against a live 3-broker group."""
    with tempfile.TemporaryDirectory(prefix="ledgermq-shots-") as root:
        try:
            paths = trio.run(take, out, os.path.join(root, "cluster"))
        except BrowserUnavailable as e:
            click.echo(f"screenshots: error: {e}", err=True)
            sys.exit(3)
    for p in paths:
        click.echo(p)


if __name__ == "__main__":
    main()
