# RocketMQ message records, the name server, the broker and its clients.
