# Owns RocketMQ's plain ACL (1.0) for ledgermq: request signing (signing.py,
# shared by the client library, mqadmin and the broker's own calls to the name
# servers), plain_acl.yml (plain.py: parsing, validation, address patterns),
# the rule of every request code (table.py: admin, the resources it touches,
# or signature only) and the header fields each code may carry (fields.py),
# the decision (validator.py), and the running service (service.py: the
# loaded rules, reloads when the file changes, the refusal answered at the
# one guard in front of dispatch, the check-back filter, the store lookup).
