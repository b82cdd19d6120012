# Tests of the tools/ scripts that run whole clusters (benchmarks' smoke tests).
