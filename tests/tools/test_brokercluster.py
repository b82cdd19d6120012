# The broker-cluster harness itself (tools/brokercluster.py): name server and
# three mqbroker processes start, exactly one master is registered with two
# distinct slave ids, and after kill -9 of the master another node takes id 0.
# Slow: a real name server + 3-broker group and a kill -9 of its master.
import pytest
import trio

from tools.brokercluster import open_broker_cluster

pytestmark = pytest.mark.slow


async def test_cluster_starts_elects_and_fails_over(tmp_path):
    async with open_broker_cluster(tmp_path) as cluster:
        assert cluster.namesrv_addr.startswith("127.0.0.1:")  # bound to loopback only
        master = await cluster.wait_master()
        ids = await cluster.broker_ids()
        assert sorted(ids.values()) == sorted(cluster.addr(n) for n in cluster.brokers)
        assert ids[0] == cluster.addr(master) and len(ids) == 3
        cluster.kill(master)
        await cluster.wait_dead(master)
        new_master = await cluster.wait_master(exclude={master})
        assert new_master != master
        ids = await cluster.broker_ids()
        assert cluster.addr(master) not in ids.values()
        await cluster.start_broker(master)
        with trio.fail_after(30):
            while len(await cluster.broker_ids()) != 3:
                await trio.sleep(0.1)
        assert cluster.brokers[master].alive
    assert all(not p.alive for p in cluster.brokers.values())
    assert all(p.process.returncode == 0 for n, p in cluster.brokers.items())
