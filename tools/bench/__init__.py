# Benchmarks (run on demand, never as timed assertions in tests).
