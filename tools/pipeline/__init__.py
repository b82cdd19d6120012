# Owns the PySpark data pipeline over commitlog stores: batch jobs
# that read one or more store roots with one Spark task per whole segment
# file (records never cross segments) and decode them with the same native
# dispatch scanner as the broker, inside the executors.
#
#   rebuild  consume queues + IndexFile, byte-identical to the dispatcher's
#   export   messages to Parquet, partitioned by topic and date
#   stats    per topic/queue counts, bytes, time ranges, size histograms,
#            tag/key cardinalities
#   audit    replicas of one group compared over their common committed
#            prefix (digest per segment range, then an entry-level diff)
#
# Modules: splits (what to read: committed bounds, segment splits), segscan
# (the executor side: native scans of one split), sparkenv (session, Java
# check, progress), jobargs (the shared command line of the spark-submit
# scripts), and one module per job.  Run as `mqadmin pipeline <job> ...` or
# `spark-submit tools/pipeline/<job>.py ...`.
