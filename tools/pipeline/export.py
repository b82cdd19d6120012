# Owns the `export` job: every committed message of one or more stores to
# Parquet, partitioned by topic and by the UTC date of its store timestamp
# (DIR/topic=<topic>/date=<yyyy-MM-dd>/part-*.parquet).  One Spark task per
# segment: the native scanner finds the records, consumequeue/record.py decodes
# each one; bodies stored compressed (sysFlag COMPRESSED) are decompressed.
# Only committed entries are read (splits.py), and malformed records that
# the dispatcher would skip are skipped here too.
#
# Schema (also in the README, "The Spark pipeline"):
#   store string            the store root the row came from
#   topic string            (partition column)
#   queueId int, queueOffset long, physicalOffset long
#   entryIndex long         DLedger entry index (null in an old commitlog)
#   offsetMsgId string      hex(storeHost + physicalOffset), spec §1.9
#   uniqKey string          UNIQ_KEY (the client's msgId), null if absent
#   keys array<string>      KEYS split on spaces
#   tags string             TAGS, null if absent
#   properties map<string,string>
#   bornTimestamp long, storeTimestamp long (ms since the epoch)
#   bornHost string, storeHost string ("ip:port", "[v6]:port")
#   reconsumeTimes int, sysFlag int, flag int, bodyCrc int
#   compressed boolean      the COMPRESSED flag was set in the store
#   compressionType string  zlib / lz4 / zstd when compressed
#   bodyDecompressed boolean body holds the decompressed bytes (false when
#                           the codec is unavailable: body is then as stored)
#   body binary
#   date string             yyyy-MM-dd of storeTimestamp, UTC (partition)
# With --since-checkpoint DIR, only the entries committed since the last
# run are exported and published roll-back safe (incremental.py).
# Usage: spark-submit tools/pipeline/export.py --store ROOT --out DIR [--since-checkpoint CKPT]
import datetime
import functools
import sys

import attrs
import click

from tools.pipeline import jobcommon as J
from tools.pipeline import segscan

COLUMNS = (
    ("store", "string"), ("topic", "string"), ("queueId", "int"), ("queueOffset", "long"),
    ("physicalOffset", "long"), ("entryIndex", "long"), ("offsetMsgId", "string"), ("uniqKey", "string"),
    ("keys", "array<string>"), ("tags", "string"), ("properties", "map<string,string>"),
    ("bornTimestamp", "long"), ("storeTimestamp", "long"), ("bornHost", "string"), ("storeHost", "string"),
    ("reconsumeTimes", "int"), ("sysFlag", "int"), ("flag", "int"), ("bodyCrc", "int"),
    ("compressed", "boolean"), ("compressionType", "string"), ("bodyDecompressed", "boolean"),
    ("body", "binary"), ("date", "string"),
)
PARTITION_BY = ("topic", "date")


def schema():
    from pyspark.sql.types import _parse_datatype_string
    return _parse_datatype_string("struct<" + ",".join(f"{n}:{t}" for n, t in COLUMNS) + ">")


def utc_date(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%d")


def message_row(store: str, view, at: int, rec, entry_index) -> tuple:
    """One export row from the record at view[at:] (rec: its dispatch record)."""
    from broker.common.msgid import offset_msg_id
    from consumequeue import record as M
    m = M.decode(view, at, limit=rec.size)
    body, kind, done = segscan.decompress_body(m.body, m.sysflag)
    props = m.properties
    return (store, m.topic, m.queue_id, m.queue_offset, rec.phy_offset, entry_index,
            offset_msg_id(m.store_host, rec.phy_offset), props.get(M.PROPERTY_UNIQ_KEY), m.keys,
            props.get(M.PROPERTY_TAGS), props, m.born_timestamp, m.store_timestamp, str(m.born_host),
            str(m.store_host), m.reconsume_times, m.sysflag, m.flag, m.body_crc,
            bool(m.sysflag & M.COMPRESSED_FLAG), kind, done, body, utc_date(m.store_timestamp))


def split_rows(split, allow_fallback: bool):
    """Task body: the export rows of one split."""
    from native.dispatch import MODE_PLAIN
    gen = segscan.records_in(split, allow_fallback)
    plain = split.mode == MODE_PLAIN
    for view, at, rec in gen:
        yield message_row(split.store, view, at, rec, None if plain else rec.entry_index)


def _rows_of_partition(splits, allow_fallback, counters):
    for split in splits:
        n = 0
        for row in split_rows(split, allow_fallback):
            n += 1
            yield row
        if counters is not None:
            counters[split.store].add(n)


def messages_frame(spark, plans, allow_fallback: bool, counters=None):
    """The DataFrame of every committed message of the plans (one
    partition per segment); `counters` ({store root: accumulator}) count
    the rows each store produced."""
    from tools.pipeline.hadoopfs import split_rdd
    items = [s for p in plans for s in p.splits]
    rdd = split_rdd(spark, items).mapPartitions(
        functools.partial(_rows_of_partition, allow_fallback=allow_fallback, counters=counters))
    return spark.createDataFrame(rdd, schema(), verifySchema=False)


def run(spark, opts: J.JobOptions) -> tuple[dict, int]:
    from tools.pipeline.sparkenv import Progress
    extra = dict(opts.extra)
    if not opts.out:
        raise ValueError("export needs --out DIR")
    if extra.get("since_checkpoint"):
        return run_incremental(spark, opts, extra["since_checkpoint"])
    mode = extra.get("mode") or "errorifexists"
    with Progress(spark, opts.progress) as progress:
        plans = J.plan_inputs(spark, opts.stores, self_id=opts.self_id, allow_fallback=opts.allow_fallback,
                              progress=progress)
        nsplits = sum(len(p.splits) for p in plans)
        progress.stage("export segments", nsplits)
        counters = {p.root: spark.sparkContext.accumulator(0) for p in plans}
        df = messages_frame(spark, plans, opts.allow_fallback, counters)
        df.write.mode(mode).partitionBy(*PARTITION_BY).parquet(opts.out)
    per_store = {root: acc.value for root, acc in counters.items()}
    return {"job": "export", "out": opts.out, "rows": sum(per_store.values()),
            "stores": [{**p.to_json(), "rows": per_store.get(p.root, 0)} for p in plans],
            "partitionBy": list(PARTITION_BY)}, J.EXIT_OK


def run_incremental(spark, opts: J.JobOptions, ckpt_dir: str) -> tuple[dict, int]:
    """Export the entries committed since the checkpoint in `ckpt_dir`, then
    advance it (tools/pipeline/incremental.py has the rules)."""
    from tools.pipeline import incremental as I
    from tools.pipeline import splits as S
    from tools.pipeline.hadoopfs import units_for
    from tools.pipeline.sparkenv import Progress
    ckpt = I.load(ckpt_dir)
    if ckpt.out is not None and ckpt.out != opts.out:
        raise I.ExportCheckpointError(f"{ckpt_dir}: the checkpoint belongs to the export into {ckpt.out}, "
                                      f"not {opts.out}")
    run = ckpt.run + 1
    with Progress(spark, opts.progress) as progress:
        plans = J.plan_inputs(spark, opts.stores, self_id=opts.self_id, allow_fallback=opts.allow_fallback,
                              progress=progress)
        cut, marks = [], {}
        for plan in plans:
            if plan.dledger is None:
                raise I.ExportCheckpointError(f"{plan.root}: an old master-slave commitlog has no entry index to "
                                              f"continue from; export it in full (without --since-checkpoint)")
            units = units_for(spark, plan)
            mark = ckpt.marks.get(plan.root, I.Mark())
            I.check_continues(plan.root, plan, units, mark)
            cut.append(I.since(plan, mark))
            last = max(plan.committed_index, mark.index)
            plain_done = plan.kind == S.KIND_MIXED or mark.plain_done
            marks[plan.root] = attrs.evolve(mark, plain_done=plain_done) if last == mark.index else \
                I.mark_of(units, last, plain_done)
        publisher = I.Publisher(spark, opts.out)
        rolled = publisher.roll_back(ckpt.run)
        progress.stage("export segments", sum(len(p.splits) for p in cut))
        counters = {p.root: spark.sparkContext.accumulator(0) for p in cut}
        df = messages_frame(spark, cut, opts.allow_fallback, counters)
        df.write.mode("overwrite").partitionBy(*PARTITION_BY).parquet(publisher.incoming(run))
        I.crash_point("after-write")
        files = publisher.staged(run)
        for k, (path, rel) in enumerate(files):
            if k == len(files) // 2:
                I.crash_point("mid-publish")
            publisher.publish(run, path, rel)
        I.crash_point("after-publish")
        I.save(ckpt_dir, I.Checkpoint(opts.out, run, {**ckpt.marks, **marks}))
        publisher.finish(run)
    per_store = {root: acc.value for root, acc in counters.items()}
    stores = []
    for plan, c in zip(plans, cut):
        before = ckpt.marks.get(plan.root, I.Mark())
        stores.append({**c.to_json(), "rows": per_store.get(plan.root, 0), "fromIndex": before.index + 1,
                       "toIndex": marks[plan.root].index})
    return {"job": "export", "out": opts.out, "rows": sum(per_store.values()), "stores": stores,
            "partitionBy": list(PARTITION_BY), "checkpoint": ckpt_dir, "run": run, "files": len(files),
            "rolledBack": rolled}, J.EXIT_OK


def render(result: dict) -> None:
    for s in result["stores"]:
        since = f" (entries {s['fromIndex']}..{s['toIndex']})" if "fromIndex" in s else ""
        print(f"{s['root']} ({s['kind']}): {s['rows']} messages from {s['segments']} segments{since}")
    if result.get("rolledBack"):
        print(f"{result['rolledBack']} file(s) of an interrupted run removed first")
    print(f"{result['rows']} rows written to {result['out']} (partitioned by {', '.join(result['partitionBy'])})")


OPTIONS = (  # reach run() as JobOptions.extra, by these names
    click.Option(["--mode"], type=click.Choice(["errorifexists", "overwrite", "append"]), default="errorifexists",
                 show_default=True, help="what to do when --out already holds data"),
    click.Option(["--since-checkpoint"], metavar="DIR",
                 help="export only entries committed since the last run recorded in DIR (created if new)"),
)


def main(argv=None) -> int:
    return J.job_main("export", "Export the committed messages of store roots to Parquet.", run, render, argv,
                      OPTIONS)


if __name__ == "__main__":
    from tools.pipeline.export import main as _main  # executors import functions by package name
    sys.exit(_main())
