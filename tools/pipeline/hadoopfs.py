# Owns store roots given as URIs (file://, hdfs://, s3a://, anything Spark's
# Hadoop filesystems read): such a root must be a staged store (stage.py
# wrote it, with its manifest `ledgermq-stage.json`), and it is read only
# through Spark's JVM, never with the driver's or an executor's own file
# calls:
#   - the driver reads the manifest and the few index units and headers the
#     checks need through org.apache.hadoop.fs.FileSystem (the Py4J gateway);
#   - executors get each segment's bytes from `SparkContext.binaryFiles`, one
#     partition per segment in log order, and check the manifest's sha256
#     before scanning them (segscan.SegmentView reads Split.data).
# The manifest is the source of truth for what a staged store holds:
# listing an object store is not, and a job must never see a segment that
# is still growing.  Plain paths keep the local reader (splits.py, mmap).
# rebuild and audit map file:// roots to plain paths and refuse other
# schemes: they read index files and write through the driver.
import functools
import hashlib
import json
import os
import re

import attrs

from tools.pipeline import splits as S

MANIFEST = "ledgermq-stage.json"
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_uri(root) -> bool:
    return bool(_URI.match(os.fspath(root)))


def local_path(root: str, job: str) -> str:
    """A plain path for a job that reads files directly: file:// URIs map to
    their path (a shared filesystem mounted alike everywhere); other schemes
    are refused."""
    if not is_uri(root):
        return root
    root = os.fspath(root)
    if root.startswith("file://"):
        return root[len("file://"):] or "/"
    raise S.PipelineInputError(f"{root}: {job} reads store files directly and needs a local or shared "
                               f"path (or file://); stage the store there, or use export/stats, which read "
                               f"hdfs://, s3a:// and other Hadoop filesystems")


def join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


class HadoopFS:
    """Small reads through Spark's Hadoop FileSystem API (driver only)."""

    def __init__(self, spark):
        self.jvm = spark.sparkContext._jvm
        self.conf = spark.sparkContext._jsc.hadoopConfiguration()

    def _path(self, uri: str):
        path = self.jvm.org.apache.hadoop.fs.Path(uri)
        return path, path.getFileSystem(self.conf)

    def exists(self, uri: str) -> bool:
        path, fs = self._path(uri)
        return bool(fs.exists(path))

    def pread(self, uri: str, offset: int, size: int) -> bytes:
        path, fs = self._path(uri)
        stream = fs.open(path)
        try:
            stream.seek(offset)
            return bytes(stream.readNBytes(size))
        finally:
            stream.close()

    def read_all(self, uri: str) -> bytes:
        path, fs = self._path(uri)
        return self.pread(uri, 0, int(fs.getFileStatus(path).getLen()))


def load_manifest(fs: HadoopFS, root: str) -> dict:
    uri = join(root, MANIFEST)
    try:
        if not fs.exists(uri):
            raise S.PipelineInputError(f"{root}: no {MANIFEST}: a store read through a Hadoop filesystem must "
                                       f"be staged first (mqadmin pipeline stage)")
        return json.loads(fs.read_all(uri))
    except S.PipelineInputError:
        raise
    except Exception as exc:  # noqa: BLE001 - Py4J errors carry the Hadoop message
        raise S.PipelineInputError(f"{uri}: cannot read: {str(exc).splitlines()[0]}") from None


def plan_uri_store(spark, root: str, self_id: str | None = None) -> S.StorePlan:
    """The plan of a staged store behind a Hadoop filesystem, from its
    manifest (every staged segment is sealed and fully committed)."""
    m = load_manifest(HadoopFS(spark), root)
    store_id = m["storeDir"]
    if self_id is not None and store_id != f"dledger-{self_id}":
        raise S.PipelineInputError(f"{root}: staged store is {store_id}, not dledger-{self_id}")
    store_dir = join(root, store_id)
    seg = m["segmentSize"]
    files = tuple((s["start"], join(store_dir, "data", s["name"]), s["length"]) for s in m["segments"])
    bound = S.DLedgerBound(store_dir, m["beginPos"], m["beginIndex"], m["lastIndex"], m["endPos"], seg, files)
    splits = []
    for s in m["segments"]:
        start = s["start"]
        if start >= bound.committed_pos:
            break
        skip = bound.begin_pos - start if start < bound.begin_pos < start + seg else 0
        splits.append(S.Split(root, len(splits), join(store_dir, "data", s["name"]), start, seg,
                              min(start + min(s["length"], seg), bound.committed_pos), S.MODE_DLEDGER, skip,
                              sha256=s["sha256"]))
    return S.StorePlan(root, S.KIND_DLEDGER, tuple(splits), bound, bound.begin_pos, bound.begin_pos)


def units_for(spark, plan: S.StorePlan) -> S.EntryUnits:
    """Index units of a plan's DLedger store, local or behind a Hadoop
    filesystem (the manifest lists the staged index files)."""
    b = plan.dledger
    if not is_uri(plan.root):
        return S.EntryUnits(b.store_dir, b.files, b.seg_size)
    fs = HadoopFS(spark)
    m = load_manifest(fs, plan.root)
    index = [(f["start"], join(b.store_dir, "index", f["name"]), f["length"]) for f in m["index"]]
    return S.EntryUnits(b.store_dir, b.files, b.seg_size, index_files=index, pread=fs.pread)


# --- the executors' side: one partition per split, in order -------------------------

def _attach(record, split: S.Split) -> S.Split:
    """binaryFiles gives (uri, bytes) for the split's file: check the staged
    checksum, then hand the bytes to the scanner."""
    from tools.pipeline.segscan import SegmentReadError
    data = record[1]
    if split.sha256 is not None:
        got = hashlib.sha256(data).hexdigest()
        if got != split.sha256:
            raise SegmentReadError(split.path, 0, f"sha256 {got} differs from the stage manifest's "
                                                  f"{split.sha256} (a damaged or partial copy)")
    return attrs.evolve(split, data=data)


def split_rdd(spark, items: list):
    """An RDD with one partition per split, in order, each holding that
    split: local splits as themselves (the task maps the file), URI splits
    with their bytes read by Spark's Hadoop filesystems."""
    sc = spark.sparkContext
    if not any(is_uri(s.path) for s in items):
        return sc.parallelize(items, max(len(items), 1))
    parts, run = [], []
    for s in items:
        if is_uri(s.path):
            if run:
                parts.append(sc.parallelize(run, len(run)))
                run = []
            parts.append(sc.binaryFiles(s.path, 1).map(functools.partial(_attach, split=s)))
        else:
            run.append(s)
    if run:
        parts.append(sc.parallelize(run, len(run)))
    return sc.union(parts)
