# The names tests/test_dead_code.py lets vulture call used although nothing
# in the packages calls them, each with who does.  Read by vulture, never
# imported.  Before adding a name here, ask whether the code should go.
# (Decorated hooks -- attrs validators and defaults, click commands,
# atexit -- are skipped by decorator in the test itself.)
# ruff: noqa
_ = None

# --- entry points (pyproject.toml [project.scripts]) ------------------------------
mqnamesrv
mqbroker

# --- the client library's public API ----------------------------------------------
_.by_tag  # broker/client/model.py MessageSelector.by_tag, as RocketMQ's MessageSelector.byTag

# --- protocols: called by name by a framework -------------------------------------
# gRPC: the proxy's MessagingService servicer methods (broker/proxy/service.py)
_.NotifyClientTermination
_.PullMessage
_.UpdateOffset
_.GetOffset
_.QueryOffset
_.SyncLiteSubscription
_.ChangeInvisibleDuration
_.ForwardMessageToDeadLetterQueue
_.QueryRoute
_.QueryAssignment
_.Heartbeat
_.Telemetry
_.EndTransaction
_.RecallMessage
# trio.abc.Instrument hooks (commitlog/roundtrace.py, commitlog/stallwatch.py,
# broker/remoting/pacing.py)
_.before_task_step
_.after_task_step
_.before_io_wait
_.after_io_wait
_.after_run
# click.ParamType.convert (tools/mqadmin/online.py)
_.convert
# the Transport protocol's waits (commitlog/transport/base.py and both
# transports; tests and tools wait on them)
_.wait_connected
_.wait_state

# --- used by tests only: fixtures, fakes and test-side views --------------------------
parse_uniq_key  # broker/common/msgid.py
_.evaluate  # broker/common/sqlfilter.py
_.install  # broker/metadata/applier.py
decode_op  # broker/metadata/records.py
_.offset_table  # broker/metadata/service.py
_size_sum  # broker/metrics.py
run_broker_registration  # broker/namesrv/client.py
_.wait_until  # broker/namesrv/service.py
_.producer_ids  # broker/processors/client_manager.py
_.in_flight_responses  # broker/remoting/client.py, connection.py
_.holders  # broker/remoting/streams.py
_.other_peer_ids  # commitlog/config.py
_.index_unit  # commitlog/entry.py
make_entry  # commitlog/entry.py
decode_index_unit  # commitlog/entry.py
batch_from_entries  # commitlog/entry.py
_.campaign  # commitlog/raft/core.py
MemLog  # commitlog/raft/memlog.py: the in-memory RaftLog of the Raft tests
_.delete_before  # commitlog/raft/memlog.py
_.pos_at  # commitlog/raft/memlog.py
_.body_at  # commitlog/raft/memlog.py
_.reconnects  # commitlog/transport/base.py
_.set_faults  # commitlog/transport/memory.py
_.isolate  # commitlog/transport/memory.py
_.open_transport  # commitlog/transport/memory.py
records_from_batch  # consumequeue/batch.py
unit_bytes  # consumequeue/cq.py
_.topic_of  # consumequeue/legacy_store.py
_.message_count  # consumequeue/reader.py
delay_tags_code  # consumequeue/record.py
set_queue_offset  # consumequeue/record.py
set_store_timestamp  # consumequeue/record.py
dispatch_committed  # consumequeue/service.py
hmac_sha1  # native/acl.py: the C helper's twin, checked against hashlib
portable_sha1  # native/acl.py
java_hash_utf8  # native/hashing.py
index_key_hash  # native/hashing.py
_.add_node  # tools/brokercluster.py
size_bucket  # tools/pipeline/stats.py
