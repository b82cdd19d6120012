# The web console (`mqadmin dashboard`): a read-mostly view of a running
# cluster -- roles, terms, replication, topics, consumer lag, messages --
# served on trio from what the admin requests answer (see serve.py).
