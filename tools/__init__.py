# Operator-facing tools: the mqadmin CLI, benchmarks, migration and pipeline.
