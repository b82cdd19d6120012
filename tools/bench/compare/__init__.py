# The ledgermq-vs-NATS JetStream comparison benchmark: python -m tools.bench.compare
