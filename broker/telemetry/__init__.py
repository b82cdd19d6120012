# Owns what an operator watches a process with, independent of what the
# process is: the Prometheus endpoint (exporter), cheap bucket histograms
# (buckets), RocketMQ-style windowed stats (stats: what VIEW_BROKER_STATS_DATA
# answers), the catalogue of metric names a broker serves and which nodes
# export them (catalog), and log setup (logs).  It imports nothing of the
# broker, so the name server, the broker and the tools can all use it; the
# collectors that know a broker's or a name server's insides live with them
# (broker/metrics.py, broker/namesrv/metrics.py).
