# Owns RocketMQ's plain ACL (1.0) for ledgermq: request signing (signing.py,
# shared by the client library, mqadmin and the broker's own calls to the name
# servers), plain_acl.yml (plain.py: parsing, validation, address patterns),
# the request -> resource/permission table and the decision (validator.py),
# and the broker's running service (service.py: the loaded rules, reloads
# when the file changes, the refusal answered at the one guard in front of
# dispatch).
