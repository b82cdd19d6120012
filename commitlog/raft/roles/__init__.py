# Role logic of the Raft core: one object per role, swapped by RaftCore on
# every role change (follower.py, candidate.py, leader.py + replicator.py).
