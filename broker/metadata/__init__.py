# Owns nothing itself: the public face of broker.metadata (topic configs,
# subscription groups and consumer offsets replicated through the log).
# See service.py for the design, records.py for the internal topics.
from broker.metadata.applier import MetadataApplier, MetadataApplyError, MetadataGapError
from broker.metadata.records import (
                                     CONSUMER_OFFSET_TOPIC,
                                     INTERNAL_TOPICS,
                                     SUBSCRIPTION_GROUP_TOPIC,
                                     TOPIC_CONFIG_TOPIC,
                                     MetadataRecordError,
                                     is_internal_topic,
)
from broker.metadata.service import FlushAbortedError, MetadataConfig, MetadataService, OffsetCommitRequest
from broker.metadata.snapshot import LoadedSnapshot, load_snapshot
from broker.metadata.tables import MetadataState, SubscriptionGroupConfig

__all__ = ["MetadataApplier", "MetadataApplyError", "MetadataGapError", "CONSUMER_OFFSET_TOPIC",
           "INTERNAL_TOPICS", "SUBSCRIPTION_GROUP_TOPIC", "TOPIC_CONFIG_TOPIC", "MetadataRecordError",
           "is_internal_topic", "FlushAbortedError", "MetadataConfig", "MetadataService", "OffsetCommitRequest",
           "LoadedSnapshot", "load_snapshot", "MetadataState", "SubscriptionGroupConfig"]
