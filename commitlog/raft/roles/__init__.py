# Role logic of the Raft core: one object per role, swapped by RaftCore on
# every role change (follower.py, candidate.py, leader.py); ports.py is all
# a role knows of its node, and the role changes it may ask for.
