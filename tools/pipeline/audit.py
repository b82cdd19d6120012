# Owns the `audit` job: replicas of one DLedger group (several store roots)
# compared over their common committed prefix, entry index 0 (or the
# latest first entry retention left) to the lowest committedIndex among
# them.  A follower that merely lags is not a divergence; uncommitted tails
# are never looked at.
#
# Raft keeps data positions byte-identical across replicas (spec §5.6), so
# two replicas agree up to entry i exactly when their data bytes up to the
# end of i agree.  Pass 1, one task per (replica, segment): the md5 of the
# segment's bytes inside the common prefix, its first/last entry index and
# the last entry's chainCrc (ledgermq's CRC chain: equal chainCrc, equal
# history; stock DLedger leaves it 0 and the md5 alone decides).  Pass 2,
# one task per replica on the first segment whose ranges disagree: every
# entry header there (index, term, pos, size, CRCs, the body's CRC32), and
# the first index at which they differ is the divergence, reported with
# each replica's version of that entry, its file and offset.
# Old master-slave stores (a master and its slaves) are audited the same
# way over their common valid range, record by record in pass 2 (records
# have no index: they are told apart by commitlog position).
# Exit status 1 when a divergence is found.
# Usage: spark-submit tools/pipeline/audit.py --store ROOT1 --store ROOT2 ...
import functools
import hashlib
import os
import sys
import zlib

import attrs

from commitlog.entry import HEADER, HEADER_SIZE
from tools.pipeline import jobcommon as J
from tools.pipeline import segscan
from tools.pipeline import splits as S

MD5_CHUNK = 8 << 20


@attrs.frozen
class RangeDigest:
    replica: int
    start: int  # segment start
    lo: int  # bytes [lo, hi) of the common prefix in this segment
    hi: int
    md5: str
    first_index: int
    last_index: int
    last_chain_crc: int


@attrs.frozen
class EntryInfo:
    index: int
    term: int
    pos: int
    size: int
    magic: int
    chain_crc: int
    body_crc: int
    body_crc32: int  # zlib CRC32 of the body, whatever the header says

    def as_dict(self) -> dict:
        return {"index": self.index, "term": self.term, "pos": self.pos, "size": self.size, "magic": self.magic,
                "chainCrc": self.chain_crc, "bodyCrc": self.body_crc, "bodyCrc32": self.body_crc32}


def digest_range(task, allow_fallback: bool, common_begin: int) -> RangeDigest:
    """Pass 1 task body: task = (replica, store dir, Split cut at the end of
    the common prefix, lo: where the common prefix starts in it).  The md5
    covers [lo, end); entry indexes come from the native scanner, the last
    entry's chainCrc from its header (found through its index unit)."""
    replica, store_dir, split, lo = task
    h = hashlib.md5()
    with segscan.SegmentView(split) as view:
        for at in range(lo - split.start, split.length, MD5_CHUNK):
            h.update(view[at:min(at + MD5_CHUNK, split.length)])
    end = segscan.drain(segscan.scan_split(split, segscan.executor_backend(allow_fallback)))
    if end.err_code or end.stop not in (0, 1):
        raise segscan.SegmentReadError(split.path, end.err_at - split.start, "unreadable entry in the "
                                                                            "committed range")
    chain = 0
    if end.last_index >= 0:
        files = tuple(S.list_segment_files(os.path.join(store_dir, "data")))
        found = S.EntryUnits(store_dir, files, split.seg_size).entry(end.last_index)
        if found is not None:
            chain = _header_at(split, found[0])[6]
    first = max(end.first_index, common_begin) if end.first_index >= 0 else -1
    return RangeDigest(replica, split.start, lo, split.end, h.hexdigest(), first, end.last_index, chain)


def _header_at(split: S.Split, pos: int) -> tuple:
    with open(split.path, "rb") as f:
        f.seek(pos - split.start)
        return HEADER.unpack(f.read(HEADER_SIZE))


def walk_entries(split: S.Split, lo: int, hi: int, *, with_body_crc: bool = True):
    """Entry headers in [lo, hi) of a DLedger segment (stops at the filler
    or at zeroes); a bad header raises SegmentReadError."""
    with segscan.SegmentView(attrs.evolve(split, end=hi)) as view:
        at = lo - split.start
        end = hi - split.start
        while at + 8 <= end:
            magic, size = HEADER.unpack_from(view, at)[:2] if at + HEADER_SIZE <= end else (
                int.from_bytes(view[at:at + 4], "big", signed=True), 0)
            if magic == -1 or (magic == 0 and size == 0):
                return
            if at + HEADER_SIZE > end or size < HEADER_SIZE or at + size > end:
                raise segscan.SegmentReadError(split.path, at, f"entry of {size} bytes runs past the range")
            h = HEADER.unpack_from(view, at)
            body_crc32 = zlib.crc32(view[at + HEADER_SIZE:at + size]) if with_body_crc else 0
            yield EntryInfo(h[2], h[3], h[4], h[1], h[0], h[6], h[7], body_crc32)
            at += size


def walk_records(split: S.Split, lo: int, hi: int):
    """The records of a plain segment range as EntryInfo keyed by their
    position (index = pos; magic, BODYCRC and the CRC32 of the whole record)."""
    from native.dispatch import default_backend
    cut = attrs.evolve(split, end=hi)
    for view, res, at in segscan.scan_split(cut, default_backend()):
        for i in range(res.n):
            r = res.record(i)
            if r.phy_offset < lo:
                continue
            rec = bytes(view[r.phy_offset - at:r.phy_offset - at + r.size])  # no view may outlive the map
            magic, crc = int.from_bytes(rec[4:8], "big", signed=True), int.from_bytes(rec[8:12], "big")
            yield EntryInfo(r.phy_offset, 0, r.phy_offset, r.size, magic, 0, crc, zlib.crc32(rec))


def entries_task(task) -> list:
    """Pass 2 task body: task = (replica, Split, lo, hi)."""
    replica, split, lo, hi = task
    walk = walk_entries if split.mode == S.MODE_DLEDGER else walk_records
    return [replica, list(walk(split, lo, hi))]


@attrs.frozen
class Replica:
    k: int
    plan: S.StorePlan
    begin_pos: int  # position of the first common entry
    end_pos: int  # just after the last common entry


def _replicas(plans, common_begin: int, common_end: int) -> list[Replica]:
    out = []
    for k, p in enumerate(plans):
        if p.kind == S.KIND_PLAIN:  # positions are the bounds already
            out.append(Replica(k, p, common_begin, common_end))
            continue
        units = S.EntryUnits(p.dledger.store_dir, p.dledger.files, p.dledger.seg_size)
        b, e = units.entry(common_begin), units.entry(common_end)
        if b is None or e is None:
            raise S.PipelineInputError(f"{p.root}: entries {common_begin}..{common_end} are not all readable")
        out.append(Replica(k, p, b[0], e[0] + e[1]))
    return out


def first_divergence(lists: list[list[EntryInfo]]) -> tuple[int, str] | None:
    """(index, what differs) of the first entry on which replicas disagree
    (present on one, missing or different on another); None if none."""
    by_rep = [{e.index: e for e in lst} for lst in lists]
    indexes = sorted(set().union(*[set(m) for m in by_rep]))
    for i in indexes:
        seen = [m.get(i) for m in by_rep]
        if any(s is None for s in seen):
            return i, "missing on some replicas"
        ref = seen[0]
        for other in seen[1:]:
            diff = [f for f in ("term", "pos", "size", "magic", "chain_crc", "body_crc", "body_crc32")
                    if getattr(ref, f) != getattr(other, f)]
            if diff:
                return i, "differs in " + ", ".join(diff)
    return None


def audit_plans(spark, plans, *, allow_fallback=False, progress=None) -> dict:
    kinds = {p.kind for p in plans}
    if kinds not in ({S.KIND_DLEDGER}, {S.KIND_PLAIN}):
        raise S.PipelineInputError("audit compares replicas of one kind: all DLedger stores or all "
                                   f"master-slave stores (got {', '.join(sorted(kinds))})")
    plain = kinds == {S.KIND_PLAIN}
    if plain:
        # The common valid range, by commitlog position (a lagging slave's
        # shorter log is not a divergence).
        common_begin, common_end = max(p.plain_begin for p in plans), min(p.plain_end for p in plans)
        report = {"job": "audit", "kind": S.KIND_PLAIN,
                  "replicas": [{"root": p.root, "beginPos": p.plain_begin, "endPos": p.plain_end} for p in plans],
                  "commonBeginPos": common_begin, "commonEndPos": common_end, "ranges": 0, "divergence": None}
        if common_end <= common_begin:
            return report
    else:
        common_end = min(p.committed_index for p in plans)
        common_begin = max(p.dledger.begin_index for p in plans)
        report = {"job": "audit", "kind": S.KIND_DLEDGER,
                  "replicas": [{"root": p.root, "committedIndex": p.committed_index,
                                "beginIndex": p.dledger.begin_index} for p in plans],
                  "commonFirstIndex": common_begin, "commonLastIndex": common_end, "ranges": 0,
                  "divergence": None}
        if common_end < common_begin or common_end < 0:
            return report
    reps = _replicas(plans, common_begin, common_end)
    tasks = []
    for r in reps:
        for s in r.plan.splits:
            if s.start + s.seg_size <= r.begin_pos or s.start >= r.end_pos:
                continue
            tasks.append((r.k, r.plan.dledger.store_dir if r.plan.dledger else None,
                          attrs.evolve(s, end=min(s.end, r.end_pos)), max(s.start, r.begin_pos)))
    if progress is not None:
        progress.stage("digest segment ranges", len(tasks))
    fn = functools.partial(digest_range, allow_fallback=allow_fallback, common_begin=common_begin)
    digests = spark.sparkContext.parallelize(tasks, max(len(tasks), 1)).map(fn).collect()
    by_start: dict[int, dict[int, RangeDigest]] = {}
    for d in digests:
        by_start.setdefault(d.start, {})[d.replica] = d
    report["ranges"] = len(by_start)
    bad_start = None
    for start in sorted(by_start):
        row = by_start[start]
        keys = {(d.lo, d.hi, d.md5, d.first_index, d.last_index, d.last_chain_crc) for d in row.values()}
        if len(row) != len(reps) or len(keys) != 1:
            bad_start = start
            break
    if bad_start is None:
        return report
    # Pass 2: every replica's entries of that segment range.
    tasks2 = []
    for r in reps:
        for s in r.plan.splits:
            if s.start == bad_start:
                lo, hi = max(s.start, r.begin_pos), min(s.end, r.end_pos)
                tasks2.append((r.k, attrs.evolve(s, end=hi), lo, hi))
    if progress is not None:
        progress.stage("compare entries", len(tasks2))
    got = spark.sparkContext.parallelize(tasks2, max(len(tasks2), 1)).map(entries_task).collect()
    lists = [[] for _ in reps]
    for k, lst in got:
        lists[k] = lst
    found = first_divergence(lists)
    div = {"segment": f"{bad_start:020d}", "segmentStart": bad_start}
    if found is None:
        div.update(index=None, position=None,
                   reason="the segment's bytes differ but its entries agree (filler or padding)")
    else:
        key, reason = found
        div.update(index=None if plain else key, reason=reason, replicas=[])
        for r, lst in zip(reps, lists):
            e = next((x for x in lst if x.index == key), None)
            entry = e.as_dict() if e else None
            if e:
                if plain:
                    entry["index"] = None
                split = next(s for s in r.plan.splits if s.start == bad_start)
                entry.update(file=split.path, offset=e.pos - bad_start)
            div["replicas"].append({"root": r.plan.root, "entry": entry})
        div["position"] = next((x["entry"]["pos"] for x in div["replicas"] if x["entry"]), None)
    report["divergence"] = div
    return report


def run(spark, opts: J.JobOptions) -> tuple[dict, int]:
    from tools.pipeline.hadoopfs import local_path
    from tools.pipeline.sparkenv import Progress
    opts = attrs.evolve(opts, stores=tuple(local_path(r, "audit") for r in opts.stores))
    if len(opts.stores) < 2:
        raise ValueError("audit needs two or more --store roots (the replicas of one group)")
    with Progress(spark, opts.progress) as progress:
        plans = J.plan_inputs(spark, opts.stores, self_id=opts.self_id, allow_fallback=opts.allow_fallback,
                              progress=progress)
        report = audit_plans(spark, plans, allow_fallback=opts.allow_fallback, progress=progress)
    return report, (J.EXIT_PROBLEMS if report["divergence"] else J.EXIT_OK)


def render(result: dict) -> None:
    plain = result.get("kind") == S.KIND_PLAIN
    for r in result["replicas"]:
        print(f"{r['root']}: " + (f"positions {r['beginPos']}..{r['endPos']} valid" if plain
                                  else f"entries {r['beginIndex']}..{r['committedIndex']} committed"))
    if plain:
        print(f"common range: positions {result['commonBeginPos']}..{result['commonEndPos']} "
              f"({result['ranges']} segment ranges compared)")
    else:
        print(f"common committed prefix: entries {result['commonFirstIndex']}..{result['commonLastIndex']} "
              f"({result['ranges']} segment ranges compared)")
    d = result["divergence"]
    if d is None:
        print("no divergence")
        return
    what = f"record at {d['position']}" if plain else f"entry {d['index']}"
    print(f"DIVERGENCE in segment {d['segment']}: {what} {d['reason']}")
    for rep in d.get("replicas", []):
        e = rep["entry"]
        if e is None:
            print(f"  {rep['root']}: (nothing there)")
        else:
            print(f"  {rep['root']}: term {e['term']} pos {e['pos']} size {e['size']} chainCrc "
                  f"{e['chainCrc']:#010x} bodyCrc32 {e['bodyCrc32']:#010x} ({e['file']} offset {e['offset']})")


def main(argv=None) -> int:
    return J.job_main("audit", "Compare the committed prefixes of a group's replicas.", run, render, argv)


if __name__ == "__main__":
    from tools.pipeline.audit import main as _main  # executors import functions by package name
    sys.exit(_main())
