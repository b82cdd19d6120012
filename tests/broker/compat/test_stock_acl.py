# The stock C++ client (rocketmq==0.4.4, set_session_credentials) against
# the secure group of tests/broker/acl/test_secure_group.py: it signs the
# way AclClientRPCHook does (its own OnsChannel field included), so with the
# right keys it produces and pulls, and with a wrong secret or no
# credentials it is refused.  (A denied group is in the table with our
# client: the stock PullConsumer retries a refused pull without end.)
# Slow: the secure 3-broker group as real processes and four stock C++ client
#   processes.
import pytest
import trio

from broker.remoting.client import open_remoting_client
from tests.broker.acl.test_secure_group import ADMIN, secure_cluster
from tests.broker.compat.stock_client import run_script
from tests.helpers.waiting import wait_until
from tools.mqadmin.adminapi import MQAdmin, NotFoundError

pytestmark = pytest.mark.slow


async def run_stock(script: str, args: list, timeout: float):
    return await trio.to_thread.run_sync(lambda: run_script(script, [str(a) for a in args], timeout=timeout))


async def test_stock_cpp_client_with_session_credentials(tmp_path, stock_client):
    cluster_cm, files, _acl_file, tls = secure_cluster(tmp_path)
    async with cluster_cm as cluster:
        master = await cluster.wait_master()
        ns = cluster.namesrv_addr
        async with open_remoting_client(rpc_hook=ADMIN, tls=tls) as rc:
            admin = MQAdmin(rc, ns)
            await admin.create_topic(cluster.addr(master), "Orders", 4, 4, 6, False)

            async def routed():  # the stock producer asks the name server once, at its first send
                try:
                    return bool((await admin.route("Orders")).queue_datas)
                except NotFoundError:
                    return False
            await wait_until(routed, 30, "the name server's route of Orders")
        creds = ["--access-key", "producer1", "--secret-key", "producer-secret"]
        ok = await run_stock("produce.py", [ns, "Orders", 3, "--group", "PG", *creds], timeout=90)
        assert ok.result["ok"] == 3, (ok.result, ok.log_text[-3000:])
        for bad in (["--access-key", "producer1", "--secret-key", "wrong-secret"], []):
            run = await run_stock("produce.py", [ns, "Orders", 1, "--group", "PG", "--timeout-ms", 2000, *bad],
                                  timeout=90)
            assert run.result["ok"] == 0 and "error" in run.result["sent"][0], run.result
        # ... refused by the ACL, not failing for another reason:
        logs = "".join(cluster.log_tail(node, 200_000) for node in cluster.brokers)
        assert "Check signature failed for accessKey=producer1" in logs
        assert "No acl config for \n" in logs or "No accessKey is configured" in logs
        pulled = await run_stock("pull.py", [ns, "Orders", "--group", "OrderConsumers", "--access-key", "consumer1",
                                             "--secret-key", "consumer-secret"], timeout=90)
        assert sorted(m["body"] for m in pulled.result["messages"]) == ["hello-0", "hello-1", "hello-2"], pulled.result
