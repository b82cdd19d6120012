# The name server: route tables (routes.py), its wire protocol (protocol.py),
# the running service (service.py), the calling side for brokers and
# clients (client.py) and the mqnamesrv command (cli.py).
