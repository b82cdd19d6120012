# Owns `mqadmin pipeline stage`: copying the sealed, fully committed data
# segments of a live broker's DLedger store to a location every Spark
# executor reaches (a shared filesystem path; from there `hadoop distcp` or
# an object store's sync tool carries it further), so that jobs never read
# a segment the broker is still appending to.  No Spark here: it runs on the
# broker's host, read-only on the store (no lock taken).
#
# A data segment is sealed once a later segment exists (DLedger closes a
# segment with its blank filler before it opens the next), and it is staged
# only when its last entry (the next segment's first index - 1) is
# committed.  Each staged segment is copied to a temporary name while its
# sha256 is computed, read back and checked, then renamed; segments already
# staged are immutable and skipped.  The index units of the staged entries
# are copied too (the rest of their index file zeroed, so no unit points at
# an unstaged entry), a `checkpoint` whose committedIndex is the last staged
# entry, `ledgermq-base` for a store reset to a later begin, and last, the
# manifest `ledgermq-stage.json` (atomic rename): segments with sizes,
# checksums and entry ranges, and the last entry's index, term, end position
# and chain CRC.  A staged store is an ordinary DLedger store for the jobs.
#
# A later run continues the staged chain: the first newly staged entry must
# be the staged last + 1 and its chainCrc must link to the staged last
# entry's (commitlog/entry.py, chain_crc).  A source that was reset or
# rewritten, or lost entries to retention before they were staged, is
# refused.
import hashlib
import json
import os
import shutil

import attrs

from commitlog.atomicfile import fsync_dir
from commitlog.entry import HEADER, HEADER_SIZE, chain_crc
from commitlog.metafiles import BASE, write_checkpoint
from commitlog.segments import segment_name
from tools.pipeline import splits as S

MANIFEST = "ledgermq-stage.json"
FORMAT = 1
CHUNK = 8 << 20


class StageError(S.PipelineInputError):
    """The store cannot be staged (or staged further) as asked."""


@attrs.frozen
class StageReport:
    root: str
    dest: str
    store_dir: str
    staged: int  # segments copied by this run
    kept: int  # segments staged before
    bytes: int  # copied by this run
    last_index: int
    end_pos: int
    left: int  # segments not staged (growing or not yet committed)

    def to_json(self) -> dict:
        return {"root": self.root, "dest": self.dest, "storeDir": self.store_dir, "staged": self.staged,
                "kept": self.kept, "bytes": self.bytes, "lastIndex": self.last_index, "endPos": self.end_pos,
                "notStaged": self.left}


def _copy_checked(src: str, dst: str) -> tuple[str, int]:
    """Copy src to dst through a temporary name; the copy's sha256 must equal
    the source's (read back from the destination).  Returns (sha256, size)."""
    tmp = dst + ".staging"
    h, n = hashlib.sha256(), 0
    with open(src, "rb") as fi, open(tmp, "wb") as fo:
        while chunk := fi.read(CHUNK):
            h.update(chunk)
            fo.write(chunk)
            n += len(chunk)
        fo.flush()
        os.fsync(fo.fileno())
    back = hashlib.sha256()
    with open(tmp, "rb") as f:
        while chunk := f.read(CHUNK):
            back.update(chunk)
    if back.hexdigest() != h.hexdigest():
        os.unlink(tmp)
        raise StageError(f"{dst}: the copy's sha256 differs from {src}'s (storage error); nothing staged")
    os.replace(tmp, dst)
    return h.hexdigest(), n


def _write_index(units: S.EntryUnits, dest_index: str, last: int) -> list[dict]:
    """The index files holding units 0..last, cut after `last` (zeroed to
    the index segment size, as DLedger preallocates them)."""
    out = []
    end = (last + 1) * S.INDEX_UNIT_SIZE
    for start, (path, length) in sorted(units.index_files.items()):
        if start >= end:
            break
        keep = min(length, end - start)
        dst = os.path.join(dest_index, segment_name(start))
        tmp = dst + ".staging"
        with open(path, "rb") as fi, open(tmp, "wb") as fo:
            left = keep
            while left > 0 and (chunk := fi.read(min(CHUNK, left))):
                fo.write(chunk)
                left -= len(chunk)
            fo.truncate(units.size)
            fo.flush()
            os.fsync(fo.fileno())
        os.replace(tmp, dst)
        out.append({"name": segment_name(start), "start": start, "length": units.size})
    return out


def _load(dest: str) -> dict | None:
    try:
        with open(os.path.join(dest, MANIFEST)) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def stage_store(root: str, dest: str, self_id: str | None = None, log=lambda *a: None) -> StageReport:
    store_dir = S.find_dledger_dir(root, self_id)
    if store_dir is None:
        raise StageError(f"{root}: no DLedger store (dledger-<id>/data) to stage")
    bound = S.dledger_bound(store_dir)
    files = list(bound.files)
    units = S.EntryUnits(store_dir, files, bound.seg_size)
    before = _load(dest)
    name = os.path.basename(store_dir)
    if before is not None and before["storeDir"] != name:
        raise StageError(f"{dest}: holds a stage of {before['storeDir']}, not {name}")
    staged = {s["start"]: s for s in before["segments"]} if before else {}
    last_before = before["lastIndex"] if before else bound.begin_index - 1
    # The sealed, fully committed segments: (start, path, length, first, last).
    sealed = []
    first = bound.begin_index
    for k, (start, path, length) in enumerate(files[:-1]):
        head = units.header_at(files[k + 1][0])
        if head is None or head[0] not in (1, 2) or head[4] != files[k + 1][0]:
            break  # the next segment has no readable first entry yet
        last = head[2] - 1
        if last > bound.committed_index or first < 0:
            break
        sealed.append((start, path, length, first, last))
        first = last + 1
    new = [s for s in sealed if s[0] not in staged and s[4] > last_before]
    if new and before is not None:
        start, path, _, first, _ = new[0]
        if first != last_before + 1:
            raise StageError(f"{root}: entries {last_before + 1}..{first - 1} are gone from the store "
                             f"(retention or a reset) and were never staged; stage into a new location")
        h = units.header_at(units.entry(first)[0])
        if (h[6] or h[7] or before["lastChainCrc"]) and chain_crc(before["lastChainCrc"], h[7], h[2], h[3]) != h[6]:
            raise StageError(f"{root}: entry {first} does not continue the staged history (chainCrc "
                             f"{h[6]:#010x} does not link to the staged entry {last_before}'s "
                             f"{before['lastChainCrc']:#010x}): the store was reset or rewritten")
    data_dir, index_dir = os.path.join(dest, name, "data"), os.path.join(dest, name, "index")
    os.makedirs(data_dir, exist_ok=True)
    os.makedirs(index_dir, exist_ok=True)
    segments = list(before["segments"]) if before else []
    copied = 0
    for start, path, _length, first, last in new:
        log(f"  stage {os.path.basename(path)} (entries {first}..{last})")
        sha, n = _copy_checked(path, os.path.join(data_dir, segment_name(start)))
        segments.append({"name": segment_name(start), "start": start, "length": n, "sha256": sha,
                         "firstIndex": first, "lastIndex": last})
        copied += n
    if not segments:
        raise StageError(f"{root}: no sealed, fully committed segment to stage yet (the last segment is "
                         f"still being written)")
    last = segments[-1]["lastIndex"]
    pos, size, term = units.entry(last)
    h = HEADER.unpack(S.pread_range(os.path.join(store_dir, "data", segment_name(pos - pos % bound.seg_size)),
                               pos % bound.seg_size, HEADER_SIZE))
    index = _write_index(units, index_dir, last)
    write_checkpoint(os.path.join(dest, name), last, last)
    if os.path.exists(os.path.join(store_dir, BASE)):
        shutil.copyfile(os.path.join(store_dir, BASE), os.path.join(dest, name, BASE))
    begin = before or {"beginIndex": bound.begin_index, "beginPos": bound.begin_pos}
    manifest = {"format": FORMAT, "storeDir": name, "segmentSize": bound.seg_size,
                "beginIndex": begin["beginIndex"], "beginPos": begin["beginPos"], "lastIndex": last,
                "lastTerm": term, "lastChainCrc": h[6], "endPos": pos + size, "segments": segments,
                "index": index, "source": os.path.abspath(root)}
    tmp = os.path.join(dest, MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(dest, MANIFEST))
    fsync_dir(dest)
    return StageReport(root, dest, name, len(new), len(segments) - len(new), copied, last, pos + size,
                       len(files) - len(sealed))


def render(result: dict) -> None:
    print(f"{result['root']} -> {result['dest']}: {result['staged']} segment(s) staged "
          f"({result['bytes'] / (1 << 20):.1f} MiB), {result['kept']} staged before; entries up to "
          f"{result['lastIndex']} (end position {result['endPos']}); {result['notStaged']} segment(s) not "
          f"sealed or not fully committed yet")
