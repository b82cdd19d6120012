# The console against a broker with aclEnable: unsigned, its admin write is
# refused with the broker's reason and nothing is created; once an access
# key and secret are entered (the page's ACL dialog posts them), the reads
# and the write are signed and go through; the secret is never sent back in
# any page, asset or API answer (the access key is shown, as the page's
# button says whom it signs as).  The broker exports Prometheus metrics,
# which the console finds through the broker's config and reads.
# Slow: a broker process and the console served in process.
import json
import urllib.error
import urllib.request

import pytest
import trio

from tests.tools.dashboard.helpers import wait_route
from tools.brokercluster import open_broker_cluster
from tools.dashboard.serve import DashboardConfig, serve_dashboard
from tools.localcluster import free_ports

pytestmark = pytest.mark.slow

SECRET = "console-admin-secret-9d1"
PLAIN_ACL = f"""\
globalWhiteRemoteAddresses: []
accounts:
  - accessKey: admin001
    secretKey: {SECRET}
    admin: true
"""
WRITE = {"Content-Type": "application/json", "X-Ledgermq-Console": "write"}


def http(url: str, body: dict | None = None, headers: dict | None = None, limit: int | None = None):
    """(status, text) of one request; `limit` bytes of a stream."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers or {}, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, (r.read(limit) if limit else r.read()).decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def call(*args, **kw):
    return await trio.to_thread.run_sync(lambda: http(*args, **kw))


async def test_console_signs_with_entered_credentials_and_never_shows_the_secret(tmp_path):
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(PLAIN_ACL)
    conf = {"aclEnable": "true", "aclFile": str(acl_file),
            "metricsExporterType": "PROM", "metricsPromExporterPort": free_ports(1)[0]}
    async with open_broker_cluster(tmp_path / "c", size=1, extra_conf=conf) as cluster, \
            trio.open_nursery() as nursery:
        await cluster.wait_master()
        url = await nursery.start(serve_dashboard, DashboardConfig(cluster.namesrv_addr, port=0, period_s=0.3))
        seen = []

        # Unsigned: the broker refuses the write; the console says why and nothing is created.
        status, text = await call(url + "/api/topics", {"topic": "AclTopic", "cluster": "LedgerCluster",
                                                        "confirmed": True}, WRITE)
        assert status == 409, text
        assert "AclTopic" not in await cluster.namesrv_client().get_topic_list()
        assert "access" in json.loads(text)["error"].lower(), text
        status, text = await call(url + "/api/credentials")
        assert json.loads(text) == {"signing": False, "accessKey": None}

        # Entered on the page: a write (no confirm step, no console header: refused before any broker).
        status, text = await call(url + "/api/credentials", {"accessKey": "admin001", "secretKey": SECRET})
        assert status == 400 and "header" in text
        status, text = await call(url + "/api/credentials", {"accessKey": "admin001", "secretKey": SECRET,
                                                             "confirmed": True}, WRITE)
        assert status == 200 and json.loads(text) == {"signing": True, "accessKey": "admin001"}
        seen.append(text)

        status, text = await call(url + "/api/topics", {"topic": "AclTopic", "cluster": "LedgerCluster",
                                                        "readQueueNums": 2, "writeQueueNums": 2, "confirmed": True},
                                  WRITE)
        assert status == 200, text
        route = await wait_route(cluster, "AclTopic")
        assert route.queue_datas[0].read_queue_nums == 2

        # Signed reads: the sampler's next snapshots show the group and the topic, no error.
        with trio.fail_after(30):
            while True:
                status, text = await call(url + "/api/snapshot")
                snap = json.loads(text)
                if not snap.get("error") and any(t["topic"] == "AclTopic" for t in snap.get("topics", [])):
                    break
                await trio.sleep(0.3)
        assert snap["groups"][0]["master"] is not None
        # The broker's Prometheus endpoint, found through its (signed) config and read too.
        (node,) = snap["groups"][0]["nodes"]
        assert node["metrics"]["error"] is None and node["metrics"]["rssBytes"] > 1 << 20, node
        seen.append(text)
        for path in ("/", "/static/app.js", "/static/index.html", "/api/credentials"):
            status, text = await call(url + path)
            assert status == 200
            seen.append(text)
        status, text = await call(url + "/api/events", limit=4096)
        assert text.startswith("data: ")
        seen.append(text)
        assert all(SECRET not in t for t in seen)
        assert "admin001" in seen[0]
        nursery.cancel_scope.cancel()
