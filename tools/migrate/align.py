# Owns carrying out a check's alignment plan (`mqadmin migrate align`):
# each target's commitlog files from the plan's offset on are replaced by
# the reference's copies -- every file copied to a staging name
# (.<name>.align), fsynced, renamed over the target name, then the
# directory fsynced, so a crash leaves either the old or the new file --
# files past the reference's last one are deleted, the target's consume
# queues and index are cut back to that offset (the migration's apply
# re-dispatches the rest from the aligned commitlog), and the reference's
# config tables are copied the same way, so whichever node leads first
# imports the same topics, groups and offsets.
#
# Resumable: a file whose md5 already equals the source's is skipped, so
# running align again after an interruption copies only what is left.
import hashlib
import os

from broker.store.upgrade import IMPORTED_CONFIGS
from commitlog.atomicfile import fsync_dir
from consumequeue.cq import ConsumeQueueStore
from consumequeue.indexfile import IndexService
from tools.migrate.check import CheckReport

CHUNK = 1 << 20


def _md5(path: str) -> str | None:
    try:
        h = hashlib.md5()
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        return h.hexdigest()
    except FileNotFoundError:
        return None


def copy_atomic(src: str, dst: str, progress=None) -> bool:
    """Copy src over dst through a staging name; False when dst already
    has the same bytes."""
    if _md5(src) == _md5(dst):
        return False
    directory, name = os.path.split(dst)
    tmp = os.path.join(directory, f".{name}.align")
    with open(src, "rb") as fin, open(tmp, "wb") as fout:
        while chunk := fin.read(CHUNK):
            fout.write(chunk)
            if progress:
                progress(len(chunk))
        fout.flush()
        os.fsync(fout.fileno())
    os.replace(tmp, dst)
    fsync_dir(directory)
    return True


def align(report: CheckReport, *, dry_run: bool = False, progress=None) -> list[str]:
    """Carry out report.plan; returns what was (or, dry, would be) done.
    `progress(bytes)` is called as bytes are copied."""
    if report.problems:
        raise ValueError("not aligning: " + "; ".join(report.problems))
    done = []
    for a in report.plan:
        src_dir, dst_dir = os.path.join(a.source, "commitlog"), os.path.join(a.target, "commitlog")
        for name in a.copy:
            if dry_run:
                done.append(f"would copy {src_dir}/{name} -> {dst_dir}/{name}")
            elif copy_atomic(os.path.join(src_dir, name), os.path.join(dst_dir, name), progress):
                done.append(f"copied {src_dir}/{name} -> {dst_dir}/{name}")
        for name in a.delete:
            done.append(f"{'would delete' if dry_run else 'deleted'} {dst_dir}/{name}")
            if not dry_run:
                os.unlink(os.path.join(dst_dir, name))
        if a.delete and not dry_run:
            fsync_dir(dst_dir)
        if a.copy or a.delete:
            done.append(f"{'would cut' if dry_run else 'cut'} {a.target}'s consume queues and index "
                        f"at {a.from_offset}")
            if not dry_run:
                _cut_derived(a.target, a.from_offset)
        for name in IMPORTED_CONFIGS:
            src = os.path.join(a.source, "config", name)
            if not os.path.exists(src):
                continue
            dst = os.path.join(a.target, "config", name)
            if dry_run:
                if _md5(src) != _md5(dst):
                    done.append(f"would copy {src} -> {dst}")
            else:
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                if copy_atomic(src, dst):
                    done.append(f"copied {src} -> {dst}")
    return done


def _cut_derived(root: str, offset: int) -> None:
    """Drop consume queue units and index items at or past `offset` (they
    may point at records the copy replaced)."""
    cqs = ConsumeQueueStore(root).load()
    try:
        cqs.truncate_phy(offset)
        cqs.flush()
    finally:
        cqs.close()
    if os.path.isdir(os.path.join(root, "index")):
        from consumequeue.source import CommitlogSource
        from native.dispatch import MODE_PLAIN
        source = CommitlogSource(os.path.join(root, "commitlog"), mode=MODE_PLAIN)
        index = IndexService(root).load()
        try:
            def ts(phy, size=0):
                try:
                    return source.store_timestamp_at(phy)
                except KeyError:
                    return None
            index.truncate_phy(offset, ts)
            for f in index.files:
                f.write_header()
                f.flush()
        finally:
            index.close()
            source.close()
