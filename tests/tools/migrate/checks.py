# Owns the checks every migration test runs on a stopped migrated node:
# `mqadmin verifyStore --cq` (entries, every message record's BODYCRC and
# PHYSICALOFFSET, every consume queue unit, queue offsets contiguous in log
# order, the index inside the committed log) must be clean -- what an
# operator runs after a migration -- and the index files of a node.
import hashlib
import json
import os

from click.testing import CliRunner

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


def index_digests(root) -> dict[str, str]:
    """name -> md5 of every file under ROOT/index."""
    d = os.path.join(str(root), "index")
    out = {}
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            out[name] = hashlib.md5(f.read()).hexdigest()
    return out
