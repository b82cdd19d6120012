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
