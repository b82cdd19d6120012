# Owns the checks every migration test runs on a stopped migrated node:
# `mqadmin verifyStore --cq` (entries, every message record's BODYCRC and
# PHYSICALOFFSET, every consume queue unit, queue offsets contiguous in log
# order, the index inside the committed log) must be clean -- what an
# operator runs after a migration --; before a group is stopped for it,
# every node has committed and dispatched the same last entry
# (wait_group_settled); and the index files of a node, by content.
import hashlib
import json
import os

import trio
from click.testing import CliRunner

from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from tools.mqadmin import cli


def verify_store_cq(root, self_id: str) -> dict:
    """`mqadmin verifyStore --store ROOT --self-id ID --cq --json`, asserted
    clean (exit 0, no entry or consume queue problem); returns its JSON."""
    res = CliRunner().invoke(cli, ["verifyStore", "--store", str(root), "--self-id", self_id, "--cq", "--json"])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    out = json.loads(res.output)
    cq = out["consumeQueues"]
    assert res.exit_code == 0 and out["problems"] == [] and cq["ok"], (self_id, out["problems"], cq["problems"])
    return out


CHUNK = 1 << 20


def content_digest(path: str) -> str:
    """md5 of a file's length and its non-zero 1 MiB chunks (by position):
    equal for equal contents, and fast on a mostly sparse IndexFile (420 MB
    at the default sizes), reading only its data extents.  Holes and
    written zeroes count the same (an IndexFile's pages may be populated
    ahead of use)."""
    h = hashlib.md5()
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        h.update(str(size).encode())
        chunks, pos = set(), 0
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: no data after pos
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            chunks.update(range(start // CHUNK, (end - 1) // CHUNK + 1))
            pos = end
        for k in sorted(chunks):
            data = os.pread(fd, CHUNK, k * CHUNK)
            if data.count(0) != len(data):
                h.update(k.to_bytes(8, "big"))
                h.update(data)
    finally:
        os.close(fd)
    return h.hexdigest()


def index_digests(root) -> dict[str, str]:
    """name -> content_digest of every file under ROOT/index."""
    d = os.path.join(str(root), "index")
    return {name: content_digest(os.path.join(d, name)) for name in sorted(os.listdir(d))}


async def runtime_info(cluster, node: str) -> dict[str, str]:
    resp = await cluster.remoting.invoke(cluster.addr(node),
                                         RemotingCommand.create_request(RequestCode.GET_BROKER_RUNTIME_INFO, {}),
                                         timeout=10)
    assert resp.code == ResponseCode.SUCCESS, (node, resp.remark)
    return json.loads(resp.body)["table"]


async def wait_group_settled(cluster, nodes, timeout: float = 30) -> None:
    """Until every node of `nodes` (brokers of a tools.brokercluster group)
    reports the same last entry, committed, and nothing left to dispatch:
    stopped then, each node's consume queues cover its committed log, which
    verifyStore --cq checks."""
    with trio.fail_after(timeout):
        while True:
            infos = [await runtime_info(cluster, n) for n in nodes]
            ends = {(i["dledgerEndIndex"], i["dledgerCommittedIndex"]) for i in infos}
            if len(ends) == 1 and len({e for pair in ends for e in pair}) == 1 and all(
                    i["dispatchBehindBytes"] == "0" for i in infos):
                return
            await trio.sleep(0.05)
