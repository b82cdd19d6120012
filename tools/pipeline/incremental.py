# Owns incremental export (`export --since-checkpoint DIR`): each run exports
# only the entries committed after the previous run, and a rerun after a
# crash neither loses nor duplicates a row.
#
# The checkpoint (DIR/export-checkpoint.json, on the driver's filesystem,
# replaced atomically) records, per store root, the last exported entry:
# its index, term, end position, chainCrc and the CRC32 of its body, plus
# the number of the last completed run and the output it belongs to.  The
# next run checks that the store still holds that history before it reads
# anything after it:
#   - entry `last` is still there: same term, end position and chainCrc
#     (stock entries without CRCs: the body's CRC32);
#   - retention removed it but the store begins right after it: the first
#     entry's chainCrc must link to the recorded chainCrc (chain_crc), and
#     it must begin at the recorded end position;
#   - the committed index fell below `last`, entries between `last` and the
#     store's begin are gone (retention or a follower reset to the leader's
#     begin), or the chain does not match (a store rewritten): refused with
#     ExportCheckpointError, never silently skipped or duplicated.
# The run then reads from the end position of `last` (Split.skip) to the
# committed bound.
#
# Publishing is roll-back safe: Spark writes the run's Parquet into
# OUT/_incoming/r<run>/ (partitioned by topic and date), the driver renames
# each file to OUT/topic=../date=../part-r<run>-<name>, and only then is
# the checkpoint replaced.  A run that finds published files of a run number
# above the checkpoint's (a crash after some renames), or anything under
# _incoming, deletes them first and redoes that run.  File operations go
# through Spark's Hadoop filesystem API, so OUT may be hdfs:// or s3a://
# (renames there are copies: a crash mid-rename still rolls back cleanly).
import json
import os
import re
import zlib

import attrs

from commitlog.atomicfile import fsync_dir
from commitlog.entry import HEADER, HEADER_SIZE, chain_crc
from tools.pipeline import splits as S

CHECKPOINT = "export-checkpoint.json"
INCOMING = "_incoming"
FORMAT = 1
_PART = re.compile(r"^part-r(\d{6})-")
# Test hook: the driver exits at this point of a run (after-write,
# mid-publish, after-publish), as a crash would.
CRASH_ENV = "LEDGERMQ_TEST_EXPORT_CRASH_AT"


class ExportCheckpointError(S.PipelineInputError):
    """The store no longer continues the history the checkpoint recorded."""


@attrs.frozen
class Mark:
    """The last exported entry of one store (index -1: none yet)."""

    index: int = -1
    term: int = -1
    end_pos: int = 0
    chain_crc: int = 0
    body_crc32: int = 0
    plain_done: bool = False  # a mixed store's old commitlog part was exported

    def to_json(self) -> dict:
        return {"lastIndex": self.index, "lastTerm": self.term, "endPos": self.end_pos,
                "chainCrc": self.chain_crc, "bodyCrc32": self.body_crc32, "plainDone": self.plain_done}

    @classmethod
    def from_json(cls, d: dict) -> "Mark":
        return cls(d["lastIndex"], d["lastTerm"], d["endPos"], d["chainCrc"], d["bodyCrc32"], d["plainDone"])


@attrs.frozen
class Checkpoint:
    out: str | None = None
    run: int = 0
    marks: dict = attrs.field(factory=dict)  # store root -> Mark


def load(directory: str) -> Checkpoint:
    try:
        with open(os.path.join(directory, CHECKPOINT)) as f:
            d = json.load(f)
    except FileNotFoundError:
        return Checkpoint()
    except (OSError, ValueError) as exc:
        raise ExportCheckpointError(f"{directory}/{CHECKPOINT}: unreadable ({exc})") from None
    if d.get("format") != FORMAT:
        raise ExportCheckpointError(f"{directory}/{CHECKPOINT}: format {d.get('format')} is not {FORMAT}")
    return Checkpoint(d["out"], d["run"], {k: Mark.from_json(v) for k, v in d["stores"].items()})


def save(directory: str, ckpt: Checkpoint) -> None:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, CHECKPOINT)
    with open(path + ".tmp", "w") as f:
        json.dump({"format": FORMAT, "out": ckpt.out, "run": ckpt.run,
                   "stores": {k: m.to_json() for k, m in sorted(ckpt.marks.items())}}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    fsync_dir(directory)


# --- the store still continues the recorded history -----------------------------------

def _entry(units: S.EntryUnits, index: int):
    """(header tuple, body CRC32) of entry `index`, or None."""
    found = units.entry(index)
    if found is None:
        return None
    pos, size, _ = found
    start = pos - pos % units.data_size
    path = units.data_files[start][0]
    raw = units.pread(path, pos - start, size)
    return HEADER.unpack(raw[:HEADER_SIZE]), zlib.crc32(raw[HEADER_SIZE:])


def mark_of(units: S.EntryUnits, index: int, plain_done: bool) -> Mark:
    if index < 0:
        return Mark(plain_done=plain_done)
    h, body = _entry(units, index)
    return Mark(index, h[3], h[4] + h[1], h[6], body, plain_done)


def check_continues(root: str, plan: S.StorePlan, units: S.EntryUnits, mark: Mark) -> None:
    """Raise ExportCheckpointError unless the store still holds the history
    up to `mark` and continues it."""
    if mark.index < 0:
        return
    b = plan.dledger
    last, committed, begin = mark.index, plan.committed_index, b.begin_index if b else -1
    refuse = f"{root}: refusing the incremental export (the checkpoint's last exported entry is {last}): "
    if committed < last:
        raise ExportCheckpointError(refuse + f"the store's committed index is {committed}, below it: the log "
                                             f"was reset or rewritten")
    if begin > last + 1:
        raise ExportCheckpointError(refuse + f"entries {last + 1}..{begin - 1} are no longer in the store "
                                             f"(retention, or a reset to the leader's begin) and were never "
                                             f"exported")
    if begin <= last:
        got = _entry(units, last)
        if got is None:
            raise ExportCheckpointError(refuse + f"entry {last} is unreadable in the store")
        h, body = got
        if (h[3], h[4] + h[1], h[6]) != (mark.term, mark.end_pos, mark.chain_crc) or \
                (not h[6] and not mark.chain_crc and body != mark.body_crc32):
            raise ExportCheckpointError(refuse + f"the store's entry {last} (term {h[3]}, chainCrc {h[6]:#010x}) "
                                                 f"is not the exported one (term {mark.term}, chainCrc "
                                                 f"{mark.chain_crc:#010x}): the store was rewritten or reset "
                                                 f"to another history")
        return
    # begin == last + 1: the exported entry is gone, its successor must link to it.
    if b.begin_pos != mark.end_pos:
        raise ExportCheckpointError(refuse + f"the store begins at position {b.begin_pos}, not at "
                                             f"{mark.end_pos} where entry {last} ended")
    got = _entry(units, begin)
    if got is None:
        raise ExportCheckpointError(refuse + f"entry {begin} is unreadable in the store")
    h, _ = got
    if (h[6] or mark.chain_crc) and chain_crc(mark.chain_crc, h[7], h[2], h[3]) != h[6]:
        raise ExportCheckpointError(refuse + f"entry {begin}'s chainCrc {h[6]:#010x} does not continue the "
                                             f"exported entry {last}'s {mark.chain_crc:#010x}: the store was "
                                             f"rewritten or reset to another history")


def since(plan: S.StorePlan, mark: Mark) -> S.StorePlan:
    """The plan cut to the entries after `mark` (from its end position)."""
    if mark.index < 0 and not mark.plain_done:
        return plan
    out = []
    for s in plan.splits:
        if s.mode == S.MODE_PLAIN:
            continue  # exported with the first run
        if mark.index >= 0:
            if s.end <= mark.end_pos:
                continue
            if s.start < mark.end_pos:
                s = attrs.evolve(s, skip=mark.end_pos - s.start)
        out.append(attrs.evolve(s, seq=len(out)))
    return attrs.evolve(plan, splits=tuple(out))


# --- publishing through Hadoop filesystems ---------------------------------------------

class Publisher:
    """OUT's files through Spark's Hadoop FileSystem API (driver side)."""

    def __init__(self, spark, out: str):
        jvm = spark.sparkContext._jvm
        self.Path = jvm.org.apache.hadoop.fs.Path
        self.root = self.Path(out)
        self.fs = self.root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        self.out = out.rstrip("/")

    def incoming(self, run: int) -> str:
        return f"{self.out}/{INCOMING}/r{run:06d}"

    def _files(self, path):
        if not self.fs.exists(path):
            return
        it = self.fs.listFiles(path, True)
        while it.hasNext():
            yield it.next().getPath()

    def roll_back(self, done_run: int) -> int:
        """Delete _incoming and every published file of a run above
        `done_run` (left by a crash); returns how many files went."""
        gone = 0
        inc = self.Path(f"{self.out}/{INCOMING}")
        if self.fs.exists(inc):
            self.fs.delete(inc, True)
        for p in list(self._files(self.root)):
            m = _PART.match(p.getName())
            if m and int(m.group(1)) > done_run:
                self.fs.delete(p, False)
                gone += 1
        return gone

    def staged(self, run: int) -> list:
        """(path, partition dir relative to the run's dir) of its data files."""
        base = self.Path(self.incoming(run))
        prefix = str(self.fs.makeQualified(base).toUri().getPath()).rstrip("/") + "/"
        out = []
        for p in self._files(base):
            name = p.getName()
            if name.startswith(("_", ".")):
                continue  # _SUCCESS, .crc side files
            rel = str(p.getParent().toUri().getPath())
            out.append((p, rel[len(prefix):] if rel.startswith(prefix) else ""))
        return out

    def publish(self, run: int, path, rel: str) -> None:
        dest_dir = self.Path(f"{self.out}/{rel}") if rel else self.root
        self.fs.mkdirs(dest_dir)
        dest = self.Path(dest_dir, f"part-r{run:06d}-{path.getName()}")
        if not self.fs.rename(path, dest):
            raise OSError(f"cannot move {path.toString()} to {dest.toString()}")

    def finish(self, run: int) -> None:
        self.fs.delete(self.Path(f"{self.out}/{INCOMING}"), True)


def crash_point(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        os._exit(86)
