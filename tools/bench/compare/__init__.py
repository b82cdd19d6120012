# The ledgermq-vs-NATS JetStream comparison benchmark (issue 13): python -m tools.bench.compare
