# Owns the store tour (python -m tools.store_tour): a walk through the
# DLedger-format store on real files: leader appends
# with an append hook, replication to a follower with byte-identical files,
# a torn tail after a simulated crash and its recovery, and verifyStore.
import os
import shutil
import struct
import sys
import tempfile

import click

from commitlog.scan import verify_store
from commitlog.store import SegmentedStore, StoreConfig
from tools.cli import CONTEXT, run_command


def _files(store_dir: str) -> dict[str, bytes]:
    out = {}
    for sub in ("data", "index"):
        for name in sorted(os.listdir(os.path.join(store_dir, sub))):
            with open(os.path.join(store_dir, sub, name), "rb") as f:
                out[f"{sub}/{name}"] = f.read()
    return out


@click.command(context_settings=CONTEXT)
@click.option("--dir", "store_dir", help="storePathRootDir to use (default: a temporary directory)")
@click.option("--entries", type=click.IntRange(1), default=2000, show_default=True, help="entries the leader appends")
@click.option("--keep", is_flag=True, help="keep the files afterwards")
def command(store_dir: str | None, entries: int, keep: bool) -> int:
    """ledgermq store tour: appends, replication, a torn tail and its recovery, verifyStore."""
    root = store_dir or tempfile.mkdtemp(prefix="ledgermq-quickstart-")
    sizes = dict(data_segment_size=64 * 1024, index_segment_size=32 * 1024)
    try:
        leader = SegmentedStore.open(StoreConfig(root=root, self_id="n0", **sizes))
        follower = SegmentedStore.open(StoreConfig(root=root, self_id="n1", **sizes))
        # The broker's hook writes PHYSICALOFFSET = pos + 48 into each message; here the
        # first 8 body bytes stand in for it.
        def stamp(batch):
            for h, body in batch.entries():
                struct.pack_into(">q", body, 0, h.pos + 48)
        leader.add_append_hook(stamp)
        for first in range(0, entries, 50):
            n = min(50, entries - first)
            leader.append_leader([b"\0" * 8 + f"message {i}".encode() * 20 for i in range(first, first + n)],
                                 term=1)
        leader.set_committed(leader.end_index)
        print(f"leader   {leader.end_index + 1} entries in {len(leader.data)} data segments, "
              f"end pos {leader.end_pos}")
        i = 0
        while i <= leader.end_index:
            batch = leader.read_batch(i, 256 * 1024, 500)
            follower.append_follower(batch)
            i = batch.last_index + 1
        follower.set_committed(leader.committed_index)  # what the leader's commit index tells it
        leader.close()
        follower.close()
        same = _files(leader.store_dir) == _files(follower.store_dir)
        print(f"follower replicated to {follower.end_index}; files byte-identical to the leader's: {same}")

        # A crash in the middle of a write: cut the last data file inside its last entry.
        with SegmentedStore.open(StoreConfig(root=root, self_id="n1", **sizes)) as f:
            last = f.get(f.end_index)
            seg = f.data.find(last.pos)
            path, offset = seg.path, last.pos - seg.start + 100
        os.truncate(path, offset)
        with SegmentedStore.open(StoreConfig(root=root, self_id="n1", **sizes)) as f:
            cut = f.recovery.cut_at
            print(f"recovery after a torn write: {cut[2]} at {os.path.basename(cut[0])}+{cut[1]}; "
                  f"log now ends at {f.end_index}")
        for node in ("n0", "n1"):
            s = verify_store(os.path.join(root, f"dledger-{node}"))
            print(f"verifyStore {node}: {s.entries} entries, index {s.first_index}..{s.last_index}, "
                  f"committed {s.committed_index}, {len(s.problems)} problems")
        if keep or store_dir:
            print(f"files kept in {root}; try: mqadmin dumpStore --store {root} --self-id n0 --count 5")
        return 0 if same else 1
    finally:
        if not (keep or store_dir):
            shutil.rmtree(root, ignore_errors=True)


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.store_tour")


if __name__ == "__main__":
    sys.exit(main())
