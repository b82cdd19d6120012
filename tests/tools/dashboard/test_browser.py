# The web console in a real headless Chromium against a real 3-broker
# DLedger group (one mqnamesrv, three mqbroker processes on loopback), with
# a console account: the cluster page shows three nodes and one master; an
# anonymous write is refused on the page, the login dialog opens writes; a
# topic is created through the Topics page's confirm dialog (and exists on
# the name server after); a push consumer's group shows its member with
# its language and version and lag 0, the producers page lists its
# producer's group unasked and shows the same client looked up by name,
# its lag rises to what was sent while it is stopped, and a reset by time
# (confirm dialog) brings it back to 0; the replicas' chain CRCs agree with
# the leader's own; a message found by key shows its body; the daily pages
# (issue 31 part 4): a group's dead letters are browsed, exported as JSON
# lines and resent to their original topic; messages listed by time range
# are the ones stored in it, and one is resent; a group is created, its
# config edited and it is deleted; a topic is deleted; a topic's route and
# a broker's effective config (secrets masked) are shown; and after a kill
# -9 of the master the same page, never reloaded, shows the new master,
# the dead node DOWN with its address, a term change, and chart axes
# whose labels do not overlap.
#
# LEDGERMQ_SCREENSHOTS=DIR also writes a screenshot of each page there
# (`python -m tools.dashboard.screenshots` is the documented command).
# Slow: a real 3-broker group and a headless Chromium.
import datetime
import json
import os

import pytest
import trio

from broker.client import ConsumeFromWhere, ConsumeStatus, Message, open_producer, open_push_consumer
from tests.tools.dashboard.helpers import wait_route
from tools.brokercluster import open_broker_cluster
from broker.remoting.codes import CURRENT_VERSION, RequestCode
from tools.dashboard.auth import hash_password
from tools.dashboard.browser import BrowserUnavailable, find_chromium, open_browser
from tools.dashboard.ops import SECRET_NAME, version_desc
from tools.dashboard.serve import DashboardConfig, serve_dashboard
from tools.mqadmin.adminapi import MQAdmin, NotFoundError

pytestmark = pytest.mark.slow

try:
    find_chromium()
    import playwright.sync_api  # noqa: F401
    SKIP = None
except (BrowserUnavailable, ImportError) as e:
    SKIP = str(e)

TOPIC, GROUP, KEY = "ConsoleTopic", "ConsoleGroup", "order-42"
DLQ_GROUP, NEW_GROUP, DOOMED = "ConsoleDeadGroup", "ConsoleNewGroup", "ConsoleDoomedTopic"
USER, PASSWORD = "operator", "console-password-5e1"
WAIT = 60_000  # ms: generous, the machine is shared


def nodes_state(page) -> dict:
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll(
        '.group[data-group="broker-a"] table.nodes tbody tr')].map(r => [r.dataset.node, r.dataset.role]))""")


@pytest.mark.skipif(SKIP is not None, reason=f"no browser to drive: {SKIP}")
async def test_console_pages_in_chromium(tmp_path):
    shots = os.environ.get("LEDGERMQ_SCREENSHOTS")
    async with open_broker_cluster(tmp_path / "c", size=3) as cluster, trio.open_nursery() as nursery:
        master = await cluster.wait_master()
        admin = MQAdmin(cluster.remoting, cluster.namesrv_addr)
        # deleted through the console later: created now, so its route is registered by then
        await admin.create_topic(cluster.addr(master), DOOMED, 1, 1, 6, False)
        url = await nursery.start(serve_dashboard, DashboardConfig(cluster.namesrv_addr, port=0, period_s=0.5,
                                                                   users={USER: hash_password(PASSWORD)}))
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

            # --- login: an anonymous write is refused on the page; the login dialog opens writes ------
            def anonymous_then_login(p):
                p.goto(url + "/#topics")
                p.wait_for_selector("#login-open:not([hidden])", timeout=WAIT)
                p.click("#topic-new")
                p.fill("#f-topic", "AnonymousTopic")
                p.click("#confirm-ok")
                p.wait_for_selector("#confirm-error:not([hidden])", timeout=WAIT)
                refused = p.inner_text("#confirm-error")
                p.click("#confirm-cancel")
                p.click("#login-open")
                p.fill("#login-user", USER)
                p.fill("#login-password", "not-the-password")
                p.click("#login-ok")
                p.wait_for_selector("#login-error:not([hidden])", timeout=WAIT)
                wrong = p.inner_text("#login-error")
                p.fill("#login-password", PASSWORD)
                p.click("#login-ok")
                p.wait_for_selector("#login", state="hidden", timeout=WAIT)
                p.wait_for_selector("#logout:not([hidden])", timeout=WAIT)
                cookies = p.context.cookies()
                return refused, wrong, p.inner_text("#whoami"), cookies, p.evaluate("document.cookie")
            refused, wrong, who, cookies, script_cookies = await browser.run(anonymous_then_login)
            assert "needs a login" in refused and "wrong user or password" in wrong and who == f"logged in as {USER}"
            (session,) = [c for c in cookies if c["name"] == "ledgermq_console_session"]
            assert session["httpOnly"] and session["sameSite"] == "Strict"
            assert "ledgermq_console_session" not in script_cookies    # the page's scripts never see it
            assert "AnonymousTopic" not in await cluster.namesrv_client().get_topic_list()

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
                    members = await browser.run(lambda p: p.inner_text(
                        f'#consumers-table tr[data-group="{GROUP}"] .members'))
                    assert f"(PYTHON, {version_desc(CURRENT_VERSION)})" in members, members

                # --- producers: every group listed without a name (the producer's among them), then
                # --- the by-name lookup: the group's client, its language and version
                def producers_page(p):
                    p.goto(url + "/#producers")
                    row = '#prod-groups tr[data-group="console_producer"]'
                    p.wait_for_selector(row, timeout=WAIT)
                    listed = p.eval_on_selector_all(row, """rs => rs.map(r => [
                        r.querySelector('.language').textContent, r.querySelector('.version').textContent])""")
                    p.fill("#prod-group", "console_producer")
                    p.click("#prod-search")
                    p.wait_for_selector("#prod-table tbody tr", timeout=WAIT)
                    return listed, p.eval_on_selector_all("#prod-table tbody tr", """rs => rs.map(r => [
                        r.querySelector('.language').textContent, r.querySelector('.version').textContent])""")
                listed, by_name = await browser.run(producers_page)
                assert listed == by_name == [["PYTHON", version_desc(CURRENT_VERSION)]]
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
                p.goto(url + "/#consumers")
                p.click(f'button[data-reset="{GROUP}"]')
                later = datetime.datetime.now() + datetime.timedelta(minutes=5)
                p.fill("#f-time", later.strftime("%Y-%m-%dT%H:%M"))
                assert f"resetOffsetByTime -g {GROUP} -t {TOPIC}" in p.inner_text("#confirm-summary")
                p.click("#confirm-ok")
                p.wait_for_selector("#confirm", state="hidden", timeout=WAIT)
                p.wait_for_function(f"""() => document.querySelector(
                    '#consumers-table tr[data-group="{GROUP}"] .lag').textContent === '0'""", timeout=WAIT)
            await browser.run(reset_offsets)
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

            # --- DLQ: three messages dead-lettered; browsed, exported as JSON lines, resent to the topic ---
            master_addr = cluster.addr(await cluster.wait_master())
            dead, _ = await admin.messages_in_range(TOPIC, limit=3)
            for m in dead:
                await admin.call(master_addr, RequestCode.CONSUMER_SEND_MSG_BACK, {
                    "offset": m["commitLogOffset"], "group": DLQ_GROUP, "delayLevel": -1,
                    "originMsgId": m["msgId"], "originTopic": TOPIC})

            def dlq_page(p):
                p.goto(url + "/#dlq")
                p.fill("#dlq-group", DLQ_GROUP)
                p.click("#dlq-browse")
                p.wait_for_function("() => document.querySelectorAll('#dlq-table tbody tr').length === 3",
                                    timeout=WAIT)
                originals = p.eval_on_selector_all("#dlq-table tbody .original", "cs => cs.map(c => c.textContent)")
                exported = p.evaluate("() => fetch(document.getElementById('dlq-export').href).then(r => r.text())")
                p.check("#dlq-all")
                p.click("#dlq-resend")
                summary = p.inner_text("#confirm-summary")
                p.click("#confirm-ok")
                p.wait_for_selector("#confirm", state="hidden", timeout=WAIT)
                return originals, exported, summary
            originals, exported, summary = await browser.run(dlq_page)
            assert originals == [TOPIC] * 3
            assert "3 message(s) sent again to their original topic" in summary
            lines = [json.loads(line) for line in exported.splitlines()]
            assert [x["topic"] for x in lines] == [f"%DLQ%{DLQ_GROUP}"] * 3
            assert sorted(x["body"] for x in lines) == sorted(m["body"] for m in dead)
            assert all(x["properties"]["RETRY_TOPIC"] == TOPIC for x in lines)
            everything, _ = await admin.messages_in_range(TOPIC, limit=500)
            bodies = [m["body"] for m in everything]
            assert len(everything) == 35 + 3 and all(bodies.count(m["body"]) == 2 for m in dead)

            # --- messages by time range: exactly those stored from a second on; one is resent --------
            start = next(m for m in everything if m["body"] == "later-0")["storeTimestamp"] // 1000
            expected = sorted(m["msgId"] for m in everything if m["storeTimestamp"] >= start * 1000)
            begin_local = datetime.datetime.fromtimestamp(start).strftime("%Y-%m-%dT%H:%M:%S")

            def range_page(p):
                p.goto(url + "/#messages")
                p.fill("#range-topic", TOPIC)
                p.fill("#range-begin", begin_local)
                p.click("#range-search")
                p.wait_for_selector("#range-table:not([hidden]) tbody tr", timeout=WAIT)
                ids = p.eval_on_selector_all("#range-table tbody tr", "rs => rs.map(r => r.dataset.msgid)")
                body = p.inner_text("#range-table tbody tr:first-child td.body")
                p.check("#range-table tbody tr:first-child .pick")
                p.click("#range-resend")
                p.click("#confirm-ok")
                p.wait_for_selector("#confirm", state="hidden", timeout=WAIT)
                return ids, body
            ids, resent_body = await browser.run(range_page)
            assert sorted(ids) == expected and len(ids) >= 25
            copies = [m["body"] for m in everything].count(resent_body)
            everything, _ = await admin.messages_in_range(TOPIC, limit=500)
            assert len(everything) == 39 and [m["body"] for m in everything].count(resent_body) == copies + 1

            # --- groups: created, its config edited, deleted --------------------------------------
            def create_group(p):
                p.goto(url + "/#consumers")
                p.click("#group-new")
                p.fill("#f-group", NEW_GROUP)
                p.fill("#f-retryMaxTimes", "3")
                p.fill("#f-consumeBroadcastEnable", "true")
                summary = p.inner_text("#confirm-summary")
                p.click("#confirm-ok")
                p.wait_for_selector("#confirm", state="hidden", timeout=WAIT)
                p.wait_for_selector(f'#consumers-table tr[data-group="{NEW_GROUP}"]', timeout=WAIT)
                return summary
            assert f"updateSubGroup -c LedgerCluster -g {NEW_GROUP}" in await browser.run(create_group)
            master_addr = cluster.addr(await cluster.wait_master())
            config = (await admin.all_group_configs(master_addr))[NEW_GROUP]
            assert config["retryMaxTimes"] == 3 and config["consumeBroadcastEnable"] is True

            def edit_group(p):
                p.click(f'button[data-edit-group="{NEW_GROUP}"]')
                p.wait_for_selector("#confirm[open]", timeout=WAIT)
                shown = p.input_value("#f-retryMaxTimes"), p.input_value("#f-consumeBroadcastEnable")
                p.fill("#f-retryMaxTimes", "7")
                p.click("#confirm-ok")
                p.wait_for_selector("#confirm", state="hidden", timeout=WAIT)
                return shown
            assert await browser.run(edit_group) == ("3", "true")
            config = (await admin.all_group_configs(master_addr))[NEW_GROUP]
            assert config["retryMaxTimes"] == 7 and config["consumeBroadcastEnable"] is True

            def delete_group(p):
                p.click(f'button[data-delete-group="{NEW_GROUP}"]')
                p.click("#confirm-ok")
                p.wait_for_selector("#confirm", state="hidden", timeout=WAIT)
                p.wait_for_selector(f'#consumers-table tr[data-group="{NEW_GROUP}"]', state="detached", timeout=WAIT)
            await browser.run(delete_group)
            assert NEW_GROUP not in await admin.all_group_configs(master_addr)

            # --- topics: one deleted; a route shown ----------------------------------------------
            await wait_route(cluster, DOOMED)

            def delete_topic(p):
                p.goto(url + "/#topics")
                p.click(f'button[data-delete-topic="{DOOMED}"]')
                assert f"deleteTopic -c LedgerCluster -t {DOOMED}" in p.inner_text("#confirm-summary")
                p.click("#confirm-ok")
                p.wait_for_selector("#confirm", state="hidden", timeout=WAIT)
                p.wait_for_selector(f'#topics-table tr[data-topic="{DOOMED}"]', state="detached", timeout=WAIT)
            await browser.run(delete_topic)
            with pytest.raises(NotFoundError):
                await admin.route(DOOMED)

            def route_page(p):
                p.click(f'button[data-route="{TOPIC}"]')
                p.wait_for_selector(f'.route[data-topic="{TOPIC}"]', timeout=WAIT)
                return (p.eval_on_selector_all(".route-brokers td.addr", "cs => cs.map(c => c.textContent)"),
                        p.inner_text(".route-queues td.read"), p.inner_text(".route-queues td.write"))
            addrs, read, write = await browser.run(route_page)
            route = await admin.route(TOPIC)
            assert sorted(addrs) == sorted(a for bd in route.broker_datas for a in bd.broker_addrs.values())
            assert master_addr in addrs and (read, write) == ("4", "4")

            # --- broker config: the effective config, secrets masked --------------------------------
            def config_page(p):
                p.goto(url + "/#brokers")
                p.select_option("#cfg-broker", master_addr)
                p.click("#cfg-show")
                p.wait_for_selector("#cfg-table:not([hidden]) tbody tr", timeout=WAIT)
                return p.evaluate("""() => Object.fromEntries([...document.querySelectorAll('#cfg-table tbody tr')]
                    .map(r => [r.dataset.key, r.querySelector('.value').textContent]))""")
            shown = await browser.run(config_page)
            real = await admin.broker_config(master_addr)
            assert shown["brokerName"] == "broker-a" and set(shown) == set(real)
            for key, value in shown.items():
                assert value == (("******" if real[key] else "") if SECRET_NAME.search(key) else real[key]), key

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
            dead_addr = await browser.run(lambda p: p.inner_text(
                f'.group[data-group="broker-a"] tr[data-node="{master}"] td:nth-child(2)'))
            assert dead_addr == cluster.addr(master)          # its address, not "not registered"
            term_after = int(await browser.run(lambda p: p.inner_text('.group[data-group="broker-a"] .group-term')))
            assert term_after > term_before
            change = " | ".join(await browser.run(lambda p: p.locator(".term-change").all_inner_texts()))
            assert f"leader {master} → {new_master}" in change, change
            # Chart axes: neighbouring time labels leave room for each other, value labels fit their axis --
            # on the live charts and on a probe drawn by the same code with five minutes of 1 s samples
            # whose values reach tens of millions (a lag after an outage).
            overlaps = await browser.run(lambda p: p.evaluate("""async () => {
                const probe = document.createElement("div");
                probe.id = "axis-probe";
                document.getElementById("tab-cluster").append(probe);
                const now = Date.now() / 1000, xs = [...Array(300).keys()].map(i => now - 300 + i);
                drawChart("axis-probe", [{label: "lag"}], [xs, xs.map((_, i) => i * 41234.5)]);
                await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
                if (!charts["axis-probe"].plot.axes[0]._splits) return ["the probe chart was not drawn"];
                // (a chart on a tab never shown has no ticks laid out yet)
                return Object.entries(charts).filter(([id, {plot}]) => plot.axes[0]._splits).flatMap(([id, {plot}]) => {
                const bad = [], ctx = plot.ctx, width = (axis, v) => {
                    ctx.font = axis.font[0];
                    return Math.max(...String(v).split("\\n").map(t => ctx.measureText(t).width)) / devicePixelRatio; };
                const x = plot.axes[0], xs = x._splits.map(v => plot.valToPos(v, "x"));
                for (let i = 0; i + 1 < xs.length; i++)
                    if (x._values[i] && x._values[i + 1] && xs[i + 1] - xs[i] < (width(x, x._values[i]) + width(x, x._values[i + 1])) / 2)
                        bad.push(id + " x " + x._values[i] + " / " + x._values[i + 1]);
                const y = plot.axes[1];
                for (const v of y._values || []) if (v && width(y, v) + y.ticks.size + y.gap > y._size) bad.push(id + " y " + v);
                return bad; }); }"""))
            assert overlaps == [], overlaps
            assert await browser.run(lambda p: p.evaluate("Object.keys(charts).length")) >= 3
            if shots:
                await browser.run(lambda p: p.screenshot(path=os.path.join(shots, "failover.png"), full_page=True))
        nursery.cancel_scope.cancel()
