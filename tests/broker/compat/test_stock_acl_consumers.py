# The stock C++ client's consumers (rocketmq==0.4.4, set_session_credentials)
# against a broker with aclEnable (tests/broker/acl/test_bypasses.py's
# broker and accounts): a push consumer whose first delivery fails, so the
# message goes back (CONSUMER_SEND_MSG_BACK, judged by the topic of the
# message at its offset) and returns from %RETRY%<group>, and an orderly
# consumer (LOCK_BATCH_MQ).  Every request they send -- heartbeats, the
# consumer list, offsets, pulls, send-back, locks -- passes the header-field
# check and the table: the broker refuses none.
# Slow: a broker in process and stock C++ consumer processes waiting on their
#   own timers (retry delay, lock renewal).
import pytest
import trio

from broker.remoting.client import open_remoting_client
from tests.broker.acl.test_bypasses import ADMIN, routed, start
from tests.broker.compat.stock_client import run_script
from tools.mqadmin.adminapi import MQAdmin

pytestmark = pytest.mark.slow

OWNER = ["--access-key", "owner001", "--secret-key", "owner-secret"]


async def run_stock(script: str, args: list, timeout: float):
    return await trio.to_thread.run_sync(lambda: run_script(script, [str(a) for a in args], timeout=timeout))


async def test_stock_consumers_with_session_credentials(tmp_path, nursery, stock_client):
    env = await start(nursery, tmp_path, namesrv=True, messageDelayLevel="1s 1s 1s 1s 1s")
    async with open_remoting_client(rpc_hook=ADMIN) as rc:
        await MQAdmin(rc, env.namesrv).create_topic(env.addr, "Orders", 2, 2, 6, False)
    await routed(env, "Orders")
    sent = await run_stock("produce.py", [env.namesrv, "Orders", 3, "--group", "PG", *OWNER], timeout=90)
    assert sent.result["ok"] == 3, sent.result
    push = await run_stock("acl_consumer.py", [env.namesrv, "Orders", 3, "--group", "PushGroup", *OWNER,
                                               "--fail-first", 1, "--wait", 60], timeout=90)
    assert push.result["complete"], (push.result, push.log_text[-3000:])
    assert any(m["reconsume_times"] >= 1 for m in push.result["messages"]), push.result  # came back
    orderly = await run_stock("acl_consumer.py", [env.namesrv, "Orders", 3, "--group", "OrderlyGroup", *OWNER,
                                                  "--orderly", "--wait", 60], timeout=90)
    assert orderly.result["complete"], (orderly.result, orderly.log_text[-3000:])
    assert env.broker.acl.refused == 0  # (an orderly consumer consumes only the queues it locked)
