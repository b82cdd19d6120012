# Owns the nemesis suite: relays, the attacked cluster, workload, faults and the checker (see run.py).
