# The pure Raft core of the commitlog (no I/O): RaftCore (core.py) driven by
# tick/step/propose and drained through Ready/advance (state.py); the role
# logic it swaps on every role change (roles/: follower, candidate, leader,
# which see the core only through roles/ports.py); the leader's per-follower
# replication progress as plain data (progress.py); the messages
# (messages.py) and their byte codec (wire.py); quorum arithmetic
# (quorum.py); the log interface it reads (logapi.py) and its in-memory
# implementation (memlog.py).
