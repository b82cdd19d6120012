# The web console in a real headless Chromium against a real 3-broker
# DLedger group (one mqnamesrv, three mqbroker processes on loopback): the
# cluster page shows three nodes and one master; a topic is created through
# the Topics page's confirm dialog (and exists on the name server after);
# a push consumer's group shows its member and lag 0, its lag rises to what
# was sent while it is stopped, and a reset by time (confirm dialog) brings
# it back to 0; the replicas' chain CRCs agree with the leader's own; a
# message found by key shows its body; and
# after a kill -9 of the master the same page, never reloaded, shows the
# new master, the dead node DOWN and a term change.
#
# LEDGERMQ_SCREENSHOTS=DIR also writes a screenshot of each page there
# (`python -m tools.dashboard.screenshots` is the documented command).
# Slow: a real 3-broker group and a headless Chromium.
import datetime
import os

import pytest
import trio

from broker.client import ConsumeFromWhere, ConsumeStatus, Message, open_producer, open_push_consumer
from tests.tools.dashboard.helpers import wait_route
from tools.brokercluster import open_broker_cluster
from tools.dashboard.browser import BrowserUnavailable, find_chromium, open_browser
from tools.dashboard.serve import DashboardConfig, serve_dashboard
from tools.mqadmin.adminapi import MQAdmin

pytestmark = pytest.mark.slow

try:
    find_chromium()
    import playwright.sync_api  # noqa: F401
    SKIP = None
except (BrowserUnavailable, ImportError) as e:
    SKIP = str(e)

TOPIC, GROUP, KEY = "ConsoleTopic", "ConsoleGroup", "order-42"
WAIT = 60_000  # ms: generous, the machine is shared


def nodes_state(page) -> dict:
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll(
        '.group[data-group="broker-a"] table.nodes tbody tr')].map(r => [r.dataset.node, r.dataset.role]))""")


@pytest.mark.skipif(SKIP is not None, reason=f"no browser to drive: {SKIP}")
async def test_console_pages_in_chromium(tmp_path):
    shots = os.environ.get("LEDGERMQ_SCREENSHOTS")
    async with open_broker_cluster(tmp_path / "c", size=3) as cluster, trio.open_nursery() as nursery:
        master = await cluster.wait_master()
        url = await nursery.start(serve_dashboard, DashboardConfig(cluster.namesrv_addr, port=0, period_s=0.5))
        assert url.startswith("http://127.0.0.1:")       # loopback by default
        async with open_browser() as browser:
            # --- cluster: three nodes, one master, the one the name server lists as id 0 ---------
            await browser.run(lambda p: p.goto(url + "/#cluster"))
            await browser.run(lambda p: p.wait_for_function("""() => {
                const rows = document.querySelectorAll('.group[data-group="broker-a"] table.nodes tbody tr');
                return rows.length === 3 && [...rows].filter(r => r.dataset.role === 'MASTER').length === 1
                    && [...rows].every(r => r.dataset.role !== 'DOWN');
            }""", timeout=WAIT))
            # On shared cores an election can move the leadership between the
            # harness's read and the page's (its next refresh shows it): the
            # page must agree with the group as it is, within a few refreshes.
            for _ in range(20):
                master = await cluster.wait_master()
                roles = await browser.run(nodes_state)
                shown = await browser.run(lambda p: p.inner_text('.group[data-group="broker-a"] .master'))
                if roles == {n: ("MASTER" if n == master else "SLAVE") for n in cluster.brokers} and shown == master:
                    break
                await trio.sleep(0.5)
            assert roles == {n: ("MASTER" if n == master else "SLAVE") for n in cluster.brokers}, roles
            assert shown == master
            term_before = int(await browser.run(lambda p: p.inner_text('.group[data-group="broker-a"] .group-term')))
            if shots:
                await browser.run(lambda p: p.screenshot(path=os.path.join(shots, "cluster.png"), full_page=True))

            # --- topics: create through the confirm dialog ---------------------------------------
            def create_topic(p):
                p.goto(url + "/#topics")
                p.click("#topic-new")
                p.fill("#f-topic", TOPIC)
                p.fill("#f-readQueueNums", "4")
                p.fill("#f-writeQueueNums", "4")
                assert "updateTopic -c LedgerCluster -t ConsoleTopic -r 4 -w 4" in p.inner_text("#confirm-summary")
                p.click("#confirm-ok")
                p.wait_for_selector("#confirm", state="hidden", timeout=WAIT)
                p.wait_for_selector(f'#topics-table tr[data-topic="{TOPIC}"]', timeout=WAIT)
                return p.inner_text(f'#topics-table tr[data-topic="{TOPIC}"] td:nth-child(2)')
            assert await browser.run(create_topic) == "4"
            route = await wait_route(cluster, TOPIC)
            assert route.queue_datas[0].write_queue_nums == 4

            # --- a consumer group: member and lag 0 while it consumes, lag rises once it stops ------
            received = trio.Event()
            got: list[bytes] = []

            async def handler(msgs):
                got.extend(m.body for m in msgs)
                if len(got) >= 10:
                    received.set()
                return ConsumeStatus.CONSUME_SUCCESS

            async with open_producer("console_producer", namesrv_addr=cluster.namesrv_addr) as producer:
                async with open_push_consumer(GROUP, namesrv_addr=cluster.namesrv_addr, subscriptions={TOPIC: "*"},
                                              handler=handler,
                                              consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET):
                    for i in range(10):
                        keys = (KEY,) if i == 3 else ()
                        await producer.send(Message(TOPIC, f"body-{i} héllo".encode(), keys=keys))
                    with trio.fail_after(60):
                        await received.wait()
                    await browser.run(lambda p: p.goto(url + "/#consumers"))
                    await browser.run(lambda p: p.wait_for_function(f"""() => {{
                        const r = document.querySelector('#consumers-table tr[data-group="{GROUP}"]');
                        return r && r.querySelector('.lag').textContent === '0'
                            && !r.children[1].textContent.includes('none online');
                    }}""", timeout=WAIT))
                for i in range(25):
                    await producer.send(Message(TOPIC, f"later-{i}".encode()))
            await browser.run(lambda p: p.wait_for_function(f"""() => {{
                const r = document.querySelector('#consumers-table tr[data-group="{GROUP}"]');
                return r && r.querySelector('.lag').textContent === '25';
            }}""", timeout=WAIT))
            if shots:
                await browser.run(lambda p: p.screenshot(path=os.path.join(shots, "consumers.png"), full_page=True))

            # --- reset the stopped group's offsets to a time after every message: lag back to 0 -----
            def reset_offsets(p):
                p.click(f'button[data-reset="{GROUP}"]')
                later = datetime.datetime.now() + datetime.timedelta(minutes=5)
                p.fill("#f-time", later.strftime("%Y-%m-%dT%H:%M"))
                assert f"resetOffsetByTime -g {GROUP} -t {TOPIC}" in p.inner_text("#confirm-summary")
                p.click("#confirm-ok")
                p.wait_for_selector("#confirm", state="hidden", timeout=WAIT)
                p.wait_for_function(f"""() => document.querySelector(
                    '#consumers-table tr[data-group="{GROUP}"] .lag').textContent === '0'""", timeout=WAIT)
            await browser.run(reset_offsets)
            admin = MQAdmin(cluster.remoting, cluster.namesrv_addr)
            stats = await admin.consume_stats(cluster.addr(await cluster.wait_master()), GROUP, TOPIC)
            assert sum(w["brokerOffset"] for w in stats.values()) == 35
            assert all(w["consumerOffset"] == w["brokerOffset"] for w in stats.values()), stats

            # --- replication: the replicas' chain CRCs agree, and are the leader's own ---------------
            def compare(p):
                p.goto(url + "/#replication")
                p.click("#repl-run")
                p.wait_for_selector("#repl-result table", timeout=WAIT)
                return p.inner_text("#repl-result p"), p.eval_on_selector_all(
                    "#repl-result tbody tr", "rs => rs.map(r => r.children[4].textContent)")
            verdict, crcs = await browser.run(compare)
            assert verdict.startswith("Replicas agree at index "), verdict
            index = int(verdict.rsplit(" ", 1)[1])
            assert len(crcs) == 3 and set(crcs) == {f"{await admin.chain_crc(cluster.addr(master), index):x}"}

            # --- messages: by key, the body as text ---------------------------------------------
            def find_by_key(p):
                p.goto(url + "/#messages")
                p.select_option("#msg-by", "key")
                p.fill("#msg-topic", TOPIC)
                p.fill("#msg-key", KEY)
                p.click("#msg-search")
                p.wait_for_selector(".message pre.body", timeout=WAIT)
                return p.inner_text(".message pre.body"), p.inner_text("table.trace")
            body, trace = await browser.run(find_by_key)
            assert body == "body-3 héllo"
            assert "original" in trace and TOPIC in trace
            if shots:
                await browser.run(lambda p: p.screenshot(path=os.path.join(shots, "messages.png"), full_page=True))

            # --- kill -9 the master; the open page shows the new master and the term change ----------
            await browser.run(lambda p: p.goto(url + "/#cluster"))
            await browser.run(lambda p: p.evaluate("window.__notReloaded = true"))
            master = await cluster.wait_master()
            term_before = int(await browser.run(lambda p: p.inner_text('.group[data-group="broker-a"] .group-term')))
            cluster.kill(master)
            await browser.run(lambda p: p.wait_for_function("""(old) => {
                const g = document.querySelector('.group[data-group="broker-a"]');
                const m = g && g.querySelector('.master').textContent;
                return m && m !== old && m !== 'none' && document.querySelectorAll('.term-change').length > 0;
            }""", arg=master, timeout=WAIT))
            assert await browser.run(lambda p: p.evaluate("window.__notReloaded === true"))
            roles = await browser.run(nodes_state)
            new_master = await browser.run(lambda p: p.inner_text('.group[data-group="broker-a"] .master'))
            assert new_master != master and roles.get(new_master) == "MASTER"
            assert list(roles.values()).count("MASTER") == 1
            assert roles.get(master) == "DOWN", roles          # still listed (the name server) or missing: DOWN
            term_after = int(await browser.run(lambda p: p.inner_text('.group[data-group="broker-a"] .group-term')))
            assert term_after > term_before
            change = " | ".join(await browser.run(lambda p: p.locator(".term-change").all_inner_texts()))
            assert f"leader {master} → {new_master}" in change, change
            if shots:
                await browser.run(lambda p: p.screenshot(path=os.path.join(shots, "failover.png"), full_page=True))
        nursery.cancel_scope.cancel()
