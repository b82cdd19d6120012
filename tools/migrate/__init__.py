# Owns nothing itself: the operator steps of moving a master-slave RocketMQ
# store onto ledgermq and back (issue 7) -- check.py (pre-flight), align.py,
# apply.py (upgrade in place), export.py (the way back) and plainlog.py (the
# plain-store writer they share).  mqadmin's `migrate` group drives them
# (tools/mqadmin/migrate_cmds.py); consumequeue/migrated.py is the broker's
# side of a migrated store.
