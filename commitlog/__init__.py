# The DLedger-format replicated commitlog: entry codecs, segmented store, Raft.
