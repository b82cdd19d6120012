# Owns the `stats` job: per topic/queue and per topic figures over the
# committed messages of one or more stores -- message count, bytes (record
# TOTALSIZE, as the consume queue counts them), queue offset and time
# ranges (store and born timestamps), a size histogram, and the number of
# distinct tags and keys.  One Spark task per segment scans and decodes its
# records (segscan + consumequeue/record.py); the aggregation is Spark SQL.
# Printed as a table (or JSON); with --out also written as stats.json and
# Parquet (queues.parquet, topics.parquet).
# Usage: spark-submit tools/pipeline/stats.py --store ROOT [--out DIR]
import datetime
import functools
import json
import os
import sys

from tools.pipeline import jobcommon as J
from tools.pipeline import segscan

ROW_COLUMNS = (("store", "string"), ("topic", "string"), ("queueId", "int"), ("queueOffset", "long"),
               ("size", "int"), ("storeTimestamp", "long"), ("bornTimestamp", "long"), ("tags", "string"),
               ("keys", "array<string>"))
# Size histogram buckets: upper bounds (bytes, inclusive) and their labels.
BUCKETS = ((256, "<=256B"), (1 << 10, "<=1KiB"), (4 << 10, "<=4KiB"), (16 << 10, "<=16KiB"),
           (64 << 10, "<=64KiB"), (256 << 10, "<=256KiB"), (1 << 20, "<=1MiB"))
OVER = ">1MiB"


def size_bucket(size: int) -> str:
    for limit, label in BUCKETS:
        if size <= limit:
            return label
    return OVER


def _rows(splits, allow_fallback):
    from consumequeue import record as M
    for split in splits:
        for view, at, rec in segscan.records_in(split, allow_fallback):
            m = M.decode(view, at, limit=rec.size)
            yield (split.store, m.topic, m.queue_id, m.queue_offset, rec.size, m.store_timestamp,
                   m.born_timestamp, m.properties.get(M.PROPERTY_TAGS), m.keys)


def rows_frame(spark, plans, allow_fallback: bool):
    from pyspark.sql.types import _parse_datatype_string

    from tools.pipeline.hadoopfs import split_rdd
    items = [s for p in plans for s in p.splits]
    rdd = split_rdd(spark, items).mapPartitions(
        functools.partial(_rows, allow_fallback=allow_fallback))
    schema = _parse_datatype_string("struct<" + ",".join(f"{n}:{t}" for n, t in ROW_COLUMNS) + ">")
    return spark.createDataFrame(rdd, schema, verifySchema=False)


def aggregate(df, by: list):
    """The figures per group of `by` columns: one aggregation over the
    rows (the histogram as one counted column per bucket) and one over
    the exploded keys for their cardinality, joined."""
    from pyspark.sql import functions as F
    bucket = F.lit(OVER)
    for limit, label in reversed(BUCKETS):
        bucket = F.when(F.col("size") <= limit, label).otherwise(bucket)
    labels = [label for _, label in BUCKETS] + [OVER]
    main = df.withColumn("bucket", bucket).groupBy(*by).agg(
        F.count(F.lit(1)).alias("messages"), F.sum("size").alias("bytes"),
        F.min("size").alias("minSize"), F.max("size").alias("maxSize"),
        F.min("queueOffset").alias("minQueueOffset"), F.max("queueOffset").alias("maxQueueOffset"),
        F.min("storeTimestamp").alias("firstStoreTimestamp"), F.max("storeTimestamp").alias("lastStoreTimestamp"),
        F.min("bornTimestamp").alias("firstBornTimestamp"), F.max("bornTimestamp").alias("lastBornTimestamp"),
        F.countDistinct("tags").alias("distinctTags"),
        *[F.sum(F.when(F.col("bucket") == label, 1).otherwise(0)).alias(f"_b{k}") for k, label in enumerate(labels)])
    hist = F.map_from_arrays(F.array(*[F.lit(label) for label in labels]),
                             F.array(*[F.col(f"_b{k}") for k in range(len(labels))]))
    main = main.withColumn("sizeHistogram", F.map_filter(hist, lambda k, v: v > 0)).drop(
        *[f"_b{k}" for k in range(len(labels))])
    keys = df.select(*by, F.explode("keys").alias("key")).groupBy(*by).agg(
        F.countDistinct("key").alias("distinctKeys"))
    return main.join(keys, on=by, how="left").fillna(0, ["distinctKeys"])


def _plain(row) -> dict:
    d = row.asDict(recursive=True)
    if d.get("sizeHistogram") is not None:
        d["sizeHistogram"] = {label: d["sizeHistogram"][label] for _, label in BUCKETS + ((0, OVER),)
                              if label in d["sizeHistogram"]}
    return d


def run(spark, opts: J.JobOptions) -> tuple[dict, int]:
    from tools.pipeline.sparkenv import Progress
    with Progress(spark, opts.progress) as progress:
        plans = J.plan_inputs(spark, opts.stores, self_id=opts.self_id, allow_fallback=opts.allow_fallback,
                              progress=progress)
        progress.stage("scan segments", sum(len(p.splits) for p in plans))
        df = rows_frame(spark, plans, opts.allow_fallback).cache()
        queues = aggregate(df, ["store", "topic", "queueId"]).orderBy("store", "topic", "queueId")
        topics = aggregate(df, ["store", "topic"]).orderBy("store", "topic")
        if opts.out:
            queues.write.mode("overwrite").parquet(os.path.join(opts.out, "queues.parquet"))
            topics.write.mode("overwrite").parquet(os.path.join(opts.out, "topics.parquet"))
        q_rows = [_plain(r) for r in queues.collect()]
        t_rows = [_plain(r) for r in topics.collect()]
        df.unpersist()
    result = {"job": "stats", "stores": [p.to_json() for p in plans], "queues": q_rows, "topics": t_rows,
              "messages": sum(r["messages"] for r in t_rows), "bytes": sum(r["bytes"] for r in t_rows)}
    if opts.out:
        with open(os.path.join(opts.out, "stats.json"), "w") as f:
            json.dump(result, f, indent=2, sort_keys=True)
        result["out"] = opts.out
    return result, J.EXIT_OK


def _ts(ms) -> str:
    if ms is None:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def render(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table
    table = Table(title=f"{result['messages']} messages, {result['bytes']} bytes")
    several = len(result["stores"]) > 1
    numeric = ("queue", "messages", "bytes", "tags", "keys")
    for col in (("store",) if several else ()) + ("topic", "queue", "messages", "bytes", "offsets",
                                                  "first stored (UTC)", "last stored (UTC)", "tags", "keys",
                                                  "sizes"):
        table.add_column(col, justify="right" if col in numeric else "left")
    for r in result["queues"]:
        hist = " ".join(f"{k}:{v}" for k, v in (r["sizeHistogram"] or {}).items())
        cells = [r["topic"], str(r["queueId"]), str(r["messages"]), str(r["bytes"]),
                 f"{r['minQueueOffset']}..{r['maxQueueOffset']}", _ts(r["firstStoreTimestamp"]),
                 _ts(r["lastStoreTimestamp"]), str(r["distinctTags"]), str(r["distinctKeys"]), hist]
        table.add_row(*([os.path.basename(r["store"])] if several else []) + cells)
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # a pipe or a file: do not squeeze the table into 80 columns
    console.print(table)
    if result.get("out"):
        print(f"written to {result['out']} (stats.json, queues.parquet, topics.parquet)")


def main(argv=None) -> int:
    return J.job_main("stats", "Per topic/queue statistics of store roots.", run, render, argv)


if __name__ == "__main__":
    from tools.pipeline.stats import main as _main  # executors import functions by package name
    sys.exit(_main())
