# Owns the pre-flight check of master-slave stores before a migration
# (`mqadmin migrate check`): each store's commitlog recovered as a stock
# broker would (record checks, torn tail), the md5 of its last N files
# (RocketMQ's own recommendation), the first record where each replica
# differs from the first store, and from that an alignment plan: which
# commitlog files to copy from which store to which, so that every node of
# the new group starts from the same old log (the same divided offset and
# the same records).  Read-only.
#
# Relations to the reference store (the --winner, else the first store
# when all agree, else none):  same | lagging (a prefix of it: a slave
# behind its master) | ahead | diverged (different records from an offset
# on: a split brain; needs --winner) | damaged (a torn or corrupt tail) |
# config-differs (same commitlog, other topics/groups/consumer offsets: a
# slave syncs them from its master only every few seconds).
#
# Every store's divided offset (where its DLedger log begins) is derived by
# consumequeue.migrated.divided_offset, the one rule apply and the broker's
# upgrade use.  Stores already migrated (a dledger-<id>/ledgermq-divided.json
# under the root) report the marker's value and their DLedger segment size;
# markers that disagree with each other or with the old files are problems:
# such replicas cannot form one group.
import hashlib
import json
import os

import attrs

from broker.metadata.snapshot import read_config_dir
from commitlog.store import StoreConfig, data_segment_size_of
from consumequeue.legacy_store import LegacyStore, compare_commitlogs, md5_files
from consumequeue.migrated import MARKER_FILE, divided_offset, load_marker


@attrs.define
class StoreStatus:
    root: str
    begin: int = 0
    end: int = 0
    records: int = 0
    segment_size: int = 0
    recovery: str = ""
    reason: str = ""
    files: list = attrs.Factory(list)  # segment names
    md5: list = attrs.Factory(list)  # [{name, size, md5}] of the last N files
    relation: str = "same"
    first_difference: int | None = None
    explanation: str = ""
    error: str = ""
    config_tables: dict = attrs.Factory(dict)  # topics / groups / offsets as parsed
    divided: int = 0  # the divided offset these old files give
    migrated: list = attrs.Factory(list)  # [{selfId, dividedOffset, dataSegmentSize}] of existing markers

    def to_json(self) -> dict:
        return {"root": self.root, "begin": self.begin, "end": self.end, "records": self.records,
                "segmentSize": self.segment_size, "dividedOffset": self.divided, "migrated": self.migrated,
                "recovery": self.recovery, "reason": self.reason,
                "md5": self.md5, "relation": self.relation, "firstDifference": self.first_difference,
                "explanation": self.explanation, "error": self.error}


@attrs.frozen
class AlignAction:
    target: str
    source: str
    from_offset: int  # the target's commitlog is replaced from here on
    copy: tuple  # file names copied from source
    delete: tuple  # target files beyond the source's last file
    reason: str

    def to_json(self) -> dict:
        return {"target": self.target, "source": self.source, "fromOffset": self.from_offset,
                "copy": list(self.copy), "delete": list(self.delete), "reason": self.reason}


@attrs.define
class CheckReport:
    stores: list
    reference: str | None
    plan: list
    problems: list

    @property
    def ok(self) -> bool:
        return not self.problems and not self.plan

    def to_json(self) -> dict:
        return {"ok": self.ok, "reference": self.reference, "stores": [s.to_json() for s in self.stores],
                "plan": [a.to_json() for a in self.plan], "problems": self.problems}


def _status(root: str, last: int) -> StoreStatus:
    st = StoreStatus(os.path.abspath(root))
    try:
        with LegacyStore(root) as s:
            rec = s.recover()
            st.begin, st.end, st.records, st.segment_size = rec.begin, rec.end, rec.records, s.segment_size
            st.recovery, st.reason = rec.stop, rec.reason
            st.divided = divided_offset(rec.end, s.segment_size)
            st.migrated = _markers(st.root)
            st.files = [os.path.basename(p) for _, p, _ in s.files]
            st.md5 = [{"name": d.name, "size": d.size, "md5": d.md5} for d in md5_files(s.commitlog_dir, last)]
            cfg = read_config_dir(root)
            st.config_tables = {"topics": (cfg.get("topics") or {}).get("topicConfigTable"),
                                "groups": (cfg.get("subscriptionGroup") or {}).get("subscriptionGroupTable"),
                                "offsets": (cfg.get("consumerOffset") or {}).get("offsetTable")}
            if rec.data_after:
                st.relation = "damaged"
                st.explanation = f"{rec.reason or rec.stop} at {rec.end}, with data after it"
            elif not rec.clean:
                st.relation = "damaged"
                st.explanation = f"torn tail: {rec.reason} (valid data ends at {rec.end})"
    except (OSError, ValueError) as exc:
        st.error = str(exc)
    return st


def _markers(root: str) -> list[dict]:
    out = []
    for name in sorted(os.listdir(root)):
        if name.startswith("dledger-") and os.path.exists(os.path.join(root, name, MARKER_FILE)):
            self_id = name[len("dledger-"):]
            marker = load_marker(os.path.join(root, name))
            out.append({"selfId": self_id, "dividedOffset": marker.divided,
                        "dataSegmentSize": data_segment_size_of(StoreConfig(root, self_id=self_id))})
    return out


def _migration_problems(stores: list[StoreStatus]) -> list[str]:
    """Migrated copies of one group must share the divided offset (the one
    their old files give) and the DLedger segment size."""
    problems = []
    marked = [(s, m) for s in stores for m in s.migrated]
    for s, m in marked:
        if m["dividedOffset"] != s.divided:
            problems.append(f"{s.root}: dledger-{m['selfId']} continues at divided offset {m['dividedOffset']}, "
                            f"but its old files end at {s.end} in {s.segment_size}-byte segments, which gives "
                            f"{s.divided}")
    for key, what in (("dividedOffset", "divided offsets"), ("dataSegmentSize", "DLedger segment sizes")):
        if len({m[key] for _, m in marked}) > 1:
            problems.append(f"migrated {what} differ: "
                            + ", ".join(f"{m[key]} at {s.root} (dledger-{m['selfId']})" for s, m in marked))
    return problems


def check_stores(roots: list[str], *, last: int = 2, winner: str | None = None) -> CheckReport:
    """Check the stores (the first is the master) and plan their alignment."""
    stores = [_status(r, last) for r in roots]
    problems = [f"{s.root}: {s.error}" for s in stores if s.error]
    if winner is not None:
        winner = os.path.abspath(winner)
        if winner not in [s.root for s in stores]:
            stores.append(_status(winner, last))
            if stores[-1].error:
                problems.append(f"{winner}: {stores[-1].error}")
    good = [s for s in stores if not s.error]
    if not good:  # nothing readable: the errors above are the whole answer
        return CheckReport(stores, None, [], problems)
    problems += _migration_problems(good)
    if len({s.segment_size for s in good}) > 1:
        problems.append("commitlog segment sizes differ: " + ", ".join(f"{s.root}={s.segment_size}" for s in good))
        return CheckReport(stores, None, [], problems)
    # Pairwise with the first store: where does each differ from it?
    base = good[0] if good else None
    diverged = []
    for s in good[1:]:
        at = compare_commitlogs(base.root, s.root)
        if at is not None:
            s.first_difference = at
            diverged.append(s)
    if winner is not None:
        ref = next(s for s in good if s.root == winner)
    elif diverged:
        ref = None
        for s in diverged:
            s.relation = "diverged"
            s.explanation = (f"its records differ from {base.root}'s from commitlog offset {s.first_difference} "
                             f"on (a split brain?); pass --winner ROOT to say which copy is kept")
        for s in good[1:]:
            if s.relation == "same" and s.first_difference is None and s.end != base.end:
                s.relation = "lagging" if s.end < base.end else "ahead"
                s.explanation = f"agrees with {base.root} over what both hold; ends at {s.end}, it at {base.end}"
        problems.append("the stores disagree: " + ", ".join(f"{s.root} differs from offset {s.first_difference}"
                                                             for s in diverged) + "; pass --winner")
    else:
        # All agree over what they share: the longest undamaged one is the reference.
        candidates = [s for s in good if s.relation != "damaged"] or good
        ref = max(candidates, key=lambda s: (s.end, s is base))
    plan = []
    if ref is not None:
        ref.relation, ref.explanation = "reference", "the copy the others are aligned to"
        for s in good:
            if s is ref:
                continue
            at = compare_commitlogs(ref.root, s.root)
            s.first_difference = at
            if at is not None:
                s.relation = "diverged"
                s.explanation = f"differs from the reference from commitlog offset {at} on"
                start = at
            elif s.relation == "damaged" or s.end < ref.end:
                if s.relation != "damaged":
                    s.relation = "lagging"
                    s.explanation = f"a prefix of the reference: ends at {s.end}, the reference at {ref.end}"
                start = s.end
            elif s.end > ref.end:
                s.relation = "ahead"
                s.explanation = f"holds {s.end - ref.end} bytes after the reference's end {ref.end} (dropped)"
                start = ref.end
            elif _digest(s.config_tables) != _digest(ref.config_tables):
                differ = [k for k in ref.config_tables if _digest(s.config_tables.get(k)) !=
                          _digest(ref.config_tables[k])]
                s.relation = "config-differs"
                s.explanation = f"same commitlog; config differs from the reference's: {', '.join(differ)}"
                plan.append(AlignAction(s.root, ref.root, ref.end, (), (), s.explanation))
                continue
            else:
                s.relation, s.explanation = "same", "identical to the reference"
                continue
            plan.append(_action(ref, s, start))
    return CheckReport(stores, ref.root if ref is not None else None, plan, problems)


def _digest(obj) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _action(ref: StoreStatus, s: StoreStatus, start: int) -> AlignAction:
    seg = ref.segment_size
    first = start - start % seg
    copy = tuple(n for n in ref.files if int(n) >= first)
    delete = tuple(n for n in s.files if int(n) >= first and n not in ref.files)
    return AlignAction(s.root, ref.root, first, copy, delete,
                       f"{s.relation}: replace its commitlog from {first} (the segment holding {start}) "
                       f"with {ref.root}'s")


def render_text(report: CheckReport) -> list[str]:
    out = []
    for s in report.stores:
        if s.error:
            out.append(f"{s.root}: ERROR {s.error}")
            continue
        out.append(f"{s.root}: {s.relation}  [{s.begin}, {s.end}) {s.records} records, recovery {s.recovery}, "
                   f"divided offset {s.divided}" + (f" -- {s.explanation}" if s.explanation else ""))
        for m in s.migrated:
            out.append(f"    migrated: dledger-{m['selfId']} continues at {m['dividedOffset']} "
                       f"in {m['dataSegmentSize']}-byte segments")
        for d in s.md5:
            out.append(f"    {d['md5']}  {d['name']}  {d['size']}")
    for a in report.plan:
        out.append(f"align {a.target} from {a.source}: copy {', '.join(a.copy) or 'nothing'}"
                   + (f"; delete {', '.join(a.delete)}" if a.delete else "") + f" ({a.reason})")
    for p in report.problems:
        out.append(f"PROBLEM: {p}")
    out.append("OK: the stores are sound and agree" if report.ok else
               "NOT READY: align the stores (mqadmin migrate align) before apply")
    return out
