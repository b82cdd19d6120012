# Owns mqproxy, the RocketMQ 5 gRPC messaging service (apache.rocketmq.v2
# MessagingService) in RocketMQ's cluster mode: a process of its own beside
# the brokers, serving the official 5.x clients over gRPC and speaking
# remoting to the name servers and brokers through ledgermq's client library
# (broker/client, on asyncio here).  The broker's trio process and its send
# path are untouched.  README "gRPC proxy" says why it runs apart.
#
#   pb.py       the generated apache.rocketmq.v2 messages and service stubs
#   config.py   proxy.conf (ProxyConfig)
#   auth.py     the authorization header, the plain ACL accounts, each RPC's rule
#   status.py   gRPC Status values and the translation of client-library errors
#   convert.py  gRPC Message <-> remoting records and properties
#   service.py  the MessagingService RPCs: routes, clients, sending, transactions
#   consume.py  the consuming RPCs on the brokers' POP codes
#   renew.py    renewing the receipts push consumers hold
#   server.py   serve_proxy (grpc.aio server + client instance) and `mqproxy`
