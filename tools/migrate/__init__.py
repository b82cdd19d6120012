# Owns nothing itself: the operator commands of moving a master-slave
# RocketMQ store onto ledgermq and back -- check.py (pre-flight), align.py,
# export.py (the way back).  `migrate apply` runs broker/store/upgrade.py, the
# same upgrade the broker does on start; consumequeue/plainlog.py writes plain
# stores and consumequeue/migrated.py reads migrated ones.  mqadmin's
# `migrate` group drives them (tools/mqadmin/migrate_cmds.py).
